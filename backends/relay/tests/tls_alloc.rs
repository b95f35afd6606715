//! What relaying over TLS allocates on the relay worker after warm-up: the
//! TLS layer's own buffers (plaintext buffer, staging) are made once per
//! connection and reused, so what remains is rustls's: one buffer per TLS
//! record it seals and per record it opens. The test measures allocations
//! per frame delivered and holds them to that bound.

mod common;
mod counting;
mod secure_alloc;

use common::*;
use counting::Counting;

#[global_allocator]
static A: Counting = Counting;

#[test]
fn tls_relaying_allocates_only_rustls_record_buffers() {
    for kind in drivers() {
        within(60, move || {
            let per_frame = secure_alloc::allocations_per_frame(kind, "tls").allocations;
            // At most one sealed record per frame per viewer plus one opened
            // record per frame from the publisher, with room for records
            // that carry control frames (credit, acknowledgements).
            assert!(
                per_frame <= 4.0,
                "{kind:?}: {per_frame:.2} allocations per frame delivered"
            );
        });
    }
}
