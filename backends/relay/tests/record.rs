//! Recording while relaying, against real `skiff-relay` processes: a hang
//! test-card camera (I_PCM H.264, its frame number drawn in) published
//! through a relay run with `--record`, then
//!
//! * the stored segments and the `export`ed MP4 read back: by `mp4-atom`
//!   always, and by Debian's `ffprobe`/`ffmpeg` where installed (every
//!   frame decoded, the drawn counter rising by one with no gap);
//! * a relay killed with SIGKILL mid-recording, with a torn index line, a
//!   temporary segment and an unindexed segment added to its directory,
//!   restarted: `GET /recordings` and `export` serve every completed segment
//!   and nothing torn;
//! * `--record-max-bytes`: the oldest segments go first and the bound holds;
//! * the replay broadcast `PATH/replay`: its catalog's `archive` entry and
//!   its `timeline.z` track, decoded, against the index, pushed while
//!   recording, served after the camera stopped, popped by retention.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{http_get, sample};
use skiff_archive::Record;
use skiff_archive::window::{Decoder, DecoderConfig, Event};
use skiff_core::hang::{self, testcard::TestCard};
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::record::{index, store};
use skiff_testkit::relay_process::RelayProcess;

/// The camera's picture size and rate.
const WIDTH: usize = 160;
const HEIGHT: usize = 96;
const FPS: u32 = 30;

/// One Opus packet of 20 ms: a TOC byte alone (CELT fullband 20 ms,
/// stereo, one frame of zero bytes: silence, RFC 6716 §3.2.1).
const OPUS_SILENCE: u8 = (31 << 3) | (1 << 2);

/// The audio frames' spacing, µs.
const OPUS_FRAME_US: u64 = 20_000;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_skiff-relay"))
}

/// A fresh empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-record-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Publishes the test card as hang broadcast `anon/NAME` through the relay
/// at `addr`: `groups` groups of `per_group` frames at [`FPS`] (all if
/// `groups` is `None`, until `stop`), starting once the video track has a
/// subscriber (the recorder). With `audio`, the broadcast also has an Opus
/// track `audio` ([`OPUS_SILENCE`] every 20 ms, a group per video group).
/// Returns the video frames published.
fn camera(
    addr: SocketAddr,
    name: &'static str,
    groups: Option<u32>,
    per_group: u32,
    audio: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    camera_at(
        format!("tcp://{addr}/anon"),
        None,
        name,
        groups,
        per_group,
        audio,
        stop,
    )
}

/// [`camera`] dialing `url`, trusting the CA in `ca` for a `tls://` one.
fn camera_at(
    url: String,
    ca: Option<PathBuf>,
    name: &'static str,
    groups: Option<u32>,
    per_group: u32,
    audio: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let card = TestCard::new(WIDTH, HEIGHT, FPS).unwrap();
            let mut config = skiff_monoio::Config::default();
            config.pool_bytes = 32 << 20;
            config.tls_roots =
                ca.map(|ca| Arc::new(skiff_monoio::tls::roots_from_pem_file(&ca).unwrap()));
            let (client, runner) = skiff_monoio::connect(&url, config).unwrap();
            monoio::spawn(runner.run());
            let broadcast = client.publish(name).unwrap();
            let mut catalog_track = broadcast.create_track(hang::catalog_info()).unwrap();
            let mut video = broadcast
                .create_track(hang::video_info("video").unwrap())
                .unwrap();
            let mut sound = audio.then(|| {
                broadcast
                    .create_track(hang::audio_info("audio").unwrap())
                    .unwrap()
            });
            let mut json = [0u8; hang::testcard::CATALOG_MAX_LEN];
            let len = card.catalog("video", &mut json).unwrap();
            let mut json: serde_json::Value = serde_json::from_slice(&json[..len]).unwrap();
            if audio {
                json["audio"] = serde_json::json!({"renditions": {"audio": {
                    "codec": "opus", "sampleRate": 48000, "numberOfChannels": 2,
                    "container": {"kind": "legacy"}}}});
            }
            let json = serde_json::to_vec(&json).unwrap();
            let mut catalog = catalog_track.append_group().unwrap();
            catalog.write_frame(0, &json).await.unwrap();
            wait_subscribed(20, name, || {
                video.subscribers() > 0 && sound.as_ref().is_none_or(|a| a.subscribers() > 0)
            })
            .await;
            let mut buf = vec![0u8; card.max_frame_len()];
            let tick = Duration::from_micros(1_000_000 / u64::from(FPS));
            let start = Instant::now();
            let total = groups.map_or(u32::MAX, |g| g * per_group);
            let mut n = 0u32;
            let (mut group, mut sound_group) = (None, None);
            let mut k = 0u64;
            while n < total && !stop.load(Ordering::Relaxed) {
                if n.is_multiple_of(per_group) {
                    if let Some(g) = group.take() {
                        skiff_monoio::sdk::GroupProducer::finish(g).unwrap();
                    }
                    group = Some(video.append_group().unwrap());
                    if let Some(a) = sound.as_mut() {
                        if let Some(g) = sound_group.take() {
                            skiff_monoio::sdk::GroupProducer::finish(g).unwrap();
                        }
                        sound_group = Some(a.append_group().unwrap());
                    }
                }
                let pts = card.pts_us(u64::from(n));
                let frame = card.frame(n, pts, &mut buf).unwrap();
                let Some(g) = group.as_mut() else { break };
                if g.write_frame(pts, frame).await.is_err() {
                    break;
                }
                // The audio frames that start before the next picture.
                while let Some(g) = sound_group.as_mut()
                    && k * OPUS_FRAME_US < card.pts_us(u64::from(n) + 1)
                {
                    let mut payload = [0u8; 9];
                    let at = k * OPUS_FRAME_US;
                    let len = hang::frame::encode_prefix(at, &mut payload).unwrap();
                    payload[len] = OPUS_SILENCE;
                    if g.write_frame(at, &payload[..=len]).await.is_err() {
                        break;
                    }
                    k += 1;
                }
                n += 1;
                monoio::time::sleep_until(monoio::time::Instant::from_std(start + tick * n)).await;
            }
            if let Some(g) = group.take() {
                let _ = g.finish();
            }
            if let Some(g) = sound_group.take() {
                let _ = g.finish();
            }
            if groups.is_some() {
                video.finish();
                if let Some(a) = sound {
                    a.finish();
                }
                let _ = catalog.finish();
                catalog_track.finish();
                flush_and_close(&client).await;
            }
            n
        })
        .expect("camera runtime")
    })
}

