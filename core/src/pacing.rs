//! Pacing: how far a writer may run ahead of its furthest reader.
//!
//! A producer that writes faster than anyone reads only fills memory (and,
//! on a relay, the pool every other track shares). So a writer stays within a
//! *window* of its fastest reader's position: each reader that forwards to a
//! transport reports its window ([`crate::model::group::Consumer::pace`]), and
//! the writer may write while it is below the furthest position any reader's
//! window reaches, and waits otherwise
//! ([`crate::model::group::Producer::poll_paced`]).
//!
//! The window is the smallest of what the transport can currently take
//! (stream and connection credit: bytes the peer allows us to send) and a
//! fixed ceiling, [`AHEAD`]. [`window`] is a pure function of its inputs, so
//! it is tested with made-up numbers; the tests below drive a group with
//! readers that report made-up credit.

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
        // The reader's transport takes WINDOW bytes past what it read.
        assert!(!c.pace_wanted());
        assert_eq!(p.poll_paced(&mut cx), Poll::Ready(()));
        assert!(c.pace_wanted());
        c.pace(WINDOW);

        let payload = [0x5au8; 40];
        let mut sent = 0; // payload bytes written
        let mut pendings = 0;
        let mut max_ahead = 0;
        while sent < TOTAL {
            match p.poll_paced(&mut cx) {
                Poll::Ready(()) => {
                    let allow = p.allowance() as usize;
                    let left = p.frame_remaining();
                    if left == 0 {
                        if allow < crate::model::frame::MAX_HEADER_LEN {
                            // Not even room for a header: let the reader move.
                            let _ = c.read(&mut [0u8; 7]).unwrap();
                            c.pace(WINDOW);
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
                    c.pace(WINDOW);
                    // The larger window brought the writer back: woken once.
                    assert_eq!(counter.0.load(Ordering::Relaxed), before + 1);
                    assert!(p.allowance() > 0);
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

        c.pace(20);
        p.write_frame(0, &[1; 30]).unwrap(); // 32 bytes
        assert_eq!(p.poll_paced(&mut cx), Poll::Pending);
        assert_eq!(p.poll_paced(&mut cx), Poll::Pending); // same waker, kept once
        c.read(&mut [0; 10]).unwrap();
        c.pace(20); // accepts up to 30: still short of 32
        assert_eq!(counter.0.load(Ordering::Relaxed), 0);
        c.read(&mut [0; 3]).unwrap();
        c.pace(20); // up to 33: one byte of room
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        c.read(&mut [0; 3]).unwrap();
        c.pace(20); // waker was consumed: no second wake
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert_eq!(p.poll_paced(&mut cx), Poll::Ready(()));
        // A smaller window later does not take room back.
        c.pace(0);
        assert_eq!(p.allowance(), 4);

        // A reset wakes a parked producer so it sees the eviction.
        p.write_frame(1, &[1; 2]).unwrap(); // 36 bytes
        assert_eq!(p.poll_paced(&mut cx), Poll::Pending);
        group.reset(1);
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);
        assert_eq!(p.poll_paced(&mut cx), Poll::Ready(()));
    }

    #[test]
    fn the_fastest_reader_paces_and_the_last_one_gone_frees_the_writer() {
        let mut storage = PoolStorage::<8, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1 << 20);
        group.reset(0);
        let p = group.producer().unwrap();
        let counter = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        let mut slow = group.consumer();
        let mut fast = group.consumer();

        // No reader reports: not paced.
        assert_eq!(p.allowance(), u64::MAX);
        slow.pace(0);
        assert_eq!(group.pace_limit(), Some(0));
        assert_eq!(p.poll_paced(&mut cx), Poll::Pending);
        // The reader whose window reaches further wins.
        fast.pace(50);
        assert_eq!(group.pace_limit(), Some(50));
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        slow.pace(10);
        assert_eq!(group.pace_limit(), Some(50));
        // A copy is no paced reader until it reports.
        drop(fast.clone());
        assert_eq!(group.pace_limit(), Some(50));
        // One reader goes: the position reached stays while another paces.
        drop(fast);
        assert_eq!(group.pace_limit(), Some(50));
        // The last one goes (say, with the session that served it): not paced.
        assert_eq!(p.poll_paced(&mut cx), Poll::Ready(()));
        slow.pace(0);
        drop(slow);
        assert_eq!(group.pace_limit(), None);
        assert_eq!(p.allowance(), u64::MAX);
    }

    #[test]
    fn noop_waker_is_enough_for_polling() {
        let mut storage = PoolStorage::<2, 16>::new();
        let pool = Pool::new(&mut storage);
        let group = State::new(&pool, 1 << 20);
        group.reset(0);
        let mut p = group.producer().unwrap();
        let mut c = group.consumer();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(p.poll_paced(&mut cx), Poll::Ready(()));
        c.pace(5);
        p.write_frame(0, b"abc").unwrap();
        assert_eq!(p.poll_paced(&mut cx), Poll::Pending);
        assert_eq!(p.allowance(), 0);
    }
}
