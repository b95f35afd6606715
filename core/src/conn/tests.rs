//! Connection tests: a client and a server wired back to back in memory, with simulated time.

extern crate std;

use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::time::Duration;
use crate::wire::DecodeError;
use crate::wire::qmux::{
    ApplicationClose, ConnectionClose, DEFAULT_MAX_RECORD_SIZE, Datagram, Frame, Protocols, Record,
    ResetStream, StopSending, Stream as StreamFrame, TransportParams, encode_record,
};

const CAP: usize = 16;
type Conn = Connection<CAP>;

// ---- harness ----

/// An [`Event`] with its borrowed parts copied, so tests can keep it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ev {
    Established(&'static str),
    Opened(u64),
    Ref {
        id: u64,
        offset: u64,
        len: u64,
        token: u64,
        fin: bool,
    },
    Data {
        id: u64,
        offset: u64,
        data: Vec<u8>,
        fin: bool,
    },
    Reset {
        id: u64,
        code: u64,
        final_size: u64,
    },
    Stop {
        id: u64,
        code: u64,
    },
    Writable(u64),
    Datagram(Vec<u8>),
    Closed {
        code: u64,
        reason: String,
        application: bool,
        cause: CloseCause,
    },
}

impl From<Event<'_>> for Ev {
    fn from(e: Event<'_>) -> Self {
        match e {
            Event::Established { protocol } => Ev::Established(protocol),
            Event::StreamOpened { id } => Ev::Opened(id.value()),
            Event::StreamData {
                id,
                offset,
                data,
                fin,
                ..
            } => Ev::Data {
                id: id.value(),
                offset,
                data: data.to_vec(),
                fin,
            },
            Event::StreamRef {
                id,
                offset,
                len,
                token,
                fin,
            } => Ev::Ref {
                id: id.value(),
                offset,
                len,
                token,
                fin,
            },
            Event::StreamReset {
                id,
                code,
                final_size,
            } => Ev::Reset {
                id: id.value(),
                code,
                final_size,
            },
            Event::StreamWritable { id } => Ev::Writable(id.value()),
            Event::StopSending { id, code } => Ev::Stop {
                id: id.value(),
                code,
            },
            Event::Datagram(d) => Ev::Datagram(d.to_vec()),
            Event::Closed(c) => Ev::Closed {
                code: c.code,
                reason: c.reason.to_string(),
                application: c.application,
                cause: c.cause,
            },
        }
    }
}

/// Feeds `inbox` to `conn` until no event is left, keeping the unconsumed tail.
fn feed(conn: &mut Conn, now: Instant, inbox: &mut Vec<u8>, auto_release: bool) -> Vec<Ev> {
    let mut events = Vec::new();
    for _ in 0..100_000 {
        let step = conn.handle_input(now, inbox);
        let consumed = step.consumed;
        if let Some(Event::StreamData { data, at, .. }) = step.event {
            // The offset names the very bytes the event borrows, ending the consumed part.
            assert_eq!(inbox.get(at..at + data.len()), Some(data));
            assert_eq!(at + data.len(), consumed);
        }
        let event = step.event.map(Ev::from);
        inbox.drain(..consumed);
        let Some(event) = event else { return events };
        if let (true, Ev::Data { id, data, .. }) = (auto_release, &event) {
            conn.release(StreamId(*id), data.len() as u64);
        }
        events.push(event);
    }
    panic!("handle_input did not settle");
}

/// Everything `poll_transmit` has to say, through a small buffer.
fn drain(conn: &mut Conn, now: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut buf = [0u8; 300];
        let n = conn.poll_transmit(now, &mut buf);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The frames of a run of whole records.
fn frames(mut bytes: &[u8]) -> Vec<Frame<'_>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let r = Record::decode(bytes, u64::MAX).expect("whole records");
        for f in r.frames() {
            out.push(f.expect("valid frame"));
        }
        bytes = &bytes[r.len..];
    }
    out
}

