//! A simulated pair of endpoints wired in memory (tests only: every test that
//! depends on timing runs in this simulated time, never on the wall clock).
//!
//! Two [`Endpoint`]s (a [`Node`] wraps a [`Session`], a [`Raw`] is a bare QMux
//! connection a test scripts byte by byte) exchange records over two
//! [`Link`]s with a latency. Time is simulated: when nothing moves, the clock
//! jumps to the next delivery or the next `poll_timeout`. Each link can hand
//! its bytes to the receiver whole, in random pieces (seeded [`Rng`]), or
//! split once at a given offset of the byte stream, so a test can try every
//! split point of a short session. Every byte sent is logged per direction,
//! and [`Tap`] turns a log back into per-stream byte strings for checks
//! against docs/protocol.md §6.
//!
//! A session runs over QMux or over [`memory::Mem`], an in-memory stream
//! transport shaped like a QUIC library ([`Wire`] builds either); over `Mem`
//! the links carry that transport's frames instead of QMux records.

extern crate std;

use std::collections::{BTreeMap, VecDeque};
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use core::cell::{Cell, RefCell};
use core::ptr::NonNull;

pub mod memory;

use super::{
    Config, ConfigError, Fed, Foreign, ForeignError, Gather, Handler, Inbox, Once, Out, Session,
    Storage,
};
use crate::conn::{self, Connection};
use crate::model::origin;
use crate::pool::{Block, Pool, Slice};
use crate::time::{Duration, Instant};
use crate::transport::Transport;
use crate::wire::Reader;
use crate::wire::qmux::Side;
use crate::wire::qmux::{Dir, Frame, Record, StreamId};
use memory::Mem;

/// A tiny seeded xorshift64 generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// An event with its text copied out, for assertions.
pub use super::OwnedEvent as Ev;

/// One end of the simulated wire.
pub trait Endpoint {
    /// Writes records to send; 0 when there is nothing.
    fn transmit(&mut self, now: Instant, out: &mut [u8]) -> usize;
    /// Takes received bytes; `None` once the endpoint is closed.
    fn input(&mut self, now: Instant, data: &[u8]) -> Option<usize>;
    /// When `on_timeout` is due.
    fn timeout(&self) -> Option<Instant>;
    /// Runs due timers.
    fn on_timeout(&mut self, now: Instant);
    /// Holds input it took but could not use yet (call `input` again, even
    /// with no new bytes).
    fn stalled(&self) -> bool {
        false
    }
    /// Takes what waits in `inbox`, all of it presented at once; `None` once
    /// the endpoint is closed. The default presents it to
    /// [`input`](Self::input).
    fn feed(&mut self, now: Instant, inbox: &mut Inbox<Vec<u8>>) -> Option<Fed> {
        let n = self.input(now, inbox.unconsumed())?;
        inbox.consume(n);
        Some(Fed {
            consumed: n,
            resumed: false,
        })
    }
}

/// A transport the session's suite runs over, and how a test builds a
/// session on it.
pub trait Wire: Transport + Sized {
    /// Bytes of a stream the transport itself may hold beyond the window
    /// the session's configuration names (its own receive window; 0 for QMux,
    /// which keeps nothing).
    const BUFFERED: u64;

    /// Received bytes the transport holds for the session and did not hand
    /// over yet (0 for QMux, whose input waits in the caller's buffer).
    fn held(session: &Session<'_, '_, '_, 32, Self>) -> usize;

    /// The per-stream bytes of a link's log.
    fn tap(log: &[u8]) -> Tap;

    /// A session on a new transport of this kind (see [`Session::new`]).
    #[allow(clippy::type_complexity)]
    fn session<
        's,
        'a,
        'p,
        const CONTROL: usize,
        const BUF: usize,
        const SERVE: usize,
        const SUBS: usize,
        const OUT: usize,
        const IN: usize,
        const CHUNKS: usize,
    >(
        side: Side,
        config: Config<'s>,
        now: Instant,
        storage: &'s mut Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>,
        origin: Option<origin::Ref<'a, 'p>>,
    ) -> Result<Session<'s, 'a, 'p, 32, Self>, ConfigError>;
}

impl Wire for Connection<32> {
    const BUFFERED: u64 = 0;

