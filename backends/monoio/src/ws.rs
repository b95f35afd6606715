//! QMux over WebSocket on monoio (docs/protocol.md §9): a [`ByteRead`] and a
//! [`ByteWrite`] that wrap a plain byte stream's halves, so [`drive`] runs a
//! session over WebSocket exactly as over TCP, and [`dial`] for clients.
//!
//! * [`WsReader`] decodes the peer's frames ([`skiff_ws::frame::Decoder`])
//!   and hands the session QMux/TCP records (`Size` + frames), unmasked in
//!   its output buffer. Cost over TCP: one more copy of each received byte
//!   (socket buffer → decoder output → inbox) and the XOR of the mask.
//! * [`WsWriter`] gives the session a staging buffer of its own and, at each
//!   flush, reframes what the session staged: each record's `Size` varint is
//!   replaced by a WebSocket frame header, the other staged bytes (record
//!   headers, control frames) are copied once into the inner writer's
//!   staging, and gathered payload ranges move across as ranges: on a server
//!   the payload still goes from the pool block to the kernel in one
//!   `writev`, with no user-space copy. The cost is a copy of the staged
//!   header bytes (not of payload) and 1 to 2 more bytes per record on the
//!   wire (a 4-byte header for a 126..65535-byte record where TCP has a
//!   2-byte `Size`). A client must mask its frames (RFC 6455 §5.3), so its
//!   payload is copied and XORed.
//! * The two share a [`Link`]: the reader leaves a Ping's payload there for
//!   the writer's Pong, and a framing error's close code for the writer's
//!   Close. The writer pings every `PING_EVERY` and fails (ending the
//!   session) after `IDLE_TIMEOUT` without a byte from the peer.
//!
//! [`drive`]: crate::session_driver::drive

use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use skiff_core::wire::varint;
use skiff_ws::frame::{
    self, CLOSE_GOING_AWAY, CLOSE_NORMAL, Decoder, MAX_CONTROL, MAX_HEADER, OP_BINARY, OP_CLOSE,
    OP_PING, OP_PONG, Role,
};

use crate::session_driver::{
    ByteRead, ByteWrite, Guard, HalfReader, HalfWriter, HandshakeToken, READ_BUFFER_BYTES,
    WRITE_BUFFER_BYTES, split_halves,
};
use crate::staging::Staging;

/// How often the writer sends a WebSocket Ping (as moq-relay).
pub(crate) const PING_EVERY: Duration = Duration::from_secs(5);

/// Silence from the peer (no byte, not even a Pong) after which the
/// connection is given up (as moq-relay).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the two halves of one WebSocket connection tell each other.
#[derive(Debug, Default)]
pub struct Link {
    /// A Ping's payload to answer.
    pong: Cell<Option<([u8; MAX_CONTROL], usize)>>,
    /// The close code (and reason) to send: a framing error the reader saw.
    close: Cell<Option<(u16, &'static str)>>,
    /// When the peer last sent a byte.
    last_rx: Cell<Option<Instant>>,
    /// The writer's task, woken when a Pong is due.
    waker: RefCell<Option<Waker>>,
}

impl Link {
    /// A link for a new connection.
    #[must_use]
    pub fn new() -> Rc<Self> {
        Rc::new(Link::default())
    }

    /// Sets the close code the writer sends when the connection ends
    /// (the first one set wins).
    pub(crate) fn set_close(&self, code: u16, reason: &'static str) {
        if self.close.get().is_none() {
            self.close.set(Some((code, reason)));
        }
    }

