//! What relaying over QUIC allocates on the relay worker after warm-up
//! (docs/protocol.md §11): the QUIC library's, per frame and per packet.
//! quinn-proto copies each write into a buffer of its own (one allocation
//! per write the session makes, about one per frame per viewer with these
//! frames), keeps per-stream state for each group stream it opens, and the
//! endpoint's receive buffer is split off per datagram that the library
//! keeps. The test measures allocations per frame delivered and holds them
//! to a bound; the QMux path stays at zero (the `relay_alloc` tests).

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
            // The library's copy of each write, its stream state for each
            // group (one stream per group per viewer), the datagrams it
            // keeps, with room for acknowledgements and credit.
            assert!(
                per_frame <= QUIC_BOUND,
                "{kind:?}: {per_frame:.2} allocations per frame delivered"
            );
        });
    }
}
