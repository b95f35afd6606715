//! skiff against the published moq-dev crates (moq-net 0.3.18, qmux 0.5.3) over real
//! loopback TCP, both directions, with a wire tap between the two:
//!
//! * (a) moq-net publisher (server) → skiff subscriber (client): announce discovery,
//!   subscribe, every group's frames (bytes, order, timestamps).
//! * (b) skiff publisher → moq-net subscriber, both ways of dialing: skiff server with a
//!   moq-net client, and skiff client with a moq-net server.
//! * (c) a 1 MiB group each way, which only gets through with QMux credit updates
//!   (MAX_STREAM_DATA / MAX_DATA, docs/protocol.md §2.4) flowing between the real crates.
//! * (d) the tap's bytes: skiff's first record against docs/protocol.md §6 V1, and skiff's
//!   SETUP / ANNOUNCE_REQUEST / TRACK / SUBSCRIBE (and publisher-side responses and group
//!   streams) against the rules of docs/protocol.md §3, encoded independently here.
//! * Also: the reverse dialing of (a), a live publisher subscribed from the latest group,
//!   a parked reader holding moq-net at one window, refusals (NOT_FOUND / UNROUTABLE)
//!   and unsubscribe, answered pings.
//!
//! `SKIFF_DUMP=1 cargo test -p skiff-interop --test skiff_vs_moq_net -- --nocapture`
//! prints every captured record.
//!
//! Every run is bounded by [`TIMEOUT`]; everything binds and dials 127.0.0.1 only.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::time::Duration;

use skiff_core::conn;
use skiff_core::session::{Config, Session, Storage};
use skiff_core::time::Duration as SkiffDuration;
use skiff_core::window::{End as WindowEnd, Request, Start};
use skiff_core::wire::lite::{Role, SessionCode, TrackInfo as SkiffTrackInfo};
use skiff_core::wire::qmux::Side;
use skiff_interop::reference::{
    self, End, Frame, Group, Options, Publication, SubscribeRequest, TrackInfo,
};
use skiff_interop::skiff_driver::{
    self, Clock, DriveError, Driver, Ev, SkiffPublication, TrackReader, leak_pool, leak_track,
    track_info,
};
use skiff_interop::tap::{Capture, Direction, Tap};
use skiff_interop::wire::{self, Frame as Wire, StreamLog};

/// Bound on every run in this file (reference endpoints and skiff drivers alike).
const TIMEOUT: Duration = Duration::from_secs(20);

/// Control-stream tables of the skiff sessions here: 24 control streams of 512 bytes,
/// 8 subscriptions each way, 8 group streams out, 16 in.
type Store = Storage<'static, 'static, 24, 512, 8, 8, 8, 16, 48>;

/// Stream table of a skiff session with skiff's default QMux settings (advertises a
/// quarter of it per direction: 16 bidi, 16 uni).
const SMALL: usize = 64;

/// Stream table big enough to advertise moq-dev's 10 000 / 10 000 streams *and* open
/// our own: skiff reserves every slot the peer may fill, so a table of exactly 20 000
/// would leave none for our SETUP and requests (`Session::new` refuses that).
const MOQ_DEV_STREAMS: usize = 20_000 + 64;

/// Hop IDs: the reference server 0x1111 and client 0x2222 (as in docs/protocol.md §6);
/// skiff uses the same so the bytes are comparable.
const SERVER_HOP: u64 = 0x1111;
const CLIENT_HOP: u64 = 0x2222;

/// docs/protocol.md §6 V1: QX_TRANSPORT_PARAMETERS as moq-dev sends it with ["moq-lite-05"].
const V1: &str = "40 54 ff 51 53 30 0d 0a 0d 0a 40 4a \
    01 04 80 00 75 30  04 04 80 10 00 00  05 04 80 04 00 00  06 04 80 04 00 00 \
    07 04 80 04 00 00  08 02 67 10  09 02 67 10  20 02 7f fe \
    c5 71 c5 94 29 cd 08 45 02 7f fe \
    fd 4f 9c 2a 8b 1e 60 75 0c 0b 6d 6f 71 2d 6c 69 74 65 2d 30 35";

/// skiff's first record with its default `conn::Config` on a 64-slot stream table:
/// V1 except `initial_max_streams_bidi/uni` = 16 (a quarter of the table each, so a
/// compliant peer can never overflow it) and no `max_datagram_frame_size` (0 = omitted:
/// skiff does not take datagrams, docs/protocol.md §3.14 "advertise 0 to be safe").
const SKIFF_DEFAULT_PARAMS: &str = "40 4e ff 51 53 30 0d 0a 0d 0a 40 44 \
    01 04 80 00 75 30  04 04 80 10 00 00  05 04 80 04 00 00  06 04 80 04 00 00 \
    07 04 80 04 00 00  08 01 10  09 01 10 \
    c5 71 c5 94 29 cd 08 45 02 7f fe \
    fd 4f 9c 2a 8b 1e 60 75 0c 0b 6d 6f 71 2d 6c 69 74 65 2d 30 35";

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

fn hex(text: &str) -> Vec<u8> {
    wire::from_hex(text).expect("valid hex in test vector")
}

/// Several groups with varied frames: an empty payload, a 20 000-byte payload (more
/// than one 16 KiB QMux record), a negative timestamp step, a one-frame group.
fn varied_publication() -> Publication {
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    Publication {
        broadcast: "room/cam".into(),
        track: "video".into(),
        info: TrackInfo::default(),
        groups: vec![
            Group {
                sequence: 3,
                frames: vec![
                    Frame::new(0, "key"),
                    Frame::new(40, ""),
                    Frame::new(80, "p2"),
                ],
            },
            Group {
                sequence: 4,
                frames: vec![Frame::new(1000, big), Frame::new(1033, "after-big")],
            },
            Group {
                sequence: 5,
                frames: vec![
                    Frame::new(2000, "b"),
                    Frame::new(1990, "earlier"),
                    Frame::new(2100, "c"),
                ],
            },
            Group {
                sequence: 6,
                frames: vec![Frame::new(3000, "only")],
            },
        ],
        finish: true,
    }
}

/// The varied publication on a 90 kHz clock with non-default TRACK_INFO values.
fn varied_publication_90k() -> Publication {
    let mut publication = varied_publication();
    publication.info = TrackInfo {
        priority: 9,
        max_age_ms: 8000,
        timescale: 90_000,
    };
    for group in &mut publication.groups {
        for frame in &mut group.frames {
            frame.timestamp *= 90;
        }
    }
    publication
}

/// One 1 MiB group (16 frames of 64 KiB), then a small group: four times the 256 KiB
/// stream window and the whole 1 MiB connection window (docs/protocol.md §1.4, §2.4).
fn bulk_publication() -> Publication {
    let frames = (0..16u64)
        .map(|i| {
            let payload: Vec<u8> = (0..65_536u32)
                .map(|j| ((j + i as u32 * 7) % 253) as u8)
                .collect();
            Frame::new(i * 10, payload)
        })
        .collect();
    Publication {
        broadcast: "bulk".into(),
        track: "data".into(),
        info: TrackInfo::default(),
        groups: vec![
            Group {
                sequence: 0,
                frames,
            },
            Group {
                sequence: 1,
                frames: vec![Frame::new(1000, "tail")],
            },
        ],
        finish: true,
    }
}

