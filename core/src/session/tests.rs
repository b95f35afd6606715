//! Session tests: byte checks against docs/protocol.md §6, end-to-end runs in the
//! simulated pair (every split point, random chunking, latency, small
//! credit), and misbehaving peers scripted with a raw QMux connection.
//!
//! The suite of two sessions talking ([`over_qmux`], `tests/suite.rs` with
//! `tests/chunks.rs`) runs once over QMux and once over the in-memory stream
//! transport ([`over_memory`]), and once more over that transport delivering
//! request streams before group streams as a QUIC library may
//! ([`over_unordered`]); its byte checks compare the moq-lite bytes of
//! each stream, which are the same on both. The tests in this file run over
//! QMux only, because what they check is QMux's own: records cut at every
//! split point of the byte stream, the bytes `poll_transmit` writes into the
//! caller's buffer, peers scripted record by record as a raw QMux connection
//! ([`Raw`]: malformed or misbehaving peers, SETUP details, full tables),
//! QMux's stream table (a table too full to open our SETUP, the 160-slot
//! table of the priority test), the input buffer of `handle_input`
//! ([`Inbox`], `tests/inbox.rs`), and gathered writes and STREAM_REF
//! lending, which only QMux offers.

extern crate std;

use core::cell::Cell;
use std::string::ToString;
use std::vec;
use std::vec::Vec;

use super::harness::{Chunking, Ev, Lender, Node, Pair, Raw, Rng, Scarce, Tap, Wire, hex};
use super::*;
use crate::conn::{self, Connection};
use crate::model::group::Next;
use crate::model::path::Path;
use crate::model::{broadcast, origin, track};
use crate::pool::{BlockMeta, Pool, PoolStorage};
use crate::session::Resolve;
use crate::time::{Duration, Instant};
use crate::window::{End, Request, Start};
use crate::wire::lite::{Role, SessionCode, StreamCode};
use crate::wire::qmux::{Dir, Side};

type St<'a, 'p> = Storage<'a, 'p, 16, 256, 4, 4, 8, 8, 32>;

/// The transport of the tests in this file (the shared suite names its own).
type Tr = Connection<32>;

fn cfg(hop: u64) -> Config<'static> {
    Config {
        hop,
        ..Config::new()
    }
}

/// Writes a whole group of `(timestamp, payload)` frames.
fn write_group(producer: &track::Producer<'_, '_>, seq: u64, frames: &[(u64, &[u8])]) {
    let mut g = producer.create_group(seq).expect("create group");
    for (t, p) in frames {
        g.write_frame(*t, p).expect("write frame");
    }
    g.finish().expect("finish group");
}

/// Reads every frame of group `seq` of `track` (which must be complete).
fn read_group(track: track::Ref<'_, '_>, seq: u64) -> Frames {
    let mut c = track.group(seq).expect("group held");
    let mut out = Vec::new();
    loop {
        match c.read_frame_header().expect("read header") {
            Next::Ready(h) => {
                let mut buf = vec![0u8; h.len];
                let mut got = 0;
                while got < h.len {
                    match c.read_payload(&mut buf[got..]).expect("read payload") {
                        Next::Ready(n) => got += n,
                        _ => panic!("payload incomplete"),
                    }
                }
                out.push((h.timestamp, buf));
            }
            Next::Finished => return out,
            Next::Pending => panic!("group {seq} incomplete"),
        }
    }
}

/// Reads whatever bytes of group 0 of `track` are there past `reader`
/// (opened on first use); returns how many.
fn read_group_bytes<'t, 'p>(
    track: track::Ref<'t, 'p>,
    reader: &mut Option<crate::model::group::Consumer<'t, 'p>>,
) -> u64 {
    if reader.is_none() {
        *reader = track.group(0);
    }
    let mut read = 0;
    if let Some(r) = reader.as_mut() {
        while let Ok(Next::Ready(chunk)) = r.chunk() {
            let k = chunk.len();
            read += k as u64;
            r.advance(k);
        }
    }
    read
}

/// A group's frames: (timestamp, payload).
type Frames = Vec<(u64, Vec<u8>)>;

fn frames(list: &[(u64, &str)]) -> Frames {
    list.iter()
        .map(|(t, s)| (*t, s.as_bytes().to_vec()))
        .collect()
}

// ---------------------------------------------------------------------------
// The docs/protocol.md §6 session: broadcast "clock", track "seconds", groups 5 and 6
// ---------------------------------------------------------------------------

#[test]
fn clock_session_at_every_split_point() {
    use over_qmux::suite::{check_clock, clock_session};
    let whole = clock_session(|_| {});
    check_clock(&whole);
    assert!(whole.s2c.len() > 150 && whole.c2s.len() > 100);
    for k in 0..=whole.s2c.len() {
        let o = clock_session(|p| p.ba.chunking = Chunking::SplitAt(k));
        check_clock(&o);
    }
    for k in 0..=whole.c2s.len() {
        let o = clock_session(|p| p.ab.chunking = Chunking::SplitAt(k));
        check_clock(&o);
    }
}

// ---------------------------------------------------------------------------
// SETUP (docs/protocol.md §3.4, §3.5, §6 V5)
// ---------------------------------------------------------------------------

/// A session against a raw QMux peer; `script` runs once the raw side is established.
macro_rules! raw_pair {
    ($side:expr, $config:expr, $origin:expr, $storage:ident, $pair:ident) => {
        let mut $storage = St::new();
        let session = Session::new($side, $config, Instant::ZERO, &mut $storage, $origin).unwrap();
        let raw = Raw::new(
            match $side {
                Side::Client => Side::Server,
                Side::Server => Side::Client,
            },
            conn::Config::new(),
        );
        let mut $pair = Pair::new(Node::new(session), raw);
        assert!($pair.run(1000, |p| p.b.established && p.a.session.is_established()));
    };
}

