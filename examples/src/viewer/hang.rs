//! The viewer's hang mode: catalog, H.264 decoding, continuity, stamps or the
//! test card, PNG output.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use openh264::formats::YUVSource;
use skiff_core::hang::ipcm::Plane;
use skiff_core::hang::testcard::TestCard;
use skiff_core::hang::{self as core_hang, avc, frame};
use skiff_core::wire::lite::StreamCode;
use skiff_media::catalog::{Catalog, VideoConfig};
use skiff_media::h264::Decoder;
use skiff_media::node::wall_clock_us;
use skiff_media::pattern;
use skiff_media::png_out::write_png;
use skiff_monoio::sdk::{GroupConsumer, Request};
use skiff_monoio::{Client, Error};

use super::Args;

/// Running counters of good frames.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) frames: u64,
    bytes: u64,
    first: Option<Instant>,
    stamped: u64,
    latency_sum_ms: f64,
    latency_max_ms: f64,
    pub(super) skipped: u64,
}

impl Stats {
    fn line(&self) -> String {
        let secs = self
            .first
            .map_or(0.0, |t| t.elapsed().as_secs_f64())
            .max(1e-9);
        let latency = if self.stamped > 0 {
            format!(
                "latency {:.1} ms avg {:.1} ms max",
                self.latency_sum_ms / self.stamped as f64,
                self.latency_max_ms
            )
        } else {
            "latency n/a (no stamp)".into()
        };
        format!(
            "{} frames, {:.1} fps, {:.3} Mbit/s, {latency}, {} groups skipped at the live edge",
            self.frames,
            self.frames as f64 / secs,
            self.bytes as f64 * 8.0 / 1e6 / secs,
            self.skipped
        )
    }
}

/// A pause between good frames longer than this (seconds) counts as an outage.
const GAP_SECS: f64 = 1.0;

/// Good frames the last of `--recoveries` must be followed by (the first included).
const RECOVERED_FRAMES: u64 = 15;

/// The video rendition the viewer reads: its track name and configuration.
pub(super) struct Rendition {
    /// The track's name.
    pub(super) name: String,
    /// Its catalog entry.
    pub(super) config: VideoConfig,
}

/// Reads the first catalog of `broadcast` and picks its H.264 rendition
/// (`--track`, or the first `avc1`/`avc3` one); also returns the catalog's JSON.
pub(super) async fn rendition(
    args: &Args,
    client: &Client,
    broadcast: &str,
    started: Instant,
) -> Result<(Rendition, Vec<u8>), String> {
    let mut catalog_track = client
        .subscribe(broadcast, core_hang::CATALOG_TRACK, Request::LIVE)
        .await
        .map_err(|e| format!("catalog subscription failed: {e}"))?;
    let json = loop {
        let mut g = match catalog_track.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => return Err("catalog track finished before a catalog".into()),
            Err(e) => return Err(format!("catalog: {e}")),
        };
        if let Ok(Some(f)) = g.read_frame().await {
            break f.payload.to_vec();
        }
    };
    let catalog = Catalog::parse(&json).map_err(|e| format!("corrupt catalog: {e}"))?;
    let (name, config) = match &args.track {
        Some(t) => catalog
            .video
            .renditions
            .get_key_value(t)
            .ok_or_else(|| format!("catalog has no video rendition {t:?}"))?,
        None => catalog
            .video
            .renditions
            .iter()
            .find(|(_, c)| c.codec.starts_with("avc1") || c.codec.starts_with("avc3"))
            .ok_or("catalog has no H.264 video rendition")?,
    };
    if config.container.kind != "legacy" {
        return Err(format!(
            "container {:?} is not supported",
            config.container.kind
        ));
    }
    println!(
        "viewer: catalog: {name}: {} {}x{} {} fps, {} bit/s ({:.1} s)",
        config.codec,
        config.coded_width.unwrap_or(0),
        config.coded_height.unwrap_or(0),
        config.framerate.unwrap_or(0.0),
        config.bitrate.unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    let rendition = Rendition {
        name: name.clone(),
        config: config.clone(),
    };
    Ok((rendition, json))
}