    fn held(_session: &Session<'_, '_, '_, 32, Self>) -> usize {
        0
    }

    fn tap(log: &[u8]) -> Tap {
        Tap::new(log)
    }

    fn session<
        's,
        'a,
        'p,
        const CONTROL: usize,
        const BUF: usize,
        const SERVE: usize,
        const SUBS: usize,
        const OUT: usize,
        const IN: usize,
        const CHUNKS: usize,
    >(
        side: Side,
        config: Config<'s>,
        now: Instant,
        storage: &'s mut Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>,
        origin: Option<origin::Ref<'a, 'p>>,
    ) -> Result<Session<'s, 'a, 'p, 32, Self>, ConfigError> {
        Session::new(side, config, now, storage, origin)
    }
}

impl<const ORDERED: bool> Wire for Mem<ORDERED> {
    const BUFFERED: u64 = memory::LIB_WINDOW;

    fn held(session: &Session<'_, '_, '_, 32, Self>) -> usize {
        session.transport().held()
    }

    fn tap(log: &[u8]) -> Tap {
        memory::tap(log)
    }

    fn session<
        's,
        'a,
        'p,
        const CONTROL: usize,
        const BUF: usize,
        const SERVE: usize,
        const SUBS: usize,
        const OUT: usize,
        const IN: usize,
        const CHUNKS: usize,
    >(
        side: Side,
        config: Config<'s>,
        now: Instant,
        storage: &'s mut Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>,
        origin: Option<origin::Ref<'a, 'p>>,
    ) -> Result<Session<'s, 'a, 'p, 32, Self>, ConfigError> {
        let transport = Mem::<ORDERED>::new(side, &config.conn);
        Session::with_transport(side, config, transport, now, storage, origin)
    }
}

/// A node's event log as the handler of its session's events.
struct Log<'l>(&'l mut Vec<Ev>);

impl<'s, 'a, 'p, const N: usize, T: Transport> Handler<'s, 'a, 'p, N, T> for Log<'_> {
    fn on_event(&mut self, _now: Instant, event: &super::Event<'_>) {
        self.0.push((*event).into());
    }
}

/// One gathered transmit call into a node's head buffer.
struct OnceGather<'o, 'g, 'p> {
    head: &'o mut [u8],
    gather: &'o mut VecGather<'g, 'p>,
    written: usize,
}

impl<'p> Out<'p> for OnceGather<'_, '_, 'p> {
    fn must_flush(&self) -> bool {
        false
    }

    fn write<F>(&mut self, write: F) -> (usize, usize)
    where
        F: FnOnce(&mut [u8], Option<&mut dyn Gather<'p>>) -> usize,
    {
        (
            self.head.len(),
            write(&mut *self.head, Some(&mut *self.gather)),
        )
    }

    fn commit(&mut self, _room: usize, n: usize) -> bool {
        self.written = n;
        false
    }
}

/// A session and the events it reported so far.
pub struct Node<'s, 'a, 'p, const N: usize = 32, T: Transport = Connection<N>> {
    pub session: Session<'s, 'a, 'p, N, T>,
    pub events: Vec<Ev>,
    /// Poll events after every call (a test may turn it off to let them pile up).
    pub auto_drain: bool,
    /// `Some`: transmit with [`Session::poll_transmit_gather`] (three payload
    /// ranges per call) and reassemble the wire bytes here; what did not fit
    /// the caller's buffer waits for the next call.
    pub gather: Option<Vec<u8>>,
    /// Payload ranges gathered so far (gather mode).
    pub gathered: usize,
    /// Gather mode: lend payload to the peer through this table (STREAM_REF).
    pub lender: Option<&'s Lender<'p>>,
}

