//! The host camera node: H.264 in moq-dev's hang format (docs/protocol.md §10),
//! published through a relay with the monoio client SDK ([`skiff_monoio::connect`]).
//!
//! One broadcast (by convention named `….hang`) with two tracks:
//!
//! * `catalog.json`: one group holding one frame, the catalog (codec string,
//!   avcC, size, rate, bitrate). The group stays open for the node's life, so
//!   a viewer joining at any time finds the catalog as the track's latest group.
//! * `video` (by default): a group per GOP, each frame a legacy container
//!   payload (`varint(pts_us)` + length-prefixed NAL units). The track's
//!   timescale is microseconds ([`hang::video_info`]), so each FRAME
//!   timestamp is the frame's `pts_us`, the same value as its prefix.
//!
//! Sources ([`Input`]): the stamped test pattern ([`skiff_media::pattern`]),
//! raw Y4M pictures, both encoded with openh264; or an Annex-B H.264 stream
//! published as it is. Pipes are read on a thread of their own, through two
//! buffers passed back and forth, so a slow pipe never stalls the session.
//!
//! The client's [`Runner`](skiff_monoio::Runner) dials the relay and redials
//! with backoff (1 s, doubling to 8 s) when the connection drops; frames keep
//! being produced meanwhile (the track's cache evicts the oldest groups).
//! Every buffer is sized once: past the first frames, the loop allocates
//! nothing outside openh264's encoder.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant, SystemTime};

use crate::annexb_input::{self, AccessUnits};
use crate::h264::{self, EncodeOptions, Encoder, Payload, StreamConfig};
use crate::pattern::{self, Stamp};
use crate::picture::Picture;
use crate::y4m_input::{self, Y4mSource};
use skiff_core::hang::{self, catalog};
use skiff_monoio::sdk::{GroupProducer, TrackProducer};
use skiff_monoio::tls::Fingerprint;
use skiff_monoio::tls::rustls::RootCertStore;
use skiff_monoio::{Client, Config, Error as SdkError, connect};

/// Where pictures come from.
pub enum Input {
    /// The stamped, moving test pattern.
    Pattern,
    /// Raw 4:2:0 pictures of a Y4M stream, encoded here.
    Y4m(Box<dyn Read + Send>),
    /// An H.264 Annex-B stream, published without re-encoding.
    H264(Box<dyn Read + Send>),
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Input::Pattern => "Pattern",
            Input::Y4m(_) => "Y4m",
            Input::H264(_) => "H264",
        })
    }
}

/// What the node publishes and where.
#[derive(Debug)]
pub struct NodeOptions {
    /// The relay, `tcp://HOST:PORT/PATH`.
    pub url: String,
    /// The broadcast path (`cam.hang`).
    pub broadcast: String,
    /// The video track's name.
    pub track: String,
    /// The source.
    pub input: Input,
    /// Picture width of the pattern (a Y4M or H.264 input has its own).
    pub width: usize,
    /// Picture height of the pattern.
    pub height: usize,
    /// Frames per second: pacing and timestamps (a Y4M header's rate wins unless `fps_forced`).
    pub fps: f64,
    /// Use `fps` even when the Y4M header states a rate.
    pub fps_forced: bool,
    /// Frames per group (the encoder's keyframe interval).
    pub gop: u32,
    /// Encoder target in bits per second.
    pub bitrate: u32,
    /// Stop after this many frames (`None`: until stopped or the input ends).
    pub frames: Option<u64>,
    /// The CAs a `tls://` or `wss://` relay's certificate must chain to
    /// (`None`: the system's trust store).
    pub tls_roots: Option<Arc<RootCertStore>>,
    /// The SHA-256 of the one certificate a `tls://` or `wss://` relay must
    /// present (a self-signed one, such as `skiff-relay --tls-generate`'s);
    /// set, it replaces `tls_roots`.
    pub tls_fingerprint: Option<Fingerprint>,
}