    fn wake(&self) {
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// The receiving half: WebSocket frames in, QMux/TCP records out.
#[derive(Debug)]
pub struct WsReader<R> {
    inner: R,
    decoder: Decoder,
    link: Rc<Link>,
    /// Bytes after the HTTP head, read with it; decoded first.
    early: Vec<u8>,
    /// Bytes the last read returned (dropped at the next).
    given: usize,
    /// The peer closed (EOF or a Close frame).
    ended: bool,
}

impl<R: ByteRead> WsReader<R> {
    /// Decodes `inner` as `role` (a server requires masked frames), after
    /// `early` (bytes that followed the HTTP head); messages may be at most
    /// `max_message` bytes (our QMux `max_record_size`).
    pub fn new(inner: R, role: Role, max_message: usize, early: Vec<u8>, link: Rc<Link>) -> Self {
        let max_message = max_message.min(skiff_ws::frame::MAX_MESSAGE);
        WsReader {
            inner,
            decoder: Decoder::new(role, max_message, READ_BUFFER_BYTES + max_message + 16),
            link,
            early,
            given: 0,
            ended: false,
        }
    }

    /// Feeds one read to the decoder; false at end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        let fed = if self.early.is_empty() {
            let data = self.inner.read().await?;
            if data.is_empty() {
                return Ok(false);
            }
            self.decoder.feed(data)
        } else {
            let early = std::mem::take(&mut self.early);
            self.decoder.feed(&early)
        };
        self.link.last_rx.set(Some(Instant::now()));
        if let Err(e) = fed {
            self.link.set_close(e.close_code(), e.reason());
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if let Some(p) = self.decoder.take_ping() {
            self.link.pong.set(Some(p));
            self.link.wake();
        }
        Ok(self.decoder.closed().is_none())
    }
}

impl<R: ByteRead> ByteRead for WsReader<R> {
    async fn read(&mut self) -> io::Result<&[u8]> {
        self.decoder.consume(std::mem::take(&mut self.given));
        while self.decoder.records().is_empty() && !self.ended {
            if !self.fill().await? {
                self.ended = true;
            }
        }
        // At most one read buffer's worth, as the session driver's inbox expects.
        let n = self.decoder.records().len().min(READ_BUFFER_BYTES);
        self.given = n;
        Ok(self.decoder.records().get(..n).unwrap_or(&[]))
    }

    fn guard(&self) -> Guard {
        self.inner.guard()
    }

    fn take_handshake(&mut self) -> Option<HandshakeToken> {
        self.inner.take_handshake()
    }

    fn set_prompt_acks(&mut self, on: bool) {
        self.inner.set_prompt_acks(on);
    }
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// The sending half: the session's QMux/TCP records out as WebSocket frames.
pub struct WsWriter<W> {
    inner: W,
    /// What the session stages (records with their `Size`).
    staging: Staging,
    link: Rc<Link>,
    /// Mask every frame (we are the client).
    mask: bool,
    started: Instant,
    ping_every: Duration,
    idle: Duration,
    next_ping: Instant,
    sleep: Pin<Box<monoio::time::Sleep>>,
    ping_due: bool,
    idle_expired: bool,
    closed: bool,
}

impl<W> std::fmt::Debug for WsWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsWriter")
            .field("staged", &self.staging.len())
            .field("mask", &self.mask)
            .finish_non_exhaustive()
    }
}

impl<W: ByteWrite> WsWriter<W> {
    /// Frames what the session writes for `inner`, as `role` (a client masks).
    pub fn new(inner: W, role: Role, link: Rc<Link>) -> Self {
        let now = Instant::now();
        WsWriter {
            inner,
            staging: Staging::new(Vec::with_capacity(WRITE_BUFFER_BYTES)),
            link,
            mask: role == Role::Client,
            started: now,
            ping_every: PING_EVERY,
            idle: IDLE_TIMEOUT,
            next_ping: now + PING_EVERY,
            sleep: Box::pin(monoio::time::sleep(PING_EVERY)),
            ping_due: false,
            idle_expired: false,
            closed: false,
        }
    }

    /// Pings every `ping_every` and gives up after `idle` of silence from the
    /// peer, instead of `PING_EVERY` and `IDLE_TIMEOUT`.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_keep_alive(mut self, ping_every: Duration, idle: Duration) -> Self {
        self.ping_every = ping_every;
        self.idle = idle;
        self.next_ping = self.started + ping_every;
        self.sleep = Box::pin(monoio::time::sleep(ping_every.min(idle)));
        self
    }

