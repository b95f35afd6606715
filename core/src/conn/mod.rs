//! The sans-IO QMux (qmux-01) connection over a reliable byte stream (docs/protocol.md §1, §2).
//!
//! A [`Connection`] holds protocol state only: parameters, flow-control
//! accounting, the stream table, timers and pending control frames. It never
//! buffers stream payload, in either direction:
//!
//! * **Receiving.** The caller keeps the TCP bytes in its own buffer and calls
//!   [`Connection::handle_input`] with the unconsumed part. Each call returns how
//!   many bytes were used and at most one [`Event`], whose payload (stream data,
//!   datagrams, a peer's close reason) *borrows that buffer*. A record is only
//!   started once it is complete, so a partial record simply stays in the buffer
//!   until more bytes arrive. Data is charged to flow control on arrival, but
//!   credit flows back to the peer only when the application calls
//!   [`Connection::release`] for bytes it has finished with.
//! * **Sending.** The application owns its outgoing bytes and asks
//!   [`Connection::write_stream`] to frame as much of them as credit allows into
//!   one record in its output buffer. Control frames (our parameters, resets,
//!   credit, pings, the close) come out of [`Connection::poll_transmit`], which
//!   must be drained before stream records are added so that they keep priority.
//!
//! **Why one event per `handle_input` call** rather than an iterator or a
//! callback: an event borrows only the *input*, not the connection, so between
//! two calls the application is free to call `release`, `write_stream`,
//! `reset_stream` and so on in reaction to what it just saw. An iterator holding
//! `&mut Connection` would forbid that, and a callback would need the
//! connection passed back into it. The cost is one call per event, which the
//! caller's loop hides:
//!
//! ```
//! # use skiff_core::conn::{Config, Connection, Event};
//! # use skiff_core::wire::qmux::Side;
//! # use skiff_core::time::Instant;
//! # let now = Instant::ZERO;
//! # let mut conn = Connection::<8>::new(Side::Client, Config::new(), now).unwrap();
//! # let buf = [0u8; 0];
//! let mut input = &buf[..];
//! loop {
//!     let step = conn.handle_input(now, input);
//!     input = &input[step.consumed..];
//!     match step.event {
//!         None => break, // keep `input` (a partial record) for the next read
//!         Some(Event::StreamData { id, data, .. }) => {
//!             // ... use `data`, then give the credit back:
//!             conn.release(id, data.len() as u64);
//!         }
//!         Some(_) => {}
//!     }
//! }
//! ```
//!
//! Driving it, in the spirit of quinn-proto: after creating the connection and
//! after every `handle_input` / `handle_timeout` / application call, drain
//! [`Connection::poll_transmit`] into the socket, then write stream records;
//! sleep until [`Connection::poll_timeout`] or readable input. The first
//! `poll_transmit` yields our QX_TRANSPORT_PARAMETERS, which must be the first
//! record on the wire (docs/protocol.md §1.1).
//!
//! Stream storage is a table of `N` slots (const generic). We advertise stream
//! counts that, with the streams we open, always fit in it: a compliant peer
//! never finds the table full, and [`Connection::open_stream`] reports
//! [`OpenError::TableFull`] when the free slots are all reserved for the peer.

mod config;
mod error;
mod event;
mod flow;
mod input;
mod send;
mod streams;
mod timer;
mod transport;

#[cfg(test)]
mod tests;

pub use config::{Config, ConfigError, MOQ_LITE_05};
pub use error::{DatagramError, OpenError, StreamError, WriteError};
pub use event::{CloseCause, Closed, Event, Input, Written};

use heapless::{Deque, String};

use crate::time::Instant;
use crate::wire::qmux::{Dir, Protocols, Side, StreamId, TransportError};
use flow::{RecvWindow, SendCredit};
use streams::StreamTable;
use timer::{Timer, Timers};

/// Longest close reason we keep (longer ones are cut at a character boundary).
pub const MAX_REASON_LEN: usize = 96;

/// The longest STREAM_REF record [`Connection::write_stream_ref`] writes: a
/// 1-byte size, a 4-byte type and four varints of at most 8 bytes.
pub const MAX_STREAM_REF_RECORD: usize = 1 + 4 + 4 * 8;

/// Application close code for "no common application protocol": moq-lite's
/// VERSION_NEGOTIATION_FAILED (docs/protocol.md §3.15).
pub const VERSION_NEGOTIATION_FAILED: u64 = 0x15;

/// Runs of QX_PING sequence numbers waiting for a response.
const PONG_RUNS: usize = 4;

/// The peer's transport parameters, as far as we use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
struct Peer {
    bidi_local: u64,
    bidi_remote: u64,
    uni: u64,
    datagram: u64,
    record: u64,
}

/// A close frame waiting to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CloseFrame {
    application: bool,
    code: u64,
    reason: String<MAX_REASON_LEN>,
}

