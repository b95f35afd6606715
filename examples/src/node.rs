//! The host camera node: [`crate::camera`]'s capture and encoder, published
//! through a relay with the monoio client ([`skiff_monoio::client`]).
//!
//! One broadcast with one track; every `1 / fps` a frame is captured, encoded
//! and written to the track, a new group every [`Format::gop`] frames (its key
//! frame first). The publisher session dials the relay and redials with
//! backoff when it drops; frames keep being produced meanwhile (the track's
//! ring evicts the oldest groups). The picture, the encoder's payload and the
//! track's blocks are all sized once: the frame loop does not allocate.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use skiff_core::model::track::GroupProducer;
use skiff_monoio::client::{self, ClientCtx, Publisher};

use crate::camera::{Capture, Encoder, Format};

/// What the node publishes and where.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The relay, `tcp://HOST:PORT/PATH`.
    pub url: String,
    /// The broadcast path.
    pub broadcast: String,
    /// The track name.
    pub track: String,
    /// Picture, rate and group length.
    pub format: Format,
    /// Stop after this many frames captured (`None`: run until stopped).
    pub frames: Option<u64>,
}

/// Counters of a node's run, reported once a second and at the end.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// Seconds since the node started.
    pub elapsed: f64,
    /// Frames published.
    pub frames: u64,
    /// Groups started.
    pub groups: u64,
    /// Payload bytes published.
    pub bytes: u64,
    /// Size of the last key frame.
    pub last_key: usize,
    /// Size of the last delta frame.
    pub last_delta: usize,
    /// Frames dropped because the track refused them.
    pub dropped: u64,
    /// True while the publisher session is set up with the relay.
    pub connected: bool,
    /// Publisher sessions started (1 + redials).
    pub sessions: u64,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.max(1e-9);
        write!(
            f,
            "t={:.1}s frames={} groups={} {:.1} fps {:.1} kbit/s key={} B delta={} B dropped={} relay={}",
            self.elapsed,
            self.frames,
            self.groups,
            self.frames as f64 / secs,
            self.bytes as f64 * 8.0 / 1e3 / secs,
            self.last_key,
            self.last_delta,
            self.dropped,
            if self.connected { "up" } else { "down" }
        )
    }
}

/// Runs the camera node on the current monoio runtime until `opts.frames`
/// frames are published or `stop` is set; calls `report` about once a second
/// and returns the final counters.
///
/// The publisher session runs in its own task and redials (1 s, doubling to
/// 8 s) whenever it ends.
pub async fn run(
    opts: NodeOptions,
    stop: Arc<AtomicBool>,
    mut report: impl FnMut(&Progress),
) -> Progress {
    let format = opts.format;
    // Room for a few seconds of worst-case frames (the track's ring evicts older groups).
    let pool = (format.max_payload() as u64 * u64::from(format.gop) * 4).max(4 << 20);
    let ctx = Rc::new(ClientCtx::new(pool));
    let notify = ctx.notify().clone();
    let (origin, producer) = ctx.publication(&opts.broadcast, &opts.track);
    let mut app = Publisher::default();
    // Set by the publisher app once a session is set up, cleared here when it ends.
    let connected = app.ready.clone();
    let sessions = Rc::new(Cell::new(0u64));
    let done = Rc::new(Cell::new(false));
    {
        let (ctx, url, connected, sessions, done) = (
            ctx.clone(),
            opts.url.clone(),
            connected.clone(),
            sessions.clone(),
            done.clone(),
        );
        monoio::spawn(async move {
            let mut backoff = Duration::from_secs(1);
            while !done.get() {
                sessions.set(sessions.get() + 1);
                let end = client::run(&url, Some(origin), &mut app, &ctx).await;
                let was_up = connected.replace(false);
                if done.get() {
                    break;
                }
                if was_up {
                    backoff = Duration::from_secs(1);
                }
                match end {
                    Ok(e) => {
                        eprintln!("camera: relay session ended ({e:?}); redialing in {backoff:?}")
                    }
                    Err(e) => eprintln!("camera: relay {url}: {e}; redialing in {backoff:?}"),
                }
                monoio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(8));
            }
        });
    }

    let mut capture = Capture::new(format);
    let mut encoder = Encoder::new(format);
    let mut progress = Progress::default();
    let start = Instant::now();
    let mut next_report = start + Duration::from_secs(1);
    let mut group: Option<GroupProducer<'static, 'static>> = None;
    while !stop.load(Ordering::Relaxed)
        && opts
            .frames
            .is_none_or(|f| progress.frames + progress.dropped < f)
    {
        let (n, picture) = capture.capture();
        let payload = match encoder.encode(n, picture) {
            Ok(p) => p,
            Err(e) => unreachable!("the capture matches the encoder's format: {e}"),
        };
        if format.is_key(n) {
            if let Some(mut g) = group.take() {
                let _ = g.finish();
            }
            match producer.create_group(format.group(n)) {
                Ok(g) => {
                    group = Some(g);
                    progress.groups += 1;
                }
                Err(e) => eprintln!("camera: group {}: {e}", format.group(n)),
            }
        }
        let written = match group.as_mut() {
            Some(g) => g.write_frame(format.timestamp_ms(n), payload),
            None => Ok(()),
        };
        match (written, group.is_some()) {
            (Ok(()), true) => {
                progress.frames += 1;
                progress.bytes += payload.len() as u64;
                if format.is_key(n) {
                    progress.last_key = payload.len();
                } else {
                    progress.last_delta = payload.len();
                }
            }
            (Ok(()), false) => progress.dropped += 1,
            (Err(e), _) => {
                // The group is unusable (evicted, pool full): drop it, the next key frame
                // starts a new one.
                progress.dropped += 1;
                if progress.dropped.is_power_of_two() {
                    eprintln!("camera: frame {n}: {e} ({} dropped)", progress.dropped);
                }
                group = None;
            }
        }
        notify.bump();
        let now = Instant::now();
        if now >= next_report {
            next_report += Duration::from_secs(1);
            progress.elapsed = now.duration_since(start).as_secs_f64();
            progress.connected = connected.get();
            progress.sessions = sessions.get();
            report(&progress);
        }
        // Paced from the start (no drift): frame n + 1 is due at (n + 1) / fps.
        let due = start
            + Duration::from_nanos((n + 1).saturating_mul(1_000_000_000) / u64::from(format.fps));
        monoio::time::sleep_until(monoio::time::Instant::from_std(due)).await;
    }
    if let Some(mut g) = group.take() {
        let _ = g.finish();
    }
    let mut producer = producer;
    producer.finish();
    notify.bump();
    // Let the end of the track reach the relay, then close the session.
    monoio::time::sleep(Duration::from_millis(200)).await;
    done.set(true);
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    progress.elapsed = start.elapsed().as_secs_f64();
    progress.connected = connected.get();
    progress.sessions = sessions.get();
    progress
}