/// One record holding `frame`.
fn rec(frame: Frame<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 40_000];
    let n = encode_record(&frame, u64::MAX, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// One endpoint and what it saw.
struct End {
    conn: Conn,
    inbox: Vec<u8>,
    events: Vec<Ev>,
    /// Every byte this end put on the wire.
    sent: Vec<u8>,
    auto_release: bool,
}

impl End {
    fn new(side: Side, config: Config, now: Instant) -> Self {
        End {
            conn: Conn::new(side, config, now).unwrap(),
            inbox: Vec::new(),
            events: Vec::new(),
            sent: Vec::new(),
            auto_release: true,
        }
    }

    fn flush(&mut self, now: Instant) -> Vec<u8> {
        let out = drain(&mut self.conn, now);
        self.sent.extend_from_slice(&out);
        out
    }

    fn feed(&mut self, now: Instant) {
        let evs = feed(&mut self.conn, now, &mut self.inbox, self.auto_release);
        self.events.extend(evs);
    }

    fn take_events(&mut self) -> Vec<Ev> {
        core::mem::take(&mut self.events)
    }
}

/// A client and a server joined by two in-memory pipes.
struct Pair {
    now: Instant,
    client: End,
    server: End,
    /// While false, bytes written are lost (a dead link).
    linked: bool,
}

impl Pair {
    fn new(client: Config, server: Config) -> Self {
        let now = Instant::from_millis(1000);
        Pair {
            now,
            client: End::new(Side::Client, client, now),
            server: End::new(Side::Server, server, now),
            linked: true,
        }
    }

    /// A pair that completed the handshake, events cleared.
    fn connected(client: Config, server: Config) -> Self {
        let mut p = Pair::new(client, server);
        p.drive();
        assert_eq!(p.client.take_events(), [Ev::Established("moq-lite-05")]);
        assert_eq!(p.server.take_events(), [Ev::Established("moq-lite-05")]);
        assert!(p.client.conn.is_established() && p.server.conn.is_established());
        p
    }

    fn ends(&mut self, side: Side) -> (&mut End, &mut End) {
        match side {
            Side::Client => (&mut self.client, &mut self.server),
            Side::Server => (&mut self.server, &mut self.client),
        }
    }

    /// Exchanges control records until both ends are quiet.
    fn drive(&mut self) {
        for _ in 0..1000 {
            self.server.feed(self.now);
            self.client.feed(self.now);
            let a = self.client.flush(self.now);
            let b = self.server.flush(self.now);
            if a.is_empty() && b.is_empty() {
                return;
            }
            if self.linked {
                self.server.inbox.extend_from_slice(&a);
                self.client.inbox.extend_from_slice(&b);
            }
        }
        panic!("pair never went quiet");
    }

    /// Writes one stream record from `side` (after its pending control records) and delivers everything.
    fn write(
        &mut self,
        side: Side,
        id: StreamId,
        data: &[u8],
        fin: bool,
    ) -> Result<Written, WriteError> {
        let now = self.now;
        let linked = self.linked;
        let (me, peer) = self.ends(side);
        let control = me.flush(now);
        let mut buf = [0u8; 20_000];
        let res = me.conn.write_stream(now, id, data, fin, &mut buf);
        let mut bytes = control;
        if let Ok(w) = res {
            bytes.extend_from_slice(&buf[..w.out]);
            me.sent.extend_from_slice(&buf[..w.out]);
        }
        if linked {
            peer.inbox.extend_from_slice(&bytes);
        }
        self.drive();
        res
    }

    /// Moves time forward and runs both ends' timers.
    fn advance(&mut self, d: Duration) {
        self.now += d;
        for end in [&mut self.client, &mut self.server] {
            if let Some(e) = end.conn.handle_timeout(self.now) {
                end.events.push(e.into());
            }
        }
        self.drive();
    }

    /// Advances in steps to each end's next deadline, until `until` has passed.
    fn run_until(&mut self, until: Instant) {
        while self.now < until {
            let next = [
                self.client.conn.poll_timeout(),
                self.server.conn.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(until)
            .min(until)
            .max(self.now + Duration::from_millis(1));
            self.advance(next - self.now);
        }
    }
}

/// Small stream counts that fit [`CAP`].
fn cfg() -> Config {
    Config {
        max_streams_bidi: Some(4),
        max_streams_uni: Some(4),
        ..Config::new()
    }
}

fn bidi(side: Side, index: u64) -> StreamId {
    StreamId::new(side, Dir::Bidi, index).unwrap()
}

fn uni(side: Side, index: u64) -> StreamId {
    StreamId::new(side, Dir::Uni, index).unwrap()
}

fn closed_by_violation(e: TransportError) -> Ev {
    Ev::Closed {
        code: 1002,
        reason: e.reason().to_string(),
        application: false,
        cause: CloseCause::Violation(e),
    }
}

// ---- handshake and parameters ----

#[test]
fn first_record_is_our_parameters() {
    let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
    let out = drain(&mut c, Instant::ZERO);
    let f = frames(&out);
    assert_eq!(f.len(), 1);
    let Frame::TransportParameters(p) = f[0] else {
        panic!("{f:?}")
    };
    assert_eq!(p, cfg().transport_params(4, 4));
    assert!(
        !c.is_established(),
        "the peer's parameters are still missing"
    );
}

/// docs/protocol.md §6 V1, moq-dev's parameters: our first record with the same values matches byte for byte.
#[test]
fn v1_first_record_is_byte_exact() {
    const V1: [u8; 86] = [
        0x40, 0x54, 0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x40, 0x4a, 0x01, 0x04, 0x80,
        0x00, 0x75, 0x30, 0x04, 0x04, 0x80, 0x10, 0x00, 0x00, 0x05, 0x04, 0x80, 0x04, 0x00, 0x00,
        0x06, 0x04, 0x80, 0x04, 0x00, 0x00, 0x07, 0x04, 0x80, 0x04, 0x00, 0x00, 0x08, 0x02, 0x67,
        0x10, 0x09, 0x02, 0x67, 0x10, 0x20, 0x02, 0x7f, 0xfe, 0xc5, 0x71, 0xc5, 0x94, 0x29, 0xcd,
        0x08, 0x45, 0x02, 0x7f, 0xfe, 0xfd, 0x4f, 0x9c, 0x2a, 0x8b, 0x1e, 0x60, 0x75, 0x0c, 0x0b,
        0x6d, 0x6f, 0x71, 0x2d, 0x6c, 0x69, 0x74, 0x65, 0x2d, 0x30, 0x35,
    ];
    let config = Config {
        max_streams_bidi: Some(10_000),
        max_streams_uni: Some(10_000),
        max_datagram_frame_size: 16_382,
        ..Config::new()
    };
    // 20 000 slots do not fit a default test thread's stack; give it a big one.
    let out = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let mut c = Connection::<20_000>::new(Side::Server, config, Instant::ZERO).unwrap();
            let mut buf = [0u8; 128];
            let n = c.poll_transmit(Instant::ZERO, &mut buf);
            buf[..n].to_vec()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(out, V1);
}

#[test]
fn handshake_establishes_both_sides() {
    let p = Pair::connected(cfg(), cfg());
    assert_eq!(p.client.conn.protocol(), Some("moq-lite-05"));
    assert_eq!(p.server.conn.idle_timeout(), Some(Duration::from_secs(30)));
    // Each side's very first record was its parameters.
    for end in [&p.client, &p.server] {
        assert!(matches!(
            frames(&end.sent)[0],
            Frame::TransportParameters(_)
        ));
    }
}

#[test]
fn nothing_may_be_sent_before_establishment() {
    let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
    assert_eq!(
        c.open_stream(Dir::Bidi),
        Err(OpenError::Limit),
        "no peer grant yet"
    );
    let mut out = [0u8; 64];
    assert_eq!(
        c.send_datagram(Instant::ZERO, b"x", &mut out),
        Err(DatagramError::NotReady)
    );
    // The server's parameters arrive before ours were sent: streams may be opened, not written.
    let server_params = rec(Frame::TransportParameters(cfg().transport_params(4, 4)));
    let mut inbox = server_params;
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, false),
        [Ev::Established("moq-lite-05")]
    );
    let id = c.open_stream(Dir::Uni).unwrap();
    assert_eq!(c.send_credit(id), 0);
    assert_eq!(
        c.write_stream(Instant::ZERO, id, b"x", false, &mut out),
        Err(WriteError::NotReady)
    );
    let _ = drain(&mut c, Instant::ZERO);
    assert!(c.is_established());
    assert_eq!(c.send_credit(id), 256 * 1024);
}

#[test]
fn config_must_fit_the_table() {
    let big = Config {
        max_streams_bidi: Some(10),
        max_streams_uni: Some(10),
        ..Config::new()
    };
    assert_eq!(
        Conn::new(Side::Client, big, Instant::ZERO).err(),
        Some(ConfigError::StreamsOverCapacity)
    );
    // Defaults: a quarter of the table each way.
    let c = Conn::new(Side::Client, Config::new(), Instant::ZERO).unwrap();
    assert_eq!(c.initial_streams, [4, 4]);
}

// ---- negotiation ----

