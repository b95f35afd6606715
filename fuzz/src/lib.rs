//! Shared drivers for the skiff-core fuzz targets.
//!
//! The connection driver turns the fuzzer's bytes into a script of operations
//! (feed a chunk of received bytes, let time pass, make an application call)
//! and runs it against a client and a server [`Connection`], checking the
//! invariants the module documentation promises after every step.

use std::collections::HashMap;

use skiff_core::conn::{CloseCause, Config, Connection, Event};
use skiff_core::time::{Duration, Instant};
use skiff_core::wire::qmux::{
    Dir, Frame, Protocols, Record, Side, StreamId, TransportParams, VIOLATION_CODE, encode_record,
};

/// Stream table size of the fuzzed connections.
pub const SLOTS: usize = 16;

/// Most `handle_input` / `handle_timeout` / `poll_transmit` calls one step may take
/// before the driver calls it a livelock.
pub const MAX_CALLS: usize = 100_000;

/// A valid QX_TRANSPORT_PARAMETERS record from a moq-dev-like peer offering moq-lite-05.
pub fn handshake_record() -> Vec<u8> {
    let params = TransportParams {
        max_idle_timeout: 30_000,
        initial_max_data: 1 << 20,
        initial_max_stream_data_bidi_local: 1 << 18,
        initial_max_stream_data_bidi_remote: 1 << 18,
        initial_max_stream_data_uni: 1 << 18,
        initial_max_streams_bidi: 100,
        initial_max_streams_uni: 100,
        max_datagram_frame_size: 1200,
        reset_stream_at: false,
        max_record_size: Some(16382),
        application_protocols: Some(Protocols::from_list(&["moq-lite-05"])),
    };
    let frame = Frame::TransportParameters(params);
    let mut buf = vec![0u8; 256];
    let n = encode_record(&frame, 16382, &mut buf).expect("parameters record");
    buf.truncate(n);
    buf
}

/// Pulls bytes off the front of the fuzz input; empty once exhausted.
pub struct Script<'a>(pub &'a [u8]);

impl<'a> Script<'a> {
    /// The next byte, if any.
    pub fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// Up to `n` next bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// What the driver remembers about a receiving stream, to check event order.
#[derive(Default)]
struct RecvTrack {
    next_offset: u64,
    done: bool,
}

/// One fuzzed connection and its harness state.
struct Harness {
    conn: Connection<SLOTS>,
    side: Side,
    now: Instant,
    inbox: Vec<u8>,
    auto_release: bool,
    unreleased: Vec<(StreamId, u64)>,
    recv: HashMap<u64, RecvTrack>,
    opened: Vec<StreamId>,
    closed_event: bool,
    out: Vec<u8>,
}

impl Harness {
    fn new(side: Side, flags: u8) -> Self {
        let mut config = Config::new();
        if flags & 0x01 != 0 {
            config.max_datagram_frame_size = 1200;
        }
        if flags & 0x02 != 0 {
            // Small windows reach the flow-control checks with short inputs.
            config.max_data = 4096;
            config.max_stream_data_bidi_local = 1024;
            config.max_stream_data_bidi_remote = 1024;
            config.max_stream_data_uni = 1024;
        }
        if flags & 0x04 != 0 {
            config.keep_alive = false;
        }
        if flags & 0x08 != 0 {
            config.handshake_timeout = Duration::ZERO;
        }
        if flags & 0x20 != 0 {
            config.max_streams_bidi = Some(2);
            config.max_streams_uni = Some(2);
        }
        let now = Instant::from_micros(1_000_000);
        let conn = Connection::<SLOTS>::new(side, config, now).expect("fuzz config is valid");
        Harness {
            conn,
            side,
            now,
            inbox: Vec::new(),
            auto_release: flags & 0x10 != 0,
            unreleased: Vec::new(),
            recv: HashMap::new(),
            opened: Vec::new(),
            closed_event: false,
            out: vec![0u8; 20_000],
        }
    }

