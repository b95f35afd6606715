//! What relaying over QUIC allocates on the relay worker after warm-up
//! (docs/protocol.md §11): the QUIC library's, per frame and per packet.
//! The session lends the library each payload range by reference (the pool
//! block stays until the viewer acknowledges it), so a write costs one small
//! allocation for that reference and no copy of the payload; the library
//! keeps per-stream state for each group stream it opens, and the
//! endpoint's receive buffer is split off per datagram that the library
//! keeps. The test measures allocations and their bytes per frame delivered
//! and holds them to bounds; the QMux path stays at zero (the `relay_alloc`
//! tests). Past the share of the pool the library may hold, writes copy:
//! the last test makes the cache small enough to reach it.

mod common;
mod counting;
mod secure_alloc;

use common::*;
use counting::Counting;

#[global_allocator]
static A: Counting = Counting;

/// Allocations per frame delivered the test allows: 4.9 measured with
/// 900-byte frames (one packet each), on epoll and io_uring alike.
const QUIC_BOUND: f64 = 6.0;

#[test]
fn quic_relaying_allocates_a_bounded_number_per_frame() {
    for kind in drivers() {
        within(60, move || {
            let per_frame = secure_alloc::allocations_per_frame(kind, "moql");
            // The library's reference to each write, its stream state for
            // each group (one stream per group per viewer), the datagrams it
            // keeps, with room for acknowledgements and credit.
            assert!(
                per_frame.allocations <= QUIC_BOUND,
                "{kind:?}: {:.2} allocations per frame delivered",
                per_frame.allocations
            );
            // The payload is lent, not copied: what the worker allocates per
            // frame delivered is less than the frame.
            assert!(
                per_frame.bytes < secure_alloc::FRAME_BYTES as f64,
                "{kind:?}: {:.0} bytes allocated per {}-byte frame delivered",
                per_frame.bytes,
                secure_alloc::FRAME_BYTES
            );
        });
    }
}

/// A worker cache of this many bytes: the least a worker takes (64 blocks),
/// so the quarter of them the QUIC send buffers may hold (16 ranges) is
/// reached while a burst of frames is in flight to forty viewers, and later
/// writes copy.
const SMALL_CACHE: u64 = 64 * 1024;

/// Past the share of the pool the QUIC send buffers may hold by reference
/// (docs/protocol.md §11.2), the session copies the payload into the
/// library's buffer instead: every frame still arrives whole and in order,
/// and the copies show in the bytes the worker allocates per frame, against
/// the same load on the default cache, which lends every write.
#[test]
fn writes_past_the_lending_share_are_copied_and_every_frame_arrives() {
    for kind in drivers() {
        within(60, move || {
            // The load checks every byte of every frame, and that every
            // frame of the window arrived.
            let shape = secure_alloc::Shape {
                cache_bytes: None,
                burst: true,
                viewers: Some(40),
            };
            let lent = secure_alloc::allocations_per_frame_with(kind, "moql", shape);
            let small = secure_alloc::Shape {
                cache_bytes: Some(SMALL_CACHE),
                ..shape
            };
            let copied = secure_alloc::allocations_per_frame_with(kind, "moql", small);
            assert!(
                copied.bytes > 2.0 * lent.bytes,
                "{kind:?}: {:.0} bytes allocated per frame on a small cache, {:.0} lending all: nothing was copied",
                copied.bytes,
                lent.bytes
            );
        });
    }
}
