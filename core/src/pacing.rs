//! Pacing: how far a writer may run ahead of its furthest reader.
//!
//! A producer that writes faster than anyone reads only fills memory (and,
//! on a relay, the pool every other track shares). So a writer stays within a
//! *window* of the furthest reader's position: it may write while
//! `written - furthest_read < window`, and waits otherwise
//! ([`crate::model::group::Producer::poll_paced`]).
//!
//! The window is the smallest of what the transport can currently take
//! (stream and connection credit: bytes the peer allows us to send) and a
//! fixed ceiling, [`AHEAD`]. Everything here is a pure function of its
//! inputs, so it is tested with made-up numbers.

/// The most a writer may run ahead of its furthest reader, whatever the credit: 16 MiB.
pub const AHEAD: u64 = 16 * 1024 * 1024;

/// The pacing window for a writer whose readers forward to a transport.
///
/// * `None, None`: no transport (a local writer, or credit unknown): [`AHEAD`].
/// * `Some(stream), None`: the stream's remaining send credit, at most [`AHEAD`].
/// * `None, Some(conn)`: the connection's remaining send credit, at most [`AHEAD`].
/// * `Some(stream), Some(conn)`: the smaller of both, at most [`AHEAD`].
///
/// A credit of 0 gives a window of 0: the writer may not run ahead at all
/// until the credit grows (re-poll it then; reading alone cannot help).
pub const fn window(stream_credit: Option<u64>, connection_credit: Option<u64>) -> u64 {
    let mut w = AHEAD;
    if let Some(s) = stream_credit
        && s < w
    {
        w = s;
    }
    if let Some(c) = connection_credit
        && c < w
    {
        w = c;
    }
    w
}

/// Decides whether a writer at `written` may write more, given the furthest read position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pacer {
    window: u64,
}

impl Pacer {
    /// A pacer with a fixed `window` in bytes.
    pub const fn new(window: u64) -> Self {
        Pacer { window }
    }

    /// A pacer whose window comes from transport credits (see [`window`]).
    pub const fn from_credits(stream_credit: Option<u64>, connection_credit: Option<u64>) -> Self {
        Pacer::new(window(stream_credit, connection_credit))
    }

    /// The window in bytes.
    pub const fn window(&self) -> u64 {
        self.window
    }

    /// How far the writer is ahead of the furthest reader (0 if a reader is level).
    pub const fn ahead(written: u64, furthest_read: u64) -> u64 {
        written.saturating_sub(furthest_read)
    }

    /// How many more bytes the writer may write now.
    pub const fn allowance(&self, written: u64, furthest_read: u64) -> u64 {
        self.window
            .saturating_sub(Self::ahead(written, furthest_read))
    }

    /// True while the writer is less than the window ahead.
    pub const fn may_write(&self, written: u64, furthest_read: u64) -> bool {
        self.allowance(written, furthest_read) > 0
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::model::group::{Next, State};
    use crate::pool::{Pool, PoolStorage};
    use core::task::{Context, Poll, Waker};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    // --- window ---------------------------------------------------------------

    #[test]
    fn window_cases() {
        assert_eq!(window(None, None), AHEAD);
        assert_eq!(window(Some(1000), None), 1000);
        assert_eq!(window(None, Some(2000)), 2000);
        assert_eq!(window(Some(1000), Some(500)), 500);
        assert_eq!(window(Some(500), Some(1000)), 500);
        assert_eq!(window(Some(u64::MAX), Some(AHEAD + 1)), AHEAD);
        assert_eq!(window(Some(0), None), 0);
    }

    // --- pacer -----------------------------------------------------------------

    #[test]
    fn pacer_with_made_up_numbers() {
        let p = Pacer::new(100);
        assert_eq!(Pacer::ahead(150, 100), 50);
        assert_eq!(Pacer::ahead(100, 150), 0); // a reader cannot really be ahead; treat as level
        assert_eq!(p.allowance(150, 100), 50);
        assert!(p.may_write(199, 100));
        assert!(!p.may_write(200, 100));
        assert_eq!(p.allowance(250, 100), 0);
        assert_eq!(Pacer::from_credits(None, None).window(), AHEAD);
        assert!(!Pacer::from_credits(Some(0), None).may_write(0, 0));
    }

    // --- with a group -------------------------------------------------------------

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn paced_writer_stays_within_window_of_slow_reader() {
        const WINDOW: u64 = 100;
        const TOTAL: usize = 1000;
        let mut storage = PoolStorage::<128, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1 << 20);
        group.reset(0);
        let mut p = group.producer().unwrap();
        let mut c = group.consumer();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);

