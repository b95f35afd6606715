//! The host camera node through a real relay: `skiff-relay`'s handler on a
//! loopback port in this process, the `camera` binary (or the node itself)
//! publishing H.264 in hang format, and the `viewer` binary (or a subscriber
//! here) decoding what arrives.

use std::io::Write;
use std::num::NonZeroUsize;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// The relay tests' helpers (bounded test threads, loopback configs).
#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;

use common::within;
use skiff_core::hang::{self, frame};
use skiff_media::h264::{EncodeOptions, Encoder, Payload};
use skiff_media::node::{self, NodeOptions};
use skiff_media::pattern::{self, Stamp};
use skiff_media::picture::Picture;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};
use skiff_relay::tls::{TlsServer, TlsSource};

/// A relay on `listen`, one worker.
fn relay_on(listen: std::net::SocketAddr) -> ServerHandle {
    let cfg = RelayConfig {
        listen,
        threads: NonZeroUsize::MIN,
        drain_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    };
    server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts")
}

/// A relay on a free loopback port.
fn relay() -> ServerHandle {
    relay_on("127.0.0.1:0".parse().unwrap())
}

/// Runs the viewer binary on `url` for `frames` good frames with `extra` flags.
fn viewer(url: &str, frames: u32, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_viewer"))
        .args(["--url", url, "--broadcast", "cam.hang", "--timeout", "60"])
        .args(["--frames", &frames.to_string()])
        .args(extra)
        .output()
        .expect("viewer runs")
}

/// The camera binary with `args`, stdin from `input` (if any).
fn camera(url: &str, args: &[&str], input: Option<Vec<u8>>) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_camera"))
        .args(["--url", url])
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("camera starts");
    if let Some(data) = input {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    child
}

/// Asserts the viewer passed with `frames` good frames; returns its stdout.
fn passed(out: &Output, frames: u32) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "viewer: {stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("PASS: {frames} good frames (hang avc1.")),
        "{stdout}"
    );
    stdout
}

/// A PNG's size and its first `rows` rows of RGB.
fn png_top(path: &Path, rows: usize) -> ((u32, u32), Vec<u8>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let row = info.line_size;
    ((info.width, info.height), buf[..row * rows].to_vec())
}

/// `frames` pictures of the stamped pattern, `w` × `h`.
fn pattern_pictures(w: usize, h: usize, frames: u32) -> impl Iterator<Item = Picture> {
    (0..frames).map(move |n| {
        let mut pic = Picture::new(w, h);
        pattern::draw(
            &mut pic,
            Stamp {
                frame: n,
                time_us: node::wall_clock_us(),
            },
        );
        pic
    })
}

