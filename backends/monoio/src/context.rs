//! The per-thread resources a client's sessions draw from: a clock, the
//! thread's [`Notify`], a block pool, session storage, and the fixed tables
//! of tracks, broadcasts and origins ([`ClientCtx`], sized by
//! [`ClientLimits`]). The SDK ([`crate::connect`]) holds one per [`crate::Client`];
//! a driver that runs its own [`App`](crate::session_driver::App) over
//! [`drive`](crate::session_driver::drive) takes its tracks, origins and
//! storage from one too.
//!
//! The SDK's context ([`ClientCtx::owning`]) frees its tables and pool when
//! the last context sharing them ([`ClientCtx::sibling`]) drops, so making
//! clients again and again never grows the process.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use monoio::net::TcpStream;
use skiff_core::conn;
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::pool::Pool;

use crate::clock::Clock;
use crate::notify::Notify;
use crate::session_driver::{DriveCtx, HalfReader, HalfWriter, SessionStorage, StoragePool};
use crate::shutdown::{LocalEvent, Shutdown};
use crate::tables::{GROUPS, Keep, TRACKS};
use skiff_core::relay::{BroadcastSlot, BroadcastTable, TrackSlot, TrackTable};

/// How many tracks, publications and origins a [`ClientCtx`] holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientLimits {
    /// Local tracks ([`ClientCtx::track`], and one per published track),
    /// about 6 KiB each.
    pub tracks: usize,
    /// Publications ([`ClientCtx::publication`]) at once.
    pub publications: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            tracks: 256,
            publications: 16,
        }
    }
}

/// The origin of one publication: one broadcast, its changes.
type PublicationOrigin = origin::State<'static, 'static, 4, 16>;

/// The media tables of a context, in storage its [`Keep`] owns.
#[derive(Debug, Clone, Copy)]
struct Tables {
    pool: &'static Pool<'static>,
    tracks: &'static TrackTable<'static, 'static, GROUPS>,
    broadcasts: &'static BroadcastTable<'static, 'static, TRACKS>,
    /// Origins and whether a live publication holds each.
    origins: &'static [(PublicationOrigin, Cell<bool>)],
}

impl Tables {
    /// Tables of `limits` over a pool of about `pool_bytes`, in `keep`.
    ///
    /// The keep frees the tracks and the pool only once every track of the
    /// table is idle (no reader, no writer left) and every block is back in
    /// the pool; otherwise it keeps them.
    ///
    /// # Safety
    /// As [`ClientCtx::owning`], for the contexts `keep` goes to.
    unsafe fn make(keep: &mut Keep, pool_bytes: u64, limits: ClientLimits) -> Tables {
        // SAFETY: the keep is the last field of every `ClientCtx` sharing
        // these tables (behind an `Rc`), so it drops after the contexts'
        // published producers and session storage. A track producer or
        // consumer, or a block, that outlives the last context (a reader
        // task, a session) is counted by the track table or the pool, and
        // the guards below then keep the tracks and the pool. Handles the
        // core does not count (`track::Ref`, `broadcast::Ref`,
        // `origin::Ref`, a group's producer) are not used after that: the
        // caller's contract.
        unsafe {
            let pool = keep.pool(pool_bytes);
            let track_slots =
                keep.slice(limits.tracks, || TrackSlot::new(pool, track::Limits::NONE));
            let broadcast_slots = keep.slice(limits.publications, BroadcastSlot::new);
            let tracks = keep.hold(TrackTable::new(track_slots));
            let broadcasts = keep.hold(BroadcastTable::new(broadcast_slots));
            keep.guard(move || {
                // The owner is gone: every track goes back; those still read
                // or written stay retired, and keep the storage.
                tracks.retire_all();
                tracks.reclaim();
                tracks.counts().free != tracks.capacity()
            });
            let origins = keep.slice(limits.publications, || {
                (origin::State::new(), Cell::new(false))
            });
            Tables {
                pool,
                tracks,
                broadcasts,
                origins,
            }
        }
    }
}

/// Per-thread client state: clock, media-change signal, block pool, session
/// storage, and the tables its tracks and publications come from.
///
/// The tracks, broadcasts and origins it hands out are `'static` handles
/// the core does not all count, so a context made with [`ClientCtx::new`]
/// keeps its tables and pool for the rest of the process; one made with
/// [`ClientCtx::owning`] (the SDK's) frees them when the last context
/// sharing them drops.
#[derive(Debug)]
pub struct ClientCtx {
    /// What every session and media task of the thread shares.
    pub drive: DriveCtx,
    tables: Tables,
    /// The producers of the broadcasts published, with their origin slot.
    published: RefCell<Vec<(broadcast::Producer<'static, 'static>, usize)>>,
    storage: Rc<StoragePool>,
    closing: LocalEvent,
    transport: Cell<conn::Config>,
    /// The storage of `tables`, shared with the siblings; the last field, so
    /// it drops after everything else of the context.
    keep: Rc<Keep>,
}

