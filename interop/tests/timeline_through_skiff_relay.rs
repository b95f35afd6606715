//! The stored form in hang 0.21.19's archive format, read by the published
//! crates: skiff's camera node publishes a hang broadcast through a
//! skiff-relay recording it (`--record anon/** --record-dir DIR`); the
//! reference moq-net client then reads the relay's replay broadcast
//! `anon/cam.hang/replay`: its `catalog.json` parses with `hang::Catalog`
//! and has an `archive` entry whose `replay` resolves (moq-net's
//! `Path::resolve`) to the replay broadcast itself, and its `timeline.z`
//! track decodes with moq-json's window consumer into `hang::timeline::Record`s
//! that name the groups the recording's index stored.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use skiff_interop::ALPN_LITE_05;
use skiff_interop::reference;
use skiff_media::node::{self, NodeOptions};
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::record::{RecordConfig, store};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// Video segments the recording holds before the timeline is read.
const SEGMENTS: usize = 4;

const BROADCAST: &str = "anon/cam.hang";
const REPLAY: &str = "anon/cam.hang/replay";

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-interop-timeline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What the reference client read of the replay broadcast.
struct Read {
    catalog: Vec<u8>,
    records: Vec<(u64, hang::timeline::Record)>,
}

/// Dials the relay at `addr` with moq-net, reads the replay's catalog and
/// the timeline's records until `want` of them arrived (within 30 s).
fn read_replay(addr: std::net::SocketAddr, want: usize) -> Read {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(30), async move {
            let qmux = reference::qmux_tcp([ALPN_LITE_05])
                .connect(addr)
                .await
                .unwrap();
            let origin = moq_tokio::origin::spawn_config(moq_net::origin::Config::new(
                moq_net::Hop::new(1).unwrap(),
            ));
            let client = moq_net::Client::new()
                .with_versions(moq_net::Versions::from(vec![
                    moq_net::Version::from_alpn(ALPN_LITE_05).unwrap(),
                ]))
                .with_subscriber(origin.clone());
            let transport = moq_tokio::transport::Session::new(qmux);
            let (session, driver) = client
                .connect(std::time::Instant::now(), transport)
                .await
                .unwrap();
            tokio::spawn(moq_net::time::run(driver));
            let consumer = origin.consume();
            let mut announced = consumer.announced();
            loop {
                let update = announced.next().await.expect("announcements");
                if update.kind.is_active() && update.prefix.as_str() == REPLAY {
                    break;
                }
            }
            let broadcast = consumer.routed_broadcast(REPLAY).await.unwrap();
            // The catalog: frame 0 of its latest group.
            let track = broadcast.track(hang::Catalog::DEFAULT_NAME).unwrap();
            let mut catalog = track
                .subscribe(hang::Catalog::default_subscription())
                .await
                .unwrap();
            let mut group = catalog
                .recv_group()
                .await
                .unwrap()
                .expect("a catalog group");
            let frame = group.read_frame().await.unwrap().expect("a catalog frame");
            let catalog = frame.payload.to_vec();
            // The timeline, through moq-json's own window consumer.
            let track = broadcast.track(hang::timeline::DEFAULT_NAME).unwrap();
            let subscriber = track
                .subscribe(moq_net::track::Subscription::default())
                .await
                .unwrap();
            let mut window = moq_json::window::Consumer::<hang::timeline::Record>::new(
                subscriber,
                moq_json::window::ConsumerConfig::default().with_compression(true),
            );
            let mut records = Vec::new();
            while records.len() < want {
                match window.next().await.unwrap().expect("the timeline goes on") {
                    moq_json::window::Event::Push { index, value } => records.push((index, value)),
                    other => panic!("unexpected {other:?}"),
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
            Read { catalog, records }
        })
        .await
        .expect("the replay is read within 30 s")
    })
}

#[test]
fn moq_dev_reads_the_replay_catalog_and_timeline_skiff_relay_stores() {
    let dir = scratch();
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        driver: DriverKind::Legacy,
        drain_timeout: Duration::from_secs(2),
        record: Some(RecordConfig {
            patterns: {
                let mut p = moq_pattern::Patterns::new();
                p.insert("anon/**".parse().unwrap());
                p
            },
            dir: dir.clone(),
            retain: None,
            max_bytes: None,
            queue_bytes: 64 << 20,
            replays: 64,
        }),
        ..RelayConfig::default()
    };
    let relay = server::start(config, RelayHandler::factory(1).unwrap()).expect("start relay");
    let addr = relay.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let camera = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let opts = NodeOptions {
                width: 160,
                height: 96,
                fps: 30.0,
                gop: 15,
                bitrate: 200_000,
                frames: Some(30 * 20),
                ..NodeOptions::pattern(format!("tcp://{addr}/anon"), "cam.hang")
            };
            driver::block_on(DriverKind::Legacy, move |_| node::run(opts, stop, |_| {}))
                .expect("camera runtime")
                .expect("camera runs")
        })
    };
    // Wait until the index holds the segments, then read.
    let started = Instant::now();
    loop {
        let stored = store::open(&dir, BROADCAST).unwrap();
        if stored.is_some_and(|s| s.segments("video").count() > SEGMENTS) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing recorded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let read = read_replay(addr, SEGMENTS);
    stop.store(true, Ordering::Relaxed);
    camera.join().expect("camera thread");
    relay.shutdown().expect("relay stops");

    // The catalog: hang's parser finds the archive entry.
    let catalog: hang::Catalog =
        hang::Catalog::from_slice(&read.catalog).expect("hang parses the catalog");
    let archive = catalog.archive.expect("an archive entry");
    assert_eq!(archive.track, hang::timeline::DEFAULT_NAME);
    assert_eq!(archive.timescale, 1000);
    let duration_max = archive.duration_max.expect("durationMax");
    assert!(duration_max > 0);
    let replay = archive.replay.expect("a replay reference");
    assert_eq!(
        moq_net::Path::new(REPLAY).resolve(&replay).as_str(),
        REPLAY,
        "the replay entry names the replay broadcast itself"
    );
    assert!(
        !catalog.video.renditions.is_empty(),
        "the recorded catalog's video"
    );

    // The timeline: consecutive segments from index 0, each naming the
    // video group the index stored for it.
    let stored = store::open(&dir, BROADCAST).unwrap().unwrap();
    let video: Vec<_> = stored.segments("video").collect();
    for (i, (index, record)) in read.records.iter().enumerate() {
        assert_eq!(*index, i as u64);
        assert_eq!(record.segment, i as u64);
        let s = video
            .iter()
            .find(|s| s.number == record.segment)
            .expect("a stored segment");
        assert_eq!(record.pts, s.start_us / 1000);
        assert_eq!(
            record.pts + record.duration,
            (s.start_us + s.duration_us) / 1000
        );
        let ranges = &record.tracks["video"];
        assert_eq!(ranges.len(), 1);
        assert_eq!((ranges[0].start, ranges[0].end), (s.group, s.group));
        assert!(ranges[0].keyframe);
        if i > 0 {
            let prev = &read.records[i - 1].1;
            // Content time in ms, rounded down at each end: no gap.
            assert!(record.pts.abs_diff(prev.pts + prev.duration) <= 1, "gap");
        }
    }
    // The recorder never records the replay broadcast.
    assert!(store::open(&dir, REPLAY).unwrap().is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
