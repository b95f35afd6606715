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

use std::num::NonZeroUsize;
use std::time::Duration;

use quic_clients::{
    FRAMES, GROUPS, MOQ_LITE_05, PATH, Received, WAIT, moq_publisher, moq_subscriber,
    skiff_relay_fingerprint,
};
use skiff_monoio::driver::DriverKind;
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const SUBSCRIBERS: usize = 3;
/// Bound on the whole scenario.
const SCENARIO: Duration = Duration::from_secs(50);

fn through_skiff_relay(threads: usize) {
    through_skiff_relay_at(threads, "https");
}

/// The same clients given `scheme://` (`https`, or `http`: moq-tokio then
/// fetches the pin from the relay's `/certificate.sha256` on its TCP port
/// and dials `https://`, as `@moq/watch` does in browsers).
fn through_skiff_relay_at(threads: usize, scheme: &str) {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(threads).unwrap(),
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        tls_generate: vec!["localhost".to_owned()],
        ..RelayConfig::default()
    };
    let relay =
        server::start(config, RelayHandler::factory(threads).unwrap()).expect("start relay");
    let addr = relay.local_addr();
    let fingerprint = skiff_relay_fingerprint(addr);
    let url = format!("{scheme}://{addr}{PATH}");
    eprintln!("skiff-relay on {url}, certificate {fingerprint}");

    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _ = tx.send(rt.block_on(scenario(url, fingerprint)));
    });
    let (published, received) = rx
        .recv_timeout(SCENARIO)
        .unwrap_or_else(|e| panic!("the scenario did not finish within {SCENARIO:?}: {e}"));
    // Every client's connection ends as WebTransport (its bytes counted as
    // it ends), none as raw QUIC.
    let web = skiff_relay::metrics::TransportLabel::WebTransport as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let totals = loop {
        let t = relay.metrics().total().transports;
        if t[web].open == 0 || std::time::Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    relay.shutdown().expect("relay stops");
    assert!(
        totals[web].bytes_in > (GROUPS * FRAMES * 16) && totals[web].bytes_out > 300 * 1024,
        "webtransport counters {:?}",
        totals[web]
    );
    assert_eq!(published, Ok(()), "publisher");
    assert_eq!(received.len(), SUBSCRIBERS);
    for (n, r) in received.into_iter().enumerate() {
        let r = r.unwrap_or_else(|e| panic!("subscriber {n}: {e}"));
        assert!(r.errors.is_empty(), "subscriber {n}: {:?}", r.errors);
        assert_eq!(r.next, (GROUPS, 0), "subscriber {n} missed frames");
        assert_eq!(
            r.arrival,
            (0..GROUPS).collect::<Vec<_>>(),
            "subscriber {n}'s groups"
        );
        eprintln!("subscriber {n}: {} frames", GROUPS * FRAMES);
    }
}

/// The publisher and the subscribers, on one tokio runtime; the publisher
/// writes once every subscriber holds its subscription.
async fn scenario(
    url: String,
    fingerprint: skiff_monoio::tls::Fingerprint,
) -> (Result<(), String>, Vec<Result<Received, String>>) {
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let publisher = tokio::spawn(moq_publisher(
        url.clone(),
        fingerprint,
        MOQ_LITE_05,
        ready,
        done,
    ));
    let (subscribed, mut subscriptions) = tokio::sync::mpsc::channel(SUBSCRIBERS);
    let subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            tokio::spawn(moq_subscriber(
                url.clone(),
                fingerprint,
                MOQ_LITE_05,
                subscribed.clone(),
            ))
        })
        .collect();
    drop(subscribed);
    let mut count = 0;
    while count < SUBSCRIBERS {
        match tokio::time::timeout(WAIT, subscriptions.recv()).await {
            Ok(Some(())) => count += 1,
            _ => break,
        }
    }
    let _ = ready_tx.send(());
    let mut received = Vec::new();
    for s in subscribers {
        received.push(s.await.unwrap_or_else(|e| Err(format!("task: {e}"))));
    }
    let _ = done_tx.send(());
    let published = publisher
        .await
        .unwrap_or_else(|e| Err(format!("task: {e}")));
    (published, received)
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
