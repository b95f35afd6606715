//! The client SDK against a `skiff-relay` process: the README's publisher
//! and subscriber (the subscriber waits for the broadcast, reads every frame
//! written after it joined, in order, and sees the track's end), a
//! subscription that follows its broadcast to a new source, a subscribed
//! track that keeps its groups by the publisher's TRACK_INFO, clients that
//! leave a draining relay at its GOAWAY, and a group past the publisher's
//! track budget, written at once, that arrives whole.

mod common;
mod peers;

#[path = "readme/publish.rs"]
mod publish;
#[path = "readme/subscribe.rs"]
mod subscribe;

use std::sync::mpsc;
use std::time::Duration;

use common::{config, read_numbered_group, within, write_numbered_group};
use peers::start_relay;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::watched::Watched;

/// The README shows exactly these two files.
#[test]
fn readme_shows_the_tested_code() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    for (name, code) in [
        ("publish.rs", include_str!("readme/publish.rs")),
        ("subscribe.rs", include_str!("readme/subscribe.rs")),
    ] {
        assert!(
            readme.contains(code.trim_end()),
            "README.md does not show tests/readme/{name} as it is"
        );
    }
}

#[test]
fn readme_publisher_reaches_readme_subscriber() {
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    const FRAMES: u64 = 75;
    let frames = driver::block_on(DriverKind::Legacy, move |_| async move {
        let viewer = monoio::spawn({
            let url = url.clone();
            async move { subscribe::watch(&url).await }
        });
        // The viewer is waiting for the broadcast before it exists.
        monoio::time::sleep(Duration::from_millis(200)).await;
        publish::publish(&url, FRAMES).await.expect("publish");
        viewer.await.expect("watch")
    })
    .expect("runtime");
    assert!(!frames.is_empty(), "the viewer saw no frame");
    // From where it joined, every frame in order and complete.
    // The README publisher stamps frame i at i * 1000 / 30 ms.
    let first = (frames[0].1 * 30).div_ceil(1000);
    for (k, &(group, timestamp, len)) in frames.iter().enumerate() {
        let i = first + k as u64;
        assert_eq!(timestamp, i * 1000 / 30, "frame {k} out of order");
        assert_eq!(
            group,
            frames[0].0 + i / 30 - first / 30,
            "frame {k} in the wrong group"
        );
        assert_eq!(len, 1200);
    }
    assert_eq!(
        frames.last().unwrap().1,
        (FRAMES - 1) * 1000 / 30,
        "the last frame is missing"
    );
    assert!(first < 30, "the viewer joined late: first frame {first}");
}

/// Publishes `frames` frames of `camera/video` in group `sequence`, starting at timestamp `from`.
async fn publish_once(url: &str, sequence: u64, from: u64, frames: u64) {
    use skiff_core::model::track::Info;
    let (client, runner) = skiff_monoio::connect(url, skiff_monoio::Config::default()).unwrap();
    monoio::spawn(runner.run());
    let broadcast = client.publish("camera").unwrap();
    let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
    // Wait for the viewer's subscription to reach this publisher.
    while track.subscribers() == 0 {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut group = track.create_group(sequence).unwrap();
    for i in from..from + frames {
        group.write_frame(i, &i.to_le_bytes()).await.unwrap();
    }
    group.finish().unwrap();
    client.flushed().await;
    // Gone without finishing the track: the relay keeps the viewer for a new source.
    drop(broadcast);
    client.close().await;
}

#[test]
fn a_subscription_follows_a_new_source() {
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (client, runner) =
            skiff_monoio::connect(&url, skiff_monoio::Config::default()).unwrap();
        monoio::spawn(runner.run());
        let viewer = monoio::spawn({
            let client = client.clone();
            async move {
                let request = skiff_monoio::sdk::Request::LIVE;
                let mut track = client.subscribe("camera", "video", request).await.unwrap();
                let mut seen = Vec::new();
                while seen.len() < 20 {
                    let Some(mut group) = track.next_group().await.unwrap() else {
                        break;
                    };
                    while let Ok(Some(frame)) = group.read_frame().await {
                        seen.push(frame.timestamp);
                    }
                }
                seen
            }
        });
        publish_once(&url, 0, 0, 10).await;
        // The new source continues the sequence.
        publish_once(&url, 1, 100, 10).await;
        let seen = viewer.await;
        client.close().await;
        seen
    })
    .expect("runtime");
    let want: Vec<u64> = (0..10).chain(100..110).collect();
    assert_eq!(seen, want);
}