#[test]
fn server_preference_wins() {
    let client = Config {
        protocols: &["moq-lite-05", "moq-lite-06"],
        ..cfg()
    };
    let server = Config {
        protocols: &["moq-lite-06", "moq-lite-05"],
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    p.drive();
    assert_eq!(p.client.take_events(), [Ev::Established("moq-lite-06")]);
    assert_eq!(p.server.take_events(), [Ev::Established("moq-lite-06")]);

    let client = Config {
        protocols: &["x-proto", "moq-lite-05"],
        ..cfg()
    };
    let server = Config {
        protocols: &["moq-lite-05", "x-proto"],
        ..cfg()
    };
    let mut p = Pair::new(client, server);
    p.drive();
    assert_eq!(p.client.conn.protocol(), Some("moq-lite-05"));
    assert_eq!(p.server.conn.protocol(), Some("moq-lite-05"));
}

#[test]
fn no_overlap_closes_cleanly() {
    let client = Config {
        protocols: &["moq-lite-06"],
        ..cfg()
    };
    let mut p = Pair::new(client, cfg());
    p.drive();
    let want = Ev::Closed {
        code: VERSION_NEGOTIATION_FAILED,
        reason: "no common application protocol".to_string(),
        application: true,
        cause: CloseCause::NoCommonProtocol,
    };
    assert_eq!(p.client.take_events(), core::slice::from_ref(&want));
    assert_eq!(p.server.take_events(), [want]);
    for end in [&mut p.client, &mut p.server] {
        assert!(end.conn.is_drained());
        let f = frames(&end.sent);
        assert_eq!(
            f[1..],
            [Frame::ApplicationClose(ApplicationClose {
                code: 0x15,
                reason: b"no common application protocol"
            })]
        );
        assert_eq!(end.conn.poll_timeout(), None);
    }
}

#[test]
fn missing_protocol_list_is_no_overlap() {
    let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
    let params = TransportParams {
        application_protocols: None,
        ..cfg().transport_params(4, 4)
    };
    let mut inbox = rec(Frame::TransportParameters(params));
    let evs = feed(&mut c, Instant::ZERO, &mut inbox, false);
    assert!(matches!(
        evs[..],
        [Ev::Closed {
            cause: CloseCause::NoCommonProtocol,
            ..
        }]
    ));
}

// ---- streams ----

#[test]
fn streams_both_ways() {
    let mut p = Pair::connected(cfg(), cfg());
    let id = p.client.conn.open_stream(Dir::Bidi).unwrap();
    assert_eq!(id, bidi(Side::Client, 0));
    p.write(Side::Client, id, b"hello", true).unwrap();
    assert_eq!(
        p.server.take_events(),
        [
            Ev::Opened(0),
            Ev::Data {
                id: 0,
                offset: 0,
                data: b"hello".to_vec(),
                fin: true
            }
        ]
    );
    p.write(Side::Server, id, b"hi ", false).unwrap();
    p.write(Side::Server, id, b"back", true).unwrap();
    assert_eq!(
        p.client.take_events(),
        [
            Ev::Data {
                id: 0,
                offset: 0,
                data: b"hi ".to_vec(),
                fin: false
            },
            Ev::Data {
                id: 0,
                offset: 3,
                data: b"back".to_vec(),
                fin: true
            },
        ]
    );
    // Both halves finished and released: retired on both sides.
    assert_eq!(p.client.conn.open_streams(), 0);
    assert_eq!(p.server.conn.open_streams(), 0);
    assert_eq!(
        p.client
            .conn
            .write_stream(p.now, id, b"x", false, &mut [0u8; 64]),
        Err(WriteError::UnknownStream)
    );

    let u = p.server.conn.open_stream(Dir::Uni).unwrap();
    assert_eq!(u, uni(Side::Server, 0));
    p.write(Side::Server, u, b"group", false).unwrap();
    assert_eq!(
        p.client.take_events(),
        [
            Ev::Opened(3),
            Ev::Data {
                id: 3,
                offset: 0,
                data: b"group".to_vec(),
                fin: false
            }
        ]
    );
    // A receive-only stream cannot be written or reset.
    let mut out = [0u8; 64];
    assert_eq!(
        p.client.conn.write_stream(p.now, u, b"x", false, &mut out),
        Err(WriteError::NotSendable)
    );
    assert_eq!(
        p.client.conn.reset_stream(u, 0),
        Err(StreamError::WrongDirection)
    );
    assert_eq!(
        p.server.conn.stop_sending(u, 0),
        Err(StreamError::WrongDirection)
    );
}

#[test]
fn out_of_order_opening_creates_lower_indices() {
    let mut p = Pair::connected(cfg(), cfg());
    let ids: Vec<StreamId> = (0..3)
        .map(|_| p.server.conn.open_stream(Dir::Uni).unwrap())
        .collect();
    assert_eq!(
        ids.iter().map(|i| i.value()).collect::<Vec<_>>(),
        [3, 7, 11]
    );
    // moq-dev schedules newest first: stream 11 arrives before 7 and 3.
    p.write(Side::Server, ids[2], b"g6", false).unwrap();
    assert_eq!(
        p.client.take_events(),
        [
            Ev::Opened(3),
            Ev::Opened(7),
            Ev::Opened(11),
            Ev::Data {
                id: 11,
                offset: 0,
                data: b"g6".to_vec(),
                fin: false
            }
        ]
    );
    p.write(Side::Server, ids[1], b"g5", false).unwrap();
    assert_eq!(
        p.client.take_events(),
        [Ev::Data {
            id: 7,
            offset: 0,
            data: b"g5".to_vec(),
            fin: false
        }]
    );
}

#[test]
fn empty_frames_open_then_are_ignored() {
    let mut p = Pair::connected(cfg(), cfg());
    let id = p.client.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Client, id, b"", false).unwrap();
    assert_eq!(p.server.take_events(), [Ev::Opened(2)]);
    p.write(Side::Client, id, b"", false).unwrap();
    assert_eq!(p.server.take_events(), []);
    p.write(Side::Client, id, b"", true).unwrap();
    assert_eq!(
        p.server.take_events(),
        [Ev::Data {
            id: 2,
            offset: 0,
            data: Vec::new(),
            fin: true
        }]
    );
    assert_eq!(
        p.client
            .conn
            .write_stream(p.now, id, b"", true, &mut [0u8; 16]),
        Err(WriteError::UnknownStream)
    );
}

#[test]
fn stream_count_limit_and_credit() {
    let client = Config {
        max_streams_uni: Some(2),
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    let a = p.server.conn.open_stream(Dir::Uni).unwrap();
    let b = p.server.conn.open_stream(Dir::Uni).unwrap();
    assert_eq!(p.server.conn.open_stream(Dir::Uni), Err(OpenError::Limit));
    p.write(Side::Server, a, b"x", true).unwrap();
    p.write(Side::Server, b, b"y", false).unwrap();
    // Stream a is finished and released: retired, so MAX_STREAMS uni (2 + 2×1 > 2) grants a third.
    let grants: Vec<u64> = frames(&p.client.sent)
        .iter()
        .filter_map(|f| match f {
            Frame::MaxStreams { dir: Dir::Uni, max } => Some(*max),
            _ => None,
        })
        .collect();
    assert_eq!(grants, [3]);
    assert_eq!(
        p.server.conn.open_stream(Dir::Uni).unwrap(),
        uni(Side::Server, 2)
    );
    assert_eq!(p.server.conn.open_stream(Dir::Uni), Err(OpenError::Limit));
}

#[test]
fn stream_credit_held_back_reaches_a_peer_at_its_limit() {
    let client = Config {
        max_streams_uni: Some(4),
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    let a = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Server, a, b"x", true).unwrap();
    // Stream a retired with one peer stream opened: 1 + 2×1 ≤ 4, no grant yet.
    let grants = |p: &Pair| -> Vec<u64> {
        frames(&p.client.sent)
            .iter()
            .filter_map(|f| match f {
                Frame::MaxStreams { dir: Dir::Uni, max } => Some(*max),
                _ => None,
            })
            .collect()
    };
    assert_eq!(grants(&p), [] as [u64; 0]);
    // Streams that stay open release nothing; the second of them brings the
    // peer to three streams, 3 + 2×1 > 4, and the credit of stream a goes out.
    for _ in 0..3 {
        let id = p.server.conn.open_stream(Dir::Uni).unwrap();
        p.write(Side::Server, id, b"y", false).unwrap();
    }
    assert_eq!(grants(&p), [5]);
    assert_eq!(
        p.server.conn.open_stream(Dir::Uni).unwrap(),
        uni(Side::Server, 4)
    );
    assert_eq!(p.server.conn.open_stream(Dir::Uni), Err(OpenError::Limit));
}

#[test]
fn unreleased_fin_keeps_the_stream() {
    let mut p = Pair::connected(cfg(), cfg());
    p.client.auto_release = false;
    let id = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Server, id, b"abcd", true).unwrap();
    assert_eq!(p.client.conn.open_streams(), 1);
    p.client.conn.release(id, 3);
    assert_eq!(p.client.conn.open_streams(), 1);
    p.client.conn.release(id, 100); // clamped
    assert_eq!(p.client.conn.open_streams(), 0);
}

#[test]
fn table_full_is_typed() {
    // 8 slots, 2 + 2 reserved for the peer: four of our own at most.
    let config = Config {
        max_streams_bidi: Some(2),
        max_streams_uni: Some(2),
        ..Config::new()
    };
    let mut c = Connection::<8>::new(Side::Client, config, Instant::ZERO).unwrap();
    let _ = drain_any(&mut c);
    let mut inbox = rec(Frame::TransportParameters(cfg().transport_params(100, 100)));
    let mut evs = Vec::new();
    for _ in 0..10 {
        let step = c.handle_input(Instant::ZERO, &inbox);
        let n = step.consumed;
        let Some(e) = step.event.map(Ev::from) else {
            break;
        };
        evs.push(e);
        inbox.drain(..n);
    }
    assert_eq!(evs, [Ev::Established("moq-lite-05")]);
    for _ in 0..4 {
        c.open_stream(Dir::Uni).unwrap();
    }
    assert_eq!(c.open_stream(Dir::Bidi), Err(OpenError::TableFull));
}

