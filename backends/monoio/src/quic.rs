//! QUIC on monoio: one UDP socket and one quinn-proto endpoint per thread,
//! and the link between the endpoint and each connection's session task
//! (docs/protocol.md §11).
//!
//! The endpoint's receive task ([`Endpoint::run`]) reads datagrams, lets the
//! endpoint route them, and queues each connection's events for its task
//! ([`Link`]), which it wakes. A server's new connections wait in the
//! endpoint until [`Endpoint::accept`] takes them. Each connection's task
//! owns its connection (inside its session's
//! [`QuicTransport`](skiff_quic::QuicTransport)) and sends its datagrams on
//! the shared socket itself ([`Link::flush`]).
//!
//! With SO_REUSEPORT, several threads bind the same port; the kernel keeps a
//! client's 4-tuple on one socket, so a connection's packets reach the
//! thread that owns it as long as the client's address does not change.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

use bytes::BytesMut;
use monoio::net::udp::UdpSocket;
use quinn_proto::{
    ClientConfig, Connection, ConnectionEvent, ConnectionHandle, DatagramEvent, EndpointEvent,
    ServerConfig,
};

use crate::clock::Clock;

/// The largest UDP payload read at once.
const RECV_BYTES: usize = 64 * 1024;

/// Most connections a server endpoint keeps waiting for [`Endpoint::accept`].
const MAX_WAITING: usize = 256;

/// Most datagrams one send hands the kernel at once (UDP GSO: one
/// `sendmsg` with a segment size, cut into datagrams below the socket).
pub const GSO_SEGMENTS: usize = 16;

/// A connection's queue of routed events and the waker of its task.
#[derive(Default)]
struct Route {
    events: VecDeque<ConnectionEvent>,
    waker: Option<Waker>,
}

/// A server's check of a new client's address ([`Endpoint::admit_with`]).
type Admission = Box<dyn Fn(SocketAddr) -> bool>;

struct Shared {
    socket: UdpSocket,
    local: SocketAddr,
    endpoint: RefCell<quinn_proto::Endpoint>,
    routes: RefCell<HashMap<usize, Route>>,
    /// Connections accepted by the endpoint, not yet taken by the server.
    waiting: RefCell<VecDeque<(ConnectionHandle, Connection, SocketAddr)>>,
    accept_waker: RefCell<Option<Waker>>,
    /// The receive task, waiting for a datagram or the stop.
    run_waker: RefCell<Option<Waker>>,
    server: Option<Arc<ServerConfig>>,
    clock: Clock,
    stopped: Cell<bool>,
    /// The kernel cuts a batch into datagrams (UDP GSO); off after a send
    /// that refused it.
    gso: Cell<bool>,
    /// New connections are refused (a draining server).
    refusing: Cell<bool>,
    /// Datagrams dropped because they did not parse or belong nowhere.
    dropped: Cell<u64>,
    /// New connections are asked to prove their address (a Retry) while at
    /// least this many connections are still handshaking, as counted in the
    /// cell the server keeps ([`Endpoint::retry_above`]); `None`: never.
    retry_above: RefCell<Option<(u32, Rc<Cell<u32>>)>>,
    /// Retry packets sent.
    retries: Cell<u64>,
    /// The server's word on a new client's address, asked before the
    /// endpoint does any work for it ([`Endpoint::admit_with`]).
    admission: RefCell<Option<Admission>>,
    /// UDP payload bytes received, and sent by the connections' flushes.
    received_bytes: Cell<u64>,
    sent_bytes: Cell<u64>,
}

/// One thread's QUIC endpoint: a UDP socket and the quinn-proto endpoint
/// that routes its datagrams. Clone it to share it between tasks.
#[derive(Clone)]
pub struct Endpoint {
    shared: Rc<Shared>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local", &self.shared.local)
            .field("connections", &self.shared.routes.borrow().len())
            .finish()
    }
}

impl Endpoint {
    /// A server endpoint on `addr` (SO_REUSEPORT, so each worker thread binds
    /// the same port) accepting connections with `config`.
    ///
    /// # Errors
    /// The socket could not be bound.
    pub fn server(addr: SocketAddr, config: Arc<ServerConfig>, clock: Clock) -> io::Result<Self> {
        let socket = bind(addr, true)?;
        Self::with_socket(socket, Some(config), clock)
    }