#[test]
fn stream_table_must_leave_room_for_our_own_streams() {
    // Found against moq-net (interop): advertising 10 000 + 10 000 streams on a
    // 20 000-slot table reserves every slot for the peer, so our SETUP could never
    // be opened and the session stalled silently. Refuse such a configuration.
    let full = Config {
        conn: conn::Config {
            max_streams_bidi: Some(16),
            max_streams_uni: Some(16),
            ..conn::Config::new()
        },
        ..Config::new()
    };
    let mut st = St::new();
    let refused: Result<Session<'_, '_, '_, 32>, _> =
        Session::new(Side::Client, full, Instant::ZERO, &mut st, None);
    assert!(matches!(
        refused,
        Err(ConfigError::Conn(conn::ConfigError::StreamsOverCapacity))
    ));
    // One slot to spare is enough: the SETUP goes out.
    let spare = Config {
        conn: conn::Config {
            max_streams_bidi: Some(15),
            max_streams_uni: Some(16),
            ..conn::Config::new()
        },
        ..Config::new()
    };
    raw_pair!(Side::Client, spare, None, st2, pair);
    pair.settle(Duration::from_millis(10));
    assert_eq!(pair.b.received(2), hex("01 01 00"));
}

#[test]
fn client_setup_is_v5() {
    let config = Config {
        path: Some("/room"),
        ..Config::new()
    };
    raw_pair!(Side::Client, config, None, st, pair);
    pair.settle(Duration::from_millis(10));
    // Client uni stream 2: exactly the minimal SETUP of V5, then FIN.
    assert_eq!(pair.b.received(2), hex("01 08 01 02 05 2f 72 6f 6f 6d"));
    assert!(pair.b.streams[&2].1);
}

#[test]
fn setup_with_role_and_hop() {
    let config = Config {
        path: Some("/room"),
        role: Role::Publisher,
        hop: 0x2222,
        ..Config::new()
    };
    raw_pair!(Side::Client, config, None, st, pair);
    pair.settle(Duration::from_millis(10));
    // Path, Role=1, Hop=0x2222 (order is ours; moq-dev's varies).
    assert_eq!(
        pair.b.received(2),
        hex("01 0f 03 02 05 2f 72 6f 6f 6d 03 01 01 05 02 62 22")
    );
}

#[test]
fn server_setup_is_empty_without_hop() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.settle(Duration::from_millis(10));
    // V5: the empty SETUP; a server never sends Path or Role.
    assert_eq!(pair.b.received(3), hex("01 01 00"));
}

#[test]
fn peer_setup_is_reported_with_its_path() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.b.open(
        Dir::Uni,
        &hex("01 12 04 03 01 02 05 02 62 22 02 05 2f 72 6f 6f 6d 01 01 01"),
        true,
    );
    assert!(pair.run(1000, |p| p.a.session.is_setup()));
    pair.settle(Duration::from_millis(10));
    assert!(pair.a.events.contains(&Ev::Setup {
        hop: 0x2222,
        role: Role::Subscriber,
        path: Some("/room".into()),
    }));
    assert_eq!(pair.a.session.peer_hop(), 0x2222);
    assert_eq!(pair.b.closed, None);
}

#[test]
fn server_reports_the_path_its_transport_carried() {
    // docs/protocol.md §9.3: over WebSocket the request URI is the path; a
    // SETUP Path (here `/room`) does not replace it, and the server's own
    // SETUP stays empty.
    let config = Config {
        path: Some("/anon?jwt=x"),
        ..Config::new()
    };
    raw_pair!(Side::Server, config, None, st, pair);
    pair.b.open(
        Dir::Uni,
        &hex("01 12 04 03 01 02 05 02 62 22 02 05 2f 72 6f 6f 6d 01 01 01"),
        true,
    );
    assert!(pair.run(1000, |p| p.a.session.is_setup()));
    pair.settle(Duration::from_millis(10));
    assert!(pair.a.events.contains(&Ev::Setup {
        hop: 0x2222,
        role: Role::Subscriber,
        path: Some("/anon?jwt=x".into()),
    }));
    assert_eq!(pair.b.received(3), hex("01 01 00"));
}

#[test]
fn a_protocol_fixed_by_the_transport_is_not_negotiated() {
    // docs/protocol.md §9.2: both ends fixed to moq-lite-05 by the WebSocket
    // subprotocol send no application_protocols and come up with it.
    let fixed = conn::Config {
        fixed_protocol: Some(conn::MOQ_LITE_05),
        ..conn::Config::new()
    };
    let config = Config {
        conn: fixed,
        ..Config::new()
    };
    let mut st = St::new();
    let session: Session<'_, '_, '_, 32> =
        Session::new(Side::Server, config, Instant::ZERO, &mut st, None).unwrap();
    let mut pair = Pair::new(Node::new(session), Raw::new(Side::Client, fixed));
    assert!(pair.run(1000, |p| p.b.established && p.a.session.is_established()));
    assert!(pair.a.events.contains(&Ev::Connected {
        protocol: conn::MOQ_LITE_05.into()
    }));

    // A peer that negotiates in-band anyway breaks the handshake.
    let mut st = St::new();
    let session: Session<'_, '_, '_, 32> =
        Session::new(Side::Server, config, Instant::ZERO, &mut st, None).unwrap();
    let mut pair = Pair::new(
        Node::new(session),
        Raw::new(Side::Client, conn::Config::new()),
    );
    assert!(pair.run(1000, |p| p.a.closed().is_some()));
    assert!(!pair.a.session.is_established());
}

#[test]
fn duplicate_setup_closes_with_protocol_violation() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(pair.b.closed.as_ref().map(|c| c.0), Some(0x3));
    assert!(matches!(
        pair.a.closed(),
        Some(Ev::Closed {
            code: 3,
            local: true,
            ..
        })
    ));
}

#[test]
fn malformed_setup_closes_with_protocol_violation() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    // A repeated parameter ID (§3.5).
    pair.b
        .open(Dir::Uni, &hex("01 07 02 05 01 01 05 01 02"), true);
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(pair.b.closed.as_ref().map(|c| c.0), Some(0x3));
}