fn drain_any<const M: usize>(c: &mut Connection<M>) -> usize {
    let mut buf = [0u8; 512];
    c.poll_transmit(Instant::ZERO, &mut buf)
}

#[test]
fn stop_sending_and_reset() {
    let mut p = Pair::connected(cfg(), cfg());
    let id = p.client.conn.open_stream(Dir::Bidi).unwrap();
    p.write(Side::Client, id, b"request", false).unwrap();
    p.server.take_events();
    // The server stops reading; the client learns it and resets with the same code.
    p.server.conn.stop_sending(id, 1).unwrap();
    p.drive();
    assert_eq!(p.client.take_events(), [Ev::Stop { id: 0, code: 1 }]);
    p.client.conn.reset_stream(id, 1).unwrap();
    p.drive();
    // The server had stopped: the reset is absorbed without an event.
    assert_eq!(p.server.take_events(), []);
    let f = frames(&p.client.sent);
    assert!(f.contains(&Frame::ResetStream(ResetStream {
        id,
        code: 1,
        final_size: 7
    })));
    assert!(frames(&p.server.sent).contains(&Frame::StopSending(StopSending { id, code: 1 })));
    // A second reset is a no-op; writing after reset is refused.
    assert_eq!(p.client.conn.reset_stream(id, 2), Ok(()));
    assert_eq!(
        p.client
            .conn
            .write_stream(p.now, id, b"x", false, &mut [0u8; 64]),
        Err(WriteError::Reset)
    );

    // A reset the peer did not ask for is reported with its final size.
    let u = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Server, u, b"12345", false).unwrap();
    p.server.conn.reset_stream(u, 0x34).unwrap();
    p.drive();
    assert_eq!(
        p.client.take_events(),
        [
            Ev::Opened(3),
            Ev::Data {
                id: 3,
                offset: 0,
                data: b"12345".to_vec(),
                fin: false
            },
            Ev::Reset {
                id: 3,
                code: 0x34,
                final_size: 5
            }
        ]
    );
    assert_eq!(
        p.client.conn.open_streams(),
        1,
        "the server's send half of bidi 0 is still open"
    );
}

#[test]
fn stop_sending_after_fin_is_ignored() {
    let mut p = Pair::connected(cfg(), cfg());
    let id = p.client.conn.open_stream(Dir::Bidi).unwrap();
    p.write(Side::Client, id, b"setup", true).unwrap();
    // moq-dev routinely sends STOP_SENDING code 0 after reading a FIN (docs/protocol.md §2.2).
    p.server.inbox.clear();
    p.client
        .inbox
        .extend_from_slice(&rec(Frame::StopSending(StopSending { id, code: 0 })));
    p.client.feed(p.now);
    assert_eq!(p.client.take_events(), []);
    assert!(p.client.conn.is_established());
}

#[test]
fn reset_as_first_frame_opens_the_stream() {
    let mut p = Pair::connected(cfg(), cfg());
    let id = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.server.conn.reset_stream(id, 5).unwrap();
    p.drive();
    assert_eq!(
        p.client.take_events(),
        [
            Ev::Opened(3),
            Ev::Reset {
                id: 3,
                code: 5,
                final_size: 0
            }
        ]
    );
    assert_eq!(p.client.conn.open_streams(), 0);
    // A late duplicate for the retired stream is ignored.
    p.client
        .inbox
        .extend_from_slice(&rec(Frame::ResetStream(ResetStream {
            id,
            code: 5,
            final_size: 0,
        })));
    p.client
        .inbox
        .extend_from_slice(&rec(Frame::Stream(StreamFrame {
            id,
            offset: 0,
            data: b"late",
            fin: false,
        })));
    p.client.feed(p.now);
    assert_eq!(p.client.take_events(), []);
    assert!(p.client.conn.is_established());
}

// ---- flow control ----

/// Every MAX_* value a byte log carries, keyed by frame kind and stream.
fn credit_updates(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
    frames(bytes)
        .iter()
        .filter_map(|f| match *f {
            Frame::MaxData(m) => Some((0x10, 0, m)),
            Frame::MaxStreamData { id, max } => Some((0x11, id.value(), max)),
            Frame::MaxStreams { dir, max } => Some((0x12 + slot(dir) as u64, 0, max)),
            _ => None,
        })
        .collect()
}

fn assert_monotonic(bytes: &[u8]) {
    let updates = credit_updates(bytes);
    for (i, (kind, id, max)) in updates.iter().enumerate() {
        for (k2, id2, m2) in &updates[..i] {
            if k2 == kind && id2 == id {
                assert!(max > m2, "MAX_* went from {m2} to {max}");
            }
        }
    }
}

