//! What a session advertises and where its tables live: [`Config`] and [`Storage`].

use crate::conn;
use crate::time::Duration;
use crate::wire::lite::Role;

use super::control::Control;
use super::publisher::{GroupOut, Served};
use super::subscriber::{GroupIn, SubEntry};

/// The smallest control buffer [`Storage`] may have: room for a SETUP with a
/// Hop and a short path, and for the small fixed-size messages.
pub const MIN_BUF: usize = 64;

/// Settings of one [`Session`](super::Session).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config<'c> {
    /// The QMux connection's settings (transport parameters, timers, protocol list).
    pub conn: conn::Config,
    /// Our Hop ID, sent in SETUP, ANNOUNCE_OK and as ANNOUNCE_REQUEST's Exclude
    /// Hop; 0 = none (docs/protocol.md §4.3: give a publisher a stable non-zero one).
    pub hop: u64,
    /// The session's path and query (`/room`, `/room?jwt=...`). Client: sent as
    /// the SETUP Path parameter, the URL's path and query as dialed; `None` or
    /// empty sends none (docs/protocol.md §3.5; leave it `None` over WebSocket,
    /// where the request URI carries it, §9.3). Server: the path the transport
    /// carried (a WebSocket request URI), reported in [`Event::Setup`] in place
    /// of any SETUP Path; `None` on TCP.
    ///
    /// [`Event::Setup`]: super::Event::Setup
    pub path: Option<&'c str>,
    /// Client only: the SETUP Role parameter; [`Role::Both`] sends none. A
    /// publishing client must not say [`Role::Subscriber`] (docs/protocol.md §4.1).
    pub role: Role,
    /// How long to wait for the peer's SETUP after the connection is
    /// established before closing with CONTROL_MESSAGE_TIMEOUT (0x11);
    /// [`Duration::ZERO`] waits forever. Default 10 s, as moq-dev.
    pub setup_timeout: Duration,
    /// Subscriptions the peer may hold on our tracks at once (capped by the
    /// storage's `SERVE` table); one more SUBSCRIBE is refused like one that
    /// finds the table full. Default: the whole table.
    pub max_served: usize,
    /// Largest FRAME payload accepted on a received group stream; a larger one
    /// drops the group with FRAME_TOO_LARGE (0x38, docs/protocol.md §3.15) and stops
    /// the stream. Default: no limit but the group's.
    pub max_frame_bytes: u64,
    /// How long an incomplete control message may sit in a control stream's
    /// buffer (a peer trickling it, slowloris) before the session is closed with
    /// CONTROL_MESSAGE_TIMEOUT (0x11); [`Duration::ZERO`] (default) waits forever.
    pub control_timeout: Duration,
    /// Payload bytes of a frame arriving in pieces that a received group stream
    /// stores before the track's readers are woken; a complete frame wakes them
    /// at once, and so does a sender running short of credit (see
    /// `track::GroupProducer::set_announce_step`). A relay's fan-out then runs
    /// once per frame, not once per piece. Default 64 KiB; 0 wakes readers on
    /// every piece.
    pub announce_step: u64,
    /// The peer's TRACK requests that may wait at once for a relay track's
    /// TRACK_INFO (see [`super::Resolve`]); one more is refused with EVICTED
    /// (0x35) and counted ([`super::Session::refused_track_requests`]).
    /// Default: no limit but the control streams.
    pub max_waiting_tracks: usize,
    /// The peer's FETCHes (docs/protocol.md §3.10) answered or waiting for an
    /// answer at once; one more is refused with EVICTED (0x35). Default 4.
    pub max_fetches: usize,
    /// A FETCH for a group the session does not hold goes to the application
    /// as [`Event::Fetch`](super::Event::Fetch) (which answers it from
    /// storage of its own, or refuses it). Off (default): it is refused at
    /// once with NOT_FOUND (0x33), or UNROUTABLE (0x36) for a broadcast not
    /// in the origin.
    pub fetch_misses: bool,
}

impl Config<'static> {
    /// The default configuration: moq-dev's `tcp://` QMux values, no Hop ID, no path, both roles.
    pub const fn new() -> Self {
        Config {
            conn: conn::Config::new(),
            hop: 0,
            path: None,
            role: Role::Both,
            setup_timeout: Duration::from_secs(10),
            max_served: usize::MAX,
            max_frame_bytes: u64::MAX,
            control_timeout: Duration::ZERO,
            announce_step: 64 * 1024,
            max_waiting_tracks: usize::MAX,
            max_fetches: 4,
            fetch_misses: false,
        }
    }
}

impl Default for Config<'static> {
    fn default() -> Self {
        Config::new()
    }
}