#[test]
fn setup_timeout_closes() {
    let config = Config {
        setup_timeout: Duration::from_secs(2),
        ..Config::new()
    };
    raw_pair!(Side::Server, config, None, st, pair);
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(
        pair.b.closed.as_ref().map(|c| c.0),
        Some(SessionCode::ControlMessageTimeout.to_code())
    );
    assert!(pair.now >= Instant::from_millis(2000));
}

// ---------------------------------------------------------------------------
// Malformed and unknown input (docs/protocol.md §3.2, §3.3, §3.13)
// ---------------------------------------------------------------------------

#[test]
fn malformed_subscribe_closes_with_protocol_violation() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    // SUBSCRIBE whose body has a trailing byte.
    pair.b.open(
        Dir::Bidi,
        &hex("02 0b 00 01 61 01 62 00 00 00 00 00 ff"),
        false,
    );
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(pair.b.closed.as_ref().map(|c| c.0), Some(0x3));
}

#[test]
fn malformed_response_closes_with_protocol_violation() {
    // The raw peer is the publisher: it answers TRACK, then sends an unknown response type.
    let mut pc = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut pc);
    let local = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    raw_pair!(Side::Client, Config::new(), None, st, pair);
    pair.a
        .session
        .subscribe("b", local.handle(), Request::LIVE)
        .unwrap();
    assert!(pair.run(1000, |p| !p.b.received(0).is_empty()));
    let track_stream = crate::wire::qmux::StreamId(0);
    pair.b
        .write(track_stream, &hex("06 7f 00 53 88 43 e8"), true);
    assert!(pair.run(1000, |p| !p.b.received(4).is_empty()));
    pair.b
        .write(crate::wire::qmux::StreamId(4), &hex("07 01 00"), false);
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(pair.b.closed.as_ref().map(|c| c.0), Some(0x3));
    // The local track learns the session ended.
    assert_eq!(
        local.handle().status(),
        track::Status::Aborted(StreamCode::SessionClosed.to_code())
    );
}

#[test]
fn unknown_stream_types_are_refused_per_stream() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let bidi = pair.b.open(Dir::Bidi, &hex("09 00"), false);
    let uni = pair.b.open(Dir::Uni, &hex("07 00"), false);
    let probe = pair.b.open(Dir::Bidi, &hex("04"), false);
    pair.settle(Duration::from_millis(50));
    // Reset and stop-sending on those streams only; the session lives on.
    assert!(pair.b.resets.contains(&(bidi.value(), 0)));
    assert!(pair.b.stops.contains(&(bidi.value(), 0)));
    assert!(pair.b.stops.contains(&(uni.value(), 0)));
    assert!(pair.b.resets.contains(&(probe.value(), 0)));
    assert_eq!(pair.b.closed, None);
    // A TRACK afterwards is still answered (UNROUTABLE: no origin).
    let t = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 74"), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(t.value(), 0x36)));
}

#[test]
fn requests_wait_for_the_peer_setup() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    let t = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let b = broadcast::State::<2>::new(Path::new("b").unwrap()).unwrap();
    let o = origin::State::<2, 4>::new();
    let bp = b.producer().unwrap();
    bp.add(t.handle()).unwrap();
    o.handle().announce(b.handle()).unwrap();
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    // TRACK before SETUP: no answer yet (docs/protocol.md §3.4).
    let id = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 74"), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.received(id.value()).is_empty());
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.received(id.value()), hex("06 7f 00 53 88 43 e8"));
    assert!(pair.b.streams[&id.value()].1);
}

#[test]
fn track_request_waits_for_track_info_still_to_come() {
    // A relay track made before its upstream's TRACK_INFO arrived
    // (docs/protocol.md §3.7: relays re-serve what they received).
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    let t = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let gone = track::State::<2>::new(&pool, track::Info::new("g").unwrap());
    let b = broadcast::State::<2>::new(Path::new("b").unwrap()).unwrap();
    let o = origin::State::<2, 4>::new();
    let bp = b.producer().unwrap();
    bp.add(t.handle()).unwrap();
    bp.add(gone.handle()).unwrap();
    o.handle().announce(b.handle()).unwrap();
    t.handle().await_info();
    gone.handle().await_info();
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let id = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 74"), false);
    let gone_id = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 67"), false);
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.b.received(id.value()).is_empty(),
        "no answer with defaults"
    );
    assert!(
        pair.a.session.has_deferred_requests(),
        "a waiting request keeps the session awake"
    );
    // The values arrive: priority 9, max age 2000 ms, timescale 90000.
    t.handle().set_info(crate::wire::lite::TrackInfo {
        priority: 9,
        max_age: Duration::from_millis(2000),
        timescale: core::num::NonZeroU64::new(90_000).unwrap(),
    });
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        pair.b.received(id.value()),
        hex("08 09 00 47 d0 80 01 5f 90")
    );
    assert!(pair.b.streams[&id.value()].1);
    // A track that ends before its values came: the request is refused with its code.
    assert!(pair.b.resets.iter().all(|(s, _)| *s != gone_id.value()));
    let mut gp = gone.producer().unwrap();
    assert!(gp.abort(0x36));
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(gone_id.value(), 0x36)));
    assert_eq!(pair.b.closed, None);
}

/// Hands out `first` for the first request of any name, `later` for any
/// other request, counting them.
struct ResolveOnce<'b, 'a, 'p> {
    first: track::Ref<'a, 'p>,
    later: track::Ref<'a, 'p>,
    producer: &'b broadcast::Producer<'a, 'p>,
    asked: Cell<usize>,
}

impl<'a, 'p> Resolve<'a, 'p> for ResolveOnce<'_, 'a, 'p> {
    fn resolve(
        &self,
        _broadcast: broadcast::Ref<'a, 'p>,
        _name: &str,
    ) -> Result<track::Ref<'a, 'p>, StreamCode> {
        self.asked.set(self.asked.get() + 1);
        let t = if self.asked.get() == 1 {
            self.first
        } else {
            self.later
        };
        t.await_info();
        self.producer.add(t).map_err(|_| StreamCode::NotFound)?;
        Ok(t)
    }
}

