//! The host camera node through a real relay: `skiff-relay`'s handler on a
//! loopback port in this process, the camera node publishing to it, and a
//! subscriber (or the `viewer` binary) decoding what arrives and comparing
//! each picture with the test pattern.

use std::num::NonZeroUsize;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// The relay tests' helpers (bounded test threads, loopback configs).
#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;

use common::within;
use skiff_examples::camera::{self, Decoder, Format};
use skiff_examples::node::{self, NodeOptions, Progress};
use skiff_monoio::client::{self, ClientCtx, FrameReader, ReadState, Subscriber};
use skiff_monoio::driver::{self, DriverKind};
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

    let ctx = Rc::new(ClientCtx::new(16 << 20));
    let notify = ctx.notify().clone();
    let local = ctx.track("video");
    let app = Subscriber::new("host/cam", local);
    let state = app.state.clone();
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = app;
            let _ = client::run(&url, None, &mut app, &ctx).await;
        });
    }
    let mut reader = FrameReader::new(local);
    let mut decoder = Decoder::new();
    let mut seen = Seen::default();
    let waiter = notify.waiter();
    while seen.frames.len() < WANT as usize && seen.error.is_none() {
        let generation = notify.generation();
        let mut got = false;
        let st = reader.poll(|f| {
            got = true;
            if seen.error.is_some() {
                return;
            }
            match camera::check(&mut decoder, f.payload) {
                Ok(h) => {
                    let fmt = h.format;
                    if h.format != format()
                        || (fmt.group(h.n), fmt.index(h.n)) != (f.group, f.index)
                        || fmt.timestamp_ms(h.n) != f.timestamp
                        || h.key != (f.index == 0)
                    {
                        seen.error = Some(format!("frame {h:?} misplaced as {f:?}"));
                    } else {
                        seen.frames.push((h.n, h.key, f.payload.len()));
                    }
                }
                Err(e) => {
                    seen.error = Some(format!("frame {}/{}: {e}", f.group, f.index));
                }
            }
        });
        if st != ReadState::Pending {
            seen.error = Some(format!("track ended: {st:?}"));
        }
        if let Some(c) = state.closed.get() {
            seen.error = Some(format!("subscription closed: {c:?}"));
        }
        if got {
            // Reading released credit: let the session send it.
            notify.bump();
        }
        monoio::select! {
            () = waiter.changed(generation) => {}
            () = monoio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    ctx.close_all();
    stop.store(true, Ordering::Relaxed);
    let progress = camera.await;
    (seen, progress)
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
