//! The client SDK against a `skiff-relay` process: the README's publisher
//! and subscriber (the subscriber waits for the broadcast, reads every frame
//! written after it joined, in order, and sees the track's end), and a
//! subscription that follows its broadcast to a new source.

mod common;
mod peers;

#[path = "readme/publish.rs"]
mod publish;
#[path = "readme/subscribe.rs"]
mod subscribe;

use std::time::Duration;

use peers::start_relay;
use skiff_monoio::driver::{self, DriverKind};

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
    let first = frames[0].1 / 33_333;
    for (k, &(group, timestamp, len)) in frames.iter().enumerate() {
        let i = first + k as u64;
        assert_eq!(timestamp, i * 33_333, "frame {k} out of order");
        assert_eq!(
            group,
            frames[0].0 + i / 30 - first / 30,
            "frame {k} in the wrong group"
        );
        assert_eq!(len, 1200);
    }
    assert_eq!(
        frames.last().unwrap().1,
        (FRAMES - 1) * 33_333,
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