/// With connection credit given back on receipt (the default), newer streams
/// cannot starve an older one the application has not finished: only the
/// stream windows wait for the application.
#[test]
fn connection_credit_on_receipt_never_starves_an_unreleased_stream() {
    let client = Config {
        max_stream_data_uni: 1000,
        max_data: 1500,
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    p.client.auto_release = false;
    let old = p.server.conn.open_stream(Dir::Uni).unwrap();
    assert_eq!(
        p.write(Side::Server, old, &[1u8; 600], false).unwrap().data,
        600
    );
    // Two newer streams take far more than the connection window in total.
    for _ in 0..2 {
        let id = p.server.conn.open_stream(Dir::Uni).unwrap();
        assert_eq!(
            p.write(Side::Server, id, &[2u8; 1000], false).unwrap().data,
            1000
        );
        p.drive();
    }
    // Nothing was released, yet the old stream still has its own window left.
    assert_eq!(p.server.conn.send_credit(old), 400);
    assert_eq!(
        p.write(Side::Server, old, &[1u8; 400], false).unwrap().data,
        400
    );
}

#[test]
fn sender_stops_at_credit_and_release_returns_it() {
    let client = Config {
        max_stream_data_uni: 1000,
        max_data: 1500,
        connection_credit_on_receipt: false,
        stream_refs: false,
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    p.client.auto_release = false;
    let id = p.server.conn.open_stream(Dir::Uni).unwrap();
    assert_eq!(p.server.conn.send_credit(id), 1000);
    let w = p.write(Side::Server, id, &[7u8; 5000], false).unwrap();
    assert_eq!(w.data, 1000);
    assert_eq!(p.server.conn.send_credit(id), 0);
    assert_eq!(
        p.write(Side::Server, id, &[7u8; 10], false),
        Err(WriteError::Blocked)
    );
    // Nothing comes back until the application releases.
    assert!(credit_updates(&p.client.sent).is_empty());
    p.client.conn.release(id, 400); // 1000 + 800 > 1000: raise the stream by 400; connection 1000 + 800 > 1500: raise by 400
    p.drive();
    assert_eq!(
        credit_updates(&p.client.sent),
        [(0x10, 0, 1900), (0x11, 3, 1400)]
    );
    assert_eq!(p.server.conn.send_credit(id), 400);

    // The connection window binds across streams.
    let id2 = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Server, id, &[1u8; 400], false).unwrap();
    assert_eq!(p.server.conn.send_credit(id2), 500);
    assert_eq!(
        p.write(Side::Server, id2, &[1u8; 900], false).unwrap().data,
        500
    );
    assert_eq!(p.server.conn.send_credit(id), 0);
    p.client.conn.release(id, 1000);
    p.client.conn.release(id2, 500);
    p.drive();
    assert_monotonic(&p.client.sent);
    assert!(p.server.conn.send_credit(id2) > 0);
}

#[test]
fn credit_keeps_flowing_over_a_long_transfer() {
    let client = Config {
        max_stream_data_uni: 4096,
        max_data: 8192,
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    let id = p.server.conn.open_stream(Dir::Uni).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let mut rest = &data[..];
    while !rest.is_empty() {
        let w = p.write(Side::Server, id, rest, true).unwrap();
        rest = &rest[w.data..];
    }
    let got: Vec<u8> = p
        .client
        .take_events()
        .into_iter()
        .flat_map(|e| match e {
            Ev::Opened(_) => Vec::new(),
            Ev::Data { data, .. } => data,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(got, data);
    assert_monotonic(&p.client.sent);
}

#[test]
fn payload_is_capped_like_moq_dev() {
    let client = Config {
        max_stream_data_uni: 100_000,
        ..cfg()
    };
    let mut p = Pair::connected(client, cfg());
    let id = p.server.conn.open_stream(Dir::Uni).unwrap();
    let w = p.write(Side::Server, id, &[0u8; 40_000], false).unwrap();
    assert_eq!(w.data, 16_352);
    // A small output buffer shrinks the record instead of failing.
    let mut small = [0u8; 100];
    let w = p
        .server
        .conn
        .write_stream(p.now, id, &[0u8; 500], true, &mut small)
        .unwrap();
    assert_eq!(w.out, 100);
    assert!(w.data < 100 && w.data > 80);
    let f = frames(&small[..w.out]);
    assert!(
        matches!(f[..], [Frame::Stream(StreamFrame { fin: false, .. })]),
        "FIN only with the last byte"
    );
    assert_eq!(
        p.server
            .conn
            .write_stream(p.now, id, &[0u8; 5], false, &mut [0u8; 6]),
        Err(WriteError::BufferTooSmall)
    );
}

// ---- ping, keep-alive, timeouts ----

#[test]
fn ping_is_answered_with_the_same_sequence() {
    let mut p = Pair::connected(cfg(), cfg());
    p.client.conn.ping();
    p.client.conn.ping(); // still one pending request
    p.drive();
    assert!(frames(&p.client.sent).contains(&Frame::PingRequest(0)));
    assert!(frames(&p.server.sent).contains(&Frame::PingResponse(0)));
    p.client.conn.ping();
    p.drive();
    assert!(frames(&p.server.sent).contains(&Frame::PingResponse(1)));
}

#[test]
fn every_request_in_a_burst_is_answered() {
    let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
    let _ = drain(&mut c, Instant::ZERO);
    let mut inbox = rec(Frame::TransportParameters(cfg().transport_params(4, 4)));
    for seq in (0..40).chain([100, 7, 8]) {
        inbox.extend_from_slice(&rec(Frame::PingRequest(seq)));
    }
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, false),
        [Ev::Established("moq-lite-05")]
    );
    let out = drain(&mut c, Instant::ZERO);
    let seqs: Vec<u64> = frames(&out)
        .iter()
        .map(|f| match f {
            Frame::PingResponse(s) => *s,
            f => panic!("{f:?}"),
        })
        .collect();
    let want: Vec<u64> = (0..40).chain([100, 7, 8]).collect();
    assert_eq!(seqs, want);
}

#[test]
fn keep_alive_pings_after_a_third_of_idle() {
    let c = Config {
        max_idle_timeout: Duration::from_secs(3),
        ..cfg()
    };
    let mut p = Pair::connected(c, cfg());
    assert_eq!(p.client.conn.idle_timeout(), Some(Duration::from_secs(3)));
    let start = p.now;
    assert_eq!(
        p.client.conn.poll_timeout(),
        Some(start + Duration::from_secs(1))
    );
    p.advance(Duration::from_secs(1));
    assert!(frames(&p.client.sent).contains(&Frame::PingRequest(0)));
    assert!(frames(&p.server.sent).contains(&Frame::PingResponse(0)));
    // Kept alive for a long time by keep-alives alone.
    p.run_until(start + Duration::from_secs(120));
    assert!(p.client.conn.is_established() && p.server.conn.is_established());
    assert_eq!(p.client.take_events(), []);
}

#[test]
fn idle_timeout_closes_silently() {
    let c = Config {
        max_idle_timeout: Duration::from_secs(3),
        ..cfg()
    };
    let mut p = Pair::connected(c, cfg());
    p.linked = false;
    let start = p.now;
    p.run_until(start + Duration::from_secs(3));
    let want = Ev::Closed {
        code: 0,
        reason: "idle timeout".to_string(),
        application: false,
        cause: CloseCause::IdleTimeout,
    };
    assert_eq!(p.client.take_events(), core::slice::from_ref(&want));
    assert_eq!(p.server.take_events(), [want]);
    for end in [&mut p.client, &mut p.server] {
        assert!(end.conn.is_drained());
        assert_eq!(drain(&mut end.conn, p.now), []);
        assert_eq!(end.conn.poll_timeout(), None);
    }
}

#[test]
fn handshake_timeout_closes_with_code_0() {
    let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
    assert_eq!(c.poll_timeout(), Some(Instant::from_millis(10_000)));
    assert_eq!(c.handle_timeout(Instant::from_millis(9_999)), None);
    let e = c.handle_timeout(Instant::from_millis(10_000)).map(Ev::from);
    assert_eq!(
        e,
        Some(Ev::Closed {
            code: 0,
            reason: "handshake timeout".to_string(),
            application: false,
            cause: CloseCause::HandshakeTimeout
        })
    );
    let out = drain(&mut c, Instant::from_millis(10_000));
    let f = frames(&out);
    assert!(matches!(f[0], Frame::TransportParameters(_)));
    assert_eq!(
        f[1..],
        [Frame::ConnectionClose(ConnectionClose {
            code: 0,
            frame_type: 0,
            reason: b"handshake timeout"
        })]
    );
    assert!(c.is_drained());
}

// ---- closing ----

#[test]
fn application_close_reaches_the_peer() {
    let mut p = Pair::connected(cfg(), cfg());
    p.client.conn.close(64 + 5, "bye");
    p.client.conn.close(1, "ignored");
    assert!(p.client.conn.is_closed() && !p.client.conn.is_drained());
    p.drive();
    assert!(p.client.conn.is_drained());
    assert_eq!(
        p.server.take_events(),
        [Ev::Closed {
            code: 69,
            reason: "bye".to_string(),
            application: true,
            cause: CloseCause::Peer
        }]
    );
    assert!(p.server.conn.is_drained(), "nothing is sent back");
    assert_eq!(p.client.take_events(), []);
    assert_eq!(p.client.conn.open_stream(Dir::Bidi), Err(OpenError::Closed));
    assert_eq!(
        p.client
            .conn
            .write_stream(p.now, bidi(Side::Client, 0), b"", true, &mut [0u8; 8]),
        Err(WriteError::Closed)
    );
}

#[test]
fn transport_close_from_the_peer() {
    let mut p = Pair::connected(cfg(), cfg());
    let mut bytes = rec(Frame::ConnectionClose(ConnectionClose {
        code: 1002,
        frame_type: 0,
        reason: b"flow control error\xff",
    }));
    bytes.extend_from_slice(&rec(Frame::PingRequest(9)));
    p.client.inbox.extend_from_slice(&bytes);
    p.client.feed(p.now);
    assert_eq!(
        p.client.take_events(),
        [Ev::Closed {
            code: 1002,
            reason: "flow control error".to_string(),
            application: false,
            cause: CloseCause::Peer
        }]
    );
    assert!(
        p.client.inbox.is_empty(),
        "input after the close is consumed and ignored"
    );
    assert_eq!(drain(&mut p.client.conn, p.now), []);
}

#[test]
fn long_reasons_are_cut_at_a_char_boundary() {
    let mut p = Pair::connected(cfg(), cfg());
    let reason = "é".repeat(100);
    p.client.conn.close(0, &reason);
    p.drive();
    let [Ev::Closed { reason: got, .. }] = &p.server.take_events()[..] else {
        panic!()
    };
    assert_eq!(got.len(), 96);
    assert!(reason.starts_with(got.as_str()));
}

// ---- datagrams ----

#[test]
fn datagrams_only_where_advertised() {
    let server = Config {
        max_datagram_frame_size: 100,
        ..cfg()
    };
    let mut p = Pair::connected(cfg(), server);
    // 1 type byte + 2 length bytes + 97 = 100.
    assert_eq!(p.client.conn.max_datagram_payload(), 97);
    assert_eq!(p.server.conn.max_datagram_payload(), 0);
    let mut out = [0u8; 200];
    let n = p.client.conn.send_datagram(p.now, b"hi", &mut out).unwrap();
    p.server.inbox.extend_from_slice(&out[..n]);
    p.server.feed(p.now);
    assert_eq!(p.server.take_events(), [Ev::Datagram(b"hi".to_vec())]);
    assert_eq!(
        p.client.conn.send_datagram(p.now, &[0u8; 98], &mut out),
        Err(DatagramError::TooLarge)
    );
    assert_eq!(
        p.server.conn.send_datagram(p.now, b"hi", &mut out),
        Err(DatagramError::Unsupported)
    );
    assert_eq!(
        p.client.conn.send_datagram(p.now, b"hi", &mut out[..3]),
        Err(DatagramError::BufferTooSmall)
    );
}

// ---- violations (docs/protocol.md §2.4): each ends in a 1002 transport close ----

/// An established client whose peer is a raw byte script; the server granted 4/4
/// streams, 1000 bytes per stream and 3000 per connection, and accepts datagrams.
fn raw_client(config: Config) -> Conn {
    let mut c = Conn::new(Side::Client, config, Instant::ZERO).unwrap();
    let _ = drain(&mut c, Instant::ZERO);
    let server = Config {
        max_stream_data_bidi_local: 1000,
        max_stream_data_bidi_remote: 1000,
        max_stream_data_uni: 1000,
        max_data: 3000,
        ..cfg()
    };
    let mut inbox = rec(Frame::TransportParameters(server.transport_params(4, 4)));
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, true),
        [Ev::Established("moq-lite-05")]
    );
    c
}

