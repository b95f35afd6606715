//! The README's publisher and subscriber, run against a `skiff-relay`
//! process: the subscriber waits for the broadcast, reads every frame the
//! publisher writes after it joined, in order, and sees the track's end.

mod common;
mod peers;

#[path = "readme/publish.rs"]
mod publish;
#[path = "readme/subscribe.rs"]
mod subscribe;

use std::time::Duration;

use peers::RelayProcess;
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
    let relay = RelayProcess::start(&[]);
    let url = format!("tcp://{}/anon", relay.addr);
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
