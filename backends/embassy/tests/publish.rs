//! Host integration tests of the publisher: an embassy-net stack publishes through
//! skiff-embassy to the moq-net reference subscriber (skiff-interop), reached through
//! an in-memory IP link and a gateway stack that bridges to a Linux socket (see
//! `support`). Every frame's bytes, order and timestamp is checked.

mod support;

use std::cell::Cell;
use std::time::Duration as StdDuration;

use embassy_net::{IpEndpoint, Stack, StackResources};
use embassy_net_driver_channel as ch;
use embassy_time::{Duration, Timer};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, group, origin, track};
use skiff_core::pool::{Pool, PoolStorage};
use skiff_embassy::{
    Config, Error, FULL_RECORD, Publisher, PublisherResources, Resources, SmallResources,
};
use skiff_interop::reference::{self, End, Options, Received, SubscribeRequest, TrackInfo};
use support::{DEVICE_ADDR, GATEWAY_ADDR, GATEWAY_PORT, LinkState, Route};

const BROADCAST: &str = "skiff/test";
const TRACK: &str = "frames";
const HOP: u64 = 0x5eed;
const PATH: &str = "/skiff";

// ---------------------------------------------------------------------------
// The synthetic track
// ---------------------------------------------------------------------------

/// Frame `f` of group `g`: a timestamp (ms) and a payload of a known pattern, 20 to
/// 1419 bytes (some frames span several TCP segments).
fn frame(g: u64, f: u64) -> (u64, Vec<u8>) {
    let timestamp = g * 1000 + f * 33;
    let len = 20 + ((g * 10 + f) * 389 % 1400) as usize;
    let payload = (0..len)
        .map(|i| ((i as u64 + g * 31 + f * 7) % 251) as u8)
        .collect();
    (timestamp, payload)
}

/// Payload bytes of the whole plan.
fn total_payload(plan: Plan) -> u64 {
    (0..plan.groups)
        .flat_map(|g| (0..plan.frames).map(move |f| frame(g, f).1.len() as u64))
        .sum()
}

/// Asserts that `group` holds exactly the `frames` frames [`frame`] makes for it.
fn check_group(group: &reference::Group, frames: u64) {
    assert_eq!(
        group.frames.len() as u64,
        frames,
        "frame count of group {}",
        group.sequence
    );
    for (f, got) in group.frames.iter().enumerate() {
        let (timestamp, payload) = frame(group.sequence, f as u64);
        assert_eq!(
            got.timestamp, timestamp,
            "timestamp of frame {f} of group {}",
            group.sequence
        );
        assert!(
            got.payload == payload,
            "payload of frame {f} of group {} differs",
            group.sequence
        );
    }
}

/// What the application publishes.
#[derive(Clone, Copy)]
struct Plan {
    groups: u64,
    frames: u64,
    /// Time between frames (a live source).
    gap: Duration,
    /// When the run is over.
    until: Until,
}

/// The end of a run.
#[derive(Clone, Copy)]
enum Until {
    /// The application published the plan and the session it went through ended.
    Published,
    /// The runner made this many connection attempts (nothing is published).
    Attempts(u32),
    /// The last connection ended with this error (nothing is published).
    Failed(skiff_embassy::Error),
}

impl Plan {
    /// A run that publishes nothing and ends at `until`.
    fn idle(until: Until) -> Self {
        Plan {
            groups: 0,
            frames: 0,
            gap: Duration::from_ticks(0),
            until,
        }
    }
}

/// The application task: waits for the first subscriber, then writes `plan`'s groups
/// frame by frame, paced by the publisher, and finishes the track; counts the payload
/// bytes written in `written`.
async fn produce<'a, 'p>(
    publisher: Publisher<'_, 'a, 'p>,
    track: track::Ref<'a, 'p>,
    plan: Plan,
    written: &Cell<u64>,
) {
    let mut producer = track.producer().expect("one producer");
    publisher.wait_subscribed().await;
    for g in 0..plan.groups {
        let mut group = producer.create_group(g).expect("create group");
        for f in 0..plan.frames {
            let (timestamp, payload) = frame(g, f);
            publisher.paced(&group).await;
            loop {
                match group.write_frame(timestamp, &payload) {
                    Ok(()) => {
                        written.set(written.get() + payload.len() as u64);
                        break;
                    }
                    Err(group::WriteError::PoolExhausted) => Timer::after_millis(1).await,
                    Err(e) => panic!("write frame {f} of group {g}: {e}"),
                }
            }
            Timer::after(plan.gap).await;
        }
        group.finish().expect("finish group");
    }
    assert!(producer.finish());
}

