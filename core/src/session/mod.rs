//! The sans-IO moq-lite-05 session over a QMux [`Connection`] or another
//! [`Transport`] (docs/protocol.md §3, §4).
//!
//! A [`Session`] speaks moq-lite on top of the connection: it sends and reads
//! SETUP, serves the peer's requests from local media (publisher side: the
//! broadcasts of an [`origin`] and their
//! [`track`]s), makes requests of its own (subscriber
//! side: announcements, and subscriptions that fill a local track),
//! and moves group bytes between pooled [`group`](crate::model::group)s and
//! group streams. Like the connection it performs no I/O, reads no clock and
//! allocates nothing: every table is fixed-capacity and lives in a
//! caller-provided [`Storage`].
//!
//! # Driving it
//!
//! In the spirit of quinn-proto, four calls move bytes and time, and one
//! reports what happened:
//!
//! * [`Session::handle_input`] with every byte received from the TCP socket that
//!   has not been consumed yet, oldest first. It returns how many bytes were
//!   used; keep the rest (a partial record, or data the session could not take
//!   yet) at the front of the buffer for the next call. An [`Inbox`] over the
//!   driver's receive buffer does that bookkeeping ([`Inbox::feed`]).
//! * [`Session::poll_transmit`] after every other call, until it returns 0:
//!   it writes QMux records into the caller's buffer, to be sent in order.
//! * [`Session::poll_timeout`] / [`Session::handle_timeout`]: sleep until that
//!   instant (or readable input), then call `handle_timeout`.
//! * [`Session::poll_event`] after every `handle_input` / `handle_timeout`,
//!   until it returns `None`.
//!
//! Local media changes (a publisher wrote a frame, a reader consumed one) are
//! noticed by polling: call [`Session::poll_transmit`] after them too.
//!
//! Over another transport ([`Session::with_transport`]) the driver hands the
//! transport's events to [`Session::handle_event`] in place of
//! `handle_input`; the rest is the same (see [`crate::transport`]).
//!
//! # Backpressure
//!
//! The session never buffers group bytes outside the pool. When the pool has
//! no free block for a received group, or the event queue is full, or a control
//! message waits in its buffer for [`Session::poll_event`], `handle_input`
//! stops and returns fewer bytes consumed than it was given: the unconsumed
//! bytes must be presented again (first) in the next call, after local readers
//! consumed data or events were polled. This backpressures the socket.
//!
//! # Pacing
//!
//! On the subscriber side, credit for a received group stream is released to
//! the peer only as local readers of the group advance (its furthest-read
//! position), so a parked reader holds the peer at one stream-credit window
//! of that group. On the publisher side a group stream sends only within its
//! QMux credit and, after each pass's writes, reports its remaining credit to
//! the group it reads, so the local producer, pacing itself with
//! [`Producer::poll_paced`](crate::model::group::Producer::poll_paced), stays
//! at most one window ahead of what the peer accepted (see [`crate::pacing`]).
//! Several sessions reading one group: the fastest reader's window counts;
//! when a session ends, its streams stop pacing the group.
//!
//! # Limits
//!
//! Every table has a fixed capacity; a request that finds its table full is
//! refused on the wire (the stream is reset and stopped with INTERNAL 0x0 for
//! control streams; a group stream is stopped with EVICTED 0x35), never grown.

mod changes;
mod config;
mod control;
mod error;
mod event;
mod inbox;
mod pass;
mod publisher;
mod qmux;
mod resolve;
mod scope;
mod slots;
mod subscriber;

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;

pub use changes::{Change, LISTED_CHANGES};
pub use config::{Config, DefaultStorage, MIN_BUF, PublisherTables, Storage, SubscriberTables};
pub use error::{ConfigError, Error};
#[cfg(any(test, feature = "alloc"))]
pub use event::OwnedEvent;
pub use event::{AnnounceId, Event, FetchId, SubscriptionId};
pub use inbox::{Fed, Inbox};
pub use pass::{Handler, Once, Out, Passed, Transmitted};
pub use resolve::Resolve;
pub use scope::Scope;

use heapless::{Deque, String};

use crate::conn::{self, CloseCause, Connection};
use crate::model::path::PathBuf;
use crate::model::{origin, track};
use crate::pool::{Block, Slice};
use crate::time::{Duration, Instant};
use crate::transport::Transport;
use crate::wire::lite::{Role, SessionCode};
use crate::wire::qmux::{Side, StreamId};
use control::Control;
use event::{Queued, Waiting};
use publisher::{GroupOut, Served};
use slots::Slots;
use subscriber::{GroupIn, SubEntry};

/// Events queued until [`Session::poll_event`]; input stops while it is nearly full.
///
/// Ends (of a subscription, an announce request) that find it full wait in
/// what they end, and the close in its own place (see [`Event`]).
const EVENTS: usize = 32;

/// Free event slots required before another input event or control message is processed.
const EVENT_MARGIN: usize = 4;

/// Longest broadcast path the session joins or normalizes for its own use
/// (announced paths in events, paths of requests it serves).
pub const MAX_PATH: usize = 256;

/// Stream data the session could not take yet: the front of the next input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stall {
    id: StreamId,
    len: usize,
    fin: bool,
}

/// Data received by reference that the session could not take yet.
struct StallRef<'p> {
    id: StreamId,
    /// Stream position of the first byte (`u64::MAX` once some were taken).
    offset: u64,
    /// The data: a token still to resolve, or the foreign block holding it.
    data: RefData<'p>,
    fin: bool,
}

/// Data by reference, resolved or not.
enum RefData<'p> {
    /// Not resolved yet (the pool had no slot): the token and length.
    Token(u64, u64),
    /// In this foreign block, of which this many bytes were taken.
    Block(Block<'p>, usize),
}

/// What we learned from the peer's SETUP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Peer {
    hop: u64,
    role: Role,
}