impl CloseFrame {
    fn new(application: bool, code: u64, reason: &str) -> Self {
        let mut r = String::new();
        for c in reason.chars() {
            if r.push(c).is_err() {
                break;
            }
        }
        CloseFrame {
            application,
            code,
            reason: r,
        }
    }
}

/// Whether the connection still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Handshaking or established.
    Open,
    /// Over; `pending` is the close frame still to write, if any.
    Closed { pending: Option<CloseFrame> },
}

/// Array slot of a direction.
const fn slot(dir: Dir) -> usize {
    match dir {
        Dir::Bidi => 0,
        Dir::Uni => 1,
    }
}

/// The valid UTF-8 prefix of a received reason.
fn utf8_prefix(b: &[u8]) -> &str {
    match core::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => b
            .get(..e.valid_up_to())
            .and_then(|v| core::str::from_utf8(v).ok())
            .unwrap_or(""),
    }
}

/// docs/protocol.md §1.5: walk the server's list, pick the first name the client also offers.
/// The result is always one of *our* names, so it outlives the input.
fn negotiate(
    side: Side,
    ours: &'static [&'static str],
    theirs: Option<Protocols<'_>>,
) -> Option<&'static str> {
    let theirs = theirs?;
    match side {
        Side::Server => ours.iter().copied().find(|p| theirs.contains(p)),
        Side::Client => theirs
            .iter()
            .find_map(|t| ours.iter().copied().find(|o| *o == t)),
    }
}

/// The byte limit the peer's parameters set on our sending half of `id` (0 before they arrive).
fn send_limit(side: Side, peer: Option<Peer>, id: StreamId) -> u64 {
    let Some(p) = peer else { return 0 };
    // docs/protocol.md §1.4: as a sender, our bidi streams use the peer's bidi_remote,
    // the peer's bidi streams its bidi_local, our uni streams its uni.
    match (id.dir(), id.is_local(side)) {
        (Dir::Bidi, true) => p.bidi_remote,
        (Dir::Bidi, false) => p.bidi_local,
        (Dir::Uni, _) => p.uni,
    }
}

/// A QMux connection over a reliable byte stream, client or server, with room for `N` live streams.
///
/// See the [module documentation](self) for how to drive it.
#[derive(Debug)]
pub struct Connection<const N: usize> {
    side: Side,
    config: Config,
    /// Stream counts we advertised initially (bidi, uni).
    initial_streams: [u64; 2],
    peer: Option<Peer>,
    protocol: Option<&'static str>,
    params_sent: bool,
    state: State,
    /// Bytes of the current record not yet decoded (0 at a record boundary).
    record_left: usize,
    /// Connection credit the peer granted us.
    conn_send: SendCredit,
    /// Connection window we grant the peer.
    conn_recv: RecvWindow,
    max_data_pending: bool,
    /// Streams we may open, per direction (`used` = next index).
    local: [SendCredit; 2],
    /// Streams the peer may open, per direction (`received` = indices opened, `released` = retired).
    remote: [RecvWindow; 2],
    max_streams_pending: [bool; 2],
    streams: StreamTable<N>,
    /// (first sequence, count) runs of QX_PING requests to answer.
    pongs: Deque<(u64, u64), PONG_RUNS>,
    ping_pending: bool,
    ping_seq: u64,
    timers: Timers,
}

impl<const N: usize> Connection<N> {
    /// A new connection on one end of a just-connected TCP stream, created at `now`.
    ///
    /// Call [`poll_transmit`](Self::poll_transmit) next: it writes our parameters.
    ///
    /// # Errors
    /// [`ConfigError`] if `config` advertises more streams than `N` slots hold, a
    /// record size below 16382, or no usable protocol name.
    pub fn new(side: Side, config: Config, now: Instant) -> Result<Self, ConfigError> {
        let (bidi, uni) = config.validate(N)?;
        Ok(Connection {
            side,
            config,
            initial_streams: [bidi, uni],
            peer: None,
            protocol: None,
            params_sent: false,
            state: State::Open,
            record_left: 0,
            conn_send: SendCredit::new(0),
            conn_recv: RecvWindow::new(config.max_data),
            max_data_pending: false,
            local: [SendCredit::new(0); 2],
            remote: [RecvWindow::new(bidi), RecvWindow::new(uni)],
            max_streams_pending: [false; 2],
            streams: StreamTable::new(),
            pongs: Deque::new(),
            ping_pending: false,
            ping_seq: 0,
            timers: Timers::new(now, config.handshake_timeout, config.keep_alive),
        })
    }

    /// Which end of the TCP connection we are.
    #[cfg(test)]
    pub fn side(&self) -> Side {
        self.side
    }