/// What the publisher's handle said at the end of a run.
#[derive(Debug)]
struct Report {
    attempts: u32,
    sessions: u32,
    last_error: Option<skiff_embassy::Error>,
    finished: bool,
    /// The runner's next wait after a failure, when the run ended.
    backoff: Duration,
}

/// Runs the whole device side (publisher stack, link, gateway stack, publisher
/// runner, application) and `far` on the gateway stack, until the application is
/// done and its session ended, or 20 s passed. `written` counts the payload bytes the
/// application wrote.
async fn scenario<const RX: usize>(
    far: impl AsyncFnOnce(Stack<'_>),
    plan: Plan,
    written: &Cell<u64>,
) -> Report {
    support::init_log();
    // The link and the two stacks.
    let mut device_link = Box::new(LinkState::new());
    let mut gateway_link = Box::new(LinkState::new());
    let (device_ch, device) = ch::new(&mut *device_link, ch::driver::HardwareAddress::Ip);
    let (gateway_ch, gateway) = ch::new(&mut *gateway_link, ch::driver::HardwareAddress::Ip);
    let mut device_res = Box::new(StackResources::<4>::new());
    let mut gateway_res = Box::new(StackResources::<4>::new());
    let (device_stack, mut device_net) = support::stack(device, DEVICE_ADDR, &mut device_res, 1);
    let (gateway_stack, mut gateway_net) =
        support::stack(gateway, GATEWAY_ADDR, &mut gateway_res, 2);

    // The media: one broadcast with one track over a pool.
    let mut pool_storage = Box::new(PoolStorage::<96, 1024>::new());
    let pool = Pool::new(&mut pool_storage);
    let info = track::Info::new(TRACK).expect("name").with_priority(9);
    let track = track::State::<4>::new(&pool, info);
    let bcast = broadcast::State::<2>::new(Path::new(BROADCAST).expect("path")).expect("bcast");
    let origin = origin::State::<2, 8>::new();
    let tracks = bcast.producer().expect("broadcast producer");
    tracks.add(track.handle()).expect("add track");
    origin.handle().announce(bcast.handle()).expect("announce");

    // The publisher.
    let mut resources = Box::new(PublisherResources::<
        16,
        8,
        256,
        10,
        4,
        4,
        RX,
        2048,
        4096,
        4096,
    >::new());
    let relay = IpEndpoint::new(GATEWAY_ADDR.into(), GATEWAY_PORT);
    let config = Config::new(relay, PATH, HOP)
        .with_backoff(Duration::from_millis(200), Duration::from_millis(800));
    let (publisher, mut runner) =
        skiff_embassy::new(device_stack, config, &mut resources, origin.handle());

    let foreground = async {
        match plan.until {
            Until::Published => {
                produce(publisher, track.handle(), plan, written).await;
                // Done once the subscriber ended the session it read the track through.
                publisher
                    .wait_for(|p| p.subscribers() == 0 && !p.is_ready())
                    .await;
            }
            Until::Attempts(n) => publisher.wait_for(|p| p.attempts() >= n).await,
            Until::Failed(e) => publisher.wait_for(|p| p.last_error() == Some(e)).await,
        }
    };
    let finished = support::run_tasks(
        Box::pin(async {
            tokio::time::timeout(StdDuration::from_secs(20), foreground)
                .await
                .is_ok()
        }),
        vec![
            Box::pin(async {
                device_net.run().await;
            }),
            Box::pin(async {
                gateway_net.run().await;
            }),
            Box::pin(support::wire(device_ch, gateway_ch)),
            Box::pin(far(gateway_stack)),
            Box::pin(async {
                runner.run().await;
            }),
        ],
    )
    .await;
    Report {
        attempts: publisher.attempts(),
        sessions: publisher.sessions(),
        last_error: publisher.last_error(),
        finished,
        backoff: runner.backoff(),
    }
}

/// A far side that bridges the gateway's connections to Linux sockets, one route each.
fn bridged(routes: Vec<Route>) -> impl AsyncFnOnce(Stack<'_>) {
    async move |stack: Stack<'_>| {
        let mut routes = routes.into_iter();
        support::gateway(stack, |_| routes.next()).await
    }
}

