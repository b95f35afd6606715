//! Stopping the server: a cross-thread stop trigger, and the per-thread
//! [`Shutdown`] signal that connection handlers observe to start draining.
//!
//! Crossing threads uses one Unix socket pair per worker: the worker's runtime
//! reads its end (on io_uring or epoll alike), and [`StopTrigger::stop`] drops
//! the other end, so the read ends with EOF. No cross-thread waker is needed,
//! which keeps monoio's `sync` feature (and its shared queues) out.
//! Inside a thread, [`LocalEvent`] is an `Rc`-based notifier with no atomics.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use monoio::io::AsyncReadRent;

// ---------------------------------------------------------------------------
// Thread-local event
// ---------------------------------------------------------------------------

#[derive(Default)]
struct EventState {
    fired: Cell<bool>,
    generation: Cell<u64>,
    /// Waiter slots; `None` is free. Slots are reused, so after warm-up a
    /// wait registers without allocating.
    waiters: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

/// A single-thread notifier: [`LocalEvent::fire`] latches it (every present
/// and future [`LocalEvent::wait`] completes); [`LocalEvent::notify`] wakes
/// only the waits that exist now. Cheap to clone (an `Rc`); `!Send`.
#[derive(Clone, Default)]
pub struct LocalEvent {
    state: Rc<EventState>,
}

impl std::fmt::Debug for LocalEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEvent")
            .field("fired", &self.state.fired.get())
            .finish()
    }
}

impl LocalEvent {
    /// A new, unfired event.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether [`LocalEvent::fire`] was called.
    pub fn is_fired(&self) -> bool {
        self.state.fired.get()
    }

    /// Latches the event and wakes every waiter.
    pub fn fire(&self) {
        self.state.fired.set(true);
        self.notify();
    }

    /// Wakes every current waiter without latching.
    pub fn notify(&self) {
        let s = &self.state;
        s.generation.set(s.generation.get().wrapping_add(1));
        // Take the wakers out first so a woken task that polls again (same
        // thread, later) never meets a borrowed RefCell.
        let mut woken = Vec::new();
        for slot in s.waiters.borrow_mut().iter_mut() {
            if let Some(w) = slot.take() {
                woken.push(w);
            }
        }
        for w in woken {
            w.wake();
        }
    }

    /// Completes when the event fires, or on the next [`LocalEvent::notify`].
    pub fn wait(&self) -> Wait<'_> {
        Wait {
            event: self,
            generation: self.state.generation.get(),
            slot: None,
        }
    }
}

/// The future of [`LocalEvent::wait`].
#[must_use = "futures do nothing unless awaited"]
pub struct Wait<'a> {
    event: &'a LocalEvent,
    generation: u64,
    slot: Option<usize>,
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let s = &self.event.state;
        if s.fired.get() || s.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let mut waiters = s.waiters.borrow_mut();
        match self.slot {
            Some(i) => {
                // Slots are only cleared, never removed, so `i` stays valid.
                if let Some(slot) = waiters.get_mut(i) {
                    match slot {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *slot = Some(cx.waker().clone()),
                    }
                }
            }
            None => {
                let i = match s.free.borrow_mut().pop() {
                    Some(i) => i,
                    None => {
                        waiters.push(None);
                        waiters.len() - 1
                    }
                };
                if let Some(slot) = waiters.get_mut(i) {
                    *slot = Some(cx.waker().clone());
                }
                drop(waiters);
                self.slot = Some(i);
            }
        }
        Poll::Pending
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &self.event.state;
            if let Some(slot) = s.waiters.borrow_mut().get_mut(i) {
                *slot = None;
            }
            s.free.borrow_mut().push(i);
        }
    }
}

// ---------------------------------------------------------------------------
// The handlers' view
// ---------------------------------------------------------------------------

/// The stop signal a connection handler observes: once it fires the server
/// accepts no more connections and waits (up to the drain timeout) for open
/// ones to finish. A moq-lite session reacts by sending GOAWAY and closing
/// once the peer has moved on; a simple handler just stops.
#[derive(Clone, Debug)]
pub struct Shutdown {
    event: LocalEvent,
}

impl Shutdown {
    /// The drain signal that fires with `event`.
    pub fn new(event: LocalEvent) -> Self {
        Shutdown { event }
    }