#[test]
fn a_waiting_track_request_is_not_resolved_again() {
    // A relay track made for a TRACK request leaves its broadcast before its
    // TRACK_INFO came (the source refused it): the request is refused, and
    // the relay is not asked to make another track for it.
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    let first = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let later = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let b = broadcast::State::<2>::new(Path::new("b").unwrap()).unwrap();
    let o = origin::State::<2, 4>::new();
    let bp = b.producer().unwrap();
    o.handle().announce(b.handle()).unwrap();
    let hook = ResolveOnce {
        first: first.handle(),
        later: later.handle(),
        producer: &bp,
        asked: Cell::new(0),
    };
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.a.session.set_resolver(Some(&hook));
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let id = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 74"), false);
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.b.received(id.value()).is_empty(),
        "waits for TRACK_INFO"
    );
    assert_eq!(hook.asked.get(), 1);
    // The source refused: the relay drops the track from the broadcast.
    let mut fp = first.producer().unwrap();
    assert!(fp.abort(StreamCode::NotFound.to_code()));
    bp.remove("t").unwrap();
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.b
            .resets
            .contains(&(id.value(), StreamCode::NotFound.to_code()))
    );
    assert_eq!(hook.asked.get(), 1, "the relay was asked again");
    assert_eq!(pair.b.closed, None);
}

#[test]
fn track_requests_past_the_waiting_limit_are_refused() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    let t = track::State::<2>::new(&pool, track::Info::new("t").unwrap());
    let u = track::State::<2>::new(&pool, track::Info::new("u").unwrap());
    let b = broadcast::State::<2>::new(Path::new("b").unwrap()).unwrap();
    let o = origin::State::<2, 4>::new();
    let bp = b.producer().unwrap();
    bp.add(t.handle()).unwrap();
    bp.add(u.handle()).unwrap();
    o.handle().announce(b.handle()).unwrap();
    t.handle().await_info();
    u.handle().await_info();
    let config = Config {
        max_waiting_tracks: 1,
        ..Config::new()
    };
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let first = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 74"), false);
    let second = pair.b.open(Dir::Bidi, &hex("06 04 01 62 01 75"), false);
    pair.settle(Duration::from_millis(50));
    // The first waits for its values; the second is over the limit.
    assert!(pair.b.resets.iter().all(|(s, _)| *s != first.value()));
    assert!(
        pair.b
            .resets
            .contains(&(second.value(), StreamCode::Evicted.to_code()))
    );
    assert_eq!(pair.a.session.refused_track_requests(), 1);
    assert_eq!(pair.b.closed, None);
}

