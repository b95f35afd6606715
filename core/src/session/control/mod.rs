//! Control streams: fixed slots that borrow a receive buffer (message
//! reassembly) and a send buffer while they need them, and message dispatch by
//! stream type.
//!
//! Every bidirectional moq-lite stream and both SETUP streams occupy one
//! [`Control`] slot. The session's control buffers (`CHUNKS` of `BUF` bytes)
//! are shared: a slot takes one for receiving when bytes arrive and one for
//! sending when it writes a message, and gives each back once it is empty, so
//! an idle stream holds none. Each buffer is a FIFO behind an optional *kept*
//! prefix (`keep` bytes that are neither parsed nor sent): an announce stream
//! keeps its prefix there (and its buffer with it), so a joined path can be
//! rebuilt for every announcement without another buffer. A slot takes a
//! receive buffer only while another stays free for its answer; with none,
//! the peer's bytes wait in the connection (backpressure) until a buffer comes
//! back.
//!
//! Receiving: stream bytes are copied into the receive FIFO (credit goes back
//! to the peer at once; control streams are not paced) and complete messages
//! are parsed in place (docs/protocol.md §3.2). A message that carries text for the
//! application (SETUP's path, ANNOUNCE, GOAWAY) stays at the front of the FIFO
//! until [`Session::poll_event`](super::Session::poll_event) has returned it; parsing of that stream
//! pauses meanwhile. A message longer than the buffer can never complete: the
//! stream is refused (or, for SETUP and GOAWAY, the session closed); nothing grows.
//!
//! Sending: messages are encoded into the send FIFO and written by
//! [`Session::poll_transmit`](super::Session::poll_transmit) as credit allows, FIN after the last byte.
//!
//! The slot mechanics live in [`fifo`] (the buffers), [`streams`] (opening,
//! flushing, refusing, freeing), [`receive`] (reassembly and dispatch) and
//! [`held`] (messages waiting for the application); the messages of each
//! stream kind in [`setup`], [`goaway`], [`announce`], [`track`] and
//! [`subscribe`]. This module holds the slot and its kinds, which all of them
//! share.

mod announce;
mod decode;
mod fetch;
mod fifo;
mod goaway;
mod held;
mod paths;
mod receive;
mod setup;
mod streams;
mod subscribe;
mod track;

pub(super) use decode::decode_within;
pub(super) use fifo::rx_of;
pub(super) use paths::{join, rooted, unrooted};

use super::event::Waiting;
use crate::model::origin;
use crate::time::Instant;
use crate::wire::lite::StreamCode;
use crate::wire::qmux::{Dir, StreamId};

/// Where an incoming announce stream we serve stands (publisher side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnnounceState {
    /// Waiting for ANNOUNCE_REQUEST.
    Request,
    /// Sending the initial set: the broadcasts under the prefix in catalog
    /// order. The receive buffer keeps the prefix (`prefix` bytes) and then
    /// the path of the last broadcast sent (`after` bytes, none before the
    /// first); `next` is the position (among the broadcasts under the prefix)
    /// of the next one to send, as of the origin's state at `mark`. `cursor`
    /// was taken with the set, so every later change is seen.
    Initial {
        prefix: usize,
        after: Option<usize>,
        next: usize,
        mark: origin::Cursor,
        exclude: u64,
        cursor: origin::Cursor,
        ok_sent: bool,
    },
    /// Following the origin's change log.
    Live {
        prefix: usize,
        exclude: u64,
        cursor: origin::Cursor,
    },
    /// Nothing to announce (no origin): ANNOUNCE_OK with 0 went out, the stream stays open.
    Quiet,
}

/// Where a Subscribe stream the peer opened stands (publisher side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SubState {
    /// Waiting for SUBSCRIBE.
    Waiting,
    /// Served by this entry of the served table.
    Serving(usize),
    /// Over (finished, refused or cancelled); anything more is ignored.
    Done,
}

/// Where a Fetch stream the peer opened stands (publisher side, docs/protocol.md §3.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FetchState {
    /// Waiting for FETCH.
    Waiting,
    /// Answered from a local group by a group-stream entry (which ends it).
    Serving,
    /// Not held locally: handed to the application as [`Event::Fetch`]
    /// (`id`), waiting for its answer or refusal.
    ///
    /// [`Event::Fetch`]: crate::session::Event::Fetch
    Missed {
        id: u64,
        /// The code it is refused with if nothing answers it.
        code: StreamCode,
        /// The peer's priority for it.
        priority: u8,
    },
    /// Over (answered, refused or cancelled); the slot waits for the peer's end.
    Done,
}

impl FetchState {
    /// True while the fetch holds a place under `Config::max_fetches`.
    pub(super) fn is_active(self) -> bool {
        matches!(self, FetchState::Serving | FetchState::Missed { .. })
    }
}