/// A subscribed track takes the publisher's TRACK_INFO: hang's microsecond
/// timescale and 30 s max age. A group the reader has not finished then stays
/// readable while the next group grows: its 33,333 µs frame steps are not
/// read as 33 s, past the default 5 s max age, which would evict it as stale.
#[test]
fn a_subscribed_group_is_kept_by_the_publishers_timescale() {
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    let (info, first, rest, next) = driver::block_on(DriverKind::Legacy, move |_| async move {
        // Older groups are wanted for the max age: what is under test is the
        // subscriber's own cache, not a live-edge request's OLD resets (§4.7).
        let Watched {
            publisher,
            broadcast,
            mut track,
            viewer,
            mut sub,
        } = Watched::video(&url, "camera", "video").await;
        let mut g0 = track.create_group(0).unwrap();
        g0.write_frame(0, b"g0f0").await.unwrap();
        let mut r0 = sub.next_group().await.unwrap().expect("group 0");
        let first = r0.read_frame().await.unwrap().expect("frame 0").timestamp;

        // The rest of group 0, then two frames of group 1.
        for ts in [33_333, 66_666] {
            g0.write_frame(ts, b"g0").await.unwrap();
        }
        g0.finish().unwrap();
        let mut g1 = track.create_group(1).unwrap();
        for ts in [100_000, 133_333] {
            g1.write_frame(ts, b"g1").await.unwrap();
        }
        g1.finish().unwrap();

        // Group 1's second frame is in the subscriber's track before group 0
        // is read on.
        let mut r1 = sub.next_group().await.unwrap().expect("group 1");
        let mut next = Vec::new();
        while let Some(f) = r1.read_frame().await.unwrap() {
            next.push(f.timestamp);
        }
        let mut rest = Vec::new();
        while let Some(f) = r0.read_frame().await.unwrap() {
            rest.push(f.timestamp);
        }
        let info = sub.info();
        drop(sub);
        viewer.close().await;
        drop(broadcast);
        publisher.close().await;
        (info, first, rest, next)
    })
    .expect("runtime");
    assert_eq!(info.timescale, skiff_core::hang::TIMESCALE);
    assert_eq!(info.max_age, skiff_core::hang::MAX_AGE);
    assert_eq!(first, 0);
    assert_eq!(rest, [33_333, 66_666]);
    assert_eq!(next, [100_000, 133_333]);
}

/// A group larger than the publisher's track budget (a quarter of its
/// pool: 4 MiB by default), written at once before any session began to
/// send it, arrives whole: the writer waits for the group's first reader
/// instead of letting the group's head be trimmed unsent.
#[test]
fn a_group_past_the_track_budget_written_at_once_arrives_whole() {
    const FRAMES: u64 = 320;
    const FRAME_BYTES: usize = 16 * 1024;
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    let read = within(60, move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let watched = Watched::video(&url, "camera", "video").await;
            let (mut track, mut sub) = (watched.track, watched.sub);
            let reader = monoio::spawn(async move {
                read_numbered_group(&mut sub, FRAME_BYTES, Duration::ZERO).await
            });
            write_numbered_group(&mut track, FRAMES, FRAME_BYTES).await;
            let read = reader.await;
            watched.viewer.close().await;
            drop(track);
            drop(watched.broadcast);
            watched.publisher.close().await;
            read
        })
        .expect("runtime")
    });
    assert_eq!(read, FRAMES);
}