    /// Stages one control frame into the inner writer.
    fn stage_control(&mut self, opcode: u8, payload: &[u8]) {
        stage_frame(self.inner.buffer(), opcode, payload, self.mask);
    }

    /// Moves the transport's own frames and the session's records into the inner writer.
    fn reframe(&mut self) -> io::Result<()> {
        if let Some((p, n)) = self.link.pong.take() {
            self.stage_control(OP_PONG, p.get(..n).unwrap_or(&[]));
        }
        if std::mem::take(&mut self.ping_due) {
            self.stage_control(OP_PING, &[]);
        }
        let res = reframe(&self.staging, self.inner.buffer(), self.mask);
        self.staging.clear();
        res
    }
}

/// Stages a final frame of `opcode` carrying `payload` (masked with a fresh key if `mask`).
fn stage_frame(out: &mut Staging, opcode: u8, payload: &[u8], mask: bool) {
    let key = mask.then(frame::new_mask);
    let mut head = [0u8; MAX_HEADER];
    let h = frame::encode_header(opcode, payload.len() as u64, key, &mut head);
    out.extend_from_slice(head.get(..h).unwrap_or(&[]));
    let at = out.staged().len();
    out.extend_from_slice(payload);
    if let Some(key) = key {
        let end = out.staged().len();
        if let Some(body) = out.spare_staged(at, end) {
            frame::apply_mask(body, key, 0);
        }
    }
}

fn malformed(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Rewrites the QMux/TCP records staged in `src` as WebSocket binary frames
/// into `dst`: one frame per record, its header in place of the `Size`
/// (docs/protocol.md §9.4). Staged bytes are copied; gathered ranges are
/// gathered again (copied and masked if `mask`).
///
/// # Errors
/// `InvalidData` if the staged bytes are not whole records (a session bug).
pub(crate) fn reframe(src: &Staging, dst: &mut Staging, mask: bool) -> io::Result<()> {
    let (bytes, ranges) = src.parts();
    let mut pos = 0;
    let mut ri = 0;
    while pos < bytes.len() || ri < ranges.len() {
        // The record's Size: always staged, before the next range.
        let limit = ranges.get(ri).map_or(bytes.len(), |r| r.0).min(bytes.len());
        let head_bytes = bytes.get(pos..limit).unwrap_or(&[]);
        let (size, n) =
            varint::decode(head_bytes).map_err(|_| malformed("record without a Size"))?;
        pos += n;
        let key = mask.then(frame::new_mask);
        let mut head = [0u8; MAX_HEADER];
        let h = frame::encode_header(OP_BINARY, size, key, &mut head);
        dst.extend_from_slice(head.get(..h).unwrap_or(&[]));
        let mut left = usize::try_from(size).map_err(|_| malformed("record too large"))?;
        let mut phase = 0;
        while left > 0 {
            let next_range = ranges.get(ri).map_or(usize::MAX, |r| r.0);
            if pos < next_range && pos < bytes.len() {
                let take = left.min(next_range.min(bytes.len()) - pos);
                let at = dst.staged().len();
                dst.extend_from_slice(bytes.get(pos..pos + take).unwrap_or(&[]));
                if let Some(key) = key
                    && let Some(body) = dst.spare_staged(at, at + take)
                {
                    frame::apply_mask(body, key, phase);
                }
                pos += take;
                left -= take;
                phase += take;
            } else if let Some((_, slice)) = ranges.get(ri).filter(|r| r.0 == pos) {
                let len = slice.len();
                if len > left {
                    return Err(malformed("a gathered range crosses a record"));
                }
                match key {
                    None => dst.gather(slice.clone()),
                    Some(key) => {
                        let at = dst.staged().len();
                        dst.extend_from_slice(slice.as_bytes());
                        if let Some(body) = dst.spare_staged(at, at + len) {
                            frame::apply_mask(body, key, phase);
                        }
                    }
                }
                ri += 1;
                left -= len;
                phase += len;
            } else {
                return Err(malformed("a record runs past the staged bytes"));
            }
        }
    }
    Ok(())
}

impl<W: ByteWrite> ByteWrite for WsWriter<W> {
    fn buffer(&mut self) -> &mut Staging {
        &mut self.staging
    }

    async fn flush(&mut self) -> io::Result<()> {
        if self.idle_expired {
            self.link.set_close(CLOSE_GOING_AWAY, "idle timeout");
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "websocket peer silent for the idle timeout",
            ));
        }
        self.reframe()?;
        self.inner.flush().await
    }

    async fn close(&mut self) -> io::Result<()> {
        if !std::mem::replace(&mut self.closed, true) {
            let _ = self.reframe();
            let (code, reason) = self.link.close.get().unwrap_or((CLOSE_NORMAL, ""));
            let (payload, n) = frame::close_payload(code, reason);
            self.stage_control(OP_CLOSE, payload.get(..n).unwrap_or(&[]));
        }
        self.inner.close().await
    }

    fn poll_transport(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut w = self.link.waker.borrow_mut();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        if self.wants_flush() {
            return Poll::Ready(());
        }
        loop {
            if self.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            let last = self.link.last_rx.get().unwrap_or(self.started);
            let idle_at = last + self.idle;
            if now >= idle_at {
                self.idle_expired = true;
                return Poll::Ready(());
            }
            if now >= self.next_ping {
                self.ping_due = true;
                self.next_ping = now + self.ping_every;
            }
            let at = self.next_ping.min(idle_at);
            self.sleep
                .as_mut()
                .reset(monoio::time::Instant::from_std(at));
            if self.ping_due {
                return Poll::Ready(());
            }
        }
    }

    fn wants_flush(&self) -> bool {
        self.ping_due || self.idle_expired || self.link.pong_pending()
    }
}