/// Feeds `bytes` and checks the connection ends with the violation `e` and says so on the wire.
fn assert_violation(c: &mut Conn, bytes: &[u8], e: TransportError) {
    let mut inbox = bytes.to_vec();
    // Nothing released: any credit in play is the initial grant.
    let evs = feed(c, Instant::ZERO, &mut inbox, false);
    assert_eq!(evs.last(), Some(&closed_by_violation(e)), "events {evs:?}");
    assert!(inbox.is_empty());
    assert!(c.is_closed() && !c.is_drained());
    let out = drain(c, Instant::ZERO);
    assert_eq!(
        frames(&out),
        [Frame::ConnectionClose(ConnectionClose {
            code: 1002,
            frame_type: 0,
            reason: e.reason().as_bytes()
        })]
    );
    assert!(c.is_drained());
    assert_eq!(drain(c, Instant::ZERO), []);
}

fn stream_rec(id: StreamId, offset: u64, data: &[u8], fin: bool) -> Vec<u8> {
    rec(Frame::Stream(StreamFrame {
        id,
        offset,
        data,
        fin,
    }))
}

#[test]
fn violation_data_beyond_stream_limit() {
    let mut c = raw_client(Config {
        max_stream_data_uni: 100,
        ..cfg()
    });
    let mut bytes = stream_rec(uni(Side::Server, 0), 0, &[0; 60], false);
    bytes.extend_from_slice(&stream_rec(uni(Side::Server, 0), 60, &[0; 41], false));
    assert_violation(&mut c, &bytes, TransportError::FlowControl);
}

#[test]
fn violation_data_beyond_connection_limit() {
    let mut c = raw_client(Config {
        max_stream_data_uni: 100,
        max_data: 150,
        connection_credit_on_receipt: false,
        stream_refs: false,
        ..cfg()
    });
    let mut bytes = stream_rec(uni(Side::Server, 0), 0, &[0; 100], false);
    bytes.extend_from_slice(&stream_rec(uni(Side::Server, 1), 0, &[0; 51], false));
    assert_violation(&mut c, &bytes, TransportError::FlowControl);
}

#[test]
fn violation_reset_final_size_beyond_limit() {
    let mut c = raw_client(Config {
        max_stream_data_uni: 100,
        ..cfg()
    });
    let bytes = rec(Frame::ResetStream(ResetStream {
        id: uni(Side::Server, 0),
        code: 0,
        final_size: 101,
    }));
    assert_violation(&mut c, &bytes, TransportError::FlowControl);
}

#[test]
fn violation_stream_index_beyond_grant() {
    let mut c = raw_client(cfg());
    // We granted 4 uni streams: indices 0..=3.
    assert_violation(
        &mut c,
        &stream_rec(uni(Side::Server, 4), 0, b"x", false),
        TransportError::StreamLimit,
    );
    let mut c = raw_client(cfg());
    let bytes = rec(Frame::ResetStream(ResetStream {
        id: bidi(Side::Server, 9),
        code: 0,
        final_size: 0,
    }));
    assert_violation(&mut c, &bytes, TransportError::StreamLimit);
}

#[test]
fn violation_decreasing_max() {
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &rec(Frame::MaxData(2999)),
        TransportError::FlowControl,
    );
    let mut c = raw_client(cfg());
    let mut bytes = rec(Frame::MaxStreams {
        dir: Dir::Uni,
        max: 4,
    }); // equal is fine
    bytes.extend_from_slice(&rec(Frame::MaxStreams {
        dir: Dir::Uni,
        max: 3,
    }));
    assert_violation(&mut c, &bytes, TransportError::FlowControl);
    let mut c = raw_client(cfg());
    let id = c.open_stream(Dir::Bidi).unwrap();
    let mut bytes = rec(Frame::MaxStreamData { id, max: 1500 });
    bytes.extend_from_slice(&rec(Frame::MaxStreamData { id, max: 1499 }));
    assert_violation(&mut c, &bytes, TransportError::FlowControl);
}

#[test]
fn violation_frame_on_invalid_stream() {
    // STREAM on a uni stream only we may send on.
    let mut c = raw_client(cfg());
    let ours = c.open_stream(Dir::Uni).unwrap();
    assert_violation(
        &mut c,
        &stream_rec(ours, 0, b"x", false),
        TransportError::InvalidStreamId,
    );
    // RESET_STREAM on it, likewise.
    let mut c = raw_client(cfg());
    let bytes = rec(Frame::ResetStream(ResetStream {
        id: uni(Side::Client, 0),
        code: 0,
        final_size: 0,
    }));
    assert_violation(&mut c, &bytes, TransportError::InvalidStreamId);
    // STOP_SENDING on a uni stream the peer sends on.
    let mut c = raw_client(cfg());
    let bytes = rec(Frame::StopSending(StopSending {
        id: uni(Side::Server, 0),
        code: 0,
    }));
    assert_violation(&mut c, &bytes, TransportError::InvalidStreamId);
    // Data on one of our bidi streams that was never opened.
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &stream_rec(bidi(Side::Client, 0), 0, b"x", false),
        TransportError::InvalidStreamId,
    );
}