#[test]
fn oversized_request_is_refused_not_buffered() {
    raw_pair!(Side::Server, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    // A TRACK naming a 300-byte broadcast: over the 256-byte control buffer.
    let mut msg = hex("06 41 30 41 2c");
    msg.extend(std::iter::repeat_n(b'x', 300));
    msg.extend(hex("01 74"));
    let id = pair.b.open(Dir::Bidi, &msg, false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.resets.contains(&(id.value(), 0)));
    assert_eq!(pair.b.closed, None);
}

#[test]
fn second_goaway_closes() {
    raw_pair!(Side::Client, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    pair.b.open(Dir::Bidi, &hex("05 01 00"), true);
    assert!(pair.run(1000, |p| p.a.saw(|e| matches!(e, Ev::Goaway { .. }))));
    assert!(pair.a.session.is_going_away());
    pair.b.open(Dir::Bidi, &hex("05 01 00"), true);
    assert!(pair.run(1000, |p| p.b.closed.is_some()));
    assert_eq!(pair.b.closed.as_ref().map(|c| c.0), Some(0x3));
}

#[test]
fn group_for_unknown_subscription_is_stopped() {
    raw_pair!(Side::Client, Config::new(), None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let g = pair.b.open(Dir::Uni, &hex("00 02 09 05 00 00"), false);
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.b
            .stops
            .contains(&(g.value(), StreamCode::Cancel.to_code()))
    );
    assert_eq!(pair.b.closed, None);
}

// ---------------------------------------------------------------------------
// Publisher and subscriber sessions in the pair
// ---------------------------------------------------------------------------

/// A client and a server session over `origin` (server side), connected.
macro_rules! session_pair {
    ($origin:expr, $pair:ident) => {
        session_pair!($origin, Config::new(), Config::new(), $pair)
    };
    ($origin:expr, $ccfg:expr, $scfg:expr, $pair:ident) => {
        let mut cst = St::new();
        let mut sst = St::new();
        let client = Tr::session(Side::Client, $ccfg, Instant::ZERO, &mut cst, None).unwrap();
        let server =
            Tr::session(Side::Server, $scfg, Instant::ZERO, &mut sst, Some($origin)).unwrap();
        let mut $pair = Pair::new(Node::new(client), Node::new(server));
        assert!($pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
    };
}

/// A one-track broadcast `path` with track `name` in origin `o`.
macro_rules! published {
    ($pool:expr, $o:ident, $path:expr, $name:expr, $track:ident, $producer:ident) => {
        let $track = track::State::<4>::new(&$pool, track::Info::new($name).unwrap());
        let bcast = broadcast::State::<2>::new(Path::new($path).unwrap()).unwrap();
        let $o = origin::State::<4, 8>::new();
        let bp = bcast.producer().unwrap();
        bp.add($track.handle()).unwrap();
        $o.handle().announce(bcast.handle()).unwrap();
        #[allow(unused_mut, unused_variables)]
        let mut $producer = $track.producer().unwrap();
    };
}

/// Finishes the track behind `$tp`, steps until the client's subscription
/// `$sub` closes cleanly, and checks it was told END `$end` (exclusive).
macro_rules! finish_and_see_end {
    ($tp:ident, $pair:ident, $sub:ident, $end:expr) => {
        $tp.finish();
        assert!($pair.run(2000, |p| {
            p.a.saw(|e| matches!(e, Ev::SubscriptionClosed { code: None, .. }))
        }));
        assert!($pair.a.events.contains(&Ev::Ended {
            subscription: $sub,
            end: $end
        }));
    };
}

/// A live subscription from group 0, with a 10 s budget that keeps the older groups fresh.
fn from_oldest() -> Request {
    Request {
        start: Start::Group(0),
        max_latency: Duration::from_secs(10),
        ..Request::LIVE
    }
}

/// A client subscribed to "live"/"video" from group 0 with a 10 s budget;
/// the server's track says its upstream delivers from group 0 and holds only
/// group 3 (sent first, newest first), which has reached the client.
macro_rules! subscribed_from_oldest {
    ($tp:ident, $local:ident, $pair:ident, $sub:ident) => {
        let mut ps = PoolStorage::<64, 128>::new();
        let pool = Pool::new(&mut ps);
        let mut pc = PoolStorage::<64, 128>::new();
        let cpool = Pool::new(&mut pc);
        published!(pool, o, "live", "video", video, $tp);
        video.handle().set_upstream_first(0);
        write_group(&$tp, 3, &[(300, b"three")]);
        let $local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
        session_pair!(o.handle(), $pair);
        let $sub = $pair
            .a
            .session
            .subscribe("live", $local.handle(), from_oldest())
            .unwrap();
        assert!($pair.run(2000, |p| p.a.saw(|e| *e
            == Ev::Group {
                subscription: $sub,
                sequence: 3
            })));
    };
}

/// Whether group `seq` of `track` is held whole: every byte readable and its end known.
fn group_complete(track: track::Ref<'_, '_>, seq: u64) -> bool {
    let Some(mut c) = track.group(seq) else {
        return false;
    };
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf) {
            Ok(Next::Ready(_)) => {}
            Ok(Next::Finished) => return true,
            Ok(Next::Pending) | Err(_) => return false,
        }
    }
}

/// The paths announced through `req` so far, in order.
fn announced(events: &[Ev], req: AnnounceId) -> Vec<std::string::String> {
    events
        .iter()
        .filter_map(|e| match e {
            Ev::Announced { request, path, .. } if *request == req => Some(path.clone()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Pacing and backpressure (README guarantee 2; docs/protocol.md §2.4)
// ---------------------------------------------------------------------------

#[test]
fn gathered_transmit_delivers_the_same_and_keeps_the_window() {
    // The publisher leaves payload in its pool (three ranges per call).
    over_qmux::suite::parked_subscriber(Mode::Gather);
}

#[test]
#[cfg(feature = "stream-refs")]
fn lent_payload_joins_the_subscriber_groups_without_a_copy() {
    // A link inside one process: payload travels as STREAM_REF tokens and the
    // subscriber's groups hold pieces of the publisher's blocks.
    over_qmux::suite::parked_subscriber(Mode::Lend);
}

#[test]
#[cfg(feature = "stream-refs")]
fn lent_payload_waits_for_a_metadata_slot() {
    // The subscriber's pool has no slot for every other reference at first:
    // the session stalls on it and takes it on its next call.
    over_qmux::suite::parked_subscriber(Mode::LendScarce);
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "stream-refs"), allow(dead_code))]
enum Mode {
    Copy,
    Gather,
    Lend,
    LendScarce,
}

#[test]
fn a_frame_for_an_open_group_stream_is_sent_in_one_round() {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "cam", "video", video, tp);
    let mut gp = tp.create_group(0).unwrap();
    gp.write_frame(0, b"key").unwrap();
    let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    pair.a
        .session
        .subscribe("cam", local.handle(), Request::LIVE)
        .unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        local.handle().sequences().count(),
        1,
        "the group stream is open"
    );
    // The next frame only adds data to that stream: its pass writes it in
    // one round over the group streams, with no second round to find that
    // nothing else came of it.
    gp.write_frame(10, b"delta").unwrap();
    pair.b.session.visits.group_rounds = 0;
    let mut out = [0u8; 4096];
    let n = pair.b.session.poll_transmit(pair.now, &mut out);
    assert!(n > b"delta".len(), "{n} bytes");
    assert_eq!(pair.b.session.visits.group_rounds, 1);
    // The stream's FIN frees its slot, which may let the session open the
    // next stream: that pass takes another round.
    gp.finish().unwrap();
    pair.b.session.visits.group_rounds = 0;
    let n = pair.b.session.poll_transmit(pair.now, &mut out);
    assert!(n > 0);
    assert_eq!(pair.b.session.visits.group_rounds, 2);
}

#[test]
fn ends_are_never_lost_on_a_full_event_queue() {
    // 40 subscriptions cancelled before their TRACK_INFO, the events not
    // polled: 40 SubscriptionClosed for a 32-event queue. Then the SETUP
    // timeout closes the session, the queue still full. Every end is
    // reported once, in order, the close last.
    const SUBS: usize = 40;
    let mut pc = PoolStorage::<8, 64>::new();
    let cpool = Pool::new(&mut pc);
    let locals: Vec<_> = (0..SUBS)
        .map(|_| track::State::<2>::new(&cpool, track::Info::new("t").unwrap()))
        .collect();
    let config = Config {
        setup_timeout: Duration::from_secs(2),
        ..Config::new()
    };
    let mut st = Storage::<'_, '_, { 2 * SUBS + 4 }, 64, 1, SUBS, 1, 8, { 4 * SUBS + 8 }>::new();
    let session = Session::new(Side::Client, config, Instant::ZERO, &mut st, None).unwrap();
    let raw = Raw::new(Side::Server, conn::Config::new());
    let mut pair = Pair::new(Node::new(session), raw);
    assert!(pair.run(1000, |p| p.b.established && p.a.session.is_established()));
    pair.a.auto_drain = false;
    let mut subs = Vec::new();
    for local in &locals {
        let sub = pair
            .a
            .session
            .subscribe("b", local.handle(), Request::LIVE)
            .unwrap();
        pair.a.session.unsubscribe(sub).unwrap();
        subs.push(sub);
    }
    // The peer never sends SETUP: the timeout closes the session.
    assert!(pair.run(1000, |p| p.a.session.is_closed()));
    let mut events = Vec::new();
    while let Some(e) = pair.a.session.poll_event() {
        events.push(Ev::from(e));
    }
    let mut want: Vec<Ev> = subs
        .iter()
        .map(|&subscription| Ev::SubscriptionClosed {
            subscription,
            code: Some(StreamCode::Cancel.to_code()),
        })
        .collect();
    want.push(Ev::Closed {
        code: SessionCode::ControlMessageTimeout.to_code(),
        reason: "setup timeout".into(),
        application: true,
        local: true,
    });
    assert_eq!(events, want);
    // Every track was let go at once (not when its event was polled).
    for local in &locals {
        assert!(local.producer().is_ok());
    }
}

#[test]
fn an_announce_end_on_a_full_queue_waits_in_its_slot() {
    // The queue is full of subscription ends (8 more waiting) when an
    // announce request ends: its end waits in the request's slot, which is
    // not freed meanwhile, and is reported once, after the ends before it.
    const SUBS: usize = 40;
    let mut pc = PoolStorage::<8, 64>::new();
    let cpool = Pool::new(&mut pc);
    let locals: Vec<_> = (0..SUBS)
        .map(|_| track::State::<2>::new(&cpool, track::Info::new("t").unwrap()))
        .collect();
    let mut st = Storage::<'_, '_, { 2 * SUBS + 4 }, 64, 1, SUBS, 1, 8, { 4 * SUBS + 8 }>::new();
    let session = Session::new(Side::Client, Config::new(), Instant::ZERO, &mut st, None).unwrap();
    let raw = Raw::new(Side::Server, conn::Config::new());
    let mut pair = Pair::new(Node::new(session), raw);
    assert!(pair.run(1000, |p| p.b.established && p.a.session.is_established()));
    pair.a.auto_drain = false;
    let req = pair.a.session.announce_request("").unwrap();
    let mut subs = Vec::new();
    for local in &locals {
        let sub = pair
            .a
            .session
            .subscribe("b", local.handle(), Request::LIVE)
            .unwrap();
        pair.a.session.unsubscribe(sub).unwrap();
        subs.push(sub);
    }
    // (Input stops while the queue is nearly full, so only a call or a timer
    // can end a request now; this one ends it directly.)
    let slot = pair
        .a
        .session
        .control
        .iter()
        .position(|c| matches!(c.kind, super::control::Kind::AnnounceOut { .. }))
        .unwrap();
    pair.a.session.announce_ended(slot, req.0, Some(7));
    pair.a.session.cancel_announce(req).unwrap();
    pair.settle(Duration::from_millis(50));
    assert!(
        pair.a.session.control[slot].ended.is_some(),
        "kept in its slot"
    );
    let mut events = Vec::new();
    while let Some(e) = pair.a.session.poll_event() {
        events.push(Ev::from(e));
    }
    let mut want: Vec<Ev> = subs
        .iter()
        .map(|&subscription| Ev::SubscriptionClosed {
            subscription,
            code: Some(StreamCode::Cancel.to_code()),
        })
        .collect();
    want.push(Ev::AnnounceEnded {
        request: req,
        code: Some(7),
    });
    assert_eq!(events, want);
    // Queued: the slot goes at the next pass.
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        pair.a.session.control[slot].kind,
        super::control::Kind::Free
    );
}

