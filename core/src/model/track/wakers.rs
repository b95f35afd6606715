//! A fixed-capacity registration of the tasks to wake on a track's change.

use core::cell::Cell;
use core::fmt;
use core::task::Waker;

/// How many tasks a track remembers to wake at once (see [`Wakers`]).
pub const WAKERS: usize = 4;

/// Up to `W` wakers to wake on a change, registered without allocating.
///
/// Registering a waker that will wake the same task as one already held is a
/// no-op. When all `W` places are taken, registering wakes every registered
/// task and clears them (they re-register when polled), then keeps the new
/// one: with any `W`, including 0, no task is ever forgotten, only woken early.
pub struct Wakers<const W: usize> {
    slots: [Cell<Option<Waker>>; W],
}

impl<const W: usize> Wakers<W> {
    /// An empty registration.
    pub const fn new() -> Self {
        Wakers {
            slots: [const { Cell::new(None) }; W],
        }
    }

    /// Remembers `waker` until the next [`Wakers::wake`].
    pub fn register(&self, waker: &Waker) {
        let mut free = None;
        for (i, slot) in self.slots.iter().enumerate() {
            match slot.take() {
                Some(w) => {
                    let same = w.will_wake(waker);
                    slot.set(Some(w));
                    if same {
                        return;
                    }
                }
                None => {
                    if free.is_none() {
                        free = Some(i);
                    }
                }
            }
        }
        let i = match free {
            Some(i) => i,
            None => {
                self.wake();
                0
            }
        };
        match self.slots.get(i) {
            Some(slot) => slot.set(Some(waker.clone())),
            None => waker.wake_by_ref(),
        }
    }

    /// Wakes and forgets every registered waker.
    pub fn wake(&self) {
        for slot in &self.slots {
            if let Some(w) = slot.take() {
                w.wake();
            }
        }
    }

    /// How many wakers are registered.
    pub fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| {
                let w = slot.take();
                let some = w.is_some();
                slot.set(w);
                some
            })
            .count()
    }

    /// Whether no waker is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<const W: usize> Default for Wakers<W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const W: usize> fmt::Debug for Wakers<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakers")
            .field("registered", &self.len())
            .field("capacity", &W)
            .finish()
    }
}
