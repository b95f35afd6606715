//! moq-net 0.3.18 clients for the tests that put them on a relay and keep
//! them there: the live publisher recipe (docs/protocol.md §7.2; it writes
//! once a relay reads its first group), a paced publisher that writes a
//! group every [`GROUP_GAP`] until told to stop, and a viewer that checks
//! every frame as it reads it and subscribes again when its subscription
//! ends (a node on the way restarted).
//!
//! The paced streams share one frame format ([`frame`]): the payload starts
//! with the stream's seed, the group and the frame index, so a viewer knows
//! which frame it read and checks its bytes and timestamp against what the
//! publisher wrote, whoever published it (a skiff SDK publisher writes the
//! same frames).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use skiff_interop::ALPN_LITE_05;
use skiff_interop::reference::{self, Frame, Group, Options};

/// Bound on each wait of these clients (a connect, a subscription reaching
/// a publisher, the release of a live publisher).
pub const WAIT: Duration = Duration::from_secs(20);
/// The pause between the frames of a paced stream.
pub const FRAME_GAP: Duration = Duration::from_millis(20);
/// Frames in a group of a paced stream.
pub const FRAMES: u64 = 5;
/// The time a paced group takes to write.
pub const GROUP_GAP: Duration = Duration::from_millis(100);
/// The frame of each paced group that is larger than one QMux record (16 KiB).
pub const BIG_FRAME: u64 = 2;

/// The poll-interface transport moq-net runs on.
pub type Transport = moq_tokio::transport::Session<qmux::Session>;

/// Where a moq-net client dials and who it is.
#[derive(Clone, Debug)]
pub struct Dial {
    /// The relay's listener (loopback).
    pub addr: SocketAddr,
    /// The SETUP path (the request URI over WebSocket): the session's root.
    pub path: String,
    /// QMux over WebSocket instead of TCP.
    pub websocket: bool,
    /// The hop id of the client's origin; distinct per client in a cluster,
    /// since a node drops an announcement whose hop list holds the receiver's.
    pub hop: u64,
}

impl Dial {
    /// Plain TCP to `addr` on `path` with `hop`.
    pub fn tcp(addr: SocketAddr, path: &str, hop: u64) -> Self {
        Dial {
            addr,
            path: path.to_owned(),
            websocket: false,
            hop,
        }
    }
}

/// The protocol every client offers.
fn versions() -> moq_net::Versions {
    let v = moq_net::Version::from_alpn(ALPN_LITE_05).expect("moq-lite-05 is known");
    moq_net::Versions::from(vec![v])
}

/// An origin with `hop` on the current runtime.
fn origin(hop: u64) -> Result<moq_net::origin::Producer, String> {
    let hop = moq_net::Hop::new(hop).map_err(|e| format!("hop: {e}"))?;
    Ok(moq_tokio::origin::spawn_config(
        moq_net::origin::Config::new(hop),
    ))
}

/// Dials `dial` and sets up a moq-net session; `attach` gives the client
/// its origin (publisher or subscriber).
pub async fn connect(
    dial: &Dial,
    attach: impl FnOnce(moq_net::Client) -> moq_net::Client,
) -> Result<moq_net::Session, String> {
    let connect = async {
        if dial.websocket {
            let opts = Options::client()
                .with_path(Some(&dial.path))
                .with_websocket();
            reference::ws_connect(dial.addr, &opts).await
        } else {
            reference::qmux_tcp([ALPN_LITE_05]).connect(dial.addr).await
        }
    };
    let qmux = tokio::time::timeout(WAIT, connect)
        .await
        .map_err(|_| "qmux connect timed out".to_owned())?
        .map_err(|e| format!("qmux connect: {e}"))?;
    let transport: Transport = moq_tokio::transport::Session::new(qmux);
    let client = moq_net::Client::new().with_versions(versions());
    // Over WebSocket the path is the request URI (docs/protocol.md §9.3).
    let client = if dial.websocket {
        client
    } else {
        client.with_path(dial.path.clone())
    };
    moq_session(attach(client), transport).await
}

/// Sets up `client`'s moq-net session over `transport` (within [`WAIT`])
/// and runs its driver on the current runtime.
pub async fn moq_session(
    client: moq_net::Client,
    transport: Transport,
) -> Result<moq_net::Session, String> {
    let (session, driver) =
        tokio::time::timeout(WAIT, client.connect(std::time::Instant::now(), transport))
            .await
            .map_err(|_| "moq connect timed out".to_owned())?
            .map_err(|e| format!("moq connect: {e}"))?;
    tokio::spawn(moq_net::time::run(driver));
    Ok(session)
}

