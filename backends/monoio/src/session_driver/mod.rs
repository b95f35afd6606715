//! Runs one sans-IO moq-lite [`Session`] over a connection on monoio.
//!
//! The driver has two halves along the core's transport seam. This module is
//! the transport-neutral one: the session task ([`drive`]), the app's hooks
//! ([`App`], [`SetupTables`]), wake-ups, storage ([`StoragePool`]), the
//! drain, timers and the guard's deadlines. The byte-stream half
//! (`bytes`: TCP, TLS, WebSocket) holds the reader task that fills the
//! connection's inbox ([`ByteRead`]) and the staging writer ([`ByteWrite`])
//! the session's records go out through.
//!
//! Two tasks per connection:
//!
//! * a **reader** task ([`ByteRead`]) appends what the socket delivers to the
//!   connection's inbox and wakes the session task; it stops reading while
//!   the inbox holds `INBOX_BYTES` (the session is backpressured, see
//!   skiff-core's session docs), so a slow session slows its peer down;
//! * the **session** task ([`drive`]) feeds the inbox to
//!   [`Session::handle_input`] (unconsumed bytes stay at the front and are
//!   presented again), runs the core's [`Session::pass`] (due timers, events
//!   to the [`App`], its turn), writes what the session has to send into the
//!   [`ByteWrite`] buffer ([`Session::transmit_to`]) and flushes it, then
//!   sleeps until new bytes, a timer, the drain signal or a change that
//!   concerns it on the thread's [`Notify`].
//!
//! What wakes a session for local media is exact, not guessed: before it
//! reads the tracks it serves, and before its next pass writes the tracks
//! it fills, the session registers the thread's track waker on each
//! (`Notify::track_waker`, the core's own track wakers), so any change of
//! them, by whoever makes it, reaches the [`Notify`]; its place there
//! follows the media of the tracks it serves and the media and consumption
//! of the tracks it fills. After each pass it forwards what the track
//! wakers do not carry: the consumption and demand changes the session
//! lists ([`Session::poll_changed`]). An app whose events may concern other
//! tasks wakes them all ([`App::EVENTS_WAKE_ALL`]).
//!
//! An untrusted peer (a relay connection: [`ByteRead::guard`]) is held to
//! two more deadlines: the QMux handshake and its SETUP must complete, and a
//! QMux record once begun must complete, within the handshake timeout; else
//! the session closes with CONTROL_MESSAGE_TIMEOUT (a slowloris peer resets
//! the idle timer with every byte, so that alone would not catch it). A peer
//! that stops reading is caught by the writer ([`ByteWrite::flush`]
//! fails with `TimedOut`), which ends the session and returns its memory.
//!
//! On drain the session sends GOAWAY and keeps serving until the peer closes
//! (the server drops it at the drain timeout). A protocol error closes the
//! session with its code (the close frame is flushed before the socket
//! closes). Storage for a session comes from a per-thread free list
//! ([`StoragePool`]): after warm-up, a new connection allocates none, and no
//! frame ever does.

mod bytes;
mod quic;

use std::cell::Cell;
use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use skiff_core::pool::Slice;
use skiff_core::session::{Change, Event, Handler, LISTED_CHANGES, Session, Storage};
use skiff_core::time::{Duration, Instant};
use skiff_core::transport::Transport;
use skiff_core::wire::lite::{Role, SessionCode};
use skiff_core::wire::qmux::Side;

use crate::clock::Clock;
use crate::notify::{Notify, TrackKey};
use crate::shutdown::Shutdown;

use bytes::Inbox;
pub use bytes::{
    ByteRead, ByteWrite, HalfReader, HalfWriter, READ_BUFFER_BYTES, WRITE_BUFFER_BYTES,
    split_halves,
};
pub use quic::{QuicSession, drive_quic, drive_webtransport};

/// Stream slots of one session's QMux connection (a quarter each are
/// advertised as the peer's bidi and uni stream limits: 20 requests and 20
/// group streams at once).
pub const STREAMS: usize = 80;