impl Drop for ClientCtx {
    fn drop(&mut self) {
        // The context is gone, and with it every session that borrowed it:
        // its publications end; the last sibling's keep frees the tables.
        for (producer, slot) in self.published.get_mut().drain(..) {
            let b = producer.broadcast();
            if let Some((o, used)) = self.tables.origins.get(slot) {
                o.handle().unannounce(b.path().as_path());
                used.set(false);
            }
            drop(producer);
            self.tables.broadcasts.retire(b);
        }
    }
}

impl ClientCtx {
    /// Client state with a pool of about `pool_bytes` and the default
    /// [`ClientLimits`]; call it on the monoio runtime that will run the sessions.
    pub fn new(pool_bytes: u64) -> Self {
        Self::with_limits(pool_bytes, ClientLimits::default())
    }

    /// Client state with a pool of about `pool_bytes` and tables of `limits`,
    /// kept for the rest of the process (see [`ClientCtx::owning`] for a
    /// context that gives its memory back).
    pub fn with_limits(pool_bytes: u64, limits: ClientLimits) -> Self {
        // SAFETY: the keep never frees (`keep_forever`), so every handle the
        // context gives out stays valid for the rest of the process.
        unsafe { Self::make(pool_bytes, limits, true) }
    }

    /// As [`ClientCtx::with_limits`], the tables and pool freed when the
    /// last context sharing them ([`ClientCtx::sibling`]) drops, unless a
    /// track is then still read or written or a block is still out (then
    /// they stay allocated).
    ///
    /// # Safety
    /// No track, broadcast, origin or group handle the contexts gave out
    /// (nor anything made from one) may be used once the last of them has
    /// dropped: what uses one holds a context (the SDK's handles hold theirs).
    pub unsafe fn owning(pool_bytes: u64, limits: ClientLimits) -> Self {
        // SAFETY: the caller's contract.
        unsafe { Self::make(pool_bytes, limits, false) }
    }

    /// A context; its storage kept for the process if `forever`.
    ///
    /// # Safety
    /// As [`ClientCtx::owning`] unless `forever`.
    unsafe fn make(pool_bytes: u64, limits: ClientLimits, forever: bool) -> Self {
        let closing = LocalEvent::new();
        let mut keep = Keep::new();
        // SAFETY: the caller's contract.
        let tables = unsafe { Tables::make(&mut keep, pool_bytes, limits) };
        if forever {
            keep.keep_forever();
        }
        ClientCtx {
            drive: DriveCtx {
                clock: Clock::new(),
                notify: Notify::shared(),
                shutdown: Some(Shutdown::new(closing.clone())),
            },
            tables,
            published: RefCell::new(Vec::new()),
            storage: Rc::new(StoragePool::new()),
            closing,
            transport: Cell::new(conn::Config::new()),
            keep: Rc::new(keep),
        }
    }

    /// The QMux settings of sessions started from now on (credit
    /// windows, timeouts); moq-dev's defaults until set.
    pub fn set_transport(&self, config: conn::Config) {
        self.transport.set(config);
    }

    /// A context sharing this one's clock, media-change signal, pool,
    /// session storage and transport settings, with its own close signal:
    /// for sessions that end on their own (a publisher that reconnects
    /// with the same tracks).
    pub fn sibling(&self) -> ClientCtx {
        let closing = LocalEvent::new();
        ClientCtx {
            drive: DriveCtx {
                shutdown: Some(Shutdown::new(closing.clone())),
                ..self.drive.clone()
            },
            tables: self.tables,
            published: RefCell::new(Vec::new()),
            storage: self.storage.clone(),
            closing,
            transport: Cell::new(self.transport.get()),
            keep: self.keep.clone(),
        }
    }

    /// Closes every session of this context (moq-lite close, NO_ERROR).
    pub fn close_all(&self) {
        self.closing.fire();
    }

    /// The thread's media-change signal.
    pub fn notify(&self) -> &Rc<Notify> {
        &self.drive.notify
    }

    /// The block pool.
    pub fn pool(&self) -> &'static Pool<'static> {
        self.tables.pool
    }

