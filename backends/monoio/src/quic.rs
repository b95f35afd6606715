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
//! With SO_REUSEPORT, several threads bind the same port. A group bound by
//! [`crate::reuseport`] steers each datagram by its connection ID to the
//! thread whose endpoint issued it ([`Endpoint::worker`]), whatever address
//! the client sends from; without the group's filter the kernel keeps a
//! client's address pair on one socket, which holds only while the
//! client's address does not change.

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

/// The largest UDP payload read at once: one datagram, or with UDP GRO the
/// train of datagrams the kernel coalesced (at most 64 KiB).
const RECV_BYTES: usize = 64 * 1024;

/// Most messages one `recvmmsg` takes from the socket: a fan-out relay's
/// receive side is mostly small acknowledgements from many viewers, which
/// GRO does not coalesce (different flows) but one call can still take
/// together.
pub const RECV_BATCH: usize = 32;

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
    /// System calls and datagrams on the socket ([`IoCounts`]).
    io: Cell<IoCounts>,
    /// The receive task takes several datagrams per call (`recvmmsg`).
    batch: Cell<bool>,
    /// The kernel coalesces datagrams of one flow on receive (UDP GRO); on
    /// only with `batch`, whose receive splits them.
    gro: Cell<bool>,
}

/// How many system calls the endpoint made on its socket and how many
/// datagrams they moved: the batching ([`RECV_BATCH`], [`GSO_SEGMENTS`],
/// UDP GRO) shows as more than one datagram per call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// Receive calls: `recvmmsg` system calls (those that found nothing
    /// included), or io_uring receives where `recvmmsg` is unavailable.
    pub recv_calls: u64,
    /// Datagrams received, each of a GRO train counted.
    pub recv_datagrams: u64,
    /// Send calls: `sendmsg` system calls and io_uring sends.
    pub send_calls: u64,
    /// Datagrams sent, each of a GSO batch counted.
    pub sent_datagrams: u64,
}