/// What a control slot carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Unused.
    Free,
    /// A bidi stream the peer opened whose type has not arrived (or not been read:
    /// requests wait for the peer's SETUP).
    Peer,
    /// Our SETUP stream.
    SetupOut,
    /// The peer's SETUP stream; `done` once its SETUP was read.
    SetupIn { done: bool },
    /// Our announce request; the send buffer keeps the normalized prefix.
    AnnounceOut { id: u64, publisher: Option<u64> },
    /// An announce request of the peer that we serve.
    AnnounceIn { state: AnnounceState },
    /// Our TRACK request for subscription `sub`; `done` once TRACK_INFO arrived.
    TrackOut { sub: u64, done: bool },
    /// The peer's TRACK request; `done` once answered; `deferred` once it
    /// waits for a relay track's TRACK_INFO (it is then looked up again, never
    /// resolved again: a track that went away meanwhile answers NOT_FOUND).
    TrackIn { done: bool, deferred: bool },
    /// Our SUBSCRIBE for subscription `sub`.
    SubscribeOut { sub: u64 },
    /// The peer's SUBSCRIBE and its serving state.
    SubscribeIn { served: SubState },
    /// Our FETCH for fetch `sub` (held until TRACK_INFO); the answer's
    /// bytes go to an incoming group-stream entry, not to the FIFO.
    FetchOut { sub: u64 },
    /// The peer's FETCH and how it is answered.
    FetchIn { state: FetchState },
    /// Our GOAWAY.
    GoawayOut,
    /// The peer's GOAWAY; `done` once read.
    GoawayIn { done: bool },
}

/// The "no control buffer" index of [`Control::rx_chunk`] and [`Control::tx_chunk`].
pub(super) const NO_CHUNK: u16 = u16::MAX;

/// One control stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    pub(super) kind: Kind,
    /// `None` until the stream is opened (ours may wait for stream credit).
    pub(super) stream: Option<StreamId>,
    pub(super) dir: Dir,
    /// The control buffer holding the receive FIFO ([`NO_CHUNK`]: none, both empty).
    pub(super) rx_chunk: u16,
    /// The control buffer holding the send FIFO ([`NO_CHUNK`]: none, both empty).
    pub(super) tx_chunk: u16,
    pub(super) rx_keep: usize,
    pub(super) rx_len: usize,
    pub(super) tx_keep: usize,
    pub(super) tx_len: usize,
    /// Send FIN once the send buffer is drained.
    pub(super) fin: bool,
    /// Our sending half is over (FIN written, reset, or we never send on it).
    pub(super) tx_done: bool,
    /// The peer's FIN arrived and is not yet processed.
    pub(super) rx_fin: bool,
    /// Nothing more will be read.
    pub(super) rx_done: bool,
    /// Neither opened nor flushed yet (a SUBSCRIBE waiting for TRACK_INFO).
    pub(super) held: bool,
    /// Bytes of a message at the front of the receive buffer kept for `poll_event`.
    pub(super) event: usize,
    /// Since when the front of the receive buffer holds an incomplete message
    /// (see `Config::control_timeout`).
    pub(super) partial_since: Option<Instant>,
    /// Our announce request's end, waiting for room in the event queue: the
    /// slot is not freed before it is queued.
    pub(super) ended: Option<Waiting>,
}

impl Control {
    /// An unused slot.
    pub(crate) const FREE: Control = Control {
        kind: Kind::Free,
        stream: None,
        dir: Dir::Bidi,
        rx_chunk: NO_CHUNK,
        tx_chunk: NO_CHUNK,
        rx_keep: 0,
        rx_len: 0,
        tx_keep: 0,
        tx_len: 0,
        fin: false,
        tx_done: false,
        rx_fin: false,
        rx_done: false,
        held: false,
        event: 0,
        partial_since: None,
        ended: None,
    };

    /// True if received bytes or a FIN wait to be processed.
    pub(super) fn needs_processing(&self) -> bool {
        self.kind != Kind::Free
            && self.event == 0
            && !self.rx_done
            && (self.rx_len > 0 || self.rx_fin)
    }

    /// True if something waits to be written on the stream.
    fn wants_flush(&self) -> bool {
        self.stream.is_some() && !self.held && !self.tx_done && (self.tx_len > 0 || self.fin)
    }
}

/// What parsing the front of a receive buffer did.
pub(super) enum Step {
    /// A message of this many bytes was handled; drop it.
    Consumed(usize),
    /// A message of this many bytes waits for `poll_event`.
    Held(usize),
    /// The front is not a complete message yet.
    Wait,
    /// The message is complete but cannot be answered yet (a TRACK request
    /// for a track whose TRACK_INFO is still to come): keep it, try again
    /// at the next pass.
    Defer,
    /// The handler changed the slot (refused, closed, failed); stop.
    Stop,
}