/// What a reference subscriber asks for: everything from the first group, priority 1,
/// max age 10 s (clamped by the publisher).
fn request_all(publication: &Publication) -> SubscribeRequest {
    SubscribeRequest {
        broadcast: publication.broadcast.clone(),
        track: publication.track.clone(),
        priority: 1,
        max_age_ms: 10_000,
        start: publication.groups.first().map(|g| g.sequence),
        end: None,
        stop_after: None,
    }
}

/// `request` as moq-net's subscriber puts it on the wire: Max Age clamped to the
/// publisher's max age from TRACK_INFO (observed; docs/protocol.md only states the publisher
/// side of the clamp, §4.7).
fn clamped(mut request: SubscribeRequest, publisher: TrackInfo) -> SubscribeRequest {
    request.max_age_ms = request.max_age_ms.min(publisher.max_age_ms);
    request
}

/// The same request in skiff's terms.
fn skiff_request(publication: &Publication) -> Request {
    Request {
        start: publication
            .groups
            .first()
            .map_or(Start::Latest, |g| Start::Group(g.sequence)),
        end: WindowEnd::Open,
        ordered: false,
        priority: 1,
        max_latency: SkiffDuration::from_millis(10_000),
    }
}

fn skiff_track_info(info: TrackInfo) -> SkiffTrackInfo {
    track_info("x", info).to_wire()
}

fn opts(base: Options) -> Options {
    base.with_timeout(TIMEOUT)
}

/// skiff's QMux settings chosen to equal moq-dev's `tcp://` values (docs/protocol.md §1.4):
/// 10 000 streams each way and datagrams up to 16 382 bytes.
fn moq_dev_conn() -> conn::Config {
    conn::Config {
        max_streams_bidi: Some(10_000),
        max_streams_uni: Some(10_000),
        max_datagram_frame_size: 16_382,
        ..conn::Config::new()
    }
}

/// Run `f` on a thread with a large stack (a session with a 20 000-slot stream table
/// is 2 MB, more than a test thread's default stack), re-raising its panic.
fn on_big_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .name("skiff".into())
        .stack_size(64 << 20)
        .spawn(f)
        .expect("spawn")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Unwrap a driver result, printing the driver's state and event log on failure.
fn check<T, const N: usize>(
    result: Result<T, DriveError>,
    driver: &Driver<'_, 'static, 'static, N>,
) -> T {
    match result {
        Ok(value) => value,
        Err(err) => panic!("{err}\n{driver:?}\nevents: {:#?}", driver.events()),
    }
}

// ---------------------------------------------------------------------------
// skiff endpoints
// ---------------------------------------------------------------------------

/// What a skiff subscriber saw.
#[derive(Debug)]
struct SkiffReceived {
    groups: Vec<Group>,
    /// Group sequences in the order their streams' GROUP headers were processed.
    arrival: Vec<u64>,
    failed: BTreeMap<u64, String>,
    events: Vec<Ev>,
    /// Bytes read from the socket while the reader was parked, if it was.
    parked_read: Option<u64>,
}

impl SkiffReceived {
    fn saw(&self, want: &Ev) -> bool {
        self.events.contains(want)
    }
}

/// A skiff client that dials through `stream`, asks for every announcement, subscribes
/// to `publication`'s track once its broadcast is announced, reads every group, and
/// closes the session with NO_ERROR once the publisher finished the subscription.
///
/// With `park`, the reader first stays parked (reads nothing) until at least
/// `park` bytes were read from the socket, then 200 ms more; the bytes read by then
/// are reported in [`SkiffReceived::parked_read`].
fn skiff_subscriber<const N: usize>(
    side: Side,
    stream: TcpStream,
    conn: conn::Config,
    publication: &Publication,
    park: Option<u64>,
) -> SkiffReceived {
    let bytes: usize = publication
        .groups
        .iter()
        .flat_map(|g| &g.frames)
        .map(|f| f.payload.len() + 16)
        .sum();
    let pool = leak_pool(bytes / 4096 + 64, 4096);
    let local = leak_track(pool, track_info(&publication.track, publication.info));

    let clock = Clock::new();
    let mut storage = Store::new();
    let (config, peer_hop) = match side {
        Side::Client => (
            Config {
                conn,
                hop: CLIENT_HOP,
                path: Some("/room"),
                role: Role::Subscriber,
                ..Config::new()
            },
            SERVER_HOP,
        ),
        Side::Server => (
            Config {
                conn,
                hop: SERVER_HOP,
                ..Config::new()
            },
            CLIENT_HOP,
        ),
    };
    let session: Session<'_, 'static, 'static, N> =
        Session::new(side, config, clock.now(), &mut storage, None).expect("config");
    let mut driver = Driver::new(session, stream, clock, TIMEOUT).expect("socket");

    // The peer's SETUP first: on a server, its path roots what we name (docs/protocol.md §4.1).
    let connected = driver.run_until("set up", |_, events| {
        events
            .iter()
            .any(|e| matches!(e, Ev::Setup { .. }))
            .then_some(())
    });
    check(connected, &driver);

    // Announce discovery first (docs/protocol.md §3.6), then subscribe to what was found.
    let announce = driver.session_mut().announce_request("").expect("announce");
    let found = driver.run_until("announced", |_, events| {
        events
            .iter()
            .any(|e| matches!(e, Ev::Announced { path, .. } if *path == publication.broadcast))
            .then_some(())
    });
    check(found, &driver);
    let sub = driver
        .session_mut()
        .subscribe(&publication.broadcast, local, skiff_request(publication))
        .expect("subscribe");
    assert_eq!(sub.get(), 0);

    let mut parked_read = None;
    if let Some(bytes) = park {
        while driver.stats().read < bytes {
            let since = std::time::Instant::now();
            let wait = driver.run_until("parked reader: window", |_, _| {
                (since.elapsed() > Duration::from_millis(10)).then_some(())
            });
            check(wait, &driver);
        }
        let since = std::time::Instant::now();
        let wait = driver.run_until("parked reader: more", |_, _| {
            (since.elapsed() > Duration::from_millis(200)).then_some(())
        });
        check(wait, &driver);
        parked_read = Some(driver.stats().read);
    }

    let mut reader = TrackReader::new(local);
    let mut closed = false;
    let want = publication.groups.len();
    let done = driver.run_until("every group", |_, events| {
        reader.poll();
        closed |= events
            .iter()
            .any(|e| matches!(e, Ev::SubscriptionClosed { .. } | Ev::Closed { .. }));
        let read_all = reader.pending_groups() == 0 && reader.complete_count() >= want;
        (closed && read_all).then_some(())
    });
    check(done, &driver);
    let close = driver.close(SessionCode::NoError, "");
    check(close, &driver);

    assert!(
        driver.events().contains(&Ev::Announced {
            request: announce,
            path: publication.broadcast.clone(),
            hops: vec![],
            publisher: peer_hop,
        }),
        "{:#?}",
        driver.events()
    );
    SkiffReceived {
        groups: reader.groups(),
        arrival: driver
            .events()
            .iter()
            .filter_map(|e| match e {
                Ev::Group { sequence, .. } => Some(*sequence),
                _ => None,
            })
            .collect(),
        failed: reader.failed().clone(),
        events: driver.events().to_vec(),
        parked_read,
    }
}