#[test]
fn max_served_refuses_subscriptions_over_the_limit() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, _tp);
    let config = Config {
        max_served: 2,
        ..Config::new()
    };
    raw_pair!(Side::Server, config, Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let mut ids = Vec::new();
    for id in 0..3u8 {
        // SUBSCRIBE id, "b", "t", priority 0, ordered 0, max age 0, latest, open.
        let mut msg = hex("02 0a");
        msg.extend([id, 1, b'b', 1, b't', 0, 0, 0, 0, 0]);
        ids.push(pair.b.open(Dir::Bidi, &msg, false));
    }
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.served_count(), 2);
    let refused = ids
        .iter()
        .filter(|id| pair.b.resets.contains(&(id.value(), 0)))
        .count();
    assert_eq!(refused, 1);
    assert_eq!(pair.b.closed, None);
}

#[test]
fn trickled_control_message_times_out() {
    let config = Config {
        control_timeout: Duration::from_secs(2),
        ..Config::new()
    };
    raw_pair!(Side::Server, config, None, st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    // ANNOUNCE_REQUEST for "": sent in two halves within the limit, no harm.
    let a = pair.b.open(Dir::Bidi, &hex("01 02"), false);
    pair.settle(Duration::from_secs(1));
    pair.b.write(a, &hex("00 00"), false);
    pair.settle(Duration::from_secs(3));
    assert_eq!(pair.b.closed, None);
    // A SUBSCRIBE that never completes: CONTROL_MESSAGE_TIMEOUT.
    pair.b.open(Dir::Bidi, &hex("02 0a 00 01"), false);
    pair.settle(Duration::from_secs(3));
    assert_eq!(
        pair.b.closed.as_ref().map(|c| c.0),
        Some(SessionCode::ControlMessageTimeout.to_code())
    );
}

#[test]
fn full_served_table_refuses_the_subscription() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", t, tp);
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    let mut ids = Vec::new();
    for id in 0..5u8 {
        // SUBSCRIBE id, "b", "t", priority 0, ordered 0, max age 0, latest, open.
        let mut msg = hex("02 0a");
        msg.extend([id, 1, b'b', 1, b't', 0, 0, 0, 0, 0]);
        ids.push(pair.b.open(Dir::Bidi, &msg, false));
    }
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.served_count(), 4);
    let refused: Vec<_> = ids
        .iter()
        .filter(|id| pair.b.resets.contains(&(id.value(), 0)))
        .collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(pair.b.closed, None);
    // A group appears: the four served subscriptions each get START and a stream.
    write_group(&tp, 0, &[(0, b"x")]);
    pair.settle(Duration::from_millis(50));
    let started = ids
        .iter()
        .filter(|id| pair.b.received(id.value()) == hex("00 01 00").as_slice())
        .count();
    assert_eq!(started, 4);
}