impl Link {
    fn pong_pending(&self) -> bool {
        let p = self.pong.take();
        self.pong.set(p);
        p.is_some()
    }
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A dialed WebSocket connection: its halves and the subprotocol the server chose.
pub type Dialed = (
    WsReader<HalfReader<monoio::net::TcpStream>>,
    WsWriter<HalfWriter<monoio::net::TcpStream>>,
    Option<String>,
);

/// Dials `host` (`host:port`, resolved now) and upgrades to WebSocket for
/// `target` (path and query), offering [`skiff_ws::SUBPROTOCOL`]; the
/// server's answer must come within `timeout`. `max_message` bounds the
/// messages accepted (our QMux `max_record_size`).
///
/// # Errors
/// The connect or socket error; `TimedOut`; `InvalidData` for a refused or
/// malformed answer (its text says which).
pub async fn dial(
    host: &str,
    target: &str,
    timeout: Duration,
    max_message: usize,
) -> io::Result<Dialed> {
    use std::net::ToSocketAddrs;
    let addr = host
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host has no address"))?;
    let handshake = async {
        let stream = monoio::net::TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = split_halves(stream, READ_BUFFER_BYTES);
        upgrade(reader, writer, host, target, max_message).await
    };
    match crate::cancel::race(handshake, monoio::time::sleep(timeout)).await {
        Ok(res) => res,
        Err(()) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no websocket upgrade answer in time",
        )),
    }
}

