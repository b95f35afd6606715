//! moq-net 0.3.18 clients on both ends of `skiff-relay`: a moq-net publisher dials
//! the relay on loopback and announces a broadcast, a moq-net subscriber dials the
//! same relay, finds the broadcast by ANNOUNCE, subscribes, and must receive every
//! frame of every group (one frame larger than 16 KiB) with its bytes, order and
//! timestamp intact, and later subscribers on either relay worker get the
//! groups the relay held before they came.
//!
//! The relay subscribes upstream at the live edge (see the `relay` module docs of
//! skiff-monoio), so the publisher here is live: it writes its groups only once the
//! relay's upstream subscription reads its first group (`group::Producer::used`),
//! not before announcing as [`reference::dial_publisher`] does (the recipe is
//! in the `moq_net_live` module, shared with the cluster tests).

mod moq_net_live;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use moq_net_live::Dial;
use skiff_interop::ALPN_LITE_05;
use skiff_interop::reference::{
    self, End, Frame, Group, Options, Received, SubscribeRequest, TrackInfo,
};
use skiff_monoio::driver::DriverKind;
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// Bound on every wait in these tests.
const WAIT: Duration = Duration::from_secs(20);
const BROADCAST: &str = "live";
const TRACK: &str = "video";
/// SETUP Path both clients send (what skiff's own clients use: `tcp://ADDR/anon`).
const PATH: &str = "/anon";
const GROUPS: u64 = 4;
const FRAMES: u64 = 5;
/// Size of frame 0 of group 1: larger than one QMux record (16 KiB).
const BIG: usize = 20 * 1024 + 7;

/// The payload of frame `i` of group `g`: its coordinates, then a pattern.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let len = if (g, i) == (1, 0) {
        BIG
    } else {
        16 + usize::try_from((g * 97 + i * 31) % 900).unwrap()
    };
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    let seed = usize::try_from(g * 31 + i * 17).unwrap();
    p.extend((p.len()..len).map(|k| u8::try_from((seed + k) % 251).unwrap()));
    p
}

/// The groups the publisher writes, in order.
fn groups() -> Vec<Group> {
    (0..GROUPS)
        .map(|g| Group {
            sequence: g,
            frames: (0..FRAMES)
                .map(|i| Frame::new(g * 1000 + i * 33, payload(g, i)))
                .collect(),
        })
        .collect()
}

/// Runs the live publisher of [`groups`] on its own thread; the sender
/// releases it.
fn spawn_publisher(
    addr: SocketAddr,
    websocket: bool,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<Result<(), String>>,
) {
    let dial = Dial {
        websocket,
        ..Dial::tcp(addr, PATH, 0x1111)
    };
    moq_net_live::spawn_live_publisher(dial, BROADCAST, TRACK, groups())
}

// ---------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------

/// skiff-relay on a free loopback port with `threads` workers.
fn start_relay(threads: usize) -> server::ServerHandle {
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::new(threads).unwrap(),
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    server::start(config, RelayHandler::factory(threads).unwrap()).expect("start relay")
}

/// Every group of the track, from group 0, until [`groups`] have come.
fn every_group() -> SubscribeRequest {
    SubscribeRequest {
        broadcast: BROADCAST.into(),
        track: TRACK.into(),
        priority: 3,
        max_age_ms: 10_000,
        start: Some(0),
        end: None,
        stop_after: Some(groups().len()),
    }
}

/// A subscriber's options: its hop, the SETUP path, the wait bound.
fn subscriber_options() -> Options {
    Options::client()
        .with_hop(0x2222)
        .with_path(Some(PATH))
        .with_timeout(WAIT)
}

