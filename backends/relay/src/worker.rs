//! One worker thread: its own monoio runtime and SO_REUSEPORT listener, an
//! accept loop that enforces the per-thread connection limit, one task per
//! connection running the [`ConnectionHandler`], and the drain on stop.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, TcpListener as StdTcpListener};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use monoio::io::Canceller;
use monoio::net::TcpListener;

use skiff_monoio::buffers::give_back_memory;
use skiff_monoio::cancel::{cancel_on, is_cancelled, race};
use skiff_monoio::driver::{self, ActiveDriver};
use skiff_monoio::session_driver::HandshakeToken;
use skiff_monoio::shutdown::{LocalEvent, Shutdown, StopReceiver};

use crate::config::RelayConfig;
use crate::conn::{BufPool, Connection, ProxyRead, WorkerShared};
use crate::conn_name::ConnName;
use crate::handler::{ConnectionHandler, WorkerInfo};
use crate::metrics::{Metrics, TransportLabel};

/// Pause after an accept error such as EMFILE, so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(20);
/// Time given to cancelled operations and closes to complete after a forced stop.
const FORCED_CLOSE_GRACE: Duration = Duration::from_millis(20);

/// Counts a connection open (in all and, once
/// [`OpenGuard::count_by_address`] named it, for its peer's address) for
/// as long as its task lives, and names it for the worker's log lines.
struct OpenGuard {
    shared: Rc<WorkerShared>,
    name: ConnName,
    /// Whether the connection counts for the address of `name`: not while
    /// a load balancer's connection waits for its PROXY header.
    by_address: bool,
}

impl OpenGuard {
    /// Counts a connection open, not yet for its address
    /// ([`OpenGuard::count_by_address`]).
    fn new(shared: Rc<WorkerShared>, name: ConnName) -> Self {
        shared.open.set(shared.open.get().saturating_add(1));
        shared.counters().connection_opened();
        OpenGuard {
            shared,
            name,
            by_address: false,
        }
    }

    /// Names the connection `name` and counts it for its address (once);
    /// returns the address's handshake count.
    fn count_by_address(&mut self, name: ConnName) -> Rc<Cell<u32>> {
        self.uncount_address();
        self.name = name;
        self.by_address = true;
        let ip = address(name);
        let mut per_ip = self.shared.per_ip.borrow_mut();
        let entry = per_ip.entry(ip).or_default();
        entry.open = entry.open.saturating_add(1);
        entry.handshakes.clone()
    }

    /// Takes the connection out of its address's count, if it is in it.
    fn uncount_address(&mut self) {
        if !std::mem::take(&mut self.by_address) {
            return;
        }
        let mut per_ip = self.shared.per_ip.borrow_mut();
        let ip = address(self.name);
        if let Some(a) = per_ip.get_mut(&ip) {
            a.open = a.open.saturating_sub(1);
            if a.open == 0 {
                per_ip.remove(&ip);
            }
        }
    }

    /// What the worker's log lines call the connection.
    fn name(&self) -> &ConnName {
        &self.name
    }
}

/// The address a client connection is counted under.
fn address(name: ConnName) -> IpAddr {
    name.peer()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip())
}

/// Connections closed since the allocator was last asked to give memory
/// back, past which a close asks again ([`give_back_memory`]): a flood of
/// short connections leaves many small frees behind.
const CLOSES_PER_TRIM: u32 = 256;

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.uncount_address();
        let s = &self.shared;
        s.open.set(s.open.get().saturating_sub(1));
        let closes = s.closes_since_trim.get() + 1;
        if closes >= CLOSES_PER_TRIM && s.open.get() < closes {
            // Most of what those connections held is free now.
            s.closes_since_trim.set(0);
            give_back_memory();
        } else {
            s.closes_since_trim.set(closes);
        }
        s.counters().connection_closed();
        if s.shutdown.is_fired() {
            s.closed.notify();
        }
    }
}

/// Counts a QUIC connection open for as long as its task lives.
struct QuicOpen(Rc<WorkerShared>);

impl QuicOpen {
    fn new(shared: Rc<WorkerShared>) -> Self {
        shared.counters().quic_opened();
        shared.counters().transport_opened(TransportLabel::Quic);
        QuicOpen(shared)
    }
}

