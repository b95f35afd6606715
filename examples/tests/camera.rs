//! The host camera node through a real relay: `skiff-relay`'s handler on a
//! loopback port in this process, the camera node publishing to it, and a
//! subscriber (or the `viewer` binary) decoding what arrives and comparing
//! each picture with the test pattern.

use std::num::NonZeroUsize;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// The relay tests' helpers (bounded test threads, loopback configs).
#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;

use common::within;
use skiff_examples::camera::{self, Decoder, Format};
use skiff_examples::node::{self, NodeOptions, Progress};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Client, Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};

/// Frames the subscriber must decode and check.
const WANT: u64 = 45;

/// A small, quick stream: 160×120 at 60 fps, a group every 15 frames.
fn format() -> Format {
    Format::new(160, 120, 60, 15).unwrap()
}

/// A relay on a free loopback port, one worker.
fn relay() -> ServerHandle {
    let cfg = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        threads: NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts")
}

/// What the subscriber saw.
#[derive(Debug, Default)]
struct Seen {
    /// Frames decoded and equal to the pattern: (n, key, payload bytes).
    frames: Vec<(u64, bool, usize)>,
    /// The first problem, if any.
    error: Option<String>,
}

/// The camera node and a decoding subscriber on one client runtime.
async fn scenario(url: String) -> (Seen, Progress) {
    let stop = Arc::new(AtomicBool::new(false));
    let camera = {
        let opts = NodeOptions {
            url: url.clone(),
            broadcast: "host/cam".into(),
            track: "video".into(),
            format: format(),
            frames: Some(600),
        };
        monoio::spawn(node::run(opts, stop.clone(), |p| eprintln!("camera: {p}")))
    };

    let (client, runner) = connect(&url, Config::default()).expect("a valid URL");
    let runner = monoio::spawn(runner.run());
    let mut seen = Seen::default();
    if let Err(e) = watch(&client, &mut seen).await {
        seen.error.get_or_insert(e);
    }
    client.close().await;
    runner.await;
    stop.store(true, Ordering::Relaxed);
    let progress = camera.await.expect("the camera node runs");
    (seen, progress)
}

/// Subscribes and decodes frames into `seen` until [`WANT`] of them or a problem.
async fn watch(client: &Client, seen: &mut Seen) -> Result<(), String> {
    let mut track = client
        .subscribe("host/cam", "video", Request::LIVE)
        .await
        .map_err(|e| format!("subscribe: {e}"))?;
    let mut decoder = Decoder::new();
    let mut bytes = Vec::new();
    while seen.frames.len() < WANT as usize {
        let mut group = match track.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => return Err("track ended".into()),
            Err(e) => return Err(format!("track: {e}")),
        };
        let mut index = 0u64;
        while seen.frames.len() < WANT as usize {
            let Some(f) = group
                .read_frame()
                .await
                .map_err(|e| format!("group: {e}"))?
            else {
                break;
            };
            bytes.clear();
            f.payload.chunks().for_each(|c| bytes.extend_from_slice(c));
            let at = (group.sequence(), index, f.timestamp);
            let h = camera::check(&mut decoder, &bytes)
                .map_err(|e| format!("frame {}/{}: {e}", at.0, at.1))?;
            let fmt = h.format;
            if h.format != format()
                || (fmt.group(h.n), fmt.index(h.n), fmt.timestamp_ms(h.n)) != at
                || h.key != (index == 0)
            {
                return Err(format!("frame {h:?} misplaced as {at:?}"));
            }
            seen.frames.push((h.n, h.key, bytes.len()));
            index += 1;
        }
    }
    Ok(())
}

#[test]
fn camera_frames_arrive_decodable_through_a_relay() {
    within(60, || {
        let relay = relay();
        let url = format!("tcp://{}/anon", relay.local_addr());
        let (seen, progress) =
            driver::block_on(DriverKind::Auto, move |_| scenario(url)).expect("client runtime");
        relay.shutdown().expect("relay stops");
        eprintln!("camera finished: {progress}");
        assert_eq!(seen.error, None, "after {} good frames", seen.frames.len());
        assert_eq!(seen.frames.len(), WANT as usize);
        // Consecutive frames, starting at a group: key frames then deltas, and
        // deltas much smaller than key frames.
        let first = seen.frames[0].0;
        assert!(format().is_key(first), "starts mid-group at {first}");
        for (k, &(n, key, _)) in seen.frames.iter().enumerate() {
            assert_eq!(n, first + k as u64);
            assert_eq!(key, format().is_key(n));
        }
        let keys: Vec<usize> = seen.frames.iter().filter(|f| f.1).map(|f| f.2).collect();
        let deltas: Vec<usize> = seen.frames.iter().filter(|f| !f.1).map(|f| f.2).collect();
        assert!(keys.len() >= 3, "{keys:?}");
        assert!(
            deltas.iter().max() < keys.iter().min(),
            "{keys:?} {deltas:?}"
        );
        assert!(progress.frames >= WANT, "{progress}");
        assert_eq!(progress.dropped, 0, "{progress}");
        assert!(progress.sessions >= 1);
    });
}