/// Creates `broadcast` in `origin` with the one track `track` (default
/// info), unannounced: the broadcast, the track and the track's timescale.
pub fn one_track(
    origin: &moq_net::origin::Producer,
    broadcast: &str,
    track: &str,
) -> Result<
    (
        moq_net::broadcast::Producer,
        moq_net::track::Producer,
        moq_net::Timescale,
    ),
    String,
> {
    let info = moq_net::track::Info::default();
    let timescale = info.timescale;
    let broadcast = origin
        .create_broadcast(broadcast)
        .map_err(|e| format!("broadcast: {e}"))?;
    let track = broadcast
        .create_track(track, info)
        .map_err(|e| format!("track: {e}"))?;
    Ok((broadcast, track, timescale))
}

/// Runs `body` on its own thread and current-thread runtime.
fn on_thread<T: Send + 'static, F>(
    body: impl FnOnce() -> F + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>>
where
    F: Future<Output = Result<T, String>>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        rt.block_on(body())
    })
}

/// Writes `frame` into `producer`, its timestamp in `timescale`.
fn write(
    producer: &mut moq_net::group::Producer,
    timescale: moq_net::Timescale,
    frame: Frame,
) -> Result<(), String> {
    let ts = moq_net::Timestamp::new(frame.timestamp, timescale)
        .map_err(|_| "timestamp overflow".to_owned())?;
    producer
        .write_frame(ts, frame.payload)
        .map_err(|e| format!("frame: {e}"))
}

// ---------------------------------------------------------------------------
// The live publisher (docs/protocol.md §7.2 recipe)
// ---------------------------------------------------------------------------

/// Dials `dial`, announces `broadcast` with `track`, waits for a
/// subscriber, writes `groups` once the relay reads the first, then stays
/// connected until `done` fires.
///
/// The relay subscribes upstream at the live edge, so group 0 is open with
/// its first frame before anyone subscribes (the only group, where the
/// relay's subscription starts whenever it is positioned), and the rest is
/// written only once that subscription reads it.
async fn live_publisher(
    dial: Dial,
    broadcast: String,
    track: String,
    groups: Vec<Group>,
    done: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), String> {
    let origin = origin(dial.hop)?;
    let (broadcast, track, timescale) = one_track(&origin, &broadcast, &track)?;
    let mut groups = groups.into_iter();
    let mut first = groups.next().ok_or("no groups")?;
    let mut group0 = track
        .create_group(moq_net::group::Info::from(first.sequence))
        .map_err(|e| format!("group: {e}"))?;
    let mut rest = first.frames.drain(..);
    write(&mut group0, timescale, rest.next().ok_or("no frames")?)?;
    let rest: Vec<Frame> = rest.collect();
    broadcast
        .announce(moq_net::origin::Route::default())
        .map_err(|e| format!("announce: {e}"))?;
    let session = connect(&dial, |c| c.with_publisher(&origin)).await?;

    // Write the rest only once the relay's subscription is serving group 0: moq-net
    // positions a live-edge subscription after it registers, so a group written in
    // between would become the start (no timing involved: wait for the readers).
    tokio::time::timeout(WAIT, track.used())
        .await
        .map_err(|_| "no subscription reached the publisher".to_owned())?
        .map_err(|e| format!("used: {e}"))?;
    tokio::time::timeout(WAIT, group0.used())
        .await
        .map_err(|_| "group 0 was never read".to_owned())?
        .map_err(|e| format!("group 0 used: {e}"))?;
    for frame in rest {
        write(&mut group0, timescale, frame)?;
    }
    group0.finish().map_err(|e| format!("finish group: {e}"))?;
    for group in groups {
        let mut producer = track
            .create_group(moq_net::group::Info::from(group.sequence))
            .map_err(|e| format!("group: {e}"))?;
        for frame in group.frames {
            write(&mut producer, timescale, frame)?;
        }
        producer
            .finish()
            .map_err(|e| format!("finish group: {e}"))?;
    }
    // The track stays open until the subscriber has everything: skiff-relay forgets a
    // relay track whose upstream subscription ended, so if the track finished before
    // the subscriber's SUBSCRIBE reached the relay (moq-net sends TRACK first, and that
    // alone creates the relay track), the relay would subscribe upstream again at the
    // live edge and serve only the last group.

    let result = tokio::select! {
        _ = done => Ok(()),
        err = session.closed() => Err(format!("relay closed the session: {err}")),
        () = tokio::time::sleep(WAIT) => Err("publisher not released in time".to_owned()),
    };
    let _ = track.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    drop((group0, track, broadcast));
    result
}

/// Runs [`live_publisher`] on its own thread: the sender releases it.
pub fn spawn_live_publisher(
    dial: Dial,
    broadcast: &str,
    track: &str,
    groups: Vec<Group>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<Result<(), String>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (broadcast, track) = (broadcast.to_owned(), track.to_owned());
    let thread = on_thread(move || live_publisher(dial, broadcast, track, groups, rx));
    (tx, thread)
}

