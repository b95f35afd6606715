//! The harness proves itself: moq-net publisher ↔ moq-net subscriber over loopback TCP,
//! both ways round, and a wire tap checked against docs/protocol.md §6.

use std::time::Duration;

use skiff_interop::reference::{
    self, End, Frame, Group, Options, Publication, SubscribeRequest, TrackInfo,
};
use skiff_interop::tap::{Capture, Direction, Tap};
use skiff_interop::wire::{self, Frame as Wire};

/// Bound on every run in this file.
const TIMEOUT: Duration = Duration::from_secs(15);

/// Where the reference capture is stored.
const CAPTURE_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/captures/lite05-clock.txt"
);

/// docs/protocol.md §6 V1: QX_TRANSPORT_PARAMETERS as moq-dev sends it with ["moq-lite-05"].
const V1: &str = "40 54 ff 51 53 30 0d 0a 0d 0a 40 4a \
    01 04 80 00 75 30  04 04 80 10 00 00  05 04 80 04 00 00  06 04 80 04 00 00 \
    07 04 80 04 00 00  08 02 67 10  09 02 67 10  20 02 7f fe \
    c5 71 c5 94 29 cd 08 45 02 7f fe \
    fd 4f 9c 2a 8b 1e 60 75 0c 0b 6d 6f 71 2d 6c 69 74 65 2d 30 35";

fn hex(text: &str) -> Vec<u8> {
    wire::from_hex(text).expect("valid hex in test vector")
}

/// Several groups with varied frames: empty payload, a 20 KB payload (bigger than one
/// QMux record), a negative timestamp delta, and a group with a single frame.
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

fn request_all(publication: &Publication) -> SubscribeRequest {
    SubscribeRequest {
        broadcast: publication.broadcast.clone(),
        track: publication.track.clone(),
        priority: 1,
        // Clamped to the publisher's 5 s; covers the 3 s spread of the fixture.
        max_age_ms: 10_000,
        start: publication.groups.first().map(|g| g.sequence),
        end: None,
        stop_after: None,
    }
}

/// `publication` with its track left open.
///
/// The pair tests read every group, and a finished lite-05 track can end at a moq-net
/// reader before an older group's stream lands (docs/protocol.md §3.8), so they count
/// groups instead of waiting for the end.
fn unfinished(mut publication: Publication) -> Publication {
    publication.finish = false;
    publication
}

/// [`request_all`], ending once every published group has arrived.
fn request_every(publication: &Publication) -> SubscribeRequest {
    SubscribeRequest {
        stop_after: Some(publication.groups.len()),
        ..request_all(publication)
    }
}

fn opts(base: Options) -> Options {
    base.with_timeout(TIMEOUT)
}

// ---------------------------------------------------------------------------
// Reference publisher ↔ reference subscriber
// ---------------------------------------------------------------------------

#[test]
fn server_publisher_to_client_subscriber() {
    let publication = unfinished(varied_publication());
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let addr = publisher.local_addr().unwrap();

    let received =
        reference::dial_subscriber(addr, opts(Options::client()), request_every(&publication))
            .unwrap()
            .join()
            .unwrap();

    assert_eq!(received.end, End::GroupCount);
    assert_eq!(received.protocol.as_deref(), Some("moq-lite-05"));
    assert_eq!(received.announced, vec!["room/cam".to_owned()]);
    assert_eq!(received.info, Some(TrackInfo::default()));
    assert_eq!(
        received.groups, publication.groups,
        "arrival order {:?}",
        received.arrival
    );

    // The subscriber closed the session once it had every group.
    let report = publisher.join().unwrap();
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);
    assert_eq!(report.peer_path.as_deref(), Some("/room"));
}