impl Shared {
    fn count(&self, f: impl FnOnce(&mut IoCounts)) {
        let mut io = self.io.get();
        f(&mut io);
        self.io.set(io);
    }
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
        let endpoint = skiff_quic::config::endpoint_config();
        Self::with_socket(socket, Some(config), endpoint, clock)
    }

    /// Worker `worker`'s server endpoint of a group of `workers` on one
    /// port, on its socket of the group ([`crate::reuseport::bind_group`]):
    /// the connection IDs it issues name the worker, so the group's socket
    /// filter brings their datagrams back to this socket
    /// ([`crate::reuseport::steer_by_connection_id`]).
    ///
    /// # Errors
    /// The socket cannot be registered with the runtime.
    pub fn worker(
        socket: std::net::UdpSocket,
        worker: usize,
        workers: usize,
        config: Arc<ServerConfig>,
        clock: Clock,
    ) -> io::Result<Self> {
        let endpoint = skiff_quic::config::worker_endpoint_config(worker, workers);
        Self::with_socket(socket, Some(config), endpoint, clock)
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
        Self::with_socket(socket, None, skiff_quic::config::endpoint_config(), clock)
    }

    fn with_socket(
        socket: std::net::UdpSocket,
        server: Option<Arc<ServerConfig>>,
        endpoint: quinn_proto::EndpointConfig,
        clock: Clock,
    ) -> io::Result<Self> {
        let local = socket.local_addr()?;
        let socket = UdpSocket::from_std(socket)?;
        // A server takes its many peers' datagrams in batches, with GRO
        // where the kernel accepts it (refused, it costs calls, not
        // correctness); a client reads one datagram per receive.
        let batch = server.is_some();
        let gro = batch && set_int(&socket, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        let endpoint = quinn_proto::Endpoint::new(Arc::new(endpoint), server.clone(), true, None);
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
                io: Cell::new(IoCounts::default()),
                batch: Cell::new(batch),
                gro: Cell::new(gro),
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

    /// The socket's system calls and the datagrams they moved so far.
    pub fn io_counts(&self) -> IoCounts {
        self.shared.io.get()
    }

    /// True if the kernel accepted UDP GRO on the socket (datagrams of one
    /// flow arrive coalesced and are split before the library sees them).
    pub fn gro(&self) -> bool {
        self.shared.gro.get()
    }

    /// Receives in batches (`true`, a server's default: readiness, then one
    /// `recvmmsg` of up to [`RECV_BATCH`] datagrams, with UDP GRO where the
    /// kernel takes it) or one datagram per io_uring receive (`false`, a
    /// client's default). Takes effect at [`run`](Self::run)'s start.
    pub fn set_batch_receive(&self, on: bool) {
        self.shared.batch.set(on);
        let gro = set_int(
            &self.shared.socket,
            libc::SOL_UDP,
            libc::UDP_GRO,
            i32::from(on),
        )
        .is_ok()
            && on;
        self.shared.gro.set(gro);
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

    /// Receives and routes datagrams until [`stop`](Self::stop). Spawn it
    /// once per endpoint.
    ///
    /// Each round waits until the socket is readable (an io_uring poll, or
    /// the epoll driver's readiness), takes up to [`RECV_BATCH`] messages in
    /// one `recvmmsg` into pooled buffers, splits each GRO train by its
    /// segment size and hands every datagram to the library, letting the
    /// task each datagram woke run before the next (a true yield: monoio
    /// runs a task that wakes itself again at once).
    /// A client endpoint ([`set_batch_receive`](Self::set_batch_receive)),
    /// or a kernel without `recvmmsg`: one io_uring receive per datagram,
    /// GRO off.
    pub async fn run(self) {
        let shared = &self.shared;
        let mut batch = RecvBatch::new();
        // The buffer of the one-datagram receive.
        let mut single = BytesMut::new();
        let turn = Turn::start();
        let mut response = Vec::with_capacity(2048);
        let mut batched = shared.batch.get();
        while !shared.stopped.get() {
            // The wait (or the receive) ends with the stop.
            let stop = std::future::poll_fn(|cx| {
                if shared.stopped.get() {
                    return Poll::Ready(());
                }
                *shared.run_waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            });
            if !batched {
                reclaim(&mut single);
                let buf = std::mem::take(&mut single);
                let Ok((res, mut buf)) =
                    crate::cancel::race(shared.socket.recv_from(buf), stop).await
                else {
                    return;
                };
                shared.count(|io| io.recv_calls += 1);
                // The datagram; the buffer's rest serves the next receive.
                let data = buf.split();
                single = buf;
                match res {
                    Ok((_, from)) => {
                        shared
                            .received_bytes
                            .set(shared.received_bytes.get() + data.len() as u64);
                        shared.count(|io| io.recv_datagrams += 1);
                        self.route(data, from, &mut response).await;
                    }
                    // ICMP errors surface here on some kernels; the socket
                    // itself goes on.
                    Err(e) => tracing::debug!(error = %e, "udp receive failed"),
                }
                continue;
            }
            let Ok(ready) = crate::cancel::race(shared.socket.readable(false), stop).await else {
                return;
            };
            if let Err(e) = ready {
                tracing::debug!(error = %e, "udp readiness failed; one receive per datagram");
                batched = false;
                self.set_batch_receive(false);
                continue;
            }
            let received = batch.recv(&shared.socket);
            shared.count(|io| io.recv_calls += 1);
            let got = match received {
                Ok(got) => got,
                Err(e) => {
                    match e.raw_os_error() {
                        Some(libc::EAGAIN | libc::EINTR) => {}
                        Some(libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP) => {
                            tracing::debug!(error = %e, "no recvmmsg; one receive per datagram");
                            batched = false;
                            self.set_batch_receive(false);
                        }
                        _ => tracing::debug!(error = %e, "udp receive failed"),
                    }
                    continue;
                }
            };
            let mut woke = false;
            for i in 0..got {
                let Some(msg) = batch.take(i) else {
                    // Truncated (larger than any datagram the endpoint
                    // takes) or from an address of no known family.
                    shared.dropped.set(shared.dropped.get() + 1);
                    continue;
                };
                let Received {
                    mut data,
                    from,
                    segment,
                } = msg;
                shared
                    .received_bytes
                    .set(shared.received_bytes.get() + data.len() as u64);
                // A GRO train: datagrams of `segment` bytes, the last one
                // possibly shorter, each its own packet for the library.
                let segment = segment.filter(|&s| s > 0).unwrap_or(data.len()).max(1);
                while !data.is_empty() {
                    let datagram = data.split_to(segment.min(data.len()));
                    shared.count(|io| io.recv_datagrams += 1);
                    match self.route(datagram, from, &mut response).await {
                        Routed::Nothing => {}
                        Routed::Event => woke = true,
                        // A new connection is counted before the next
                        // datagram's admission check.
                        Routed::Connection => {
                            turn.wait().await;
                            woke = false;
                        }
                    }
                }
            }
            // The connections this batch woke run before the next receive:
            // a reader keeps up with its data, and the buffers come back to
            // the batch before it is filled again. A connection takes all
            // the datagrams the batch held for it in one pass, and
            // acknowledges them in one packet (a GRO train is one address's,
            // so usually one connection's).
            if woke {
                turn.wait().await;
            }
        }
    }

    /// Hands one datagram to the library and acts on what it says: an event
    /// for a connection's task, a new connection, or an answer to send; says
    /// which task, if any, has something to take.
    async fn route(&self, data: BytesMut, from: SocketAddr, response: &mut Vec<u8>) -> Routed {
        let shared = &self.shared;
        let now = std::time::Instant::now();
        response.clear();
        let event = shared
            .endpoint
            .borrow_mut()
            .handle(now, from, None, None, data, response);
        match event {
            Some(DatagramEvent::ConnectionEvent(ch, event)) => {
                let mut routes = shared.routes.borrow_mut();
                let Some(route) = routes.get_mut(&ch.0) else {
                    return Routed::Nothing;
                };
                route.events.push_back(event);
                if let Some(w) = route.waker.take() {
                    w.wake();
                }
                Routed::Event
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                self.admit(incoming, now, response).await;
                if shared.waiting.borrow().is_empty() {
                    Routed::Nothing
                } else {
                    Routed::Connection
                }
            }
            Some(DatagramEvent::Response(t)) => {
                send(shared, response, t).await;
                Routed::Nothing
            }
            None => {
                shared.dropped.set(shared.dropped.get() + 1);
                Routed::Nothing
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
            send(shared, response, t).await;
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
                    send(shared, response, t).await;
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
                    send(shared, response, t).await;
                }
            }
        }
    }
}

/// What routing one datagram left for another task to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routed {
    /// Nothing: an answer went out, or the datagram was dropped.
    Nothing,
    /// An event for a connection's task.
    Event,
    /// A new connection for the server's accept.
    Connection,
}