/// Slices a publisher lent, by token, and the subscriber's pool that adopts
/// them: both ends of a link inside one process, as a relay's workers are.
pub struct Lender<'p> {
    lent: RefCell<Vec<Option<Slice<'p>>>>,
    pool: &'p Pool<'p>,
    /// Slices lent so far.
    pub count: Cell<usize>,
}

impl<'p> Lender<'p> {
    /// A table whose tokens the subscriber adopts into `pool`.
    pub fn new(pool: &'p Pool<'p>) -> Self {
        Lender {
            lent: RefCell::new(Vec::new()),
            pool,
            count: Cell::new(0),
        }
    }

    fn lend(&self, slice: Slice<'p>) -> u64 {
        let mut lent = self.lent.borrow_mut();
        self.count.set(self.count.get() + 1);
        match lent.iter().position(Option::is_none) {
            Some(i) => {
                lent[i] = Some(slice);
                i as u64
            }
            None => {
                lent.push(Some(slice));
                (lent.len() - 1) as u64
            }
        }
    }

    /// Gives back the slices the subscriber's pool released.
    pub fn reclaim(&self) {
        while let Some(token) = self.pool.take_released() {
            self.lent.borrow_mut()[token as usize] = None;
        }
    }

    /// Slices lent and not given back.
    pub fn outstanding(&self) -> usize {
        self.lent.borrow().iter().flatten().count()
    }
}

impl<'p> Foreign<'p> for Lender<'p> {
    #[allow(unsafe_code)]
    fn resolve(&self, token: u64, len: u64) -> Result<Block<'p>, ForeignError> {
        let lent = self.lent.borrow();
        let slice = usize::try_from(token)
            .ok()
            .and_then(|t| lent.get(t)?.as_ref())
            .filter(|s| s.len() as u64 == len)
            .ok_or(ForeignError::Unknown)?;
        let bytes = slice.as_bytes();
        // SAFETY: the table holds the slice (its committed bytes never change)
        // until `reclaim` sees the token come back from `take_released`.
        unsafe {
            self.pool
                .adopt(NonNull::from(bytes).cast(), bytes.len(), token)
        }
        .map_err(|_| ForeignError::Exhausted)
    }
}

/// A [`Foreign`] resolver whose pool is short of metadata every other
/// time it is asked: the session must wait and ask again.
pub struct Scarce<'l, 'p> {
    /// The resolver that succeeds.
    pub inner: &'l Lender<'p>,
    /// Calls so far.
    pub calls: Cell<usize>,
}

impl<'p> Foreign<'p> for Scarce<'_, 'p> {
    fn resolve(&self, token: u64, len: u64) -> Result<Block<'p>, ForeignError> {
        let n = self.calls.get();
        self.calls.set(n + 1);
        if n.is_multiple_of(2) {
            return Err(ForeignError::Exhausted);
        }
        self.inner.resolve(token, len)
    }
}

/// A [`Gather`] that keeps up to `limit` ranges.
struct VecGather<'l, 'p> {
    ranges: Vec<(usize, Slice<'p>)>,
    limit: usize,
    lender: Option<&'l Lender<'p>>,
}

impl<'p> Gather<'p> for VecGather<'_, 'p> {
    fn room(&self) -> usize {
        self.limit.saturating_sub(self.ranges.len())
    }

    fn lend(&mut self, slice: Slice<'p>) -> Option<u64> {
        self.lender.map(|l| l.lend(slice))
    }