#[test]
fn client_publisher_to_server_subscriber() {
    let mut publication = unfinished(varied_publication());
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
    let subscriber =
        reference::serve_subscriber(opts(Options::server()), request_every(&publication)).unwrap();
    let addr = subscriber.local_addr().unwrap();

    let publisher = reference::dial_publisher(
        addr,
        opts(Options::client()).with_path(Some("/anon")),
        publication.clone(),
    )
    .unwrap();

    let received = subscriber.join().unwrap();
    assert_eq!(received.end, End::GroupCount);
    assert_eq!(received.peer_path.as_deref(), Some("/anon"));
    assert_eq!(received.announced, vec!["room/cam".to_owned()]);
    assert_eq!(received.info, Some(publication.info));
    assert_eq!(
        received.groups, publication.groups,
        "arrival order {:?}",
        received.arrival
    );

    let report = publisher.join().unwrap();
    assert!(matches!(report.end, End::PeerClosed(_)), "{:?}", report.end);
}

/// An unfinished track's subscriber ends on its group count, not hanging: that
/// is `server_publisher_to_client_subscriber`. Here, a broadcast that never
/// comes.
#[test]
fn subscriber_of_a_missing_broadcast_times_out_cleanly() {
    let publication = unfinished(varied_publication());
    // Bounded by the timeout, with nothing received.
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let mut request = request_all(&publication);
    request.broadcast = "missing".into();
    let received = reference::dial_subscriber(
        publisher.local_addr().unwrap(),
        Options::client().with_timeout(Duration::from_secs(4)),
        request,
    )
    .unwrap()
    .join()
    .unwrap();
    assert_eq!(received.end, End::TimedOut);
    assert_eq!(received.announced, vec!["room/cam".to_owned()]);
    assert!(received.groups.is_empty());
    let report = publisher.stop().unwrap();
    assert!(
        matches!(report.end, End::PeerClosed(_) | End::Stopped),
        "{:?}",
        report.end
    );
}

#[test]
fn large_group_is_flow_controlled_by_the_receiver() {
    // 700 KB in one group: beyond the 256 KiB stream window and the 1 MiB connection
    // window only together with the credit updates of docs/protocol.md §2.4.
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    let publication = Publication {
        broadcast: "bulk".into(),
        track: "data".into(),
        info: TrackInfo::default(),
        groups: vec![Group {
            sequence: 0,
            frames: (0..7).map(|i| Frame::new(i * 10, big.clone())).collect(),
        }],
        finish: true,
    };
    let publisher =
        reference::serve_publisher(opts(Options::server()), publication.clone()).unwrap();
    let tap = Tap::start(publisher.local_addr().unwrap()).unwrap();
    let received = reference::dial_subscriber(
        tap.addr(),
        opts(Options::client()),
        request_all(&publication),
    )
    .unwrap()
    .join()
    .unwrap();
    assert_eq!(received.end, End::TrackFinished);
    assert_eq!(received.groups, publication.groups);
    publisher.join().unwrap();
    assert!(tap.wait_closed(Duration::from_secs(5)));
    let capture = tap.capture();

    let server = capture.streams(Direction::ServerToClient).unwrap();
    let group = server
        .iter()
        .find(|(id, log)| *id & 3 == 3 && log.data.starts_with(&[0x00]))
        .map(|(id, _)| *id)
        .unwrap();
    let mut stream_limits = vec![262_144u64];
    let mut conn_limits = vec![1_048_576u64];
    for frame in capture.frames(Direction::ClientToServer).unwrap() {
        match frame {
            Wire::MaxStreamData { id, max } if id == group => stream_limits.push(max),
            Wire::MaxData(max) => conn_limits.push(max),
            _ => {}
        }
    }
    // Credit only ever grows, and what the publisher sent stayed within the last grant.
    assert!(
        stream_limits.len() > 1 && conn_limits.len() > 1,
        "{stream_limits:?} {conn_limits:?}"
    );
    assert!(
        stream_limits.windows(2).all(|w| w[0] < w[1]),
        "{stream_limits:?}"
    );
    assert!(
        conn_limits.windows(2).all(|w| w[0] < w[1]),
        "{conn_limits:?}"
    );
    assert!(server[&group].data.len() as u64 <= *stream_limits.last().unwrap());
    let total: u64 = server.values().map(|log| log.data.len() as u64).sum();
    assert!(total <= *conn_limits.last().unwrap());

    // STREAM payloads are capped at 16352 bytes and records stay within 16382 (§1.3).
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
    assert_eq!(largest, 16_352);
    for record in capture.records() {
        assert!(wire::record_payload(&record.bytes).unwrap().len() <= 16_382);
    }
}