    /// A client endpoint on an ephemeral port of `addr`'s family.
    ///
    /// # Errors
    /// The socket could not be bound.
    pub fn client(remote: SocketAddr, clock: Clock) -> io::Result<Self> {
        let local: SocketAddr = if remote.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let socket = bind(local, false)?;
        Self::with_socket(socket, None, clock)
    }

    fn with_socket(
        socket: std::net::UdpSocket,
        server: Option<Arc<ServerConfig>>,
        clock: Clock,
    ) -> io::Result<Self> {
        let local = socket.local_addr()?;
        let socket = UdpSocket::from_std(socket)?;
        let endpoint = quinn_proto::Endpoint::new(
            Arc::new(skiff_quic::config::endpoint_config()),
            server.clone(),
            true,
            None,
        );
        Ok(Endpoint {
            shared: Rc::new(Shared {
                socket,
                local,
                endpoint: RefCell::new(endpoint),
                routes: RefCell::new(HashMap::new()),
                waiting: RefCell::new(VecDeque::new()),
                accept_waker: RefCell::new(None),
                run_waker: RefCell::new(None),
                server,
                clock,
                stopped: Cell::new(false),
                gso: Cell::new(true),
                refusing: Cell::new(false),
                dropped: Cell::new(0),
                retry_above: RefCell::new(None),
                retries: Cell::new(0),
                admission: RefCell::new(None),
                received_bytes: Cell::new(0),
                sent_bytes: Cell::new(0),
            }),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Datagrams dropped so far because they did not parse or belonged to
    /// no connection.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.get()
    }

    /// Retry packets sent so far ([`retry_above`](Self::retry_above)).
    pub fn retries(&self) -> u64 {
        self.shared.retries.get()
    }

    /// Answers a new connection's first Initial with a Retry (the client
    /// proves it receives at its address before the endpoint keeps any state
    /// for it) while `handshaking` (a count the server keeps of its
    /// connections still in their handshake) is at `threshold` or more;
    /// 0 asks every new connection. A client that already came back with a
    /// Retry's token is let through.
    pub fn retry_above(&self, threshold: u32, handshaking: Rc<Cell<u32>>) {
        *self.shared.retry_above.borrow_mut() = Some((threshold, handshaking));
    }

    /// Asks `check` about each new client's address before the endpoint
    /// does any work for it: `false` refuses the connection at once
    /// (CONNECTION_REFUSED, without state or a TLS handshake), as a server
    /// over its limits for that address does.
    pub fn admit_with(&self, check: impl Fn(SocketAddr) -> bool + 'static) {
        *self.shared.admission.borrow_mut() = Some(Box::new(check));
    }

    /// UDP payload bytes the socket received so far (every datagram,
    /// dropped ones included).
    pub fn received_bytes(&self) -> u64 {
        self.shared.received_bytes.get()
    }

    /// UDP payload bytes the endpoint's connections sent so far (handshakes,
    /// streams, acknowledgements; the endpoint's stateless answers aside).
    pub fn sent_bytes(&self) -> u64 {
        self.shared.sent_bytes.get()
    }

    /// Connections the endpoint routes datagrams to.
    pub fn connections(&self) -> usize {
        self.shared.routes.borrow().len()
    }

    /// Dials `remote` (`server_name` for SNI and the certificate).
    ///
    /// # Errors
    /// `InvalidInput` for a server name or address the library refuses.
    pub fn connect(
        &self,
        config: ClientConfig,
        remote: SocketAddr,
        server_name: &str,
    ) -> io::Result<(Connection, Link)> {
        let now = std::time::Instant::now();
        let (ch, conn) = self
            .shared
            .endpoint
            .borrow_mut()
            .connect(now, config, remote, server_name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.shared
            .routes
            .borrow_mut()
            .insert(ch.0, Route::default());
        Ok((conn, self.link(ch)))
    }

    fn link(&self, ch: ConnectionHandle) -> Link {
        Link {
            shared: self.shared.clone(),
            ch,
            drained: false,
        }
    }

    /// The next connection a client opened (server endpoints only); `None`
    /// once the endpoint stopped.
    pub async fn accept(&self) -> Option<(Connection, Link, SocketAddr)> {
        std::future::poll_fn(|cx| {
            if let Some((ch, conn, remote)) = self.shared.waiting.borrow_mut().pop_front() {
                return Poll::Ready(Some((conn, self.link(ch), remote)));
            }
            if self.shared.stopped.get() {
                return Poll::Ready(None);
            }
            *self.shared.accept_waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Sends one datagram per system call instead of batches (`false`), or
    /// batches again while the kernel takes them (`true`, the default).
    pub fn set_gso(&self, on: bool) {
        self.shared.gso.set(on);
    }

    /// Refuses new connections from now on (a draining server); the open
    /// ones go on.
    pub fn refuse_new(&self) {
        self.shared.refusing.set(true);
    }

    /// Stops the receive task and wakes [`accept`](Self::accept).
    pub fn stop(&self) {
        self.shared.stopped.set(true);
        for waker in [&self.shared.accept_waker, &self.shared.run_waker] {
            if let Some(w) = waker.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// Receives and routes datagrams until [`stop`](Self::stop) (or a socket
    /// error). Spawn it once per endpoint.
    pub async fn run(self) {
        let shared = &self.shared;
        let mut buf = BytesMut::with_capacity(RECV_BYTES);
        let mut response = Vec::with_capacity(2048);
        while !shared.stopped.get() {
            buf.clear();
            if buf.capacity() < RECV_BYTES {
                buf.reserve(RECV_BYTES);
            }
            // The receive ends with the stop (its buffer goes with it).
            let stop = std::future::poll_fn(|cx| {
                if shared.stopped.get() {
                    return Poll::Ready(());
                }
                *shared.run_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            });
            let Ok((res, b)) = crate::cancel::race(shared.socket.recv_from(buf), stop).await else {
                return;
            };
            buf = b;
            let (n, from) = match res {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors surface here on some kernels; the socket
                    // itself goes on.
                    tracing::debug!(error = %e, "udp receive failed");
                    continue;
                }
            };
            shared
                .received_bytes
                .set(shared.received_bytes.get() + n as u64);
            let data = buf.split_to(n);
            let now = std::time::Instant::now();
            response.clear();
            let event =
                shared
                    .endpoint
                    .borrow_mut()
                    .handle(now, from, None, None, data, &mut response);
            match event {
                Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                    let mut routes = shared.routes.borrow_mut();
                    if let Some(route) = routes.get_mut(&ch.0) {
                        route.events.push_back(event);
                        if let Some(w) = route.waker.take() {
                            w.wake();
                        }
                    }
                }
                Some(DatagramEvent::NewConnection(incoming)) => {
                    self.admit(incoming, now, &mut response).await;
                }
                Some(DatagramEvent::Response(t)) => {
                    response.truncate(t.size);
                    response = send(&shared.socket, response, t.destination).await;
                }
                None => shared.dropped.set(shared.dropped.get() + 1),
            }
        }
    }

    /// Accepts a new connection for [`accept`](Self::accept), refuses it
    /// when too many wait, this endpoint serves none or the server's
    /// [`admit_with`](Self::admit_with) says no, or asks it to
    /// validate its address first ([`retry_above`](Self::retry_above)).
    async fn admit(
        &self,
        incoming: quinn_proto::Incoming,
        now: std::time::Instant,
        response: &mut Vec<u8>,
    ) {
        let shared = &self.shared;
        let remote = incoming.remote_address();
        if shared.server.is_none()
            || shared.refusing.get()
            || shared.waiting.borrow().len() >= MAX_WAITING
            || shared
                .admission
                .borrow()
                .as_ref()
                .is_some_and(|f| !f(remote))
        {
            let t = shared.endpoint.borrow_mut().refuse(incoming, response);
            response.truncate(t.size);
            let buf = std::mem::take(response);
            *response = send(&shared.socket, buf, t.destination).await;
            return;
        }
        let pressed =
            shared
                .retry_above
                .borrow()
                .as_ref()
                .is_some_and(|(threshold, handshaking)| {
                    // Those accepted and not yet taken by the server count too.
                    let waiting = u32::try_from(shared.waiting.borrow().len()).unwrap_or(u32::MAX);
                    handshaking.get().saturating_add(waiting) >= *threshold
                });
        let incoming = if pressed && incoming.may_retry() {
            let retried = shared.endpoint.borrow_mut().retry(incoming, response);
            match retried {
                Ok(t) => {
                    shared.retries.set(shared.retries.get() + 1);
                    response.truncate(t.size);
                    let buf = std::mem::take(response);
                    *response = send(&shared.socket, buf, t.destination).await;
                    return;
                }
                Err(e) => e.into_incoming(),
            }
        } else {
            incoming
        };
        let accepted = shared
            .endpoint
            .borrow_mut()
            .accept(incoming, now, response, None);
        match accepted {
            Ok((ch, conn)) => {
                shared.routes.borrow_mut().insert(ch.0, Route::default());
                shared.waiting.borrow_mut().push_back((ch, conn, remote));
                if let Some(w) = shared.accept_waker.borrow_mut().take() {
                    w.wake();
                }
            }
            Err(e) => {
                if let Some(t) = e.response {
                    response.truncate(t.size);
                    let buf = std::mem::take(response);
                    *response = send(&shared.socket, buf, t.destination).await;
                }
            }
        }
    }
}

/// Sends `buf` to `to` and returns it emptied.
async fn send(socket: &UdpSocket, buf: Vec<u8>, to: SocketAddr) -> Vec<u8> {
    let (res, mut buf) = socket.send_to(buf, to).await;
    if let Err(e) = res {
        tracing::debug!(error = %e, "udp send failed");
    }
    buf.clear();
    buf
}

/// One `sendmsg` of `data` to `to` on the non-blocking socket; with
/// `segment`, the kernel cuts it into datagrams of that size (UDP_SEGMENT).
fn send_batch(
    socket: &UdpSocket,
    data: &[u8],
    to: SocketAddr,
    segment: Option<usize>,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut addr, addr_len) = sockaddr(to);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for one control message holding a u16.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; all zeroes is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = addr_len;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(size) = segment {
        let size = u16::try_from(size).unwrap_or(u16::MAX);
        // SAFETY: CMSG_SPACE only computes a length.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer holds `space` bytes, room for one
        // header and its u16; CMSG_FIRSTHDR points into it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = libc::UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
        }
    }
    // SAFETY: `msg` points at `iov`, `addr` and `control`, all alive for the
    // call; the kernel reads them only during it.
    let rc = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::UdpSocket> {
    use std::os::fd::FromRawFd;
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: a plain socket(2) call; the descriptor is checked and then
    // owned by the std socket.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh, valid socket descriptor nobody else owns.
    let socket = unsafe { std::net::UdpSocket::from_raw_fd(fd) };
    if reuse_port {
        set_int(&socket, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    }
    // Room for bursts at the socket: a relay's receive side takes every
    // viewer's ACKs.
    let _ = set_int(&socket, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
    let _ = set_int(&socket, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
    let (raw, len) = sockaddr(addr);
    // SAFETY: `raw` holds a sockaddr of `len` bytes for `addr`'s family.
    let rc = unsafe { libc::bind(fd, (&raw as *const libc::sockaddr_storage).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

fn set_int(socket: &std::net::UdpSocket, level: i32, name: i32, value: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt with a pointer to an int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is aligned for it.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage, which is aligned for it.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

/// Send buffers a thread's flushes share, so a connection holds no buffer of
/// its own between flushes (a batch fills up to [`GSO_SEGMENTS`] datagrams).
/// A flush waiting for room in the socket keeps its buffer; at most
/// [`SPARE_SEND_BUFS`] are kept for the next flushes.
struct SendBuf(Vec<u8>);

/// Free send buffers a thread keeps ([`SendBuf`]).
const SPARE_SEND_BUFS: usize = 4;

thread_local! {
    static SEND_BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

impl SendBuf {
    /// A free buffer of the thread's, or a new one when every one is in a
    /// flush that waits for the socket.
    fn take() -> SendBuf {
        let spare = SEND_BUFS.try_with(|b| b.borrow_mut().pop()).ok().flatten();
        SendBuf(spare.unwrap_or_default())
    }
}

impl Drop for SendBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        let _ = SEND_BUFS.try_with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < SPARE_SEND_BUFS {
                b.push(buf);
            }
        });
    }
}

/// One connection's side of the endpoint: the events routed to it, the
/// endpoint events it raises, and the socket its datagrams go out on.
pub struct Link {
    shared: Rc<Shared>,
    ch: ConnectionHandle,
    /// The connection told the endpoint it drained: the endpoint forgot it.
    drained: bool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("handle", &self.ch.0).finish()
    }
}

impl Link {
    /// Hands `conn` the events the endpoint routed to it; true if any.
    pub fn deliver(&self, conn: &mut Connection) -> bool {
        let mut any = false;
        loop {
            let event = {
                let mut routes = self.shared.routes.borrow_mut();
                routes
                    .get_mut(&self.ch.0)
                    .and_then(|r| r.events.pop_front())
            };
            let Some(event) = event else { break };
            any = true;
            conn.handle_event(event);
        }
        any
    }

    /// True if routed events wait; otherwise registers `waker` for the next.
    pub fn poll_ready(&self, waker: &Waker) -> bool {
        let mut routes = self.shared.routes.borrow_mut();
        match routes.get_mut(&self.ch.0) {
            Some(r) if !r.events.is_empty() => true,
            Some(r) => {
                if !r.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    r.waker = Some(waker.clone());
                }
                false
            }
            None => true,
        }
    }

    /// Passes the connection's endpoint events (new connection IDs, the
    /// drain) to the endpoint, and the endpoint's answers back.
    pub fn exchange(&mut self, conn: &mut Connection) {
        while let Some(event) = conn.poll_endpoint_events() {
            self.drained |= event.is_drained();
            let back = self
                .shared
                .endpoint
                .borrow_mut()
                .handle_event(self.ch, event);
            if let Some(back) = back {
                conn.handle_event(back);
            }
        }
    }

    /// Sends every datagram `conn` has ready, in batches of up to
    /// [`GSO_SEGMENTS`] datagrams per system call while the kernel takes
    /// them (UDP GSO); returns how many sends it made.
    pub async fn flush(&mut self, conn: &mut Connection) -> usize {
        let mut sent = 0;
        // A buffer of the thread's, given back when the flush ends (or is
        // dropped): a batch is up to GSO_SEGMENTS datagrams, and a
        // connection between flushes holds none.
        let mut buf = SendBuf::take();
        loop {
            buf.0.clear();
            let now = std::time::Instant::now();
            let max = if self.shared.gso.get() {
                GSO_SEGMENTS
            } else {
                1
            };
            let Some(t) = conn.poll_transmit(now, max, &mut buf.0) else {
                break;
            };
            let data = buf.0.get(..t.size).unwrap_or(&buf.0);
            let segment = t.segment_size.filter(|&s| s < data.len());
            let shared = &self.shared;
            shared
                .sent_bytes
                .set(shared.sent_bytes.get() + data.len() as u64);
            loop {
                match send_batch(&self.shared.socket, data, t.destination, segment) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if self.shared.socket.writable(true).await.is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if e.raw_os_error() == Some(libc::EIO)
                            && let Some(size) = segment =>
                    {
                        // The device cannot segment: this batch and every
                        // later one go one datagram per send.
                        self.shared.gso.set(false);
                        for piece in data.chunks(size) {
                            let _ = send_batch(&self.shared.socket, piece, t.destination, None);
                        }
                        break;
                    }
                    Err(e) => {
                        // Lost like any datagram; the library retransmits.
                        tracing::debug!(error = %e, "udp send failed");
                        break;
                    }
                }
            }
            sent += 1;
        }
        sent
    }

    /// The clock the endpoint was made with.
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.routes.borrow_mut().remove(&self.ch.0);
        if self.drained {
            return;
        }
        // The connection is gone: the endpoint forgets its IDs.
        let _ = self
            .shared
            .endpoint
            .borrow_mut()
            .handle_event(self.ch, EndpointEvent::drained());
    }
}