/// How the receive task lets the tasks already woken run before it goes on.
/// monoio puts a task woken while it runs at the front of its queue (it runs
/// again at once), so the receive task wakes a helper task instead, which
/// joins the back of the queue and wakes the receive task when its turn
/// comes. Made once per receive task; no allocation per turn.
struct Turn {
    shared: Rc<TurnShared>,
}

#[derive(Default)]
struct TurnShared {
    /// The receive task, waiting for its turn.
    waiter: Cell<Option<Waker>>,
    /// The helper task, waiting to be asked.
    helper: Cell<Option<Waker>>,
    /// The receive task ended: so does the helper.
    done: Cell<bool>,
}

impl Turn {
    /// Spawns the helper on the current runtime.
    fn start() -> Self {
        let shared = Rc::new(TurnShared::default());
        let helper = shared.clone();
        monoio::spawn(std::future::poll_fn(move |cx| {
            if helper.done.get() {
                return Poll::Ready(());
            }
            if let Some(w) = helper.waiter.take() {
                w.wake();
            }
            helper.helper.set(Some(cx.waker().clone()));
            Poll::Pending
        }));
        Turn { shared }
    }

    /// Returns once the tasks woken before this call have run (at once if
    /// the helper has not started yet).
    async fn wait(&self) {
        let mut asked = false;
        std::future::poll_fn(|cx| {
            if asked {
                return Poll::Ready(());
            }
            let Some(helper) = self.shared.helper.take() else {
                return Poll::Ready(());
            };
            self.shared.waiter.set(Some(cx.waker().clone()));
            helper.wake();
            asked = true;
            Poll::Pending
        })
        .await
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.shared.done.set(true);
        if let Some(h) = self.shared.helper.take() {
            h.wake();
        }
    }
}