    fn push(&mut self, at: usize, slice: Slice<'p>) {
        assert!(self.room() > 0, "pushed past the room");
        assert!(
            self.ranges.last().is_none_or(|(last, _)| *last <= at),
            "ranges out of order"
        );
        self.ranges.push((at, slice));
    }
}

impl<'s, 'a, 'p, T: Transport> Node<'s, 'a, 'p, 32, T> {
    /// A node on a session with the usual 32-slot stream table.
    pub fn new(session: Session<'s, 'a, 'p, 32, T>) -> Self {
        Node::with_streams(session)
    }
}

impl<'s, 'a, 'p, const N: usize, T: Transport> Node<'s, 'a, 'p, N, T> {
    /// A node on a session with an `N`-slot stream table.
    pub fn with_streams(session: Session<'s, 'a, 'p, N, T>) -> Self {
        Node {
            session,
            events: Vec::new(),
            auto_drain: true,
            gather: None,
            gathered: 0,
            lender: None,
        }
    }

    /// Moves every pending event into `events`.
    pub fn drain(&mut self) {
        // The log does not read the instant.
        self.session
            .deliver(Instant::ZERO, &mut Log(&mut self.events));
    }

    /// Whether an event matching `f` was reported.
    pub fn saw(&self, f: impl Fn(&Ev) -> bool) -> bool {
        self.events.iter().any(f)
    }

    /// The close event, if any.
    pub fn closed(&self) -> Option<&Ev> {
        self.events.iter().find(|e| matches!(e, Ev::Closed { .. }))
    }
}

impl<const N: usize> Endpoint for Node<'_, '_, '_, N> {
    fn transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        let n = match self.gather.as_mut() {
            None => {
                let mut once = Once::new(out);
                self.session.transmit_to(now, &mut once);
                once.written
            }
            Some(spill) => {
                if spill.is_empty() {
                    if let Some(l) = self.lender {
                        l.reclaim();
                    }
                    let mut head = vec![0u8; out.len()];
                    let mut g = VecGather {
                        ranges: Vec::new(),
                        limit: 3,
                        lender: self.lender,
                    };
                    let mut once = OnceGather {
                        head: &mut head,
                        gather: &mut g,
                        written: 0,
                    };
                    self.session.transmit_to(now, &mut once);
                    let n = once.written;
                    let mut at = 0;
                    self.gathered += g.ranges.len();
                    for (pos, slice) in g.ranges {
                        spill.extend_from_slice(&head[at..pos]);
                        spill.extend_from_slice(&slice);
                        at = pos;
                    }
                    spill.extend_from_slice(&head[at..n]);
                }
                let k = spill.len().min(out.len());
                out[..k].copy_from_slice(&spill[..k]);
                spill.drain(..k);
                k
            }
        };
        if self.auto_drain {
            self.drain();
        }
        n
    }

    fn input(&mut self, now: Instant, data: &[u8]) -> Option<usize> {
        let r = self.session.handle_input(now, data).ok();
        if self.auto_drain {
            self.drain();
        }
        r
    }

    fn timeout(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    fn on_timeout(&mut self, now: Instant) {
        self.session.handle_timeout(now);
        if self.auto_drain {
            self.drain();
        }
    }

    fn stalled(&self) -> bool {
        self.session.is_stalled()
    }

    fn feed(&mut self, now: Instant, inbox: &mut Inbox<Vec<u8>>) -> Option<Fed> {
        let r = inbox.feed(&mut self.session, now).ok();
        if self.auto_drain {
            self.drain();
        }
        r
    }
}