/// Reads the catalog, then decodes and checks video frames until `args.frames` good ones.
pub async fn read(
    args: &Args,
    client: &Client,
    intact: &AtomicU64,
    started: Instant,
) -> Result<(), String> {
    if let Some(back) = args.from {
        return super::rewind::read(args, client, back, intact, started).await;
    }
    let (rendition, _) = rendition(args, client, &args.broadcast, started).await?;
    let mut checker = Checker::new(args, &rendition, intact, started)?;
    let name = &rendition.name;
    let mut track = client
        .subscribe(&args.broadcast, name, Request::LIVE)
        .await
        .map_err(|e| format!("subscription to {name} failed: {e}"))?;
    let mut first_group = None;
    loop {
        let mut group = match track.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => {
                return Err(format!(
                    "track finished after {} frames",
                    checker.stats.frames
                ));
            }
            Err(e) => return Err(format!("{e} after {} frames", checker.stats.frames)),
        };
        let seq = group.sequence();
        if first_group.is_none() {
            println!(
                "viewer: subscribed to {name}, first group {seq} ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
            first_group = Some(seq);
        } else {
            checker.stats.skipped += group.skipped();
        }
        if checker
            .group(&mut group, first_group.unwrap_or(seq))
            .await?
        {
            return Ok(());
        }
    }
}

/// The checks every frame of the hang track goes through, and their running state.
pub(super) struct Checker<'a> {
    args: &'a Args,
    intact: &'a AtomicU64,
    started: Instant,
    codec: String,
    decoder: Decoder,
    /// The catalog's coded width and height, when it gives them.
    size: (Option<usize>, Option<usize>),
    card: Option<TestCard>,
    pub(super) stats: Stats,
    /// One frame's payload in one piece.
    bytes: Vec<u8>,
    rgb: Vec<u8>,
    last_pts: Option<u64>,
    last_stamp: Option<u32>,
    /// Whether this camera stamps its pictures (decided by the first one).
    stamps: Option<bool>,
    /// Stamps must rise by exactly one (a rewind's promise of no gap).
    pub(super) consecutive: bool,
    /// The first stamp read: its capture time tells how far back a rewind started.
    pub(super) first_stamp: Option<pattern::Stamp>,
    last_counter: Option<u32>,
    counter_gaps: u64,
    last_good: Option<Instant>,
    recoveries: u64,
    since_recovery: u64,
}

