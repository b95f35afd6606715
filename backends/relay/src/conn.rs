//! An accepted connection as a handler sees it: the socket split into a
//! [`Reader`] and a [`Writer`], each with one reusable owned buffer.
//!
//! Buffers move the io_uring way: a read hands the whole `Vec` to the kernel
//! and gets it back with the completion (monoio's `AsyncReadRent`); a write
//! does the same with the staged bytes. The `Vec`s come from a per-thread
//! [`BufPool`] and go back to it when the halves drop, so after warm-up
//! neither a read, a write nor a new connection allocates.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::io::{
    AsyncReadRent, AsyncWriteRent, CancelableAsyncReadRent, Canceller, OwnedReadHalf,
    OwnedWriteHalf, Splitable,
};
use monoio::net::TcpStream;
use skiff_monoio::buffers;
use skiff_monoio::cancel::{cancel_on, cancel_on_or_after, is_cancelled, write_all_or_stall};
use skiff_monoio::session_driver::{
    ByteRead, ByteWrite, Guard, HandshakeToken, READ_BUFFER_BYTES, WRITE_BUFFER_BYTES,
};
use skiff_monoio::shutdown::{LocalEvent, Shutdown};
use skiff_monoio::staging::Staging;

use crate::config::RelayConfig;
use crate::conn_name::ConnName;
use crate::metrics::{Metrics, ThreadCounters, TransportLabel};

/// Capacity of the buffer a connection's first read uses
/// ([`Reader::wait_first`]): a connection that has sent nothing holds no
/// more than this of user-space buffer.
pub const FIRST_READ_BYTES: usize = 1024;
/// A write buffer that grew past this is freed rather than pooled.
const MAX_POOLED_CAPACITY: usize = 4 * WRITE_BUFFER_BYTES;
/// Most buffers a thread keeps for reuse (bounds idle memory after a burst).
pub const MAX_POOLED_BUFFERS: usize = 512;

// ---------------------------------------------------------------------------
// Buffer pool
// ---------------------------------------------------------------------------

/// A per-thread free list of byte buffers (no locking, `!Send`).
#[derive(Debug, Default)]
pub struct BufPool {
    free: RefCell<Vec<Vec<u8>>>,
}

impl BufPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer with at least `cap` bytes of capacity, reused if one is free.
    pub fn take(&self, cap: usize) -> Vec<u8> {
        let reused = self.free.borrow_mut().pop();
        match reused {
            Some(mut b) => {
                b.clear();
                b.reserve(cap);
                b
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// Returns a buffer for reuse; dropped instead if the pool is full or it grew large.
    pub fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.borrow_mut();
        if buf.capacity() <= MAX_POOLED_CAPACITY && free.len() < MAX_POOLED_BUFFERS {
            free.push(buf);
        }
    }

    /// Buffers currently free.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.free.borrow().len()
    }
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// State shared by the tasks of one worker thread, its connections among
/// them (never leaves the thread).
pub(crate) struct WorkerShared {
    pub(crate) index: usize,
    pub(crate) config: Arc<RelayConfig>,
    pub(crate) metrics: Arc<Metrics>,
    /// Fires when the server stops accepting: handlers drain.
    pub(crate) shutdown: LocalEvent,
    /// Fires when the drain timeout ran out: remaining handlers are dropped.
    pub(crate) force: LocalEvent,
    /// Notified whenever a connection ends while draining.
    pub(crate) closed: LocalEvent,
    pub(crate) open: Cell<u32>,
    /// Open connections and handshakes by peer IP address (an address
    /// leaves when its last connection closes).
    pub(crate) per_ip: RefCell<HashMap<IpAddr, PerAddress>>,
    /// The clients that PROXY headers named, by connection number, while
    /// their connections are open (for the rare log line that asks the
    /// socket for its peer: it would name the load balancer).
    pub(crate) proxied: RefCell<HashMap<u64, SocketAddr>>,
    /// Connections that have not finished their handshake
    /// ([`HandshakeToken`]).
    pub(crate) handshaking: Rc<Cell<u32>>,
    /// Connections closed since the allocator last gave memory back.
    pub(crate) closes_since_trim: Cell<u32>,
    pub(crate) next_id: Cell<u64>,
    pub(crate) pool: BufPool,
}

impl WorkerShared {
    pub(crate) fn counters(&self) -> &ThreadCounters {
        self.metrics.thread(self.index)
    }
}

/// What a worker counts of one peer address.
#[derive(Debug, Default)]
pub(crate) struct PerAddress {
    /// Its open connections.
    pub(crate) open: u32,
    /// Those of them that have not finished their handshake (each one's
    /// [`HandshakeToken`] counts it here too).
    pub(crate) handshakes: Rc<Cell<u32>>,
}

/// One accepted TCP connection, owned by the handler that serves it.
///
/// [`Connection::into_split`] gives its halves, to read and write in one
/// task or to move into separate tasks (a session driver: one task reading
/// into the state machine, one writing what it transmits).
pub struct Connection {
    reader: Reader,
    writer: Writer,
    peer: SocketAddr,
    id: u64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .field("worker", &self.reader.shared.index)
            .finish()
    }
}