/// A session over the in-memory transport: the link carries the transport's
/// frames ([`memory::encode`]), and received frames reach the session
/// through [`memory::pump`].
impl<const N: usize, const ORDERED: bool> Endpoint for Node<'_, '_, '_, N, Mem<ORDERED>> {
    fn transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        memory::pump(&mut self.session, now);
        let mut once = Once::new(out);
        self.session.transmit_to(now, &mut once);
        assert_eq!(
            once.written, 0,
            "the memory transport writes nothing into out"
        );
        if self.auto_drain {
            self.drain();
        }
        let mut bytes = Vec::new();
        let t = self.session.transport_mut();
        while let Some(frame) = t.pop_frame() {
            if memory::encode(&frame, &mut bytes, out.len()) {
                continue;
            }
            // Too long for what is left: send a prefix of its data, or wait.
            let room = (out.len() - bytes.len()).saturating_sub(memory::DATA_OVERHEAD);
            match frame {
                memory::Frame::Data {
                    id,
                    offset,
                    bytes: data,
                    fin,
                } if room > 0 => {
                    let head = memory::Frame::Data {
                        id,
                        offset,
                        bytes: data[..room].to_vec(),
                        fin: false,
                    };
                    assert!(memory::encode(&head, &mut bytes, out.len()));
                    t.unpop_frame(memory::Frame::Data {
                        id,
                        offset: offset + room as u64,
                        bytes: data[room..].to_vec(),
                        fin,
                    });
                }
                other => t.unpop_frame(other),
            }
            break;
        }
        out[..bytes.len()].copy_from_slice(&bytes);
        bytes.len()
    }

    fn input(&mut self, now: Instant, data: &[u8]) -> Option<usize> {
        self.feed_frames(now, data).map(|fed| fed.consumed)
    }

    fn feed(&mut self, now: Instant, inbox: &mut Inbox<Vec<u8>>) -> Option<Fed> {
        let fed = self.feed_frames(now, inbox.unconsumed())?;
        inbox.consume(fed.consumed);
        Some(fed)
    }

    fn timeout(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    fn on_timeout(&mut self, now: Instant) {
        self.session.handle_timeout(now);
        if self.auto_drain {
            self.drain();
        }
    }

    fn stalled(&self) -> bool {
        self.session.is_stalled() || self.session.transport().has_room()
    }
}

impl<const N: usize, const ORDERED: bool> Node<'_, '_, '_, N, Mem<ORDERED>> {
    /// Applies the whole frames at the front of `data` to the transport and
    /// hands the session what it has room for; `resumed`: the session took
    /// bytes the transport held.
    fn feed_frames(&mut self, now: Instant, data: &[u8]) -> Option<Fed> {
        if self.session.is_closed() {
            return None;
        }
        let mut pos = 0;
        while let Some((frame, n)) = memory::decode(&data[pos..]) {
            self.session.transport_mut().receive(frame);
            pos += n;
        }
        let resumed = memory::pump(&mut self.session, now);
        if self.auto_drain {
            self.drain();
        }
        Some(Fed {
            consumed: pos,
            resumed,
        })
    }
}

/// A bare QMux connection whose moq-lite bytes a test writes by hand.
pub struct Raw {
    pub conn: Connection<32>,
    /// Bytes received per stream, and whether FIN arrived.
    pub streams: BTreeMap<u64, (Vec<u8>, bool)>,
    pub resets: Vec<(u64, u64)>,
    pub stops: Vec<(u64, u64)>,
    pub closed: Option<(u64, String)>,
    pub established: bool,
    /// Stream writes waiting for `transmit`: (stream, bytes, fin).
    pending: VecDeque<(StreamId, Vec<u8>, bool)>,
}

impl Raw {
    pub fn new(side: crate::wire::qmux::Side, config: conn::Config) -> Self {
        Raw {
            conn: Connection::new(side, config, Instant::ZERO).expect("raw config"),
            streams: BTreeMap::new(),
            resets: Vec::new(),
            stops: Vec::new(),
            closed: None,
            established: false,
            pending: VecDeque::new(),
        }
    }

    /// Opens a stream and queues `bytes` on it.
    pub fn open(&mut self, dir: Dir, bytes: &[u8], fin: bool) -> StreamId {
        let id = self.conn.open_stream(dir).expect("raw open");
        self.pending.push_back((id, bytes.to_vec(), fin));
        id
    }

    /// Queues more bytes on an open stream.
    pub fn write(&mut self, id: StreamId, bytes: &[u8], fin: bool) {
        self.pending.push_back((id, bytes.to_vec(), fin));
    }

