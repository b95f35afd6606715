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

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// The per-thread change signal (`!Send`; share it with `Rc`).
#[derive(Debug, Default)]
pub struct Notify {
    generation: Cell<u64>,
    /// A bump waits for the flusher.
    pending: Cell<bool>,
    /// The flusher task was spawned (on first bump) and its waker.
    flusher: Cell<bool>,
    flusher_waker: RefCell<Option<Waker>>,
    /// One waker place per registered task; `None` = free or not waiting.
    wakers: RefCell<Vec<Option<Waker>>>,
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

    /// Records a change: every waiting task is woken once the runtime gets
    /// to the flusher (see the module docs). Must be called on a monoio
    /// runtime thread of an `Rc`-shared `Notify` created by [`Notify::shared`];
    /// a `Notify` without a flusher wakes at once ([`Notify::flush`]).
    pub fn bump(&self) {
        if !self.flusher.get() {
            self.flush();
            return;
        }
        if !self.pending.replace(true)
            && let Some(w) = self.flusher_waker.borrow_mut().take()
        {
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
                    if n.pending.replace(false) {
                        return Poll::Ready(true);
                    }
                    *n.flusher_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                })
                .await;
                match weak.upgrade() {
                    Some(n) if ready => n.flush(),
                    _ => return,
                }
            }
        });
        n
    }

    /// Advances the generation and wakes every waiting task now.
    pub fn flush(&self) {
        self.generation.set(self.generation.get().wrapping_add(1));
        // Collect first: a woken waker may not re-enter (it only schedules), but
        // keep the borrow short anyway.
        let mut wakers = self.wakers.borrow_mut();
        for w in wakers.iter_mut() {
            if let Some(w) = w.take() {
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
}