#[test]
fn group_streams_are_chosen_in_one_pass_by_priority() {
    // 64 group streams open at once, 32 for each of two subscriptions: they
    // are sent by priority (higher first), then newest group first. Choosing
    // them sorts the stream table once per `flush_groups` call (S log S ranks
    // for a table out of order, as here; S for one in order) instead of
    // scanning it again for every record written (~3 * S * S).
    const S: usize = 64;
    let mut ps = PoolStorage::<256, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<256, 64>::new();
    let cpool = Pool::new(&mut pc);
    let low = track::State::<32>::new(&pool, track::Info::new("low").unwrap());
    let high = track::State::<32>::new(&pool, track::Info::new("high").unwrap());
    let bcast = broadcast::State::<2>::new(Path::new("b").unwrap()).unwrap();
    let o = origin::State::<2, 4>::new();
    let bp = bcast.producer().unwrap();
    bp.add(low.handle()).unwrap();
    bp.add(high.handle()).unwrap();
    o.handle().announce(bcast.handle()).unwrap();
    let (lp, hp) = (low.producer().unwrap(), high.producer().unwrap());
    let local_low = track::State::<32>::new(&cpool, track::Info::new("low").unwrap());
    let local_high = track::State::<32>::new(&cpool, track::Info::new("high").unwrap());
    // Room for 64 group streams at once on both ends.
    let ccfg = Config {
        conn: conn::Config {
            max_streams_uni: Some(80),
            ..conn::Config::new()
        },
        ..Config::new()
    };
    let mut cst = Storage::<'_, '_, 16, 256, 4, 4, 8, 80, 32>::new();
    let mut sst = Storage::<'_, '_, 16, 256, 4, 4, S, 8, 32>::new();
    let client: Session<'_, '_, '_, 128> =
        Session::new(Side::Client, ccfg, Instant::ZERO, &mut cst, None).unwrap();
    let server: Session<'_, '_, '_, 160> = Session::new(
        Side::Server,
        Config::new(),
        Instant::ZERO,
        &mut sst,
        Some(o.handle()),
    )
    .unwrap();
    let mut pair = Pair::new(Node::with_streams(client), Node::with_streams(server));
    assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
    let req = |priority| Request::test(priority, 3_600_000, Start::Group(0), End::Open);
    let sub_low = pair
        .a
        .session
        .subscribe("b", local_low.handle(), req(1))
        .unwrap();
    let sub_high = pair
        .a
        .session
        .subscribe("b", local_high.handle(), req(5))
        .unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.session.served_count(), 2);
    // Both tracks get their groups at once: the next pass opens all 64 streams.
    for seq in 0..(S / 2) as u64 {
        write_group(&lp, seq, &[(0, b"low")]);
        write_group(&hp, seq, &[(0, b"high")]);
    }
    pair.settle(Duration::from_millis(50));
    assert_eq!(local_low.handle().sequences().count(), S / 2);
    assert_eq!(local_high.handle().sequences().count(), S / 2);
    // Wire order of the group streams: (Subscribe ID, sequence).
    let s2c = Tap::new(&pair.ba.log);
    let order: Vec<(u64, u64)> = s2c
        .order
        .iter()
        .filter(|&&id| id % 4 == 3)
        .filter_map(|&id| match s2c.stream(id) {
            [0, _, sub, seq, ..] => Some((u64::from(*sub), u64::from(*seq))),
            _ => None,
        })
        .collect();
    let mut want: Vec<(u64, u64)> = (0..32).rev().map(|seq| (sub_high.0, seq)).collect();
    want.extend((0..32).rev().map(|seq| (sub_low.0, seq)));
    assert_eq!(order, want);
    let visits = pair.b.session.visits.groups;
    assert!(
        visits <= 32 * S,
        "{visits} slots visited in one call for {S} streams"
    );
}

// ---------------------------------------------------------------------------
// Trimmed groups and failover (model::group trimming, track::Ref::set_failover)
// ---------------------------------------------------------------------------

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Random bytes on random streams after a valid SETUP never panic the
        /// session: it answers, refuses or closes with a code.
        #[test]
        fn random_stream_bytes(streams in proptest::collection::vec(
            (any::<bool>(), 0u8..8, proptest::collection::vec(any::<u8>(), 0..48)),
            1..5,
        )) {
            let mut ps = PoolStorage::<16, 64>::new();
            let pool = Pool::new(&mut ps);
            published!(pool, o, "b", "t", t, tp);
            write_group(&tp, 0, &[(0, b"x")]);
            raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
            pair.b.open(Dir::Uni, &hex("01 01 00"), true);
            for (uni, kind, body) in &streams {
                let mut bytes = std::vec![*kind];
                bytes.extend_from_slice(body);
                let dir = if *uni { Dir::Uni } else { Dir::Bidi };
                pair.b.open(dir, &bytes, body.len() % 2 == 0);
            }
            pair.settle(Duration::from_millis(50));
            if let Some((code, _)) = &pair.b.closed {
                // Only moq-lite session codes or QMux violations.
                prop_assert!(*code == 0x3 || *code == 0x1 || *code >= 0x100 || *code == 0);
            }
        }

        /// Random record bytes straight into `handle_input` never panic.
        #[test]
        fn random_input(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut st = St::new();
            let mut s: Session<'_, '_, '_, 32> =
                Session::new(Side::Server, Config::new(), Instant::ZERO, &mut st, None).unwrap();
            let mut out = std::vec![0u8; 20_000];
            let _ = s.poll_transmit(Instant::ZERO, &mut out);
            let _ = s.handle_input(Instant::ZERO, &bytes);
            while s.poll_event().is_some() {}
            let _ = s.poll_transmit(Instant::ZERO, &mut out);
        }
    }
}