/// Waits (within `secs` seconds) until `subscribed` holds: the recorder
/// subscribed to `what`.
async fn wait_subscribed(secs: u64, what: &str, subscribed: impl Fn() -> bool) {
    let waited = Instant::now();
    while !subscribed() {
        assert!(
            waited.elapsed() < Duration::from_secs(secs),
            "the recorder never subscribed to {what}"
        );
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Closes `client` once what it sent is flushed, or after 5 s.
async fn flush_and_close(client: &skiff_monoio::Client) {
    monoio::select! {
        () = client.flushed() => {}
        () = monoio::time::sleep(Duration::from_secs(5)) => {}
    }
    client.close().await;
}

/// A relay with `threads` workers recording every `anon/` broadcast into
/// the directory `d`, with the `extra` flags.
fn recording_relay(d: &str, threads: usize, extra: &[&str]) -> RelayProcess {
    let mut args = vec!["--record", "anon/**", "--record-dir", d];
    args.extend_from_slice(extra);
    RelayProcess::start_threads(binary(), threads, &args)
}

/// Polls `GET /recordings` until `done` holds for its JSON (within 30 s).
fn wait_recordings(
    addr: SocketAddr,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (status, body) = http_get(addr, "/recordings");
        assert!(status.contains("200"), "{status}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        if done(&json) {
            return json;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "recordings never got there: {json}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `segments` count of `track` of `broadcast` in a `/recordings` answer.
fn segments_of(json: &serde_json::Value, broadcast: &str, track: &str) -> u64 {
    json.as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["broadcast"] == broadcast)
        .flat_map(|b| b["tracks"].as_array().cloned().unwrap_or_default())
        .filter(|t| t["track"] == track)
        .map(|t| t["segments"].as_u64().unwrap_or(0))
        .sum()
}

fn ended(json: &serde_json::Value, broadcast: &str) -> bool {
    json.as_array()
        .into_iter()
        .flatten()
        .any(|b| b["broadcast"] == broadcast && b["ended"] == true)
}

/// Whether Debian's ffmpeg tools are installed.
fn have_ffmpeg() -> bool {
    let ok = |tool: &str| {
        Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let found = ok("ffprobe") && ok("ffmpeg");
    if !found {
        eprintln!(
            "ffprobe/ffmpeg not installed (apt-get install ffmpeg): their checks are skipped"
        );
    }
    found
}

/// Runs `command` (`what` names it in a failure) and returns what it wrote
/// to stdout; panics unless it succeeds without printing to stderr.
fn run_clean(command: &mut Command, what: &str) -> Vec<u8> {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "{what}: {stderr}"
    );
    out.stdout
}

/// `ffprobe`'s count of the video frames of `file`; panics on any error it prints.
fn ffprobe_frames(file: &Path) -> u64 {
    let out = run_clean(
        Command::new("ffprobe")
            .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
            .args([
                "-show_entries",
                "stream=nb_read_frames,codec_name,width,height",
                "-of",
                "csv=p=0",
            ])
            .arg(file),
        &format!("ffprobe {}", file.display()),
    );
    let text = String::from_utf8_lossy(&out);
    let fields: Vec<&str> = text.lines().next().unwrap_or("").split(',').collect();
    assert_eq!(
        fields[..3],
        ["h264", &WIDTH.to_string(), &HEIGHT.to_string()],
        "{text}"
    );
    fields[3]
        .parse()
        .unwrap_or_else(|_| panic!("ffprobe said {text}"))
}

/// Decodes every frame of `file` with ffmpeg (no error allowed) and reads
/// the test card's counter off each picture.
fn ffmpeg_counters(file: &Path) -> Vec<u32> {
    let out = run_clean(
        Command::new("ffmpeg")
            .args(["-v", "error", "-i"])
            .arg(file)
            .args(["-f", "rawvideo", "-pix_fmt", "gray", "-"]),
        &format!("ffmpeg {}", file.display()),
    );
    let card = TestCard::new(WIDTH, HEIGHT, FPS).unwrap();
    assert_eq!(out.len() % (WIDTH * HEIGHT), 0);
    out.chunks(WIDTH * HEIGHT)
        .map(|luma| {
            card.read_counter(luma, WIDTH)
                .expect("the counter reads back")
        })
        .collect()
}

/// Checks every stored segment of `broadcast`'s video: its file decodes
/// with `mp4-atom` (moof + mdat, as many samples as the index says) and,
/// with ffmpeg, init + segment is a file ffprobe reads without error.
/// Returns the frames the index lists.
fn check_segments(dir: &Path, broadcast: &str, ffmpeg: bool) -> u64 {
    use mp4_atom::{Decode, Mdat, Moof};
    let stored = store::open(dir, broadcast)
        .unwrap()
        .expect("a stored broadcast");
    let mut frames = 0;
    for s in stored.segments("video") {
        let bytes = std::fs::read(stored.segment_path(s)).unwrap();
        assert_eq!(bytes.len() as u64, s.bytes);
        let buf = &mut bytes.as_slice();
        let moof = Moof::decode(buf).unwrap();
        Mdat::decode(buf).unwrap();
        assert!(buf.is_empty());
        assert_eq!(
            moof.traf[0].trun[0].samples.len() as u64,
            u64::from(s.frames)
        );
        if ffmpeg {
            let mut whole = std::fs::read(stored.init_path("video", s.init)).unwrap();
            whole.extend_from_slice(&bytes);
            let probe = dir.join("probe.mp4");
            std::fs::write(&probe, whole).unwrap();
            assert_eq!(
                ffprobe_frames(&probe),
                u64::from(s.frames),
                "segment {}",
                s.number
            );
            std::fs::remove_file(probe).unwrap();
        }
        frames += u64::from(s.frames);
    }
    frames
}

fn export(dir: &Path, broadcast: &str, out: &Path, range: &[&str]) -> String {
    let o = Command::new(binary())
        .args(["export", "--record-dir"])
        .arg(dir)
        .args(["--broadcast", broadcast])
        .args(range)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "export: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn records_the_camera_exports_it_and_survives_sigkill() {
    let dir = scratch("camera");
    let ffmpeg = have_ffmpeg();
    let d = dir.to_str().unwrap();
    let relay = recording_relay(d, 1, &[]);

    // 1. Twelve one-second groups, recorded whole.
    let (groups, per_group) = (12u32, FPS);
    let cam = camera(
        relay.addr,
        "cam.hang",
        Some(groups),
        per_group,
        true,
        Arc::default(),
    );
    assert_eq!(cam.join().unwrap(), groups * per_group);
    let json = wait_recordings(relay.addr, |j| ended(j, "anon/cam.hang"));
    // Its Opus track too: a segment per group, 50 frames of 20 ms each.
    assert_eq!(
        segments_of(&json, "anon/cam.hang", "audio"),
        u64::from(groups),
        "{json}"
    );
    let audio_frames = u64::from(groups) * 50;
    let stored = store::open(&dir, "anon/cam.hang").unwrap().unwrap();
    assert_eq!(
        stored
            .segments("audio")
            .map(|s| u64::from(s.frames))
            .sum::<u64>(),
        audio_frames
    );
    let sound = dir.join("sound.mp4");
    let said = export(&dir, "anon/cam.hang", &sound, &["--track", "audio"]);
    assert!(
        said.contains(&format!("({audio_frames} frames, track audio")),
        "{said}"
    );
    if ffmpeg {
        let out = run_clean(
            Command::new("ffprobe")
                .args(["-v", "error", "-count_frames", "-select_streams", "a:0"])
                .args([
                    "-show_entries",
                    "stream=codec_name,channels,nb_read_frames",
                    "-of",
                    "csv=p=0",
                ])
                .arg(&sound),
            "ffprobe",
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.trim(), format!("opus,2,{audio_frames}"));
        let out = Command::new("ffmpeg")
            .args(["-v", "error", "-i"])
            .arg(&sound)
            .args(["-f", "null", "-"])
            .output()
            .unwrap();
        assert!(
            out.stderr.is_empty(),
            "ffmpeg: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        segments_of(&json, "anon/cam.hang", "video"),
        u64::from(groups),
        "{json}"
    );
    assert_eq!(
        check_segments(&dir, "anon/cam.hang", ffmpeg),
        u64::from(groups * per_group)
    );
    let (_, metrics) = http_get(relay.metrics, "/metrics");
    assert_eq!(
        sample(&metrics, "skiff_relay_record_groups_recorded_total"),
        Some(2 * u64::from(groups)),
        "video and audio"
    );
    assert_eq!(
        sample(&metrics, "skiff_relay_record_groups_dropped_total"),
        Some(0)
    );

    let mp4 = dir.join("cam.mp4");
    let said = export(&dir, "anon/cam.hang", &mp4, &[]);
    assert!(
        said.contains(&format!(
            "exported {groups} segments ({} frames",
            groups * per_group
        )),
        "{said}"
    );
    // Content seconds 3 to 6: the groups starting at 3, 4 and 5 s.
    let part = dir.join("part.mp4");
    let said = export(
        &dir,
        "anon/cam.hang",
        &part,
        &["--from", "3s", "--to", "6s"],
    );
    assert!(
        said.contains(&format!("exported 3 segments ({} frames", 3 * per_group)),
        "{said}"
    );
    if ffmpeg {
        assert_eq!(ffprobe_frames(&mp4), u64::from(groups * per_group));
        // The part starts at the file's time 0 and lasts its three seconds.
        let out = Command::new("ffprobe")
            .args(["-v", "error", "-show_entries", "format=start_time,duration"])
            .args(["-of", "csv=p=0"])
            .arg(&part)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let times: Vec<f64> = text.trim().split(',').map(|t| t.parse().unwrap()).collect();
        assert!(
            times[0].abs() < 0.001 && (times[1] - 3.0).abs() < 0.001,
            "{text}"
        );
        let counters = ffmpeg_counters(&mp4);
        assert_eq!(counters, (0..groups * per_group).collect::<Vec<_>>());
        let counters = ffmpeg_counters(&part);
        assert_eq!(counters, (3 * per_group..6 * per_group).collect::<Vec<_>>());
    }

    // The finished recording as HLS: every segment listed, then the end.
    let (status, m3u8) = http_get(relay.addr, "/hls/anon/cam.hang/index.m3u8");
    assert!(status.contains("200"), "{status}");
    assert_eq!(m3u8.matches("#EXTINF:").count(), groups as usize, "{m3u8}");
    assert!(
        m3u8.contains("#EXT-X-MAP:URI=\"video.0.init.mp4\""),
        "{m3u8}"
    );
    assert!(m3u8.trim_end().ends_with("#EXT-X-ENDLIST"), "{m3u8}");
    // Numbered per track (the audio's segments do not take video numbers):
    // the media sequence runs 0..11 without a hole.
    assert!(m3u8.contains("#EXT-X-MEDIA-SEQUENCE:0\n"), "{m3u8}");
    let listed: Vec<&str> = m3u8.lines().filter(|l| l.ends_with(".m4s")).collect();
    let numbered: Vec<String> = (0..u64::from(groups))
        .map(|n| index::segment_file("video", n))
        .collect();
    assert_eq!(listed, numbered);
    let (status, _) = http_get(relay.addr, "/hls/anon/cam.hang/..%2F..%2Fetc%2Fpasswd");
    assert!(status.contains("404"), "{status}");
    let hls = format!("http://{}/hls/anon/cam.hang/index.m3u8", relay.addr);
    if ffmpeg {
        assert_eq!(
            ffprobe_frames(Path::new(&hls)),
            u64::from(groups * per_group)
        );
        let counters = ffmpeg_counters(Path::new(&hls));
        assert_eq!(counters, (0..groups * per_group).collect::<Vec<_>>());
    }

    // 2. A camera that is still publishing when the relay is killed.
    let stop = Arc::new(AtomicBool::new(false));
    let _live = camera(relay.addr, "live.hang", None, 10, false, stop.clone());
    wait_recordings(relay.addr, |j| {
        segments_of(j, "anon/live.hang", "video") >= 4
    });
    // Live HLS: no end yet, and ffprobe reads its start.
    let (_, m3u8) = http_get(relay.addr, "/hls/anon/live.hang/index.m3u8");
    assert!(!m3u8.contains("#EXT-X-ENDLIST"), "{m3u8}");
    if ffmpeg {
        let live_url = format!("http://{}/hls/anon/live.hang/index.m3u8", relay.addr);
        let out = run_clean(
            Command::new("ffprobe")
                .args([
                    "-v",
                    "error",
                    "-show_entries",
                    "stream=codec_name",
                    "-of",
                    "csv=p=0",
                ])
                .arg(&live_url),
            &format!("ffprobe {live_url}"),
        );
        assert_eq!(String::from_utf8_lossy(&out).lines().next(), Some("h264"));
    }
    let mut relay = relay;
    relay.child.kill().unwrap(); // SIGKILL
    relay.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);

    // What a crash can leave: a half-written segment, a segment renamed
    // before its index line, and half an index line.
    let live = store::open(&dir, "anon/live.hang").unwrap().unwrap();
    let before: Vec<u64> = live.segments("video").map(|s| s.number).collect();
    let next = live.index.tracks["video"].last_number.unwrap() + 1;
    let bdir = live.dir.clone();
    std::fs::write(
        bdir.join(format!(".{}.tmp", index::segment_file("video", next + 1))),
        b"torn",
    )
    .unwrap();
    std::fs::write(
        bdir.join(index::segment_file("video", next)),
        b"\0\0\0\x08moof",
    )
    .unwrap();
    let line = index::Record::Delete {
        track: "video".into(),
        number: before[0],
    }
    .line();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(bdir.join(index::INDEX_FILE))
        .unwrap();
    std::io::Write::write_all(&mut log, &line.as_bytes()[..line.len() / 2]).unwrap();
    drop(log);

    // A relay that only serves the directory (no --record, so no writer to
    // recover it) answers the killed recording as ended, not as live.
    let reader = RelayProcess::start_threads(binary(), 1, &["--record-dir", d]);
    wait_recordings(reader.addr, |j| ended(j, "anon/live.hang"));
    let (_, m3u8) = http_get(reader.addr, "/hls/anon/live.hang/index.m3u8");
    assert!(m3u8.contains("#EXT-X-ENDLIST"), "{m3u8}");
    drop(reader);

    let relay = recording_relay(d, 1, &[]);
    let json = wait_recordings(relay.addr, |j| ended(j, "anon/live.hang"));
    assert_eq!(
        segments_of(&json, "anon/live.hang", "video"),
        before.len() as u64,
        "{json}"
    );
    let after = store::open(&dir, "anon/live.hang").unwrap().unwrap();
    let kept: Vec<u64> = after.segments("video").map(|s| s.number).collect();
    assert_eq!(kept, before, "every completed segment, nothing torn");
    let mut files: Vec<String> = std::fs::read_dir(&bdir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".m4s"))
        .collect();
    files.sort();
    let named: Vec<String> = before
        .iter()
        .map(|&n| index::segment_file("video", n))
        .collect();
    assert_eq!(files, named, "no temporary or unindexed segment is left");
    let frames = check_segments(&dir, "anon/live.hang", ffmpeg);
    assert_eq!(frames, 10 * before.len() as u64);
    let live_mp4 = dir.join("live.mp4");
    let said = export(&dir, "anon/live.hang", &live_mp4, &[]);
    assert!(said.contains(&format!("({frames} frames")), "{said}");
    if ffmpeg {
        let counters = ffmpeg_counters(&live_mp4);
        assert_eq!(counters.len() as u64, frames);
        assert!(
            counters.windows(2).all(|w| w[1] == w[0] + 1),
            "{counters:?}"
        );
    }
    // The first recording is still there, untouched.
    assert_eq!(
        segments_of(&json, "anon/cam.hang", "video"),
        u64::from(groups)
    );
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn retention_by_size_deletes_the_oldest_first() {
    let dir = scratch("retain");
    let d = dir.to_str().unwrap();
    // A group of 10 pictures is about 230 KB: the bound holds four.
    let bound: u64 = 1_000_000;
    // Two workers: the camera and the recorder may land on either.
    let relay = recording_relay(d, 2, &["--record-max-bytes", &bound.to_string()]);
    let groups = 12u32;
    let cam = camera(
        relay.addr,
        "cam.hang",
        Some(groups),
        10,
        false,
        Arc::default(),
    );
    assert_eq!(cam.join().unwrap(), groups * 10);
    wait_recordings(relay.addr, |j| ended(j, "anon/cam.hang"));
    let stored = store::open(&dir, "anon/cam.hang").unwrap().unwrap();
    let kept: Vec<u64> = stored.segments("video").map(|s| s.number).collect();
    let bytes: u64 = stored.segments("video").map(|s| s.bytes).sum();
    assert!(bytes <= bound, "{bytes} stored");
    assert!(kept.len() >= 3, "{kept:?}");
    // Segment numbers are in recording order: the newest are the ones kept.
    let last = stored.index.tracks["video"].last_number.unwrap();
    let expect: Vec<u64> = (last + 1 - kept.len() as u64..=last).collect();
    assert_eq!(kept, expect);
    let on_disk = std::fs::read_dir(&stored.dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".m4s")
        })
        .count();
    assert_eq!(on_disk, kept.len());
    let (_, metrics) = http_get(relay.metrics, "/metrics");
    assert_eq!(
        sample(&metrics, "skiff_relay_record_segments_deleted_total"),
        Some(u64::from(groups) - kept.len() as u64)
    );
    assert_eq!(
        sample(&metrics, "skiff_relay_record_stored_bytes"),
        Some(bytes)
    );
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's spelling: `1536k`) at a fresh
    /// directory; `None` where this process may not mount (not root).
    fn mount(name: &str, size: &str) -> Option<Tmpfs> {
        let dir = scratch(name);
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("cannot mount a tmpfs here (needs root): the full-disk test is skipped");
            return None;
        }
        Some(Tmpfs(dir))
    }

    fn resize(&self, size: &str) {
        self.remount(&format!("size={size}"));
    }

    /// Remounts with `options` (`ro`, `rw`, `size=…`); a remount read-only
    /// while the writer has a file open is busy, so it is tried again.
    fn remount(&self, options: &str) {
        for _ in 0..100 {
            let ok = Command::new("mount")
                .args(["-o", &format!("remount,{options}")])
                .arg(&self.0)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("cannot remount {} with {options}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A viewer of `anon/NAME`'s video through the relay at `addr`: the
/// timestamps of every frame it reads until the track ends.
fn viewer(addr: SocketAddr, name: &'static str) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (client, runner) = skiff_monoio::connect(
                &format!("tcp://{addr}/anon"),
                skiff_monoio::Config::default(),
            )
            .unwrap();
            monoio::spawn(runner.run());
            let request = skiff_monoio::sdk::Request {
                max_latency: skiff_core::time::Duration::from_secs(30),
                ..skiff_monoio::sdk::Request::LIVE
            };
            let mut track = client.subscribe(name, "video", request).await.unwrap();
            let mut seen = Vec::new();
            while let Ok(Some(mut group)) = track.next_group().await {
                while let Ok(Some(frame)) = group.read_frame().await {
                    seen.push(frame.timestamp);
                }
            }
            client.close().await;
            seen
        })
        .expect("viewer runtime")
    })
}

