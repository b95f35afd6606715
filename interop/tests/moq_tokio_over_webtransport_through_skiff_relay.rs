//! moq-tokio 0.19.31's WebTransport client (its noq transport dialing
//! `https://`, HTTP/3 and an extended CONNECT, docs/protocol.md §12) on both
//! ends of `skiff-relay`: one publisher and three subscribers dial the
//! relay's UDP port with its `--tls-generate` certificate pinned by the
//! fingerprint its HTTP `GET /certificate.sha256` answers, and agree on
//! moq-lite-05 through `WT-Protocol`. Each subscriber must receive every
//! frame of every group, one frame larger than a stream window, with its
//! bytes, order and timestamp; the relay counts the four connections under
//! its `webtransport` label.

mod quic_clients;

use std::time::Duration;

use quic_clients::{FRAMES, GROUPS, moq_tokio_through_skiff_relay};

fn through_skiff_relay(threads: usize) {
    through_skiff_relay_at(threads, "https");
}

/// The same clients given `scheme://` (`https`, or `http`: moq-tokio then
/// fetches the pin from the relay's `/certificate.sha256` on its TCP port
/// and dials `https://`, as `@moq/watch` does in browsers).
fn through_skiff_relay_at(threads: usize, scheme: &str) {
    moq_tokio_through_skiff_relay(threads, scheme, |relay| {
        // Every client's connection ends as WebTransport (its bytes counted
        // as it ends), none as raw QUIC.
        let web = skiff_relay::metrics::TransportLabel::WebTransport as usize;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let totals = loop {
            let t = relay.metrics().total().transports;
            if t[web].open == 0 || std::time::Instant::now() > deadline {
                break t;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            totals[web].bytes_in > (GROUPS * FRAMES * 16) && totals[web].bytes_out > 300 * 1024,
            "webtransport counters {:?}",
            totals[web]
        );
    });
}

/// One relay worker: every client on it.
#[test]
fn moq_tokio_publisher_and_three_subscribers_over_webtransport_one_worker() {
    through_skiff_relay(1);
}

/// Two relay workers: the kernel spreads the clients' UDP flows over both,
/// so a subscriber may be served through the worker link.
#[test]
fn moq_tokio_publisher_and_three_subscribers_over_webtransport_two_workers() {
    through_skiff_relay(2);
}

/// moq-tokio given `http://`: the pin comes from the relay's own
/// `/certificate.sha256`, then WebTransport as above.
#[test]
fn moq_tokio_publisher_and_three_subscribers_over_webtransport_pinned_from_http() {
    through_skiff_relay_at(1, "http");
}
