//! A per-thread "local media changed" signal shared by every session task of
//! one thread: [`Notify`].
//!
//! moq-lite sessions notice local media changes by polling (a group got
//! bytes, a reader advanced). On one thread, the tasks that move media (the
//! relay's session drivers, a client's publisher and readers) bump one
//! generation counter after they made progress and wait for it to change
//! before they poll their sessions again. A task that was woken and finds
//! nothing to do goes back to sleep without bumping, so the wake-ups stop
//! when the media does.
//!
//! Bumps are coalesced: [`Notify::bump`] only marks the signal and schedules
//! a flusher task; when the runtime gets to it (after the tasks that were
//! ready already), it advances the generation and wakes every waiter once.
//! So a hundred sessions making progress in one scheduling round cost one
//! round of wake-ups, not a hundred (which made fan-out quadratic).
//!
//! A second, narrower signal says "readers advanced" ([`Notify::bump_consumed`]):
//! a session that only sent bytes (its group readers moved on, pool blocks may
//! be free) matters to the tasks that write media and wait on their readers
//! (a relay's upstream session releases flow-control credit as the furthest
//! reader advances; a paced or stalled producer waits for room), not to the
//! tasks that only send what others produce. Those mark their [`Waiter`] with
//! [`Waiter::set_sender_only`] and `bump_consumed` skips them, so a fan-out's
//! senders do not wake each other in an echo round after every change. Every
//! other waiter is woken by both signals; [`Notify::bump`] wakes everyone.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// The per-thread change signal (`!Send`; share it with `Rc`).
#[derive(Debug, Default)]
pub struct Notify {
    generation: Cell<u64>,
    /// A bump waits for the flusher.
    pending: Cell<bool>,
    /// The "readers advanced" generation (also advanced by every bump).
    consumed: Cell<u64>,
    /// A consumed-bump waits for the flusher.
    consumed_pending: Cell<bool>,
    /// The flusher task was spawned (on first bump) and its waker.
    flusher: Cell<bool>,
    flusher_waker: RefCell<Option<Waker>>,
    /// One waker place per registered task; `None` = free or not waiting.
    wakers: RefCell<Vec<Option<Waker>>>,
    /// Per place: the task skips [`Notify::bump_consumed`] wake-ups.
    sender_only: RefCell<Vec<bool>>,
    free: RefCell<Vec<usize>>,
}

/// A task's place in a [`Notify`] (returned to it on drop).
#[derive(Debug)]
pub struct Waiter<'n> {
    notify: &'n Notify,
    slot: usize,
}

impl Notify {
    /// A signal nobody waits on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current generation; compare with a later value to see a change.
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }

    /// The current "readers advanced" generation (it changes at every
    /// [`Notify::bump`] and [`Notify::bump_consumed`]).
    pub fn consumed_generation(&self) -> u64 {
        self.consumed.get()
    }

    /// Records a change: every waiting task is woken once the runtime gets
    /// to the flusher (see the module docs). Must be called on a monoio
    /// runtime thread of an `Rc`-shared `Notify` created by [`Notify::shared`];
    /// a `Notify` without a flusher wakes at once ([`Notify::flush`]).
    pub fn bump(&self) {
        if !self.flusher.get() {
            self.flush();
            return;
        }
        if !self.pending.replace(true) {
            self.wake_flusher();
        }
    }

    /// Records that local readers advanced (a task sent what it read): the
    /// waiters not marked with [`Waiter::set_sender_only`] are woken, once
    /// the runtime gets to the flusher (at once without a flusher).
    pub fn bump_consumed(&self) {
        if !self.flusher.get() {
            self.flush_consumed();
            return;
        }
        if !self.consumed_pending.replace(true) {
            self.wake_flusher();
        }
    }

    fn wake_flusher(&self) {
        if let Some(w) = self.flusher_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// A shared signal with its flusher task spawned on the current monoio runtime.
    pub fn shared() -> std::rc::Rc<Notify> {
        let n = std::rc::Rc::new(Notify::new());
        n.flusher.set(true);
        let weak = std::rc::Rc::downgrade(&n);
        monoio::spawn(async move {
            loop {
                let ready = poll_fn(|cx| {
                    let Some(n) = weak.upgrade() else {
                        return Poll::Ready(false);
                    };
                    if n.pending.get() || n.consumed_pending.get() {
                        return Poll::Ready(true);
                    }
                    *n.flusher_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                })
                .await;
                match weak.upgrade() {
                    Some(n) if ready => {
                        // A full bump covers a consumed one.
                        let consumed = n.consumed_pending.replace(false);
                        if n.pending.replace(false) {
                            n.flush();
                        } else if consumed {
                            n.flush_consumed();
                        }
                    }
                    _ => return,
                }
            }
        });
        n
    }

    /// Advances both generations and wakes every waiting task now.
    pub fn flush(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        self.consumed.set(self.consumed.get().wrapping_add(1));
        // Collect first: a woken waker may not re-enter (it only schedules), but
        // keep the borrow short anyway.
        let mut wakers = self.wakers.borrow_mut();
        for w in wakers.iter_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }

    /// Advances the "readers advanced" generation and wakes the waiting
    /// tasks not marked with [`Waiter::set_sender_only`] now.
    pub fn flush_consumed(&self) {
        self.consumed.set(self.consumed.get().wrapping_add(1));
        let mut wakers = self.wakers.borrow_mut();
        let sender_only = self.sender_only.borrow();
        for (w, &skip) in wakers.iter_mut().zip(sender_only.iter()) {
            if !skip && let Some(w) = w.take() {
                w.wake();
            }
        }
    }

    /// A place to wait from (one per task).
    pub fn waiter(&self) -> Waiter<'_> {
        let slot = match self.free.borrow_mut().pop() {
            Some(s) => s,
            None => {
                let mut w = self.wakers.borrow_mut();
                w.push(None);
                self.sender_only.borrow_mut().push(false);
                w.len() - 1
            }
        };
        Waiter { notify: self, slot }
    }

    /// Tasks registered (for tests and metrics).
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len() - self.free.borrow().len()
    }
}