impl<'a> Checker<'a> {
    /// A checker for `rendition`'s frames.
    pub(super) fn new(
        args: &'a Args,
        rendition: &Rendition,
        intact: &'a AtomicU64,
        started: Instant,
    ) -> Result<Self, String> {
        let config = &rendition.config;
        let mut decoder = Decoder::new().map_err(|e| e.to_string())?;
        if let Some(d) = &config.description {
            decoder
                .configure(d)
                .map_err(|e| format!("corrupt catalog description: {e}"))?;
        }
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir).map_err(|e| format!("--out {}: {e}", dir.display()))?;
        }
        let card = match args.expect_ipcm_pattern {
            true => Some(test_card(config)?),
            false => None,
        };
        Ok(Self {
            args,
            intact,
            started,
            codec: config.codec.clone(),
            decoder,
            size: (
                config.coded_width.map(|w| w as usize),
                config.coded_height.map(|h| h as usize),
            ),
            card,
            stats: Stats::default(),
            bytes: Vec::new(),
            rgb: Vec::new(),
            last_pts: None,
            last_stamp: None,
            stamps: None,
            consecutive: false,
            first_stamp: None,
            last_counter: None,
            counter_gaps: 0,
            last_good: None,
            recoveries: 0,
            since_recovery: 0,
        })
    }

    /// Checks every frame of `group`; true once the run is done (`--frames`
    /// good frames, and `--recoveries` seen). `first_group` is only for the
    /// final line.
    pub(super) async fn group(
        &mut self,
        group: &mut GroupConsumer,
        first_group: u64,
    ) -> Result<bool, String> {
        let seq = group.sequence();
        let mut index = 0u64;
        loop {
            let f = match group.read_frame().await {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(false),
                // The relay gave up the group as superseded (OLD, docs/protocol.md
                // §4.7: it ages out non-latest groups past the subscriber's max
                // latency, zero here): a skip at the live edge, not a hole; the
                // next group starts with a key frame.
                Err(Error::Aborted(code)) if code == StreamCode::Old.to_code() => {
                    self.stats.skipped += 1;
                    return Ok(false);
                }
                Err(e @ (Error::Evicted | Error::Aborted(_))) if index > 0 => {
                    return Err(format!(
                        "lost frame: group {seq} ended after {index} frames: {e}"
                    ));
                }
                // A group that never started for us: read on with the next one.
                Err(Error::Evicted | Error::Aborted(_)) => return Ok(false),
                Err(e) => return Err(format!("{e} after {} frames", self.stats.frames)),
            };
            self.bytes.clear();
            f.payload
                .chunks()
                .for_each(|c| self.bytes.extend_from_slice(c));
            let at = format!("frame {index} of group {seq}");
            self.frame(&at, index, f.timestamp)?;
            index += 1;
            if self.done() {
                self.pass(first_group, seq);
                return Ok(true);
            }
        }
    }

    /// Checks the frame in `self.bytes`, frame `index` of its group, with
    /// FRAME timestamp `timestamp`.
    fn frame(&mut self, at: &str, index: u64, timestamp: u64) -> Result<(), String> {
        let (pts, au) =
            frame::decode(&self.bytes).map_err(|e| format!("corrupt frame: {at}: {e}"))?;
        if pts != timestamp {
            return Err(format!(
                "corrupt frame: {at}: prefix time {pts} µs, FRAME timestamp {timestamp}"
            ));
        }
        if self.last_pts.is_some_and(|l| pts <= l) {
            return Err(format!(
                "corrupt frame: {at}: time {pts} µs after {} µs",
                self.last_pts.unwrap_or(0)
            ));
        }
        let key = avc::LengthPrefixed::new(au)
            .flatten()
            .any(|n| avc::nal_type(n[0]) == avc::NAL_IDR);
        if index == 0 && !key {
            return Err(format!(
                "corrupt frame: {at}: a group must start with a keyframe"
            ));
        }
        let yuv = self
            .decoder
            .decode(au)
            .map_err(|e| format!("corrupt frame: {at}: {e}"))?
            .ok_or_else(|| format!("corrupt frame: {at}: decodes to no picture"))?;
        let (w, h) = yuv.dimensions();
        if self.size.0.is_some_and(|cw| cw != w) || self.size.1.is_some_and(|ch| ch != h) {
            return Err(format!(
                "corrupt frame: {at}: {w}x{h}, the catalog says {:?}",
                self.size
            ));
        }
        let (stride, _, _) = yuv.strides();
        if let Some(card) = &self.card {
            let n = check_test_card(card, &yuv, pts)
                .map_err(|e| format!("corrupt frame: {at}: {e}"))?;
            if let Some(l) = self.last_counter {
                if n <= l {
                    return Err(format!("corrupt frame: {at}: counter {n} after {l}"));
                }
                self.counter_gaps += u64::from(n - l - 1);
            }
            self.last_counter = Some(n);
        }
        let stamp = match self.card {
            Some(_) => None,
            None => pattern::read_stamp(yuv.y(), stride, w, h),
        };
        // The first picture decides whether this camera stamps its frames.
        let stamped = *self.stamps.get_or_insert(stamp.is_some());
        if stamped {
            let s = stamp.ok_or_else(|| format!("corrupt frame: {at}: stamp unreadable"))?;
            if let Some(l) = self.last_stamp
                && (s.frame <= l || (self.consecutive && s.frame != l + 1))
            {
                return Err(format!(
                    "corrupt frame: {at}: stamp frame {} after {l}",
                    s.frame
                ));
            }
            self.last_stamp = Some(s.frame);
            self.first_stamp.get_or_insert(s);
            let ms = wall_clock_us().saturating_sub(s.time_us) as f64 / 1e3;
            self.stats.stamped += 1;
            self.stats.latency_sum_ms += ms;
            self.stats.latency_max_ms = self.stats.latency_max_ms.max(ms);
        }
        if let Some(dir) = &self.args.out {
            let path = dir.join(format!("frame-{:06}.png", self.stats.frames));
            write_png(&path, &yuv, &mut self.rgb)
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        let now = Instant::now();
        if let Some(gap) = self
            .last_good
            .map(|t| now - t)
            .filter(|g| g.as_secs_f64() > GAP_SECS)
        {
            self.recoveries += 1;
            self.since_recovery = 0;
            println!(
                "viewer: recovery {}: frames again after a {:.2} s gap ({at}, {:.1} s)",
                self.recoveries,
                gap.as_secs_f64(),
                self.started.elapsed().as_secs_f64()
            );
        }
        self.last_good = Some(now);
        self.since_recovery += 1;
        self.last_pts = Some(pts);
        self.stats.first.get_or_insert_with(Instant::now);
        self.stats.frames += 1;
        self.stats.bytes += self.bytes.len() as u64;
        self.intact.store(self.stats.frames, Ordering::Relaxed);
        if self.stats.frames.is_multiple_of(30) {
            println!("viewer: {}", self.stats.line());
        }
        Ok(())
    }

    /// True once `--frames` good frames arrived and `--recoveries` were seen.
    fn done(&self) -> bool {
        let recovered = self.args.recoveries == 0
            || (self.recoveries >= self.args.recoveries && self.since_recovery >= RECOVERED_FRAMES);
        self.stats.frames >= self.args.frames && recovered
    }

    /// Prints the run's result lines.
    fn pass(&self, first_group: u64, last_group: u64) {
        println!(
            "viewer: PASS: {} good frames (hang {}), groups {first_group}..={last_group}, {:.1} s",
            self.stats.frames,
            self.codec,
            self.started.elapsed().as_secs_f64()
        );
        println!("viewer: {}", self.stats.line());
        if let Some(n) = self.last_counter {
            println!(
                "viewer: test card exact in every sample, counter rising to {n} ({} frames not seen)",
                self.counter_gaps
            );
        }
    }
}