/// Polls the relay's metric `series` until `done` holds (within 20 s).
fn wait_metric(relay: &RelayProcess, series: &str, done: impl Fn(u64) -> bool) -> u64 {
    let start = Instant::now();
    loop {
        let (_, text) = http_get(relay.metrics, "/metrics");
        let v = sample(&text, series).unwrap_or(0);
        if done(v) {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{series} stays at {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Groups the camera of [`record_through_disk_fault`] publishes, and frames per group.
const FAULT_GROUPS: u32 = 30;
const FAULT_PER_GROUP: u32 = 10;

/// Records a camera of [`FAULT_GROUPS`] groups into `disk` while `fault`
/// breaks the disk and mends it again, returning the groups recorded before
/// it was mended. Then checks that the groups after it are recorded again,
/// that the viewer lost no frame, and that every stored segment reads back.
fn record_through_disk_fault(disk: &Tmpfs, fault: impl FnOnce(&RelayProcess) -> u64) {
    let d = disk.0.to_str().unwrap();
    let relay = recording_relay(d, 1, &[]);
    let watching = viewer(relay.addr, "cam.hang");
    let (groups, per_group) = (FAULT_GROUPS, FAULT_PER_GROUP);
    let cam = camera(
        relay.addr,
        "cam.hang",
        Some(groups),
        per_group,
        false,
        Arc::default(),
    );
    let before = fault(&relay);
    // Space returns: the groups still to come are recorded again.
    wait_metric(&relay, RECORDED, |v| v >= before + 2);
    assert_eq!(cam.join().unwrap(), groups * per_group);
    // The viewer lost nothing: every frame, in order.
    let card = TestCard::new(WIDTH, HEIGHT, FPS).unwrap();
    let expect: Vec<u64> = (0..u64::from(groups * per_group))
        .map(|n| card.pts_us(n))
        .collect();
    assert_eq!(watching.join().unwrap(), expect, "the viewer lost nothing");
    // What is stored is whole: every indexed segment reads back.
    let json = wait_recordings(relay.addr, |j| ended(j, "anon/cam.hang"));
    let stored = segments_of(&json, "anon/cam.hang", "video");
    assert!(stored > before && stored < u64::from(groups), "{json}");
    check_segments(&disk.0, "anon/cam.hang", have_ffmpeg());
    drop(relay);
}

/// The recorder's write errors and recorded groups (metric series).
const WRITE_ERRORS: &str = "skiff_relay_record_write_errors_total";
const RECORDED: &str = "skiff_relay_record_groups_recorded_total";

#[test]
fn a_full_disk_stops_recording_not_delivery_and_recording_resumes() {
    // About six segments of ten pictures fit.
    let Some(disk) = Tmpfs::mount("full", "1536k") else {
        return;
    };
    record_through_disk_fault(&disk, |relay| {
        wait_metric(relay, WRITE_ERRORS, |v| v >= 1);
        let before = wait_metric(relay, RECORDED, |_| true);
        assert!(before < u64::from(FAULT_GROUPS), "the disk was never full");
        disk.resize("64m");
        before
    });
}

#[test]
fn a_read_only_directory_stops_recording_not_delivery_and_recording_resumes() {
    let Some(disk) = Tmpfs::mount("ro", "64m") else {
        return;
    };
    record_through_disk_fault(&disk, |relay| {
        wait_metric(relay, RECORDED, |v| v >= 2);
        disk.remount("ro");
        wait_metric(relay, WRITE_ERRORS, |v| v >= 2);
        let before = wait_metric(relay, RECORDED, |_| true);
        disk.remount("rw");
        before
    });
}

/// Waits (at most 20 s) until the index of `broadcast` under `dir` says it ended.
fn wait_stored_end(dir: &Path, broadcast: &str) {
    let start = Instant::now();
    loop {
        let stored = store::open(dir, broadcast).unwrap();
        if stored.as_ref().is_some_and(|s| s.index.ended) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not recorded: {stored:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn records_on_a_relay_whose_listen_port_speaks_tls_only() {
    let dir = scratch("tls");
    let pki = skiff_testkit::pki::Pki::write(&dir, "record");
    let store_dir = dir.join("rec");
    let relay = recording_relay(
        store_dir.to_str().unwrap(),
        1,
        &[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
    );
    // The recorder dials tls:// with the relay's own certificate pinned.
    let url = format!("tls://localhost:{}/anon", relay.addr.port());
    let cam = camera_at(
        url,
        Some(pki.ca.clone()),
        "cam.hang",
        Some(3),
        10,
        false,
        Arc::default(),
    );
    assert_eq!(cam.join().unwrap(), 30);
    wait_stored_end(&store_dir, "anon/cam.hang");
    assert_eq!(
        check_segments(&store_dir, "anon/cam.hang", have_ffmpeg()),
        30
    );
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_on_a_relay_that_verifies_tokens() {
    use moq_auth::{Algorithm, Claims, Key, KeyId, Pattern};
    let dir = scratch("auth");
    let key = Key::generate(Algorithm::ES256, Some(KeyId::decode("rec").unwrap())).unwrap();
    key.to_file(dir.join("key.jwk")).unwrap();
    let store_dir = dir.join("rec");
    // No --auth-public: every session needs a token, the recorder's included.
    let relay = recording_relay(
        store_dir.to_str().unwrap(),
        1,
        &["--auth-key", dir.join("key.jwk").to_str().unwrap()],
    );
    let publish: Pattern = "**".parse().unwrap();
    let token = key
        .sign(
            &Claims::default()
                .with_root("anon")
                .with_publish(vec![publish])
                .with_expires(std::time::SystemTime::now() + Duration::from_secs(600)),
        )
        .unwrap();
    let url = format!("tcp://{}/anon?jwt={token}", relay.addr);
    let cam = camera_at(url, None, "cam.hang", Some(3), 10, false, Arc::default());
    assert_eq!(cam.join().unwrap(), 30);
    wait_stored_end(&store_dir, "anon/cam.hang");
    assert_eq!(check_segments(&store_dir, "anon/cam.hang", false), 30);
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Publishes the test-card broadcasts `anon/many-I.hang` for I in `range`
/// (at most four: what one client's origin holds) from one client, `groups` groups of `per_group` frames each, all in step, once
/// every video track has a subscriber. Returns the frames published per broadcast.
fn many_cameras(
    addr: SocketAddr,
    range: std::ops::Range<usize>,
    groups: u32,
    per_group: u32,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let card = TestCard::new(WIDTH, HEIGHT, FPS).unwrap();
            let mut config = skiff_monoio::Config::default();
            config.pool_bytes = 16 << 20;
            let (client, runner) =
                skiff_monoio::connect(&format!("tcp://{addr}/anon"), config).unwrap();
            monoio::spawn(runner.run());
            let mut json = [0u8; hang::testcard::CATALOG_MAX_LEN];
            let len = card.catalog("video", &mut json).unwrap();
            let mut casts = Vec::new();
            for i in range {
                let b = client.publish(&format!("many-{i}.hang")).unwrap();
                let mut cat = b.create_track(hang::catalog_info()).unwrap();
                let video = b.create_track(hang::video_info("video").unwrap()).unwrap();
                let mut g = cat.append_group().unwrap();
                g.write_frame(0, &json[..len]).await.unwrap();
                casts.push((b, cat, g, video));
            }
            wait_subscribed(30, "every broadcast", || {
                casts.iter().all(|c| c.3.subscribers() > 0)
            })
            .await;
            let mut buf = vec![0u8; card.max_frame_len()];
            let tick = Duration::from_micros(1_000_000 / u64::from(FPS));
            let start = Instant::now();
            let mut n = 0u32;
            for _ in 0..groups {
                let mut open: Vec<_> = casts
                    .iter_mut()
                    .map(|c| c.3.append_group().unwrap())
                    .collect();
                for _ in 0..per_group {
                    let pts = card.pts_us(u64::from(n));
                    let frame = card.frame(n, pts, &mut buf).unwrap();
                    for g in &mut open {
                        g.write_frame(pts, frame).await.unwrap();
                    }
                    n += 1;
                    monoio::time::sleep_until(monoio::time::Instant::from_std(start + tick * n))
                        .await;
                }
                for g in open {
                    g.finish().unwrap();
                }
            }
            for (_, cat, g, video) in casts {
                video.finish();
                let _ = g.finish();
                cat.finish();
            }
            flush_and_close(&client).await;
            n
        })
        .expect("cameras runtime")
    })
}

#[test]
fn records_more_broadcasts_than_one_client_session_holds() {
    let dir = scratch("many");
    let d = dir.to_str().unwrap();
    let relay = recording_relay(d, 1, &[]);
    // 20 broadcasts: more than one recorder client's session holds (its
    // announce requests and subscriptions), so the recorder dials several.
    let count = 20;
    let cams: Vec<_> = (0..count)
        .step_by(4)
        .map(|i| many_cameras(relay.addr, i..i + 4, 3, 5))
        .collect();
    for cam in cams {
        assert_eq!(cam.join().unwrap(), 15);
    }
    let json = wait_recordings(relay.addr, |j| {
        (0..count).all(|i| ended(j, &format!("anon/many-{i}.hang")))
    });
    for i in 0..count {
        let b = format!("anon/many-{i}.hang");
        assert_eq!(segments_of(&json, &b, "video"), 3, "{b}: {json}");
        assert_eq!(check_segments(&dir, &b, false), 15, "{b}");
    }
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn groups_larger_than_the_write_queue_are_dropped_from_the_recording_only() {
    let dir = scratch("small-queue");
    let d = dir.to_str().unwrap();
    // A group of ten pictures is about 230 KB: none fits in 64 KiB.
    let relay = recording_relay(d, 1, &["--record-queue-bytes", "64KiB"]);
    let watching = viewer(relay.addr, "cam.hang");
    let cam = camera(relay.addr, "cam.hang", Some(3), 10, false, Arc::default());
    assert_eq!(cam.join().unwrap(), 30);
    let card = TestCard::new(WIDTH, HEIGHT, FPS).unwrap();
    let expect: Vec<u64> = (0..30).map(|n| card.pts_us(n)).collect();
    assert_eq!(watching.join().unwrap(), expect, "the viewer lost nothing");
    wait_metric(&relay, "skiff_relay_record_groups_dropped_total", |v| {
        v == 3
    });
    let json = wait_recordings(relay.addr, |j| ended(j, "anon/cam.hang"));
    assert_eq!(segments_of(&json, "anon/cam.hang", "video"), 0, "{json}");
    let (_, metrics) = http_get(relay.metrics, "/metrics");
    assert_eq!(
        sample(&metrics, "skiff_relay_record_groups_recorded_total"),
        Some(0)
    );
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a reader of a replay broadcast saw: the catalog's first frame and
/// the timeline's events, decoded with `skiff_archive`.
struct ReplayRead {
    catalog: serde_json::Value,
    events: Vec<Event<Record>>,
}

/// Reads `PATH/replay` through the relay at `addr` with the skiff SDK: the
/// catalog, then the timeline (from its latest group on) until `done`
/// holds for the events so far, within `secs` seconds.
fn read_replay(
    addr: SocketAddr,
    path: &'static str,
    secs: u64,
    done: impl Fn(&[Event<Record>]) -> bool + Send + 'static,
) -> std::thread::JoinHandle<ReplayRead> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (client, runner) =
                skiff_monoio::connect(&format!("tcp://{addr}/"), skiff_monoio::Config::default())
                    .unwrap();
            monoio::spawn(runner.run());
            let request = skiff_monoio::sdk::Request {
                start: skiff_monoio::sdk::Start::Latest,
                max_latency: skiff_core::time::Duration::from_secs(30),
                ..skiff_monoio::sdk::Request::LIVE
            };
            let replay = format!("{path}/replay");
            let deadline = Instant::now() + Duration::from_secs(secs);
            let within = |what: &'static str| async move {
                monoio::time::sleep_until(monoio::time::Instant::from_std(deadline)).await;
                what
            };
            let catalog = monoio::select! {
                c = async {
                    let mut t = client.subscribe(&replay, hang::CATALOG_TRACK, request).await.unwrap();
                    let mut g = t.next_group().await.unwrap().unwrap();
                    g.read_frame().await.unwrap().unwrap().payload.to_vec()
                } => c,
                what = within("the catalog") => panic!("{what} never came"),
            };
            let mut timeline = client
                .subscribe(&replay, skiff_archive::TIMELINE_TRACK, request)
                .await
                .unwrap();
            let mut decoder = Decoder::<Record>::new(DecoderConfig {
                compression: true,
                ..DecoderConfig::default()
            });
            let mut events = Vec::new();
            'read: while !done(&events) {
                let next = monoio::select! {
                    g = timeline.next_group() => g,
                    what = within("the timeline") => panic!("{what} stopped short: {events:?}"),
                };
                let Ok(Some(mut group)) = next else { break };
                decoder.start_group();
                loop {
                    let frame = monoio::select! {
                        f = group.read_frame() => f,
                        what = within("the timeline") => panic!("{what} stopped short: {events:?}"),
                    };
                    let Ok(Some(frame)) = frame else { break };
                    events.extend(decoder.decode(&frame.payload.to_vec()).unwrap());
                    if done(&events) {
                        break 'read;
                    }
                }
            }
            client.close().await;
            ReplayRead {
                catalog: serde_json::from_slice(&catalog).unwrap(),
                events,
            }
        })
        .expect("replay reader runtime")
    })
}

fn pushed(events: &[Event<Record>]) -> Vec<&Record> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Push { value, .. } => Some(value),
            _ => None,
        })
        .collect()
}