/// A draining relay sends GOAWAY and waits (up to its drain timeout) for its
/// clients to leave: the SDK's publisher and viewer close their sessions at
/// once (docs/protocol.md §3.12), so the drain ends with no connection left
/// for the timeout to force closed.
#[test]
fn sdk_clients_leave_a_draining_relay_at_its_goaway() {
    within(120, || {
        let make = RelayHandler::factory(1).expect("factory");
        let mut cfg = config(1, DriverKind::Legacy);
        cfg.drain_timeout = Duration::from_secs(30);
        let handle = server::start(cfg, make).expect("relay");
        let url = format!("tcp://{}/", handle.local_addr());
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let clients = std::thread::spawn(move || {
            driver::block_on(DriverKind::Legacy, move |_| async move {
                let config = skiff_monoio::Config::default;
                let (publisher, runner) = skiff_monoio::connect(&url, config()).unwrap();
                monoio::spawn(runner.run());
                let broadcast = publisher.publish("camera").unwrap();
                let info = skiff_core::model::track::Info::new("video").unwrap();
                let mut track = broadcast.create_track(info).unwrap();
                let (viewer, runner) = skiff_monoio::connect(&url, config()).unwrap();
                monoio::spawn(runner.run());
                let mut sub = viewer
                    .subscribe("camera", "video", skiff_monoio::sdk::Request::LIVE)
                    .await
                    .unwrap();
                let mut g = track.create_group(0).unwrap();
                g.write_frame(0, b"frame").await.unwrap();
                let mut group = sub.next_group().await.unwrap().expect("group 0");
                assert!(group.read_frame().await.unwrap().is_some());
                ready_tx.send(()).unwrap();
                while stop_rx.try_recv().is_err() {
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
                drop(group);
                drop(sub);
                drop(g);
                drop(track);
                drop(broadcast);
                viewer.close().await;
                publisher.close().await;
            })
            .expect("runtime");
        });
        ready_rx.recv().expect("clients connected");
        let report = handle.shutdown().expect("shutdown");
        stop_tx.send(()).unwrap();
        clients.join().expect("clients");
        assert_eq!(report.forced(), 0, "clients stayed until the drain timeout");
    });
}

/// One viewer session subscribes to 12 broadcasts, each read: past a few it
/// asks for every announcement at once instead of holding one announce
/// request (and one of the session's few control-stream buffers) per
/// broadcast, which stalled its fifth subscription.
#[test]
fn one_session_subscribes_to_many_broadcasts() {
    use skiff_core::model::track::Info;
    use skiff_monoio::sdk::Request;
    const BROADCASTS: usize = 12;
    let relay = start_relay(&[]);
    let url = format!("tcp://{}/", relay.addr);
    // Two publisher threads of six broadcasts each, until the viewer is done.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publishers: Vec<_> = (0..2)
        .map(|p| {
            let (url, stop) = (url.clone(), stop.clone());
            std::thread::spawn(move || {
                driver::block_on(DriverKind::Legacy, move |_| async move {
                    // A client publishes four broadcasts at most.
                    let mut clients = Vec::new();
                    let mut tracks = Vec::new();
                    for b in (p * BROADCASTS / 2)..((p + 1) * BROADCASTS / 2) {
                        if b % 4 == 0 || clients.is_empty() {
                            let (client, runner) =
                                skiff_monoio::connect(&url, skiff_monoio::Config::default())
                                    .unwrap();
                            monoio::spawn(runner.run());
                            clients.push(client);
                        }
                        let client = clients.last().unwrap();
                        let broadcast = client.publish(&format!("cam{b}")).unwrap();
                        let track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
                        tracks.push((b, broadcast, track, None));
                    }
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        for (b, _, track, group) in &mut tracks {
                            if group.is_none() && track.subscribers() > 0 {
                                let mut g = track.create_group(0).unwrap();
                                g.write_frame(0, format!("frame of cam{b}").as_bytes())
                                    .await
                                    .unwrap();
                                *group = Some(g);
                            }
                        }
                        monoio::time::sleep(Duration::from_millis(5)).await;
                    }
                    drop(tracks);
                    for client in clients {
                        client.close().await;
                    }
                })
                .expect("runtime")
            })
        })
        .collect();
    let outcomes = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (viewer, runner) =
            skiff_monoio::connect(&url, skiff_monoio::Config::default()).unwrap();
        monoio::spawn(runner.run());
        let mut outcomes = Vec::new();
        let mut held = Vec::new();
        for b in 0..BROADCASTS {
            let subscribed = monoio::time::timeout(
                Duration::from_secs(20),
                viewer.subscribe(&format!("cam{b}"), "video", Request::LIVE),
            )
            .await
            .unwrap_or_else(|_| panic!("subscription {b} stalled"));
            match subscribed {
                Ok(mut track) => {
                    let mut group = track.next_group().await.unwrap().expect("a group");
                    let frame = group.read_frame().await.unwrap().expect("a frame");
                    assert_eq!(
                        frame.payload.to_vec(),
                        format!("frame of cam{b}").into_bytes()
                    );
                    outcomes.push("read");
                    held.push(track);
                }
                Err(e) => panic!("subscription {b}: {e}"),
            }
        }
        drop(held);
        viewer.close().await;
        outcomes
    })
    .expect("runtime");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for p in publishers {
        p.join().unwrap();
    }
    assert_eq!(outcomes, vec!["read"; BROADCASTS]);
}