impl Drop for QuicOpen {
    fn drop(&mut self) {
        self.0.counters().quic_closed();
        self.0.counters().transport_closed(TransportLabel::Quic);
    }
}

/// How often a worker copies its QUIC endpoint's counters (datagrams
/// dropped, Retry packets sent) to its metrics.
const QUIC_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Everything a worker thread is started with.
pub(crate) struct WorkerSetup<F> {
    pub(crate) index: usize,
    pub(crate) listener: StdTcpListener,
    /// The worker's UDP socket for QUIC, if the relay serves QUIC.
    pub(crate) quic: Option<QuicSocket>,
    pub(crate) stop: StopReceiver,
    pub(crate) config: Arc<RelayConfig>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) make_handler: Arc<F>,
    /// Reports `(index, Ok(driver))` once accepting, or the start error;
    /// taken (and dropped) by the first report.
    pub(crate) ready: Option<ReadySender>,
}

/// A worker's socket of the QUIC group the server bound
/// (`skiff_monoio::reuseport::bind_group`): number `index` of `workers`.
pub(crate) struct QuicSocket {
    pub(crate) socket: std::net::UdpSocket,
    pub(crate) workers: usize,
}

/// Where a worker reports that it accepts (or why it could not start).
pub(crate) type ReadySender = Sender<(usize, io::Result<ActiveDriver>)>;

/// Sends the one start report, if not sent yet; the sender is dropped after,
/// so the server notices a worker that died before reporting.
fn report(ready: &Cell<Option<ReadySender>>, index: usize, r: io::Result<ActiveDriver>) {
    if let Some(tx) = ready.take() {
        let _ = tx.send((index, r));
    }
}

/// What a worker did, reported when its thread ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerExit {
    /// Worker index.
    pub index: usize,
    /// Connections still open when the drain timeout ran out (0 = clean drain).
    pub forced: u32,
}

/// Runs a worker on the calling thread until it is stopped and drained.
pub(crate) fn run<F, H>(mut setup: WorkerSetup<F>) -> io::Result<WorkerExit>
where
    F: Fn(&WorkerInfo) -> H + Send + Sync + 'static,
    H: ConnectionHandler,
{
    let index = setup.index;
    let ready = Rc::new(Cell::new(setup.ready.take()));
    let kind = setup.config.driver;
    let ready2 = ready.clone();
    let res = driver::block_on(kind, move |active| serve(setup, active, ready2));
    match res {
        Ok(r) => r,
        Err(e) => {
            // The runtime itself could not be built: `serve` never ran.
            report(&ready, index, Err(io::Error::new(e.kind(), e.to_string())));
            Err(e)
        }
    }
}