#[test]
fn violation_unknown_frame_type() {
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &[0x02, 0x02, 0x00],
        TransportError::InvalidFrameType(0x02),
    ); // ACK
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &[0x05, 0x24, 0x03, 0x00, 0x00, 0x00],
        TransportError::InvalidFrameType(0x24),
    );
}

#[test]
fn stream_ref_is_a_violation_unless_configured() {
    // STREAM_REF is skiff's private frame for in-process links: a connection
    // that did not turn it on treats it as an unknown frame type.
    let mut c = raw_client(cfg());
    let bytes = rec(Frame::StreamRef(crate::wire::qmux::StreamRef {
        id: uni(Side::Server, 0),
        offset: 0,
        len: 5,
        token: 9,
        fin: true,
    }));
    assert_violation(
        &mut c,
        &bytes,
        TransportError::InvalidFrameType(crate::wire::qmux::STREAM_REF),
    );
}

#[test]
#[cfg(feature = "stream-refs")]
fn stream_ref_is_charged_like_stream_data() {
    let config = Config {
        stream_refs: true,
        max_stream_data_uni: 1000,
        ..cfg()
    };
    let r = |offset, len, token, fin| {
        rec(Frame::StreamRef(crate::wire::qmux::StreamRef {
            id: uni(Side::Server, 0),
            offset,
            len,
            token,
            fin,
        }))
    };
    let mut c = raw_client(config);
    let mut inbox = r(0, 600, 1, false);
    inbox.extend_from_slice(&r(600, 400, 2, true));
    let evs = feed(&mut c, Instant::ZERO, &mut inbox, false);
    let id = uni(Side::Server, 0).value();
    assert_eq!(
        evs,
        [
            Ev::Opened(id),
            Ev::Ref {
                id,
                offset: 0,
                len: 600,
                token: 1,
                fin: false
            },
            Ev::Ref {
                id,
                offset: 600,
                len: 400,
                token: 2,
                fin: true
            },
        ]
    );
    // Past the stream window it is a flow-control violation, like STREAM.
    let mut c = raw_client(config);
    assert_violation(&mut c, &r(0, 1001, 1, false), TransportError::FlowControl);
}

#[test]
fn violation_malformed_frame() {
    // A STREAM frame whose Length runs past its record.
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &[0x05, 0x0e, 0x03, 0x00, 0x09, 0x61],
        TransportError::ShortFrame,
    );
    // A MAX_DATA cut short by the record end.
    let mut c = raw_client(cfg());
    assert_violation(&mut c, &[0x02, 0x10, 0x80], TransportError::ShortFrame);
}

#[test]
fn violation_record_too_large() {
    let mut c = raw_client(cfg());
    // Size 16383 is refused before its body arrives.
    assert_violation(&mut c, &[0x7f, 0xff], TransportError::FrameTooLarge);
}

#[test]
fn violation_datagrams() {
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &rec(Frame::Datagram(Datagram::new(b"x"))),
        TransportError::DatagramsUnsupported,
    );
    let mut c = raw_client(Config {
        max_datagram_frame_size: 10,
        ..cfg()
    });
    let mut inbox = rec(Frame::Datagram(Datagram::new(&[1; 8])));
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, true),
        [Ev::Datagram(vec![1; 8])]
    );
    assert_violation(
        &mut c,
        &rec(Frame::Datagram(Datagram::new(&[1; 9]))),
        TransportError::FrameTooLarge,
    );
}

#[test]
fn violation_transport_parameters() {
    fn fresh() -> Conn {
        let mut c = Conn::new(Side::Client, cfg(), Instant::ZERO).unwrap();
        let _ = drain(&mut c, Instant::ZERO);
        c
    }
    // Forbidden ID 0x00 (original_destination_connection_id).
    let bad = [
        0x0b, 0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x02, 0x00, 0x00,
    ];
    assert_violation(&mut fresh(), &bad, TransportError::TransportParameter);
    // max_idle_timeout twice.
    let dup = [
        0x0f, 0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x06, 0x01, 0x01, 0x05, 0x01, 0x01,
        0x05,
    ];
    assert_violation(&mut fresh(), &dup, TransportError::DuplicateParameter);
    // A second parameters frame.
    let mut c = raw_client(cfg());
    assert_violation(
        &mut c,
        &rec(Frame::TransportParameters(cfg().transport_params(4, 4))),
        TransportError::ProtocolViolation,
    );
}

// ---- late and lenient input ----

#[test]
fn late_frames_for_retired_streams_are_ignored_but_charged() {
    let mut c = raw_client(Config {
        max_data: 1000,
        ..cfg()
    });
    let id = uni(Side::Server, 0);
    let mut inbox = stream_rec(id, 0, &[1; 10], true);
    let evs = feed(&mut c, Instant::ZERO, &mut inbox, true);
    assert_eq!(evs.len(), 2);
    assert_eq!(c.open_streams(), 0);
    // 990 late bytes still count against the connection window, and come straight back.
    let mut inbox = stream_rec(id, 10, &[1; 990], false);
    assert_eq!(feed(&mut c, Instant::ZERO, &mut inbox, true), []);
    let out = drain(&mut c, Instant::ZERO);
    assert_eq!(frames(&out), [Frame::MaxData(2000)]);
}

#[test]
fn frames_without_off_or_len_are_accepted() {
    let mut c = raw_client(cfg());
    // Type 0x08: no offset, data runs to the end of the record; then 0x09 with FIN.
    let bytes = [0x04, 0x08, 0x03, b'a', b'b', 0x02, 0x09, 0x03, 0x00, 0x00];
    let mut inbox = bytes.to_vec();
    // Padding between frames is skipped too.
    inbox.splice(5..5, [0x01, 0x00]);
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, true),
        [
            Ev::Opened(3),
            Ev::Data {
                id: 3,
                offset: 0,
                data: b"ab".to_vec(),
                fin: false
            },
            Ev::Data {
                id: 3,
                offset: 2,
                data: Vec::new(),
                fin: true
            },
        ]
    );
}

#[test]
fn several_frames_in_one_record() {
    let mut c = raw_client(cfg());
    let mut body = Vec::new();
    for f in [
        Frame::Stream(StreamFrame {
            id: uni(Side::Server, 1),
            offset: 0,
            data: b"x",
            fin: false,
        }),
        Frame::PingRequest(3),
        Frame::Stream(StreamFrame {
            id: uni(Side::Server, 0),
            offset: 0,
            data: b"y",
            fin: true,
        }),
    ] {
        let mut buf = [0u8; 64];
        let mut w = crate::wire::Writer::new(&mut buf);
        f.encode(&mut w).unwrap();
        body.extend_from_slice(w.written());
    }
    let mut inbox = vec![body.len() as u8];
    inbox.extend_from_slice(&body);
    assert_eq!(
        feed(&mut c, Instant::ZERO, &mut inbox, true),
        [
            Ev::Opened(3),
            Ev::Opened(7),
            Ev::Data {
                id: 7,
                offset: 0,
                data: b"x".to_vec(),
                fin: false
            },
            Ev::Data {
                id: 3,
                offset: 0,
                data: b"y".to_vec(),
                fin: true
            },
        ]
    );
    assert_eq!(
        frames(&drain(&mut c, Instant::ZERO)),
        [Frame::PingResponse(3)]
    );
}

#[test]
fn partial_records_wait() {
    let mut c = raw_client(cfg());
    let bytes = stream_rec(uni(Side::Server, 0), 0, b"hello", false);
    for cut in 0..bytes.len() {
        let step = c.handle_input(Instant::ZERO, &bytes[..cut]);
        assert_eq!((step.consumed, step.event), (0, None), "cut {cut}");
    }
    assert_eq!(
        Record::decode(&bytes[..3], DEFAULT_MAX_RECORD_SIZE),
        Err(DecodeError::Incomplete)
    );
}

