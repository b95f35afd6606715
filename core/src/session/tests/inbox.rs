//! [`Inbox`]: its buffer accounting, and sessions fed through it.

use super::*;
use crate::session::harness::Endpoint;

/// A full QMux record: the default `max_record_size` plus its 8-byte head room.
const RECORD: usize = 16_390;

/// Writes `bytes` into the spare room and commits them (they must fit).
fn put<B: AsRef<[u8]> + AsMut<[u8]>>(inbox: &mut Inbox<B>, bytes: &[u8]) {
    let room = inbox.spare_mut();
    room[..bytes.len()].copy_from_slice(bytes);
    inbox.commit(bytes.len());
}

#[test]
fn consuming_everything_starts_over_at_the_front() {
    let mut buf = [0u8; 64];
    let mut inbox = Inbox::new(&mut buf[..]);
    assert!(inbox.is_empty() && !inbox.is_full());
    assert_eq!(inbox.capacity(), 64);
    put(&mut inbox, b"abcdef");
    assert_eq!((inbox.len(), inbox.unconsumed()), (6, &b"abcdef"[..]));
    assert_eq!(inbox.spare_mut().len(), 58);
    inbox.consume(2);
    assert_eq!(inbox.unconsumed(), b"cdef");
    // Room enough after the bytes: nothing moves.
    assert_eq!(inbox.spare_mut().len(), 58);
    inbox.consume(4);
    assert!(inbox.is_empty());
    assert_eq!(inbox.spare_mut().len(), 64);
    // Consuming more than waits drops what waits.
    put(&mut inbox, b"xy");
    inbox.consume(10);
    assert!(inbox.is_empty());
}

#[test]
fn the_tail_moves_to_the_front_only_when_room_runs_short() {
    let mut buf = [0u8; 100];
    let mut inbox = Inbox::with_min_room(&mut buf[..], 30);
    let bytes: Vec<u8> = (0..80).collect();
    put(&mut inbox, &bytes);
    inbox.consume(10);
    // 20 bytes of room after the 70 waiting, less than 30: they move.
    assert_eq!(inbox.spare_mut().len(), 30);
    assert_eq!(inbox.unconsumed(), &bytes[10..]);
    put(&mut inbox, &[200; 5]);
    inbox.consume(60);
    // 25 left after 15 waiting: under 30 again, so they move, and 85 are free.
    assert_eq!(inbox.spare_mut().len(), 85);
    let mut want = bytes[70..].to_vec();
    want.extend_from_slice(&[200; 5]);
    assert_eq!(inbox.unconsumed(), &want[..]);
    // Nothing consumed: nothing to win by moving.
    let mut buf = [0u8; 10];
    let mut inbox = Inbox::with_min_room(&mut buf[..], 30);
    put(&mut inbox, &[1; 4]);
    assert_eq!(inbox.spare_mut().len(), 6);
}

/// A read larger than the minimum room, but not than the free space: the
/// tail moves to the front for it, though the room after the tail was not
/// short by the minimum's measure.
#[test]
fn a_read_larger_than_the_minimum_room_fits_once_the_front_is_given_back() {
    let mut buf = [0u8; 100];
    let mut inbox = Inbox::with_min_room(&mut buf[..], 30);
    let bytes: Vec<u8> = (0..60).collect();
    put(&mut inbox, &bytes);
    inbox.consume(50);
    // 40 bytes follow the 10 waiting: not short of 30, so spare_mut keeps
    // them where they are, and a read of 45 would not fit there.
    assert_eq!(inbox.spare_mut().len(), 40);
    let room = inbox.spare_for(45).expect("90 bytes are free");
    room.copy_from_slice(&[7; 45]);
    inbox.commit(45);
    let mut want = bytes[50..].to_vec();
    want.extend_from_slice(&[7; 45]);
    assert_eq!(inbox.unconsumed(), &want[..]);
    // More than the free space: no room.
    assert!(inbox.spare_for(46).is_none());
}