/// A skiff endpoint on `side` that publishes `publication` (in an origin, announced)
/// and serves the peer until the peer closes the session.
fn skiff_publisher<const N: usize>(
    side: Side,
    stream: TcpStream,
    conn: conn::Config,
    publication: &Publication,
    block_size: usize,
) -> Vec<Ev> {
    let bytes: usize = publication
        .groups
        .iter()
        .flat_map(|g| &g.frames)
        .map(|f| f.payload.len() + 16)
        .sum();
    let media = SkiffPublication::new(publication, bytes / block_size + 64, block_size);

    let clock = Clock::new();
    let mut storage = Store::new();
    let config = match side {
        Side::Server => Config {
            conn,
            hop: SERVER_HOP,
            ..Config::new()
        },
        Side::Client => Config {
            conn,
            hop: CLIENT_HOP,
            path: Some("/anon"),
            role: Role::Publisher,
            ..Config::new()
        },
    };
    let session: Session<'_, 'static, 'static, N> =
        Session::new(side, config, clock.now(), &mut storage, Some(media.origin)).expect("config");
    let mut driver = Driver::new(session, stream, clock, TIMEOUT).expect("socket");
    // The reference subscriber closes the session once it has read the whole track.
    let closed = driver.run_until("peer close", |session, events| {
        (session.is_closed() || events.iter().any(|e| matches!(e, Ev::Closed { .. }))).then_some(())
    });
    check(closed, &driver);
    let finish = driver.finish();
    check(finish, &driver);
    assert_eq!(driver.session().served_count(), 0);
    driver.events().to_vec()
}

// ---------------------------------------------------------------------------
// Expected bytes, encoded here from docs/protocol.md §3 (independently of skiff-core)
// ---------------------------------------------------------------------------

fn varint(value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    wire::write_varint(value, &mut out);
    out
}

/// A string: length varint, then the bytes (docs/protocol.md §0).
fn string(text: &str) -> Vec<u8> {
    let mut out = varint(text.len() as u64);
    out.extend_from_slice(text.as_bytes());
    out
}

/// A control message: `Message Length (i)` then the body (§3.2).
fn message(body: &[u8]) -> Vec<u8> {
    let mut out = varint(body.len() as u64);
    out.extend_from_slice(body);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// §3.5: a SETUP stream holding `(id, value)` parameters in this order.
fn setup_stream(params: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let mut body = varint(params.len() as u64);
    for (id, value) in params {
        body.extend(varint(*id));
        body.extend(varint(value.len() as u64));
        body.extend_from_slice(value);
    }
    cat(&[&[0x01], &message(&body)])
}

/// §3.6: Announce stream type + ANNOUNCE_REQUEST.
fn announce_request(prefix: &str, exclude_hop: u64) -> Vec<u8> {
    cat(&[
        &[0x01],
        &message(&cat(&[&string(prefix), &varint(exclude_hop)])),
    ])
}

/// §3.6: ANNOUNCE_OK then one active ANNOUNCE with no hops.
fn announce_ok_one(hop: u64, suffix: &str) -> Vec<u8> {
    cat(&[
        &message(&cat(&[&varint(hop), &varint(1)])),
        &message(&cat(&[&[0x01], &string(suffix), &varint(0)])),
    ])
}

/// §3.7: Track stream type + TRACK.
fn track_request(broadcast: &str, track: &str) -> Vec<u8> {
    cat(&[
        &[0x06],
        &message(&cat(&[&string(broadcast), &string(track)])),
    ])
}

/// §3.7: TRACK_INFO (priority, ordered 0, max age in ms, timescale).
fn track_info_msg(info: TrackInfo) -> Vec<u8> {
    message(&cat(&[
        &[info.priority, 0],
        &varint(info.max_age_ms),
        &varint(info.timescale),
    ]))
}

/// §3.8: Subscribe stream type + SUBSCRIBE of `request` with Subscribe ID `id`.
fn subscribe_msg(id: u64, request: &SubscribeRequest) -> Vec<u8> {
    let opt = |v: Option<u64>| varint(v.map_or(0, |v| v + 1));
    cat(&[
        &[0x02],
        &message(&cat(&[
            &varint(id),
            &string(&request.broadcast),
            &string(&request.track),
            &[request.priority, 0],
            &varint(request.max_age_ms),
            &opt(request.start),
            &opt(request.end),
        ])),
    ])
}

/// §3.8: SUBSCRIBE_START `first`, then SUBSCRIBE_END `end` (exclusive).
fn start_end(first: u64, end: u64) -> Vec<u8> {
    cat(&[
        &[0x00],
        &message(&varint(first)),
        &[0x01],
        &message(&varint(end)),
    ])
}

/// §3.9: a whole group stream: type 0, GROUP, FRAMEs with zigzag timestamp deltas
/// restarting from 0 in each group.
fn group_stream(subscribe: u64, group: &Group) -> Vec<u8> {
    let mut out = cat(&[
        &[0x00],
        &message(&cat(&[&varint(subscribe), &varint(group.sequence)])),
    ]);
    let mut prev = 0i64;
    for frame in &group.frames {
        let ts = i64::try_from(frame.timestamp).expect("timestamp");
        let delta = ts - prev;
        prev = ts;
        out.extend(varint(((delta << 1) ^ (delta >> 63)) as u64));
        out.extend(varint(frame.payload.len() as u64));
        out.extend_from_slice(&frame.payload);
    }
    out
}

// ---------------------------------------------------------------------------
// Capture helpers
// ---------------------------------------------------------------------------

const CLIENT_BIDI: u64 = 0;
const CLIENT_UNI: u64 = 2;
const SERVER_BIDI: u64 = 1;
const SERVER_UNI: u64 = 3;

fn first_record(capture: &Capture, dir: Direction) -> Vec<u8> {
    capture
        .records()
        .into_iter()
        .find(|record| record.dir == dir)
        .expect("a record in each direction")
        .bytes
}

fn transport_params(record: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let frames = wire::parse_frames(wire::record_payload(record).unwrap()).unwrap();
    match frames.as_slice() {
        [Wire::TransportParameters(params)] => params.clone(),
        other => panic!("first record is not the parameters: {other:?}"),
    }
}

/// The one stream of `kind` (low two ID bits) whose data starts with `prefix`.
fn stream_starting(streams: &BTreeMap<u64, StreamLog>, prefix: &[u8], kind: u64) -> u64 {
    let ids: Vec<u64> = streams
        .iter()
        .filter(|(id, log)| *id & 3 == kind && log.data.starts_with(prefix))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "streams of kind {kind} starting {prefix:02x?}: {ids:?}"
    );
    ids[0]
}

/// Group streams (type 0) of `kind` in `streams`, keyed by the GROUP header's sequence.
fn group_streams(streams: &BTreeMap<u64, StreamLog>, kind: u64) -> BTreeMap<u64, &StreamLog> {
    streams
        .iter()
        .filter(|(id, log)| *id & 3 == kind && log.data.first() == Some(&0x00))
        .map(|(_, log)| {
            let mut pos = 1;
            let _len = wire::read_varint(&log.data, &mut pos).unwrap();
            let _sub = wire::read_varint(&log.data, &mut pos).unwrap();
            let seq = wire::read_varint(&log.data, &mut pos).unwrap();
            (seq, log)
        })
        .collect()
}