fn popped(events: &[Event<Record>]) -> u64 {
    events
        .iter()
        .map(|e| match e {
            Event::Pop(r) => r.end - r.start,
            _ => 0,
        })
        .sum()
}

/// Checks `records` against every segment line the index of `broadcast`
/// ever held: consecutive segments, rising content time, the video group
/// stored for each and the audio groups that start in its span.
fn check_timeline(dir: &Path, broadcast: &str, records: &[&Record]) {
    let text = std::fs::read(
        store::open(dir, broadcast)
            .unwrap()
            .unwrap()
            .dir
            .join(index::INDEX_FILE),
    )
    .unwrap();
    let lines = index::parse(&text).records;
    let segments = |track: &str| -> Vec<index::Segment> {
        lines
            .iter()
            .filter_map(|r| match r {
                index::Record::Segment(s) if s.track == track => Some(s.clone()),
                _ => None,
            })
            .collect()
    };
    let (video, audio) = (segments("video"), segments("audio"));
    for (i, r) in records.iter().enumerate() {
        if i > 0 {
            assert_eq!(r.segment, records[i - 1].segment + 1, "consecutive");
            assert!(r.pts > records[i - 1].pts, "rising");
        }
        let s = video
            .iter()
            .find(|s| s.number == r.segment)
            .expect("an indexed segment");
        assert_eq!(r.pts, s.start_us / 1000);
        assert_eq!(r.pts + r.duration, (s.start_us + s.duration_us) / 1000);
        assert_eq!(
            r.tracks["video"],
            [skiff_archive::Range::new(s.group, s.group)]
        );
        let end = s.start_us + s.duration_us;
        let groups: Vec<u64> = audio
            .iter()
            .filter(|a| a.start_us >= s.start_us && a.start_us < end)
            .map(|a| a.group)
            .collect();
        let named: Vec<u64> = r
            .tracks
            .get("audio")
            .into_iter()
            .flatten()
            .flat_map(|g| g.start..=g.end)
            .collect();
        assert_eq!(named, groups, "segment {}", r.segment);
        assert_eq!(named.is_empty(), audio.is_empty());
    }
}