/// The test card the catalog's rendition describes (size and frame rate).
fn test_card(config: &skiff_media::catalog::VideoConfig) -> Result<TestCard, String> {
    let (Some(w), Some(h), Some(fps)) = (config.coded_width, config.coded_height, config.framerate)
    else {
        return Err(
            "--expect-ipcm-pattern: the catalog lacks codedWidth, codedHeight or framerate".into(),
        );
    };
    if fps.fract() != 0.0 || !(1.0..=1000.0).contains(&fps) {
        return Err(format!(
            "--expect-ipcm-pattern: frame rate {fps} is not a whole number of fps"
        ));
    }
    TestCard::new(w as usize, h as usize, fps as u32)
        .map_err(|e| format!("--expect-ipcm-pattern: {w}x{h} at {fps} fps: {e}"))
}

/// Checks a decoded picture against `card`: its counter must read back, every
/// sample must be the card's for that counter, and `pts` its time. Returns the counter.
fn check_test_card(card: &TestCard, yuv: &impl YUVSource, pts: u64) -> Result<u32, String> {
    let (sy, su, sv) = yuv.strides();
    let n = card
        .read_counter(yuv.y(), sy)
        .ok_or("test card counter unreadable")?;
    let g = card.geometry();
    for (plane, data, stride, sub) in [
        (Plane::Y, yuv.y(), sy, 1),
        (Plane::Cb, yuv.u(), su, 2),
        (Plane::Cr, yuv.v(), sv, 2),
    ] {
        for y in 0..g.height() / sub {
            for x in 0..g.width() / sub {
                let (got, want) = (data[y * stride + x], card.sample(plane, x, y, n));
                if got != want {
                    return Err(format!(
                        "test card {n}: {plane:?} sample ({x}, {y}) is {got}, not {want}"
                    ));
                }
            }
        }
    }
    if pts != card.pts_us(n.into()) {
        return Err(format!(
            "test card {n}: time {pts} µs, not {} µs",
            card.pts_us(n.into())
        ));
    }
    Ok(n)
}