/// The tap's recording once the connection closed, after [`check_records`]. With
/// `SKIFF_DUMP` set in the environment, every record is also printed (one per line,
/// `C`/`S` = sender, cut at 30 bytes) for debugging with `--nocapture`.
fn finished_capture(tap: &Tap) -> Capture {
    assert!(
        tap.wait_closed(Duration::from_secs(5)),
        "connection still open"
    );
    let capture = tap.capture();
    if std::env::var_os("SKIFF_DUMP").is_some() {
        for record in capture.records() {
            let text = wire::to_hex(&record.bytes);
            println!("{} {}", record.dir.tag(), &text[..text.len().min(90)]);
        }
    }
    check_records(&capture);
    capture
}

/// Checks that hold for every capture: whole records within 16 382 bytes of frames,
/// STREAM frames OFF|LEN (0x0e/0x0f), contiguous streams, nothing left mid-record.
fn check_records(capture: &Capture) {
    for record in capture.records() {
        let payload = wire::record_payload(&record.bytes).unwrap();
        assert!(payload.len() <= 16_382, "record of {} bytes", payload.len());
        for frame in wire::parse_frames(payload).unwrap() {
            if let Wire::Stream { ty, .. } = frame {
                assert!(ty == 0x0e || ty == 0x0f, "STREAM type {ty:#x}");
            }
        }
    }
    for dir in [Direction::ClientToServer, Direction::ServerToClient] {
        assert!(
            capture.tail(dir).is_empty(),
            "{dir:?} ended inside a record"
        );
        assert!(capture.streams(dir).unwrap().values().all(|l| l.contiguous));
    }
}

/// Credit a receiver (`to`) granted on group stream `id`: initial window, then each
/// MAX_STREAM_DATA; and the connection's: initial, then each MAX_DATA. Asserts both
/// only grow and that the sender (`from`) stayed within the last grants.
fn check_credit(capture: &Capture, from: Direction, to: Direction, id: u64) -> (usize, usize) {
    let mut stream_limits = vec![262_144u64];
    let mut conn_limits = vec![1_048_576u64];
    for frame in capture.frames(to).unwrap() {
        match frame {
            Wire::MaxStreamData { id: sid, max } if sid == id => stream_limits.push(max),
            Wire::MaxData(max) => conn_limits.push(max),
            _ => {}
        }
    }
    assert!(
        stream_limits.windows(2).all(|w| w[0] < w[1]),
        "{stream_limits:?}"
    );
    assert!(
        conn_limits.windows(2).all(|w| w[0] < w[1]),
        "{conn_limits:?}"
    );
    let sent = capture.streams(from).unwrap();
    let on_stream = sent[&id].data.len() as u64;
    assert!(on_stream > 262_144, "the group crossed the first window");
    assert!(on_stream <= *stream_limits.last().unwrap());
    let total: u64 = sent.values().map(|log| log.data.len() as u64).sum();
    assert!(total > 1_048_576, "the connection window was crossed");
    assert!(total <= *conn_limits.last().unwrap());
    (stream_limits.len() - 1, conn_limits.len() - 1)
}

// ---------------------------------------------------------------------------
// (a) moq-net publisher → skiff subscriber
// ---------------------------------------------------------------------------

/// moq-net serves the varied publication; a skiff client configured with moq-dev's
/// QMux values dials it through a tap, discovers the broadcast, subscribes and reads
/// every frame. Then the tap's bytes are checked against docs/protocol.md.
#[test]
fn moq_net_publisher_to_skiff_subscriber() {
    let publication = varied_publication();
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let tap = Tap::start(publisher.local_addr().unwrap()).unwrap();
    let stream = skiff_driver::dial(tap.addr(), TIMEOUT).unwrap();

    let fixture = publication.clone();
    let received = on_big_stack(move || {
        skiff_subscriber::<MOQ_DEV_STREAMS>(Side::Client, stream, moq_dev_conn(), &fixture, None)
    });

    // Every frame's bytes, order and timestamp.
    assert!(received.failed.is_empty(), "{:?}", received.failed);
    assert_eq!(received.groups, publication.groups);
    // The one subscription's id, as its TRACK_INFO reports it (the first: 0).
    let sub = received
        .events
        .iter()
        .find_map(|e| match e {
            Ev::TrackInfo { subscription, .. } => Some(*subscription),
            _ => None,
        })
        .expect("TRACK_INFO");
    assert_eq!(sub.get(), 0);
    for want in [
        Ev::Connected {
            protocol: "moq-lite-05".into(),
        },
        Ev::Setup {
            hop: SERVER_HOP,
            role: Role::Both,
            path: None,
        },
        Ev::TrackInfo {
            subscription: sub,
            info: skiff_track_info(TrackInfo::default()),
        },
        Ev::Started {
            subscription: sub,
            group: 3,
        },
        Ev::Ended {
            subscription: sub,
            end: 7,
        },
        Ev::SubscriptionClosed {
            subscription: sub,
            code: None,
        },
    ] {
        assert!(
            received.saw(&want),
            "{want:?} not in {:#?}",
            received.events
        );
    }
    assert!(
        !received
            .events
            .iter()
            .any(|e| matches!(e, Ev::Closed { .. } | Ev::Dropped { .. })),
        "{:#?}",
        received.events
    );

    let report = publisher.join().unwrap();
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);
    assert_eq!(report.peer_path.as_deref(), Some("/room"));
    assert_eq!(report.protocol.as_deref(), Some("moq-lite-05"));

    // (d) The wire, as the tap saw it.
    let capture = finished_capture(&tap);
    let (c, s) = (Direction::ClientToServer, Direction::ServerToClient);
    // Configured with moq-dev's values, skiff's first record is V1 byte for byte, as is
    // moq-net's.
    assert_eq!(
        wire::to_hex(&first_record(&capture, c)),
        wire::to_hex(&hex(V1))
    );
    assert_eq!(first_record(&capture, s), hex(V1));

    let client = capture.streams(c).unwrap();
    let server = capture.streams(s).unwrap();
    // SETUP on client uni 2: Path, Role = subscriber, Hop, then FIN. moq-net's client
    // sends the same set plus Probe = 1 (§6 V5; skiff does not implement probing, §3.11).
    assert_eq!(
        client[&CLIENT_UNI].data,
        setup_stream(&[
            (0x2, b"/room".to_vec()),
            (0x3, varint(2)),
            (0x5, varint(CLIENT_HOP)),
        ])
    );
    assert!(client[&CLIENT_UNI].fin);
    // ANNOUNCE_REQUEST on client bidi 0 (the first request): prefix "", Exclude Hop =
    // our Hop (§3.6; = V6 with Hop 0x2222).
    assert_eq!(client[&0].data, announce_request("", CLIENT_HOP));
    assert_eq!(client[&0].data, hex("01 03 00 62 22"));
    // TRACK (§3.7), FINed once TRACK_INFO (moq-dev's defaults, = V10's) was read.
    let track = stream_starting(&client, &[0x06], CLIENT_BIDI);
    assert_eq!(client[&track].data, track_request("room/cam", "video"));
    // skiff FINs its side once TRACK_INFO is read (§3.7) -- unless moq-net's
    // STOP_SENDING(0), which it sends right after its own FIN, arrives first: then the
    // answer is RESET_STREAM(0) at the final size (QUIC's rule for STOP_SENDING).
    let track_len = client[&track].data.len() as u64;
    assert!(
        client[&track].fin || client[&track].reset == Some((0, track_len)),
        "{:?}",
        client[&track]
    );
    assert_eq!(server[&track].data, track_info_msg(TrackInfo::default()));
    assert_eq!(server[&track].data, hex("06 7f 00 53 88 43 e8"));
    // SUBSCRIBE (§3.8), after TRACK: ID 0, priority 1, max age 10 s, start 3 (+1), open
    // end. (moq-net's own subscriber would send max age 5 s here: it clamps its budget
    // to TRACK_INFO's max age before subscribing; see test (b). skiff sends the budget
    // it was given; the publisher clamps it either way, §4.7.)
    let subscribe = stream_starting(&client, &[0x02], CLIENT_BIDI);
    assert!(subscribe > track, "TRACK is asked before SUBSCRIBE");
    assert_eq!(
        client[&subscribe].data,
        subscribe_msg(0, &request_all(&publication))
    );
    assert_eq!(
        client[&subscribe].data,
        hex("02 16 00 08 72 6f 6f 6d 2f 63 61 6d 05 76 69 64 65 6f 01 00 67 10 04 00")
    );
    // moq-net answers START 3, END 7 (exclusive) and FIN; one uni stream per group.
    assert_eq!(server[&subscribe].data, start_end(3, 7));
    assert!(server[&subscribe].fin);
    let groups = group_streams(&server, SERVER_UNI);
    assert_eq!(groups.len(), publication.groups.len());
    for group in &publication.groups {
        let log = groups[&group.sequence];
        assert_eq!(log.data, group_stream(0, group), "group {}", group.sequence);
        assert!(log.fin);
    }
    // skiff created the groups in the order their streams began on the wire (moq-net
    // ranks them newest first, but interleaves; §3.9: deduplicate, any order).
    let mut wire_order: Vec<(usize, u64)> = groups
        .iter()
        .map(|(seq, log)| (log.first_seen, *seq))
        .collect();
    wire_order.sort();
    let wire_order: Vec<u64> = wire_order.into_iter().map(|(_, seq)| seq).collect();
    assert_eq!(received.arrival, wire_order, "{:#?}", received.events);
    // skiff never sends on moq-net's uni streams, and ends with an application close,
    // code 0 (§3.13).
    assert!(
        client
            .iter()
            .filter(|(id, _)| *id & 3 == SERVER_UNI)
            .all(|(_, log)| log.data.is_empty() && !log.fin && log.reset.is_none())
    );
    let closes: Vec<Wire> = capture
        .frames(c)
        .unwrap()
        .into_iter()
        .filter(|f| matches!(f, Wire::ConnectionClose { .. }))
        .collect();
    assert_eq!(
        closes,
        vec![Wire::ConnectionClose {
            application: true,
            code: 0,
            frame_type: None,
            reason: Vec::new(),
        }]
    );
}