#[test]
fn a_full_inbox_has_no_room_until_bytes_are_consumed() {
    let mut inbox = Inbox::new(vec![0u8; 16]);
    put(&mut inbox, &[9; 16]);
    assert!(inbox.is_full());
    assert!(inbox.spare_mut().is_empty());
    inbox.consume(1);
    assert!(!inbox.is_full());
    // The whole capacity minus what waits, after the move.
    assert_eq!(inbox.spare_mut().len(), 1);
    assert_eq!(inbox.unconsumed(), &[9; 15]);
    inbox.clear();
    assert_eq!(inbox.spare_mut().len(), 16);
    assert_eq!(inbox.into_inner().len(), 16);
}

#[test]
#[should_panic(expected = "commit past the spare room")]
fn committing_more_than_the_room_panics() {
    let mut inbox = Inbox::new(vec![0u8; 8]);
    inbox.commit(9);
}

/// Bytes sent and not yet received, per direction, and the receivers' inboxes.
struct Wires {
    to_a: Vec<u8>,
    to_b: Vec<u8>,
    a: Inbox<Vec<u8>>,
    b: Inbox<Vec<u8>>,
    /// Most bytes one read moves from a wire into an inbox.
    piece: usize,
    out: Vec<u8>,
}

impl Wires {
    fn new(a_capacity: usize, piece: usize) -> Self {
        Wires {
            to_a: Vec::new(),
            to_b: Vec::new(),
            a: Inbox::new(vec![0; a_capacity]),
            b: Inbox::new(vec![0; 4 * RECORD]),
            piece,
            out: vec![0; 20_000],
        }
    }

    /// One round, as a driver does it: transmit, one read per direction
    /// into the spare room, feed while the session moves, timers. True if
    /// anything moved.
    fn step<A: Endpoint, B: Endpoint>(&mut self, pair: &mut Pair<A, B>) -> bool {
        let now = pair.now;
        let mut progress = false;
        for (ep, wire) in [
            (&mut pair.a as &mut dyn Transmit, &mut self.to_b),
            (&mut pair.b as &mut dyn Transmit, &mut self.to_a),
        ] {
            loop {
                let n = ep.send(now, &mut self.out);
                if n == 0 {
                    break;
                }
                wire.extend_from_slice(&self.out[..n]);
                progress = true;
            }
        }
        progress |= receive(&mut self.to_a, &mut self.a, self.piece);
        progress |= receive(&mut self.to_b, &mut self.b, self.piece);
        progress |= feed(&mut pair.a, now, &mut self.a);
        progress |= feed(&mut pair.b, now, &mut self.b);
        for ep in [&mut pair.a as &mut dyn Transmit, &mut pair.b] {
            if ep.due().is_some_and(|t| t <= now) {
                ep.tick(now);
                progress = true;
            }
        }
        progress
    }

    /// Steps until nothing moves, the clock standing still.
    fn settle<A: Endpoint, B: Endpoint>(&mut self, pair: &mut Pair<A, B>) {
        for _ in 0..100_000 {
            if !self.step(pair) {
                return;
            }
        }
        panic!("the pair did not settle");
    }

    /// Steps (jumping the clock when idle) until `until` holds.
    fn run<A: Endpoint, B: Endpoint>(
        &mut self,
        pair: &mut Pair<A, B>,
        until: impl Fn(&mut Pair<A, B>) -> bool,
    ) -> bool {
        for _ in 0..200_000 {
            if until(pair) {
                return true;
            }
            if !self.step(pair) {
                match [pair.a.timeout(), pair.b.timeout()]
                    .into_iter()
                    .flatten()
                    .min()
                {
                    Some(t) => pair.now = pair.now.max(t),
                    None => return until(pair),
                }
            }
        }
        until(pair)
    }
}

/// The endpoint calls [`Wires::step`] makes besides feeding.
trait Transmit {
    fn send(&mut self, now: Instant, out: &mut [u8]) -> usize;
    fn due(&self) -> Option<Instant>;
    fn tick(&mut self, now: Instant);
}