#[test]
fn the_viewer_decodes_300_camera_frames_and_writes_pngs() {
    within(90, || {
        let relay = relay();
        let url = format!("tcp://{}/anon", relay.local_addr());
        let mut cam = camera(&url, &["--frames", "3000"], None);
        let dir = std::env::temp_dir().join(format!("skiff-viewer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = viewer(&url, 300, &["--out", dir.to_str().unwrap()]);
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        let stdout = passed(&out, 300);
        assert!(
            stdout.contains("latency") && !stdout.contains("n/a"),
            "{stdout}"
        );
        // The pictures: the catalog's size, and the stamp rows change frame to frame.
        let names: Vec<_> = [0, 1, 150, 299]
            .iter()
            .map(|i| dir.join(format!("frame-{i:06}.png")))
            .collect();
        let tops: Vec<_> = names.iter().map(|p| png_top(p, 24)).collect();
        for (size, _) in &tops {
            assert_eq!(*size, (320, 240));
        }
        for pair in tops.windows(2) {
            assert_ne!(pair[0].1, pair[1].1, "the stamp region did not change");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 300);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn the_camera_publishes_over_tls_and_the_viewer_reads_over_wss() {
    within(90, || {
        let dir = std::env::temp_dir().join(format!("skiff-camera-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = skiff_testkit::pki::Pki::write(&dir, "camera");
        let cfg = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: NonZeroUsize::MIN,
            drain_timeout: Duration::from_secs(2),
            tls: Some(skiff_relay::tls::TlsFiles {
                cert: pki.cert.clone(),
                key: pki.key.clone(),
            }),
            ..RelayConfig::default()
        };
        let relay = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts");
        let addr = relay.local_addr();
        let ca = pki.ca.to_str().unwrap();
        let mut cam = camera(
            &format!("tls://{addr}/anon"),
            &["--frames", "3000", "--ca", ca],
            None,
        );
        let out = viewer(&format!("wss://{addr}/anon"), 100, &["--ca", ca]);
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        passed(&out, 100);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn the_camera_and_the_viewer_pin_a_generated_certificate() {
    within(90, || {
        // The relay's certificate, made here for the two hosts and shared
        // with its workers, so the test knows the fingerprint to pin; a
        // generated certificate serves QUIC, so both dial moql://.
        let hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let tls = TlsServer::load(TlsSource::Generate(hosts.clone())).expect("a certificate");
        let tls = Arc::new(tls);
        let hex = tls.cert().fingerprint_hex().expect("a fingerprint");
        let cfg = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: NonZeroUsize::MIN,
            drain_timeout: Duration::from_secs(2),
            tls_generate: hosts,
            ..RelayConfig::default()
        };
        let factory = RelayHandler::factory_with_tls(1, Some(tls)).unwrap();
        let relay = server::start(cfg, factory).expect("relay starts");
        let addr = relay.local_addr();
        let mut cam = camera(
            &format!("moql://{addr}/anon"),
            &["--frames", "3000", "--fingerprint", &hex],
            None,
        );
        let out = viewer(
            &format!("moql://{addr}/anon"),
            100,
            &["--fingerprint", &hex],
        );
        let _ = cam.kill();
        let _ = cam.wait();
        // Another pin: every attempt is refused, and the viewer says why.
        let wrong = "ab".repeat(32);
        let mut cam = camera(
            &format!("moql://{addr}/anon"),
            &["--frames", "3000", "--fingerprint", &wrong],
            None,
        );
        let refused = Command::new(env!("CARGO_BIN_EXE_viewer"))
            .args(["--url", &format!("moql://{addr}/anon"), "--frames", "1"])
            .args(["--fingerprint", &wrong, "--timeout", "2"])
            .output()
            .expect("viewer runs");
        let _ = cam.kill();
        let cam = cam.wait_with_output().unwrap();
        relay.shutdown().expect("relay stops");
        passed(&out, 100);
        // A generated certificate serves QUIC (the TCP port stays plain);
        // the QUIC library reports the verifier's refusal as text.
        let said = "invalid peer certificate";
        let err = String::from_utf8_lossy(&cam.stderr);
        assert!(err.contains(said), "camera: {err}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{err}");
        assert!(
            err.contains("connection failed: ") && err.contains(said),
            "{err}"
        );
    });
}

#[test]
fn the_camera_and_the_viewer_dial_moql_pinning_the_relay_certificate() {
    within(90, || {
        // A relay as `skiff-relay --tls-generate localhost,127.0.0.1`: QUIC on
        // UDP at its port, TCP plain; the pin is what its TCP port answers.
        let cfg = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: NonZeroUsize::MIN,
            drain_timeout: Duration::from_secs(2),
            tls_generate: vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            ..RelayConfig::default()
        };
        let relay = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts");
        let addr = relay.local_addr();
        let (status, hex) = common::http_get(addr, "/certificate.sha256");
        assert!(status.contains("200"), "{status}");
        let hex = hex.trim().to_owned();
        assert_eq!(hex.len(), 64, "{hex}");
        let url = format!("moql://{addr}/anon");
        let mut cam = camera(&url, &["--frames", "3000", "--fingerprint", &hex], None);
        let dir = std::env::temp_dir().join(format!("skiff-viewer-quic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = viewer(
            &url,
            100,
            &["--fingerprint", &hex, "--out", dir.to_str().unwrap()],
        );
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        passed(&out, 100);
        // A PNG per frame, of the catalog's size, the stamp changing.
        let tops: Vec<_> = [0, 50, 99]
            .iter()
            .map(|i| png_top(&dir.join(format!("frame-{i:06}.png")), 24))
            .collect();
        for (size, _) in &tops {
            assert_eq!(*size, (320, 240));
        }
        for pair in tops.windows(2) {
            assert_ne!(pair[0].1, pair[1].1, "the stamp region did not change");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 100);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn a_malformed_fingerprint_is_refused_with_a_clear_error() {
    within(60, || {
        let short = "--fingerprint=abc";
        let not_hex = format!("--fingerprint={}", "z".repeat(64));
        for (flag, says) in [
            (short, "64 hex digits, this has 3"),
            (
                not_hex.as_str(),
                "character 0 of the fingerprint is no hex digit",
            ),
        ] {
            let cam = camera("tls://127.0.0.1:9/anon", &[flag], None)
                .wait_with_output()
                .unwrap();
            let view = viewer("tls://127.0.0.1:9/anon", 1, &[flag]);
            for (name, out) in [("camera", cam), ("viewer", view)] {
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{name}: {err}");
                assert!(
                    err.contains("--fingerprint") && err.contains(says),
                    "{name}: {err}"
                );
                assert!(!err.contains("panicked"), "{name}: {err}");
            }
        }
        // A CA and a pin at once: refused too.
        let pin = format!("--fingerprint={}", "a".repeat(64));
        let out = viewer("tls://127.0.0.1:9/anon", 1, &["--ca", "ca.pem", &pin]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("cannot be used with"), "{err}");
    });
}

#[test]
fn a_y4m_stream_on_stdin_is_encoded_and_viewed() {
    within(90, || {
        let relay = relay();
        let url = format!("tcp://{}/anon", relay.local_addr());
        let (w, h) = (160, 120);
        let mut data = Vec::new();
        {
            let mut enc = y4m::encode(w, h, y4m::Ratio::new(30, 1))
                .with_colorspace(y4m::Colorspace::C420jpeg)
                .write_header(&mut data)
                .unwrap();
            for mut pic in pattern_pictures(w, h, 450) {
                let bytes = pic.as_bytes_mut();
                let (y, uv) = bytes.split_at(w * h);
                let (u, v) = uv.split_at(w * h / 4);
                enc.write_frame(&y4m::Frame::new([y, u, v], None)).unwrap();
            }
        }
        let mut cam = camera(&url, &["--input", "y4m", "--gop", "15"], Some(data));
        let out = viewer(&url, 60, &[]);
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        let stdout = passed(&out, 60);
        assert!(stdout.contains("160x120 30 fps"), "{stdout}");
    });
}

#[test]
fn an_h264_stream_on_stdin_is_published_as_it_is() {
    within(90, || {
        let relay = relay();
        let url = format!("tcp://{}/anon", relay.local_addr());
        let (w, h) = (192, 108);
        let opts = EncodeOptions {
            width: w,
            height: h,
            fps: 30.0,
            gop: 20,
            bitrate: 400_000,
        };
        let mut enc = Encoder::new(opts).unwrap();
        let mut au = Payload::with_capacity(1 << 16);
        let mut data = Vec::new();
        for pic in pattern_pictures(w, h, 450) {
            if enc.encode(&pic, &mut au).unwrap() {
                for nal in skiff_core::hang::avc::LengthPrefixed::new(au.access_unit()) {
                    data.extend_from_slice(&[0, 0, 0, 1]);
                    data.extend_from_slice(nal.unwrap());
                }
            }
        }
        let mut cam = camera(&url, &["--input", "h264", "--fps", "30"], Some(data));
        let out = viewer(&url, 60, &[]);
        let _ = cam.kill();
        let _ = cam.wait();
        relay.shutdown().expect("relay stops");
        let stdout = passed(&out, 60);
        assert!(stdout.contains("192x108 30 fps"), "{stdout}");
    });
}

/// Runs the camera binary on bad stdin: it must exit 2 with `message`, not panic.
fn refuses(args: &[&str], input: Vec<u8>, message: &str) {
    let mut cam = camera("tcp://127.0.0.1:9/anon", args, Some(input));
    let status = cam.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut cam.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains(message), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    within(60, || {
        refuses(
            &["--input", "y4m"],
            b"YUV4MPEG2 W320 Hx F30:1\n".to_vec(),
            "y4m: bad stream header",
        );
        refuses(
            &["--input", "y4m"],
            b"YUV4MPEG2 W320 H240 F30:1 C444\nFRAME\n".to_vec(),
            "not 8-bit 4:2:0",
        );
        refuses(&["--input", "y4m"], Vec::new(), "y4m: bad stream header");
        // An Annex-B stream cut inside its first keyframe.
        let mut enc = Encoder::new(EncodeOptions {
            width: 160,
            height: 120,
            fps: 30.0,
            gop: 30,
            bitrate: 300_000,
        })
        .unwrap();
        let mut au = Payload::with_capacity(1 << 16);
        let pic = pattern_pictures(160, 120, 1).next().unwrap();
        assert!(enc.encode(&pic, &mut au).unwrap());
        let mut data = Vec::new();
        for nal in skiff_core::hang::avc::LengthPrefixed::new(au.access_unit()) {
            data.extend_from_slice(&[0, 0, 0, 1]);
            data.extend_from_slice(nal.unwrap());
        }
        data.truncate(data.len() * 2 / 3);
        refuses(&["--input", "h264"], data, "h264 input:");
        refuses(
            &["--input", "h264"],
            vec![0x42; 10_000],
            "no Annex-B start code",
        );
        refuses(&["--width", "100"], Vec::new(), "at least 128x96");
    });
}

/// The relay goes away and comes back on the same address: the camera's and
/// a subscriber's clients redial, and frames go on arriving, well formed.
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
                    *slot.lock().unwrap() = Some(relay_on(addr));
                    let _ = ready_tx.send(());
                }
            });
            driver::block_on(DriverKind::Auto, move |_| async move {
                let stop = Arc::new(AtomicBool::new(false));
                let opts = NodeOptions {
                    width: 160,
                    height: 120,
                    fps: 60.0,
                    gop: 15,
                    bitrate: 300_000,
                    ..NodeOptions::pattern(url.clone(), "cam.hang")
                };
                let camera = monoio::spawn(node::run(opts, stop.clone(), |_| {}));
                let (client, runner) = connect(&url, Config::default()).expect("a valid URL");
                let runner = monoio::spawn(runner.run());
                let mut track = client
                    .subscribe("cam.hang", "video", Request::LIVE)
                    .await
                    .expect("subscribed");
                // Well-formed frames (prefix and FRAME timestamp agree) before and after.
                let mut counts = [0u64; 2];
                let mut phase = 0;
                while counts[1] < 30 {
                    let Ok(Some(mut group)) = track.next_group().await else {
                        panic!("the track ended");
                    };
                    // A group the restart cut short ends in an error: read on.
                    while let Ok(Some(f)) = group.read_frame().await {
                        let bytes = f.payload.to_vec();
                        if frame::decode(&bytes).is_ok_and(|(pts, _)| pts == f.timestamp) {
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
                // The catalog is still there for a subscriber that joins now.
                let mut catalog = client
                    .subscribe("cam.hang", hang::CATALOG_TRACK, Request::LIVE)
                    .await
                    .expect("catalog subscribed");
                let mut g = catalog
                    .next_group()
                    .await
                    .unwrap()
                    .expect("a catalog group");
                let json = g
                    .read_frame()
                    .await
                    .unwrap()
                    .expect("the catalog")
                    .payload
                    .to_vec();
                assert!(json.starts_with(b"{\"video\":{\"renditions\":{\"video\":"));
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