fn request(start: Option<u64>) -> SubscribeRequest {
    SubscribeRequest {
        broadcast: BROADCAST.into(),
        track: TRACK.into(),
        priority: 1,
        max_age_ms: 10_000,
        start,
        end: None,
        stop_after: None,
    }
}

fn server() -> Options {
    Options::server().with_timeout(StdDuration::from_secs(25))
}

/// The facts every subscriber that read the track to its end shows.
fn check_discovery(received: &Received) {
    assert_eq!(received.protocol.as_deref(), Some("moq-lite-05"));
    assert_eq!(received.peer_path.as_deref(), Some(PATH));
    assert_eq!(received.announced, vec![BROADCAST.to_owned()]);
    assert_eq!(
        received.info,
        Some(TrackInfo {
            priority: 9,
            ..TrackInfo::default()
        })
    );
}

// ---------------------------------------------------------------------------
// Publishing
// ---------------------------------------------------------------------------

#[test]
fn publishes_every_frame_to_the_reference_subscriber() {
    let subscriber = reference::serve_subscriber(server(), request(Some(0))).expect("subscriber");
    let addr = subscriber.local_addr().expect("listening");
    let plan = Plan {
        groups: 5,
        frames: 10,
        gap: Duration::from_millis(3),
        until: Until::Published,
    };
    let written = Cell::new(0);
    let report = support::block_on(scenario::<{ FULL_RECORD }>(
        bridged(vec![Route::Forward(addr)]),
        plan,
        &written,
    ));
    let received = subscriber.join().expect("subscriber result");

    assert!(
        report.finished,
        "run did not finish: {report:?}, {received:?}"
    );
    assert_eq!(received.end, End::TrackFinished, "{received:?}");
    check_discovery(&received);
    let sequences: Vec<u64> = received.groups.iter().map(|g| g.sequence).collect();
    assert_eq!(sequences, vec![0, 1, 2, 3, 4]);
    for g in &received.groups {
        check_group(g, plan.frames);
    }
    assert_eq!(report.attempts, 1);
    assert_eq!(report.sessions, 1);
    // The subscriber closed the session with NO_ERROR once the track ended.
    assert_eq!(report.last_error, None);
    assert_eq!(written.get(), total_payload(plan));
}

// ---------------------------------------------------------------------------
// Reconnecting
// ---------------------------------------------------------------------------

#[test]
fn reconnects_after_a_drop_and_publishes_again() {
    // The first connection is dropped once ~1.5 groups went through; the publisher
    // redials after its backoff and a second subscriber reads from the latest group.
    let first = reference::serve_subscriber(server(), request(Some(0))).expect("subscriber");
    let second = reference::serve_subscriber(server(), request(None)).expect("subscriber");
    let routes = vec![
        Route::ForwardThenDrop(first.local_addr().expect("listening"), 12_000),
        Route::Forward(second.local_addr().expect("listening")),
    ];
    let plan = Plan {
        groups: 12,
        frames: 10,
        gap: Duration::from_millis(15),
        until: Until::Published,
    };
    let written = Cell::new(0);
    let report = support::block_on(scenario::<{ FULL_RECORD }>(bridged(routes), plan, &written));
    let dropped = first.join().expect("first subscriber result");
    let received = second.join().expect("second subscriber result");

    assert!(report.finished, "run did not finish: {report:?}");
    assert_eq!(report.sessions, 2, "{report:?}");
    assert!(report.attempts >= 2, "{report:?}");

    // Before the drop: complete groups only, each exact.
    assert_ne!(dropped.end, End::TrackFinished, "{dropped:?}");
    assert!(!dropped.groups.is_empty(), "{dropped:?}");
    for g in &dropped.groups {
        check_group(g, plan.frames);
    }

    // After the reconnect: from the latest group on, every group to the end, exact.
    assert_eq!(received.end, End::TrackFinished, "{received:?}");
    check_discovery(&received);
    let sequences: Vec<u64> = received.groups.iter().map(|g| g.sequence).collect();
    let first_seq = *sequences.first().expect("some groups after the reconnect");
    assert!(first_seq >= 1, "{sequences:?}");
    assert_eq!(sequences, (first_seq..plan.groups).collect::<Vec<_>>());
    for g in &received.groups {
        check_group(g, plan.frames);
    }
}