impl Connection {
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        id: u64,
        shared: Rc<WorkerShared>,
    ) -> Self {
        // Latency matters more than segment count for a relay.
        let _ = stream.set_nodelay(true);
        let fd = stream.as_raw_fd();
        let (r, w) = stream.into_split();
        // Buffers are taken from the pool when bytes come or go, not before:
        // a connection that has sent nothing holds none.
        let reader = Reader {
            half: r,
            fd,
            prompt_acks: shared.config.quick_ack,
            buf: Vec::new(),
            pending: 0,
            canceller: Canceller::new(),
            shared: shared.clone(),
            handshake: Some(HandshakeToken::new(shared.handshaking.clone())),
            transport: TransportLabel::Tcp,
        };
        // Open on plain TCP until the handler learns more; the reader closes it.
        shared.counters().transport_opened(TransportLabel::Tcp);
        let writer = Writer {
            half: w,
            fd,
            buf: None,
            shared,
            id,
            transport: TransportLabel::Tcp,
        };
        Connection {
            reader,
            writer,
            peer,
            id,
        }
    }

    /// What log lines call this connection (its transport, address,
    /// worker and number), over plain TCP until the handler learns more.
    pub fn name(&self) -> ConnName {
        ConnName::client(self.reader.shared.index, self.id, self.peer)
    }

    /// Counts the connection's handshake in `count` too (its peer
    /// address's handshakes), if the handshake is not over.
    pub(crate) fn count_handshake_in(&mut self, count: Rc<Cell<u32>>) {
        if let Some(token) = self.reader.handshake.as_mut() {
            token.count_also(count);
        }
    }

    /// Reads the PROXY protocol header a load balancer starts the
    /// connection with (at most [`proxy_protocol::MAX_HEADER_BYTES`],
    /// within the handshake timeout of now), keeps the bytes after it for
    /// the handler, and takes the client it names as the connection's peer
    /// (the socket's for a LOCAL or UNKNOWN header). `Ok(None)`: the
    /// balancer closed, the time ran out or the server started draining
    /// before a complete header.
    ///
    /// # Errors
    /// [`ProxyRead::Malformed`] for a header that does not parse;
    /// [`ProxyRead::Io`] for what the socket reports.
    pub(crate) async fn read_proxy_header(&mut self) -> Result<Option<SocketAddr>, ProxyRead> {
        use crate::proxy_protocol::{Header, MAX_HEADER_BYTES, decode};
        let limit = self.reader.handshake_timeout();
        let by = std::time::Instant::now() + limit;
        if !self.reader.wait_first().await.map_err(ProxyRead::Io)? {
            return Ok(None);
        }
        loop {
            match decode(self.reader.pending()).map_err(ProxyRead::Malformed)? {
                Header::Complete { len, client } => {
                    self.reader.skip_pending(len);
                    if let Some(client) = client {
                        self.peer = client;
                    }
                    return Ok(Some(self.peer));
                }
                Header::Incomplete => {
                    let left = by.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    let more = self.reader.read_more(MAX_HEADER_BYTES, left);
                    if !more.await.map_err(ProxyRead::Io)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The server's drain signal, as seen from this thread.
    pub fn shutdown(&self) -> Shutdown {
        Shutdown::new(self.reader.shared.shutdown.clone())
    }

    /// Both halves, owned.
    pub fn into_split(self) -> (Reader, Writer) {
        (self.reader, self.writer)
    }
}

/// Why [`Connection::read_proxy_header`] found no usable header.
#[derive(Debug)]
pub(crate) enum ProxyRead {
    /// The bytes are not a valid PROXY header.
    Malformed(crate::proxy_protocol::HeaderError),
    /// The socket failed.
    Io(io::Error),
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// The receiving half of a [`Connection`] with its reusable read buffer.
pub struct Reader {
    half: OwnedReadHalf<TcpStream>,
    /// The socket's descriptor, for [`quick_ack`] (owned by `half`).
    fd: RawFd,
    /// Whether a read that drained the socket is acknowledged at once
    /// (`--quick-ack`, and the peer may publish: [`ByteRead::set_prompt_acks`]).
    prompt_acks: bool,
    buf: Vec<u8>,
    /// Bytes at the front of `buf` received by [`Reader::wait_first`] and
    /// not returned by a read yet.
    pending: usize,
    canceller: Canceller,
    shared: Rc<WorkerShared>,
    /// Counts the connection among those still in their handshake.
    handshake: Option<HandshakeToken>,
    /// The transport the connection is counted open on, and its bytes
    /// read under ([`SetTransport`]).
    transport: TransportLabel,
}

impl Reader {
    /// The relay's handshake timeout (`--handshake-timeout`), which a session
    /// driver enforces on this connection.
    pub fn handshake_timeout(&self) -> Duration {
        self.shared.config.timeouts.handshake
    }

    /// The token counting this connection among those in their handshake;
    /// the session driver marks it done once the session is established.
    pub fn take_handshake(&mut self) -> Option<HandshakeToken> {
        self.handshake.take()
    }

    /// Waits for the peer's first bytes, with only a
    /// [`FIRST_READ_BYTES`] buffer, and keeps them for the next
    /// [`Reader::read`]: true once bytes arrived; false if the peer closed,
    /// the handshake timeout passed or the server started draining first.
    /// A handler calls it before it takes any per-connection state.
    ///
    /// # Errors
    /// Whatever the socket reports.
    pub async fn wait_first(&mut self) -> io::Result<bool> {
        if self.pending > 0 {
            return Ok(true);
        }
        let limit = self.shared.config.timeouts.handshake;
        let stop = self.shared.shutdown.clone();
        let buf = Vec::with_capacity(FIRST_READ_BYTES);
        let half = &mut self.half;
        let (res, buf) = cancel_on_or_after(&stop, Some(limit), &mut self.canceller, |h| {
            half.cancelable_read(buf, h)
        })
        .await;
        self.buf = buf;
        match res {
            Ok(n) => {
                self.shared.counters().add_bytes_in_on(self.transport, n);
                self.pending = n;
                Ok(n > 0)
            }
            Err(e) if is_cancelled(&e) || e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The bytes received by [`Reader::wait_first`] and [`Reader::read_more`]
    /// that no read has returned yet.
    pub fn pending(&self) -> &[u8] {
        self.buf.get(..self.pending).unwrap_or(&[])
    }

    /// Drops the first `n` pending bytes (a PROXY header), keeping the rest
    /// pending.
    fn skip_pending(&mut self, n: usize) {
        let n = n.min(self.pending);
        self.buf.drain(..n);
        self.pending -= n;
    }

    /// Takes the pending bytes after the first `skip` (which are dropped):
    /// what followed an HTTP head, for the WebSocket reader.
    pub fn take_pending(&mut self, skip: usize) -> Vec<u8> {
        let rest = self.pending().get(skip..).unwrap_or(&[]).to_vec();
        self.pending = 0;
        rest
    }

    /// Reads more bytes and keeps them after the pending ones (at most
    /// `max` pending in all), giving up `limit` from now or when the server
    /// drains: true once bytes arrived, false if the peer closed, the time
    /// passed or the drain began. For the HTTP head, which is read before any
    /// session state exists.
    ///
    /// # Errors
    /// Whatever the socket reports.
    pub async fn read_more(&mut self, max: usize, limit: Duration) -> io::Result<bool> {
        let room = max.saturating_sub(self.pending);
        if room == 0 {
            return Ok(true);
        }
        let stop = self.shared.shutdown.clone();
        let tmp = Vec::with_capacity(room.min(4096));
        let half = &mut self.half;
        let (res, tmp) = cancel_on_or_after(&stop, Some(limit), &mut self.canceller, |h| {
            half.cancelable_read(tmp, h)
        })
        .await;
        match res {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.shared.counters().add_bytes_in_on(self.transport, n);
                self.buf.truncate(self.pending);
                self.buf.extend_from_slice(tmp.get(..n).unwrap_or(&[]));
                self.pending += n;
                Ok(true)
            }
            Err(e) if is_cancelled(&e) || e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The read buffer, taken from the pool at the first full read.
    fn full_buffer(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.buf);
        if buf.capacity() < READ_BUFFER_BYTES {
            buf = self.shared.pool.take(READ_BUFFER_BYTES);
        }
        buf.clear();
        buf
    }

    /// Reads what the peer sent next (at most [`READ_BUFFER_BYTES`]).
    /// An empty slice means the peer closed its sending side.
    ///
    /// # Errors
    /// Whatever the socket reports (reset, timeout...).
    pub async fn read(&mut self) -> io::Result<&[u8]> {
        if self.pending > 0 {
            let n = std::mem::take(&mut self.pending);
            return Ok(self.buf.get(..n).unwrap_or(&[]));
        }
        let buf = self.full_buffer();
        let (res, buf) = self.half.read(buf).await;
        self.buf = buf;
        let n = res?;
        // A short read drained the socket: the peer may be holding back its
        // next segment (Nagle) until this one is acknowledged, so acknowledge
        // now rather than at the delayed-ACK timer. A full read means more is
        // queued, and the kernel acknowledges that by itself.
        if n > 0 && n < self.buf.capacity() {
            self.drained();
        }
        self.shared.counters().add_bytes_in_on(self.transport, n);
        Ok(self.buf.get(..n).unwrap_or(&[]))
    }

    /// Reads what has arrived into `dst` without waiting (bytes a sniff read
    /// first): `Err(WouldBlock)` if nothing waits, `Ok(0)` at end of stream.
    ///
    /// # Errors
    /// Whatever the socket reports.
    pub fn try_read_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.pending > 0 {
            let n = self.pending.min(dst.len());
            if let (Some(d), Some(s)) = (dst.get_mut(..n), self.buf.get(..n)) {
                d.copy_from_slice(s);
            }
            self.buf.drain(..n);
            self.pending -= n;
            if self.pending == 0 {
                // The sniffed bytes are all out: the buffer is not needed again.
                self.buf = Vec::new();
            }
            return Ok(n);
        }
        if dst.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // SAFETY: `fd` is the open socket the read half owns for as long as
        // this reader lives; `dst` is a live, writable buffer of the length
        // passed. MSG_DONTWAIT makes the call return at once whatever the
        // socket's blocking mode.
        let n = unsafe {
            libc::recv(
                self.fd,
                dst.as_mut_ptr().cast(),
                dst.len(),
                libc::MSG_DONTWAIT,
            )
        };
        let Ok(n) = usize::try_from(n) else {
            return Err(io::Error::last_os_error());
        };
        // As in `read`: a short read drained the socket.
        if n > 0 && n < dst.len() {
            self.drained();
        }
        self.shared.counters().add_bytes_in_on(self.transport, n);
        Ok(n)
    }

    /// After a read that drained the socket: acknowledges it at once if the
    /// peer may publish, and counts it.
    fn drained(&self) {
        if self.prompt_acks {
            quick_ack(self.fd);
        }
        self.shared.counters().short_read(self.prompt_acks);
    }

    /// Waits until the socket has bytes (or the end) to read, holding no
    /// buffer meanwhile.
    ///
    /// # Errors
    /// Whatever the wait reports.
    pub async fn readable(&mut self) -> io::Result<()> {
        if self.pending > 0 {
            return Ok(());
        }
        // SAFETY: the stream lives in the `Rc` both halves share for as long
        // as either does; `readable` takes it by shared reference and only
        // reads its descriptor to queue a poll, as the halves' own reads and
        // writes do through the same cell.
        let stream: &TcpStream = unsafe { &*self.half.0.get() };
        // Not relaxed: the reads bypass monoio, so on the epoll driver its
        // readiness must be checked against the socket, not its own record.
        stream.readable(false).await
    }

    /// Like [`Reader::read`], but gives up when the server starts draining:
    /// `Ok(None)` then. The in-flight read is cancelled, not abandoned, so
    /// the buffer comes back and no received byte is lost (bytes that won
    /// the race are returned; the next call returns `None`).
    ///
    /// # Errors
    /// Whatever the socket reports.
    pub async fn read_or_drain(&mut self) -> io::Result<Option<&[u8]>> {
        let stop = self.shared.shutdown.clone();
        if self.pending > 0 {
            let n = std::mem::take(&mut self.pending);
            return Ok(Some(self.buf.get(..n).unwrap_or(&[])));
        }
        let n = {
            let buf = self.full_buffer();
            let half = &mut self.half;
            let (res, buf) =
                cancel_on(&stop, &mut self.canceller, |h| half.cancelable_read(buf, h)).await;
            self.buf = buf;
            match res {
                Ok(n) => n,
                Err(e) if is_cancelled(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        self.shared.counters().add_bytes_in_on(self.transport, n);
        Ok(Some(self.buf.get(..n).unwrap_or(&[])))
    }
}

/// Has the kernel send the ACK it owes on `fd` now and acknowledge at once
/// until it next decides to delay (`TCP_QUICKACK`, which Linux clears by
/// itself, so it is set again after every read that needs it).
///
/// A peer that does not set `TCP_NODELAY` (moq-net's TCP transport, for
/// one) sends a partial segment only once everything before it is
/// acknowledged; with the relay's ACK delayed (40 ms and up on Linux) that
/// adds tens of milliseconds to a frame split over two writes. One
/// `setsockopt` per short read costs far less than the stall.
fn quick_ack(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: `fd` is the open socket of the read half that calls this (the
    // half owns it for as long as the reader lives); `one` is a live c_int
    // and its size is passed with it. A failure (not a TCP socket) is harmless.
    let _ = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&raw const one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.shared.counters().transport_closed(self.transport);
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() >= READ_BUFFER_BYTES {
            self.shared.pool.give(buf);
        }
    }
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// The sending half of a [`Connection`] with its reusable write buffer
/// (taken from the pool at the first write).
pub struct Writer {
    half: OwnedWriteHalf<TcpStream>,
    /// The socket's descriptor: a write that stalls past the limit shuts it down.
    fd: RawFd,
    buf: Option<Staging>,
    shared: Rc<WorkerShared>,
    id: u64,
    /// The transport the connection's bytes written are counted under.
    transport: TransportLabel,
}

impl Writer {
    /// The staging buffer: stage bytes here, then [`Writer::flush`]. A
    /// sans-IO session's `poll_transmit` writes straight into its spare room.
    pub fn buffer(&mut self) -> &mut Staging {
        self.buf.get_or_insert_with(buffers::take_staging)
    }

    /// Gives the staging buffer back to the thread's pool if nothing is
    /// staged (the next [`Writer::buffer`] takes one again).
    pub fn release(&mut self) {
        if self.buf.as_ref().is_some_and(Staging::is_empty)
            && let Some(buf) = self.buf.take()
        {
            buffers::give_staging(buf);
        }
    }

    /// Writes every staged byte, then empties the buffer (keeping its allocation).
    ///
    /// # Errors
    /// Whatever the socket reports; the staged bytes are dropped then.
    /// [`io::ErrorKind::TimedOut`] if the socket accepted no byte for the
    /// relay's write timeout (`--write-timeout`): the peer stopped reading.
    pub async fn flush(&mut self) -> io::Result<()> {
        let Some(buf) = self.buf.as_mut().filter(|b| !b.is_empty()) else {
            return Ok(());
        };
        let stall = self.shared.config.timeouts.write;
        let out = buf.take();
        let (res, out) = write_all_or_stall(&mut self.half, out, Some((stall, self.fd))).await;
        self.shared
            .counters()
            .add_bytes_out_on(self.transport, out.sent());
        if let Some(buf) = self.buf.as_mut() {
            buf.restore(out);
        }
        if let Err(e) = &res
            && e.kind() == io::ErrorKind::TimedOut
        {
            // Named as accepted (the socket's transport). The address is
            // asked of the socket on this rare path rather than kept: the
            // writer is moved through every future that serves the
            // connection, each of which would hold the copy.
            let proxied = self.shared.proxied.borrow().get(&self.id).copied();
            let peer = proxied.unwrap_or_else(|| self.half.peer_addr().unwrap_or(UNKNOWN_PEER));
            tracing::info!(
                conn = ?ConnName::client(self.shared.index, self.id, peer),
                "peer stopped reading: no byte accepted for {stall:?}; dropping the connection"
            );
        }
        res
    }

    /// Stages `data` and flushes.
    ///
    /// # Errors
    /// As [`Writer::flush`].
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.buffer().extend_from_slice(data);
        self.flush().await
    }

    /// Flushes, then shuts the sending direction (the peer reads EOF).
    ///
    /// # Errors
    /// As [`Writer::flush`], or the shutdown call's error.
    pub async fn close(&mut self) -> io::Result<()> {
        self.flush().await?;
        self.half.shutdown().await
    }
}

/// What a log line shows for a peer whose address the socket no longer knows.
const UNKNOWN_PEER: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            buffers::give_staging(buf);
        }
    }
}

// ---------------------------------------------------------------------------
// The session driver's byte I/O
// ---------------------------------------------------------------------------

impl ByteRead for Reader {
    fn read(&mut self) -> impl Future<Output = io::Result<&[u8]>> {
        Reader::read(self)
    }
    fn guard(&self) -> Guard {
        Guard {
            handshake: Some(self.handshake_timeout()),
        }
    }
    fn take_handshake(&mut self) -> Option<HandshakeToken> {
        Reader::take_handshake(self)
    }
    fn try_read_into(&mut self, dst: &mut [u8]) -> Option<io::Result<usize>> {
        Some(Reader::try_read_into(self, dst))
    }
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> {
        Reader::readable(self)
    }
    fn set_prompt_acks(&mut self, on: bool) {
        self.prompt_acks = on && self.shared.config.quick_ack;
    }
}

/// A half of an accepted connection that the handler tells which transport
/// it turned out to carry, for the per-transport counters
/// ([`crate::metrics::TransportLabel`]).
pub(crate) trait SetTransport {
    /// Counts the connection (and its bytes from now on) under `t`.
    fn set_transport(&mut self, t: TransportLabel);
}

impl SetTransport for Reader {
    fn set_transport(&mut self, t: TransportLabel) {
        if t != self.transport {
            let counters = self.shared.counters();
            counters.transport_closed(self.transport);
            counters.transport_opened(t);
            self.transport = t;
        }
    }
}

impl SetTransport for Writer {
    fn set_transport(&mut self, t: TransportLabel) {
        self.transport = t;
    }
}

/// A TLS connection stays counted as `tls` whatever it carries (its halves
/// were labelled before the handshake).
impl SetTransport for skiff_monoio::tls::TlsReader<Reader> {
    fn set_transport(&mut self, _: TransportLabel) {}
}

/// As for [`skiff_monoio::tls::TlsReader`].
impl SetTransport for skiff_monoio::tls::TlsWriter<Writer> {
    fn set_transport(&mut self, _: TransportLabel) {}
}

impl ByteWrite for Writer {
    fn buffer(&mut self) -> &mut Staging {
        Writer::buffer(self)
    }
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> {
        Writer::flush(self)
    }
    fn close(&mut self) -> impl Future<Output = io::Result<()>> {
        Writer::close(self)
    }
    fn release(&mut self) {
        Writer::release(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_reuses_and_bounds() {
        let pool = BufPool::new();
        let a = pool.take(1024);
        let ptr = a.as_ptr();
        pool.give(a);
        assert_eq!(pool.len(), 1);
        let b = pool.take(512);
        assert_eq!(b.as_ptr(), ptr);
        assert!(b.is_empty());
        pool.give(Vec::with_capacity(MAX_POOLED_CAPACITY + 1));
        assert_eq!(pool.len(), 0);
        for _ in 0..MAX_POOLED_BUFFERS + 5 {
            pool.give(Vec::with_capacity(8));
        }
        assert_eq!(pool.len(), MAX_POOLED_BUFFERS);
    }
}