// ---------------------------------------------------------------------------
// Paced streams
// ---------------------------------------------------------------------------

/// Frame `i` of group `g` of the stream `seed`: its payload starts with
/// the seed, `g` and `i` (little-endian), then a pattern; frame
/// [`BIG_FRAME`] is over 20 KiB, the others under 1 KiB. Its timestamp
/// (`g * 100 + i * 20`, milliseconds in moq-net's default timescale) keeps
/// pace with the writing.
pub fn frame(seed: u64, g: u64, i: u64) -> Frame {
    let len = if i == BIG_FRAME {
        20 * 1024 + usize::try_from(seed % 64).unwrap_or(0)
    } else {
        24 + usize::try_from((seed * 7 + g * 97 + i * 31) % 900).unwrap_or(0)
    };
    let mut p = Vec::with_capacity(len);
    p.extend_from_slice(&seed.to_le_bytes());
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    let start = seed * 13 + g * 31 + i * 17;
    p.extend((p.len()..len).map(|k| ((start + k as u64) % 251) as u8));
    Frame::new(g * 100 + i * 20, p)
}

/// Checks a frame read from group `group` of the stream `seed`: its bytes
/// and timestamp are [`frame`]'s for the coordinates it carries, and those
/// name `group`. The frame's index, or what is wrong.
pub fn check(seed: u64, group: u64, timestamp: u64, payload: &[u8]) -> Result<u64, String> {
    let field = |k: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            payload.get(k * 8..k * 8 + 8)?.try_into().ok()?,
        ))
    };
    let (Some(s), Some(g), Some(i)) = (field(0), field(1), field(2)) else {
        return Err(format!("group {group}: a frame of {} bytes", payload.len()));
    };
    if (s, g) != (seed, group) || i >= FRAMES {
        return Err(format!(
            "group {group} of stream {seed}: a frame of stream {s}, group {g}, index {i}"
        ));
    }
    let want = frame(seed, g, i);
    if want.payload != payload {
        return Err(format!(
            "stream {seed} group {g} frame {i} damaged ({} bytes, want {})",
            payload.len(),
            want.payload.len()
        ));
    }
    if want.timestamp != timestamp {
        return Err(format!(
            "stream {seed} group {g} frame {i}: timestamp {timestamp}, want {}",
            want.timestamp
        ));
    }
    Ok(i)
}

/// Checks what a reference subscriber received of the stream `seed`: at
/// least `groups` groups, arriving one after another with no gap and no
/// repeat, each with every frame, in order, as written.
pub fn check_received(
    seed: u64,
    groups: usize,
    received: &reference::Received,
) -> Result<(), String> {
    if received.end != reference::End::GroupCount {
        return Err(format!(
            "stream {seed}: ended {:?} after groups {:?}",
            received.end, received.arrival
        ));
    }
    let arrival = &received.arrival;
    if arrival.len() < groups || arrival.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(format!("stream {seed}: groups arrived {arrival:?}"));
    }
    for group in &received.groups {
        let indices = group
            .frames
            .iter()
            .map(|f| check(seed, group.sequence, f.timestamp, &f.payload))
            .collect::<Result<Vec<u64>, String>>()?;
        if indices != (0..FRAMES).collect::<Vec<_>>() {
            return Err(format!(
                "stream {seed} group {}: frames {indices:?}",
                group.sequence
            ));
        }
    }
    Ok(())
}

