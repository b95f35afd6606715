//! The QUIC half of the session driver: one task per connection runs the
//! session over a [`QuicTransport`], fed by the thread's endpoint through
//! its [`Link`] (docs/protocol.md §11).
//!
//! A pass hands the connection the datagrams routed to it and runs its
//! timers, [`pump`]s what it received into the session (no more per stream
//! than the session has room for), runs the core's pass (events to the
//! [`App`], its turn), lets the session write into the library's stream
//! buffers (group payload by reference to its pool block, [`PoolGather`];
//! everything else copied), and sends the datagrams the library has ready.
//! Between passes the task sleeps until a datagram, a timer, a change of
//! the media it follows, or the drain.

use std::cell::Cell;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration as StdDuration;

use bytes::Bytes;
use skiff_core::pool::Slice;
use skiff_core::session::{Gather, Session};
use skiff_core::time::Instant;
use skiff_quic::{Handoff, QuicTransport, WtStatus, pump};

use super::{
    App, AppHandler, DriveCtx, Ended, SetupTables, arm, follow, follows_every_change,
    forward_changes, goaway_on_drain, watch_tracks,
};
use crate::quic::Link;
use crate::shutdown::Shutdown;

/// A session over QUIC whose media lives for the whole thread.
pub type QuicSession<'s, const N: usize> = Session<'s, 'static, 'static, N, QuicTransport>;

/// Bytes of the scratch buffer the session's transmit is given: the QUIC
/// transport writes into the library's buffers, never into it.
const SCRATCH: usize = 64;

/// The share of a pool's blocks the thread's QUIC connections may hold in
/// their send buffers at once: one block in this many (a quarter), so the
/// pool's other blocks always take new media. Past it, writes copy.
const LEND_SHARE: usize = 4;

thread_local! {
    /// Pool ranges this thread's QUIC send buffers hold ([`PoolBytes`]).
    static LENT: Cell<usize> = const { Cell::new(0) };
}