async fn serve<F, H>(
    setup: WorkerSetup<F>,
    active: ActiveDriver,
    ready: Rc<Cell<Option<ReadySender>>>,
) -> io::Result<WorkerExit>
where
    F: Fn(&WorkerInfo) -> H + Send + Sync + 'static,
    H: ConnectionHandler,
{
    let WorkerSetup {
        index,
        listener,
        quic,
        stop,
        config,
        metrics,
        make_handler,
        ready: _,
    } = setup;
    metrics.thread(index).set_driver(active);
    tracing::info!(
        worker = index,
        driver = active.name(),
        "worker runtime started on the {active} driver"
    );

    // epoll needs a non-blocking listener; io_uring a blocking one (it honours O_NONBLOCK).
    let listener = match listener
        .set_nonblocking(active == ActiveDriver::Legacy)
        .and_then(|()| TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            report(&ready, index, Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
    };

    let shared = Rc::new(WorkerShared {
        index,
        config: config.clone(),
        metrics,
        shutdown: LocalEvent::new(),
        force: LocalEvent::new(),
        closed: LocalEvent::new(),
        open: Cell::new(0),
        per_ip: RefCell::new(HashMap::new()),
        proxied: RefCell::new(HashMap::new()),
        handshaking: Rc::new(Cell::new(0)),
        closes_since_trim: Cell::new(0),
        next_id: Cell::new(0),
        pool: BufPool::new(),
    });
    let info = WorkerInfo {
        index,
        driver: active,
        config: config.clone(),
        shutdown: Shutdown::new(shared.shutdown.clone()),
        metrics: shared.metrics.clone(),
    };
    let handler = Rc::new(make_handler(&info));

    // The stop pipe: EOF means stop accepting and drain.
    let stop_event = shared.shutdown.clone();
    monoio::spawn(async move {
        if let Err(e) = stop.stopped().await {
            tracing::error!(worker = index, error = %e, "stop pipe failed; stopping");
        }
        stop_event.fire();
    });

    report(&ready, index, Ok(active));
    drop(ready);
    let quic = quic.and_then(|socket| start_quic(socket, &shared, &handler));
    accept_loop(&listener, active, &shared, &handler).await;
    if let Some((endpoint, _)) = &quic {
        // New QUIC connections are refused from now on; the endpoint goes on
        // routing the open ones' datagrams until the worker ends.
        endpoint.refuse_new();
    }
    drop(listener);
    shared.counters().set_draining();

    // Drain: wait for handlers to finish, up to the drain timeout.
    let open = shared.open.get();
    let drained = if open == 0 {
        true
    } else {
        tracing::info!(
            worker = index,
            open,
            "draining connections (up to {:?})",
            config.drain_timeout
        );
        let wait_idle = async {
            while shared.open.get() > 0 {
                shared.closed.wait().await;
            }
        };
        monoio::time::timeout(config.drain_timeout, wait_idle)
            .await
            .is_ok()
    };
    let forced = shared.open.get();
    if !drained {
        tracing::warn!(
            worker = index,
            open = forced,
            "drain timeout; closing remaining connections"
        );
        shared.force.fire();
        // Dropped handler futures cancel their I/O and close their sockets;
        // give those completions a moment to be processed.
        monoio::time::sleep(FORCED_CLOSE_GRACE).await;
    }
    if let Some((endpoint, accepting)) = quic {
        endpoint.stop();
        // The accept loop ends at the stop and drops its handler before the
        // runtime does: the relay's state is then freed on a running
        // runtime (freeing it wakes the tasks that follow its tracks, which
        // a runtime being torn down refuses).
        accepting.await;
    }
    tracing::info!(worker = index, "worker stopped");
    Ok(WorkerExit { index, forced })
}

async fn accept_loop<H: ConnectionHandler>(
    listener: &TcpListener,
    active: ActiveDriver,
    shared: &Rc<WorkerShared>,
    handler: &Rc<H>,
) {
    let index = shared.index;
    let mut canceller = Canceller::new();
    loop {
        if shared.shutdown.is_fired() {
            return;
        }
        let accepted = cancel_on(&shared.shutdown, &mut canceller, |h| {
            listener.cancelable_accept(h)
        })
        .await;
        match accepted {
            Ok((stream, peer)) => admit(stream, peer, shared, handler),
            Err(e) if is_cancelled(&e) => return,
            Err(e) => {
                shared.counters().accept_error();
                tracing::warn!(worker = index, error = %e, "accept failed");
                monoio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        }
        // The rest of the listen queue, at once: an accept that waits for
        // the runtime's next turn takes one connection per turn, and a
        // worker busy with thousands of sessions would then let its
        // backlog overflow (each dropped SYN costs the client a second or
        // more) while it has the time to admit them.
        for _ in 1..ACCEPT_BATCH {
            if shared.shutdown.is_fired() {
                return;
            }
            match accept_queued(listener, active) {
                Ok(Some((stream, peer))) => admit(stream, peer, shared, handler),
                Ok(None) => break,
                Err(e) => {
                    shared.counters().accept_error();
                    tracing::warn!(worker = index, error = %e, "accept failed");
                    break;
                }
            }
        }
    }
}

/// Connections one turn of the accept loop takes from the listen queue at most.
const ACCEPT_BATCH: usize = 64;

/// Takes a connection already waiting in `listener`'s queue, if any, without
/// waiting: `poll` with no timeout, then `accept4` (a worker's listener is
/// its own, `SO_REUSEPORT`, so nothing else takes the connection between
/// the two). The socket is made as the driver wants it: non-blocking for
/// epoll, blocking for io_uring (which honours `O_NONBLOCK`), as the
/// listener is.
fn accept_queued(
    listener: &TcpListener,
    active: ActiveDriver,
) -> io::Result<Option<(monoio::net::TcpStream, std::net::SocketAddr)>> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let fd = listener.as_raw_fd();
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `poll` is one live pollfd and the count passed is 1; the
    // listener's descriptor stays open while `listener` is borrowed.
    let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
    if ready <= 0 || poll.revents & libc::POLLIN == 0 {
        return Ok(None);
    }
    let flags = if active == ActiveDriver::Legacy {
        libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK
    } else {
        libc::SOCK_CLOEXEC
    };
    // SAFETY: null address pointers ask for no peer address (read below from
    // the socket); the descriptor is the listener's, open while borrowed.
    let conn = unsafe { libc::accept4(fd, std::ptr::null_mut(), std::ptr::null_mut(), flags) };
    if conn < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            // The peer gave up while queued: nothing to admit.
            io::ErrorKind::ConnectionAborted => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: `conn` is a socket accept4 just returned, owned by nothing else.
    let std = unsafe { std::net::TcpStream::from_raw_fd(conn) };
    let peer = std.peer_addr()?;
    let stream = monoio::net::TcpStream::from_std(std)?;
    Ok(Some((stream, peer)))
}

/// Runs this worker's QUIC endpoint on its socket of the group the server
/// bound on UDP at the TCP listeners' port, if the handler has a
/// certificate for it (the socket is dropped otherwise), and spawns its
/// receive task and its accept loop (which ends once the endpoint stops).
/// The endpoint's connection IDs name the worker (docs/protocol.md §11.8).
fn start_quic<H: ConnectionHandler>(
    quic: QuicSocket,
    shared: &Rc<WorkerShared>,
    handler: &Rc<H>,
) -> Option<(skiff_monoio::quic::Endpoint, monoio::task::JoinHandle<()>)> {
    if !shared.config.quic {
        return None;
    }
    let config = handler.quic_config()?;
    let clock = skiff_monoio::clock::Clock::new();
    let QuicSocket { socket, workers } = quic;
    let endpoint = match skiff_monoio::quic::Endpoint::worker(
        socket,
        shared.index,
        workers,
        config,
        clock,
    ) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(worker = shared.index, error = %e, "QUIC endpoint not started: TCP only");
            return None;
        }
    };
    endpoint.set_gso(shared.config.quic_gso);
    endpoint.retry_above(shared.config.quic_retry_above, shared.handshaking.clone());
    {
        // Over a limit: refused before the endpoint keeps any state or
        // starts a TLS handshake for the address.
        let shared = shared.clone();
        endpoint.admit_with(move |peer| match over_limit(&shared, peer) {
            Some(quota) => {
                refuse(&shared, peer, quota, "QUIC connection refused");
                false
            }
            None => true,
        });
    }
    tracing::info!(worker = shared.index, addr = %endpoint.local_addr(), "QUIC (moql://) on UDP");
    monoio::spawn(endpoint.clone().run());
    {
        // The endpoint's counters reach the metrics until the worker drains.
        let (endpoint, shared) = (endpoint.clone(), shared.clone());
        monoio::spawn(async move {
            loop {
                let c = shared.counters();
                c.set_quic_endpoint(endpoint.dropped(), endpoint.retries());
                c.set_quic_bytes(endpoint.sent_bytes(), endpoint.received_bytes());
                let io = endpoint.io_counts();
                c.set_quic_io(
                    io.recv_calls,
                    io.recv_datagrams,
                    io.send_calls,
                    io.sent_datagrams,
                );
                if race(
                    monoio::time::sleep(QUIC_SAMPLE_EVERY),
                    shared.shutdown.wait(),
                )
                .await
                .is_err()
                {
                    return;
                }
            }
        });
    }
    let (accepting, shared, handler) = (endpoint.clone(), shared.clone(), handler.clone());
    let accept_loop = monoio::spawn(async move {
        while let Some((conn, link, peer)) = accepting.accept().await {
            admit_quic(conn, link, peer, &shared, &handler);
        }
    });
    Some((endpoint, accept_loop))
}