    /// What arrived on stream `id`.
    pub fn received(&self, id: u64) -> &[u8] {
        self.streams.get(&id).map_or(&[], |(d, _)| d.as_slice())
    }
}

impl Endpoint for Raw {
    fn transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        let mut pos = self.conn.poll_transmit(now, out);
        if !self.conn.is_established() {
            return pos;
        }
        while let Some((id, data, fin)) = self.pending.pop_front() {
            match self.conn.write_stream(now, id, &data, fin, &mut out[pos..]) {
                Ok(w) => {
                    pos += w.out;
                    if w.data < data.len() {
                        self.pending.push_front((id, data[w.data..].to_vec(), fin));
                        break;
                    }
                }
                Err(_) => {
                    self.pending.push_front((id, data, fin));
                    break;
                }
            }
        }
        pos + self.conn.poll_transmit(now, &mut out[pos..])
    }

    fn input(&mut self, now: Instant, data: &[u8]) -> Option<usize> {
        if self.conn.is_closed() {
            return None;
        }
        let mut pos = 0;
        loop {
            let step = self.conn.handle_input(now, &data[pos..]);
            pos += step.consumed;
            match step.event {
                None => break,
                Some(conn::Event::Established { .. }) => self.established = true,
                Some(conn::Event::StreamData { id, data, fin, .. }) => {
                    let e = self.streams.entry(id.value()).or_default();
                    e.0.extend_from_slice(data);
                    e.1 |= fin;
                    self.conn.release(id, data.len() as u64);
                }
                Some(conn::Event::StreamReset { id, code, .. }) => {
                    self.resets.push((id.value(), code))
                }
                Some(conn::Event::StopSending { id, code }) => self.stops.push((id.value(), code)),
                Some(conn::Event::Closed(c)) => {
                    self.closed = Some((c.code, c.reason.to_string()));
                    return Some(data.len());
                }
                Some(_) => {}
            }
        }
        Some(pos)
    }

    fn timeout(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    fn on_timeout(&mut self, now: Instant) {
        let _ = self.conn.handle_timeout(now);
    }
}

/// How a link hands its bytes to the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    /// Everything that arrived, in one call.
    Whole,
    /// Random prefixes of what arrived.
    Random,
    /// The first call that reaches it sees the stream cut at this offset; then whole.
    SplitAt(usize),
}

/// Bytes a link's receiver can hold unconsumed; what does not fit waits
/// on the wire.
pub const LINK_INBOX: usize = 1 << 20;

/// One direction of the wire.
pub struct Link {
    pub latency: Duration,
    pub chunking: Chunking,
    /// While set, nothing is delivered: bytes sent wait on the wire (a link
    /// gone silent without either end closing).
    pub held: bool,
    /// Every byte sent, in order.
    pub log: Vec<u8>,
    queue: VecDeque<(Instant, Vec<u8>)>,
    inbox: Inbox<Vec<u8>>,
    consumed: usize,
}

impl Link {
    pub fn new() -> Self {
        Link {
            latency: Duration::ZERO,
            chunking: Chunking::Whole,
            held: false,
            log: Vec::new(),
            queue: VecDeque::new(),
            inbox: Inbox::new(vec![0; LINK_INBOX]),
            consumed: 0,
        }
    }

    fn send(&mut self, now: Instant, bytes: &[u8]) {
        self.log.extend_from_slice(bytes);
        self.queue
            .push_back((now.saturating_add(self.latency), bytes.to_vec()));
    }

    fn deliver(&mut self, now: Instant) {
        if self.held {
            return;
        }
        while let Some((at, bytes)) = self.queue.front_mut() {
            if *at > now {
                break;
            }
            let room = self.inbox.spare_mut();
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            self.inbox.commit(n);
            if n < bytes.len() {
                // The receiver's inbox is full: the rest stays on the wire.
                bytes.drain(..n);
                break;
            }
            self.queue.pop_front();
        }
    }

