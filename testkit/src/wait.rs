//! Waiting on a thread's [`Notify`] from a test task, with the API the
//! session driver uses: a place that follows every change
//! ([`Waiter::register`]) and the mark a flush leaves on it
//! ([`Waiter::take_concerned`]).
//!
//! A test that drives sessions by hand waits for "something changed on this
//! thread" (a session passed and listed a change, a track waker fired, a
//! test bumped) and then looks again at what it checks: [`Changes::next`],
//! or [`until`] for the whole loop.

use std::future::poll_fn;
use std::task::{Poll, Waker};

use skiff_monoio::notify::{Notify, Waiter};

/// A task's place on a [`Notify`] that every change concerns: each flush
/// from the place's making on is kept until [`Changes::next`] sees it, so
/// a change made while the task runs is not lost.
#[derive(Debug)]
pub struct Changes<'n> {
    waiter: Waiter<'n>,
}

impl<'n> Changes<'n> {
    /// A place on `notify`, following every change from now on.
    pub fn new(notify: &'n Notify) -> Self {
        let waiter = notify.waiter();
        // Listed at once, so flushes before the first wait mark it; the
        // task's own waker replaces this one at its first wait.
        waiter.register(Waker::noop());
        Changes { waiter }
    }

    /// Completes once a flush concerned the place since it was made or
    /// since the last `next` completed (at once if one did).
    pub async fn next(&self) {
        poll_fn(|cx| {
            if self.waiter.take_concerned() {
                return Poll::Ready(());
            }
            self.waiter.register(cx.waker());
            Poll::Pending
        })
        .await
    }
}

/// Completes once `cond` holds: checked now and again after every change
/// flushed on `notify`.
pub async fn until(notify: &Notify, mut cond: impl FnMut() -> bool) {
    let changes = Changes::new(notify);
    while !cond() {
        changes.next().await;
    }
}