/// [`admit`] for a connection the QUIC endpoint accepted: the same limits
/// and quotas, counted the same way.
fn admit_quic<H: ConnectionHandler>(
    conn: skiff_quic::quinn_proto::Connection,
    link: skiff_monoio::quic::Link,
    peer: std::net::SocketAddr,
    shared: &Rc<WorkerShared>,
    handler: &Rc<H>,
) {
    let index = shared.index;
    if let Some(quota) = over_limit(shared, peer) {
        // Several accepted at once from one address, past its quota: the
        // endpoint's check ([`start_quic`]) came before the first of them
        // counted. Dropping the connection and its link forgets it; the
        // client's handshake times out.
        refuse(shared, peer, quota, "QUIC connection refused");
        drop((conn, link));
        return;
    }
    let id = shared.next_id.get();
    shared.next_id.set(id.wrapping_add(1));
    let name = ConnName::quic(index, id, peer);
    let mut guard = OpenGuard::new(shared.clone(), name);
    let quic_open = QuicOpen::new(shared.clone());
    let mut handshake = HandshakeToken::new(shared.handshaking.clone());
    handshake.count_also(guard.count_by_address(name));
    let quic = crate::handler::QuicConn {
        conn: Box::new(conn),
        link,
        peer,
        name,
        shutdown: Shutdown::new(shared.shutdown.clone()),
        handshake,
        handshake_timeout: shared.config.timeouts.handshake,
        send_budget: shared.config.quic_send_budget,
    };
    let handler = handler.clone();
    let force = shared.force.clone();
    tracing::debug!(conn = ?name, "QUIC connection accepted");
    monoio::spawn(async move {
        let _quic_open = quic_open;
        let name = guard.name();
        match race(handler.serve_quic(quic), force.wait()).await {
            Ok(Ok(())) => tracing::debug!(conn = ?name, "connection finished"),
            Ok(Err(e)) => {
                tracing::debug!(conn = ?name, error = %e, "connection ended with an error")
            }
            Err(()) => tracing::debug!(conn = ?name, "connection closed by the drain timeout"),
        }
    });
}