/// The other way of dialing: a moq-net client publishes (Path /anon, 90 kHz, custom
/// TRACK_INFO) to a skiff server that subscribes; skiff asks the client for
/// announcements on a server-initiated bidi stream.
#[test]
fn moq_net_client_publisher_to_skiff_server_subscriber() {
    let publication = varied_publication_90k();
    let (listener, addr) = skiff_driver::listen().unwrap();
    let tap = Tap::start(addr).unwrap();
    let publisher = reference::dial_publisher(
        tap.addr(),
        opts(Options::client()).with_path(Some("/anon")),
        publication.clone(),
    )
    .unwrap();
    let stream = skiff_driver::accept(&listener, TIMEOUT).unwrap();
    // moq-net dialed `/anon`: its broadcast is skiff's `anon/…` (docs/protocol.md §4.1).
    let rooted = Publication {
        broadcast: format!("anon/{}", publication.broadcast),
        ..publication.clone()
    };
    let received =
        skiff_subscriber::<SMALL>(Side::Server, stream, conn::Config::new(), &rooted, None);
    assert!(received.failed.is_empty(), "{:?}", received.failed);
    assert_eq!(received.groups, publication.groups);
    // The one subscription's id, as its TRACK_INFO reports it (the first: 0).
    let sub = received
        .events
        .iter()
        .find_map(|e| match e {
            Ev::TrackInfo { subscription, .. } => Some(*subscription),
            _ => None,
        })
        .expect("TRACK_INFO");
    assert_eq!(sub.get(), 0);
    for want in [
        Ev::Setup {
            hop: CLIENT_HOP,
            role: Role::Publisher,
            path: Some("/anon".into()),
        },
        Ev::TrackInfo {
            subscription: sub,
            info: skiff_track_info(publication.info),
        },
        Ev::Started {
            subscription: sub,
            group: 3,
        },
        Ev::Ended {
            subscription: sub,
            end: 7,
        },
    ] {
        assert!(
            received.saw(&want),
            "{want:?} not in {:#?}",
            received.events
        );
    }
    let report = publisher.join().unwrap();
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);

    let capture = finished_capture(&tap);
    let client = capture.streams(Direction::ClientToServer).unwrap();
    let server = capture.streams(Direction::ServerToClient).unwrap();
    // skiff's requests go out on server bidi streams 1, 5, 9 (§1.6).
    assert_eq!(server[&1].data, announce_request("", SERVER_HOP));
    assert_eq!(client[&1].data, announce_ok_one(CLIENT_HOP, "room/cam"));
    let track = stream_starting(&server, &[0x06], SERVER_BIDI);
    assert_eq!(server[&track].data, track_request("room/cam", "video"));
    assert_eq!(client[&track].data, track_info_msg(publication.info));
    let subscribe = stream_starting(&server, &[0x02], SERVER_BIDI);
    assert_eq!(
        server[&subscribe].data,
        subscribe_msg(0, &request_all(&publication))
    );
    assert_eq!(client[&subscribe].data, start_end(3, 7));
    let groups = group_streams(&client, CLIENT_UNI);
    for group in &publication.groups {
        assert_eq!(groups[&group.sequence].data, group_stream(0, group));
    }
}

// ---------------------------------------------------------------------------
// (b) skiff publisher → moq-net subscriber
// ---------------------------------------------------------------------------

