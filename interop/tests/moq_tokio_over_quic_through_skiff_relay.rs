//! moq-tokio 0.19.31's own QUIC client (its noq transport, `moql://`,
//! docs/protocol.md §11) on both ends of `skiff-relay`: one publisher and
//! three subscribers dial the relay's UDP port with its `--tls-generate`
//! certificate pinned by the fingerprint its HTTP `GET /certificate.sha256`
//! answers. Each subscriber must receive every frame of every group, one
//! frame larger than a stream window, with its bytes, order and timestamp.

mod quic_clients;

use quic_clients::moq_tokio_through_skiff_relay;

fn through_skiff_relay(threads: usize) {
    moq_tokio_through_skiff_relay(threads, "moql", |_| {});
}

/// One relay worker: every client on it.
#[test]
fn moq_tokio_publisher_and_three_subscribers_over_quic_one_worker() {
    through_skiff_relay(1);
}

/// Two relay workers: the kernel spreads the clients' UDP flows over both,
/// so a subscriber may be served through the worker link.
#[test]
fn moq_tokio_publisher_and_three_subscribers_over_quic_two_workers() {
    through_skiff_relay(2);
}