/// The tables of one client's session: 24 control streams sharing 8 control
/// buffers of 1 KiB (a stream holds one only while a message is on its way
/// or a prefix is kept; an answer takes the buffer its request leaves), 16
/// subscriptions each way, 16 group streams each way: 23 KiB. A limit
/// reached is refused on the wire, or waits (a control buffer), never grown.
pub type SessionStorage = Storage<'static, 'static, 24, 1024, 16, CLIENT_SUBSCRIPTIONS, 16, 16, 8>;

/// Subscriptions a client's session holds on its peer's tracks at once (the
/// `SUBS` of [`SessionStorage`]).
pub const CLIENT_SUBSCRIPTIONS: usize = 16;

/// A session whose media (origin, tracks, pool) lives for the whole thread.
pub type MoqSession<'s> = Session<'s, 'static, 'static, STREAMS>;

// ---------------------------------------------------------------------------
// Storage pool
// ---------------------------------------------------------------------------

/// A per-thread free list of session tables (a [`SessionStorage`] by
/// default), so accepting a connection does not allocate them again.
pub struct StoragePool<T = SessionStorage> {
    free: RefCell<Vec<Box<T>>>,
}

impl<T> Default for StoragePool<T> {
    fn default() -> Self {
        StoragePool {
            free: RefCell::new(Vec::new()),
        }
    }
}

impl<T> std::fmt::Debug for StoragePool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoragePool")
            .field("free", &self.free.borrow().len())
            .finish()
    }
}

/// Most storages a thread keeps for reuse.
const MAX_POOLED_STORAGE: usize = 256;

impl<T: Default> StoragePool<T> {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A storage, reused if one is free (the session clears it).
    pub fn take(&self) -> Box<T> {
        let reused = self.free.borrow_mut().pop();
        reused.unwrap_or_default()
    }

    /// Gives a storage back.
    pub fn give(&self, storage: Box<T>) {
        let mut free = self.free.borrow_mut();
        if free.len() < MAX_POOLED_STORAGE {
            free.push(storage);
        }
    }
}

/// Deadlines [`drive`] enforces on an untrusted peer, beyond the session's own
/// timers (the QMux idle timeout is reset by any byte, so it does not catch a
/// peer that trickles them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Guard {
    /// The QMux handshake and the peer's SETUP must complete within this of
    /// the start, and a QMux record, once its first byte arrived, within this
    /// of it (a slowloris peer trickling bytes); otherwise the session is
    /// closed with CONTROL_MESSAGE_TIMEOUT 0x11 (docs/protocol.md §2.6, §3.15).
    /// `None`: no such deadline.
    pub handshake: Option<StdDuration>,
}

/// Counts one connection among those that have not finished their handshake
/// (a server's quota of such connections) until [`HandshakeToken::done`] or
/// its drop.
pub struct HandshakeToken {
    count: Rc<Cell<u32>>,
    /// A second count the connection is in ([`HandshakeToken::count_also`]).
    also: Option<Rc<Cell<u32>>>,
    counted: bool,
}

impl std::fmt::Debug for HandshakeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeToken")
            .field("counted", &self.counted)
            .finish()
    }
}

impl HandshakeToken {
    /// Counts one more connection in `count` until the token is done.
    pub fn new(count: Rc<Cell<u32>>) -> Self {
        count.set(count.get().saturating_add(1));
        HandshakeToken {
            count,
            also: None,
            counted: true,
        }
    }

    /// Counts the connection in `count` too (a server's count of one peer
    /// address's handshakes, say) until the token is done; nothing if it is
    /// done already. A later call replaces the second count.
    pub fn count_also(&mut self, count: Rc<Cell<u32>>) {
        if !self.counted {
            return;
        }
        if let Some(old) = self.also.take() {
            old.set(old.get().saturating_sub(1));
        }
        count.set(count.get().saturating_add(1));
        self.also = Some(count);
    }