/// skiff serves (as the TCP server, default settings) the varied publication; a
/// moq-net client subscriber dials it through a tap.
#[test]
fn skiff_server_publisher_to_moq_net_client_subscriber() {
    let publication = varied_publication();
    let (listener, addr) = skiff_driver::listen().unwrap();
    let tap = Tap::start(addr).unwrap();
    // The subscriber lingers after the track ended, so moq-net's once-a-second QX_PING
    // (docs/protocol.md §2.5) reaches skiff before the close.
    let client = opts(Options::client()).with_linger(Duration::from_millis(1300));
    // The client dials `/room`: skiff's `room/cam` is its `cam` (docs/protocol.md §4.1).
    let mut request = request_all(&publication);
    request.broadcast = "cam".into();
    let subscriber = reference::dial_subscriber(tap.addr(), client, request).unwrap();
    let stream = skiff_driver::accept(&listener, TIMEOUT).unwrap();
    let events = skiff_publisher::<SMALL>(
        Side::Server,
        stream,
        conn::Config::new(),
        &publication,
        4096,
    );

    let received = subscriber.join().unwrap();
    assert_eq!(received.end, End::TrackFinished);
    assert_eq!(received.protocol.as_deref(), Some("moq-lite-05"));
    assert_eq!(received.announced, vec!["cam".to_owned()]);
    assert_eq!(received.info, Some(publication.info));
    assert_eq!(received.groups, publication.groups);
    // skiff sends group streams newest first (§4.6).
    assert_eq!(received.arrival, vec![6, 5, 4, 3]);

    // skiff saw moq-net's SETUP (Path /room, Role subscriber, Hop) and its clean close.
    assert!(events.contains(&Ev::Setup {
        hop: CLIENT_HOP,
        role: Role::Subscriber,
        path: Some("/room".into()),
    }));
    assert!(
        events.iter().any(|e| matches!(
            e,
            Ev::Closed {
                code: 0,
                application: true,
                local: false,
                ..
            }
        )),
        "{events:#?}"
    );

    // (d) skiff's side of the wire.
    let capture = finished_capture(&tap);
    let (c, s) = (Direction::ClientToServer, Direction::ServerToClient);
    assert_eq!(first_record(&capture, c), hex(V1));
    // skiff's defaults: V1 but for the stream counts and datagrams (see the constant).
    let ours = first_record(&capture, s);
    assert_eq!(
        wire::to_hex(&ours),
        wire::to_hex(&hex(SKIFF_DEFAULT_PARAMS))
    );
    let mut v1: Vec<(u64, Vec<u8>)> = transport_params(&hex(V1))
        .into_iter()
        .filter(|(id, _)| *id != 0x20)
        .collect();
    for (id, value) in &mut v1 {
        if *id == 0x08 || *id == 0x09 {
            *value = varint(16);
        }
    }
    assert_eq!(transport_params(&ours), v1);

    let client = capture.streams(c).unwrap();
    let server = capture.streams(s).unwrap();
    // SETUP on server uni 3: just the Hop (moq-net's server adds Probe = 1), then FIN.
    assert_eq!(
        server[&SERVER_UNI].data,
        setup_stream(&[(0x5, varint(SERVER_HOP))])
    );
    assert_eq!(server[&SERVER_UNI].data, hex("01 05 01 05 02 51 11"));
    assert!(server[&SERVER_UNI].fin);
    // moq-net's ANNOUNCE_REQUEST on client bidi 0 is V6; skiff answers ANNOUNCE_OK (our
    // Hop, 1 active) and ANNOUNCE active "cam", `room/cam` below the client's root
    // `/room`, no hops (§3.6, §4.1).
    assert_eq!(client[&0].data, announce_request("", CLIENT_HOP));
    assert_eq!(server[&0].data, announce_ok_one(SERVER_HOP, "cam"));
    assert!(!server[&0].fin, "the announce stream stays open");
    // TRACK → TRACK_INFO (V10 exactly: moq-dev's defaults) and FIN.
    let track = stream_starting(&client, &[0x06], CLIENT_BIDI);
    assert_eq!(client[&track].data, track_request("cam", "video"));
    assert_eq!(server[&track].data, hex("06 7f 00 53 88 43 e8"));
    assert!(server[&track].fin);
    // moq-net's SUBSCRIBE: as skiff's in test (a) except that moq-net clamped its
    // 10 s max age to the publisher's 5 s from TRACK_INFO before sending it.
    // skiff answers START 3, END 7 (exclusive), FIN (§3.8, V9 form).
    let subscribe = stream_starting(&client, &[0x02], CLIENT_BIDI);
    let mut asked = request_all(&publication);
    asked.broadcast = "cam".into();
    assert_eq!(
        client[&subscribe].data,
        subscribe_msg(0, &clamped(asked, publication.info))
    );
    assert_eq!(server[&subscribe].data, start_end(3, 7));
    assert!(server[&subscribe].fin);
    // One server uni stream per group, the bytes moq-net's publisher sends, FIN.
    let groups = group_streams(&server, SERVER_UNI);
    assert_eq!(groups.len(), publication.groups.len());
    for group in &publication.groups {
        let log = groups[&group.sequence];
        assert_eq!(log.data, group_stream(0, group), "group {}", group.sequence);
        assert!(log.fin && log.reset.is_none());
    }
    // skiff answered moq-net's QX_PING requests, echoing the sequence (V14).
    let pings = |dir: Direction, response: bool| -> Vec<u64> {
        capture
            .frames(dir)
            .unwrap()
            .into_iter()
            .filter_map(|f| match f {
                Wire::Ping {
                    response: r,
                    sequence,
                } if r == response => Some(sequence),
                _ => None,
            })
            .collect()
    };
    let requests = pings(c, false);
    let responses = pings(s, true);
    assert!(!requests.is_empty(), "moq-net pinged within 1.3 s");
    assert_eq!(responses, requests);
}

/// A live skiff publisher: group 10 exists when the moq-net subscriber arrives asking
/// for the latest group; groups 11–13 are written frame by frame while the session
/// runs; then the track finishes.
#[test]
fn skiff_live_publisher_to_moq_net_subscriber_from_latest() {
    let groups: Vec<Group> = (10..=13u64)
        .map(|seq| Group {
            sequence: seq,
            frames: vec![
                Frame::new(seq * 1000, format!("key {seq}")),
                Frame::new(seq * 1000 + 33, vec![seq as u8; 3000]),
                Frame::new(seq * 1000 + 20, ""),
            ],
        })
        .collect();
    let live = Publication {
        broadcast: "live/cam".into(),
        track: "video".into(),
        info: TrackInfo::default(),
        groups: groups[..1].to_vec(),
        finish: false,
    };
    let mut media = SkiffPublication::new(&live, 64, 4096);

    let (listener, addr) = skiff_driver::listen().unwrap();
    let tap = Tap::start(addr).unwrap();
    let mut request = request_all(&live);
    request.start = None;
    let subscriber = reference::dial_subscriber(
        tap.addr(),
        opts(Options::client()).with_path(Some("/")),
        request,
    )
    .unwrap();
    let stream = skiff_driver::accept(&listener, TIMEOUT).unwrap();

    let clock = Clock::new();
    let mut storage = Store::new();
    let config = Config {
        hop: SERVER_HOP,
        ..Config::new()
    };
    let session: Session<'_, 'static, 'static, SMALL> = Session::new(
        Side::Server,
        config,
        clock.now(),
        &mut storage,
        Some(media.origin),
    )
    .expect("config");
    let mut driver = Driver::new(session, stream, clock, TIMEOUT).expect("socket");
    let served = driver.run_until("subscribed", |session, _| {
        (session.served_count() == 1 && session.sending_groups() == 0).then_some(())
    });
    check(served, &driver);

    // One frame per turn of the driver, so group data goes out while it is written.
    let producer = &media.producer;
    let mut next = 1;
    let mut writer = None;
    let mut frame = 0;
    let written = driver.run_until("live groups", |_, _| {
        let Some(group) = groups.get(next) else {
            return Some(());
        };
        let w = writer.get_or_insert_with(|| producer.create_group(group.sequence).unwrap());
        let f = &group.frames[frame];
        w.write_frame(f.timestamp, &f.payload).unwrap();
        frame += 1;
        if frame == group.frames.len() {
            if let Some(mut w) = writer.take() {
                w.finish().unwrap();
            }
            frame = 0;
            next += 1;
        }
        None
    });
    check(written, &driver);
    media.producer.finish();
    let closed = driver.run_until("peer close", |session, _| session.is_closed().then_some(()));
    check(closed, &driver);
    let finish = driver.finish();
    check(finish, &driver);

    let received = subscriber.join().unwrap();
    assert_eq!(received.end, End::TrackFinished);
    assert_eq!(received.announced, vec!["live/cam".to_owned()]);
    assert_eq!(received.groups, groups);

    let capture = finished_capture(&tap);
    let client = capture.streams(Direction::ClientToServer).unwrap();
    let server = capture.streams(Direction::ServerToClient).unwrap();
    // SUBSCRIBE with Group Start 0 (latest); skiff starts at 10 and ends at 14.
    let subscribe = stream_starting(&client, &[0x02], CLIENT_BIDI);
    let mut wanted = clamped(request_all(&live), live.info);
    wanted.start = None;
    assert_eq!(client[&subscribe].data, subscribe_msg(0, &wanted));
    assert_eq!(server[&subscribe].data, start_end(10, 14));
    let streams = group_streams(&server, SERVER_UNI);
    for group in &groups {
        assert_eq!(streams[&group.sequence].data, group_stream(0, group));
    }
}