    /// Checks one event against what came before.
    fn on_event(&mut self, event: Event<'_>) {
        assert!(!self.closed_event, "event after Closed: {event:?}");
        match event {
            Event::StreamData {
                id,
                offset,
                data,
                fin,
                ..
            } => {
                assert!(id.can_recv(self.side), "data on a send-only stream {id:?}");
                let t = self.recv.entry(id.value()).or_default();
                assert!(!t.done, "data after FIN/reset on {id:?}");
                assert_eq!(offset, t.next_offset, "offset gap on {id:?}");
                t.next_offset += data.len() as u64;
                t.done = fin;
                if self.auto_release {
                    self.conn.release(id, data.len() as u64);
                } else {
                    self.unreleased.push((id, data.len() as u64));
                }
            }
            // QMux's credit arrives with its input: it never reports this.
            Event::StreamWritable { id } => {
                panic!("StreamWritable from a QMux connection, on {id:?}")
            }
            // The harness never turns stream references on.
            Event::StreamRef { id, .. } => {
                panic!("STREAM_REF accepted with stream refs off, on {id:?}")
            }
            Event::StreamReset { id, final_size, .. } => {
                let t = self.recv.entry(id.value()).or_default();
                assert!(!t.done, "reset after FIN/reset on {id:?}");
                assert!(
                    final_size >= t.next_offset,
                    "final size below data on {id:?}"
                );
                t.done = true;
            }
            Event::StreamOpened { id } => {
                assert!(!id.is_local(self.side), "peer opened our stream {id:?}");
                self.opened.push(id);
            }
            Event::Closed(c) => {
                assert!(self.conn.is_closed(), "Closed event on an open connection");
                if let CloseCause::Violation(e) = c.cause {
                    assert_eq!(c.code, VIOLATION_CODE);
                    assert_eq!(c.code, e.code());
                    assert!(!c.application);
                }
                self.closed_event = true;
            }
            Event::Established { protocol } => {
                assert_eq!(Some(protocol), self.conn.protocol());
            }
            Event::StopSending { id, .. } => {
                assert!(id.can_send(self.side), "STOP_SENDING event on {id:?}");
            }
            Event::Datagram(d) => {
                assert!(d.len() <= 1200);
            }
        }
    }

    /// Feeds the inbox until no event is left.
    fn pump(&mut self) {
        for _ in 0..MAX_CALLS {
            let inbox = std::mem::take(&mut self.inbox);
            let step = self.conn.handle_input(self.now, &inbox);
            assert!(step.consumed <= inbox.len(), "consumed past the input");
            let consumed = step.consumed;
            let event = step.event;
            let done = event.is_none();
            if let Some(event) = event {
                self.on_event(event);
            }
            if done && self.conn.is_closed() {
                assert_eq!(consumed, inbox.len(), "closed but input left");
            }
            self.inbox = inbox;
            self.inbox.drain(..consumed);
            if done {
                return;
            }
        }
        panic!("handle_input did not settle");
    }

    /// Drains `poll_transmit` and checks that what it wrote is well-formed records.
    fn transmit(&mut self) {
        let mut buf = [0u8; 512];
        for _ in 0..MAX_CALLS {
            let n = self.conn.poll_transmit(self.now, &mut buf);
            assert!(n <= buf.len());
            if n == 0 {
                return;
            }
            check_records(&buf[..n]);
        }
        panic!("poll_transmit did not settle");
    }

    fn advance(&mut self, step: u8) {
        let dt = u64::from(step) * u64::from(step) * 1_000;
        self.now = Instant::from_micros(self.now.as_micros() + dt);
        for _ in 0..MAX_CALLS {
            match self.conn.handle_timeout(self.now) {
                Some(event) => self.on_event(event),
                None => return,
            }
        }
        panic!("handle_timeout did not settle");
    }