#[test]
fn serves_each_recording_back_as_a_replay_with_its_timeline() {
    let dir = scratch("replay");
    let d = dir.to_str().unwrap();
    // Segments older than 8 s are deleted: the timeline pops them.
    let relay = recording_relay(d, 1, &["--record-retain", "8s"]);
    let groups = 10u32;
    // A reader following the replay from its start sees every segment
    // pushed, then every one popped once retention deleted it.
    let follower = read_replay(relay.addr, "anon/cam.hang", 60, move |e| {
        popped(e) >= u64::from(groups)
    });
    let cam = camera(
        relay.addr,
        "cam.hang",
        Some(groups),
        FPS,
        true,
        Arc::default(),
    );
    assert_eq!(cam.join().unwrap(), groups * FPS);
    wait_recordings(relay.addr, |j| ended(j, "anon/cam.hang"));
    // After the camera stopped, a new reader gets the window from the
    // latest group's header: the newest segment and those before it that
    // retention still keeps.
    let late = read_replay(relay.addr, "anon/cam.hang", 20, |e| {
        pushed(e).last().is_some_and(|r| r.segment == 9)
    })
    .join()
    .unwrap();
    let records = pushed(&late.events);
    assert!(!records.is_empty());
    check_timeline(&dir, "anon/cam.hang", &records);
    assert_eq!(
        late.catalog["archive"],
        serde_json::json!({
            "track": "timeline.z",
            "timescale": 1000,
            "durationMax": late.catalog["archive"]["durationMax"],
            "replay": "./replay",
        })
    );
    // One-second groups, in whole ms rounded down at both ends.
    assert!(late.catalog["archive"]["durationMax"].as_u64().unwrap() >= 999);
    assert!(late.catalog["video"]["renditions"]["video"].is_object());

    let follow = follower.join().unwrap();
    // A record's window index is its segment number.
    for e in &follow.events {
        if let Event::Push { index, value } = e {
            assert_eq!(*index, value.segment);
        }
    }
    let records = pushed(&follow.events);
    let numbers: Vec<u64> = records.iter().map(|r| r.segment).collect();
    assert_eq!(numbers, (0..u64::from(groups)).collect::<Vec<_>>());
    check_timeline(&dir, "anon/cam.hang", &records);
    assert_eq!(popped(&follow.events), u64::from(groups));
    assert!(!follow.events.iter().any(|e| matches!(e, Event::Skip(_))));
    // Nothing stored any more: the replay is unannounced.
    wait_metric(&relay, "skiff_relay_record_replays", |v| v == 0);
    // The replay broadcast was never recorded itself.
    let json = wait_recordings(relay.addr, |_| true);
    let listed: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["broadcast"].as_str())
        .collect();
    assert_eq!(listed, ["anon/cam.hang"]);
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restarted_relay_replays_the_newest_ended_recordings_up_to_its_limit() {
    let dir = scratch("replay-restart");
    let d = dir.to_str().unwrap();
    let relay = recording_relay(d, 1, &[]);
    for name in ["old.hang", "new.hang"] {
        let cam = camera(relay.addr, name, Some(3), FPS, false, Arc::default());
        assert_eq!(cam.join().unwrap(), 3 * FPS);
        wait_recordings(relay.addr, |j| ended(j, &format!("anon/{name}")));
    }
    wait_metric(&relay, "skiff_relay_record_replays", |v| v == 2);
    drop(relay);
    // Retention's deletion of new.hang's first segment, as the writer
    // records it: its index line, then the file gone.
    let stored = store::open(&dir, "anon/new.hang").unwrap().unwrap();
    let gone = stored.segments("video").next().unwrap().clone();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(stored.dir.join(index::INDEX_FILE))
        .unwrap();
    let delete = index::Record::Delete {
        track: "video".into(),
        number: gone.number,
    };
    std::io::Write::write_all(&mut log, delete.line().as_bytes()).unwrap();
    std::fs::remove_file(stored.segment_path(&gone)).unwrap();
    // The same directory, nothing recorded any more, one replay at most:
    // the newest recording is served (what is left of it), the other is
    // over the limit.
    let relay =
        RelayProcess::start_threads(binary(), 1, &["--record-dir", d, "--record-replays", "1"]);
    wait_metric(&relay, "skiff_relay_record_replays", |v| v == 1);
    wait_metric(&relay, "skiff_relay_record_replays_over_limit", |v| v == 1);
    let read = read_replay(relay.addr, "anon/new.hang", 20, |e| pushed(e).len() == 2)
        .join()
        .unwrap();
    // Segments 1 and 2, at window indices 1 and 2: a record's index is its
    // segment number, whatever the relay's restarts.
    let indexed: Vec<(u64, u64)> = read
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Push { index, value } => Some((*index, value.segment)),
            _ => None,
        })
        .collect();
    assert_eq!(indexed, [(1, 1), (2, 2)]);
    let records = pushed(&read.events);
    check_timeline(&dir, "anon/new.hang", &records);
    assert_eq!(read.catalog["archive"]["replay"], "./replay");
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A FETCH (docs/protocol.md §3.10) for a group the relay's cache let go
/// long ago is answered from the recording: the SDK reads the stored
/// segment's frames back as the hang frames the camera published (its
/// presentation time as a varint, then the access unit), with the
/// presentation times as timestamps; a group never recorded is not found.
#[test]
fn a_group_gone_from_the_cache_is_fetched_from_the_recording() {
    let dir = scratch("fetch");
    let relay = recording_relay(dir.to_str().unwrap(), 1, &[]);
    let addr = relay.addr;
    let stop = Arc::new(AtomicBool::new(false));
    // Groups of 3 frames, ten a second: a relay track holds 32 groups
    // (`skiff_monoio::tables::GROUPS`), so group 1 left the cache once 45
    // are recorded.
    let cam = camera(addr, "cam.hang", None, 3, false, stop.clone());
    wait_recordings(addr, |j| segments_of(j, "anon/cam.hang", "video") >= 45);
    let stored = store::open(&dir, "anon/cam.hang")
        .unwrap()
        .expect("recorded");
    let segment = stored
        .segments("video")
        .find(|s| s.group == 1)
        .expect("group 1 recorded")
        .clone();
    let bytes = std::fs::read(stored.segment_path(&segment)).unwrap();
    let want: Vec<(u64, Vec<u8>)> = skiff_relay::record::fmp4::segment_samples(&bytes)
        .unwrap()
        .into_iter()
        .map(|s| {
            let mut p = [0u8; 10];
            let n = hang::frame::encode_prefix(s.pts_us, &mut p).unwrap();
            let mut payload = p[..n].to_vec();
            payload.extend_from_slice(&s.data);
            (s.pts_us, payload)
        })
        .collect();
    assert_eq!(want.len(), 3);
    // `X/replay` names the recording of `X` (its publisher, which the SDK's
    // TRACK request needs, is not part of this test: read it directly).
    assert_eq!(
        skiff_relay::record::fetch::read_group(&dir, "anon/cam.hang/replay", "video", 1),
        Ok(want.clone())
    );

    let url = format!("tcp://{addr}/anon");
    let (fetched, missing) = driver::block_on(DriverKind::Legacy, move |_| async move {
        let (client, runner) =
            skiff_monoio::connect(&url, skiff_monoio::Config::default()).unwrap();
        monoio::spawn(runner.run());
        let mut frames = Vec::new();
        let mut group = client.fetch("cam.hang", "video", 1).await.expect("fetch");
        while let Some(f) = group.read_frame().await.expect("read") {
            frames.push((f.timestamp, f.payload.to_vec()));
        }
        drop(group);
        let missing = client.fetch("cam.hang", "video", 1_000_000).await.err();
        client.close().await;
        (frames, missing)
    })
    .expect("runtime");
    stop.store(true, Ordering::SeqCst);
    cam.join().unwrap();
    assert_eq!(fetched, want);
    assert!(
        matches!(missing, Some(skiff_monoio::Error::NotFound)),
        "{missing:?}"
    );
}