/// skiff dials (as the TCP client, Role publisher, Path /anon) a moq-net server that
/// subscribes; non-default TRACK_INFO on a 90 kHz clock.
#[test]
fn skiff_client_publisher_to_moq_net_server_subscriber() {
    let publication = varied_publication_90k();
    let subscriber =
        reference::serve_subscriber(opts(Options::server()), request_all(&publication)).unwrap();
    let tap = Tap::start(subscriber.local_addr().unwrap()).unwrap();
    let stream = skiff_driver::dial(tap.addr(), TIMEOUT).unwrap();
    let events = skiff_publisher::<SMALL>(
        Side::Client,
        stream,
        conn::Config::new(),
        &publication,
        4096,
    );

    let received = subscriber.join().unwrap();
    assert_eq!(received.end, End::TrackFinished);
    assert_eq!(received.peer_path.as_deref(), Some("/anon"));
    assert_eq!(received.announced, vec![publication.broadcast.clone()]);
    assert_eq!(received.info, Some(publication.info));
    assert_eq!(received.groups, publication.groups);
    assert!(events.contains(&Ev::Setup {
        hop: SERVER_HOP,
        role: Role::Both,
        path: None,
    }));

    let capture = finished_capture(&tap);
    let (c, s) = (Direction::ClientToServer, Direction::ServerToClient);
    assert_eq!(first_record(&capture, s), hex(V1));
    assert_eq!(first_record(&capture, c), hex(SKIFF_DEFAULT_PARAMS));
    let client = capture.streams(c).unwrap();
    let server = capture.streams(s).unwrap();
    // skiff's client SETUP: Path, Role = publisher, Hop.
    assert_eq!(
        client[&CLIENT_UNI].data,
        setup_stream(&[
            (0x2, b"/anon".to_vec()),
            (0x3, varint(1)),
            (0x5, varint(CLIENT_HOP)),
        ])
    );
    // The moq-net server asks skiff (on a server bidi stream) for announcements.
    let announce = stream_starting(&server, &[0x01], SERVER_BIDI);
    assert_eq!(server[&announce].data, announce_request("", SERVER_HOP));
    assert_eq!(
        client[&announce].data,
        announce_ok_one(CLIENT_HOP, "room/cam")
    );
    // TRACK_INFO with the publication's values: priority 9, 8000 ms, 90 kHz.
    let track = stream_starting(&server, &[0x06], SERVER_BIDI);
    assert_eq!(client[&track].data, track_info_msg(publication.info));
    assert_eq!(client[&track].data, hex("08 09 00 5f 40 80 01 5f 90"));
    // moq-net clamps its 10 s budget to our 8 s max age in the SUBSCRIBE.
    let subscribe = stream_starting(&server, &[0x02], SERVER_BIDI);
    assert_eq!(
        server[&subscribe].data,
        subscribe_msg(0, &clamped(request_all(&publication), publication.info))
    );
    assert_eq!(client[&subscribe].data, start_end(3, 7));
    let groups = group_streams(&client, CLIENT_UNI);
    for group in &publication.groups {
        assert_eq!(groups[&group.sequence].data, group_stream(0, group));
    }
}

// ---------------------------------------------------------------------------
// (c) a 1 MiB group each way: QMux flow control across the real crates
// ---------------------------------------------------------------------------

/// moq-net sends a 1 MiB group to a skiff subscriber: skiff must return credit
/// (MAX_STREAM_DATA, MAX_DATA) as its reader consumes the group, or it stalls at
/// 256 KiB.
#[test]
fn large_group_moq_net_to_skiff() {
    let publication = bulk_publication();
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let tap = Tap::start(publisher.local_addr().unwrap()).unwrap();
    let stream = skiff_driver::dial(tap.addr(), TIMEOUT).unwrap();
    // The reader stays parked until the first 256 KiB stream window has arrived.
    let received = skiff_subscriber::<SMALL>(
        Side::Client,
        stream,
        conn::Config::new(),
        &publication,
        Some(262_144),
    );
    assert!(received.failed.is_empty(), "{:?}", received.failed);
    assert_eq!(received.groups, publication.groups);
    publisher.join().unwrap();
    // A parked reader holds moq-net at one stream window of the group: no credit went
    // back, so beyond the 262 144-byte window only records' framing, the control
    // streams and the small group arrived (docs/protocol.md §2.4; README pacing guarantee).
    let parked = received.parked_read.unwrap();
    assert!(parked <= 262_144 + 4096, "{parked} bytes read while parked");

    let capture = finished_capture(&tap);
    let server = capture.streams(Direction::ServerToClient).unwrap();
    let big = server
        .iter()
        .find(|(id, log)| *id & 3 == SERVER_UNI && log.data.starts_with(&hex("00 02 00 00")))
        .map(|(id, _)| *id)
        .unwrap();
    let (stream_updates, conn_updates) = check_credit(
        &capture,
        Direction::ServerToClient,
        Direction::ClientToServer,
        big,
    );
    assert!(stream_updates >= 3 && conn_updates >= 1);
}