    /// A new local track named `name` (for a subscription to fill or to
    /// publish), from the context's table; [`ClientCtx::release`] gives it back.
    ///
    /// # Panics
    /// If `name` is longer than [`track::MAX_NAME_LEN`], or every track of the
    /// table ([`ClientLimits::tracks`]) is in use.
    pub fn track(&self, name: &str) -> track::Ref<'static, 'static> {
        let info = track::Info::new(name).expect("track name too long");
        self.tables
            .tracks
            .claim(info)
            .expect("the context's track table is full (ClientLimits::tracks)")
    }

    /// Gives local track `t` back: its slot is reused once nothing reads or
    /// writes it any more.
    pub fn release(&self, t: track::Ref<'static, 'static>) {
        self.tables.tracks.retire(t);
    }

    /// An origin holding one broadcast `path` with one track `name`, and the
    /// track's producer: the origin a publishing session serves.
    ///
    /// # Panics
    /// For an invalid path or name.
    pub fn publication(
        &self,
        path: &str,
        name: &str,
    ) -> (
        origin::Ref<'static, 'static>,
        track::Producer<'static, 'static>,
    ) {
        let (o, mut producers) = self.publication_tracks(path, &[name]);
        (o, producers.remove(0))
    }

    /// Like [`ClientCtx::publication`] with one track per name (up to
    /// [`TRACKS`]), their producers in the same order.
    ///
    /// # Panics
    /// For an invalid path or name, or more than [`TRACKS`] names.
    pub fn publication_tracks(
        &self,
        path: &str,
        names: &[&str],
    ) -> (
        origin::Ref<'static, 'static>,
        Vec<track::Producer<'static, 'static>>,
    ) {
        let path = Path::new(path).expect("path");
        let b = self
            .tables
            .broadcasts
            .claim(path)
            .expect("the context's broadcast table is full (ClientLimits::publications)");
        let slot = self
            .tables
            .origins
            .iter()
            .position(|(_, used)| !used.get())
            .expect("every origin of the context is in use (ClientLimits::publications)");
        let (o, used) = &self.tables.origins[slot];
        used.set(true);
        let bp = b.producer().expect("fresh broadcast");
        let producers = names
            .iter()
            .map(|name| {
                let t = self.track(name);
                bp.add(t).expect("track fits");
                t.producer().expect("fresh track")
            })
            .collect();
        o.handle().announce(b).expect("fresh origin");
        // The broadcast lives as long as the context.
        self.published.borrow_mut().push((bp, slot));
        (o.handle(), producers)
    }
}

impl ClientCtx {
    /// A free origin of the context's tables and its slot, for
    /// [`ClientCtx::release_origin`]; `None` if every one is in use.
    pub(crate) fn claim_origin(&self) -> Option<(origin::Ref<'static, 'static>, usize)> {
        let slot = self
            .tables
            .origins
            .iter()
            .position(|(_, used)| !used.get())?;
        let (o, used) = self.tables.origins.get(slot)?;
        used.set(true);
        Some((o.handle(), slot))
    }

    /// Gives origin `slot` back (its broadcasts must be unannounced).
    pub(crate) fn release_origin(&self, slot: usize) {
        if let Some((_, used)) = self.tables.origins.get(slot) {
            used.set(false);
        }
    }

    /// A broadcast at `path` from the context's table.
    pub(crate) fn claim_broadcast(
        &self,
        path: Path<'_>,
    ) -> Option<broadcast::Ref<'static, 'static>> {
        self.tables.broadcasts.claim(path).ok()
    }

    /// Gives broadcast `b` back to the table.
    pub(crate) fn retire_broadcast(&self, b: broadcast::Ref<'static, 'static>) {
        self.tables.broadcasts.retire(b);
    }

    /// A track described by `info` from the context's table.
    pub(crate) fn claim_track(&self, info: track::Info) -> Option<track::Ref<'static, 'static>> {
        self.tables.tracks.claim(info).ok()
    }

    /// Session storage for a new session, reused if one is free.
    pub fn take_storage(&self) -> Box<SessionStorage> {
        self.storage.take()
    }

    /// Gives session storage back for the next session.
    pub fn give_storage(&self, storage: Box<SessionStorage>) {
        self.storage.give(storage);
    }

    /// The QMux settings sessions start with ([`ClientCtx::set_transport`]).
    pub fn transport(&self) -> conn::Config {
        self.transport.get()
    }
}

/// The receiving half of a client's TCP stream.
pub(crate) type TcpReader = HalfReader<TcpStream>;

/// The sending half of a client's TCP stream.
pub(crate) type TcpWriter = HalfWriter<TcpStream>;