/// Where [`Session::poll_transmit_gather`] puts the group payload it leaves
/// in the pool instead of copying it.
pub trait Gather<'p> {
    /// How many more payload ranges fit (a record whose payload spans blocks
    /// takes one per block).
    fn room(&self) -> usize;
    /// Lends `slice` to a transport that takes data by reference
    /// ([`Transport::lends`]): keeps it (its block stays unchanged) until the
    /// peer of a link in the same process gives the returned token back, or
    /// the transport's send buffer lets go of it. `None` (the default) sends
    /// the bytes instead.
    fn lend(&mut self, slice: Slice<'p>) -> Option<u64> {
        let _ = slice;
        None
    }
    /// The bytes of `slice` go on the wire right after the first `at` bytes
    /// the call wrote to its `out` buffer (ranges come in order).
    fn push(&mut self, at: usize, slice: Slice<'p>);
}

/// Resolves the tokens of STREAM_REF records (data passed by reference on a
/// link inside one process, [`conn::Config::stream_refs`]) to the bytes they name.
pub trait Foreign<'p> {
    /// The `len` bytes `token` names, as a foreign block of the session's pool
    /// ([`crate::pool::Pool::adopt`]).
    ///
    /// # Errors
    /// [`ForeignError::Unknown`] if the token names nothing (the session
    /// closes with INTERNAL), [`ForeignError::Exhausted`] if the pool has no
    /// metadata slot free (the session stops taking input and asks again on
    /// its next call, as for a full pool).
    fn resolve(&self, token: u64, len: u64) -> Result<Block<'p>, ForeignError>;
}

/// Why [`Foreign::resolve`] gave no block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForeignError {
    /// The token names no lent bytes of that length.
    Unknown,
    /// No metadata slot is free in the pool right now.
    Exhausted,
}

/// A shorter-lived handle on an optional [`Gather`], for one call in a loop.
fn reborrow<'b, 'p>(gather: &'b mut Option<&mut dyn Gather<'p>>) -> Option<&'b mut dyn Gather<'p>> {
    match gather {
        Some(g) => Some(&mut **g),
        None => None,
    }
}

/// A moq-lite-05 session over one transport: by default a QMux connection
/// with room for `N` live streams.
///
/// `'s` borrows the [`Storage`] and the client path; `'a` is how long the
/// local media (origin, broadcasts, tracks) outlive the session; `'p` is the
/// lifetime of the block pool behind the groups. `T` carries the streams
/// ([`Transport`]); `N` sizes the QMux connection's stream table and means
/// nothing to another transport. See the [module documentation](self) for
/// how to drive it.
pub struct Session<'s, 'a, 'p, const N: usize, T: Transport = Connection<N>> {
    conn: T,
    side: Side,
    hop: u64,
    path: Option<&'s str>,
    role: Role,
    setup_timeout: Duration,
    /// Largest FRAME payload accepted on a received group stream.
    max_frame: u64,
    /// See [`Config::announce_step`].
    announce_step: u64,
    /// How long an incomplete control message may wait (zero: forever).
    control_timeout: Duration,
    /// The latest instant a call was given.
    now: Instant,
    origin: Option<origin::Ref<'a, 'p>>,
    /// Asked for tracks the peer requests that a known broadcast lacks.
    resolver: Option<&'s dyn Resolve<'a, 'p>>,
    /// Admits the client at its SETUP and limits what it may see.
    scope: Option<&'s dyn Scope>,

    control: Slots<'s, Control>,
    /// The control buffers, `buf` bytes each, lent to slots while they need
    /// them (see [`Storage`]).
    chunks: &'s mut [u8],
    /// Which control buffers a slot holds.
    chunk_used: &'s mut [bool],
    /// Control buffers no slot holds.
    free_chunks: usize,
    buf: usize,
    served: Slots<'s, Option<Served<'a, 'p>>>,
    subs: Slots<'s, Option<SubEntry<'a, 'p>>>,
    out: Slots<'s, Option<GroupOut<'a, 'p>>>,
    inc: Slots<'s, Option<GroupIn<'a, 'p>>>,

    events: Deque<Queued, EVENTS>,
    /// Ends waiting for room in `events` (in subscription entries and control
    /// slots); while there are any, `events` is full.
    waiting: usize,
    /// The order number of the next end to wait.
    next_waiting: u64,
    /// [`Event::Closed`], reported after every other event.
    close_event: Option<Queued>,
    /// A control slot whose held message the last `poll_event` returned.
    surfaced: Option<usize>,
    stall: Option<Stall>,
    /// Resolves STREAM_REF tokens ([`Session::set_foreign`]).
    foreign: Option<&'s dyn Foreign<'p>>,
    stall_ref: Option<StallRef<'p>>,
    /// Something may need driving: set by every call that can change the
    /// session's state, cleared by a `poll_transmit` pass whose last round
    /// wrote nothing with room to spare.
    dirty: bool,
    /// A control buffer was wanted and none was free since the current
    /// `drive` began.
    chunk_starved: bool,
    /// The last `drive` freed control buffers after one of its steps found
    /// none: another drive may do more, so the session is not idle.
    drive_freed: bool,
    /// A TRACK request waits for its track's TRACK_INFO (retried every pass).
    deferred: bool,
    /// See [`Config::max_waiting_tracks`].
    max_waiting_tracks: usize,
    /// See [`Config::max_served`] (applied to attached tables too).
    max_served: usize,
    /// See [`Config::max_fetches`].
    max_fetches: usize,
    /// See [`Config::fetch_misses`].
    fetch_misses: bool,
    /// The number of the next [`Event::Fetch`].
    next_fetch: u64,
    /// The number of our next fetch ([`Session::fetch`]).
    next_fetch_out: u64,
    /// The peer's SETUP was read by a session with no table for either
    /// direction: input waits until the application has seen
    /// [`Event::Setup`] or attached tables.
    awaiting_tables: bool,
    /// TRACK requests refused by [`Config::max_waiting_tracks`] so far.
    refused_tracks: u64,
    /// [`Session::media_stamp`] when `dirty` was last cleared.
    stamp: u64,
    /// Served subscriptions started, updated or ended so far.
    served_changes: u64,
    /// Our subscriptions opened or closed so far.
    filled_changes: u64,
    /// Tracks changed since the driver last polled ([`Session::poll_changed`]).
    changes: changes::Changes,
    /// Joined or normalized paths handed out in events.
    scratch: PathBuf<MAX_PATH>,
    /// Server: the path the client dialed, which every path it names is
    /// relative to (docs/protocol.md §4.1); empty for the origin's root.
    root: PathBuf<MAX_PATH>,
    close_reason: String<{ conn::MAX_REASON_LEN }>,

    established: Option<Instant>,
    setup_sent: bool,
    peer: Option<Peer>,
    setup_seen: bool,
    goaway_sent: bool,
    goaway_received: bool,
    closed: bool,
    next_subscribe: u64,
    next_announce: u64,
    /// ANNOUNCE messages written to the peer (active and ended).
    announces_sent: u64,
    /// Work counters a test reads to bound a scan's cost.
    #[cfg(test)]
    visits: Visits,
}