impl Waiter<'_> {
    /// Whether this task only sends what others produce, so readers
    /// advancing elsewhere ([`Notify::bump_consumed`]) never concern it
    /// (default `false`: woken by both signals).
    pub fn set_sender_only(&self, on: bool) {
        if let Some(p) = self.notify.sender_only.borrow_mut().get_mut(self.slot) {
            *p = on;
        }
    }

    /// Registers `waker` to be woken at the next bump.
    pub fn register(&self, waker: &Waker) {
        let mut w = self.notify.wakers.borrow_mut();
        if let Some(place) = w.get_mut(self.slot) {
            match place {
                Some(old) if old.will_wake(waker) => {}
                _ => *place = Some(waker.clone()),
            }
        }
    }

    /// Completes once the generation differs from `seen`.
    pub async fn changed(&self, seen: u64) {
        poll_fn(|cx| {
            if self.notify.generation() != seen {
                return Poll::Ready(());
            }
            self.register(cx.waker());
            Poll::Pending
        })
        .await
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.notify.wakers.borrow_mut().get_mut(self.slot) {
            *place = None;
        }
        self.set_sender_only(false);
        self.notify.free.borrow_mut().push(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_bump_changes_generation() {
        let n = Notify::new();
        let a = n.waiter();
        let b = n.waiter();
        assert_eq!(n.waiters(), 2);
        drop(a);
        let c = n.waiter();
        assert_eq!(n.waiters(), 2);
        let g = n.generation();
        n.bump();
        assert_ne!(n.generation(), g);
        drop((b, c));
        assert_eq!(n.waiters(), 0);
    }

    // ---- the "readers advanced" signal ----

    /// A waker that counts its wake-ups.
    fn counting_waker() -> (Waker, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Count(Arc<AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let n = Arc::new(AtomicUsize::new(0));
        (Waker::from(Arc::new(Count(n.clone()))), n)
    }

    #[test]
    fn bump_consumed_skips_sender_only_waiters() {
        use std::sync::atomic::Ordering;
        let n = Notify::new();
        let (sender, producer) = (n.waiter(), n.waiter());
        sender.set_sender_only(true);
        let (ws, cs) = counting_waker();
        let (wp, cp) = counting_waker();
        sender.register(&ws);
        producer.register(&wp);
        let (g, c) = (n.generation(), n.consumed_generation());
        n.bump_consumed();
        assert_eq!(n.generation(), g);
        assert_ne!(n.consumed_generation(), c);
        assert_eq!(cs.load(Ordering::Relaxed), 0);
        assert_eq!(cp.load(Ordering::Relaxed), 1);
        // A full bump wakes both and advances both generations.
        producer.register(&wp);
        let c = n.consumed_generation();
        n.bump();
        assert_ne!(n.generation(), g);
        assert_ne!(n.consumed_generation(), c);
        assert_eq!(cs.load(Ordering::Relaxed), 1);
        assert_eq!(cp.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn sender_only_mark_is_cleared_with_the_slot() {
        use std::sync::atomic::Ordering;
        let n = Notify::new();
        let a = n.waiter();
        a.set_sender_only(true);
        drop(a);
        let b = n.waiter();
        let (w, c) = counting_waker();
        b.register(&w);
        n.bump_consumed();
        assert_eq!(c.load(Ordering::Relaxed), 1);
    }
}