/// Sends the endpoint's answer `t`, whose bytes the library wrote into
/// `response`, and leaves `response` empty for the next one.
async fn send(shared: &Shared, response: &mut Vec<u8>, t: quinn_proto::Transmit) {
    response.truncate(t.size);
    let buf = std::mem::take(response);
    let (res, mut buf) = shared.socket.send_to(buf, t.destination).await;
    shared.count(|io| {
        io.send_calls += 1;
        io.sent_datagrams += u64::from(res.is_ok());
    });
    if let Err(e) = res {
        tracing::debug!(error = %e, "udp send failed");
    }
    buf.clear();
    *response = buf;
}

/// One `sendmsg` of `data` to `to` on the non-blocking socket; with
/// `segment`, the kernel cuts it into datagrams of that size (UDP_SEGMENT).
fn send_batch(
    socket: &impl std::os::fd::AsRawFd,
    data: &[u8],
    to: SocketAddr,
    segment: Option<usize>,
) -> io::Result<()> {
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

/// The smallest batch [`RecvBatch::recv`] offers the kernel; it doubles
/// while calls fill it, up to [`RECV_BATCH`], and halves while they do not,
/// so an endpoint that gets one datagram at a time keeps few buffers.
const RECV_MIN: usize = 4;

/// Room for the control messages of one received message: the GRO segment
/// size (an int) with its header, and slack for any other the kernel adds.
const CONTROL_WORDS: usize = 8;

/// One received message: its payload (a datagram, or a GRO train of
/// datagrams of `segment` bytes each), its source.
struct Received {
    data: BytesMut,
    from: SocketAddr,
    segment: Option<usize>,
}

/// The pooled buffers and headers of one `recvmmsg`: a buffer of
/// [`RECV_BYTES`] per message, each datagram split off the front of its
/// buffer, which is reclaimed for the next call once the library let go of
/// what it took (a fresh one is allocated only while it holds on).
struct RecvBatch {
    slots: Vec<BytesMut>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    controls: Vec<[u64; CONTROL_WORDS]>,
    hdrs: Vec<libc::mmsghdr>,
    /// Messages the next call offers the kernel.
    want: usize,
    /// Slots the last call handed out (to reclaim before the next).
    used: usize,
}

impl RecvBatch {
    fn new() -> Self {
        // SAFETY: sockaddr_storage, iovec and mmsghdr are plain data; all
        // zeroes is a valid value of each (null pointers, zero lengths).
        let (name, iov, hdr) = unsafe {
            (
                std::mem::zeroed::<libc::sockaddr_storage>(),
                std::mem::zeroed::<libc::iovec>(),
                std::mem::zeroed::<libc::mmsghdr>(),
            )
        };
        RecvBatch {
            slots: (0..RECV_BATCH).map(|_| BytesMut::new()).collect(),
            names: vec![name; RECV_BATCH],
            iovs: vec![iov; RECV_BATCH],
            controls: vec![[0; CONTROL_WORDS]; RECV_BATCH],
            hdrs: vec![hdr; RECV_BATCH],
            want: RECV_MIN,
            used: 0,
        }
    }

    /// One `recvmmsg` (non-blocking) of up to `want` messages; how many
    /// arrived, each then taken with [`take`](Self::take).
    fn recv(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        for slot in self.slots.iter_mut().take(self.used.max(self.want)) {
            reclaim(slot);
        }
        self.used = 0;
        let want = self.want.min(RECV_BATCH);
        for i in 0..want {
            let (Some(slot), Some(name), Some(iov), Some(control), Some(hdr)) = (
                self.slots.get_mut(i),
                self.names.get_mut(i),
                self.iovs.get_mut(i),
                self.controls.get_mut(i),
                self.hdrs.get_mut(i),
            ) else {
                break;
            };
            iov.iov_base = slot.spare_capacity_mut().as_mut_ptr().cast();
            iov.iov_len = slot.capacity() - slot.len();
            hdr.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
            hdr.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            hdr.msg_hdr.msg_iov = iov;
            hdr.msg_hdr.msg_iovlen = 1;
            hdr.msg_hdr.msg_control = control.as_mut_ptr().cast();
            hdr.msg_hdr.msg_controllen = std::mem::size_of_val(control) as _;
            hdr.msg_hdr.msg_flags = 0;
            hdr.msg_len = 0;
        }
        // SAFETY: the first `want` headers point at this batch's names,
        // iovecs (each over its slot's spare capacity) and control buffers,
        // all alive and unmoved for the call; the kernel writes only within
        // the lengths given.
        let rc = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                want as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = usize::try_from(rc).unwrap_or(0).min(want);
        self.used = got;
        self.want = if got == want {
            (want * 2).min(RECV_BATCH)
        } else if got * 2 < want {
            (want / 2).max(RECV_MIN)
        } else {
            want
        };
        Ok(got)
    }

    /// Message `i` of the last [`recv`](Self::recv), split off its slot;
    /// `None` if it was truncated or its source is of no known family.
    fn take(&mut self, i: usize) -> Option<Received> {
        if i >= self.used {
            return None;
        }
        let hdr = self.hdrs.get(i)?;
        let slot = self.slots.get_mut(i)?;
        let n = (hdr.msg_len as usize).min(slot.capacity() - slot.len());
        // SAFETY: the kernel wrote `n` bytes at the start of the slot's
        // spare capacity (its iovec), within that capacity.
        unsafe { slot.set_len(slot.len() + n) };
        let data = slot.split();
        if hdr.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return None;
        }
        let from = socket_addr(self.names.get(i)?)?;
        Some(Received {
            data,
            from,
            segment: gro_segment(&hdr.msg_hdr),
        })
    }
}