/// Entries the session's scans visited, for tests that bound their cost.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
struct Visits {
    /// Origin entries walked to send announce requests' initial sets.
    announce: usize,
    /// The most group-stream slots one `flush_groups` call visited.
    groups: usize,
    /// `flush_groups` calls: a transmit's rounds over the group streams.
    group_rounds: usize,
}

/// The storage's shape errors, checked before anything is built.
fn check_storage(control: usize, buf: usize, chunks: usize) -> Result<(), ConfigError> {
    if control == 0 {
        return Err(ConfigError::NoControl);
    }
    if chunks < 2 {
        return Err(ConfigError::TooFewChunks);
    }
    if buf < MIN_BUF {
        return Err(ConfigError::BufferTooSmall);
    }
    Ok(())
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// A new session over `transport`, a just-connected transport of any kind
    /// ([`Transport`]), created at `now`; [`new`](Session::new) builds the
    /// QMux connection itself. `config.conn` configures QMux only and is not
    /// read here.
    ///
    /// The driver feeds the transport's events to
    /// [`handle_event`](Self::handle_event) and calls
    /// [`poll_transmit`](Self::poll_transmit) as for QMux.
    ///
    /// # Errors
    /// [`ConfigError`] if the control buffers are smaller than [`MIN_BUF`]
    /// or cannot hold our SETUP, or the storage has no control slot.
    pub fn with_transport<
        const CONTROL: usize,
        const BUF: usize,
        const SERVE: usize,
        const SUBS: usize,
        const OUT: usize,
        const IN: usize,
        const CHUNKS: usize,
    >(
        side: Side,
        config: Config<'s>,
        transport: T,
        now: Instant,
        storage: &'s mut Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>,
        origin: Option<origin::Ref<'a, 'p>>,
    ) -> Result<Self, ConfigError> {
        check_storage(CONTROL, BUF, CHUNKS)?;
        let conn = transport;
        let Storage {
            control,
            chunks,
            chunk_used,
            served,
            subs,
            out,
            inc,
        } = storage;
        // Storage may come from an earlier session: start from empty tables.
        // (A session that ended unregistered what it served, see `teardown`.)
        control.fill(Control::FREE);
        chunk_used.fill(false);
        let (served, out) = clear_publisher_tables(served, out, config.max_served);
        clear_subscriber_tables(subs, inc);
        let session = Session {
            conn,
            side,
            hop: config.hop,
            path: config.path.filter(|p| !p.is_empty()),
            role: match side {
                Side::Client => config.role,
                Side::Server => Role::Both,
            },
            setup_timeout: config.setup_timeout,
            max_frame: config.max_frame_bytes,
            announce_step: config.announce_step,
            control_timeout: config.control_timeout,
            max_waiting_tracks: config.max_waiting_tracks,
            max_served: config.max_served,
            max_fetches: config.max_fetches,
            fetch_misses: config.fetch_misses,
            next_fetch: 0,
            next_fetch_out: 0,
            awaiting_tables: false,
            refused_tracks: 0,
            now,
            origin,
            resolver: None,
            scope: None,
            root: PathBuf::new(),
            control: Slots::new(control.as_mut_slice()),
            chunks: chunks.as_flattened_mut(),
            chunk_used: chunk_used.as_mut_slice(),
            free_chunks: CHUNKS,
            buf: BUF,
            served: Slots::new(served),
            subs: Slots::new(subs),
            out: Slots::new(out),
            inc: Slots::new(inc),
            events: Deque::new(),
            waiting: 0,
            next_waiting: 0,
            close_event: None,
            surfaced: None,
            stall: None,
            foreign: None,
            stall_ref: None,
            dirty: true,
            chunk_starved: false,
            drive_freed: true,
            deferred: false,
            stamp: 0,
            served_changes: 0,
            filled_changes: 0,
            changes: changes::Changes::new(),
            scratch: PathBuf::new(),
            close_reason: String::new(),
            established: None,
            setup_sent: false,
            peer: None,
            setup_seen: false,
            goaway_sent: false,
            goaway_received: false,
            closed: false,
            next_subscribe: 0,
            next_announce: 0,
            announces_sent: 0,
            #[cfg(test)]
            visits: Visits::default(),
        };
        if session.setup_len().is_none_or(|n| n > BUF) {
            return Err(ConfigError::SetupTooLarge);
        }
        Ok(session)
    }

    /// Which end of the TCP connection we are.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The transport underneath (read-only: its state, credit).
    pub fn transport(&self) -> &T {
        &self.conn
    }

    /// The transport underneath, for a driver that feeds it what it received
    /// and reads from it (a transport that receives on its own). Streams are
    /// the session's: opening, writing, resetting, stopping or closing
    /// through this handle leaves the session out of step with its streams.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.conn
    }

    /// True once the transport is established: requests may be made.
    pub fn is_established(&self) -> bool {
        self.conn.is_established() && !self.closed
    }

    /// True once the peer's SETUP arrived (docs/protocol.md §3.4).
    pub fn is_setup(&self) -> bool {
        self.peer.is_some()
    }

    /// The peer's Hop ID from its SETUP (0 until it arrives, or if it sent none).
    pub fn peer_hop(&self) -> u64 {
        self.peer.map_or(0, |p| p.hop)
    }

    /// True once the peer sent GOAWAY: new requests are refused with [`Error::GoingAway`].
    #[cfg(test)]
    pub fn is_going_away(&self) -> bool {
        self.goaway_received
    }

    /// True once the session is over (either side closed it, or a timer ran out).
    pub fn is_closed(&self) -> bool {
        self.closed || self.conn.is_closed()
    }

    /// True once closed and the close frame was written: the caller may shut the
    /// TCP connection down and drop the session.
    pub fn is_drained(&self) -> bool {
        self.conn.is_drained()
    }

    /// How many times a subscription this session serves started, changed
    /// its request or ended: each changes the demand on a local track (a
    /// relay follows it upstream).
    #[cfg(test)]
    pub fn served_changes(&self) -> u64 {
        self.served_changes
    }

    /// A counter that changes whenever the set of [`served_tracks`] or of
    /// [`filled_tracks`] may have: a driver that registered on those tracks
    /// need not walk them again while it stays the same.
    ///
    /// [`served_tracks`]: Session::served_tracks
    /// [`filled_tracks`]: Session::filled_tracks
    pub fn tracks_version(&self) -> u64 {
        self.served_changes.wrapping_add(self.filled_changes)
    }

    /// The local tracks our subscriptions fill (their versions change only
    /// through this session).
    pub fn filled_tracks(&self) -> impl Iterator<Item = track::Ref<'a, 'p>> + '_ {
        self.subs
            .iter()
            .flatten()
            .filter_map(SubEntry::open)
            .map(|s| s.producer.track())
    }

    /// The local tracks the peer's subscriptions are served from.
    pub fn served_tracks(&self) -> impl Iterator<Item = track::Ref<'a, 'p>> + '_ {
        self.served.iter().flatten().map(|s| s.source)
    }

    /// The peer's TRACK requests refused so far because
    /// [`Config::max_waiting_tracks`] were waiting already.
    pub fn refused_track_requests(&self) -> u64 {
        self.refused_tracks
    }

    /// True while received bytes wait at the front of the input because the
    /// session could not take them (pool exhausted, events or a held message
    /// not polled), or data received by reference waits inside the session;
    /// see the module documentation on backpressure. Call
    /// [`handle_input`](Self::handle_input) again then, even with no new bytes.
    pub fn is_stalled(&self) -> bool {
        self.stall.is_some() || self.stall_ref.is_some()
    }

    /// True while a request of the peer's waits for local media it does not
    /// name yet (a TRACK request for a relay track whose TRACK_INFO has not
    /// come): a change of any local track may let the next call answer it.
    pub fn has_deferred_requests(&self) -> bool {
        self.deferred
    }

    /// ANNOUNCE messages (active and ended) written to the peer so far, on
    /// every announce stream it opened.
    pub fn announcements_sent(&self) -> u64 {
        self.announces_sent
    }

    /// Subscriptions the peer holds on our tracks.
    pub fn served_count(&self) -> usize {
        self.served.iter().filter(|s| s.is_some()).count()
    }

    /// Group streams we are sending right now.
    pub fn sending_groups(&self) -> usize {
        self.out.iter().filter(|s| s.is_some()).count()
    }

    /// Group streams we are receiving right now.
    pub fn receiving_groups(&self) -> usize {
        self.inc.iter().filter(|s| s.is_some()).count()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called, if ever.
    ///
    /// Ask again after every other call: the answer changes.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_closed() {
            return None;
        }
        let setup = match (self.established, self.peer) {
            (Some(at), None) if self.setup_timeout > Duration::ZERO => {
                Some(at.saturating_add(self.setup_timeout))
            }
            _ => None,
        };
        let deadline = match (self.conn.poll_timeout(), setup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = match (deadline, self.partial_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (deadline, self.ending_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the oldest incomplete control message times out, if one waits
    /// and the timeout is on.
    fn partial_deadline(&self) -> Option<Instant> {
        if self.control_timeout == Duration::ZERO {
            return None;
        }
        self.control
            .iter()
            .filter_map(|c| c.partial_since)
            .min()
            .map(|t| t.saturating_add(self.control_timeout))
    }

    /// Runs the timers due at `now`; call it when [`poll_timeout`](Self::poll_timeout)'s
    /// instant is reached (earlier or repeated calls are harmless), then drain
    /// [`poll_event`](Self::poll_event) and [`poll_transmit`](Self::poll_transmit).
    ///
    /// The connection's handshake and idle timeouts end the session
    /// ([`Event::Closed`]); the SETUP timeout and the control-message timeout
    /// (`Config::control_timeout`) close it with CONTROL_MESSAGE_TIMEOUT (0x11).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.release_surfaced();
        self.dirty = true;
        self.now = now;
        if self.is_closed() {
            return;
        }
        if let Some(c) = self.conn.handle_timeout(now) {
            self.on_closed(c);
            return;
        }
        if let (Some(at), None) = (self.established, self.peer)
            && self.setup_timeout > Duration::ZERO
            && now >= at.saturating_add(self.setup_timeout)
        {
            self.fail(SessionCode::ControlMessageTimeout, "setup timeout");
            return;
        }
        if self.partial_deadline().is_some_and(|t| now >= t) {
            // A peer trickling a control message (slowloris): the idle timer,
            // reset by every byte, never fires.
            self.fail(
                SessionCode::ControlMessageTimeout,
                "control message timeout",
            );
            return;
        }
        self.drive();
    }

    /// Processes one event of the transport: the entry for a transport that
    /// receives on its own (see [`crate::transport`] on receiving), where
    /// [`handle_input`](Session::handle_input) is the one for QMux bytes.
    /// Returns how many bytes of an [`Event::StreamData`](conn::Event::StreamData)'s
    /// `data` the session took; other events are taken whole (a
    /// [`StreamRef`](conn::Event::StreamRef) reports its `len`, or 0 if it must
    /// come again).
    ///
    /// The data of each stream comes in order, `offset` being the stream
    /// position of its first byte (`at` is not read). When the session takes
    /// fewer bytes than it was given (see the module documentation on
    /// backpressure), [`is_stalled`](Self::is_stalled) turns true: present the
    /// rest again, first, from `offset` plus the bytes taken, once events were
    /// polled or local readers consumed. A driver whose transport returns
    /// credit as data leaves its buffer reads no more than the session has
    /// room for ([`crate::transport`] on flow control).
    ///
    /// Afterwards drain [`poll_event`](Self::poll_event) and
    /// [`poll_transmit`](Self::poll_transmit).
    ///
    /// # Errors
    /// [`Error::Closed`] once the session is over.
    pub fn handle_event(&mut self, now: Instant, event: conn::Event<'_>) -> Result<usize, Error> {
        self.release_surfaced();
        self.dirty = true;
        self.now = now;
        // The transport is closed already when it reports its own end.
        if self.closed || (self.conn.is_closed() && !matches!(event, conn::Event::Closed(_))) {
            return Err(Error::Closed);
        }
        self.resume();
        if cfg!(feature = "stream-refs")
            && self.has_event_room()
            && let Some(st) = self.stall_ref.take()
        {
            let _ = self.take_ref(now, st);
        }
        let taken = match event {
            conn::Event::StreamData {
                id,
                offset,
                data,
                fin,
                ..
            } => {
                if self.stall.is_some_and(|st| st.id == id) {
                    self.stall = None;
                }
                let used = if self.has_event_room() && !self.awaiting_tables {
                    self.on_stream_data(now, id, offset, data, None, fin)
                } else {
                    0
                };
                if used < data.len() && !self.is_closed() {
                    self.stall = Some(Stall {
                        id,
                        len: data.len() - used,
                        fin,
                    });
                }
                used
            }
            conn::Event::StreamRef {
                id,
                offset,
                len,
                token,
                fin,
            } => {
                if !cfg!(feature = "stream-refs") {
                    self.fail(SessionCode::Internal, "stream reference");
                    0
                } else if self.stall_ref.is_some() || !self.has_event_room() {
                    0
                } else {
                    let st = StallRef {
                        id,
                        offset,
                        data: RefData::Token(token, len),
                        fin,
                    };
                    let _ = self.take_ref(now, st);
                    usize::try_from(len).unwrap_or(usize::MAX)
                }
            }
            other => {
                self.on_conn_event(now, other);
                0
            }
        };
        self.drive();
        Ok(taken)
    }

    /// Writes QMux records into `out` and returns how many bytes it wrote (0 when
    /// there is nothing to send or no room).
    ///
    /// Order (docs/protocol.md §2.8, §4.6): connection control frames first (our
    /// parameters, resets, credit, pings, the close), then control-stream
    /// messages, then group-stream data ranked by subscriber priority (higher
    /// first), then subscription age (older Subscribe ID first), then group
    /// sequence (newest first). Call it after every other call, and after local
    /// media changed, until it returns 0; send the bytes in order.
    ///
    /// `out` should hold at least one full record (16390 bytes); a smaller
    /// buffer works but cuts records short.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        self.transmit(now, out, None)
    }

    /// Like [`poll_transmit`](Self::poll_transmit), without copying group
    /// payload: `out` gets everything else (records up to their payload
    /// included) and `gather` the payload ranges, each sharing its pool block,
    /// to be sent in order between the bytes of `out` (a vectored write).
    ///
    /// Stops when `gather` is full; send, then call again.
    #[must_use]
    pub fn poll_transmit_gather(
        &mut self,
        now: Instant,
        out: &mut [u8],
        gather: &mut dyn Gather<'p>,
    ) -> usize {
        self.transmit(now, out, Some(gather))
    }

    fn transmit(
        &mut self,
        now: Instant,
        out: &mut [u8],
        mut gather: Option<&mut dyn Gather<'p>>,
    ) -> usize {
        if self.surfaced.is_some() {
            // The message behind the last event goes: its stream may go on.
            self.release_surfaced();
            self.dirty = true;
        }
        self.now = now;
        if !T::GATHER && !self.conn.lends() {
            // The transport can neither send payload where it lies nor keep
            // a reference to it: copy it.
            gather = None;
        }
        // Fast path: after a pass that found nothing to send, only a call on
        // the session or a change of the media it serves or fills can give
        // it work (a relay wakes every session on every change).
        if self.deferred {
            // What the requests that waited write now is sent by the full pass.
            self.resume();
            self.dirty = true;
        }
        let stamp = self.media_stamp();
        if !self.dirty && stamp == self.stamp && !self.is_stalled() && !self.deferred {
            return self.conn.poll_transmit(now, out);
        }
        let mut pos = 0;
        // Data the transport took in some round (a transport with its own
        // send buffer takes it without writing into `out`).
        let mut moved = false;
        // Rounds: writing can free slots and finish streams, which lets `drive`
        // queue more (a FIN after the last group, the next group stream). Stop
        // when a round writes nothing.
        loop {
            self.drive();
            let start = pos;
            let conn_bytes = self
                .conn
                .poll_transmit(now, out.get_mut(pos..).unwrap_or(&mut []));
            pos += conn_bytes;
            if self.conn.is_closed() || !self.conn.is_established() {
                self.dirty = true;
                return pos;
            }
            let control = self.flush_control(now, out.get_mut(pos..).unwrap_or(&mut []));
            pos += control.bytes;
            let groups = self.flush_groups(
                now,
                out.get_mut(pos..).unwrap_or(&mut []),
                pos,
                reborrow(&mut gather),
            );
            pos += groups.bytes;
            let round_moved = control.moved || groups.moved;
            if pos == start && !round_moved {
                // This round walked the tables and wrote nothing. If its
                // drive freed nothing, another drive finds nothing either;
                // and with room for any one write of the transport left
                // (and for a payload range, gathering), the buffer held
                // nothing back: the session is idle, as after a call that
                // wrote nothing. Otherwise the next call walks the tables
                // again.
                let room = out.len().saturating_sub(pos);
                let spare = room >= self.conn.whole_write_room()
                    && gather.as_ref().is_none_or(|g| g.room() > 0);
                self.dirty = self.drive_freed || ((pos > 0 || moved) && !spare);
                self.stamp = stamp;
                return pos;
            }
            // A round that wrote group data only and ended no stream gave
            // `drive` nothing new to queue, so another round would write
            // nothing. The session stays dirty (it sent), so its next call
            // walks the tables again; what lets it send more (media, credit,
            // a request) comes with that call or a media change.
            moved |= round_moved;
            if conn_bytes == 0 && !control.moved && !groups.ended {
                self.dirty = true;
                return pos;
            }
        }
    }

    /// A digest of the local media this session depends on: the origin it
    /// announces from, the tracks it serves, the tracks it fills and how far
    /// their readers got. Any change there may give `drive` work: a
    /// transmit with the stamp of the last pass that found nothing to send
    /// skips walking the tables.
    fn media_stamp(&self) -> u64 {
        let mix = |h: u64, v: u64| h.rotate_left(7) ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut h = self.origin.map_or(0, |o| o.version());
        for s in self.served.iter().flatten() {
            h = mix(h, s.source.version());
        }
        for s in self.subs.iter().flatten().filter_map(SubEntry::open) {
            h = mix(h, s.producer.track().version());
        }
        for g in self.inc.iter().flatten() {
            if let Some(p) = &g.producer {
                let st = p.state();
                h = mix(mix(h, st.furthest_read()), st.generation());
            }
        }
        h
    }

    /// The next event, if any. Call it after every `handle_input` and
    /// `handle_timeout` until it returns `None`.
    ///
    /// Events carrying text borrow the session; the message they came from is
    /// released at the next call on the session.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event<'_>> {
        // Releasing a surfaced message and taking an event may both give
        // the session work (input goes on, a request waits for an answer);
        // a call that finds nothing leaves it as it was, so the driver's
        // transmit after an empty poll may still take its fast path.
        if self.surfaced.is_some() {
            self.release_surfaced();
            self.dirty = true;
        }
        if let Some(q) = self.events.pop_front() {
            self.dirty = true;
            self.queue_waiting();
            return Some(self.queued_event(q));
        }
        if let Some(slot) = self.next_held() {
            self.dirty = true;
            self.surfaced = Some(slot);
            return self.held_event(slot);
        }
        // A close is reported after everything that arrived before it.
        let q = self.close_event.take()?;
        self.dirty = true;
        Some(self.queued_event(q))
    }

    /// Closes the session with a moq-lite session code and a reason
    /// (docs/protocol.md §3.13, §3.15): [`SessionCode::NoError`] for a normal end.
    ///
    /// `poll_transmit` then writes the close and nothing else; subscriptions are
    /// closed locally. No [`Event::Closed`] is reported for it. A second call
    /// does nothing.
    pub fn close(&mut self, code: SessionCode, reason: &str) {
        self.release_surfaced();
        self.dirty = true;
        if self.is_closed() {
            return;
        }
        self.conn.close(code.to_code(), reason);
        self.closed = true;
        self.teardown();
    }

    // ---- internals shared by the submodules ----

    /// Counts origin entries visited for announce requests' initial sets (tests only).
    #[cfg(test)]
    fn count_announce_visits(&mut self, n: usize) {
        self.visits.announce += n;
    }

    /// Counts origin entries visited for announce requests' initial sets (tests only).
    #[cfg(not(test))]
    fn count_announce_visits(&mut self, _n: usize) {}

    /// Records how many group-stream slots one `flush_groups` call visited (tests only).
    #[cfg(test)]
    fn count_group_visits(&mut self, n: usize) {
        self.visits.groups = self.visits.groups.max(n);
        self.visits.group_rounds += 1;
    }

    /// Records how many group-stream slots one `flush_groups` call visited (tests only).
    #[cfg(not(test))]
    fn count_group_visits(&mut self, _n: usize) {}

    /// Room for the events one more input event or message may queue.
    fn has_event_room(&self) -> bool {
        self.events.len() + EVENT_MARGIN <= EVENTS
    }

    /// Queues an informational event (connected, track info, subscription
    /// progress). Those are queued only while handling input, which stops
    /// while the queue is nearly full, so the queue has room; were it full,
    /// the event would be dropped with a log. Ends go through
    /// [`queue_end`](Self::queue_end), the close through `close_event`.
    fn queue(&mut self, q: Queued) {
        debug_assert!(!matches!(
            q,
            Queued::SubscriptionClosed(..) | Queued::AnnounceEnded(..) | Queued::Closed { .. }
        ));
        if self.events.push_back(q).is_err() {
            warn!("session: event queue full, event dropped");
        }
    }

    /// Queues the end of a subscription or an announce request, which may
    /// come from a call on a full queue; if it is full, returns where the end
    /// waits in line, for the caller to keep in the entry it ends (see
    /// [`queue_waiting`](Self::queue_waiting)).
    fn queue_end(&mut self, q: Queued) -> Option<Waiting> {
        let code = match q {
            Queued::SubscriptionClosed(_, code) | Queued::AnnounceEnded(_, code) => code,
            _ => None,
        };
        // While ends wait, the queue is full: a new one waits behind them.
        if self.waiting == 0 && self.events.push_back(q).is_ok() {
            return None;
        }
        let order = self.next_waiting;
        self.next_waiting += 1;
        self.waiting += 1;
        Some(Waiting { order, code })
    }

    /// Moves waiting ends into the event queue, oldest first, while it has room.
    fn queue_waiting(&mut self) {
        while self.waiting > 0 && !self.events.is_full() {
            // The oldest: in a subscription entry or a control slot.
            let mut oldest: Option<(u64, bool, usize)> = None;
            for (i, s) in self.subs.iter().enumerate() {
                if let Some(SubEntry::Closed { end, .. }) = s
                    && oldest.is_none_or(|(o, ..)| end.order < o)
                {
                    oldest = Some((end.order, true, i));
                }
            }
            for (slot, c) in self.control.iter().enumerate() {
                if let Some(end) = c.ended
                    && oldest.is_none_or(|(o, ..)| end.order < o)
                {
                    oldest = Some((end.order, false, slot));
                }
            }
            let q = match oldest {
                Some((_, true, i)) => match self.subs[i].take() {
                    Some(SubEntry::Closed { id, end }) => {
                        Queued::SubscriptionClosed(SubscriptionId(id), end.code)
                    }
                    _ => break,
                },
                Some((_, false, slot)) => {
                    let end = self.control[slot].ended.take();
                    match (self.control[slot].kind, end) {
                        (control::Kind::AnnounceOut { id, .. }, Some(end)) => {
                            Queued::AnnounceEnded(AnnounceId(id), end.code)
                        }
                        _ => break,
                    }
                }
                None => {
                    debug_assert!(false, "a waiting end was lost");
                    self.waiting = 0;
                    break;
                }
            };
            self.waiting -= 1;
            let _ = self.events.push_back(q);
        }
    }

    /// Keeps the close for [`Event::Closed`], reported after every other event.
    fn queue_close(&mut self, code: u64, application: bool, local: bool) {
        if self.close_event.is_none() {
            self.close_event = Some(Queued::Closed {
                code,
                application,
                local,
            });
        }
    }

    /// Ends the session because of a rule the peer broke or a local limit: close
    /// with `code` and report [`Event::Closed`].
    fn fail(&mut self, code: SessionCode, reason: &'static str) {
        if self.is_closed() {
            return;
        }
        debug!("session: closing with code {}: {}", code.to_code(), reason);
        self.conn.close(code.to_code(), reason);
        self.closed = true;
        self.set_reason(reason);
        self.queue_close(code.to_code(), true, true);
        self.teardown();
    }

    fn set_reason(&mut self, reason: &str) {
        self.close_reason.clear();
        for c in reason.chars() {
            if self.close_reason.push(c).is_err() {
                break;
            }
        }
    }

    /// The connection ended (peer close, violation, timeout).
    fn on_closed(&mut self, c: conn::Closed<'_>) {
        let local = !matches!(c.cause, CloseCause::Peer);
        self.set_reason(c.reason);
        self.closed = true;
        self.queue_close(c.code, c.application, local);
        self.teardown();
    }

    /// Dispatches a connection event other than stream data.
    fn on_conn_event(&mut self, now: Instant, event: conn::Event<'_>) {
        match event {
            conn::Event::Established { protocol } => {
                self.established = Some(now);
                self.queue(Queued::Connected(protocol));
                self.send_setup();
            }
            conn::Event::StreamOpened { .. } => {
                // Slots are taken when the stream's first byte arrives.
            }
            conn::Event::StreamData { .. } | conn::Event::StreamRef { .. } => {}
            conn::Event::StreamWritable { .. } => {
                // The call marked the session for a full transmit pass, which
                // writes what waited for the credit.
            }
            conn::Event::StreamReset { id, code, .. } => self.on_stream_reset(id, code),
            conn::Event::StopSending { id, code } => self.on_stop_sending(id, code),
            conn::Event::Datagram(_) => {
                // We advertise no datagram support (docs/protocol.md §3.14); the connection
                // refuses them, so this does not happen.
            }
            conn::Event::Closed(c) => self.on_closed(c),
        }
    }

    /// Takes stream data received by reference; false if the session could
    /// not take all of it (the rest waits in `stall_ref` for the next call)
    /// or closed because the reference names nothing.
    fn take_ref(&mut self, now: Instant, st: StallRef<'p>) -> bool {
        let (block, used) = match st.data {
            RefData::Block(block, used) => (block, used),
            RefData::Token(token, len) => {
                let resolved = match self.foreign {
                    Some(f) => f.resolve(token, len),
                    None => Err(ForeignError::Unknown),
                };
                match resolved {
                    Ok(block) if block.len() as u64 == len => (block, 0),
                    Err(ForeignError::Exhausted) => {
                        self.stall_ref = Some(st);
                        return false;
                    }
                    _ => {
                        self.fail(SessionCode::Internal, "unresolved stream reference");
                        return false;
                    }
                }
            }
        };
        let data = block.data().get(used..).unwrap_or(&[]);
        let n = self.on_stream_data(now, st.id, st.offset, data, Some((&block, used)), st.fin);
        if n < data.len() {
            self.stall_ref = Some(StallRef {
                offset: u64::MAX,
                data: RefData::Block(block, used + n),
                ..st
            });
            return false;
        }
        true
    }

    /// Installs the resolver of STREAM_REF tokens, for a connection with
    /// [`conn::Config::stream_refs`] (a link inside one process).
    pub fn set_foreign(&mut self, foreign: Option<&'s dyn Foreign<'p>>) {
        self.foreign = foreign;
    }

    /// Routes stream data to the control slot or group stream it belongs to and
    /// returns how many bytes were taken. `src`: `data` lies in this foreign
    /// block from this byte on (group payload joins groups without a copy).
    fn on_stream_data(
        &mut self,
        now: Instant,
        id: StreamId,
        offset: u64,
        data: &[u8],
        src: Option<(&Block<'p>, usize)>,
        fin: bool,
    ) -> usize {
        if let Some(slot) = self.control_slot(id) {
            return self.control_data(now, slot, data, fin);
        }
        if let Some(i) = self.group_in(id) {
            return self.group_data(now, i, data, src, fin);
        }
        if offset == 0 && !id.is_local(self.side) {
            return self.new_peer_stream(now, id, data, fin);
        }
        // A stream we already gave up on: drop the bytes, give the credit back.
        self.conn.release(id, data.len() as u64);
        data.len()
    }

    /// Processes whatever waits in control buffers (after events were polled).
    fn resume(&mut self) {
        self.deferred = false;
        for slot in 0..self.control.span() {
            if !self.has_event_room() || self.is_closed() {
                return;
            }
            if self.control[slot].needs_processing() {
                self.process_rx(slot);
            }
        }
    }

    /// Advances every state machine that depends on local media or credit:
    /// opening queued streams, serving announcements and subscriptions,
    /// releasing credit for consumed group bytes, freeing finished slots.
    fn drive(&mut self) {
        if self.is_closed() || !self.conn.is_established() {
            return;
        }
        self.chunk_starved = false;
        self.resume();
        // Ended subscriptions (a FIN `resume` may just have read) whose last
        // groups came, or whose grace ran out, close now.
        self.close_ended(self.now);
        self.open_pending();
        self.serve_announces();
        self.serve_subscriptions();
        self.release_credit();
        self.sweep_control();
        // Buffers of FIFOs that emptied (sent by the round before, taken by
        // the application) go back for the next message.
        self.trim_chunks();
        // A step above found no buffer (an answer waits for one) and the
        // sweep or the trim freed some: the next drive may do more.
        self.drive_freed = self.chunk_starved && self.free_chunks > 0;
        // Later passes scan only up to the highest slot still in use.
        self.control.trim();
        self.served.trim();
        self.subs.trim();
        self.out.trim();
        self.inc.trim();
    }

    /// The next track whose media this session changed, or whose bytes it
    /// read, since the last call ([`Change`]); `None` once all were reported.
    /// Call it after any other call and wake the waiters of each track named:
    /// nothing else tells a driver what a pass changed.
    pub fn poll_changed(&mut self) -> Option<Change> {
        if self.changes.is_empty() {
            self.note_filled();
        }
        self.changes.poll()
    }

    /// Lists the filled tracks whose version moved since the last look.
    fn note_filled(&mut self) {
        for entry in self.subs.iter_mut().flatten() {
            if let SubEntry::Open(s) = entry {
                let t = s.producer.track();
                let v = t.version();
                if v != s.seen {
                    s.seen = v;
                    self.changes.add(Change::Media(t.key()));
                }
            }
        }
    }

    /// Records a change for [`Session::poll_changed`].
    pub(crate) fn note(&mut self, change: Change) {
        self.changes.add(change);
    }

    /// Drops everything after the session ended: producers abort, sinks close,
    /// consumers let go.
    fn teardown(&mut self) {
        let code = crate::wire::lite::StreamCode::SessionClosed.to_code();
        for s in self.inc.iter_mut() {
            if let Some(g) = s.take()
                && let Some(mut p) = g.producer
            {
                p.abort(code);
            }
        }
        for s in self.subs.iter_mut() {
            // Ends still waiting to be queued stay.
            if let Some(SubEntry::Open(_)) = s
                && let Some(SubEntry::Open(mut sub)) = s.take()
            {
                self.filled_changes += 1;
                sub.producer.abort(code);
                self.changes.add(Change::Media(sub.producer.track().key()));
            }
        }
        for s in self.out.iter_mut() {
            *s = None;
        }
        for i in 0..self.served.span() {
            self.free_served(i);
        }
        self.stall = None;
        self.stall_ref = None;
    }
}