impl NodeOptions {
    /// The stamped test pattern, 320x240 at 30 fps, a group a second, 1 Mbit/s,
    /// as track `video` of `broadcast` on the relay at `url`, until stopped:
    /// change the fields that differ.
    pub fn pattern(url: impl Into<String>, broadcast: impl Into<String>) -> Self {
        NodeOptions {
            url: url.into(),
            broadcast: broadcast.into(),
            track: "video".into(),
            input: Input::Pattern,
            width: 320,
            height: 240,
            fps: 30.0,
            fps_forced: true,
            gop: 30,
            bitrate: 1_000_000,
            frames: None,
            tls_roots: None,
            tls_fingerprint: None,
        }
    }
}

/// Why the node could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The SDK refused the URL or a name.
    #[error("{0}")]
    Sdk(#[from] SdkError),
    /// A bad option (sizes, rates).
    #[error("{0}")]
    Options(String),
    /// The Y4M input is unusable.
    #[error("{0}")]
    Y4m(#[from] y4m_input::Error),
    /// The H.264 input is unusable.
    #[error("{0}")]
    H264Input(#[from] annexb_input::Error),
    /// The input broke after frames were published (a malformed frame, a read error).
    #[error("{0}")]
    Input(String),
    /// The encoder failed.
    #[error("{0}")]
    Encoder(#[from] h264::Error),
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
    /// Size of the last keyframe.
    pub last_key: usize,
    /// Size of the last delta frame.
    pub last_delta: usize,
    /// Frames dropped (refused by the track, or skipped by the encoder).
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
            "t={:.1}s frames={} groups={} {:.1} fps {:.3} Mbit/s key={} B delta={} B dropped={} relay={}",
            self.elapsed,
            self.frames,
            self.groups,
            self.frames as f64 / secs,
            self.bytes as f64 * 8.0 / 1e6 / secs,
            self.last_key,
            self.last_delta,
            self.dropped,
            if self.connected { "up" } else { "down" }
        )
    }
}

/// How long the node waits, at the end, for the relay to read the tracks' end.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Room for one access unit at the start (payload buffers grow to the largest seen).
const AU_CAPACITY: usize = 256 << 10;

/// The client configuration of a node publishing `width` × `height` at `bitrate`.
pub fn client_config(width: usize, height: usize, bitrate: u32) -> Config {
    let mut config = Config::default();
    // Room for several seconds of video, keyframes (up to a raw picture) included.
    let raw = (width * height * 3 / 2) as u64;
    config.pool_bytes = (u64::from(bitrate) / 8 * 8 + raw * 8).max(8 << 20);
    config.backoff_min = Duration::from_secs(1);
    config.backoff_max = Duration::from_secs(8);
    config
}

/// Microseconds since the Unix epoch, now.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A producer thread's output and the empty buffers it gets back.
struct Pipe<T> {
    full: Receiver<Result<T, String>>,
    empty: SyncSender<T>,
}

impl<T: Send + 'static> Pipe<T> {
    /// Runs `read(buffer)` on a thread, `buffers` buffers in flight: `Ok(false)` ends the stream.
    fn spawn(
        buffers: Vec<T>,
        mut read: impl FnMut(&mut T) -> Result<bool, String> + Send + 'static,
    ) -> Pipe<T> {
        let (full_tx, full) = mpsc::sync_channel(buffers.len());
        let (empty, empty_rx) = mpsc::sync_channel::<T>(buffers.len());
        for b in buffers {
            let _ = empty.send(b);
        }
        std::thread::spawn(move || {
            while let Ok(mut b) = empty_rx.recv() {
                match read(&mut b) {
                    Ok(true) => {
                        if full_tx.send(Ok(b)).is_err() {
                            return;
                        }
                    }
                    Ok(false) => return,
                    Err(e) => {
                        let _ = full_tx.send(Err(e));
                        return;
                    }
                }
            }
        });
        Pipe { full, empty }
    }

    /// The next buffer (`None`: the stream ended), polling without blocking the runtime.
    async fn next(&self, stop: &AtomicBool) -> Option<Result<T, String>> {
        loop {
            match self.full.try_recv() {
                Ok(b) => return Some(b),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if stop.load(Ordering::Relaxed) => return None,
                Err(TryRecvError::Empty) => {
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }

    /// Hands a buffer back to the thread.
    fn recycle(&self, b: T) {
        let _ = self.empty.try_send(b);
    }
}

/// Where the node's frames come from, set up.
enum Frames {
    /// Pattern pictures drawn here.
    Pattern(Picture),
    /// Y4M pictures from a thread.
    Y4m(Pipe<Picture>),
    /// Annex-B access units from a thread; the first one already read.
    H264(Pipe<Payload>, Option<Payload>),
}

/// Sets up `opts.input`; returns the frames, picture size and rate.
fn open(opts: &mut NodeOptions) -> Result<(Frames, usize, usize, f64), NodeError> {
    let input = std::mem::replace(&mut opts.input, Input::Pattern);
    match input {
        Input::Pattern => {
            if !pattern::fits(opts.width, opts.height) {
                return Err(NodeError::Options(format!(
                    "the pattern needs an even size of at least {}x{}, got {}x{}",
                    pattern::MIN_SIZE.0,
                    pattern::MIN_SIZE.1,
                    opts.width,
                    opts.height
                )));
            }
            let pic = Picture::new(opts.width, opts.height);
            Ok((Frames::Pattern(pic), opts.width, opts.height, opts.fps))
        }
        Input::Y4m(reader) => {
            let mut src = Y4mSource::new(reader)?;
            let (w, h) = (src.width(), src.height());
            let fps = match src.fps() {
                Some(f) if !opts.fps_forced => f,
                _ => opts.fps,
            };
            let pipe = Pipe::spawn(vec![Picture::new(w, h), Picture::new(w, h)], move |p| {
                src.read_into(p).map_err(|e| e.to_string())
            });
            Ok((Frames::Y4m(pipe), w, h, fps))
        }
        Input::H264(reader) => {
            let (mut units, first) = AccessUnits::new(reader)?;
            let (w, h) = units.size();
            let pipe = Pipe::spawn(
                vec![
                    Payload::with_capacity(AU_CAPACITY),
                    Payload::with_capacity(AU_CAPACITY),
                ],
                move |p| units.next_into(p).map_err(|e| e.to_string()),
            );
            // The first access unit's configuration is read again from it below.
            Ok((Frames::H264(pipe, Some(first)), w, h, opts.fps))
        }
    }
}

/// The catalog JSON of one avc1 rendition.
fn catalog_json(
    track: &str,
    config: &StreamConfig,
    (w, h): (usize, usize),
    fps: f64,
    bitrate: Option<u32>,
) -> Vec<u8> {
    let r = catalog::VideoRendition {
        track,
        codec: &config.codec,
        description: Some(&config.avcc),
        coded_width: w as u32,
        coded_height: h as u32,
        framerate: Some(fps),
        bitrate: bitrate.map(u64::from),
    };
    let mut buf = vec![0u8; 256 + track.len() * 6 + config.avcc.len() * 2];
    let n = catalog::write(&[r], &mut buf).unwrap_or(0);
    buf.truncate(n);
    buf
}

/// The codec string and avcC of an access unit that carries SPS and PPS.
fn config_of(au: &Payload) -> Option<StreamConfig> {
    let (mut sps, mut pps) = (None, None);
    for nal in skiff_core::hang::avc::LengthPrefixed::new(au.access_unit()).flatten() {
        match skiff_core::hang::avc::nal_type(nal[0]) {
            skiff_core::hang::avc::NAL_SPS => sps = sps.or(Some(nal)),
            skiff_core::hang::avc::NAL_PPS => pps = pps.or(Some(nal)),
            _ => {}
        }
    }
    StreamConfig::from_parameter_sets(sps?, pps?).ok()
}

/// Runs the camera node on the current monoio runtime until `opts.frames`
/// frames are published, the input ends or `stop` is set; calls `report`
/// about once a second and returns the final counters.
///
/// # Errors
/// [`NodeError`] for a bad URL or name, an unusable input or options, or an
/// encoder that cannot start.
pub async fn run(
    mut opts: NodeOptions,
    stop: Arc<AtomicBool>,
    mut report: impl FnMut(&Progress),
) -> Result<Progress, NodeError> {
    if !(opts.fps.is_finite() && opts.fps > 0.0) || opts.gop == 0 {
        return Err(NodeError::Options("fps and gop must be positive".into()));
    }
    let (mut frames, width, height, fps) = open(&mut opts)?;
    let mut encoder = match frames {
        Frames::H264(..) => None,
        _ => Some(Encoder::new(EncodeOptions {
            width,
            height,
            fps: fps as f32,
            gop: opts.gop,
            bitrate: opts.bitrate,
        })?),
    };
    let mut config = client_config(width, height, opts.bitrate);
    config.tls_roots = opts.tls_roots.clone();
    config.tls_fingerprint = opts.tls_fingerprint;
    let (client, runner) = connect(&opts.url, config)?;
    let runner = monoio::spawn(runner.run());
    let video_info =
        hang::video_info(&opts.track).map_err(|_| SdkError::InvalidName(opts.track.clone()))?;
    let broadcast = client.publish(&opts.broadcast)?;
    let mut catalog_track = broadcast.create_track(hang::catalog_info())?;
    let mut track = broadcast.create_track(video_info)?;
    // The catalog's group, open until the end.
    let mut catalog_group: Option<GroupProducer> = None;

    let mut payload = Payload::with_capacity(AU_CAPACITY);
    let mut progress = Progress::default();
    let mut link = Link::default();
    let start = Instant::now();
    let mut next_report = start + Duration::from_secs(1);
    let mut group: Option<GroupProducer> = None;
    let mut n = 0u64;
    let frame_ns = 1e9 / fps;
    let mut outcome = Ok(());
    while !stop.load(Ordering::Relaxed) && opts.frames.is_none_or(|f| n < f) {
        // One access unit into `payload`, or a recycled input buffer's.
        let made = match &mut frames {
            Frames::Pattern(pic) => {
                let stamp = Stamp {
                    frame: n as u32,
                    time_us: wall_clock_us(),
                };
                pattern::draw(pic, stamp);
                encode(encoder.as_mut(), pic, &mut payload)
            }
            Frames::Y4m(pipe) => match pipe.next(&stop).await {
                None => break,
                Some(Err(e)) => {
                    outcome = Err(NodeError::Input(e));
                    break;
                }
                Some(Ok(pic)) => {
                    let r = encode(encoder.as_mut(), &pic, &mut payload);
                    pipe.recycle(pic);
                    r
                }
            },
            Frames::H264(pipe, first) => {
                let au = match first.take() {
                    Some(au) => Ok(au),
                    None => match pipe.next(&stop).await {
                        None => break,
                        Some(r) => r,
                    },
                };
                match au {
                    Err(e) => {
                        outcome = Err(NodeError::Input(e));
                        break;
                    }
                    Ok(au) => {
                        // Swapped in: the thread gets the old buffer back.
                        let old = std::mem::replace(&mut payload, au);
                        pipe.recycle(old);
                        Ok(true)
                    }
                }
            }
        };
        match made {
            Err(e) => {
                outcome = Err(e.into());
                break;
            }
            Ok(false) => progress.dropped += 1,
            Ok(true) => {
                if catalog_group.is_none() && payload.is_keyframe() {
                    let config = encoder
                        .as_ref()
                        .and_then(|e| e.config().cloned())
                        .or_else(|| config_of(&payload));
                    if let Some(config) = config {
                        let bitrate = encoder.as_ref().map(|_| opts.bitrate);
                        let json =
                            catalog_json(&opts.track, &config, (width, height), fps, bitrate);
                        catalog_group = publish_catalog(&mut catalog_track, &json).await;
                    }
                }
                let pts_us = (n as f64 * 1e6 / fps) as u64;
                publish(&mut track, &mut group, &mut payload, pts_us, &mut progress).await;
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
        n += 1;
        // Paced from the start (no drift): frame n is due at n / fps.
        let due = start + Duration::from_nanos((n as f64 * frame_ns) as u64);
        monoio::time::sleep_until(monoio::time::Instant::from_std(due)).await;
    }
    if let Some(g) = group.take() {
        let _ = g.finish();
    }
    if let Some(g) = catalog_group.take() {
        let _ = g.finish();
    }
    track.finish();
    catalog_track.finish();
    // Let the end of the tracks reach the relay (a relay that is down gets nothing).
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
    outcome.map(|()| progress)
}

/// Encodes `pic` into `payload`; false if the encoder skipped it.
fn encode(
    encoder: Option<&mut Encoder>,
    pic: &Picture,
    payload: &mut Payload,
) -> Result<bool, h264::Error> {
    match encoder {
        Some(e) => e.encode(pic, payload),
        None => Ok(false),
    }
}

/// Writes the catalog as the only frame of a new catalog group, which the caller keeps open.
async fn publish_catalog(track: &mut TrackProducer, json: &[u8]) -> Option<GroupProducer> {
    let mut g = match track.append_group() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("camera: catalog group: {e}");
            return None;
        }
    };
    match g.write_frame(0, json).await {
        Ok(()) => Some(g),
        Err(e) => {
            eprintln!("camera: catalog: {e}");
            None
        }
    }
}

/// Writes `payload` at `pts_us`: a new group at each keyframe, frames of a
/// broken group dropped until the next keyframe.
async fn publish(
    track: &mut TrackProducer,
    group: &mut Option<GroupProducer>,
    payload: &mut Payload,
    pts_us: u64,
    progress: &mut Progress,
) {
    let key = payload.is_keyframe();
    if key {
        if let Some(g) = group.take() {
            let _ = g.finish();
        }
        match track.append_group() {
            Ok(g) => {
                *group = Some(g);
                progress.groups += 1;
            }
            Err(e) => eprintln!("camera: group: {e}"),
        }
    }
    let Ok(bytes) = payload.frame(pts_us) else {
        progress.dropped += 1;
        return;
    };
    let len = bytes.len();
    let written = match group.as_mut() {
        Some(g) => Some(g.write_frame(pts_us, bytes).await),
        None => None,
    };
    match written {
        Some(Ok(())) => {
            progress.frames += 1;
            progress.bytes += len as u64;
            if key {
                progress.last_key = len;
            } else {
                progress.last_delta = len;
            }
        }
        None => progress.dropped += 1,
        Some(Err(e)) => {
            // The group is unusable: drop it, the next keyframe starts a new one.
            progress.dropped += 1;
            if progress.dropped.is_power_of_two() {
                eprintln!(
                    "camera: frame at {pts_us} µs: {e} ({} dropped)",
                    progress.dropped
                );
            }
            *group = None;
        }
    }
}

/// What the node last saw of the connection, to say when it changes.
#[derive(Debug, Default)]
struct Link {
    /// Connected at the last look.
    up: bool,
    /// Sessions at the last look.
    sessions: u64,
    /// The last failed attempt's reason printed (each distinct one once).
    said: String,
}

impl Link {
    /// Prints a line on stderr when the relay went down or a new session
    /// came up, and why attempts fail (a refused certificate, a relay that
    /// is not up), each distinct reason once.
    fn follow(&mut self, client: &Client, url: &str) {
        let (up, sessions) = (client.is_connected(), client.sessions());
        if let Some(e) = client.last_error().filter(|_| !up) {
            let text = e.to_string();
            if text != self.said {
                eprintln!("camera: cannot connect to {url}: {text} (retrying)");
                self.said = text;
            }
        }
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
