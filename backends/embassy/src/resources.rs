//! Everything a publisher needs in memory, given by the caller: [`PublisherResources`].

use skiff_core::model::origin;
use skiff_core::session::{self, ConfigError, Session, Storage};
use skiff_core::time::Instant;
use skiff_core::wire::qmux::Side;

use crate::publisher::Shared;

/// The smallest input buffer that holds any record a peer may send: the 16382-byte
/// `max_record_size` every QMux peer must accept, plus its 8-byte size prefix
/// (docs/protocol.md §1.3).
pub const FULL_RECORD: usize = 16_390;

/// All the memory of one publisher, with its capacities as const generics (the
/// pattern of embassy-net's `StackResources`): put it in a `static` (e.g. a
/// `static_cell::StaticCell`) or on the stack of the task that owns the runner.
///
/// * `STREAMS`: the QMux stream table of the session (every stream either side has
///   open: control streams and our group streams). By default the relay may open a
///   quarter of it as bidi streams (its ANNOUNCE and SUBSCRIBE requests).
/// * `CONTROL`, `BUF`: control-stream slots and the bytes of a control buffer (see
///   [`Storage`]): our SETUP and the relay's, its announce request, one per
///   subscription. A path or track name must fit `BUF` with its message.
/// * `CHUNKS`: control buffers the slots share (the announce stream keeps one;
///   a request holds one while it is received and its answer while it is sent).
/// * `SERVE`: subscriptions the relay may hold on our tracks at once.
/// * `OUT`: group streams sent at once.
/// * `RX`: input staging: received bytes wait here until the session takes them. A
///   record longer than `RX` cannot be processed and ends the session
///   ([`Error::RecordTooLarge`](crate::Error::RecordTooLarge)); [`FULL_RECORD`]
///   takes any record a peer may send, while a relay's records to a publisher
///   (control messages, credit, pings) are far smaller in practice.
/// * `TX`: output staging: [`Session::poll_transmit`] writes records here before they
///   are copied into the socket. Records are cut to fit, so it only bounds their size.
/// * `SOCK_RX`, `SOCK_TX`: the TCP socket's buffers (the network stack's side).
///
/// A publisher never subscribes, so the session's subscriber tables are empty but
/// for one incoming uni stream: the relay's SETUP stream, whose type is only known
/// once its first byte arrives (docs/protocol.md §3.5).
pub struct PublisherResources<
    'a,
    'p,
    const STREAMS: usize,
    const CONTROL: usize,
    const BUF: usize,
    const CHUNKS: usize,
    const SERVE: usize,
    const OUT: usize,
    const RX: usize,
    const TX: usize,
    const SOCK_RX: usize,
    const SOCK_TX: usize,
> {
    pub(crate) storage: Storage<'a, 'p, CONTROL, BUF, SERVE, 0, OUT, 1, CHUNKS>,
    pub(crate) shared: Shared<'a, 'p>,
    pub(crate) rx: [u8; RX],
    pub(crate) tx: [u8; TX],
    pub(crate) socket_rx: [u8; SOCK_RX],
    pub(crate) socket_tx: [u8; SOCK_TX],
}

impl<
    'a,
    'p,
    const STREAMS: usize,
    const CONTROL: usize,
    const BUF: usize,
    const CHUNKS: usize,
    const SERVE: usize,
    const OUT: usize,
    const RX: usize,
    const TX: usize,
    const SOCK_RX: usize,
    const SOCK_TX: usize,
> PublisherResources<'a, 'p, STREAMS, CONTROL, BUF, CHUNKS, SERVE, OUT, RX, TX, SOCK_RX, SOCK_TX>
{
    /// Empty resources; `const`, so they can be built in a `static` initializer.
    pub const fn new() -> Self {
        PublisherResources {
            storage: Storage::new(),
            shared: Shared::new(),
            rx: [0; RX],
            tx: [0; TX],
            socket_rx: [0; SOCK_RX],
            socket_tx: [0; SOCK_TX],
        }
    }
}

impl<
    const STREAMS: usize,
    const CONTROL: usize,
    const BUF: usize,
    const CHUNKS: usize,
    const SERVE: usize,
    const OUT: usize,
    const RX: usize,
    const TX: usize,
    const SOCK_RX: usize,
    const SOCK_TX: usize,
> Default
    for PublisherResources<
        '_,
        '_,
        STREAMS,
        CONTROL,
        BUF,
        CHUNKS,
        SERVE,
        OUT,
        RX,
        TX,
        SOCK_RX,
        SOCK_TX,
    >
{
    fn default() -> Self {
        Self::new()
    }
}

/// Capacities for a publisher of a few tracks: 16 streams, 8 control slots of 256
/// bytes, 4 subscriptions, 4 group streams, a full-record input buffer, 2 KiB output
/// staging and 4 KiB each way for the socket.
pub type Resources<'a, 'p> =
    PublisherResources<'a, 'p, 16, 8, 256, 10, 4, 4, FULL_RECORD, 2048, 4096, 4096>;

/// [`Resources`] with a 2 KiB input buffer, for boards short of RAM: it relies on the
/// relay sending no record over 2 KiB, which holds for a relay talking to a publisher
/// (its SUBSCRIBE, announce requests, credit and pings are tens of bytes).
pub type SmallResources<'a, 'p> =
    PublisherResources<'a, 'p, 16, 8, 256, 10, 4, 4, 2048, 2048, 4096, 4096>;

/// Builds a session over size-erased storage, so the runner does not carry the
/// storage's capacities in its type.
pub(crate) trait MakeSession<'a, 'p, const N: usize> {
    /// A client session at `now` serving `origin`.
    fn make(
        &mut self,
        config: session::Config<'a>,
        now: Instant,
        origin: origin::Ref<'a, 'p>,
    ) -> Result<Session<'_, 'a, 'p, N>, ConfigError>;
}

impl<
    'a,
    'p,
    const N: usize,
    const CONTROL: usize,
    const BUF: usize,
    const SERVE: usize,
    const SUBS: usize,
    const OUT: usize,
    const IN: usize,
    const CHUNKS: usize,
> MakeSession<'a, 'p, N> for Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>
{
    fn make(
        &mut self,
        config: session::Config<'a>,
        now: Instant,
        origin: origin::Ref<'a, 'p>,
    ) -> Result<Session<'_, 'a, 'p, N>, ConfigError> {
        Session::new(Side::Client, config, now, self, Some(origin))
    }
}
