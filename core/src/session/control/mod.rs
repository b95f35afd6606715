//! Control streams: fixed slots with a receive buffer (message reassembly) and a
//! send buffer each, message dispatch by stream type, SETUP and GOAWAY.
//!
//! Every bidirectional moq-lite stream and both SETUP streams occupy one
//! [`Control`] slot. Slot `i` owns bytes `i * BUF .. (i + 1) * BUF` of the
//! session's receive and send memories. Each buffer is a FIFO behind an
//! optional *kept* prefix (`keep` bytes that are neither parsed nor sent): an
//! announce stream keeps its prefix there, so a joined path can be rebuilt for
//! every announcement without another buffer.
//!
//! Receiving: stream bytes are copied into the receive FIFO (credit goes back
//! to the peer at once; control streams are not paced) and complete messages
//! are parsed in place (PROTOCOL.md §3.2). A message that carries text for the
//! application (SETUP's path, ANNOUNCE, GOAWAY) stays at the front of the FIFO
//! until [`Session::poll_event`] has returned it; parsing of that stream
//! pauses meanwhile. A message longer than the buffer can never complete: the
//! stream is refused (or, for SETUP and GOAWAY, the session closed); nothing grows.
//!
//! Sending: messages are encoded into the send FIFO and written by
//! [`Session::poll_transmit`] as credit allows, FIN after the last byte.

use core::cmp::min;

use super::event::{AnnounceId, Event, Queued, Waiting};
use super::{Error, Session};
use crate::model::path::{Path, PathBuf};
use crate::model::{origin, track};
use crate::time::Instant;
use crate::wire::lite::{
    Announce, AnnounceOk, BidiStreamType, Goaway, MAX_HOPS, Message, Param, SessionCode, Setup,
    StreamCode, SubscribeResponse, Track, TrackInfo, UniStreamType, decode_message,
    decode_message_within, message_len, write_message,
};
use crate::wire::qmux::{Dir, Side, StreamId};
use crate::wire::{DecodeError, EncodeError, Writer, varint};

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
    /// Our GOAWAY.
    GoawayOut,
    /// The peer's GOAWAY; `done` once read.
    GoawayIn { done: bool },
}

/// One control stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    pub(super) kind: Kind,
    /// `None` until the stream is opened (ours may wait for stream credit).
    pub(super) stream: Option<StreamId>,
    pub(super) dir: Dir,
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

/// Decodes a message that must fit `limit` bytes of buffer, telling a message
/// that is merely too long for our buffer ([`Too::Large`]) from a malformed one.
pub(super) fn decode_within<'m, M: Message<'m>>(
    data: &'m [u8],
    limit: usize,
) -> Result<(M, usize), Too> {
    match decode_message_within::<M>(data, limit) {
        Ok(v) => Ok(v),
        Err(DecodeError::Incomplete) => Err(Too::Incomplete),
        Err(DecodeError::TooLarge) => match decode_message::<M>(data) {
            // Within the protocol's limit but over our buffer: a resource limit.
            Ok(_) | Err(DecodeError::Incomplete) => Err(Too::Large),
            Err(_) => Err(Too::Malformed),
        },
        Err(_) => Err(Too::Malformed),
    }
}

/// Why a message could not be taken from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Too {
    Incomplete,
    Large,
    Malformed,
}

impl<'s, 'a, 'p, const N: usize> Session<'s, 'a, 'p, N> {
    // ---- slots and buffers ----

    /// The control slot of stream `id`.
    pub(super) fn control_slot(&self, id: StreamId) -> Option<usize> {
        self.control.iter().position(|c| c.stream == Some(id))
    }

    /// Takes a free slot for a stream of `kind` (opened later by `open_pending`
    /// when `stream` is `None`).
    pub(super) fn alloc_control(
        &mut self,
        kind: Kind,
        dir: Dir,
        stream: Option<StreamId>,
    ) -> Option<usize> {
        let slot = self.control.first_free()?;
        self.control[slot] = Control {
            kind,
            stream,
            dir,
            ..Control::FREE
        };
        Some(slot)
    }

    /// Free control slots.
    pub(super) fn free_control(&self) -> usize {
        self.control.free_count()
    }

    /// The unparsed receive bytes of `slot`.
    pub(super) fn rx_data(&self, slot: usize) -> &[u8] {
        rx_of(self.rx, &self.control[slot], self.buf, slot)
    }

