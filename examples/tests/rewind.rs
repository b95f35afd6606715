//! Rewind through a recording relay: the `camera` binary publishes the
//! stamped test pattern to `skiff-relay`'s handler in this process, which
//! records it; 40 s in, the `viewer` binary asks for 30 s ago
//! (`--from -30s`) and must get the frames whose stamps say so, then the
//! live edge, every frame decoded and the stamps rising by exactly one.

use std::process::Command;
use std::time::{Duration, Instant};

// The relay tests' helpers (bounded test threads, loopback configs).
#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;

use clap::Parser;
use common::within;
use skiff_relay::config::RelayConfig;
use skiff_relay::config::keys::Cli;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// The number in `line` after `label`, as in `... captured 31.2 s ago ...`.
fn number_after(text: &str, label: &str) -> Option<f64> {
    let rest = &text[text.find(label)? + label.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn the_viewer_rewinds_30_seconds_and_plays_on_to_live_without_a_gap() {
    within(180, || {
        let dir = std::env::temp_dir().join(format!("skiff-rewind-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cli = Cli::parse_from([
            "skiff-relay",
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "1",
            "--record",
            "anon/**",
            "--record-dir",
            dir.to_str().unwrap(),
        ]);
        let cfg = RelayConfig::load(&cli).expect("config");
        let relay = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts");
        let url = format!("tcp://{}/anon", relay.local_addr());
        let mut cam = Command::new(env!("CARGO_BIN_EXE_camera"))
            .args(["--url", &url])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("camera starts");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(40) {
            std::thread::sleep(Duration::from_millis(200));
        }
        // 30 s of the past at 30 fps, then some of the live edge.
        let out = Command::new(env!("CARGO_BIN_EXE_viewer"))
            .args(["--url", &url, "--broadcast", "cam.hang", "--timeout", "120"])
            .args(["--from", "-30s", "--frames", "1050"])
            .output()
            .expect("viewer runs");
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        let _ = std::fs::remove_dir_all(&dir);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "viewer: {stdout}\n{stderr}");
        assert!(
            stdout.contains("PASS: 1050 good frames (hang avc1."),
            "{stdout}"
        );
        // The first frame is from 30 s before the live edge: the segment
        // holding that time starts up to a group (1 s) earlier, and the
        // newest stored segment trails real time by up to two.
        let ago = number_after(&stdout, "first frame captured ").expect("the rewind's first frame");
        assert!(
            (29.0..=34.0).contains(&ago),
            "first frame {ago} s old:\n{stdout}"
        );
        // The past came from the recording, then the live subscription took over.
        assert!(
            stdout.contains("past groups read, live from group"),
            "{stdout}"
        );
    });
}