#[test]
fn backs_off_exponentially_while_the_relay_refuses() {
    // Nothing listens behind the gateway: every connect is refused with a RST. The
    // waits go 200, 400, then 800 ms (the cap) and stay there.
    let written = Cell::new(0);
    let report = support::block_on(scenario::<{ FULL_RECORD }>(
        bridged(Vec::new()),
        Plan::idle(Until::Attempts(4)),
        &written,
    ));
    assert!(report.finished, "{report:?}");
    assert_eq!(report.sessions, 0);
    assert_eq!(
        report.last_error,
        Some(Error::Connect(
            embassy_net::tcp::ConnectError::ConnectionReset
        ))
    );
    assert_eq!(report.backoff, Duration::from_millis(800));
}

/// A far side that answers the publisher's connection with the header of a record
/// longer than `RX` (and the start of its body), then waits for the publisher to go.
async fn oversized_record(stack: Stack<'_>, len: usize) {
    use embassy_net::tcp::TcpSocket;
    let mut socket_rx = vec![0u8; 8192];
    let mut socket_tx = vec![0u8; 8192];
    let mut socket = TcpSocket::new(stack, &mut socket_rx, &mut socket_tx);
    socket.accept(GATEWAY_PORT).await.expect("accept");
    // docs/protocol.md §1.3: Size (2-byte varint), then PADDING.
    let mut record = vec![0u8; 2 + len];
    record[0] = 0x40 | (len >> 8) as u8;
    record[1] = len as u8;
    let mut pos = 0;
    while pos < record.len() {
        match socket.write(&record[pos..]).await {
            Ok(n) => pos += n,
            Err(_) => return,
        }
    }
    let mut buf = [0u8; 512];
    while let Ok(n) = socket.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

#[test]
fn a_record_over_the_input_buffer_ends_the_connection() {
    // With a 2 KiB input buffer, a 4000-byte record (legal: under 16382) cannot be
    // taken: the runner closes with INTERNAL instead of waiting forever.
    let written = Cell::new(0);
    let far = async |stack: Stack<'_>| oversized_record(stack, 4000).await;
    let report = support::block_on(scenario::<2048>(
        far,
        Plan::idle(Until::Failed(Error::RecordTooLarge)),
        &written,
    ));
    assert!(report.finished, "{report:?}");
    assert_eq!(report.attempts, 1);
    assert_eq!(Error::RecordTooLarge.to_code(), Some(0x1));
}

// ---------------------------------------------------------------------------
// Footprint
// ---------------------------------------------------------------------------

#[test]
fn footprint_of_the_resources_and_the_runner() {
    use core::mem::size_of;
    type Full = Resources<'static, 'static>;
    type Small = SmallResources<'static, 'static>;
    type SessionState = skiff_core::session::Session<'static, 'static, 'static, 16>;
    // The socket buffers belong to the network stack's share (4 KiB each way).
    let sockets = 2 * 4096;

    let mut link = Box::new(LinkState::new());
    let (_link_runner, device) = ch::new(&mut *link, ch::driver::HardwareAddress::Ip);
    let mut stack_res = Box::new(StackResources::<4>::new());
    let (stack, _net) = support::stack(device, DEVICE_ADDR, &mut stack_res, 1);
    let pool_storage = Box::leak(Box::new(PoolStorage::<4, 64>::new()));
    let pool = Box::leak(Box::new(Pool::new(pool_storage)));
    let origin = Box::leak(Box::new(origin::State::<1, 4>::new()));
    let _ = pool;
    let mut resources = Box::new(Small::new());
    let relay = IpEndpoint::new(GATEWAY_ADDR.into(), GATEWAY_PORT);
    let (_publisher, mut runner) = skiff_embassy::new(
        stack,
        Config::new(relay, PATH, HOP),
        &mut resources,
        origin.handle(),
    );
    let run = size_of_val(&runner.run());
    let full = size_of::<Full>() - sockets;
    let small = size_of::<Small>() - sockets;
    println!(
        "session state (Session<16>, in the runner's future): {} B",
        size_of::<SessionState>()
    );
    println!("runner future (Runner::run): {run} B");
    println!("Resources without socket buffers (RX = full record): {full} B");
    println!("SmallResources without socket buffers (RX = 2 KiB): {small} B");
    println!(
        "publisher total, SmallResources + runner future: {} B",
        small + run
    );
    println!(
        "publisher total, Resources + runner future: {} B",
        full + run
    );
    // The aim: core + session + backend under 32 KiB, without the stack's buffers.
    assert!(full + run < 32 * 1024, "{} B", full + run);
}

// ---------------------------------------------------------------------------
// Pacing
// ---------------------------------------------------------------------------

/// What the slow subscriber saw.
#[derive(Debug, Default)]
struct SlowReport {
    /// Payload bytes the application had written when the reader started.
    written_at_unpark: Option<u64>,
    /// Complete groups: (sequence, frames).
    groups: Vec<reference::Group>,
    /// Whether the track ended (SUBSCRIBE_END, then every group read).
    finished: bool,
}

/// A skiff server session on the gateway stack, standing in for a relay: it grants
/// `window` bytes of credit per group stream, subscribes to the track from group 0,
/// and reads nothing for `park` (so no credit is given back), then reads everything.
async fn slow_subscriber(
    stack: Stack<'_>,
    window: u64,
    park: Duration,
    written: &Cell<u64>,
    report: &std::cell::RefCell<SlowReport>,
) {
    use embassy_net::tcp::TcpSocket;
    use skiff_core::conn;
    use skiff_core::session::{Event, Session, Storage};
    use skiff_core::window::{End as WindowEnd, Request, Start};
    use skiff_core::wire::qmux::Side;
    use skiff_embassy::clock;

    let mut socket_rx = vec![0u8; 16 * 1024];
    let mut socket_tx = vec![0u8; 16 * 1024];
    let mut socket = TcpSocket::new(stack, &mut socket_rx, &mut socket_tx);
    socket.accept(GATEWAY_PORT).await.expect("accept");

    let mut pool_storage = Box::new(PoolStorage::<128, 512>::new());
    let pool = Pool::new(&mut pool_storage);
    let local = track::State::<8>::new(&pool, track::Info::new(TRACK).expect("name"));
    let mut storage = Box::new(Storage::<16, 256, 4, 4, 8, 8, 32>::new());
    let config = skiff_core::session::Config {
        conn: conn::Config {
            max_stream_data_uni: window,
            ..conn::Config::new()
        },
        hop: 0x1111,
        ..skiff_core::session::Config::new()
    };
    let mut session: Session<'_, '_, '_, 16> =
        Session::new(Side::Server, config, clock::now(), &mut storage, None).expect("session");

    let mut rx = vec![0u8; skiff_embassy::FULL_RECORD];
    let mut rx_len = 0;
    let mut out = vec![0u8; skiff_embassy::FULL_RECORD];
    let started = embassy_time::Instant::now();
    let mut readers: Vec<(u64, group::Consumer<'_, '_>, bool)> = Vec::new();
    let mut subscribed = false;
    loop {
        let now = clock::now();
        if session.poll_timeout().is_some_and(|t| t <= now) {
            session.handle_timeout(now);
        }
        while rx_len > 0 {
            let Ok(n) = session.handle_input(now, &rx[..rx_len]) else {
                break;
            };
            rx.copy_within(n..rx_len, 0);
            rx_len -= n;
            while session.poll_event().is_some() {}
            if n == 0 {
                break;
            }
        }
        let mut setup = false;
        while let Some(event) = session.poll_event() {
            setup |= matches!(event, Event::Setup { .. });
        }
        if (setup || session.is_setup()) && !subscribed {
            let request = Request {
                start: Start::Group(0),
                end: WindowEnd::Open,
                ordered: false,
                priority: 1,
                max_latency: skiff_core::time::Duration::from_secs(10),
            };
            // The device dialed PATH: its BROADCAST is PATH/BROADCAST here (docs/protocol.md §4.1).
            let full = std::format!("{}/{BROADCAST}", PATH.trim_start_matches('/'));
            session
                .subscribe(&full, local.handle(), request)
                .expect("subscribe");
            subscribed = true;
        }
        // The reader: parked first, then it consumes every byte as it arrives.
        if started.elapsed() >= park {
            let mut r = report.borrow_mut();
            if r.written_at_unpark.is_none() {
                r.written_at_unpark = Some(written.get());
            }
            for seq in local.handle().sequences() {
                if !readers.iter().any(|(s, _, _)| *s == seq)
                    && let Some(c) = local.handle().group(seq)
                {
                    readers.push((seq, c, false));
                }
            }
            for (_, reader, done) in readers.iter_mut().filter(|(_, _, done)| !*done) {
                loop {
                    match reader.chunk() {
                        Ok(group::Next::Ready(chunk)) => {
                            let n = chunk.len();
                            reader.advance(n);
                        }
                        Ok(group::Next::Finished) => {
                            *done = true;
                            break;
                        }
                        Ok(group::Next::Pending) => break,
                        Err(e) => panic!("group read: {e}"),
                    }
                }
            }
            if local.handle().status() == track::Status::Finished
                && !readers.is_empty()
                && readers.iter().all(|(_, _, done)| *done)
            {
                r.finished = true;
                break;
            }
        }
        loop {
            let n = session.poll_transmit(now, &mut out);
            if n == 0 {
                break;
            }
            let mut pos = 0;
            while pos < n {
                match socket.write(&out[pos..n]).await {
                    Ok(k) => pos += k,
                    Err(e) => panic!("subscriber write: {e:?}"),
                }
            }
        }
        if session.is_closed() {
            break;
        }
        // Wake on input, or every 2 ms to let the reader and timers run.
        match embassy_time::with_timeout(Duration::from_millis(2), socket.read(&mut rx[rx_len..]))
            .await
        {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => rx_len += n,
            Err(_) => {}
        }
    }

    // Every group, parsed from the local copy.
    let mut groups = Vec::new();
    for seq in local.handle().sequences() {
        let mut c = local.handle().group(seq).expect("group held");
        let mut frames = Vec::new();
        while let Ok(group::Next::Ready(h)) = c.read_frame_header() {
            let mut payload = vec![0u8; h.len];
            let mut got = 0;
            while got < h.len {
                match c.read_payload(&mut payload[got..]) {
                    Ok(group::Next::Ready(n)) => got += n,
                    other => panic!("payload of group {seq}: {other:?}"),
                }
            }
            frames.push(reference::Frame::new(h.timestamp, payload));
        }
        groups.push(reference::Group {
            sequence: seq,
            frames,
        });
    }
    groups.sort_by_key(|g| g.sequence);
    report.borrow_mut().groups = groups;
    session.close(skiff_core::wire::lite::SessionCode::NoError, "done");
    let n = session.poll_transmit(clock::now(), &mut out);
    let _ = socket.write(&out[..n]).await;
    socket.close();
    let _ = embassy_time::with_timeout(Duration::from_secs(1), socket.flush()).await;
}

#[test]
fn paces_the_producer_to_the_relay_credit() {
    // A 4 KiB stream window and a subscriber that reads nothing for 400 ms: the
    // application, writing as fast as pacing lets it, stops about one window ahead
    // of what was sent, then delivers every frame once the reader drains.
    const WINDOW: u64 = 4096;
    let plan = Plan {
        groups: 5,
        frames: 10,
        gap: Duration::from_ticks(0),
        until: Until::Published,
    };
    let written = Cell::new(0);
    let report = std::cell::RefCell::new(SlowReport::default());
    let far = async |stack: Stack<'_>| {
        slow_subscriber(stack, WINDOW, Duration::from_millis(400), &written, &report).await
    };
    let run = support::block_on(scenario::<{ FULL_RECORD }>(far, plan, &written));
    let report = report.into_inner();

    assert!(run.finished, "run did not finish: {run:?}, {report:?}");
    assert!(report.finished, "{report:?}");
    let held = report.written_at_unpark.expect("reader started");
    // One window sent (unacknowledged by the parked reader), at most one frame beyond.
    let largest_frame = 1420;
    assert!(
        held <= WINDOW + largest_frame,
        "the producer wrote {held} bytes against a {WINDOW}-byte window"
    );
    // ... and it did use the window (payload only, so a few header bytes short of it).
    assert!(held >= WINDOW - largest_frame, "{held}");
    assert_eq!(written.get(), total_payload(plan));
    let sequences: Vec<u64> = report.groups.iter().map(|g| g.sequence).collect();
    assert_eq!(sequences, vec![0, 1, 2, 3, 4]);
    for g in &report.groups {
        check_group(g, plan.frames);
    }
}