    /// The handshake is over: the connection no longer counts.
    pub fn done(&mut self) {
        if std::mem::take(&mut self.counted) {
            self.count.set(self.count.get().saturating_sub(1));
            if let Some(also) = self.also.take() {
                also.set(also.get().saturating_sub(1));
            }
        }
    }
}

impl Drop for HandshakeToken {
    fn drop(&mut self) {
        self.done();
    }
}

// ---------------------------------------------------------------------------
// The application seam
// ---------------------------------------------------------------------------

/// What a session takes once its peer's SETUP declared the peer's
/// [`Role`]: [`drive`] calls [`SetupTables::attach`] after handing the SETUP
/// event to the app and before the session reads on, so tables attached
/// there are in place before the peer's first request. A server that sizes
/// a session's media tables by what the peer does implements it; `()`
/// attaches nothing, and `Option<T>` what `T` does if it is `Some`.
pub trait SetupTables<'s, const N: usize> {
    /// Gives `session` what a peer of `role` needs.
    fn attach<X: Transport>(self, session: &mut Session<'s, 'static, 'static, N, X>, role: Role);
}

impl<'s, const N: usize> SetupTables<'s, N> for () {
    fn attach<X: Transport>(self, _session: &mut Session<'s, 'static, 'static, N, X>, _role: Role) {
    }
}

impl<'s, T: SetupTables<'s, N>, const N: usize> SetupTables<'s, N> for Option<T> {
    fn attach<X: Transport>(self, session: &mut Session<'s, 'static, 'static, N, X>, role: Role) {
        if let Some(tables) = self {
            tables.attach(session, role);
        }
    }
}