    /// Whether the server is draining.
    pub fn is_draining(&self) -> bool {
        self.event.is_fired()
    }

    /// Completes once the server starts draining (at once if it already is).
    pub fn wait(&self) -> impl Future<Output = ()> + '_ {
        let event = &self.event;
        async move {
            while !event.is_fired() {
                event.wait().await;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Cross-thread trigger
// ---------------------------------------------------------------------------

/// The side of the stop pipes held by whoever stops the server (signal
/// thread, tests). Dropping it stops the server too.
#[derive(Debug, Default)]
pub struct StopTrigger {
    ends: Mutex<Vec<StdUnixStream>>,
}

/// One worker's end of its stop pipe.
#[derive(Debug)]
pub struct StopReceiver {
    end: StdUnixStream,
}

impl StopTrigger {
    /// A trigger with one receiver per worker.
    ///
    /// # Errors
    /// The socket pairs cannot be created (out of file descriptors).
    pub fn new(workers: usize) -> io::Result<(Self, Vec<StopReceiver>)> {
        let mut ends = Vec::with_capacity(workers);
        let mut receivers = Vec::with_capacity(workers);
        for _ in 0..workers {
            let (a, b) = StdUnixStream::pair()?;
            ends.push(a);
            receivers.push(StopReceiver { end: b });
        }
        Ok((
            StopTrigger {
                ends: Mutex::new(ends),
            },
            receivers,
        ))
    }

    /// Tells every worker to stop accepting and drain. Idempotent.
    pub fn stop(&self) {
        let ends = match self.ends.lock() {
            Ok(mut g) => std::mem::take(&mut *g),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        drop(ends);
    }
}

impl StopReceiver {
    /// Waits, on the current monoio runtime, until [`StopTrigger::stop`] is
    /// called (or the trigger is dropped).
    ///
    /// # Errors
    /// The socket cannot be registered with the runtime.
    pub async fn stopped(self) -> io::Result<()> {
        // epoll needs a non-blocking fd; io_uring must get a blocking one (it
        // honours O_NONBLOCK and would complete the read with EAGAIN).
        self.end.set_nonblocking(monoio::utils::is_legacy())?;
        let mut s = monoio::net::UnixStream::from_std(self.end)?;
        let mut buf = Vec::with_capacity(1);
        loop {
            let (res, b) = s.read(buf).await;
            buf = b;
            buf.clear();
            match res {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Any other error also means the pipe is unusable: stop.
                Err(_) => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{self, DriverKind};

    fn both_drivers(f: impl Fn(DriverKind)) {
        f(DriverKind::Legacy);
        if driver::io_uring_available() {
            f(DriverKind::IoUring);
        }
    }

    #[test]
    fn fire_wakes_present_and_future_waiters() {
        both_drivers(|kind| {
            driver::block_on(kind, |_| async {
                let ev = LocalEvent::new();
                let ev2 = ev.clone();
                let waiter = monoio::spawn(async move {
                    ev2.wait().await;
                    ev2.is_fired()
                });
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                ev.fire();
                assert!(waiter.await);
                ev.wait().await; // latched
            })
            .unwrap();
        });
    }

    #[test]
    fn notify_wakes_only_current_waiters_and_slots_are_reused() {
        driver::block_on(DriverKind::Legacy, |_| async {
            let ev = LocalEvent::new();
            for _ in 0..3 {
                let ev2 = ev.clone();
                let t = monoio::spawn(async move { ev2.wait().await });
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
                ev.notify();
                t.await;
            }
            assert!(!ev.is_fired());
            assert_eq!(ev.state.waiters.borrow().len(), 1);
        })
        .unwrap();
    }

    #[test]
    fn stop_trigger_reaches_every_worker() {
        both_drivers(|kind| {
            let (trigger, receivers) = StopTrigger::new(2).unwrap();
            let threads: Vec<_> = receivers
                .into_iter()
                .map(|r| {
                    std::thread::spawn(move || driver::block_on(kind, |_| r.stopped()).unwrap())
                })
                .collect();
            trigger.stop();
            trigger.stop();
            for t in threads {
                t.join().unwrap().unwrap();
            }
        });
    }
}