// ---------------------------------------------------------------------------
// Wire tap
// ---------------------------------------------------------------------------

/// Run the docs/protocol.md §6 session (clock/seconds, groups 5 and 6, SUBSCRIBE of V8)
/// through a tap and return the capture.
fn capture_clock_session() -> Capture {
    let publisher =
        reference::serve_publisher(opts(Options::server()), Publication::clock()).unwrap();
    let tap = Tap::start(publisher.local_addr().unwrap()).unwrap();
    // Linger so the capture includes each side's once-a-second QX_PING exchange.
    let client = opts(Options::client()).with_linger(Duration::from_millis(1300));
    let received = reference::dial_subscriber(tap.addr(), client, SubscribeRequest::clock())
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(received.end, End::TrackFinished);
    // The reader holds the final group and each group it holds is the one published; an
    // older group can land after SUBSCRIBE_END and be lost to it (docs/protocol.md §3.8),
    // so the checks of the capture, not the reader, show that both streams were sent whole.
    let published = Publication::clock().groups;
    assert_eq!(received.groups.last(), published.last());
    assert!(
        received.groups.iter().all(|g| published.contains(g)),
        "{:?}",
        received.groups
    );
    publisher.join().unwrap();
    assert!(
        tap.wait_closed(Duration::from_secs(5)),
        "the tapped connection did not close"
    );
    tap.capture()
}

fn first_record(capture: &Capture, dir: Direction) -> Vec<u8> {
    capture
        .records()
        .into_iter()
        .find(|record| record.dir == dir)
        .expect("a record in each direction")
        .bytes
}

#[test]
fn tap_sees_transport_parameters_first_identical_to_v1() {
    let capture = capture_clock_session();
    for dir in [Direction::ClientToServer, Direction::ServerToClient] {
        let first = first_record(&capture, dir);
        let frames = wire::parse_frames(wire::record_payload(&first).unwrap()).unwrap();
        assert!(
            matches!(frames.as_slice(), [Wire::TransportParameters(_)]),
            "{dir:?}: {frames:?}"
        );
        assert_eq!(wire::to_hex(&first), wire::to_hex(&hex(V1)), "{dir:?}");
        assert_eq!(first.len(), 86);
        assert!(
            capture.tail(dir).is_empty(),
            "{dir:?} ended inside a record"
        );
    }
    if std::env::var_os("SKIFF_WRITE_CAPTURE").is_some() {
        let header = "skiff interop capture: moq-net 0.3.18 client (Hop 0x2222, Path /room, subscriber)\n\
                      <-> moq-net 0.3.18 server (Hop 0x1111, publisher) over qmux 0.5.3 (qmux-01), moq-lite-05.\n\
                      Broadcast clock, track seconds, groups 5 and 6 (hello @ (g-4)*1000 ms, world! 33 ms later),\n\
                      track finished after group 6; SUBSCRIBE priority 3, max age 250 ms, groups 5..=9.\n\
                      C = client -> server, S = server -> client. One QMux record per line (Size prefix\n\
                      included), in the order the tap saw them complete. Regenerate with\n\
                      SKIFF_WRITE_CAPTURE=1 cargo test -p skiff-interop --test reference_pair tap_sees";
        std::fs::write(CAPTURE_PATH, capture.to_text(header)).unwrap();
    }
    check_clock_session(&capture);
}