    fn next_delivery(&self) -> Option<Instant> {
        if self.held {
            return None;
        }
        self.queue.front().map(|(at, _)| *at)
    }

    /// Bytes received but not consumed by the endpoint.
    pub fn unconsumed(&self) -> usize {
        self.inbox.len()
    }

    fn feed(&mut self, ep: &mut impl Endpoint, now: Instant, rng: &mut Rng) -> bool {
        let mut progress = false;
        let mut full = false;
        while !self.inbox.is_empty() || ep.stalled() {
            let len = self.inbox.len();
            let take = match self.chunking {
                _ if len == 0 => 0,
                _ if full => len,
                Chunking::Whole => len,
                Chunking::Random => 1 + rng.below(len),
                Chunking::SplitAt(k) => {
                    if self.consumed + len >= k {
                        // The split point has arrived: cut there once, then go whole.
                        self.chunking = Chunking::Whole;
                        (k - self.consumed.min(k)).max(1).min(len)
                    } else {
                        len
                    }
                }
            };
            let fed = if take == len {
                ep.feed(now, &mut self.inbox)
            } else {
                ep.input(now, &self.inbox.unconsumed()[..take]).map(|n| {
                    self.inbox.consume(n);
                    Fed {
                        consumed: n,
                        resumed: false,
                    }
                })
            };
            let Some(fed) = fed else {
                self.inbox.clear();
                return true;
            };
            self.consumed += fed.consumed;
            if fed.consumed > 0 {
                progress = true;
                full = false;
            } else if fed.resumed {
                progress = true;
            } else if take == len || full {
                break;
            } else {
                full = true;
            }
        }
        progress
    }
}

/// Something stepped in simulated time (a [`Pair`], a relay mesh).
pub trait Stepped {
    /// One round; true if anything moved.
    fn step(&mut self) -> bool;
    /// When something is next due.
    fn next_time(&self) -> Option<Instant>;
    /// The clock.
    fn clock(&mut self) -> &mut Instant;
}

/// Steps `s` (jumping its clock to the next due time when nothing moves)
/// until `until` holds; false if it did not within `max` steps or everything
/// went quiet for good.
pub fn run_until<S: Stepped>(s: &mut S, max: usize, mut until: impl FnMut(&mut S) -> bool) -> bool {
    for _ in 0..max {
        if until(s) {
            return true;
        }
        if !s.step() {
            match s.next_time() {
                Some(t) => {
                    let now = s.clock();
                    *now = (*now).max(t);
                }
                None => return until(s),
            }
        }
    }
    until(s)
}

impl<A: Endpoint, B: Endpoint> Stepped for Pair<A, B> {
    fn step(&mut self) -> bool {
        Pair::step(self)
    }
    fn next_time(&self) -> Option<Instant> {
        Pair::next_time(self)
    }
    fn clock(&mut self) -> &mut Instant {
        &mut self.now
    }
}

/// Two endpoints, `a` (normally the client) and `b`, and the links between them.
pub struct Pair<A: Endpoint, B: Endpoint> {
    pub now: Instant,
    pub a: A,
    pub b: B,
    /// `a` → `b`.
    pub ab: Link,
    /// `b` → `a`.
    pub ba: Link,
    pub rng: Rng,
    buf: Vec<u8>,
}

impl<A: Endpoint, B: Endpoint> Pair<A, B> {
    pub fn new(a: A, b: B) -> Self {
        Pair {
            now: Instant::ZERO,
            a,
            b,
            ab: Link::new(),
            ba: Link::new(),
            rng: Rng::new(1),
            buf: vec![0u8; 20_000],
        }
    }