/// Empties publisher-side tables (a reused storage holds an ended session's
/// entries) and narrows the served table to `max_served`.
fn clear_publisher_tables<'t, 'a, 'p>(
    served: &'t mut [Option<Served<'a, 'p>>],
    out: &'t mut [Option<GroupOut<'a, 'p>>],
    max_served: usize,
) -> (
    &'t mut [Option<Served<'a, 'p>>],
    &'t mut [Option<GroupOut<'a, 'p>>],
) {
    // A session that ended unregistered what it served (see `teardown`).
    for s in served.iter_mut() {
        if let Some(s) = s.take() {
            s.source.remove_subscriber(s.window.request());
        }
    }
    out.iter_mut().for_each(|s| *s = None);
    let served_len = max_served.min(served.len());
    (served.split_at_mut(served_len).0, out)
}

/// Empties subscriber-side tables (a reused storage holds an ended
/// session's entries).
fn clear_subscriber_tables(
    subs: &mut [Option<SubEntry<'_, '_>>],
    inc: &mut [Option<GroupIn<'_, '_>>],
) {
    subs.iter_mut().for_each(|s| *s = None);
    inc.iter_mut().for_each(|s| *s = None);
}

/// Moves the entries in use of two tables into `a` and `b`, both or
/// neither.
fn move_both<'s, A: slots::Slot, B: slots::Slot>(
    table_a: &mut Slots<'s, A>,
    a: &'s mut [A],
    table_b: &mut Slots<'s, B>,
    b: &'s mut [B],
) -> Result<(), TablesTooSmall> {
    if a.len() < table_a.span() || b.len() < table_b.span() {
        return Err(TablesTooSmall);
    }
    table_a.move_to(a);
    table_b.move_to(b);
    Ok(())
}

