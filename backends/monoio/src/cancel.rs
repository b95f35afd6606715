//! Cancelable monoio operations: an operation cancelled when a drain signal
//! fires or a time limit passes (its owned buffers still come back from the
//! kernel), a write that gives up on a peer that stopped reading (by shutting
//! its socket down), and a race of two futures.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use std::os::fd::RawFd;

use monoio::io::{AsyncWriteRent, Canceller};

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
/// set (the limit and the socket's descriptor), gives up with
/// [`io::ErrorKind::TimedOut`] once the socket accepted no byte for that
/// long (each accepted byte restarts the clock). Returns the result and the
/// buffers ([`Outgoing::sent`] tells how much was written).
///
/// A write that completes at once costs no timer and no cancellation
/// token (registering one costs a hashed insert and removal in the runtime
/// on every write). One that waits arms a timer; when it fires, the socket
/// is shut down in both directions, which ends the pending write with an
/// error (or the bytes it took meanwhile) so its buffers come back from
/// the kernel, and ends the connection, which a peer that stopped reading
/// loses anyway.
pub async fn write_all_or_stall<W: AsyncWriteRent>(
    half: &mut W,
    mut out: Outgoing,
    stall: Option<(Duration, RawFd)>,
) -> (io::Result<()>, Outgoing) {
    while out.remaining() > 0 {
        let (res, back, timed_out) = {
            let mut write = pin!(half.writev(out));
            let mut timer = pin!(None::<monoio::time::Sleep>);
            let mut timed_out = false;
            let (res, back) = poll_fn(|cx| {
                if let Poll::Ready(r) = write.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                let Some((limit, fd)) = stall else {
                    return Poll::Pending;
                };
                if timer.is_none() && !timed_out {
                    timer.set(Some(monoio::time::sleep(limit)));
                }
                if let Some(t) = timer.as_mut().as_pin_mut()
                    && t.poll(cx).is_ready()
                {
                    timer.set(None);
                    timed_out = true;
                    // SAFETY: `fd` is the socket `half` writes to, open
                    // while `half` lives; shutting it down only ends its
                    // traffic. The pending write then completes.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
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
            Ok(n) => {
                // Bytes accepted, even by a write that ended late; but the
                // socket is shut down once the limit passed.
                out.advance(n);
                if timed_out {
                    return (Err(io::ErrorKind::TimedOut.into()), out);
                }
            }
            Err(_) if timed_out => return (Err(io::ErrorKind::TimedOut.into()), out),
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