/// What runs on top of a driven session of `N` stream slots (the relay, a
/// client; [`MoqSession`] unless it is a trunk).
pub trait App<const N: usize = STREAMS> {
    /// An event from the session (its text is borrowed for this call only).
    fn on_event(&mut self, event: &Event<'_>);
    /// Called after every round of events and whenever the thread's media
    /// changed: make requests on the session here.
    fn act<X: Transport>(&mut self, session: &mut Session<'_, 'static, 'static, N, X>);
    /// The session is over.
    fn on_close(&mut self) {}
    /// The driver closes the session because the peer missed a [`Guard`]
    /// deadline (`reason` says which); the default logs it, an app that
    /// names its connections logs it under that name instead.
    fn on_guard_close(&mut self, reason: &'static str) {
        tracing::info!("{reason}: closing the connection");
    }
    /// Lends `slice` of group payload to the peer instead of sending its
    /// bytes, on a link inside one process whose session passes data by
    /// reference (STREAM_REF): the token that names it, or `None` to send
    /// the bytes (the default, and what a link does with every slot lent).
    fn lend(&self, slice: Slice<'static>) -> Option<u64> {
        let _ = slice;
        None
    }
    /// An instant at which the driver makes a pass although nothing woke
    /// the session, asked once before each wait (`now`: the pass's instant).
    /// The relay's worker links use it to look for lent blocks the other
    /// worker gave back. The default is `None`.
    fn wake_at(&mut self, now: Instant) -> Option<Instant> {
        let _ = now;
        None
    }
    /// Whether the app's events may change what other tasks of the thread
    /// wait on, so a pass that delivered events wakes every task. An app
    /// that wakes whom its events concern itself (the relay, by its policy's
    /// [`Effect`](skiff_core::relay::Effect)) says false. The default is true.
    const EVENTS_WAKE_ALL: bool = true;
}

// ---------------------------------------------------------------------------
// The session task
// ---------------------------------------------------------------------------

/// How a driven session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The session closed (either side) and its close was sent.
    Closed,
    /// The peer closed the TCP connection without closing the session.
    PeerEof,
    /// The socket failed.
    SocketError,
}

/// Everything [`drive`] needs besides the session and the socket.
///
/// `shutdown`: a server session sends GOAWAY when it fires; a client session
/// closes with NO_ERROR.
#[derive(Debug, Clone)]
pub struct DriveCtx {
    /// The clock the session's instants come from.
    pub clock: Clock,
    /// The thread's media-change signal.
    pub notify: Rc<Notify>,
    /// The server's drain signal (`None` for clients).
    pub shutdown: Option<Shutdown>,
}

/// Runs `session` over `reader`/`writer` until it ends; see the module docs.
/// It returns once the connection's reader task has ended as well, so
/// nothing of the connection (its socket, its read buffer) outlives it.
///
/// # Errors
/// The writer's error if sending failed.
///
/// The session comes boxed: it is the largest part of a connection, and a
/// future that took it by value would hold a copy of it in every caller's
/// state as well.
///
/// `tables`: what the session takes at the peer's SETUP ([`SetupTables`]:
/// the media tables of a session built without them); `()` for a session
/// whose storage has them already.
///
/// A plain function returning the future, whose block uses the arguments
/// where they were moved in: an `async fn` would also keep a copy of each
/// argument it moves into its body, in every connection's task.
#[allow(clippy::manual_async_fn)]
pub fn drive<'s, R: ByteRead, W: ByteWrite, A: App<N>, T: SetupTables<'s, N>, const N: usize>(
    mut session: Box<Session<'s, 'static, 'static, N>>,
    tables: T,
    mut reader: R,
    mut writer: W,
    app: &mut A,
    ctx: &DriveCtx,
) -> impl Future<Output = io::Result<Ended>> {
    async move {
        // Both buffers come from the thread's pools while bytes pass through.
        let guard = reader.guard();
        let mut handshake = reader.take_handshake();
        let (inbox, reading) = bytes::spawn_reader(reader);
        let driven = Driven {
            session: &mut session,
            inbox: &inbox,
            handler: AppHandler {
                app: &mut *app,
                tables: Some(tables),
                inbox: Some(&inbox),
                setup: None,
            },
            ctx,
            handshake: &mut handshake,
            limit: guard.handshake.map(crate::clock::to_core),
            started: ctx.clock.now(),
            partial_since: None,
            goaway_sent: false,
        };
        let res = driven.run(&mut writer).await;
        // Let the reader go (its in-flight read is dropped with it).
        inbox.stop();
        app.on_close();
        drop(session);
        ctx.notify.bump();
        let _ = writer.close().await;
        // The session ends with its reader: the task has seen the stop (or the
        // end of the stream) and dropped the socket half and its read buffer.
        reading.await;
        res
    }
}

/// The app as the handler of the core's pass: it sees the events and acts,
/// and the peer's SETUP sets the reader's ACK rule and attaches the
/// session's tables before the session reads on.
struct AppHandler<'h, A, T> {
    app: &'h mut A,
    /// What the session takes at the peer's SETUP, until then.
    tables: Option<T>,
    /// The byte-stream reader's inbox, whose ACK rule the SETUP sets (none
    /// on QUIC, whose library acknowledges by itself).
    inbox: Option<&'h Inbox>,
    /// The role of the SETUP just handed to the app.
    setup: Option<Role>,
}

impl<'s, A: App<N>, T: SetupTables<'s, N>, X: Transport, const N: usize>
    Handler<'s, 'static, 'static, N, X> for AppHandler<'_, A, T>
{
    fn on_event(&mut self, _now: Instant, event: &Event<'_>) {
        if let Event::Setup { role, .. } = event {
            self.setup = Some(*role);
        }
        self.app.on_event(event);
    }

    fn after_event(&mut self, session: &mut Session<'s, 'static, 'static, N, X>) {
        // The session reads on past the SETUP only now: its media tables
        // are in place before the peer's first request.
        if let Some(role) = self.setup.take() {
            if let Some(inbox) = self.inbox {
                inbox.set_prompt_acks(role != Role::Subscriber);
            }
            if let Some(tables) = self.tables.take() {
                tables.attach(session, role);
            }
        }
    }

    fn act(&mut self, _now: Instant, session: &mut Session<'s, 'static, 'static, N, X>) {
        self.app.act(session);
    }
}

