//! Cancelable monoio operations: an operation cancelled when a drain signal
//! fires or a time limit passes (its owned buffers still come back from the
//! kernel), a write that gives up on a peer that stopped reading, and a race
//! of two futures.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use monoio::io::{CancelableAsyncWriteRent, Canceller};

use crate::shutdown::LocalEvent;
use crate::staging::Outgoing;

/// ECANCELED, what monoio returns for a cancelled operation.
const ECANCELED: i32 = 125;

/// Runs the cancelable operation built by `op` and cancels it (through
/// `canceller`) once `stop` fires, then still waits for the operation to
/// complete so owned buffers come back from the kernel.
///
/// Reusing one [`Canceller`] per loop keeps this allocation-free after the
/// first call (a fresh one allocates its shared state).
pub async fn cancel_on<F, T>(
    stop: &LocalEvent,
    canceller: &mut Canceller,
    op: impl FnOnce(monoio::io::CancelHandle) -> F,
) -> T
where
    F: Future<Output = T>,
{
    cancel_on_or_after(stop, None, canceller, op).await
}

/// [`cancel_on`], cancelling also once `limit` (if any) has passed.
pub async fn cancel_on_or_after<F, T>(
    stop: &LocalEvent,
    limit: Option<Duration>,
    canceller: &mut Canceller,
    op: impl FnOnce(monoio::io::CancelHandle) -> F,
) -> T
where
    F: Future<Output = T>,
{
    let mut fut = pin!(op(canceller.handle()));
    let mut stop_wait = pin!(stop.wait());
    let mut timer = pin!(limit.map(monoio::time::sleep));
    let mut armed = true;
    poll_fn(|cx| {
        if armed
            && (stop.is_fired()
                || stop_wait.as_mut().poll(cx).is_ready()
                || timer
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|t| t.poll(cx).is_ready()))
        {
            armed = false;
            // `cancel` hands back a fresh canceller for any later operation.
            *canceller = std::mem::take(canceller).cancel();
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// Writes all of `out` to `half` (one `writev` after another); with `stall`
/// set, gives up with [`io::ErrorKind::TimedOut`] once the socket accepted no
/// byte for that long (each accepted byte restarts the clock), and cancels
/// the write through the canceller then. Returns the
/// result and the buffers ([`Outgoing::sent`] tells how much was written).
///
/// A write that completes at once costs no timer; one that waits arms a
/// timer and, when it fires, cancels the write through `canceller` (and waits
/// for the cancellation, so the buffers come back from the kernel).
pub async fn write_all_or_stall<W: CancelableAsyncWriteRent>(
    half: &mut W,
    mut out: Outgoing,
    mut stall: Option<(Duration, &mut Canceller)>,
) -> (io::Result<()>, Outgoing) {
    while out.remaining() > 0 {
        let Some((limit, canceller)) = stall.as_mut() else {
            let (res, back) = half.writev(out).await;
            out = back;
            match res {
                Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), out),
                Ok(n) => out.advance(n),
                Err(e) => return (Err(e), out),
            }
            continue;
        };
        let handle = canceller.handle();
        let limit = *limit;
        let (res, back, timed_out) = {
            let mut write = pin!(half.cancelable_writev(out, handle));
            let mut timer = pin!(None::<monoio::time::Sleep>);
            let mut timed_out = false;
            let (res, back) = poll_fn(|cx| {
                if let Poll::Ready(r) = write.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                if timer.is_none() && !timed_out {
                    timer.set(Some(monoio::time::sleep(limit)));
                }
                if let Some(t) = timer.as_mut().as_pin_mut()
                    && t.poll(cx).is_ready()
                {
                    timer.set(None);
                    timed_out = true;
                    // Cancel, then wait for the write to hand the buffers back.
                    **canceller = std::mem::take(&mut **canceller).cancel();
                    return write.as_mut().poll(cx);
                }
                Poll::Pending
            })
            .await;
            (res, back, timed_out)
        };
        out = back;
        match res {
            Ok(0) => return (Err(io::ErrorKind::WriteZero.into()), out),
            // Bytes accepted, even by a write cancelled late: progress.
            Ok(n) => out.advance(n),
            Err(e) if timed_out && (is_cancelled(&e) || e.kind() == io::ErrorKind::Interrupted) => {
                return (Err(io::ErrorKind::TimedOut.into()), out);
            }
            Err(e) => return (Err(e), out),
        }
    }
    (Ok(()), out)
}

/// Whether an I/O error is monoio's "operation cancelled".
pub fn is_cancelled(e: &io::Error) -> bool {
    e.raw_os_error() == Some(ECANCELED)
}

/// Polls two futures; returns the first to finish, dropping the other.
///
/// `b` is polled first on every wake-up, so a `b` that registers a waker
/// (such as [`LocalEvent::wait`]) does so on the very first poll, before `a`
/// runs; it then never allocates later, in the middle of `a`'s steady state.
pub fn race<A: Future, B: Future>(a: A, b: B) -> Race<A, B> {
    Race { a, b }
}

pin_project_lite::pin_project! {
    /// The future of [`race`]: both futures in place, each stored once (a
    /// connection's task holds several races, so their size is its size).
    #[must_use = "futures do nothing unless awaited"]
    pub struct Race<A, B> {
        #[pin]
        a: A,
        #[pin]
        b: B,
    }
}

impl<A: Future, B: Future> Future for Race<A, B> {
    type Output = Result<A::Output, B::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(y) = this.b.poll(cx) {
            return Poll::Ready(Err(y));
        }
        if let Poll::Ready(x) = this.a.poll(cx) {
            return Poll::Ready(Ok(x));
        }
        Poll::Pending
    }
}