fn through_relay(threads: usize, websocket: bool) {
    let relay = start_relay(threads);
    let addr = relay.local_addr();

    let (release, publisher) = spawn_publisher(addr, websocket);
    let want = groups();
    let opts = subscriber_options();
    let opts = if websocket {
        opts.with_websocket()
    } else {
        opts
    };
    let subscriber =
        reference::dial_subscriber(addr, opts, every_group()).expect("start subscriber");
    let received: Received = subscriber.join().expect("subscriber run");
    let _ = release.send(());
    let published = publisher.join().expect("publisher thread");
    // Informational: SO_REUSEPORT decides whether the worker link was crossed.
    let accepted: Vec<u64> = (0..threads)
        .map(|t| relay.metrics().thread(t).snapshot().accepted)
        .collect();
    eprintln!("connections accepted per worker: {accepted:?}");
    relay.shutdown().expect("relay stops");

    assert_eq!(received.protocol.as_deref(), Some(ALPN_LITE_05));
    assert!(
        received.announced.iter().any(|p| p == BROADCAST),
        "announced: {:?}",
        received.announced
    );
    assert_eq!(
        received.end,
        End::GroupCount,
        "subscriber end; groups arrived {:?}, frames per group {:?}, publisher {published:?}",
        received.arrival,
        received
            .groups
            .iter()
            .map(|g| (g.sequence, g.frames.len()))
            .collect::<Vec<_>>()
    );
    let info = received.info.expect("TRACK_INFO");
    assert_eq!(info.timescale, TrackInfo::default().timescale);
    assert_eq!(
        received
            .groups
            .iter()
            .map(|g| g.sequence)
            .collect::<Vec<_>>(),
        want.iter().map(|g| g.sequence).collect::<Vec<_>>(),
        "group sequences (arrival {:?})",
        received.arrival
    );
    assert_eq!(published, Ok(()), "publisher");
    for (got, want) in received.groups.iter().zip(&want) {
        assert_eq!(
            got.frames.len(),
            want.frames.len(),
            "group {}",
            want.sequence
        );
        for (i, (g, w)) in got.frames.iter().zip(&want.frames).enumerate() {
            assert_eq!(
                g.timestamp, w.timestamp,
                "group {} frame {i}",
                want.sequence
            );
            assert!(
                g.payload == w.payload,
                "group {} frame {i}: {} bytes, want {}",
                want.sequence,
                g.payload.len(),
                w.payload.len()
            );
        }
    }
}

/// One relay worker: publisher and subscriber share it.
#[test]
fn moq_net_publisher_to_moq_net_subscriber_one_worker() {
    through_relay(1, false);
}

/// Both moq-net clients over WebSocket (qmux's own client, offering
/// `qmux-02.moq-lite-05, qmux-01.moq-lite-05` as the browser does).
#[test]
fn moq_net_over_websocket_through_skiff_relay() {
    through_relay(1, true);
}

/// Two relay workers: the clients may land on different workers (worker link).
#[test]
fn moq_net_publisher_to_moq_net_subscriber_two_workers() {
    through_relay(2, false);
}

/// Subscribers that come once the relay holds every group, asking for all of
/// them (start 0): those the kernel puts on the worker without the publisher
/// get them too, since that worker's link subscription asks for every group
/// the publisher's worker holds, not only its latest.
#[test]
fn later_subscribers_on_either_worker_get_the_groups_held_before_them() {
    const THREADS: usize = 2;
    const LATER: usize = 12;
    let relay = start_relay(THREADS);
    let addr = relay.local_addr();
    let (release, publisher) = spawn_publisher(addr, false);
    let want = groups();
    // The first subscriber makes the relay subscribe upstream, and the live
    // publisher writes every group once the relay reads the first.
    let first = reference::dial_subscriber(addr, subscriber_options(), every_group())
        .expect("start subscriber")
        .join()
        .expect("first subscriber");
    assert_eq!(
        first.end,
        End::GroupCount,
        "first subscriber: {:?}",
        first.arrival
    );
    // The later ones come within the relay track's linger, so the relay still
    // holds the groups; the kernel spreads them over both workers.
    let later: Vec<_> = (0..LATER)
        .map(|_| {
            reference::dial_subscriber(addr, subscriber_options(), every_group())
                .expect("start subscriber")
        })
        .collect();
    let received: Vec<Received> = later
        .into_iter()
        .map(|r| r.join().expect("subscriber run"))
        .collect();
    let _ = release.send(());
    let published = publisher.join().expect("publisher thread");
    let accepted: Vec<u64> = (0..THREADS)
        .map(|t| relay.metrics().thread(t).snapshot().accepted)
        .collect();
    relay.shutdown().expect("relay stops");

    assert!(
        accepted.iter().all(|&a| a > 0),
        "connections accepted per worker: {accepted:?}"
    );
    let sequences: Vec<u64> = want.iter().map(|g| g.sequence).collect();
    for (i, r) in received.iter().enumerate() {
        assert_eq!(
            r.end,
            End::GroupCount,
            "subscriber {i}: groups arrived {:?}",
            r.arrival
        );
        assert_eq!(
            r.groups.iter().map(|g| g.sequence).collect::<Vec<_>>(),
            sequences,
            "subscriber {i}"
        );
    }
    assert_eq!(published, Ok(()), "publisher");
}