/// Makes `buf` an empty buffer with room for [`RECV_BYTES`]: its own
/// memory once the library let go of what was split off it, or a fresh one.
fn reclaim(buf: &mut BytesMut) {
    buf.clear();
    if !buf.try_reclaim(RECV_BYTES) {
        *buf = BytesMut::with_capacity(RECV_BYTES);
    }
}

/// The segment size of a GRO train, from a received message's control
/// messages (`UDP_GRO`); `None` for a single datagram.
fn gro_segment(msg: &libc::msghdr) -> Option<usize> {
    // SAFETY: `msg` is a header the kernel filled, its control pointer and
    // length describing the control messages it wrote; CMSG_FIRSTHDR and
    // CMSG_NXTHDR stay within them, and each data read is within its header.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(size).ok();
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    None
}

/// The address in `storage`, of family IPv4 or IPv6.
fn socket_addr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, and
            // sockaddr_storage is aligned and large enough for it.
            let sin =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A non-blocking UDP socket bound on `addr`, with SO_REUSEPORT if asked.
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::UdpSocket> {
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

/// Sets the int socket option `name` at `level` to `value`.
fn set_int(
    socket: &impl std::os::fd::AsRawFd,
    level: i32,
    name: i32,
    value: i32,
) -> io::Result<()> {
    set_opt(socket, level, name, &value)
}

/// Sets the socket option `name` at `level` to `value`, a plain value of
/// the type the option takes (the kernel copies its bytes).
pub(crate) fn set_opt<T>(
    socket: &impl std::os::fd::AsRawFd,
    level: i32,
    name: i32,
    value: &T,
) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to a live `T` of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
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

    /// Hands `conn` the oldest event the endpoint routed to it; true if
    /// there was one (a caller that polls the connection after each
    /// datagram sees each one's effect, such as a close before a reset).
    pub fn deliver_one(&self, conn: &mut Connection) -> bool {
        let event = {
            let mut routes = self.shared.routes.borrow_mut();
            routes
                .get_mut(&self.ch.0)
                .and_then(|r| r.events.pop_front())
        };
        match event {
            Some(event) => {
                conn.handle_event(event);
                true
            }
            None => false,
        }
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
            let datagrams = segment.map_or(1, |s| data.len().div_ceil(s.max(1))) as u64;
            loop {
                let res = send_batch(&self.shared.socket, data, t.destination, segment);
                shared.count(|io| {
                    io.send_calls += 1;
                    io.sent_datagrams += if res.is_ok() { datagrams } else { 0 };
                });
                match res {
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
                            let res = send_batch(&self.shared.socket, piece, t.destination, None);
                            shared.count(|io| {
                                io.send_calls += 1;
                                io.sent_datagrams += u64::from(res.is_ok());
                            });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{DriverKind, block_on, io_uring_available};

    fn drivers() -> Vec<DriverKind> {
        let mut kinds = vec![DriverKind::Legacy];
        if io_uring_available() {
            kinds.push(DriverKind::IoUring);
        }
        kinds
    }

    /// Runs a client endpoint, lets `send` queue datagrams at its socket
    /// before its receive task starts, and returns the endpoint's counts
    /// once it took `datagrams` of them, with the datagrams it dropped.
    fn receive(
        kind: DriverKind,
        datagrams: u64,
        send: impl FnOnce(&std::net::UdpSocket, SocketAddr),
    ) -> (IoCounts, u64, bool) {
        block_on(kind, |_| async move {
            let server = SocketAddr::from(([127, 0, 0, 1], 9));
            let endpoint = Endpoint::client(server, Clock::new()).expect("client endpoint");
            endpoint.set_batch_receive(true);
            let to = SocketAddr::from(([127, 0, 0, 1], endpoint.local_addr().port()));
            let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("peer socket");
            send(&peer, to);
            monoio::spawn(endpoint.clone().run());
            for _ in 0..2000 {
                if endpoint.io_counts().recv_datagrams >= datagrams {
                    break;
                }
                monoio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            // The receive task's next round finds nothing more.
            monoio::time::sleep(std::time::Duration::from_millis(20)).await;
            endpoint.stop();
            (endpoint.io_counts(), endpoint.dropped(), endpoint.gro())
        })
        .expect("runtime")
    }

    #[test]
    fn queued_datagrams_arrive_in_fewer_calls_than_datagrams() {
        const K: u64 = 20;
        for kind in drivers() {
            let (io, dropped, _) = receive(kind, K, |peer, to| {
                for i in 0..K {
                    // Not QUIC (the fixed bit is clear): each is dropped.
                    peer.send_to(&[0, i as u8, 2, 3, 4, 5, 6, 7], to)
                        .expect("send");
                }
            });
            assert_eq!(io.recv_datagrams, K, "{kind:?}");
            assert_eq!(dropped, K, "{kind:?}");
            // Batches of 4, then 8, then the last 8 of an offered 16.
            assert_eq!(io.recv_calls, 3, "{kind:?}: {io:?}");
            assert_eq!(io.send_calls, 0, "{kind:?}");
        }
    }

    #[test]
    fn a_gro_train_is_split_into_its_datagrams() {
        // One GSO send of ten datagrams, 100 bytes each but the last (50).
        const SEGMENTS: u64 = 10;
        for kind in drivers() {
            let (io, dropped, gro) = receive(kind, SEGMENTS, |peer, to| {
                let data = vec![0u8; 100 * 9 + 50];
                send_batch(peer, &data, to, Some(100)).expect("gso send");
            });
            assert_eq!(io.recv_datagrams, SEGMENTS, "{kind:?}");
            assert_eq!(dropped, SEGMENTS, "{kind:?}");
            // Coalesced, the train is one message of one call; segmented
            // by the kernel, ten messages in calls of 4, then 8.
            let calls = if gro { 1 } else { 2 };
            assert_eq!(io.recv_calls, calls, "{kind:?} (gro {gro}): {io:?}");
        }
    }
}