impl<E: Endpoint> Transmit for E {
    fn send(&mut self, now: Instant, out: &mut [u8]) -> usize {
        self.transmit(now, out)
    }
    fn due(&self) -> Option<Instant> {
        self.timeout()
    }
    fn tick(&mut self, now: Instant) {
        self.on_timeout(now);
    }
}

/// One read: at most `piece` bytes of `wire` into the spare room of `inbox`.
fn receive(wire: &mut Vec<u8>, inbox: &mut Inbox<Vec<u8>>, piece: usize) -> bool {
    let room = inbox.spare_mut();
    let n = room.len().min(wire.len()).min(piece);
    room[..n].copy_from_slice(&wire[..n]);
    inbox.commit(n);
    wire.drain(..n);
    n > 0
}

/// Feeds `inbox` to `ep` while it moves.
fn feed(ep: &mut impl Endpoint, now: Instant, inbox: &mut Inbox<Vec<u8>>) -> bool {
    let mut progress = false;
    while let Some(fed) = ep.feed(now, inbox) {
        if !fed.progress() {
            break;
        }
        progress = true;
    }
    progress
}

/// Whether group 0 of `track` holds all its frames and its end.
fn complete(track: track::Ref<'_, '_>) -> bool {
    let Some(mut c) = track.group(0) else {
        return false;
    };
    loop {
        match c.read_frame_header() {
            Ok(Next::Ready(h)) => {
                let mut buf = vec![0u8; h.len];
                let mut got = 0;
                while got < h.len {
                    match c.read_payload(&mut buf[got..]) {
                        Ok(Next::Ready(n)) => got += n,
                        _ => return false,
                    }
                }
            }
            Ok(Next::Finished) => return true,
            _ => return false,
        }
    }
}

/// A session pair over [`Wires`]: the client subscribes to a 40 KB group
/// (three records and more) whose bytes reach it `piece` bytes at a time,
/// through an inbox of `capacity` bytes.
fn group_through_inbox(capacity: usize, piece: usize) {
    let mut ps = PoolStorage::<512, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<512, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "cam", "video", video, tp);
    let big: Vec<u8> = (0..40_000).map(|i| (i % 251) as u8).collect();
    write_group(
        &tp,
        0,
        &[(0, &big[..25_000]), (1, b"tick"), (2, &big[25_000..])],
    );
    let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    let mut cst = St::new();
    let mut sst = St::new();
    // Credit for the whole group: the reader looks only at the end.
    let ccfg = Config {
        conn: conn::Config {
            max_stream_data_uni: 256 * 1024,
            ..conn::Config::new()
        },
        ..Config::new()
    };
    let client = Session::new(Side::Client, ccfg, Instant::ZERO, &mut cst, None).unwrap();
    let server = Session::new(
        Side::Server,
        Config::new(),
        Instant::ZERO,
        &mut sst,
        Some(o.handle()),
    )
    .unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    let mut wires = Wires::new(capacity, piece);
    assert!(wires.run(&mut pair, |p| p.a.session.is_setup()
        && p.b.session.is_setup()));
    pair.a
        .session
        .subscribe("cam", local.handle(), Request::LIVE)
        .unwrap();
    let done = |_: &mut Pair<Node<'_, '_, '_>, Node<'_, '_, '_>>| complete(local.handle());
    assert!(
        wires.run(&mut pair, done),
        "piece {piece}, capacity {capacity}"
    );
    assert_eq!(
        read_group(local.handle(), 0),
        vec![
            (0, big[..25_000].to_vec()),
            (1, b"tick".to_vec()),
            (2, big[25_000..].to_vec())
        ]
    );
    assert!(wires.a.is_empty());
    assert!(pair.a.closed().is_none() && pair.b.closed().is_none());
}