    /// One round: transmit, deliver, feed, timers. True if anything moved.
    pub fn step(&mut self) -> bool {
        let now = self.now;
        let mut progress = false;
        loop {
            let n = self.a.transmit(now, &mut self.buf);
            if n == 0 {
                break;
            }
            self.ab.send(now, &self.buf[..n]);
            progress = true;
        }
        loop {
            let n = self.b.transmit(now, &mut self.buf);
            if n == 0 {
                break;
            }
            self.ba.send(now, &self.buf[..n]);
            progress = true;
        }
        self.ab.deliver(now);
        self.ba.deliver(now);
        progress |= self.ab.feed(&mut self.b, now, &mut self.rng);
        progress |= self.ba.feed(&mut self.a, now, &mut self.rng);
        if self.a.timeout().is_some_and(|t| t <= now) {
            self.a.on_timeout(now);
            progress = true;
        }
        if self.b.timeout().is_some_and(|t| t <= now) {
            self.b.on_timeout(now);
            progress = true;
        }
        progress
    }

    /// When something is next due: a delivery or a timer.
    pub fn next_time(&self) -> Option<Instant> {
        [
            self.ab.next_delivery(),
            self.ba.next_delivery(),
            self.a.timeout(),
            self.b.timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Steps (jumping the clock when idle) until `until` holds; false if it
    /// did not within `max` steps or the pair went quiet for good.
    pub fn run(&mut self, max: usize, until: impl FnMut(&mut Self) -> bool) -> bool {
        run_until(self, max, until)
    }

    /// Steps until nothing moves without advancing the clock past `horizon`.
    pub fn settle(&mut self, horizon: Duration) {
        let end = self.now.saturating_add(horizon);
        for _ in 0..100_000 {
            if self.step() {
                continue;
            }
            match self.next_time() {
                Some(t) if t <= end => self.now = self.now.max(t),
                _ => return,
            }
        }
    }
}

/// The moq-lite byte strings of a logged direction, per stream.
#[derive(Debug, Default)]
pub struct Tap {
    /// Stream data in order of arrival, and whether FIN was seen.
    pub streams: BTreeMap<u64, (Vec<u8>, bool)>,
    /// Streams in the order their first byte was sent.
    pub order: Vec<u64>,
    pub resets: Vec<(u64, u64)>,
    pub stops: Vec<(u64, u64)>,
    pub close: Option<(bool, u64)>,
}

impl Tap {
    /// Decodes a link log into streams.
    pub fn new(log: &[u8]) -> Self {
        let mut tap = Tap::default();
        let mut rest = log;
        while !rest.is_empty() {
            let record = Record::decode(rest, u64::MAX).expect("whole records");
            let mut r = Reader::new(record.body);
            while !r.is_empty() {
                match Frame::decode(&mut r).expect("valid frame") {
                    Frame::Stream(s) => {
                        let e = tap.streams.entry(s.id.value()).or_insert_with(|| {
                            tap.order.push(s.id.value());
                            (Vec::new(), false)
                        });
                        e.0.extend_from_slice(s.data);
                        e.1 |= s.fin;
                    }
                    Frame::ResetStream(x) => tap.resets.push((x.id.value(), x.code)),
                    Frame::StopSending(x) => tap.stops.push((x.id.value(), x.code)),
                    Frame::ApplicationClose(c) => tap.close = Some((true, c.code)),
                    Frame::ConnectionClose(c) => tap.close = Some((false, c.code)),
                    _ => {}
                }
            }
            rest = &rest[record.len..];
        }
        tap
    }

    /// The bytes of stream `id`.
    pub fn stream(&self, id: u64) -> &[u8] {
        self.streams.get(&id).map_or(&[], |(d, _)| d.as_slice())
    }

    /// Whether stream `id` was finished.
    pub fn fin(&self, id: u64) -> bool {
        self.streams.get(&id).is_some_and(|(_, f)| *f)
    }
}

/// Parses "01 0a ff" into bytes.
pub fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("test hex"))
        .collect()
}