/// Dials `dial`, announces `broadcast` with the track `track`, and writes
/// the stream `seed` ([`frame`]) a frame every [`FRAME_GAP`], group after
/// group, whether or not anyone reads, until `stop` is set: the number of
/// groups written, or why it could not go on (the relay closed the session).
async fn paced_publisher(
    dial: Dial,
    broadcast: String,
    track: String,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> Result<u64, String> {
    let origin = origin(dial.hop)?;
    let (broadcast, track, timescale) = one_track(&origin, &broadcast, &track)?;
    broadcast
        .announce(moq_net::origin::Route::default())
        .map_err(|e| format!("announce: {e}"))?;
    let session = connect(&dial, |c| c.with_publisher(&origin)).await?;
    let writing = async {
        let mut g = 0;
        let mut tick = tokio::time::interval(FRAME_GAP);
        while !stop.load(Ordering::SeqCst) {
            let mut producer = track
                .create_group(moq_net::group::Info::from(g))
                .map_err(|e| format!("group: {e}"))?;
            for i in 0..FRAMES {
                tick.tick().await;
                write(&mut producer, timescale, frame(seed, g, i))?;
            }
            producer
                .finish()
                .map_err(|e| format!("finish group: {e}"))?;
            g += 1;
        }
        Ok::<u64, String>(g)
    };
    let result = tokio::select! {
        written = writing => written,
        err = session.closed() => Err(format!("relay closed the session: {err}")),
    };
    let _ = track.finish();
    let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    drop((track, broadcast));
    result
}

/// Runs [`paced_publisher`] on its own thread until `stop` is set.
pub fn spawn_paced_publisher(
    dial: Dial,
    broadcast: &str,
    track: &str,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<u64, String>> {
    let (broadcast, track) = (broadcast.to_owned(), track.to_owned());
    on_thread(move || paced_publisher(dial, broadcast, track, seed, stop))
}

// ---------------------------------------------------------------------------
// A viewer that lives through restarts
// ---------------------------------------------------------------------------

/// What a [`spawn_watcher`] viewer read.
#[derive(Debug, Default)]
pub struct Watched {
    /// For each subscription it made, the (group, frame index) of every
    /// frame read, in order; every frame was checked as it came.
    pub subscriptions: Vec<Vec<(u64, u64)>>,
}

/// One subscription's reads: frames are checked and counted in `seen`;
/// `Ok` when the subscription ended (the track finished, a group or the
/// subscription failed) or `stop` was set, `Err` for a damaged frame.
async fn read_subscription(
    consumer: &moq_net::origin::Consumer,
    broadcast: &str,
    track: &str,
    seed: u64,
    seen: &AtomicU64,
    reads: &mut Vec<(u64, u64)>,
) -> Result<(), String> {
    let Ok(broadcast) = consumer.routed_broadcast(broadcast).await else {
        return Ok(());
    };
    let Ok(track) = broadcast.track(track) else {
        return Ok(());
    };
    let subscription = moq_net::track::Subscription::default()
        .with_priority(3)
        .with_max_age(Duration::from_secs(10));
    let Ok(subscriber) = track.subscribe(subscription).await else {
        return Ok(());
    };
    let timescale = subscriber.info().timescale;
    // As a player reads: in sequence order, a group older than one already
    // read is skipped (a relay taking the track from a new route may send
    // the groups it gets there, older ones too).
    let mut subscriber = subscriber.ordered();
    loop {
        let Ok(Some(mut group)) = subscriber.next_group().await else {
            return Ok(());
        };
        // A group cut short (its route went away) ends at its last frame read.
        while let Ok(Some(frame)) = group.read_frame().await {
            let timestamp = frame
                .timestamp
                .convert(timescale)
                .map_err(|_| "timestamp overflow".to_owned())?
                .value();
            let i = check(seed, group.sequence, timestamp, &frame.payload)?;
            reads.push((group.sequence, i));
            seen.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Dials `dial` and reads the stream `seed` ([`frame`]) published as
/// `broadcast`/`track` from the live edge in sequence order (moq-net's
/// `Ordered` reader), checking every frame, until
/// `stop` is set; when a subscription ends (a node on its route went away)
/// it waits for the broadcast's announcement and subscribes again. `seen`
/// counts the frames read.
async fn watcher(
    dial: Dial,
    broadcast: String,
    track: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
) -> Result<Watched, String> {
    let origin = origin(dial.hop)?;
    let session = connect(&dial, |c| c.with_subscriber(origin.clone())).await?;
    let consumer = origin.consume();
    let mut watched = Watched::default();
    let watching = async {
        let mut announced = consumer.announced();
        let mut active = false;
        loop {
            // Subscribe while the broadcast is announced; otherwise wait until it is.
            while !active {
                let Some(update) = announced.next().await else {
                    return Err("the origin closed".to_owned());
                };
                if update.prefix.as_str() == broadcast {
                    active = update.kind.is_active();
                }
            }
            watched.subscriptions.push(Vec::new());
            let reads = watched.subscriptions.last_mut().ok_or("no subscription")?;
            let reading = read_subscription(&consumer, &broadcast, &track, seed, &seen, reads);
            // The announcement going away ends the subscription too: the
            // next one waits until it is back.
            let gone = async {
                while let Some(update) = announced.next().await {
                    if update.prefix.as_str() == broadcast && !update.kind.is_active() {
                        return;
                    }
                }
                std::future::pending::<()>().await;
            };
            tokio::select! {
                read = reading => read?,
                () = gone => active = false,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let stopped = async {
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let result = tokio::select! {
        watching = watching => watching,
        () = stopped => Ok(()),
        err = session.closed() => Err(format!("relay closed the session: {err}")),
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    result.map(|()| watched)
}

/// Runs [`watcher`] on its own thread until `stop` is set.
pub fn spawn_watcher(
    dial: Dial,
    broadcast: &str,
    track: &str,
    seed: u64,
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Result<Watched, String>> {
    let (broadcast, track) = (broadcast.to_owned(), track.to_owned());
    on_thread(move || watcher(dial, broadcast, track, seed, stop, seen))
}