/// The limit or quota a new connection from `peer` (TCP or QUIC) would go
/// past, if any: the worker's, then its address's.
fn over_limit(shared: &WorkerShared, peer: std::net::SocketAddr) -> Option<&'static str> {
    over_worker_limit(shared).or_else(|| over_address_limit(shared, peer.ip()))
}

/// The worker's limit a new connection would go past, if any, whatever
/// its address.
fn over_worker_limit(shared: &WorkerShared) -> Option<&'static str> {
    if shared.shutdown.is_fired() || shared.open.get() >= shared.config.limits.max_connections {
        Some("max-connections")
    } else if shared.handshaking.get() >= shared.config.quotas.handshakes {
        Some("max-handshakes")
    } else {
        None
    }
}

/// The per-address quota a new connection from `ip` would go past, if any:
/// its open connections (`--max-connections-per-ip`, off by default) or
/// those still in their handshake (`--max-handshakes-per-ip`).
fn over_address_limit(shared: &WorkerShared, ip: IpAddr) -> Option<&'static str> {
    let quotas = shared.config.quotas;
    let per_ip = shared.per_ip.borrow();
    let (open, handshakes) = per_ip
        .get(&ip)
        .map_or((0, 0), |a| (a.open, a.handshakes.get()));
    if quotas.connections_per_ip.is_some_and(|n| open >= n) {
        Some("max-connections-per-ip")
    } else if handshakes >= quotas.handshakes_per_ip {
        Some("max-handshakes-per-ip")
    } else {
        None
    }
}

/// Counts and logs a connection refused for going past `quota` (a quota
/// refusal unless it is the worker's connection limit).
fn refuse(shared: &WorkerShared, peer: std::net::SocketAddr, quota: &'static str, what: &str) {
    shared.counters().connection_refused();
    if quota != "max-connections" {
        shared.counters().add_quota_refused();
    }
    tracing::debug!(worker = shared.index, %peer, quota, "{what}");
}