/// A pool range the library's send buffer holds as [`Bytes`]: its block
/// stays allocated and unchanged until the peer acknowledges the bytes (or
/// the connection drops), instead of the buffer holding a copy.
struct PoolBytes(Slice<'static>);

// SAFETY: a `PoolBytes` lives only inside the `Bytes` handed to the quinn
// connection of a `QuicTransport`, which is not `Send` (it holds `Rc`s): the
// connection, its send buffers and so these ranges are made, read and
// dropped on the thread whose pool they borrow, which is all the pool's
// unsynchronized reference counts need. The pool itself outlives them: its
// owner frees nothing while a block is out (`tables::Keep`).
unsafe impl Send for PoolBytes {}

impl PoolBytes {
    fn new(slice: Slice<'static>) -> Self {
        LENT.with(|n| n.set(n.get() + 1));
        PoolBytes(slice)
    }
}

impl AsRef<[u8]> for PoolBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl Drop for PoolBytes {
    fn drop(&mut self) {
        LENT.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// The session's [`Gather`] on QUIC: lends each group payload range to the
/// library by reference ([`QuicTransport::lend_handoff`]), so a frame sent
/// to many viewers lies once in the pool rather than once per viewer's send
/// buffer, and no write copies it. Past the thread's [`LEND_SHARE`] of the
/// pool it lends nothing and the write copies.
struct PoolGather {
    handoff: Handoff,
}

impl Gather<'static> for PoolGather {
    fn room(&self) -> usize {
        usize::MAX
    }

    fn lend(&mut self, slice: Slice<'static>) -> Option<u64> {
        let cap = slice.pool().capacity() / LEND_SHARE;
        if LENT.with(Cell::get) >= cap {
            return None;
        }
        self.handoff.put(Bytes::from_owner(PoolBytes::new(slice)));
        // The transport takes the range from the handoff; the token is unused.
        Some(0)
    }

    fn push(&mut self, _at: usize, _slice: Slice<'static>) {
        // Never called: a QUIC transport does not gather (`Transport::GATHER`
        // is false), so the session copies what it does not lend.
        debug_assert!(false, "QUIC transport asked to gather");
    }
}

/// Runs `session` over its QUIC connection until it ends (see the module
/// docs); `link` is the connection's side of the thread's endpoint.
///
/// # Errors
/// None today: a failed send is the library's loss to recover; the result
/// keeps the byte-stream driver's shape.
#[allow(clippy::manual_async_fn)]
pub fn drive_quic<'s, A: App<N>, T: SetupTables<'s, N>, const N: usize>(
    mut session: Box<QuicSession<'s, N>>,
    tables: T,
    mut link: Link,
    app: &mut A,
    ctx: &DriveCtx,
) -> impl Future<Output = io::Result<Ended>> {
    async move {
        let ended = run(&mut session, tables, &mut link, app, ctx).await;
        app.on_close();
        // The close goes out before the connection is dropped.
        let now = ctx.clock.now();
        let t = session.transport_mut();
        t.quic_handle_timeout(now);
        link.exchange(t.connection_mut());
        link.flush(t.connection_mut()).await;
        drop(session);
        ctx.notify.bump();
        ended
    }
}

async fn run<'s, A: App<N>, T: SetupTables<'s, N>, const N: usize>(
    session: &mut QuicSession<'s, N>,
    tables: T,
    link: &mut Link,
    app: &mut A,
    ctx: &DriveCtx,
) -> io::Result<Ended> {
    let notify = &*ctx.notify;
    let waiter = notify.waiter();
    let task = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    let mut handler = AppHandler {
        app,
        tables: Some(tables),
        inbox: None,
        setup: None,
    };
    let mut followed: Option<(u64, bool)> = None;
    let mut sleep = pin!(monoio::time::sleep(StdDuration::from_secs(3600)));
    let mut armed: Option<Instant> = None;
    let mut drain = pin!(async {
        match &ctx.shutdown {
            Some(s) => s.wait().await,
            None => std::future::pending().await,
        }
    });
    let mut drain_seen = false;
    let mut goaway_sent = false;
    let mut scratch = [0u8; SCRATCH];
    let mut gather = PoolGather {
        handoff: session.transport_mut().lend_handoff(),
    };
    loop {
        let now = ctx.clock.now();
        crate::buffers::trim_if_due(now);
        let t = session.transport_mut();
        // The connection's share of the thread's send budget, as
        // connections come and go.
        t.fit_send_window();
        let mut progress = link.deliver(t.connection_mut());
        if t.quic_timeout().is_some_and(|at| at <= now) {
            t.quic_handle_timeout(now);
        }
        progress |= pump(session, now);
        let passed = session.pass(now, &mut handler);
        let events = passed.events > 0;
        progress |= events;
        goaway_on_drain(session, ctx, &mut goaway_sent);
        watch_tracks(session, ctx, &waiter, &task, &mut followed);
        // The session writes into the library's stream buffers.
        let _ = session.poll_transmit_gather(now, &mut scratch, &mut gather);
        // What the writes and reads changed (credit, stream limits) may let
        // the session do more at once.
        progress |= pump(session, now);
        let t = session.transport_mut();
        link.exchange(t.connection_mut());
        let sent = link.flush(t.connection_mut()).await > 0;
        if progress {
            forward_changes(session, notify, events && A::EVENTS_WAKE_ALL);
        }
        let t = session.transport();
        // Drained, and nothing the peer sent before its close is left for
        // the session to take.
        if skiff_core::transport::Transport::is_drained(t) {
            return Ok(Ended::Closed);
        }
        if session.is_closed() && t.connection().is_closed() {
            if !sent {
                // Our close (or the peer's) went out: nothing more to say.
                return Ok(Ended::Closed);
            }
            // The close is going out: one more pass sends the rest of it
            // and ends, instead of sleeping through the library's draining
            // period (three probe timeouts, seconds for a peer with no RTT
            // sample) while the connection still counts against its
            // address's quota.
            continue;
        }
        if progress || events {
            continue;
        }

        // Sleep until a datagram, a timer, media or the drain.
        let mut deadline = session.poll_timeout();
        if let Some(at) = session.transport_mut().quic_timeout() {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        if let Some(at) = handler.app.wake_at(now) {
            deadline = Some(deadline.map_or(at, |d| d.min(at)));
        }
        arm(sleep.as_mut(), &mut armed, deadline, now);
        let shutdown = ctx.shutdown.as_ref().filter(|_| !goaway_sent);
        let session_ref = &*session;
        let link_ref = &*link;
        poll_fn(|cx| {
            if waiter.take_concerned()
                || link_ref.poll_ready(cx.waker())
                || shutdown.is_some_and(Shutdown::is_draining)
            {
                return Poll::Ready(());
            }
            let all = follows_every_change(session_ref);
            if followed.is_none_or(|(_, then)| then != all) {
                let now_all = follow(session_ref, &waiter, cx.waker());
                followed = Some((session_ref.tracks_version(), now_all));
            }
            if armed.is_some() && sleep.as_mut().poll(cx).is_ready() {
                armed = None;
                return Poll::Ready(());
            }
            if !drain_seen && drain.as_mut().poll(cx).is_ready() {
                drain_seen = true;
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }
}

/// Drives a WebTransport connection before its session exists
/// (docs/protocol.md §12): the QUIC handshake, the HTTP/3 SETTINGS and the
/// CONNECT exchange, until `done` says the transport reached what the
/// caller waits for, or `by` passes. Returns the last status (`Failed` for
/// a raw QUIC transport).
pub async fn drive_webtransport(
    transport: &mut QuicTransport,
    link: &mut Link,
    clock: crate::clock::Clock,
    by: Instant,
    done: impl Fn(&QuicTransport) -> bool,
) -> WtStatus {
    let mut sleep = pin!(monoio::time::sleep(StdDuration::ZERO));
    loop {
        let now = clock.now();
        link.deliver(transport.connection_mut());
        if transport.quic_timeout().is_some_and(|at| at <= now) {
            transport.quic_handle_timeout(now);
        }
        transport.poll_webtransport(now);
        link.exchange(transport.connection_mut());
        link.flush(transport.connection_mut()).await;
        let status = transport.wt_status().unwrap_or(WtStatus::Failed);
        if done(transport) || transport.connection().is_drained() || now >= by {
            return status;
        }
        // Until a datagram, a timer, or the deadline.
        let wake = transport.quic_timeout().map_or(by, |t| t.min(by));
        sleep
            .as_mut()
            .reset(monoio::time::Instant::from_std(transport.std_at(wake)));
        let link = &*link;
        poll_fn(|cx| {
            if link.poll_ready(cx.waker()) || sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }
}