/// What one pass of [`Driven::pass`] did.
#[derive(Debug, Clone, Copy, Default)]
struct Step {
    /// The session took input, closed, or the app saw events.
    progress: bool,
    /// Events reached the app, which may change what other tasks wait on
    /// (see [`App::EVENTS_WAKE_ALL`]).
    events: bool,
    /// The pass left work another pass may do at once: input it did not
    /// take, events the app saw, a timeout or a close.
    more: bool,
}

/// A session being driven: the session, its inbox and app, and the state
/// its passes keep (the guard's deadlines, the drain).
struct Driven<'d, 's, A, T, const N: usize> {
    session: &'d mut Session<'s, 'static, 'static, N>,
    inbox: &'d Inbox,
    handler: AppHandler<'d, A, T>,
    ctx: &'d DriveCtx,
    handshake: &'d mut Option<HandshakeToken>,
    /// The guard's handshake and record deadline, if any.
    limit: Option<Duration>,
    started: Instant,
    /// Since when the front of the input is a record that has not completed.
    partial_since: Option<Instant>,
    goaway_sent: bool,
}

impl<'s, A: App<N>, T: SetupTables<'s, N>, const N: usize> Driven<'_, 's, A, T, N> {
    /// One pass up to the sending: the input, the guard's deadlines, then
    /// the core's pass (due timers, events to the app, its turn), then the
    /// drain's GOAWAY.
    fn pass(&mut self, now: Instant) -> Step {
        let mut step = Step::default();
        // Input: everything not consumed yet, oldest first.
        if let Some(taken) = self.inbox.feed(self.session, now) {
            step.progress |= taken.consumed;
            step.more |= taken.more;
            // Slowloris: bytes waiting that the session could take but that
            // do not complete a record.
            if taken.settled {
                self.partial_since = None;
            } else if self.partial_since.is_none() {
                self.partial_since = Some(now);
            }
        }
        self.enforce_guard(now, &mut step);
        if self.session.is_setup()
            && let Some(mut h) = self.handshake.take()
        {
            h.done();
        }
        let passed = self.session.pass(now, &mut self.handler);
        step.more |= passed.timed_out;
        if passed.events > 0 {
            step.progress = true;
            step.events = true;
            step.more = true;
        }
        goaway_on_drain(self.session, self.ctx, &mut self.goaway_sent);
        step
    }

    /// Closes the session with CONTROL_MESSAGE_TIMEOUT once the guard's
    /// handshake or incomplete-record deadline passed.
    fn enforce_guard(&mut self, now: Instant, step: &mut Step) {
        let Some(limit) = self.limit else { return };
        if self.session.is_closed() {
            return;
        }
        let reason = if !self.session.is_setup() && now >= self.started.saturating_add(limit) {
            Some("handshake timeout")
        } else if self
            .partial_since
            .is_some_and(|t| now >= t.saturating_add(limit))
        {
            Some("incomplete record timeout")
        } else {
            None
        };
        if let Some(reason) = reason {
            self.handler.app.on_guard_close(reason);
            // docs/protocol.md §3.15: CONTROL_MESSAGE_TIMEOUT.
            self.session
                .close(SessionCode::ControlMessageTimeout, reason);
            step.progress = true;
            step.more = true;
        }
    }