/// Admits an accepted connection within the worker's limits and quotas (or
/// closes it at once) and spawns its handler.
fn admit<H: ConnectionHandler>(
    stream: monoio::net::TcpStream,
    peer: std::net::SocketAddr,
    shared: &Rc<WorkerShared>,
    handler: &Rc<H>,
) {
    let index = shared.index;
    if shared.config.proxy_protocol_from.contains(peer.ip()) {
        admit_proxied(stream, peer, shared, handler);
        return;
    }
    if let Some(limit) = over_limit(shared, peer) {
        // Over a limit (or the accept raced the stop): close at once.
        refuse(shared, peer, limit, "connection refused");
        drop(stream);
        return;
    }
    let id = shared.next_id.get();
    shared.next_id.set(id.wrapping_add(1));
    let name = ConnName::client(index, id, peer);
    let mut guard = OpenGuard::new(shared.clone(), name);
    let mut conn = Connection::new(stream, peer, id, shared.clone());
    conn.count_handshake_in(guard.count_by_address(name));
    let handler = handler.clone();
    let force = shared.force.clone();
    tracing::debug!(conn = ?name, "connection accepted");
    monoio::spawn(async move {
        // The task holds the whole guard until it ends (a method call
        // captures it all), and names the connection with it (as accepted:
        // its socket's transport): a copy of the name, or the guard moved
        // to a local, would grow every connection's task.
        let name = guard.name();
        match race(handler.serve(conn), force.wait()).await {
            Ok(Ok(())) => tracing::debug!(conn = ?name, "connection finished"),
            Ok(Err(e)) => {
                tracing::debug!(conn = ?name, error = %e, "connection ended with an error")
            }
            Err(()) => tracing::debug!(conn = ?name, "connection closed by the drain timeout"),
        }
    });
}

/// [`admit`] for a connection from a load balancer of
/// `--proxy-protocol-from`: within the worker's limits it is accepted, its
/// PROXY header read (within the handshake timeout), and only then counted
/// and limited by the address the header names, under which it is logged
/// and served. A header that does not parse closes the connection and
/// counts as a refusal.
fn admit_proxied<H: ConnectionHandler>(
    stream: monoio::net::TcpStream,
    balancer: std::net::SocketAddr,
    shared: &Rc<WorkerShared>,
    handler: &Rc<H>,
) {
    let index = shared.index;
    if let Some(limit) = over_worker_limit(shared) {
        refuse(shared, balancer, limit, "connection refused");
        drop(stream);
        return;
    }
    let id = shared.next_id.get();
    shared.next_id.set(id.wrapping_add(1));
    // Named by the balancer's address until the header names the client.
    let mut guard = OpenGuard::new(shared.clone(), ConnName::client(index, id, balancer));
    let mut conn = Connection::new(stream, balancer, id, shared.clone());
    let (handler, shared) = (handler.clone(), shared.clone());
    let force = shared.force.clone();
    monoio::spawn(async move {
        let serve = async {
            let client = match conn.read_proxy_header().await {
                Ok(Some(client)) => client,
                Ok(None) => {
                    tracing::debug!(conn = ?guard.name(), "no PROXY header in time; connection closed");
                    return Ok(());
                }
                Err(ProxyRead::Malformed(e)) => {
                    shared.counters().connection_refused();
                    tracing::info!(conn = ?guard.name(), error = %e, "PROXY header refused; connection closed");
                    return Ok(());
                }
                Err(ProxyRead::Io(e)) => {
                    tracing::debug!(conn = ?guard.name(), error = %e, "PROXY header not read");
                    return Ok(());
                }
            };
            if let Some(quota) = over_address_limit(&shared, client.ip()) {
                refuse(&shared, client, quota, "connection refused");
                return Ok(());
            }
            let count = guard.count_by_address(ConnName::client(index, id, client));
            conn.count_handshake_in(count);
            if client != balancer {
                shared.proxied.borrow_mut().insert(id, client);
            }
            tracing::debug!(conn = ?guard.name(), %balancer, "connection accepted through a PROXY header");
            handler.serve(conn).await
        };
        match race(serve, force.wait()).await {
            Ok(Ok(())) => tracing::debug!(conn = ?guard.name(), "connection finished"),
            Ok(Err(e)) => {
                tracing::debug!(conn = ?guard.name(), error = %e, "connection ended with an error")
            }
            Err(()) => {
                tracing::debug!(conn = ?guard.name(), "connection closed by the drain timeout")
            }
        }
        shared.proxied.borrow_mut().remove(&id);
    });
}
