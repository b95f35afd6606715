//! A session that wrote and then found nothing more with room to spare is
//! idle: the driver's next pass takes the fast path. Driven as the relay's
//! driver drives it (a pass per wake-up, another only after one that did
//! something), every request must still be answered, including answers
//! that waited for a control buffer the same pass freed.

use super::*;
use crate::session::{Handler, Out};

/// Room offered to one transmit call: two whole QMux records.
const CHUNK: usize = 2 * 16_390;

/// Control buffers of the serving side: fewer than the burst's answers.
const CHUNKS: usize = 2;

/// A driver's send buffer: payload copied, another call while at least
/// [`CHUNK`] is left.
struct Send {
    buf: Vec<u8>,
    len: usize,
}

impl<'p> Out<'p> for Send {
    fn must_flush(&self) -> bool {
        self.buf.len() - self.len < CHUNK
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'p>>) -> usize,
    {
        let room = &mut self.buf[self.len..];
        (room.len(), write(room, None))
    }

    fn commit(&mut self, room: usize, n: usize) -> bool {
        self.len += n;
        room - n < CHUNK
    }
}

/// Counts the events of a pass.
struct Count;

impl<'s, 'a, 'p> Handler<'s, 'a, 'p, 32, Tr> for Count {
    fn on_event(&mut self, _now: Instant, _event: &Event<'_>) {}
}

/// One relay-driver pass over `s`: the input, the core pass, then
/// everything it has to send, appended to `wire`. Returns the input taken
/// and whether the pass did anything.
fn pass(
    s: &mut Session<'_, '_, '_, 32, Tr>,
    now: Instant,
    input: &[u8],
    wire: &mut Vec<u8>,
) -> (usize, bool) {
    let mut taken = 0;
    if !input.is_empty() || s.is_stalled() {
        taken = s.handle_input(now, input).unwrap();
    }
    let events = s.pass(now, &mut Count).events;
    let mut send = Send {
        buf: vec![0; 4 * CHUNK],
        len: 0,
    };
    let sent = s.transmit_to(now, &mut send);
    wire.extend_from_slice(&send.buf[..send.len]);
    (taken, taken > 0 || events > 0 || sent.wrote || sent.flush)
}

#[test]
fn answers_that_wait_for_a_control_buffer_go_out_without_more_input() {
    let mut ps = PoolStorage::<64, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 64>::new();
    let cpool = Pool::new(&mut pc);
    let names = ["t0", "t1", "t2", "t3", "t4", "t5"];
    live_room!(pool, names => tracks, bcast, o, bp, producers);
    let locals: Vec<_> = names
        .iter()
        .map(|n| track::State::<4>::new(&cpool, track::Info::new(n).unwrap()))
        .collect();

    let mut cst = Storage::<'_, '_, 24, 256, 4, 8, 8, 8, 32>::new();
    let mut sst = Storage::<'_, '_, 24, 256, 8, 1, 8, 1, CHUNKS>::new();
    let now = Instant::ZERO;
    let mut client = Tr::session(Side::Client, Config::new(), now, &mut cst, None).unwrap();
    let mut server =
        Tr::session(Side::Server, Config::new(), now, &mut sst, Some(o.handle())).unwrap();
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; CHUNK];
    let mut subscribed = false;
    for _ in 0..1000 {
        let mut moved = false;
        loop {
            let n = client.poll_transmit(now, &mut buf);
            if n == 0 {
                break;
            }
            to_server.extend_from_slice(&buf[..n]);
            moved = true;
        }
        // A wake-up of the server's driver: passes while they do something.
        loop {
            let (taken, progress) = pass(&mut server, now, &to_server, &mut to_client);
            to_server.drain(..taken);
            if !progress {
                break;
            }
            moved = true;
        }
        if !to_client.is_empty() {
            let n = client.handle_input(now, &to_client).unwrap();
            to_client.drain(..n);
            moved |= n > 0;
        }
        while client.poll_event().is_some() {
            moved = true;
        }
        if client.is_setup() && !subscribed {
            // Six subscriptions at once: their answers need more control
            // buffers than the server has.
            for l in &locals {
                client
                    .subscribe(
                        "room/live",
                        l.handle(),
                        Request::test(1, 1000, Start::Latest, End::Open),
                    )
                    .unwrap();
            }
            subscribed = true;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    assert!(subscribed, "SETUP done");
    assert_eq!(server.served_count(), names.len());
    for l in &locals {
        assert!(l.handle().group(0).is_some(), "{}", l.handle().info().name);
    }
    assert_eq!(server.free_chunks(), CHUNKS);
}