    /// The kept prefix of `slot`'s receive buffer.
    pub(super) fn rx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        let start = slot * self.buf;
        self.rx.get(start..start + c.rx_keep).unwrap_or(&[])
    }

    /// The kept prefix of `slot`'s send buffer.
    pub(super) fn tx_kept(&self, slot: usize) -> &[u8] {
        let c = &self.control[slot];
        let start = slot * self.buf;
        self.tx.get(start..start + c.tx_keep).unwrap_or(&[])
    }

    /// Drops `n` parsed bytes from the front of `slot`'s receive FIFO.
    pub(super) fn rx_consume(&mut self, slot: usize, n: usize) {
        let c = &mut self.control[slot];
        let n = min(n, c.rx_len);
        let start = slot * self.buf + c.rx_keep;
        if let Some(region) = self.rx.get_mut(start..start + c.rx_len) {
            region.copy_within(n.., 0);
        }
        c.rx_len -= n;
    }

    /// Replaces the kept prefix of `slot`'s receive buffer (the FIFO must be empty).
    pub(super) fn set_rx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        let c = &mut self.control[slot];
        if c.rx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        let start = slot * self.buf;
        match self.rx.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.rx_keep = bytes.len();
                true
            }
            None => false,
        }
    }

    /// Writes `bytes` into `slot`'s receive buffer at `offset` and makes the kept
    /// prefix end after them (the FIFO must be empty).
    pub(super) fn set_rx_kept_at(&mut self, slot: usize, offset: usize, bytes: &[u8]) -> bool {
        let c = &mut self.control[slot];
        let end = offset.saturating_add(bytes.len());
        if c.rx_len != 0 || end > self.buf || offset > c.rx_keep {
            return false;
        }
        let start = slot * self.buf;
        match self.rx.get_mut(start + offset..start + end) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.rx_keep = end;
                true
            }
            None => false,
        }
    }

    /// Appends to `slot`'s send FIFO whatever `f` writes, all or nothing.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if it does not fit; [`EncodeError::ValueTooLarge`] from `f`.
    pub(super) fn tx_write(
        &mut self,
        slot: usize,
        f: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        let c = self.control[slot];
        let base = slot * self.buf;
        let region = self
            .tx
            .get_mut(base + c.tx_keep + c.tx_len..base + self.buf)
            .ok_or(EncodeError::BufferTooSmall)?;
        let mut w = Writer::new(region);
        f(&mut w)?;
        self.control[slot].tx_len += w.position();
        Ok(())
    }

    /// Stores `bytes` as the kept prefix of `slot`'s send buffer (before anything is queued).
    pub(super) fn set_tx_kept(&mut self, slot: usize, bytes: &[u8]) -> bool {
        let c = &mut self.control[slot];
        if c.tx_len != 0 || bytes.len() > self.buf {
            return false;
        }
        let start = slot * self.buf;
        match self.tx.get_mut(start..start + bytes.len()) {
            Some(region) => {
                region.copy_from_slice(bytes);
                c.tx_keep = bytes.len();
                true
            }
            None => false,
        }
    }

    // ---- stream lifecycle ----

    /// Refuses a peer request: reset our half and stop reading, both with `code`,
    /// and free the slot (PROTOCOL.md §3.3, §3.8).
    pub(super) fn refuse(&mut self, slot: usize, code: StreamCode) {
        debug!("session: refusing control stream, code {}", code.to_code());
        self.detach_control(slot, code);
        if let Some(id) = self.control[slot].stream {
            if id.can_send(self.side) {
                let _ = self.conn.reset_stream(id, code.to_code());
            }
            if id.can_recv(self.side) {
                let _ = self.conn.stop_sending(id, code.to_code());
            }
        }
        self.free_slot(slot);
    }

    /// Resets our sending half of `slot` with `code` (pending bytes are dropped).
    pub(super) fn reset_tx(&mut self, slot: usize, code: StreamCode) {
        let c = &mut self.control[slot];
        if c.tx_done {
            return;
        }
        c.tx_len = 0;
        c.fin = false;
        c.tx_done = true;
        match c.stream {
            Some(id) => {
                let _ = self.conn.reset_stream(id, code.to_code());
            }
            // Never opened: nothing was sent, nothing to say.
            None => c.rx_done = true,
        }
    }

    /// Stops reading `slot` (the peer's further bytes are discarded).
    pub(super) fn stop_rx(&mut self, slot: usize, code: StreamCode) {
        let c = &mut self.control[slot];
        if c.rx_done {
            return;
        }
        c.rx_done = true;
        c.rx_len = 0;
        c.rx_fin = false;
        if let Some(id) = c.stream {
            let _ = self.conn.stop_sending(id, code.to_code());
        }
    }

    /// Marks a slot unused.
    pub(super) fn free_slot(&mut self, slot: usize) {
        debug_assert!(
            self.control[slot].ended.is_none(),
            "a waiting end is never freed"
        );
        if self.surfaced == Some(slot) {
            self.surfaced = None;
        }
        self.control[slot] = Control::FREE;
    }

    /// Frees slots whose both halves are over.
    pub(super) fn sweep_control(&mut self) {
        for slot in 0..self.control.span() {
            let c = &self.control[slot];
            if c.kind != Kind::Free
                && c.tx_done
                && c.rx_done
                && c.event == 0
                && c.ended.is_none()
                && self.surfaced != Some(slot)
            {
                self.detach_control(slot, StreamCode::Cancel);
                self.free_slot(slot);
            }
        }
    }

    /// Lets go of what a slot refers to before it is freed (served subscriptions
    /// and their group streams; our subscriptions' pending SUBSCRIBE).
    fn detach_control(&mut self, slot: usize, code: StreamCode) {
        match self.control[slot].kind {
            Kind::SubscribeIn {
                served: SubState::Serving(i),
            } => self.end_served(i, code),
            Kind::TrackOut { sub, done: false } => self.track_failed(sub, code.to_code()),
            _ => {}
        }
    }

    /// Opens the streams of slots that wait for one (stream credit permitting).
    pub(super) fn open_pending(&mut self) {
        for slot in 0..self.control.span() {
            let c = self.control[slot];
            if c.kind == Kind::Free || c.stream.is_some() || c.held || c.tx_done {
                continue;
            }
            match self.conn.open_stream(c.dir) {
                Ok(id) => self.control[slot].stream = Some(id),
                Err(_) => return,
            }
        }
    }

    /// Writes pending control bytes into `out`; returns the bytes written.
    pub(super) fn flush_control(&mut self, now: crate::time::Instant, out: &mut [u8]) -> usize {
        let mut pos = 0;
        for slot in 0..self.control.span() {
            while self.control[slot].wants_flush() {
                let c = self.control[slot];
                let Some(id) = c.stream else { break };
                let base = slot * self.buf + c.tx_keep;
                let data = self.tx.get(base..base + c.tx_len).unwrap_or(&[]);
                let Some(room) = out.get_mut(pos..) else {
                    return pos;
                };
                match self.conn.write_stream(now, id, data, c.fin, room) {
                    Ok(w) => {
                        pos += w.out;
                        let c = &mut self.control[slot];
                        let rest = c.tx_len - w.data;
                        if let Some(region) = self.tx.get_mut(base..base + c.tx_len) {
                            region.copy_within(w.data.., 0);
                        }
                        c.tx_len = rest;
                        if c.fin && rest == 0 {
                            c.tx_done = true;
                            c.fin = false;
                        }
                    }
                    Err(crate::conn::WriteError::Blocked) => break,
                    Err(crate::conn::WriteError::BufferTooSmall) => return pos,
                    Err(_) => {
                        // Reset, finished or gone underneath: nothing more to send.
                        let c = &mut self.control[slot];
                        c.tx_len = 0;
                        c.fin = false;
                        c.tx_done = true;
                    }
                }
            }
        }
        pos
    }

    // ---- receiving ----

    /// A new stream opened by the peer: its first bytes.
    pub(super) fn new_peer_stream(
        &mut self,
        now: crate::time::Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
    ) -> usize {
        match id.dir() {
            Dir::Bidi => match self.alloc_control(Kind::Peer, Dir::Bidi, Some(id)) {
                Some(slot) => self.control_data(now, slot, data, fin),
                None => {
                    debug!(
                        "session: control table full, refusing stream {}",
                        id.value()
                    );
                    let _ = self.conn.reset_stream(id, StreamCode::Internal.to_code());
                    let _ = self.conn.stop_sending(id, StreamCode::Internal.to_code());
                    data.len()
                }
            },
            Dir::Uni => self.new_uni_stream(now, id, data, fin),
        }
    }

    /// Bytes for control slot `slot`; returns how many were taken (fewer only
    /// when the stream's buffer is full of a message held for `poll_event`).
    pub(super) fn control_data(
        &mut self,
        _now: crate::time::Instant,
        slot: usize,
        data: &[u8],
        fin: bool,
    ) -> usize {
        let Some(id) = self.control[slot].stream else {
            return data.len();
        };
        let mut used = 0;
        loop {
            if self.is_closed() || self.control[slot].stream != Some(id) {
                return data.len();
            }
            let c = self.control[slot];
            if c.rx_done {
                self.conn.release(id, (data.len() - used) as u64);
                return data.len();
            }
            let room = self.buf.saturating_sub(c.rx_keep + c.rx_len);
            let n = min(room, data.len() - used);
            let start = slot * self.buf + c.rx_keep + c.rx_len;
            if let (Some(dst), Some(src)) =
                (self.rx.get_mut(start..start + n), data.get(used..used + n))
            {
                dst.copy_from_slice(src);
            }
            self.control[slot].rx_len += n;
            used += n;
            // Control streams are not paced: the bytes are ours now.
            self.conn.release(id, n as u64);
            if used == data.len() && fin {
                self.control[slot].rx_fin = true;
            }
            self.process_rx(slot);
            if used == data.len() {
                return used;
            }
            if self.control[slot].stream != Some(id) {
                return data.len();
            }
            let c = self.control[slot];
            if c.rx_keep + c.rx_len < self.buf {
                continue;
            }
            if c.event > 0 || !self.has_event_room() {
                // Waiting for the application: backpressure.
                return used;
            }
            // A full buffer and no complete message: it can never fit.
            self.too_large(slot);
            return data.len();
        }
    }

    /// Our announce request `id` on `slot` ended: queue
    /// [`Event::AnnounceEnded`], or keep it in the slot until the queue has room.
    pub(super) fn announce_ended(&mut self, slot: usize, id: u64, code: Option<u64>) {
        if let Some(end) = self.queue_end(Queued::AnnounceEnded(AnnounceId(id), code)) {
            self.control[slot].ended = Some(end);
        }
    }

    /// A message longer than the buffer: refuse the stream (or close the session
    /// for the streams it cannot do without).
    fn too_large(&mut self, slot: usize) {
        match self.control[slot].kind {
            Kind::SetupIn { .. } | Kind::GoawayIn { .. } => {
                self.fail(SessionCode::Internal, "control message too large")
            }
            Kind::AnnounceOut { id, .. } => {
                self.announce_ended(slot, id, Some(StreamCode::Internal.to_code()));
                if self.control[slot].ended.is_some() {
                    // The end waits in the slot: stop both halves, keep it.
                    self.reset_tx(slot, StreamCode::Internal);
                    self.stop_rx(slot, StreamCode::Internal);
                } else {
                    self.refuse(slot, StreamCode::Internal);
                }
            }
            Kind::SubscribeOut { sub } => {
                self.refuse(slot, StreamCode::Internal);
                self.subscription_closed(sub, Some(StreamCode::Internal.to_code()));
            }
            _ => self.refuse(slot, StreamCode::Internal),
        }
    }

    /// Handles complete messages at the front of `slot`'s receive buffer, then a FIN.
    pub(super) fn process_rx(&mut self, slot: usize) {
        loop {
            if self.is_closed() {
                return;
            }
            let c = self.control[slot];
            if c.kind == Kind::Free || c.event > 0 || c.rx_done {
                return;
            }
            if c.rx_len == 0 {
                if c.rx_fin {
                    self.control[slot].rx_fin = false;
                    self.control[slot].rx_done = true;
                    self.on_control_fin(slot);
                }
                return;
            }
            if !self.has_event_room() {
                return;
            }
            let limit = self.buf - c.rx_keep;
            let step = match c.kind {
                Kind::Free => return,
                Kind::Peer => self.parse_stream_type(slot),
                Kind::SetupIn { done } => self.parse_setup(slot, done, limit),
                Kind::AnnounceIn { state } => self.parse_announce_request(slot, state, limit),
                Kind::TrackIn { done, deferred } => self.parse_track(slot, done, deferred, limit),
                Kind::SubscribeIn { served } => self.parse_subscribe(slot, served, limit),
                Kind::GoawayIn { done } => self.parse_goaway(slot, done, limit),
                Kind::AnnounceOut { id, publisher } => {
                    self.parse_announce(slot, id, publisher, limit)
                }
                Kind::TrackOut { sub, done } => self.parse_track_info(slot, sub, done, limit),
                Kind::SubscribeOut { sub } => self.parse_response(slot, sub),
                Kind::SetupOut | Kind::GoawayOut => Step::Consumed(c.rx_len),
            };
            if !matches!(step, Step::Wait) {
                self.control[slot].partial_since = None;
            }
            if matches!(step, Step::Defer) {
                self.deferred = true;
                return;
            }
            match step {
                Step::Consumed(n) => self.rx_consume(slot, n),
                Step::Held(n) => {
                    self.control[slot].event = n;
                    return;
                }
                Step::Wait => {
                    if self.control[slot].partial_since.is_none() {
                        self.control[slot].partial_since = Some(self.now);
                    }
                    if self.control[slot].rx_fin {
                        // The stream ended inside a message.
                        self.fail(SessionCode::ProtocolViolation, "truncated control message");
                    }
                    return;
                }
                Step::Stop | Step::Defer => return,
            }
        }
    }

    /// Maps a decode failure to the step to take.
    pub(super) fn on_decode_error(&mut self, slot: usize, e: Too) -> Step {
        match e {
            Too::Incomplete => Step::Wait,
            Too::Large => {
                // Let the caller see the full buffer first: only then is it too large.
                let c = self.control[slot];
                if c.rx_keep + c.rx_len >= self.buf {
                    self.too_large(slot);
                    Step::Stop
                } else {
                    Step::Wait
                }
            }
            Too::Malformed => {
                self.fail(SessionCode::ProtocolViolation, "malformed control message");
                Step::Stop
            }
        }
    }

    /// A peer bidi stream's type (PROTOCOL.md §3.3); read only after the peer's SETUP (§3.4).
    fn parse_stream_type(&mut self, slot: usize) -> Step {
        if self.peer.is_none() {
            return Step::Wait;
        }
        let (code, n) = match varint::decode(self.rx_data(slot)) {
            Ok(v) => v,
            Err(_) => return Step::Wait,
        };
        let kind = match BidiStreamType::from_code(code) {
            Some(BidiStreamType::Announce) => Kind::AnnounceIn {
                state: AnnounceState::Request,
            },
            Some(BidiStreamType::Track) => Kind::TrackIn {
                done: false,
                deferred: false,
            },
            Some(BidiStreamType::Subscribe) => Kind::SubscribeIn {
                served: SubState::Waiting,
            },
            Some(BidiStreamType::Goaway) => {
                // PROTOCOL.md §3.12: at most one per direction.
                if self.goaway_received {
                    self.fail(SessionCode::ProtocolViolation, "second GOAWAY");
                    return Step::Stop;
                }
                self.goaway_received = true;
                Kind::GoawayIn { done: false }
            }
            // §3.11: we advertise no Probe level and do not implement probing;
            // FETCH (§3.10) is not served. Unknown types (§3.3): refuse the stream only.
            Some(BidiStreamType::Probe) | Some(BidiStreamType::Fetch) | None => {
                debug!("session: refusing bidi stream type {}", code);
                self.refuse(slot, StreamCode::Internal);
                return Step::Stop;
            }
        };
        self.control[slot].kind = kind;
        Step::Consumed(n)
    }

    /// The peer's SETUP (PROTOCOL.md §3.5).
    fn parse_setup(&mut self, slot: usize, done: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after SETUP");
            return Step::Stop;
        }
        let parsed = match decode_within::<Setup<'_>>(self.rx_data(slot), limit) {
            Ok((setup, n)) => Ok((setup.hop(), setup.role(), n)),
            Err(e) => Err(e),
        };
        match parsed {
            Ok((hop, role, n)) => {
                // Role and Path are client parameters; a server's are ignored.
                let role = match self.side {
                    Side::Server => role,
                    Side::Client => crate::wire::lite::Role::Both,
                };
                self.peer = Some(super::Peer { hop, role });
                self.control[slot].kind = Kind::SetupIn { done: true };
                debug!("session: peer SETUP, hop {}", hop);
                Step::Held(n)
            }
            Err(Too::Malformed) => {
                self.fail(SessionCode::ProtocolViolation, "malformed SETUP");
                Step::Stop
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// The peer's GOAWAY (PROTOCOL.md §3.12).
    fn parse_goaway(&mut self, slot: usize, done: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after GOAWAY");
            return Step::Stop;
        }
        let parsed = decode_within::<Goaway<'_>>(self.rx_data(slot), limit)
            .map(|(g, n)| (g.uri.is_empty(), n));
        match parsed {
            Ok((empty, n)) => {
                // Only a server may name a URI (lite-06 rule, applied to lite-05 too).
                if !empty && self.side == Side::Server {
                    self.fail(SessionCode::ProtocolViolation, "GOAWAY URI from a client");
                    return Step::Stop;
                }
                self.control[slot].kind = Kind::GoawayIn { done: true };
                Step::Held(n)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// ANNOUNCE_OK, then ANNOUNCEs, on our announce request (PROTOCOL.md §3.6).
    fn parse_announce(
        &mut self,
        slot: usize,
        id: u64,
        publisher: Option<u64>,
        limit: usize,
    ) -> Step {
        if publisher.is_none() {
            return match decode_within::<AnnounceOk>(self.rx_data(slot), limit) {
                Ok((ok, n)) => {
                    self.control[slot].kind = Kind::AnnounceOut {
                        id,
                        publisher: Some(ok.hop),
                    };
                    Step::Consumed(n)
                }
                Err(e) => self.on_decode_error(slot, e),
            };
        }
        let (hop, via) = (self.hop, publisher.unwrap_or(0));
        let joined = match decode_within::<Announce<'_>>(self.rx_data(slot), limit) {
            Ok((a, n)) => {
                let prefix = core::str::from_utf8(self.tx_kept(slot)).unwrap_or("");
                // PROTOCOL.md §4.3: the receiver discards an announcement whose route
                // (hops + the publisher) contains us, already contains the publisher
                // (a reflection), or would exceed 32 entries. Ended ones carry no hops.
                let looped = (hop != 0 && a.hops.contains(hop))
                    || (via != 0 && a.hops.contains(via))
                    || a.hops.len() >= MAX_HOPS;
                Ok((n, join(prefix, a.suffix).is_ok(), looped))
            }
            Err(e) => Err(e),
        };
        match joined {
            Ok((n, true, false)) => Step::Held(n),
            Ok((n, false, _)) => {
                debug!("session: announced path too long, ignored");
                Step::Consumed(n)
            }
            Ok((n, _, true)) => {
                debug!("session: looping announcement discarded");
                Step::Consumed(n)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// TRACK_INFO on our TRACK request (PROTOCOL.md §3.7).
    fn parse_track_info(&mut self, slot: usize, sub: u64, done: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after TRACK_INFO");
            return Step::Stop;
        }
        match decode_within::<TrackInfo>(self.rx_data(slot), limit) {
            Ok((info, n)) => {
                self.rx_consume(slot, n);
                if self.control[slot].rx_len > 0 {
                    self.fail(SessionCode::ProtocolViolation, "data after TRACK_INFO");
                    return Step::Stop;
                }
                // moq-dev FINs its side after reading TRACK_INFO.
                self.control[slot].fin = true;
                self.control[slot].kind = Kind::TrackOut { sub, done: true };
                self.on_track_info(sub, info);
                Step::Consumed(0)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }

    /// A typed response on our SUBSCRIBE (PROTOCOL.md §3.8).
    fn parse_response(&mut self, slot: usize, sub: u64) -> Step {
        match SubscribeResponse::decode(self.rx_data(slot)) {
            Ok((r, n)) => {
                self.on_response(sub, r);
                Step::Consumed(n)
            }
            Err(DecodeError::Incomplete) => Step::Wait,
            Err(_) => {
                self.fail(
                    SessionCode::ProtocolViolation,
                    "malformed subscribe response",
                );
                Step::Stop
            }
        }
    }

    /// The peer's FIN on a control stream, after everything before it was handled.
    fn on_control_fin(&mut self, slot: usize) {
        match self.control[slot].kind {
            Kind::Free => {}
            Kind::SetupIn { done } => {
                if !done {
                    self.fail(SessionCode::ProtocolViolation, "SETUP stream ended early");
                }
            }
            Kind::AnnounceOut { id, .. } => {
                self.announce_ended(slot, id, None);
                self.control[slot].fin = true;
            }
            Kind::TrackOut { sub, done } => {
                if !done {
                    // Finished without TRACK_INFO.
                    self.control[slot].fin = true;
                    self.track_failed(sub, StreamCode::Internal.to_code());
                }
            }
            Kind::SubscribeOut { sub } => {
                self.control[slot].fin = true;
                self.subscription_closed(sub, None);
            }
            Kind::SubscribeIn { served } => {
                // PROTOCOL.md §3.8: the subscriber's FIN cancels; answer with FIN.
                if let SubState::Serving(i) = served {
                    self.end_served(i, StreamCode::Cancel);
                }
                self.control[slot].kind = Kind::SubscribeIn {
                    served: SubState::Done,
                };
                self.control[slot].fin = true;
            }
            Kind::AnnounceIn { .. } | Kind::Peer | Kind::GoawayIn { .. } => {
                self.control[slot].fin = true;
            }
            Kind::TrackIn { .. } | Kind::SetupOut | Kind::GoawayOut => {}
        }
    }

    /// The peer reset its half of a stream.
    pub(super) fn on_stream_reset(&mut self, id: StreamId, code: u64) {
        if let Some(slot) = self.control_slot(id) {
            let c = &mut self.control[slot];
            c.rx_done = true;
            c.rx_len = 0;
            c.rx_fin = false;
            match c.kind {
                Kind::SetupIn { done: false } => {
                    self.fail(SessionCode::ProtocolViolation, "SETUP stream reset");
                }
                Kind::AnnounceOut { id, .. } => {
                    self.announce_ended(slot, id, Some(code));
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                Kind::TrackOut { sub, done } => {
                    self.reset_tx(slot, StreamCode::Cancel);
                    if !done {
                        self.track_failed(sub, code);
                    }
                }
                Kind::SubscribeOut { sub } => {
                    self.reset_tx(slot, StreamCode::Cancel);
                    self.subscription_closed(sub, Some(code));
                }
                Kind::SubscribeIn { served } => {
                    if let SubState::Serving(i) = served {
                        self.end_served(i, StreamCode::Cancel);
                    }
                    self.control[slot].kind = Kind::SubscribeIn {
                        served: SubState::Done,
                    };
                    self.reset_tx(slot, StreamCode::Cancel);
                }
                Kind::AnnounceIn { .. } | Kind::Peer => self.reset_tx(slot, StreamCode::Cancel),
                _ => {}
            }
            return;
        }
        self.group_reset(id, code);
    }

    /// The peer will not read what we send on a stream.
    pub(super) fn on_stop_sending(&mut self, id: StreamId, code: u64) {
        if let Some(slot) = self.control_slot(id) {
            let code = StreamCode::from_code(code);
            if let Kind::SubscribeIn { served } = self.control[slot].kind {
                if let SubState::Serving(i) = served {
                    self.end_served(i, StreamCode::Cancel);
                }
                self.control[slot].kind = Kind::SubscribeIn {
                    served: SubState::Done,
                };
            }
            self.reset_tx(slot, code);
            return;
        }
        self.group_stopped(id, code);
    }

    // ---- held events ----

    /// Releases the message the last `poll_event` returned and goes on parsing.
    pub(super) fn release_surfaced(&mut self) {
        let Some(slot) = self.surfaced.take() else {
            return;
        };
        let n = self.control[slot].event;
        self.control[slot].event = 0;
        self.rx_consume(slot, n);
        self.process_rx(slot);
    }

    /// A slot with a message waiting for `poll_event`.
    pub(super) fn next_held(&self) -> Option<usize> {
        self.control.iter().position(|c| c.event > 0)
    }

    /// The event for the message held in `slot` (validated when it was parsed).
    pub(super) fn held_event(&mut self, slot: usize) -> Option<Event<'_>> {
        let c = self.control[slot];
        let start = slot * self.buf + c.rx_keep;
        let msg = self.rx.get(start..start + c.event)?;
        match c.kind {
            Kind::SetupIn { .. } => {
                let (setup, _) = decode_message::<Setup<'_>>(msg).ok()?;
                let path = match self.side {
                    Side::Server => setup.path(),
                    Side::Client => None,
                };
                Some(Event::Setup {
                    hop: setup.hop(),
                    role: self.peer.map_or(crate::wire::lite::Role::Both, |p| p.role),
                    path,
                })
            }
            Kind::GoawayIn { .. } => {
                let (g, _) = decode_message::<Goaway<'_>>(msg).ok()?;
                Some(Event::Goaway { uri: g.uri })
            }
            Kind::AnnounceOut { id, publisher } => {
                let (a, _) = decode_message::<Announce<'_>>(msg).ok()?;
                let base = slot * self.buf;
                let kept = self.tx.get(base..base + c.tx_keep)?;
                let prefix = core::str::from_utf8(kept).ok()?;
                self.scratch = join(prefix, a.suffix).ok()?;
                let path = self.scratch.as_str();
                let request = AnnounceId(id);
                Some(if a.status.is_active() {
                    Event::Announced {
                        request,
                        path,
                        hops: a.hops,
                        publisher: publisher.unwrap_or(0),
                    }
                } else {
                    Event::Unannounced { request, path }
                })
            }
            _ => None,
        }
    }

    /// The public form of a queued event.
    pub(super) fn queued_event(&self, q: Queued) -> Event<'_> {
        match q {
            Queued::Connected(protocol) => Event::Connected { protocol },
            Queued::AnnounceEnded(request, code) => Event::AnnounceEnded { request, code },
            Queued::TrackInfo(subscription, info) => Event::TrackInfo { subscription, info },
            Queued::Started(subscription, group) => Event::Started {
                subscription,
                group,
            },
            Queued::Group(subscription, sequence) => Event::Group {
                subscription,
                sequence,
            },
            Queued::Dropped(subscription, start, end, code) => Event::Dropped {
                subscription,
                start,
                end,
                code,
            },
            Queued::Ended(subscription, end) => Event::Ended { subscription, end },
            Queued::SubscriptionClosed(subscription, code) => {
                Event::SubscriptionClosed { subscription, code }
            }
            Queued::Closed {
                code,
                application,
                local,
            } => Event::Closed {
                code,
                reason: self.close_reason.as_str(),
                application,
                local,
            },
        }
    }

    // ---- SETUP and GOAWAY ----

    /// Our SETUP parameters (PROTOCOL.md §3.5): client Path and Role, both Hop;
    /// no Probe (we do not implement probing, §3.11).
    fn setup_params(&self) -> ([Param<'s>; 3], usize) {
        let mut params = [Param::Hop(0); 3];
        let mut n = 0;
        if let Some(path) = self.path {
            params[n] = Param::Path(path);
            n += 1;
        }
        if self.role != crate::wire::lite::Role::Both {
            params[n] = Param::Role(self.role);
            n += 1;
        }
        if self.hop != 0 {
            params[n] = Param::Hop(self.hop);
            n += 1;
        }
        (params, n)
    }

    /// The encoded size of our Setup stream (type and SETUP), if it encodes.
    pub(super) fn setup_len(&self) -> Option<usize> {
        let (params, n) = self.setup_params();
        let setup = Setup::new(params.get(..n)?);
        Some(UniStreamType::Setup.encoded_len() + message_len(&setup).ok()?)
    }

    /// Opens our Setup stream with SETUP and FIN (PROTOCOL.md §3.4: promptly, always).
    pub(super) fn send_setup(&mut self) {
        if self.setup_sent {
            return;
        }
        self.setup_sent = true;
        let Some(slot) = self.alloc_control(Kind::SetupOut, Dir::Uni, None) else {
            self.fail(SessionCode::Internal, "no control slot for SETUP");
            return;
        };
        let (params, n) = self.setup_params();
        let written = self.tx_write(slot, |w| {
            UniStreamType::Setup.write(w)?;
            write_message(&Setup::new(params.get(..n).unwrap_or(&[])), w)
        });
        if written.is_err() {
            self.fail(SessionCode::Internal, "SETUP does not fit");
            return;
        }
        let c = &mut self.control[slot];
        c.fin = true;
        c.rx_done = true;
        self.open_pending();
    }

    /// Sends GOAWAY on a new stream (PROTOCOL.md §3.12): the peer should make no
    /// new requests and reconnect to `uri` ("" = the same place) when done.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a second GOAWAY or a non-empty `uri` from a client;
    /// [`Error::TooLarge`] if it does not fit a control buffer;
    /// [`Error::ControlFull`], [`Error::NotReady`], [`Error::Closed`].
    pub fn goaway(&mut self, uri: &str) -> Result<(), Error> {
        self.release_surfaced();
        self.dirty = true;
        self.check_ready()?;
        if self.goaway_sent || (!uri.is_empty() && self.side == Side::Client) {
            return Err(Error::Invalid);
        }
        let slot = self
            .alloc_control(Kind::GoawayOut, Dir::Bidi, None)
            .ok_or(Error::ControlFull)?;
        let written = self.tx_write(slot, |w| {
            BidiStreamType::Goaway.write(w)?;
            write_message(&Goaway { uri }, w)
        });
        if written.is_err() {
            self.free_slot(slot);
            return Err(Error::TooLarge);
        }
        self.control[slot].fin = true;
        self.goaway_sent = true;
        self.open_pending();
        Ok(())
    }

    /// Fails unless requests may be made now.
    pub(super) fn check_ready(&self) -> Result<(), Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if !self.conn.is_established() {
            return Err(Error::NotReady);
        }
        Ok(())
    }

    /// The peer's TRACK requests waiting for TRACK_INFO now.
    fn waiting_tracks(&self) -> usize {
        self.control
            .iter()
            .filter(|c| matches!(c.kind, Kind::TrackIn { deferred: true, .. }))
            .count()
    }

    /// Parses the peer's TRACK request and answers it (PROTOCOL.md §3.7).
    fn parse_track(&mut self, slot: usize, done: bool, deferred: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after TRACK");
            return Step::Stop;
        }
        let origin = self.origin;
        let resolver = self.resolver;
        // Over the limit of waiting requests, a new one is not resolved:
        // only a track whose values are known can answer it.
        let over = !deferred && self.waiting_tracks() >= self.max_waiting_tracks;
        let data = rx_of(self.rx, &self.control[slot], self.buf, slot);
        let answer = match decode_within::<Track<'_>>(data, limit) {
            Ok((t, n)) => {
                let found = match normalize(t.broadcast, &mut self.scratch) {
                    Some(path) if over => match lookup(origin, path, t.track) {
                        Err(StreamCode::NotFound) => Err(StreamCode::Evicted),
                        found => found,
                    },
                    // Asked again while waiting for TRACK_INFO: only the
                    // track resolved then (or a newer one of its name).
                    Some(path) if deferred => lookup(origin, path, t.track),
                    Some(path) => {
                        super::resolve::lookup_or_resolve(origin, resolver, path, t.track)
                    }
                    None => Err(StreamCode::NotFound),
                };
                Ok((n, found))
            }
            Err(e) => Err(e),
        };
        // A relay track re-serves its upstream's TRACK_INFO (PROTOCOL.md
        // §3.7): wait for it, unless the track ended without it.
        let answer = match answer {
            Ok((n, Ok(track))) if !track.info_known() => match track.status() {
                track::Status::Open if over => Ok((n, Err(StreamCode::Evicted))),
                track::Status::Open => {
                    self.control[slot].kind = Kind::TrackIn {
                        done: false,
                        deferred: true,
                    };
                    return Step::Defer;
                }
                track::Status::Aborted(code) => Ok((n, Err(StreamCode::from_code(code)))),
                track::Status::Finished => Ok((n, Err(StreamCode::NotFound))),
            },
            Ok((n, Ok(track))) => Ok((n, Ok(track.info().to_wire()))),
            Ok((n, Err(code))) => Ok((n, Err(code))),
            Err(e) => Err(e),
        };
        if over && matches!(answer, Ok((_, Err(StreamCode::Evicted)))) {
            debug!("session: too many TRACK requests waiting, refusing one");
            self.refused_tracks += 1;
        }
        match answer {
            Ok((n, Ok(info))) => {
                self.control[slot].kind = Kind::TrackIn {
                    done: true,
                    deferred: false,
                };
                if self.tx_write(slot, |w| write_message(&info, w)).is_err() {
                    self.refuse(slot, StreamCode::Internal);
                    return Step::Stop;
                }
                self.control[slot].fin = true;
                Step::Consumed(n)
            }
            Ok((_, Err(code))) => {
                self.refuse(slot, code);
                Step::Stop
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }
}

/// The unparsed receive bytes of control slot `slot` (`c`) in the session's
/// receive memory `rx` of `buf`-byte buffers; a field-level borrow, so other
/// fields of the session stay usable.
pub(super) fn rx_of<'b>(rx: &'b [u8], c: &Control, buf: usize, slot: usize) -> &'b [u8] {
    let start = slot * buf + c.rx_keep;
    rx.get(start..start + c.rx_len).unwrap_or(&[])
}

/// `prefix` joined with `suffix` segment-wise (PROTOCOL.md §3.6).
pub(super) fn join(prefix: &str, suffix: &str) -> Result<PathBuf<{ super::MAX_PATH }>, ()> {
    let mut suffix_buf = PathBuf::<{ super::MAX_PATH }>::new();
    let suffix = Path::new_in(suffix, &mut suffix_buf).map_err(|_| ())?;
    let prefix = Path::new(prefix).map_err(|_| ())?;
    PathBuf::join(prefix, suffix).map_err(|_| ())
}

/// The local track `name` of broadcast `broadcast` (PROTOCOL.md §4.4: an
/// unknown broadcast is UNROUTABLE, an unknown track NOT_FOUND).
pub(super) fn lookup<'a, 'p>(
    origin: Option<crate::model::origin::Ref<'a, 'p>>,
    broadcast: Path<'_>,
    name: &str,
) -> Result<crate::model::track::Ref<'a, 'p>, StreamCode> {
    let b = origin
        .and_then(|o| o.get(broadcast))
        .ok_or(StreamCode::Unroutable)?;
    b.track(name).ok_or(StreamCode::NotFound)
}

/// A broadcast path off the wire, normalized (in `buf` if it had to be collapsed).
pub(super) fn normalize<'s>(
    s: &'s str,
    buf: &'s mut PathBuf<{ super::MAX_PATH }>,
) -> Option<Path<'s>> {
    Path::new_in(s, buf).ok()
}