/// The fixed-capacity tables of one [`Session`](super::Session), provided by the caller.
///
/// * `CONTROL`: control-stream slots: our SETUP and the peer's, each announce,
///   track, subscribe and goaway stream either side opened. A subscription we
///   make takes two while its TRACK request is open, one afterwards.
/// * `BUF`: bytes of a control buffer. A control message longer than this is
///   refused (the stream is reset, or the session closed for a SETUP/GOAWAY),
///   never buffered elsewhere. At least [`MIN_BUF`].
/// * `SERVE`: subscriptions the peer holds on our tracks (publisher side).
/// * `SUBS`: subscriptions we hold on the peer's tracks (subscriber side);
///   a closed one keeps its entry while its
///   [`Event::SubscriptionClosed`](super::Event::SubscriptionClosed) waits
///   for room in the event queue.
/// * `OUT`: group streams we send at once (publisher side).
/// * `IN`: group streams we receive at once (subscriber side); keep it at least
///   the connection's `max_streams_uni` so a compliant peer never finds it full.
/// * `CHUNKS`: control buffers, shared by the slots: a slot holds one for
///   receiving while a message is incomplete, held for the application or
///   kept (an announce stream's prefix), and one for sending while bytes wait
///   or a prefix is kept; an idle slot holds none.
///   `2 * CONTROL` never runs short. Fewer save memory: a slot that finds
///   none free stops taking bytes (the peer's data waits, backpressure) or,
///   for a message of ours, fails as a control buffer too small would.
///   At least 2.
///
/// A full table is never grown: the request is refused on the wire with a
/// stream reset (see the module documentation of [`session`](super)).
///
/// A server that does not know yet which way its peer's media flows can
/// leave `SERVE`, `SUBS` and `OUT` at 0 and `IN` at 1 (the peer's SETUP
/// stream): the session then reads no further than the peer's SETUP until
/// the application has seen [`Event::Setup`](super::Event::Setup), and the
/// application attaches [`PublisherTables`] and [`SubscriberTables`] for the
/// directions the peer's Role asks for. A viewer then never holds tables for
/// media it will not send.
///
/// `new` is `const`, so on firmware the storage can sit in a `static`.
pub struct Storage<
    'a,
    'p,
    const CONTROL: usize,
    const BUF: usize,
    const SERVE: usize,
    const SUBS: usize,
    const OUT: usize,
    const IN: usize,
    const CHUNKS: usize,
> {
    pub(super) control: [Control; CONTROL],
    pub(super) chunks: [[u8; BUF]; CHUNKS],
    pub(super) chunk_used: [bool; CHUNKS],
    pub(super) served: [Option<Served<'a, 'p>>; SERVE],
    pub(super) subs: [Option<SubEntry<'a, 'p>>; SUBS],
    pub(super) out: [Option<GroupOut<'a, 'p>>; OUT],
    pub(super) inc: [Option<GroupIn<'a, 'p>>; IN],
}

impl<
    'a,
    'p,
    const CONTROL: usize,
    const BUF: usize,
    const SERVE: usize,
    const SUBS: usize,
    const OUT: usize,
    const IN: usize,
    const CHUNKS: usize,
> Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>
{
    /// Empty tables.
    pub const fn new() -> Self {
        Storage {
            control: [Control::FREE; CONTROL],
            chunks: [[0; BUF]; CHUNKS],
            chunk_used: [false; CHUNKS],
            served: [const { None }; SERVE],
            subs: [const { None }; SUBS],
            out: [const { None }; OUT],
            inc: [const { None }; IN],
        }
    }
}

impl<
    const CONTROL: usize,
    const BUF: usize,
    const SERVE: usize,
    const SUBS: usize,
    const OUT: usize,
    const IN: usize,
    const CHUNKS: usize,
> Default for Storage<'_, '_, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>
{
    fn default() -> Self {
        Self::new()
    }
}

/// The publisher side of a session's tables, for a session that takes them
/// only once the peer's SETUP shows it subscribes
/// ([`Session::attach_publisher_tables`](super::Session::attach_publisher_tables)):
/// `SERVE` subscriptions the peer holds on our tracks and `OUT` group
/// streams we send at once, as in [`Storage`].
pub struct PublisherTables<'a, 'p, const SERVE: usize, const OUT: usize> {
    pub(super) served: [Option<Served<'a, 'p>>; SERVE],
    pub(super) out: [Option<GroupOut<'a, 'p>>; OUT],
}

impl<const SERVE: usize, const OUT: usize> PublisherTables<'_, '_, SERVE, OUT> {
    /// Empty tables.
    pub const fn new() -> Self {
        PublisherTables {
            served: [const { None }; SERVE],
            out: [const { None }; OUT],
        }
    }
}

impl<const SERVE: usize, const OUT: usize> Default for PublisherTables<'_, '_, SERVE, OUT> {
    fn default() -> Self {
        Self::new()
    }
}

/// The subscriber side of a session's tables, for a session that takes them
/// only once the peer's SETUP shows it publishes
/// ([`Session::attach_subscriber_tables`](super::Session::attach_subscriber_tables)):
/// `SUBS` subscriptions we hold on the peer's tracks and `IN` group streams
/// we receive at once, as in [`Storage`].
pub struct SubscriberTables<'a, 'p, const SUBS: usize, const IN: usize> {
    pub(super) subs: [Option<SubEntry<'a, 'p>>; SUBS],
    pub(super) inc: [Option<GroupIn<'a, 'p>>; IN],
}

impl<const SUBS: usize, const IN: usize> SubscriberTables<'_, '_, SUBS, IN> {
    /// Empty tables.
    pub const fn new() -> Self {
        SubscriberTables {
            subs: [const { None }; SUBS],
            inc: [const { None }; IN],
        }
    }
}

impl<const SUBS: usize, const IN: usize> Default for SubscriberTables<'_, '_, SUBS, IN> {
    fn default() -> Self {
        Self::new()
    }
}

/// A storage size that suits a small node: 24 control streams with 48
/// control buffers of 512 bytes (two each, so never short), 8 subscriptions
/// each way, 8 group streams each way (about 26 KiB of buffers).
pub type DefaultStorage<'a, 'p> = Storage<'a, 'p, 24, 512, 8, 8, 8, 8, 48>;