    /// When the next pass is due although nothing wakes the task: the
    /// session's timers, the app's wish, the guard's deadlines.
    fn deadline(&mut self, now: Instant) -> Option<Instant> {
        let mut deadline = self.session.poll_timeout();
        // A pass the app asks for although nothing wakes the task.
        if let Some(at) = self.handler.app.wake_at(now) {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        if let Some(limit) = self.limit
            && !self.session.is_closed()
        {
            let guard_at = [
                (!self.session.is_setup()).then(|| self.started.saturating_add(limit)),
                self.partial_since.map(|t| t.saturating_add(limit)),
            ];
            for at in guard_at.into_iter().flatten() {
                deadline = Some(deadline.map_or(at, |d| d.min(at)));
            }
        }
        deadline
    }

    /// Passes until the session ends, sleeping between them until something
    /// can change.
    async fn run<W: ByteWrite>(mut self, writer: &mut W) -> io::Result<Ended> {
        let ctx = self.ctx;
        let notify = &*ctx.notify;
        let inbox = self.inbox;
        let waiter = notify.waiter();
        // This task's waker: the session's place stays registered while it runs.
        let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
        // What the place follows: the session's track set version and whether it
        // follows every change ([`follow`]).
        let mut followed: Option<(u64, bool)> = None;
        let mut sleep = pin!(monoio::time::sleep(StdDuration::from_secs(3600)));
        let mut armed: Option<Instant> = None;
        // One drain wait for the whole session (dropping it would unregister it).
        let mut drain = pin!(async {
            match &ctx.shutdown {
                Some(s) => s.wait().await,
                None => std::future::pending().await,
            }
        });
        let mut drain_seen = false;
        loop {
            let now = ctx.clock.now();
            crate::buffers::trim_if_due(now);
            let step = self.pass(now);
            let session = &mut *self.session;

            // Core wakers: the next change of a track this session serves, by
            // whoever makes it, wakes the session. Registered after the input
            // and the app (which may start serving) and before `transmit` reads
            // the tracks, so no change after the read is missed.
            // The session's place follows the same tracks from now on, so a
            // change while it runs is seen by its next wait. The tracks it
            // fills carry the same waker, so what its next pass writes there
            // reaches the tasks following them (the only way a media change
            // reaches them: see the `notify` module docs).
            watch_tracks(session, ctx, &waiter, &task, &mut followed);
            let sent = bytes::transmit(session, now, writer, &*self.handler.app).await?;
            let progress = step.progress | sent;
            if session.is_closed() && (session.is_drained() || !progress) {
                return Ok(Ended::Closed);
            }
            if inbox.failed() {
                return Ok(Ended::SocketError);
            }
            if inbox.ended() && (inbox.is_empty() || !progress) {
                return Ok(Ended::PeerEof);
            }
            if progress {
                forward_changes(session, notify, step.events && A::EVENTS_WAKE_ALL);
            }
            // A pass that took all its input and only sent besides (a
            // publisher's frame, a viewer's media and credit) left nothing it
            // could do at once: what lets it do more (bytes, media, credit)
            // wakes it, and the waiter it armed before sending keeps any change
            // since. So it goes to wait rather than walk its tables again for
            // nothing, and the tasks its changes woke run sooner.
            if step.more || (progress && session.is_closed()) {
                continue;
            }

            // Sleep until something can change.
            let deadline = self.deadline(now);
            arm(sleep.as_mut(), &mut armed, deadline, now);
            let shutdown = ctx.shutdown.as_ref().filter(|_| !self.goaway_sent);
            let session_ref = &*self.session;
            poll_fn(|cx| {
                if waiter.take_concerned()
                    || inbox.is_ready()
                    || shutdown.is_some_and(Shutdown::is_draining)
                {
                    return Poll::Ready(());
                }
                // The place is still registered from before `transmit` (a flush
                // that concerned it since took its waker and left the mark seen
                // above); only a session that came to wait on every change since
                // registers again.
                let all = follows_every_change(session_ref);
                if followed.is_none_or(|(_, then)| then != all) {
                    let now_all = follow(session_ref, &waiter, cx.waker());
                    followed = Some((session_ref.tracks_version(), now_all));
                }
                inbox.set_session_waker(cx.waker());
                if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                    armed = None;
                    return Poll::Ready(());
                }
                if !drain_seen && drain.as_mut().poll(cx).is_ready() {
                    drain_seen = true;
                    return Poll::Ready(());
                }
                if writer.poll_transport(cx).is_ready() {
                    return Poll::Ready(());
                }
                Poll::Pending
            })
            .await;
        }
    }
}