/// Upgrades a connected byte stream (plain TCP, or TLS for `wss://`) to
/// WebSocket as a client: sends the request for `target` with `Host: host`,
/// offering [`skiff_ws::SUBPROTOCOL`], and reads the answer. The caller
/// bounds the time.
///
/// # Errors
/// Socket errors; `UnexpectedEof`; `InvalidData` for a refused or malformed
/// answer (its text says which).
pub async fn upgrade<R: ByteRead, W: ByteWrite>(
    mut reader: R,
    mut writer: W,
    host: &str,
    target: &str,
    max_message: usize,
) -> io::Result<(WsReader<R>, WsWriter<W>, Option<String>)> {
    let key = skiff_ws::http::client_key();
    let request = skiff_ws::http::client_request(host, target, &key, skiff_ws::SUBPROTOCOL);
    writer.buffer().extend_from_slice(&request);
    writer.flush().await?;
    let mut head = Vec::new();
    let (len, chosen) = loop {
        let data = reader.read().await?;
        if data.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed during the upgrade",
            ));
        }
        head.extend_from_slice(data);
        match skiff_ws::http::parse_response(&head, &key, skiff_ws::SUBPROTOCOL) {
            Ok(Some(done)) => break done,
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    };
    let early = head.split_off(len);
    let link = Link::new();
    Ok((
        WsReader::new(reader, Role::Client, max_message, early, link.clone()),
        WsWriter::new(writer, Role::Client, link),
        chosen,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_become_frames_and_payload_stays_gathered() {
        let pool = crate::tables::process_pool(0);
        let mut block = pool.alloc().unwrap();
        block.append(&[7u8; 300]);
        let shared = block.into_shared();

        let mut src = Staging::new(Vec::with_capacity(64));
        // A 3-byte record, then a 302-byte one whose last 300 bytes are gathered.
        src.extend_from_slice(&[3, 1, 2, 3, 0x41, 0x2e, 9, 9]);
        src.gather(shared.clone().slice(0, 300).unwrap());
        let mut dst = Staging::new(Vec::with_capacity(64));
        reframe(&src, &mut dst, false).unwrap();
        let (bytes, ranges) = dst.parts();
        assert_eq!(bytes, [0x82, 3, 1, 2, 3, 0x82, 0x7e, 0x01, 0x2e, 9, 9]);
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0].0, bytes.len());

        // Masked: every byte is copied; the decoder gives the records back.
        let mut masked = Staging::new(Vec::with_capacity(64));
        reframe(&src, &mut masked, true).unwrap();
        assert!(masked.parts().1.is_empty());
        let mut d = Decoder::new(Role::Server, 16382, 1024);
        d.feed(masked.parts().0).unwrap();
        let mut want = vec![3, 1, 2, 3, 0x41, 0x2e, 9, 9];
        want.extend_from_slice(&[7u8; 300]);
        assert_eq!(d.records(), want);

        let mut bad = Staging::new(Vec::with_capacity(8));
        bad.extend_from_slice(&[5, 1]);
        assert!(reframe(&bad, &mut dst, false).is_err());
    }

    #[test]
    fn pings_then_gives_up_on_a_silent_peer() {
        use std::io::Read;
        let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pings, waited) =
            crate::driver::block_on(crate::driver::DriverKind::Legacy, move |_| async move {
                let ours = monoio::net::UnixStream::from_std(ours).unwrap();
                let (_reader, writer) = split_halves(ours, 4096);
                let idle = Duration::from_millis(300);
                let mut w = WsWriter::new(writer, Role::Server, Link::new())
                    .with_keep_alive(Duration::from_millis(50), idle);
                let started = Instant::now();
                let mut pings = 0;
                loop {
                    std::future::poll_fn(|cx| w.poll_transport(cx)).await;
                    match w.flush().await {
                        Ok(()) => pings += 1,
                        Err(e) => {
                            assert_eq!(e.kind(), io::ErrorKind::TimedOut);
                            break;
                        }
                    }
                }
                let waited = started.elapsed();
                // The close that ends the connection says why: 1001.
                w.close().await.unwrap();
                assert!(waited >= idle, "gave up after {waited:?}");
                (pings, waited)
            })
            .unwrap();
        assert!(pings >= 2, "{pings} pings in {waited:?}");
        let mut got = Vec::new();
        peer.read_to_end(&mut got).unwrap();
        // Unmasked empty Pings, then a Close with 1001.
        assert_eq!(&got[..2], [0x89, 0x00]);
        let close = &got[got.len() - 2 - 2 - "idle timeout".len()..];
        assert_eq!(&close[..4], [0x88, 14, 0x03, 0xe9]);
    }
}