/// A skiff publisher sends a 1 MiB group to a moq-net subscriber: skiff must respect
/// moq-net's windows and resume on its MAX_STREAM_DATA / MAX_DATA.
#[test]
fn large_group_skiff_to_moq_net() {
    let publication = bulk_publication();
    let (listener, addr) = skiff_driver::listen().unwrap();
    let tap = Tap::start(addr).unwrap();
    let subscriber = reference::dial_subscriber(
        tap.addr(),
        opts(Options::client()).with_path(Some("/")),
        request_all(&publication),
    )
    .unwrap();
    let stream = skiff_driver::accept(&listener, TIMEOUT).unwrap();
    skiff_publisher::<SMALL>(
        Side::Server,
        stream,
        conn::Config::new(),
        &publication,
        32 * 1024,
    );
    let received = subscriber.join().unwrap();
    assert_eq!(received.end, End::TrackFinished);
    assert_eq!(received.groups, publication.groups);

    let capture = finished_capture(&tap);
    let server = capture.streams(Direction::ServerToClient).unwrap();
    let big = server
        .iter()
        .find(|(id, log)| *id & 3 == SERVER_UNI && log.data.starts_with(&hex("00 02 00 00")))
        .map(|(id, _)| *id)
        .unwrap();
    assert_eq!(
        server[&big].data,
        group_stream(0, &publication.groups[0]),
        "the 1 MiB group stream"
    );
    let (stream_updates, conn_updates) = check_credit(
        &capture,
        Direction::ServerToClient,
        Direction::ClientToServer,
        big,
    );
    assert!(stream_updates >= 3 && conn_updates >= 1);
    // With 32 KiB pool blocks, skiff cuts STREAM frames to moq-net's record budget
    // (16 382 bytes of frames per record). (It writes at most one pool block per STREAM
    // frame: with 4 KiB blocks every frame carries at most 4096 bytes.)
    let largest = capture
        .frames(Direction::ServerToClient)
        .unwrap()
        .iter()
        .filter_map(|f| match f {
            Wire::Stream { data, .. } => Some(data.len()),
            _ => None,
        })
        .max()
        .unwrap();
    assert!(largest > 16_000 && largest <= 16_382, "{largest}");
}

// ---------------------------------------------------------------------------
// Refusals and cancellation against moq-net
// ---------------------------------------------------------------------------

/// skiff asks a moq-net publisher for a missing track, a missing broadcast and a live
/// track; the first two are refused with the stream codes of docs/protocol.md §4.4 on the
/// TRACK stream, the third starts at the latest group and ends cleanly (publisher FIN)
/// when skiff unsubscribes (§3.8: the subscriber FINs its side).
#[test]
fn moq_net_refuses_unknown_tracks_and_honours_unsubscribe() {
    let mut publication = varied_publication();
    publication.finish = false;
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let tap = Tap::start(publisher.local_addr().unwrap()).unwrap();
    let stream = skiff_driver::dial(tap.addr(), TIMEOUT).unwrap();

    let pool = leak_pool(64, 4096);
    let audio = leak_track(pool, track_info("audio", TrackInfo::default()));
    let elsewhere = leak_track(pool, track_info("video", TrackInfo::default()));
    let video = leak_track(pool, track_info("video", TrackInfo::default()));
    let clock = Clock::new();
    let mut storage = Store::new();
    let config = Config {
        hop: CLIENT_HOP,
        ..Config::new()
    };
    let session: Session<'_, 'static, 'static, SMALL> =
        Session::new(Side::Client, config, clock.now(), &mut storage, None).expect("config");
    let mut driver = Driver::new(session, stream, clock, TIMEOUT).expect("socket");
    let setup = driver.run_until("setup", |_, events| {
        events
            .iter()
            .any(|e| matches!(e, Ev::Setup { .. }))
            .then_some(())
    });
    check(setup, &driver);
    let session = driver.session_mut();
    let missing_track = session.subscribe("room/cam", audio, Request::LIVE).unwrap();
    let missing_broadcast = session
        .subscribe("nowhere", elsewhere, Request::LIVE)
        .unwrap();
    let live = session.subscribe("room/cam", video, Request::LIVE).unwrap();

    let mut reader = TrackReader::new(video);
    let mut unsubscribed = false;
    let done = driver.run_until("refusals and unsubscribe", |session, events| {
        reader.poll();
        if !unsubscribed && reader.complete_count() == 1 {
            session.unsubscribe(live).unwrap();
            unsubscribed = true;
        }
        events
            .iter()
            .any(|e| {
                *e == Ev::SubscriptionClosed {
                    subscription: live,
                    code: None,
                }
            })
            .then_some(())
    });
    check(done, &driver);
    let close = driver.close(SessionCode::NoError, "");
    check(close, &driver);

    let events = driver.events();
    for want in [
        Ev::SubscriptionClosed {
            subscription: missing_track,
            code: Some(0x33),
        },
        Ev::SubscriptionClosed {
            subscription: missing_broadcast,
            code: Some(0x36),
        },
        Ev::Started {
            subscription: live,
            group: 6,
        },
    ] {
        assert!(events.contains(&want), "{want:?} not in {events:#?}");
    }
    // Request::LIVE has max age 0: only the latest group, 6, was delivered.
    assert_eq!(reader.groups(), publication.groups[3..].to_vec());
    let report = publisher.join().unwrap();
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);

    // On the wire: the refusals are RESET_STREAMs of the TRACK streams (no SUBSCRIBE
    // was sent for them), and the live subscription's stream was FINed both ways.
    let capture = finished_capture(&tap);
    let client = capture.streams(Direction::ClientToServer).unwrap();
    let server = capture.streams(Direction::ServerToClient).unwrap();
    let track_audio = stream_starting(&client, &track_request("room/cam", "audio"), CLIENT_BIDI);
    let track_nowhere = stream_starting(&client, &track_request("nowhere", "video"), CLIENT_BIDI);
    assert_eq!(server[&track_audio].reset.map(|r| r.0), Some(0x33));
    assert_eq!(server[&track_nowhere].reset.map(|r| r.0), Some(0x36));
    let subscribe = stream_starting(&client, &[0x02], CLIENT_BIDI);
    assert!(client[&subscribe].fin && server[&subscribe].fin);
    assert_eq!(server[&subscribe].data, hex("00 01 06"));
}

/// A moq-net subscriber asks skiff for a track the broadcast lacks: skiff refuses the
/// TRACK request with NOT_FOUND (0x33, docs/protocol.md §4.4) and moq-net reports it.
#[test]
fn skiff_refuses_an_unknown_track_to_moq_net() {
    let publication = varied_publication();
    let (listener, addr) = skiff_driver::listen().unwrap();
    let tap = Tap::start(addr).unwrap();
    let mut request = request_all(&publication);
    request.track = "audio".into();
    // At `/room`, skiff's `room/cam` is `cam` (docs/protocol.md §4.1).
    request.broadcast = "cam".into();
    let subscriber =
        reference::dial_subscriber(tap.addr(), opts(Options::client()), request).unwrap();
    let stream = skiff_driver::accept(&listener, TIMEOUT).unwrap();
    skiff_publisher::<SMALL>(
        Side::Server,
        stream,
        conn::Config::new(),
        &publication,
        4096,
    );
    let received = subscriber.join().unwrap();
    assert_eq!(received.announced, vec!["cam".to_owned()]);
    assert!(
        matches!(&received.end, End::Failed(msg) if msg.contains("not found")),
        "{:?}",
        received.end
    );
    assert!(received.groups.is_empty());

    let capture = finished_capture(&tap);
    let client = capture.streams(Direction::ClientToServer).unwrap();
    let server = capture.streams(Direction::ServerToClient).unwrap();
    let track = stream_starting(&client, &track_request("cam", "audio"), CLIENT_BIDI);
    assert_eq!(server[&track].reset.map(|r| r.0), Some(0x33));
    assert!(server[&track].data.is_empty());
}