// ---------------------------------------------------------------------------
// Served subscriptions on the source track (docs/protocol.md §4.5)
// ---------------------------------------------------------------------------

/// Every change a session reported since its last poll.
fn changes_of<const N: usize, T: Transport>(s: &mut Session<'_, '_, '_, N, T>) -> Vec<Change> {
    core::iter::from_fn(|| s.poll_changed()).collect()
}

/// Tracks `names` (from `pool`) in broadcast `room/live` of a new origin,
/// each with group 0 holding one keyframe, the broadcast announced: binds
/// the tracks, the broadcast, the origin, its producer and the tracks'.
macro_rules! live_room {
    ($pool:expr, $names:expr => $tracks:ident, $bcast:ident, $o:ident, $bp:ident, $producers:ident) => {
        let $tracks: Vec<_> = $names
            .iter()
            .map(|n| track::State::<4>::new(&$pool, track::Info::new(n).unwrap()))
            .collect();
        let $bcast = broadcast::State::<8>::new(Path::new("room/live").unwrap()).unwrap();
        let $o = origin::State::<4, 8>::new();
        let $bp = $bcast.producer().unwrap();
        let $producers: Vec<_> = $tracks.iter().map(|t| t.producer().unwrap()).collect();
        for (t, p) in $tracks.iter().zip(&$producers) {
            $bp.add(t.handle()).unwrap();
            write_group(p, 0, &[(0, b"key")]);
        }
        $o.handle().announce($bcast.handle()).unwrap();
    };
}

mod fetch;
mod idle;
mod inbox;

mod over_memory;
mod over_qmux;
mod over_unordered;

/// The Role of the peer's SETUP, from the events waiting.
fn setup_role<const N: usize>(session: &mut Session<'_, '_, '_, N>) -> Option<Role> {
    while let Some(e) = session.poll_event() {
        if let Event::Setup { role, .. } = e {
            return Some(role);
        }
    }
    None
}

/// A server storage with no table for either direction (see [`Storage`]).
type Bare<'a, 'p> = Storage<'a, 'p, 16, 256, 0, 0, 0, 1, 32>;

/// A server session on a [`Bare`] storage serving origin `$o`, and a raw
/// client that has sent its SETUP with Role 2 (subscriber); the server's
/// events are left for the test to poll.
macro_rules! bare_pair {
    ($o:ident, $storage:ident, $pair:ident) => {
        let mut $storage = Bare::new();
        let session = Session::new(
            Side::Server,
            Config::new(),
            Instant::ZERO,
            &mut $storage,
            Some($o.handle()),
        )
        .unwrap();
        let raw = Raw::new(Side::Client, conn::Config::new());
        let mut $pair = Pair::new(Node::new(session), raw);
        $pair.a.auto_drain = false;
        assert!($pair.run(1000, |p| p.b.established && p.a.session.is_established()));
        $pair.b.open(Dir::Uni, &hex("01 04 01 03 01 02"), true);
    };
}

#[test]
fn tables_attached_at_setup_serve_a_subscription_sent_with_the_setup() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, _tp);
    let mut served = PublisherTables::<4, 4>::new();
    bare_pair!(o, st, pair);
    // A SUBSCRIBE in the same flight as the SETUP.
    let sub = pair.b.open(
        Dir::Bidi,
        &hex("02 0a 00 01 62 01 74 00 00 00 00 00"),
        false,
    );
    pair.settle(Duration::from_millis(50));
    // The SUBSCRIBE waits unread while the SETUP is unseen.
    assert_eq!(pair.a.session.served_count(), 0);
    assert!(pair.b.resets.is_empty());
    assert_eq!(setup_role(&mut pair.a.session), Some(Role::Subscriber));
    pair.a.session.attach_publisher_tables(&mut served).unwrap();
    pair.a.auto_drain = true;
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.served_count(), 1);
    assert!(!pair.b.resets.iter().any(|(id, _)| *id == sub.value()));
    assert_eq!(pair.b.closed, None);
}

#[test]
fn a_session_without_subscriber_tables_refuses_group_streams_and_goes_on() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, _tp);
    let mut served = PublisherTables::<4, 4>::new();
    bare_pair!(o, st, pair);
    pair.settle(Duration::from_millis(50));
    assert_eq!(setup_role(&mut pair.a.session), Some(Role::Subscriber));
    pair.a.session.attach_publisher_tables(&mut served).unwrap();
    pair.a.auto_drain = true;
    // A group stream (subscription 0, group 5) from a peer that said it only
    // subscribes: no table takes it, so it is refused and nothing else ends.
    let group = pair.b.open(Dir::Uni, &hex("00 02 00 05"), false);
    pair.settle(Duration::from_millis(50));
    assert!(pair.b.stops.iter().any(|(id, _)| *id == group.value()));
    assert_eq!(pair.b.closed, None);
    assert!(pair.a.session.is_established());
}

#[test]
fn attached_tables_too_small_for_the_entries_in_use_are_refused() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "b", "t", _t, _tp);
    let mut none = PublisherTables::<0, 0>::new();
    raw_pair!(Side::Server, Config::new(), Some(o.handle()), st, pair);
    pair.b.open(Dir::Uni, &hex("01 01 00"), true);
    pair.b.open(
        Dir::Bidi,
        &hex("02 0a 00 01 62 01 74 00 00 00 00 00"),
        false,
    );
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.served_count(), 1);
    assert_eq!(
        pair.a.session.attach_publisher_tables(&mut none),
        Err(TablesTooSmall)
    );
    assert_eq!(pair.a.session.served_count(), 1);
}
