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
//! Two kinds of change: media ([`Notify::bump`]: bytes or groups arrived,
//! tracks or subscriptions changed) and consumption only
//! ([`Notify::bump_consumed`]: a task only sent what it had read, which
//! matters to producers waiting for pacing or credit). A task that cares
//! about media only waits with [`Waiter::register_media`]; after a fan-out
//! round the senders' bumps then wake the producers, not every sender again.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// The per-thread change signal (`!Send`; share it with `Rc`).
#[derive(Debug, Default)]
pub struct Notify {
    /// Changes of either kind.
    generation: Cell<u64>,
    /// Media changes.
    media: Cell<u64>,
    /// A media bump waits for the flusher.
    pending: Cell<bool>,
    /// A consumption-only bump waits for the flusher.
    pending_consumed: Cell<bool>,
    /// The flusher task was spawned (on first bump) and its waker.
    flusher: Cell<bool>,
    flusher_waker: RefCell<Option<Waker>>,
    /// One waker place per registered task (`None` = free or not waiting),
    /// and whether it waits for media changes only.
    wakers: RefCell<Vec<(Option<Waker>, bool)>>,
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

    /// The current media generation: it changes with media bumps only.
    pub fn media_generation(&self) -> u64 {
        self.media.get()
    }

    /// Records a media change: every waiting task is woken once the runtime
    /// gets to the flusher (see the module docs). Must be called on a monoio
    /// runtime thread of an `Rc`-shared `Notify` created by [`Notify::shared`];
    /// a `Notify` without a flusher wakes at once ([`Notify::flush`]).
    pub fn bump(&self) {
        self.mark(true);
    }

    /// Records that a task consumed media without changing any: only the
    /// tasks not waiting for media alone are woken (see [`Notify::bump`]).
    pub fn bump_consumed(&self) {
        self.mark(false);
    }

    /// Marks a change of either kind for the flusher (or wakes at once without one).
    fn mark(&self, media: bool) {
        if !self.flusher.get() {
            if media {
                self.flush();
            } else {
                self.flush_consumed();
            }
            return;
        }
        let pending = if media {
            &self.pending
        } else {
            &self.pending_consumed
        };
        if !pending.replace(true) {
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
                        return Poll::Ready(None);
                    };
                    let (media, consumed) =
                        (n.pending.replace(false), n.pending_consumed.replace(false));
                    if media || consumed {
                        return Poll::Ready(Some(media));
                    }
                    *n.flusher_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                })
                .await;
                match weak.upgrade() {
                    Some(n) if ready == Some(true) => n.flush(),
                    Some(n) if ready == Some(false) => n.flush_consumed(),
                    _ => return,
                }
            }
        });
        n
    }

    /// Advances both generations and wakes every waiting task now.
    pub fn flush(&self) {
        self.media.set(self.media.get().wrapping_add(1));
        self.wake(true);
    }

    /// Advances the generation (not the media one) and wakes now the tasks
    /// that do not wait for media changes only.
    pub fn flush_consumed(&self) {
        self.wake(false);
    }

    fn wake(&self, media: bool) {
        self.generation.set(self.generation.get().wrapping_add(1));
        // A woken waker may not re-enter (it only schedules).
        let mut wakers = self.wakers.borrow_mut();
        for (w, media_only) in wakers.iter_mut() {
            if (media || !*media_only)
                && let Some(w) = w.take()
            {
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
                w.push((None, false));
                w.len() - 1
            }
        };
        Waiter { notify: self, slot }
    }

    /// Completes once `cond` holds: checked now and again after every change.
    pub async fn wait_until(&self, mut cond: impl FnMut() -> bool) {
        let waiter = self.waiter();
        loop {
            let seen = self.generation();
            if cond() {
                return;
            }
            waiter.changed(seen).await;
        }
    }

    /// Tasks registered (for tests and metrics).
    pub fn waiters(&self) -> usize {
        self.wakers.borrow().len() - self.free.borrow().len()
    }
}

impl Waiter<'_> {
    /// Registers `waker` to be woken at the next bump of either kind.
    pub fn register(&self, waker: &Waker) {
        self.register_for(waker, false);
    }

    /// Registers `waker` to be woken at the next media bump only
    /// ([`Notify::bump`]); compare [`Notify::media_generation`] then.
    pub fn register_media(&self, waker: &Waker) {
        self.register_for(waker, true);
    }

    fn register_for(&self, waker: &Waker, media_only: bool) {
        let mut w = self.notify.wakers.borrow_mut();
        if let Some((place, only)) = w.get_mut(self.slot) {
            *only = media_only;
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
            *place = (None, false);
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

    #[test]
    fn consumption_wakes_only_tasks_not_waiting_for_media_alone() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::task::Wake;
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let (any, media) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let (wa, wm) = (Waker::from(any.clone()), Waker::from(media.clone()));
        let n = Notify::new();
        let (a, m) = (n.waiter(), n.waiter());
        a.register(&wa);
        m.register_media(&wm);
        let (g, mg) = (n.generation(), n.media_generation());
        n.bump_consumed();
        assert_ne!(n.generation(), g);
        assert_eq!(n.media_generation(), mg);
        assert_eq!(
            (
                any.0.load(Ordering::Relaxed),
                media.0.load(Ordering::Relaxed)
            ),
            (1, 0)
        );
        a.register(&wa);
        n.bump();
        assert_ne!(n.media_generation(), mg);
        assert_eq!(
            (
                any.0.load(Ordering::Relaxed),
                media.0.load(Ordering::Relaxed)
            ),
            (2, 1)
        );
    }
}