        let payload = [0x5au8; 40];
        let mut sent = 0; // payload bytes written
        let mut pendings = 0;
        let mut max_ahead = 0;
        while sent < TOTAL {
            match p.poll_paced(&mut cx, WINDOW) {
                Poll::Ready(()) => {
                    let allow = p.allowance(WINDOW) as usize;
                    let left = p.frame_remaining();
                    if left == 0 {
                        if allow < crate::model::frame::MAX_HEADER_LEN {
                            // Not even room for a header: let the reader move.
                            let _ = c.read(&mut [0u8; 7]).unwrap();
                            continue;
                        }
                        p.begin_frame(sent as u64, payload.len()).unwrap();
                    } else {
                        let n = p.write_payload(&payload[..allow.min(left)]).unwrap();
                        sent += n;
                    }
                }
                Poll::Pending => {
                    pendings += 1;
                    let before = counter.0.load(Ordering::Relaxed);
                    // A slow reader: 7 bytes at a time.
                    let Next::Ready(n) = c.read(&mut [0u8; 7]).unwrap() else {
                        panic!()
                    };
                    assert!(n > 0);
                    // Advancing brought the writer back within its window: woken once.
                    assert_eq!(counter.0.load(Ordering::Relaxed), before + 1);
                    assert!(p.is_paced(WINDOW));
                }
            }
            let ahead = group.bytes_written() - group.furthest_read();
            max_ahead = max_ahead.max(ahead);
            assert!(ahead <= WINDOW, "ahead {ahead}");
        }
        assert!(pendings > 0);
        assert_eq!(max_ahead, WINDOW);
        assert_eq!(counter.0.load(Ordering::Relaxed), pendings);
    }

    #[test]
    fn parked_writer_is_woken_only_within_window() {
        let mut storage = PoolStorage::<8, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1 << 20);
        group.reset(0);
        let mut p = group.producer().unwrap();
        let mut c = group.consumer();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);

        p.write_frame(0, &[1; 30]).unwrap(); // 32 bytes
        assert_eq!(p.poll_paced(&mut cx, 20), Poll::Pending);
        assert_eq!(p.poll_paced(&mut cx, 20), Poll::Pending); // same waker, kept once
        c.read(&mut [0; 10]).unwrap(); // ahead 22: still outside
        assert_eq!(counter.0.load(Ordering::Relaxed), 0);
        c.read(&mut [0; 3]).unwrap(); // ahead 19: inside
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        c.read(&mut [0; 3]).unwrap(); // waker was consumed: no second wake
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert_eq!(p.poll_paced(&mut cx, 20), Poll::Ready(()));

        // A reset wakes a parked producer so it sees the eviction.
        assert_eq!(p.poll_paced(&mut cx, 0), Poll::Pending);
        group.reset(1);
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);
        assert_eq!(p.poll_paced(&mut cx, 0), Poll::Ready(()));
    }

    #[test]
    fn noop_waker_is_enough_for_polling() {
        let mut storage = PoolStorage::<2, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1 << 20);
        group.reset(0);
        let mut p = group.producer().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(p.poll_paced(&mut cx, window(None, None)), Poll::Ready(()));
        p.write_frame(0, b"abc").unwrap();
        assert_eq!(p.poll_paced(&mut cx, window(Some(5), None)), Poll::Pending);
        assert!(!p.is_paced(5));
    }
}