#[test]
fn saved_capture_decodes_and_matches_the_vectors() {
    let text = std::fs::read_to_string(CAPTURE_PATH).unwrap();
    assert!(text.len() < 50 * 1024);
    let capture = Capture::from_text(&text).unwrap();
    for dir in [Direction::ClientToServer, Direction::ServerToClient] {
        assert_eq!(first_record(&capture, dir), hex(V1));
    }
    check_clock_session(&capture);
    // V14: the saved session lasted long enough for a QX_PING round trip each way.
    let records: Vec<String> = capture
        .records()
        .iter()
        .map(|r| wire::to_hex(&r.bytes))
        .collect();
    assert!(records.contains(&"09 f4 8c 67 52 9e f8 c7 bd 00".to_owned()));
    assert!(records.contains(&"09 f4 8c 67 52 9e f8 c7 be 00".to_owned()));
}

/// docs/protocol.md §6 V12: the whole group-5 stream.
const GROUP_5: &str = "00 02 00 05 47 d0 05 68 65 6c 6c 6f 40 42 06 77 6f 72 6c 64 21";
/// Group 6: same frames, first timestamp 2000 (ZZ 4000 = 4f a0).
const GROUP_6: &str = "00 02 00 06 4f a0 05 68 65 6c 6c 6f 40 42 06 77 6f 72 6c 64 21";

/// Decode a lite-05 SETUP stream (type 0x1, length, count, params) into a sorted list.
fn setup_params(data: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut pos = 0;
    assert_eq!(
        wire::read_varint(data, &mut pos),
        Ok(1),
        "stream type Setup"
    );
    let len = wire::read_varint(data, &mut pos).unwrap() as usize;
    assert_eq!(pos + len, data.len(), "SETUP fills the stream");
    let count = wire::read_varint(data, &mut pos).unwrap();
    let mut params = Vec::new();
    for _ in 0..count {
        let id = wire::read_varint(data, &mut pos).unwrap();
        let len = wire::read_varint(data, &mut pos).unwrap() as usize;
        params.push((id, data[pos..pos + len].to_vec()));
        pos += len;
    }
    assert_eq!(pos, data.len());
    params.sort();
    params
}