    fn write(&mut self, id: StreamId, len: usize, fin: bool) {
        let data = vec![0x5au8; len];
        let mut out = std::mem::take(&mut self.out);
        if let Ok(w) = self.conn.write_stream(self.now, id, &data, fin, &mut out) {
            assert!(w.data <= len && w.out <= out.len());
            check_records(&out[..w.out]);
        }
        self.out = out;
    }

    /// Runs one scripted operation.
    fn op(&mut self, op: u8, s: &mut Script<'_>) {
        match op & 0x07 {
            0..=2 => {
                let n = usize::from(s.byte().unwrap_or(0)) + 1;
                self.inbox.extend_from_slice(s.take(n));
                self.pump();
            }
            3 => {
                let n = usize::from(s.byte().unwrap_or(0)) * 64 + 1;
                self.inbox.extend_from_slice(s.take(n));
                self.pump();
            }
            4 => self.advance(s.byte().unwrap_or(0)),
            5 => {
                let dir = if op & 0x08 != 0 { Dir::Uni } else { Dir::Bidi };
                let len = usize::from(s.byte().unwrap_or(0)) * 17;
                if let Ok(id) = self.conn.open_stream(dir) {
                    assert!(id.is_local(self.side));
                    self.opened.push(id);
                    self.write(id, len, op & 0x10 != 0);
                }
            }
            6 => {
                let pick = usize::from(s.byte().unwrap_or(0));
                if let Some(&id) = self.opened.get(pick % self.opened.len().max(1)) {
                    let code = u64::from(op >> 4);
                    match op & 0x08 {
                        0 => {
                            let _ = self.conn.reset_stream(id, code);
                        }
                        _ => {
                            let _ = self.conn.stop_sending(id, code);
                        }
                    }
                }
            }
            _ => match (op >> 3) & 0x03 {
                0 => {
                    for (id, n) in std::mem::take(&mut self.unreleased) {
                        self.conn.release(id, n);
                    }
                }
                1 => self.conn.ping(),
                2 => {
                    let pick = usize::from(s.byte().unwrap_or(0));
                    if let Some(&id) = self.opened.get(pick % self.opened.len().max(1)) {
                        let _ = self.conn.send_credit(id);
                        self.write(id, 3000, op & 0x20 != 0);
                    }
                }
                _ => self.conn.close(u64::from(op >> 5), "fuzz close"),
            },
        }
        self.transmit();
    }
}

/// Every byte `poll_transmit` / `write_stream` writes must be whole, decodable records.
pub fn check_records(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let rec = Record::decode(bytes, u64::MAX).expect("we wrote a bad record");
        for f in rec.frames() {
            f.expect("we wrote a bad frame");
        }
        bytes = &bytes[rec.len..];
    }
}

/// Runs the fuzz script against a server and a client connection.
///
/// The first byte holds configuration flags; with `handshake` the peer's valid
/// QX_TRANSPORT_PARAMETERS record is received first, so the script starts on an
/// established connection and reaches stream and flow-control code.
pub fn drive_conn(data: &[u8], handshake: bool) {
    let Some((&flags, script)) = data.split_first() else {
        return;
    };
    for side in [Side::Server, Side::Client] {
        let mut h = Harness::new(side, flags);
        h.transmit();
        if handshake {
            h.inbox = handshake_record();
            h.pump();
            assert!(h.conn.is_established(), "valid handshake did not establish");
        }
        let mut s = Script(script);
        while let Some(op) = s.byte() {
            h.op(op, &mut s);
        }
        // Once closed, input is swallowed and the close frame drains.
        if h.conn.is_closed() {
            let step = h.conn.handle_input(h.now, &[0x01, 0x00]);
            assert_eq!(step.consumed, 2);
            assert!(step.event.is_none());
            h.transmit();
            assert!(h.conn.is_drained(), "closed but not drained");
            assert!(h.conn.poll_timeout().is_none());
        }
    }
}