/// When the server drains, once: a server's session tells its peer to move
/// on (GOAWAY) and keeps serving until it does, a client's closes
/// (docs/protocol.md §3.12).
fn goaway_on_drain<const N: usize, X: Transport>(
    session: &mut Session<'_, 'static, 'static, N, X>,
    ctx: &DriveCtx,
    goaway_sent: &mut bool,
) {
    if *goaway_sent || !ctx.shutdown.as_ref().is_some_and(Shutdown::is_draining) {
        return;
    }
    *goaway_sent = true;
    if session.side() == Side::Client || session.goaway("").is_err() {
        session.close(SessionCode::NoError, "shutting down");
    }
}

/// Registers the thread's track waker on every track the session serves or
/// fills, and the session's place for what it follows (re-armed when its
/// track set did not change).
///
/// The next change of a track this session serves, by whoever makes it,
/// wakes the session: registered after the input and the app (which may
/// start serving) and before the session reads the tracks to send, so no
/// change after the read is missed. The tracks it fills carry the same
/// waker, so what its next pass writes there reaches the tasks following
/// them (the only way a media change reaches them: see the `notify` module
/// docs).
fn watch_tracks<const N: usize, X: Transport>(
    session: &Session<'_, 'static, 'static, N, X>,
    ctx: &DriveCtx,
    waiter: &crate::notify::Waiter<'_>,
    task: &std::task::Waker,
    followed: &mut Option<(u64, bool)>,
) {
    for track in session.served_tracks().chain(session.filled_tracks()) {
        track.wake_on_change(&ctx.notify.track_waker(track.key()));
    }
    let version = session.tracks_version();
    if *followed != Some((version, follows_every_change(session))) {
        *followed = Some((version, follow(session, waiter, task)));
    } else {
        waiter.rearm(task);
    }
}

/// Arms `sleep` for `deadline` if it is earlier than what is `armed`: the
/// idle deadline moves later with every byte, and a timer that fires early
/// costs one pass, which arms it again for the deadline then.
fn arm(
    sleep: std::pin::Pin<&mut monoio::time::Sleep>,
    armed: &mut Option<Instant>,
    deadline: Option<Instant>,
    now: Instant,
) {
    if let Some(at) = deadline
        && armed.is_none_or(|a| at < a)
    {
        *armed = Some(at);
        let wait = crate::clock::to_std(at.saturating_duration_since(now));
        sleep.reset(monoio::time::Instant::from_std(StdInstant::now() + wait));
    }
}

/// Whether the session waits on every change of the thread: its input is
/// stalled (room in the pool may come from any task) or a request waits for a
/// track it does not name.
fn follows_every_change<const N: usize, X: Transport>(
    session: &Session<'_, 'static, 'static, N, X>,
) -> bool {
    session.is_stalled() || session.has_deferred_requests()
}

/// Registers the session's task at its place: for the media of the tracks it
/// serves and for everything of the tracks it fills; for every change while
/// its input is stalled (room in the pool may come from any task) or a
/// request waits for a track it does not name. True in that last case.
fn follow<const N: usize, X: Transport>(
    session: &Session<'_, 'static, 'static, N, X>,
    waiter: &crate::notify::Waiter<'_>,
    waker: &std::task::Waker,
) -> bool {
    let all = follows_every_change(session);
    if all {
        waiter.register(waker);
    } else {
        waiter.register_session(
            waker,
            session.served_tracks().map(|t| t.key()),
            session.filled_tracks().map(|t| t.key()),
        );
    }
    all
}

/// Wakes the tasks waiting on what the pass changed that no track waker
/// carries, as the session lists it ([`Session::poll_changed`]; see
/// [`forward`]).
fn forward_changes<const N: usize, X: Transport>(
    session: &mut Session<'_, 'static, 'static, N, X>,
    notify: &Notify,
    all: bool,
) {
    forward(std::iter::from_fn(|| session.poll_changed()), notify, all);
}

