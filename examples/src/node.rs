//! The host camera node: [`crate::camera`]'s capture and encoder, published
//! through a relay with the monoio client SDK ([`skiff_monoio::connect`]).
//!
//! One broadcast with one track; every `1 / fps` a frame is captured, encoded
//! and written to the track, a new group every [`Format::gop`] frames (its key
//! frame first). The client's [`Runner`](skiff_monoio::Runner) dials the relay
//! and redials with backoff (1 s, doubling to 8 s) when the connection drops;
//! frames keep being produced meanwhile (the track's cache evicts the oldest
//! groups). The picture, the encoder's payload and the pool blocks are all
//! sized once: the frame loop does not allocate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use skiff_core::model::track;
use skiff_monoio::sdk::GroupProducer;
use skiff_monoio::{Client, Config, Error, connect};

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
    /// Publisher sessions set up with the relay (1 + reconnections).
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

/// How long the node waits, at the end, for the relay to read the track's end.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The client configuration of a node publishing `format`.
pub fn client_config(format: Format) -> Config {
    let mut config = Config::default();
    // Room for a few groups of worst-case frames (the track keeps a quarter of
    // the pool cached and evicts older groups).
    config.pool_bytes = (format.max_payload() as u64 * u64::from(format.gop) * 4).max(4 << 20);
    config.backoff_min = Duration::from_secs(1);
    config.backoff_max = Duration::from_secs(8);
    config
}

/// Runs the camera node on the current monoio runtime until `opts.frames`
/// frames are published or `stop` is set; calls `report` about once a second
/// and returns the final counters.
///
/// The client's runner is spawned here and redials (1 s, doubling to 8 s)
/// whenever the connection ends; the node says on stderr when the relay goes
/// down and comes back.
///
/// # Errors
/// [`Error::InvalidUrl`] for a URL that is not `tcp://host:port[/path]`,
/// [`Error::InvalidName`] for a bad broadcast path or track name.
pub async fn run(
    opts: NodeOptions,
    stop: Arc<AtomicBool>,
    mut report: impl FnMut(&Progress),
) -> Result<Progress, Error> {
    let format = opts.format;
    let (client, runner) = connect(&opts.url, client_config(format))?;
    let runner = monoio::spawn(runner.run());
    let info = track::Info::new(&opts.track).map_err(|_| Error::InvalidName(opts.track.clone()))?;
    let broadcast = client.publish(&opts.broadcast)?;
    let mut track = broadcast.create_track(info)?;

    let mut capture = Capture::new(format);
    let mut encoder = Encoder::new(format);
    let mut progress = Progress::default();
    let mut link = Link::default();
    let start = Instant::now();
    let mut next_report = start + Duration::from_secs(1);
    let mut group: Option<GroupProducer> = None;
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
            if let Some(g) = group.take() {
                let _ = g.finish();
            }
            // The track's groups are appended one per key frame, so group
            // `format.group(n)` is the track's group of that sequence.
            match track.append_group() {
                Ok(g) => {
                    group = Some(g);
                    progress.groups += 1;
                }
                Err(e) => eprintln!("camera: group {}: {e}", format.group(n)),
            }
        }
        let written = match group.as_mut() {
            Some(g) => Some(g.write_frame(format.timestamp_ms(n), payload).await),
            None => None,
        };
        match written {
            Some(Ok(())) => {
                progress.frames += 1;
                progress.bytes += payload.len() as u64;
                if format.is_key(n) {
                    progress.last_key = payload.len();
                } else {
                    progress.last_delta = payload.len();
                }
            }
            None => progress.dropped += 1,
            Some(Err(e)) => {
                // The group is unusable: drop it, the next key frame starts a new one.
                progress.dropped += 1;
                if progress.dropped.is_power_of_two() {
                    eprintln!("camera: frame {n}: {e} ({} dropped)", progress.dropped);
                }
                group = None;
            }
        }
        link.follow(&client, &opts.url);
        let now = Instant::now();
        if now >= next_report {
            next_report += Duration::from_secs(1);
            progress.elapsed = now.duration_since(start).as_secs_f64();
            progress.connected = client.is_connected();
            progress.sessions = client.sessions();
            report(&progress);
        }
        // Paced from the start (no drift): frame n + 1 is due at (n + 1) / fps.
        let due = start
            + Duration::from_nanos((n + 1).saturating_mul(1_000_000_000) / u64::from(format.fps));
        monoio::time::sleep_until(monoio::time::Instant::from_std(due)).await;
    }
    if let Some(g) = group.take() {
        let _ = g.finish();
    }
    track.finish();
    // Let the end of the track reach the relay (a relay that is down gets nothing).
    monoio::select! {
        () = client.flushed() => {}
        () = monoio::time::sleep(FLUSH_TIMEOUT) => {}
    }
    progress.elapsed = start.elapsed().as_secs_f64();
    progress.connected = client.is_connected();
    progress.sessions = client.sessions();
    client.close().await;
    runner.await;
    drop(broadcast);
    Ok(progress)
}

/// What the node last saw of the connection, to say when it changes.
#[derive(Debug, Default)]
struct Link {
    /// Connected at the last look.
    up: bool,
    /// Sessions at the last look.
    sessions: u64,
}

impl Link {
    /// Prints a line on stderr when the relay went down or a new session came up.
    fn follow(&mut self, client: &Client, url: &str) {
        let (up, sessions) = (client.is_connected(), client.sessions());
        if self.up && (!up || sessions != self.sessions) {
            eprintln!("camera: relay {url} went away; redialing with backoff");
        }
        if up && sessions != self.sessions && sessions > 1 {
            eprintln!("camera: relay {url} is back (session {sessions})");
        }
        self.up = up;
        self.sessions = sessions;
    }
}