/// The one stream of `dir` whose data starts with `prefix`.
fn stream_starting(
    streams: &std::collections::BTreeMap<u64, wire::StreamLog>,
    prefix: &[u8],
    kind: u64,
) -> u64 {
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

/// Checks on a captured clock session that hold run after run: stream contents are
/// compared by stream, SETUPs as parameter sets (moq-dev's SETUP order is not
/// deterministic), and record/frame shapes everywhere.
fn check_clock_session(capture: &Capture) {
    use Direction::{ClientToServer as C, ServerToClient as S};
    const CLIENT_BIDI: u64 = 0;
    const CLIENT_UNI: u64 = 2;
    const SERVER_UNI: u64 = 3;

    // Records: one frame each, within 16382 bytes; STREAM frames always OFF|LEN.
    for record in capture.records() {
        let payload = wire::record_payload(&record.bytes).unwrap();
        assert!(payload.len() <= 16382);
        let frames = wire::parse_frames(payload).unwrap();
        assert_eq!(
            frames.len(),
            1,
            "one frame per record: {}",
            wire::to_hex(&record.bytes)
        );
        if let Wire::Stream { ty, .. } = frames[0] {
            assert!(ty == 0x0e || ty == 0x0f, "STREAM type {ty:#x}");
        }
    }
    let records: Vec<(Direction, String)> = capture
        .records()
        .into_iter()
        .map(|r| (r.dir, wire::to_hex(&r.bytes)))
        .collect();
    let has = |dir: Direction, vector: &str| records.contains(&(dir, wire::to_hex(&hex(vector))));

    let client = capture.streams(C).unwrap();
    let server = capture.streams(S).unwrap();
    assert!(
        client
            .values()
            .chain(server.values())
            .all(|log| log.contiguous)
    );

    // V3: the Announce stream opens as client bidi 0 in one STREAM frame; V6 its content.
    assert!(has(C, "09 0e 00 00 05 01 03 00 62 22"));
    assert!(client[&0].data.starts_with(&hex("01 03 00 62 22")));
    // V7: ANNOUNCE_OK (Hop 0x1111, 1 active) then ANNOUNCE active "clock", no hops.
    assert_eq!(
        server[&0].data,
        hex("03 51 11 01 08 01 05 63 6c 6f 63 6b 00")
    );

    // V5: SETUP on client uni 2 and server uni 3, each FINed right after.
    assert_eq!(
        setup_params(&client[&2].data),
        vec![
            (1, vec![1]),
            (2, b"/room".to_vec()),
            (3, vec![2]),
            (5, hex("62 22")),
        ]
    );
    assert!(client[&2].fin && server[&3].fin);
    assert!(has(C, "04 0f 02 14 00"), "V3 FIN record");
    assert_eq!(
        setup_params(&server[&3].data),
        vec![(1, vec![1]), (5, hex("51 11"))]
    );

    // V10: TRACK on a client bidi stream, TRACK_INFO back, then FIN.
    let track = stream_starting(&client, &[0x06], CLIENT_BIDI);
    assert_eq!(
        client[&track].data,
        hex("06 0e 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73")
    );
    assert_eq!(server[&track].data, hex("06 7f 00 53 88 43 e8"));
    assert!(server[&track].fin);

    // V8: SUBSCRIBE; V9: SUBSCRIBE_START 5, then SUBSCRIBE_END 7 (exclusive), then FIN.
    let subscribe = stream_starting(&client, &[0x02], CLIENT_BIDI);
    assert!(subscribe > track, "TRACK is asked before SUBSCRIBE");
    assert_eq!(
        client[&subscribe].data,
        hex("02 15 00 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 00 40 fa 06 0a")
    );
    assert_eq!(server[&subscribe].data, hex("00 01 05 01 01 07"));
    assert!(server[&subscribe].fin);

    // V11/V12: one server uni stream per group, each FINed on a frame boundary.
    let group5 = stream_starting(&server, &hex("00 02 00 05"), SERVER_UNI);
    let group6 = stream_starting(&server, &hex("00 02 00 06"), SERVER_UNI);
    assert_eq!(server[&group5].data, hex(GROUP_5));
    assert_eq!(server[&group6].data, hex(GROUP_6));
    assert!(server[&group5].fin && server[&group6].fin);
    assert!(
        has(S, &format!("04 0f {group5:02x} 15 00")),
        "V12 FIN after 21 bytes"
    );
    // Nobody sends data on the peer's uni streams (only STOP_SENDING, the receiver's frame).
    let sends_on = |logs: &std::collections::BTreeMap<u64, wire::StreamLog>, kind: u64| {
        logs.iter().any(|(id, log)| {
            id & 3 == kind && (!log.data.is_empty() || log.fin || log.reset.is_some())
        })
    };
    assert!(!sends_on(&client, SERVER_UNI) && !sends_on(&server, CLIENT_UNI));

    // Every QX_PING response echoes a request the other side sent (a request sent just
    // before the close may go unanswered, so not the other way round).
    for (dir, other) in [(C, S), (S, C)] {
        let requests: Vec<u64> = capture
            .frames(dir)
            .unwrap()
            .iter()
            .filter_map(|f| match f {
                Wire::Ping {
                    response: false,
                    sequence,
                } => Some(*sequence),
                _ => None,
            })
            .collect();
        let responses: Vec<u64> = capture
            .frames(other)
            .unwrap()
            .iter()
            .filter_map(|f| match f {
                Wire::Ping {
                    response: true,
                    sequence,
                } => Some(*sequence),
                _ => None,
            })
            .collect();
        assert!(
            responses.iter().all(|seq| requests.contains(seq)),
            "{dir:?}: {requests:?} vs {responses:?}"
        );
    }

    // The subscribing client ends the session with an application close, code 0. (moq-dev
    // may still emit a few frames after its close frame, e.g. a PROBE report, so this is
    // not necessarily the last frame.)
    let closes: Vec<Wire> = capture
        .frames(C)
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
            reason: Vec::new()
        }]
    );
}