    /// The configuration the connection was created with.
    #[cfg(test)]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The negotiated application protocol, once established.
    pub fn protocol(&self) -> Option<&'static str> {
        self.protocol
    }

    /// True once the peer's parameters arrived, a protocol was agreed and ours were
    /// sent: streams may be opened and written.
    pub fn is_established(&self) -> bool {
        self.state == State::Open && self.protocol.is_some() && self.params_sent
    }

    /// True once the connection is over (closed by either side or timed out).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed { .. })
    }

    /// True once closed *and* any close frame has been written by `poll_transmit`:
    /// the caller may shut the TCP connection down and drop this value.
    pub fn is_drained(&self) -> bool {
        matches!(self.state, State::Closed { pending: None })
    }

    /// Live streams in the table.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// The effective idle timeout, once the peer's parameters arrived (docs/protocol.md §1.4).
    pub fn idle_timeout(&self) -> Option<crate::time::Duration> {
        self.timers.idle()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called, if ever.
    ///
    /// The value may change after any other call; ask again each time round the loop.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Open => self.timers.next(self.ping_pending),
            State::Closed { .. } => None,
        }
    }

    /// Runs the timers that are due at `now`; call it when [`poll_timeout`](Self::poll_timeout)'s
    /// instant is reached (earlier or repeated calls are harmless).
    ///
    /// Returns [`Event::Closed`] if the handshake or idle timeout fired: after a
    /// handshake timeout `poll_transmit` still writes a transport close (code 0,
    /// "handshake timeout", as moq-dev); an idle timeout closes silently
    /// (docs/protocol.md §2.5). A due keep-alive queues a QX_PING request.
    #[must_use]
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Event<'static>> {
        while self.state == State::Open {
            match self.timers.expired(now, self.ping_pending)? {
                Timer::Handshake => {
                    debug!("qmux: handshake timeout");
                    self.state = State::Closed {
                        pending: Some(CloseFrame::new(false, 0, "handshake timeout")),
                    };
                    return Some(Event::Closed(Closed {
                        code: 0,
                        reason: "handshake timeout",
                        application: false,
                        cause: CloseCause::HandshakeTimeout,
                    }));
                }
                Timer::Idle => {
                    debug!("qmux: idle timeout");
                    self.state = State::Closed { pending: None };
                    return Some(Event::Closed(Closed {
                        code: 0,
                        reason: "idle timeout",
                        application: false,
                        cause: CloseCause::IdleTimeout,
                    }));
                }
                Timer::KeepAlive => {
                    trace!("qmux: keep-alive ping");
                    self.ping_pending = true;
                }
            }
        }
        None
    }

    /// Queues a QX_PING request (docs/protocol.md §2.5); the peer answers with a response.
    pub fn ping(&mut self) {
        if self.state == State::Open {
            self.ping_pending = true;
        }
    }

    /// Closes the connection with an application close (`0x1d`) carrying a moq-lite
    /// session code (docs/protocol.md §2.6, §3.15) and a reason (cut to [`MAX_REASON_LEN`] bytes).
    ///
    /// `poll_transmit` then writes the close and nothing else; no event is
    /// reported for a close we initiate. A second call, or a call after the
    /// connection ended, does nothing.
    pub fn close(&mut self, code: u64, reason: &str) {
        if self.state == State::Open {
            debug!("qmux: closing with code {}", code);
            self.state = State::Closed {
                pending: Some(CloseFrame::new(true, code, reason)),
            };
        }
    }

    /// Ends the connection because the peer broke a rule: queue a transport close
    /// with code 1002 (docs/protocol.md §2.4, §2.6) and report it.
    fn violation(&mut self, e: TransportError) -> Event<'static> {
        debug!("qmux: peer violation: {}", e);
        self.state = State::Closed {
            pending: Some(CloseFrame::new(false, e.code(), e.reason())),
        };
        Event::Closed(Closed {
            code: e.code(),
            reason: e.reason(),
            application: false,
            cause: CloseCause::Violation(e),
        })
    }

    /// Retires finished streams; peer streams retired return stream-count credit.
    fn sweep(&mut self) {
        let retired = self.streams.sweep(self.side);
        for (dir, n) in [(Dir::Bidi, retired.bidi), (Dir::Uni, retired.uni)] {
            // docs/protocol.md §2.4: the same rule as for bytes, counting retired peer streams.
            if n > 0 && self.remote[slot(dir)].release(n).is_some() {
                self.max_streams_pending[slot(dir)] = true;
            }
        }
    }

    /// The byte limit we may send up to on a new stream `id` (0 until the peer's parameters arrive).
    fn send_max(&self, id: StreamId) -> u64 {
        send_limit(self.side, self.peer, id)
    }

    /// The byte window we grant on a new stream `id`.
    fn recv_max(&self, id: StreamId) -> u64 {
        match (id.dir(), id.is_local(self.side)) {
            (Dir::Bidi, true) => self.config.max_stream_data_bidi_local,
            (Dir::Bidi, false) => self.config.max_stream_data_bidi_remote,
            (Dir::Uni, _) => self.config.max_stream_data_uni,
        }
    }

    /// Peer stream indices granted but not yet opened: table slots we keep free for them.
    fn reserved_for_peer(&self) -> usize {
        self.remote
            .iter()
            .map(|w| usize::try_from(w.max() - w.received()).unwrap_or(usize::MAX))
            .fold(0usize, usize::saturating_add)
    }
}