/// Wakes the tasks concerned by `changes`: the consumption or the demand
/// of a track wakes the tasks following its consumption (its filler, which
/// owes credit for what was read and follows upstream what is wanted), not
/// the other sessions serving it, so a viewer joining or leaving a track
/// with n viewers wakes its filler, not the n; `all` (or more changes than
/// listed) wakes every task. A media change is left out: the track's own
/// wakers reported it to the [`Notify`] when it was made (see [`drive`] and
/// the `notify` module docs).
fn forward(changes: impl Iterator<Item = Change>, notify: &Notify, mut all: bool) {
    let mut keys = [TrackKey::NONE; LISTED_CHANGES];
    let mut n = 0;
    for change in changes {
        match change {
            Change::Media(_) => {}
            Change::Consumed(k) | Change::Demand(k) if n < LISTED_CHANGES => {
                keys[n] = k;
                n += 1;
            }
            _ => all = true,
        }
    }
    if all {
        notify.bump();
        return;
    }
    if n > 0 {
        notify.bump_consumed_tracks(keys.into_iter().take(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waker counting its wake-ups.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn demand_and_consumption_wake_the_filler_not_the_other_viewers() {
        let notify = Notify::new();
        let track = TrackKey::from_parts(1, 0);
        let counts: Vec<_> = (0..4)
            .map(|_| std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0))))
            .collect();
        let woken = || {
            counts
                .iter()
                .map(|c| c.0.load(std::sync::atomic::Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        let wakers: Vec<_> = counts
            .iter()
            .map(|c| std::task::Waker::from(c.clone()))
            .collect();
        let places: Vec<_> = (0..4).map(|_| notify.waiter()).collect();
        let register = || {
            // Place 0 fills the track (the publisher's session); 1 to 3
            // serve it (viewers' sessions).
            places[0].register_session(&wakers[0], std::iter::empty(), [track]);
            for (place, waker) in places.iter().zip(&wakers).skip(1) {
                place.register_session(waker, [track], std::iter::empty());
            }
        };
        register();
        // A viewer subscribed: its session lists the track's demand.
        forward([Change::Demand(track)].into_iter(), &notify, false);
        assert_eq!(woken(), [1, 0, 0, 0]);
        register();
        forward([Change::Consumed(track)].into_iter(), &notify, false);
        assert_eq!(woken(), [2, 0, 0, 0]);
        register();
        // Media is the track wakers' to report; events the app says wake
        // every task do.
        forward([Change::Media(track)].into_iter(), &notify, false);
        assert_eq!(woken(), [2, 0, 0, 0]);
        forward(std::iter::empty(), &notify, true);
        assert_eq!(woken(), [3, 1, 1, 1]);
        register();
        forward([Change::Many].into_iter(), &notify, false);
        assert_eq!(woken(), [4, 2, 2, 2]);
    }

    #[test]
    fn a_handshake_token_counts_in_both_counts_until_done() {
        let (all, addr, other) = (
            Rc::new(Cell::new(0)),
            Rc::new(Cell::new(0)),
            Rc::new(Cell::new(0)),
        );
        let mut t = HandshakeToken::new(all.clone());
        t.count_also(addr.clone());
        assert_eq!((all.get(), addr.get()), (1, 1));
        // A second count replaces the first.
        t.count_also(other.clone());
        assert_eq!((all.get(), addr.get(), other.get()), (1, 0, 1));
        t.done();
        assert_eq!((all.get(), other.get()), (0, 0));
        // Done: neither a new count nor the drop counts again.
        t.count_also(addr.clone());
        drop(t);
        assert_eq!((all.get(), addr.get(), other.get()), (0, 0, 0));
        let mut dropped = HandshakeToken::new(all.clone());
        dropped.count_also(addr.clone());
        drop(dropped);
        assert_eq!((all.get(), addr.get()), (0, 0));
    }
}