/// Tables offered to [`Session::attach_publisher_tables`] or
/// [`Session::attach_subscriber_tables`] that hold fewer entries than the
/// session already uses; the session goes on with its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TablesTooSmall;

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Gives the session `tables` for the media it sends (the peer's
    /// subscriptions, our group streams), in place of its own: the entries
    /// in use move over, and its own become free for the caller once the
    /// session is gone. Call it at [`Event::Setup`], when the peer's Role
    /// shows it subscribes (see [`Storage`]).
    ///
    /// # Errors
    /// [`TablesTooSmall`] if `tables` cannot hold the entries in use.
    pub fn attach_publisher_tables<const SERVE: usize, const OUT: usize>(
        &mut self,
        tables: &'s mut PublisherTables<'a, 'p, SERVE, OUT>,
    ) -> Result<(), TablesTooSmall> {
        let PublisherTables { served, out } = tables;
        let (served, out) = clear_publisher_tables(served, out, self.max_served);
        move_both(&mut self.served, served, &mut self.out, out)?;
        self.awaiting_tables = false;
        self.dirty = true;
        Ok(())
    }

    /// Gives the session `tables` for the media it receives (our
    /// subscriptions, the peer's group streams), as
    /// [`attach_publisher_tables`](Self::attach_publisher_tables) does for
    /// the media it sends. Call it at [`Event::Setup`], when the peer's Role
    /// shows it publishes.
    ///
    /// # Errors
    /// [`TablesTooSmall`] if `tables` cannot hold the entries in use.
    pub fn attach_subscriber_tables<const SUBS: usize, const IN: usize>(
        &mut self,
        tables: &'s mut SubscriberTables<'a, 'p, SUBS, IN>,
    ) -> Result<(), TablesTooSmall> {
        let SubscriberTables { subs, inc } = tables;
        clear_subscriber_tables(subs, inc);
        move_both(&mut self.subs, subs, &mut self.inc, inc)?;
        self.awaiting_tables = false;
        self.dirty = true;
        Ok(())
    }
}

impl<const N: usize, T: Transport> Drop for Session<'_, '_, '_, N, T> {
    /// Lets go of local media: the tracks of our subscriptions are aborted with
    /// SESSION_CLOSED (0x3) and every group reader and writer is dropped, so
    /// the storage can be reused. Nothing is sent: close first for a clean end.
    fn drop(&mut self) {
        self.teardown();
    }
}

impl<const N: usize, T: Transport> core::fmt::Debug for Session<'_, '_, '_, N, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Session")
            .field("side", &self.side)
            .field("established", &self.conn.is_established())
            .field("setup", &self.peer.is_some())
            .field("closed", &self.is_closed())
            .field("served", &self.served_count())
            .field("out", &self.sending_groups())
            .field("in", &self.receiving_groups())
            .finish_non_exhaustive()
    }
}