// ---- every chunking of a whole session yields the same events ----

/// A scripted session; returns the bytes each side sent.
fn scripted_session() -> (Vec<u8>, Vec<u8>) {
    let client = Config {
        max_datagram_frame_size: 64,
        ..cfg()
    };
    let server = Config {
        max_datagram_frame_size: 64,
        ..cfg()
    };
    let mut p = Pair::connected(client, server);
    let b0 = p.client.conn.open_stream(Dir::Bidi).unwrap();
    p.write(Side::Client, b0, b"announce please", false)
        .unwrap();
    p.write(Side::Server, b0, b"ok", false).unwrap();
    let u0 = p.client.conn.open_stream(Dir::Uni).unwrap();
    let u1 = p.client.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Client, u1, b"newest first", true).unwrap();
    p.write(Side::Client, u0, b"older", false).unwrap();
    p.client.conn.reset_stream(u0, 0x34).unwrap();
    let s0 = p.server.conn.open_stream(Dir::Uni).unwrap();
    p.write(Side::Server, s0, &[9u8; 300], true).unwrap();
    p.client.conn.ping();
    p.server.conn.ping();
    p.drive();
    let mut out = [0u8; 100];
    let n = p
        .client
        .conn
        .send_datagram(p.now, b"dgram", &mut out)
        .unwrap();
    p.server.inbox.extend_from_slice(&out[..n]);
    p.client.sent.extend_from_slice(&out[..n]);
    p.client.conn.stop_sending(b0, 1).unwrap();
    p.server.conn.stop_sending(b0, 2).unwrap();
    p.drive();
    p.write(Side::Server, b0, b"bye", true).unwrap();
    p.client.conn.close(0, "done");
    p.drive();
    (p.client.sent.clone(), p.server.sent.clone())
}

/// Events of a fresh `side` fed `bytes` in the given chunks (the buffer keeps unconsumed tails).
fn replay(side: Side, bytes: &[u8], cuts: &[usize]) -> Vec<Ev> {
    let config = Config {
        max_datagram_frame_size: 64,
        ..cfg()
    };
    let mut c = Conn::new(side, config, Instant::ZERO).unwrap();
    let _ = drain(&mut c, Instant::ZERO);
    let mut inbox = Vec::new();
    let mut events = Vec::new();
    let mut last = 0;
    for &cut in cuts.iter().chain([bytes.len()].iter()) {
        inbox.extend_from_slice(&bytes[last..cut]);
        last = cut;
        events.extend(feed(&mut c, Instant::ZERO, &mut inbox, true));
        // Control output in between must not disturb the input side.
        let _ = drain(&mut c, Instant::ZERO);
    }
    events
}

#[test]
fn every_split_point_yields_the_same_events() {
    let (from_client, from_server) = scripted_session();
    assert!(
        from_client.len() > 150 && from_server.len() > 400,
        "{} {}",
        from_client.len(),
        from_server.len()
    );
    for (side, bytes) in [(Side::Server, &from_client), (Side::Client, &from_server)] {
        let whole = replay(side, bytes, &[]);
        assert!(matches!(whole.first(), Some(Ev::Established(_))));
        assert!(matches!(
            whole.last(),
            Some(Ev::Closed { .. }) | Some(Ev::Data { .. }) | Some(Ev::Stop { .. })
        ));
        for cut in 0..=bytes.len() {
            assert_eq!(
                replay(side, bytes, &[cut]),
                whole,
                "{side:?} split at {cut}"
            );
        }
        let every: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(replay(side, bytes, &every), whole, "{side:?} byte by byte");
    }
    // The server saw the client's whole script.
    let whole = replay(Side::Server, &from_client, &[]);
    assert!(whole.contains(&Ev::Datagram(b"dgram".to_vec())));
    assert!(whole.contains(&Ev::Opened(6)));
    assert!(whole.contains(&Ev::Reset {
        id: 2,
        code: 0x34,
        final_size: 5
    }));
    assert_eq!(
        whole.last(),
        Some(&Ev::Closed {
            code: 0,
            reason: "done".to_string(),
            application: true,
            cause: CloseCause::Peer
        })
    );
}

// ---- hostile input ----

/// Feeds `bytes` and checks the connection either closed or holds only an incomplete record.
fn check_random(prefix: &[u8], bytes: &[u8]) {
    let mut c = Conn::new(
        Side::Server,
        Config {
            max_datagram_frame_size: 100,
            ..cfg()
        },
        Instant::ZERO,
    )
    .unwrap();
    let _ = drain(&mut c, Instant::ZERO);
    let mut inbox = prefix.to_vec();
    inbox.extend_from_slice(bytes);
    let events = feed(&mut c, Instant::ZERO, &mut inbox, true);
    let _ = drain(&mut c, Instant::ZERO);
    if c.is_closed() {
        assert!(inbox.is_empty());
        assert!(matches!(events.last(), Some(Ev::Closed { .. })));
    } else {
        assert!(
            Record::decode(&inbox, DEFAULT_MAX_RECORD_SIZE) == Err(DecodeError::Incomplete)
                || c.record_left > 0
        );
    }
    // Whatever happened, the timers still work.
    let _ = c.handle_timeout(Instant::MAX);
    assert!(c.is_closed());
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_random(&[], &bytes);
    }

    #[test]
    fn random_frames_after_valid_parameters_never_panic(
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20)
    ) {
        let prefix = rec(Frame::TransportParameters(cfg().transport_params(4, 4)));
        // Well-framed records with random bodies reach the frame handlers.
        let mut bytes = Vec::new();
        for body in records {
            bytes.push(body.len() as u8);
            bytes.extend_from_slice(&body);
        }
        check_random(&prefix, &bytes);
    }

    #[test]
    fn random_valid_frames_never_panic(ops in proptest::collection::vec((0u8..10, 0u64..40, 0u64..2000), 0..40)) {
        let prefix = rec(Frame::TransportParameters(cfg().transport_params(4, 4)));
        let mut bytes = Vec::new();
        for (kind, a, b) in ops {
            let id = StreamId(a);
            let data = [0u8; 50];
            let f = match kind {
                0 => Frame::Stream(StreamFrame { id, offset: b, data: &data[..(b % 50) as usize], fin: b % 3 == 0 }),
                1 => Frame::ResetStream(ResetStream { id, code: b, final_size: b }),
                2 => Frame::StopSending(StopSending { id, code: b }),
                3 => Frame::MaxData(b),
                4 => Frame::MaxStreamData { id, max: b },
                5 => Frame::MaxStreams { dir: if a % 2 == 0 { Dir::Bidi } else { Dir::Uni }, max: b },
                6 => Frame::PingRequest(b),
                7 => Frame::Datagram(Datagram::new(&data[..(b % 50) as usize])),
                8 => Frame::ApplicationClose(ApplicationClose { code: b, reason: b"r" }),
                _ => Frame::Padding,
            };
            bytes.extend_from_slice(&rec(f));
        }
        check_random(&prefix, &bytes);
    }
}

#[test]
fn protocols_are_ours_even_when_chosen_by_the_peer() {
    // The client's answer is taken from its own list, so it outlives the input.
    let theirs = [
        0x0b, b'm', b'o', b'q', b'-', b'l', b'i', b't', b'e', b'-', b'0', b'5',
    ];
    let p = Protocols::decode(&theirs).unwrap();
    let got: &'static str = negotiate(Side::Client, &["x", "moq-lite-05"], Some(p)).unwrap();
    assert_eq!(got, "moq-lite-05");
    assert_eq!(negotiate(Side::Server, &["x"], Some(p)), None);
    assert_eq!(negotiate(Side::Server, &["x"], None), None);
}