/// The two binaries, as a user runs them: `camera` publishes, `viewer` checks.
#[test]
fn the_viewer_binary_views_the_camera_binary() {
    within(90, || {
        let relay = relay();
        let url = format!("tcp://{}/anon", relay.local_addr());
        let mut camera = Command::new(env!("CARGO_BIN_EXE_camera"))
            .args([
                "--url", &url, "--fps", "60", "--gop", "20", "--frames", "3000",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("camera starts");
        let viewer = Command::new(env!("CARGO_BIN_EXE_viewer"))
            .args([
                "--url",
                &url,
                "--broadcast",
                "host/cam",
                "--track",
                "video",
                "--frames",
                "60",
                "--timeout",
                "60",
            ])
            .output()
            .expect("viewer runs");
        let _ = camera.kill();
        let _ = camera.wait();
        relay.shutdown().expect("relay stops");
        let out = String::from_utf8_lossy(&viewer.stdout);
        let err = String::from_utf8_lossy(&viewer.stderr);
        assert!(viewer.status.success(), "viewer: {out}\n{err}");
        assert!(
            out.contains("PASS: 60 frames intact (host camera)"),
            "{out}"
        );
    });
}

/// The relay goes away and comes back on the same address: the camera's and
/// the viewer's clients redial, and the frames go on, decodable.
#[test]
fn the_camera_redials_a_relay_that_comes_back() {
    within(60, || {
        let first = relay();
        let addr = first.local_addr();
        let url = format!("tcp://{addr}/anon");
        let relay_slot = std::sync::Mutex::new(Some(first));
        let (before, after, progress) = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
            let slot = &relay_slot;
            // Restarts the relay on the same address when told to.
            scope.spawn(move || {
                if rx.recv().is_ok() {
                    let old = slot.lock().unwrap().take().expect("the first relay");
                    old.shutdown().expect("relay stops");
                    let cfg = RelayConfig {
                        listen: addr,
                        threads: NonZeroUsize::MIN,
                        drain_timeout: Duration::from_secs(2),
                        ..RelayConfig::default()
                    };
                    let again = server::start(cfg, RelayHandler::factory(1).unwrap())
                        .expect("the relay starts again on its address");
                    *slot.lock().unwrap() = Some(again);
                    let _ = ready_tx.send(());
                }
            });
            driver::block_on(DriverKind::Auto, move |_| async move {
                let stop = Arc::new(AtomicBool::new(false));
                let opts = NodeOptions {
                    url: url.clone(),
                    broadcast: "host/cam".into(),
                    track: "video".into(),
                    format: format(),
                    frames: None,
                };
                let camera = monoio::spawn(node::run(opts, stop.clone(), |_| {}));
                let (client, runner) = connect(&url, Config::default()).expect("a valid URL");
                let runner = monoio::spawn(runner.run());
                let mut track = client
                    .subscribe("host/cam", "video", Request::LIVE)
                    .await
                    .expect("subscribed");
                let mut decoder = Decoder::new();
                let mut bytes = Vec::new();
                // Intact frames before and after the restart.
                let mut counts = [0u64; 2];
                let mut phase = 0;
                while counts[1] < 30 {
                    let Ok(Some(mut group)) = track.next_group().await else {
                        panic!("the track ended");
                    };
                    // A group the restart cut short ends in an error: read on.
                    while let Ok(Some(f)) = group.read_frame().await {
                        bytes.clear();
                        f.payload.chunks().for_each(|c| bytes.extend_from_slice(c));
                        if camera::check(&mut decoder, &bytes).is_ok() {
                            counts[phase] += 1;
                        }
                    }
                    if phase == 0 && counts[0] >= 30 {
                        phase = 1;
                        tx.send(()).unwrap();
                        while ready_rx.try_recv().is_err() {
                            monoio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                client.close().await;
                runner.await;
                stop.store(true, Ordering::Relaxed);
                let progress = camera.await.expect("the camera node runs");
                (counts[0], counts[1], progress)
            })
            .expect("client runtime")
        });
        if let Some(r) = relay_slot.lock().unwrap().take() {
            r.shutdown().expect("relay stops");
        }
        eprintln!("camera finished: {progress}");
        assert!(before >= 30 && after >= 30, "{before} then {after}");
        assert!(progress.sessions >= 2, "{progress}");
    });
}