#[test]
fn partial_records_wait_in_the_inbox_for_their_rest() {
    for piece in [1, 7, 1000, RECORD - 1, usize::MAX] {
        group_through_inbox(4 * RECORD, piece);
    }
}

#[test]
fn an_inbox_of_one_record_moves_its_tail_and_carries_every_byte() {
    // Room for one record only: every record after the first begins behind
    // consumed bytes, and the inbox fills up before its last byte arrives.
    for piece in [3, 5000, usize::MAX] {
        group_through_inbox(RECORD, piece);
    }
}

#[test]
fn a_stalled_session_takes_its_bytes_from_the_inbox_once_events_are_polled() {
    // 40 broadcasts announced, the client's events not polled: the session
    // stops on its event queue and keeps the rest waiting in the inbox.
    let names: Vec<std::string::String> = (0..40).map(|i| std::format!("b/{i:02}")).collect();
    let bs: Vec<_> = names
        .iter()
        .map(|n| broadcast::State::<1>::new(Path::new(n).unwrap()).unwrap())
        .collect();
    let o = origin::State::<64, 64>::new();
    for b in &bs {
        o.handle().announce(b.handle()).unwrap();
    }
    let mut cst = St::new();
    let mut sst = St::new();
    let client = Session::new(Side::Client, Config::new(), Instant::ZERO, &mut cst, None).unwrap();
    let server = Session::new(
        Side::Server,
        Config::new(),
        Instant::ZERO,
        &mut sst,
        Some(o.handle()),
    )
    .unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    let mut wires = Wires::new(4 * RECORD, usize::MAX);
    assert!(wires.run(&mut pair, |p| p.a.session.is_setup()
        && p.b.session.is_setup()));
    pair.a.auto_drain = false;
    pair.a.session.announce_request("").unwrap();
    let stalled = |p: &mut Pair<Node<'_, '_, '_>, Node<'_, '_, '_>>| p.a.session.is_stalled();
    assert!(wires.run(&mut pair, stalled));
    wires.settle(&mut pair);
    assert!(pair.a.session.is_stalled());
    assert!(!wires.a.is_empty(), "the stalled bytes wait in the inbox");
    let waiting = wires.a.len();
    // Feeding again without polling changes nothing.
    let fed = wires.a.feed(&mut pair.a.session, pair.now).unwrap();
    assert_eq!(fed, Fed::default());
    assert_eq!(wires.a.len(), waiting);
    // Polled events make room: the next feed, with no new byte, goes on.
    let mut seen = Vec::new();
    let drain = |s: &mut Session<'_, '_, '_, 32>, seen: &mut Vec<std::string::String>| {
        while let Some(e) = s.poll_event() {
            if let Event::Announced { path, .. } = e {
                seen.push(path.to_string());
            }
        }
    };
    drain(&mut pair.a.session, &mut seen);
    let fed = wires.a.feed(&mut pair.a.session, pair.now).unwrap();
    assert!(fed.progress() && fed.consumed > 0, "{fed:?}");
    assert!(wires.a.len() < waiting);
    for _ in 0..100 {
        drain(&mut pair.a.session, &mut seen);
        wires.settle(&mut pair);
        if seen.len() == names.len() {
            break;
        }
    }
    assert_eq!(seen, names);
    assert!(!pair.a.session.is_stalled());
    assert!(wires.a.is_empty());
}

#[test]
fn a_closed_session_drops_what_waits() {
    let o = origin::State::<4, 8>::new();
    session_pair!(o.handle(), pair);
    pair.a.session.close(SessionCode::NoError, "");
    let mut inbox = Inbox::new(vec![0u8; 64]);
    put(&mut inbox, &[0; 10]);
    assert_eq!(
        inbox.feed(&mut pair.a.session, pair.now),
        Err(Error::Closed)
    );
    assert!(inbox.is_empty());
    // Nothing waiting and no stall: the session is not called.
    assert_eq!(
        inbox.feed(&mut pair.a.session, pair.now),
        Ok(Fed::default())
    );
}
