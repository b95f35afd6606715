//! Starting and stopping the thread-per-core server.
//!
//! [`start`] binds one SO_REUSEPORT listener per worker on the calling thread
//! (so bind errors and port 0 resolve before anything runs), and one UDP
//! socket per worker for QUIC, in worker order (the kernel numbers a
//! reuseport group by bind order, which the QUIC steering relies on), starts the
//! metrics endpoint, spawns the workers and waits until each one accepts.
//! The returned [`ServerHandle`] stops the server and waits for the drain.

use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use socket2::{Domain, Protocol, Socket, Type};

use skiff_monoio::driver::ActiveDriver;
use skiff_monoio::shutdown::StopTrigger;

use crate::config::RelayConfig;
use crate::error::RelayError;
use crate::handler::{ConnectionHandler, WorkerInfo};
use crate::metrics::{Metrics, MetricsServer};
use crate::worker::{self, QuicSocket, WorkerExit, WorkerSetup};

/// Stack of each worker thread.
const WORKER_STACK_BYTES: usize = 8 << 20;

/// Listen backlog of each worker's socket.
pub const LISTEN_BACKLOG: i32 = 1024;

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    local_addr: SocketAddr,
    drivers: Vec<ActiveDriver>,
    metrics: Arc<Metrics>,
    metrics_server: Option<MetricsServer>,
    trigger: Arc<StopTrigger>,
    workers: Vec<JoinHandle<io::Result<WorkerExit>>>,
    /// The workers' QUIC sockets, held until every worker has stopped.
    quic_group: Vec<UdpSocket>,
}

/// How the server ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerReport {
    /// One entry per worker, in index order.
    pub workers: Vec<WorkerExit>,
}

impl ServerReport {
    /// Connections closed by the drain timeout rather than by their handler.
    pub fn forced(&self) -> u32 {
        self.workers.iter().map(|w| w.forced).sum()
    }
}

/// Binds a listening socket with SO_REUSEPORT so every worker can bind the
/// same address, and with `send_buffer` set, the SO_SNDBUF every accepted
/// connection inherits (bounding the kernel memory a peer that stopped
/// reading can hold; unset, the kernel autotunes up to `net.ipv4.tcp_wmem`'s
/// maximum).
///
/// # Errors
/// The socket cannot be created, configured, bound or put into listen
/// state, or the buffer size cannot be set.
pub fn bind_reuseport_with(
    addr: SocketAddr,
    send_buffer: Option<usize>,
) -> io::Result<StdTcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if let Some(n) = send_buffer {
        socket.set_send_buffer_size(n)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// Starts `config.threads` workers, each serving connections with the
/// handler `make_handler` builds on that thread, and the metrics endpoint
/// if configured. Returns once every worker accepts.
///
/// # Errors
/// [`RelayError::Listen`], [`RelayError::Metrics`], [`RelayError::Spawn`],
/// or [`RelayError::Worker`] if a runtime could not start (the others are
/// stopped again before returning).
pub fn start<F, H>(config: RelayConfig, make_handler: F) -> Result<ServerHandle, RelayError>
where
    F: Fn(&WorkerInfo) -> H + Send + Sync + 'static,
    H: ConnectionHandler,
{
    let threads = config.threads.get();
    let listen_err = |source| RelayError::Listen {
        addr: config.listen,
        source,
    };

    // Bind the first socket to learn the real address (port 0), then the rest on it.
    let send_buffer = config
        .send_buffer
        .map(|b| usize::try_from(b).unwrap_or(usize::MAX));
    let bind_tcp = || -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
        let first = bind_reuseport_with(config.listen, send_buffer)?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..threads {
            listeners.push(bind_reuseport_with(local_addr, send_buffer)?);
        }
        Ok((listeners, local_addr))
    };
    let metrics = Arc::new(Metrics::new(threads));
    let serves_quic = config.quic && config.tls_source().is_some();
    let ((listeners, local_addr), quic_sockets) = bind_twins(
        config.listen.port() == 0,
        bind_tcp,
        |(_, addr): &(Vec<std::net::TcpListener>, SocketAddr)| {
            if serves_quic {
                skiff_monoio::reuseport::bind_group(*addr, threads)
            } else {
                Ok(Vec::new())
            }
        },
    )
    .map_err(listen_err)?;
    let quic_sockets = match quic_sockets {
        Ok(group) => steer_quic(group, threads, &metrics),
        Err(e) => {
            tracing::error!(addr = %local_addr, error = %e, "QUIC sockets not bound: TCP only");
            Vec::new()
        }
    };
    // The server keeps a descriptor of each socket until every worker has
    // stopped: a worker that ends first would otherwise leave the group
    // (the kernel renumbers it), and the datagrams of a worker still
    // draining would go astray.
    let quic_group: Vec<UdpSocket> = quic_sockets
        .iter()
        .filter_map(|s| s.try_clone().ok())
        .collect();
    let mut quic_sockets = quic_sockets.into_iter();
    let metrics_server = match config.metrics {
        Some(addr) => Some(
            MetricsServer::start(addr, metrics.clone())
                .map_err(|source| RelayError::Metrics { addr, source })?,
        ),
        None => None,
    };

    let (trigger, receivers) = StopTrigger::new(threads).map_err(RelayError::Spawn)?;
    let trigger = Arc::new(trigger);
    // One Hop ID for the whole relay: its workers are one node of a cluster.
    // The workers see the address bound (port 0 resolved): the recorder dials it.
    let config = Arc::new(RelayConfig {
        listen: local_addr,
        cluster_id: Some(config.hop_id()),
        ..config
    });
    let make_handler = Arc::new(make_handler);
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut workers = Vec::with_capacity(threads);
    for (index, (listener, stop)) in listeners.into_iter().zip(receivers).enumerate() {
        let setup = WorkerSetup {
            index,
            listener,
            quic: quic_sockets.next().map(|socket| QuicSocket {
                socket,
                workers: threads,
            }),
            stop,
            config: config.clone(),
            metrics: metrics.clone(),
            make_handler: make_handler.clone(),
            ready: Some(ready_tx.clone()),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("skiff-worker-{index}"))
            // Room for a trunk session's tables while they are made (see
            // `storage::TrunkStorage`); only what is used is mapped.
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || worker::run(setup));
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                trigger.stop();
                join_all(workers);
                return Err(RelayError::Spawn(e));
            }
        }
    }
    drop(ready_tx);

    let mut drivers = vec![ActiveDriver::Legacy; threads];
    let mut failure = None;
    for _ in 0..threads {
        match ready_rx.recv() {
            Ok((i, Ok(d))) => {
                if let Some(slot) = drivers.get_mut(i) {
                    *slot = d;
                }
            }
            Ok((i, Err(source))) => {
                failure.get_or_insert(RelayError::Worker { worker: i, source });
            }
            Err(_) => {
                // A worker ended without reporting: it panicked.
                failure.get_or_insert(RelayError::Worker {
                    worker: usize::MAX,
                    source: io::Error::other("worker exited before it was ready"),
                });
                break;
            }
        }
    }
    if let Some(e) = failure {
        trigger.stop();
        join_all(workers);
        return Err(e);
    }
    tracing::info!(addr = %local_addr, threads, "listening on {local_addr}");
    Ok(ServerHandle {
        local_addr,
        drivers,
        metrics,
        metrics_server,
        trigger,
        workers,
        quic_group,
    })
}

/// How many port numbers a relay told to listen on port 0 tries for TCP
/// listeners whose UDP twin (QUIC, the same port number) is free too.
const PORT_TRIES: usize = 64;

/// Binds the TCP listeners (`bind_tcp`), then the workers' UDP sockets for
/// QUIC on the same port number (`bind_udp`: an empty group if the relay
/// serves no QUIC). With `any_port` (the configuration asked for port 0),
/// a port whose UDP number something else holds is let go and another one
/// tried, up to [`PORT_TRIES`] times: a relay on an ephemeral port serves
/// QUIC beside TCP however many UDP sockets the host has open. With a port
/// given, or once the tries are spent, the UDP error is returned beside the
/// listeners (the relay then serves TCP alone).
///
/// # Errors
/// What `bind_tcp` returns.
fn bind_twins<T, U>(
    any_port: bool,
    mut bind_tcp: impl FnMut() -> io::Result<T>,
    mut bind_udp: impl FnMut(&T) -> io::Result<U>,
) -> io::Result<(T, io::Result<U>)> {
    let mut tries = 1;
    loop {
        let tcp = bind_tcp()?;
        match bind_udp(&tcp) {
            Err(e) if any_port && tries < PORT_TRIES => {
                tracing::debug!(error = %e, "UDP twin of the chosen port taken: another port");
                tries += 1;
            }
            udp => return Ok((tcp, udp)),
        }
    }
}

/// Steers the datagrams of the workers' UDP `group` by connection ID
/// (docs/protocol.md §11.8); a filter the kernel refuses leaves the
/// kernel's choice by address, logged and shown as
/// `skiff_relay_quic_steering 0`.
fn steer_quic(group: Vec<UdpSocket>, threads: usize, metrics: &Metrics) -> Vec<UdpSocket> {
    if group.is_empty() {
        return group;
    }
    let steered = if threads == 1 {
        // One socket gets every datagram.
        true
    } else {
        match group
            .first()
            .map(|s| skiff_monoio::reuseport::steer_by_connection_id(s, threads))
        {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                tracing::warn!(
                    error = %e,
                    "QUIC connection-ID steering unavailable: the kernel picks a worker by \
                     address, and a client whose address changes loses its connection"
                );
                false
            }
            None => false,
        }
    };
    metrics.set_quic_steering(steered);
    group
}

fn join_all(workers: Vec<JoinHandle<io::Result<WorkerExit>>>) {
    for w in workers {
        let _ = w.join();
    }
}

impl ServerHandle {
    /// The address every worker listens on (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The metrics endpoint's address, if one runs.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(MetricsServer::local_addr)
    }

    /// The live counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The driver each worker runs on, by index.
    pub fn drivers(&self) -> &[ActiveDriver] {
        &self.drivers
    }

    /// A trigger that stops the server from any thread (e.g. a signal thread).
    pub fn stop_trigger(&self) -> Arc<StopTrigger> {
        self.trigger.clone()
    }

    /// Stops accepting and tells handlers to drain; returns at once.
    pub fn stop(&self) {
        self.trigger.stop();
    }

    /// Waits until every worker has stopped (after [`ServerHandle::stop`],
    /// or a stop through the trigger). Each worker gives its connections at
    /// most the drain timeout.
    ///
    /// # Errors
    /// [`RelayError::WorkerPanicked`], or [`RelayError::Worker`] if a worker failed.
    pub fn wait(mut self) -> Result<ServerReport, RelayError> {
        let mut exits = Vec::with_capacity(self.workers.len());
        let mut err = None;
        for (i, w) in std::mem::take(&mut self.workers).into_iter().enumerate() {
            match w.join() {
                Ok(Ok(exit)) => exits.push(exit),
                Ok(Err(source)) => {
                    err.get_or_insert(RelayError::Worker { worker: i, source });
                }
                Err(_) => {
                    self.trigger.stop();
                    err.get_or_insert(RelayError::WorkerPanicked { worker: i });
                }
            }
        }
        // Every worker stopped: the QUIC group may go.
        drop(std::mem::take(&mut self.quic_group));
        match err {
            Some(e) => Err(e),
            None => Ok(ServerReport { workers: exits }),
        }
    }

    /// Stops the server and waits for it: [`ServerHandle::stop`] then [`ServerHandle::wait`].
    ///
    /// # Errors
    /// As [`ServerHandle::wait`].
    pub fn shutdown(self) -> Result<ServerReport, RelayError> {
        self.stop();
        self.wait()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        // A handle dropped without `wait` still stops its workers.
        self.trigger.stop();
        join_all(std::mem::take(&mut self.workers));
        drop(std::mem::take(&mut self.quic_group));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> io::Error {
        io::ErrorKind::AddrInUse.into()
    }

    #[test]
    fn a_relay_on_port_zero_moves_past_ports_whose_udp_twin_is_taken() {
        let mut ports = 40_000u16..;
        let mut refusals = 3;
        let (port, udp) = bind_twins(
            true,
            || Ok(ports.next().unwrap()),
            |_| {
                if refusals > 0 {
                    refusals -= 1;
                    Err(taken())
                } else {
                    Ok("group")
                }
            },
        )
        .unwrap();
        assert_eq!(port, 40_003);
        assert_eq!(udp.unwrap(), "group");
    }

    #[test]
    fn a_given_port_keeps_its_number_and_reports_the_udp_error() {
        let mut binds = 0;
        let (port, udp) = bind_twins(
            false,
            || {
                binds += 1;
                Ok(4443u16)
            },
            |_| Err::<(), _>(taken()),
        )
        .unwrap();
        assert_eq!((port, binds), (4443, 1));
        assert_eq!(udp.unwrap_err().kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn the_tries_are_bounded() {
        let mut ports = 40_000usize..;
        let (port, udp) = bind_twins(
            true,
            || Ok(ports.next().unwrap()),
            |_| Err::<(), _>(taken()),
        )
        .unwrap();
        assert_eq!(port, 40_000 + PORT_TRIES - 1);
        assert!(udp.is_err());
    }

    #[test]
    fn a_tcp_error_ends_the_binding() {
        let res = bind_twins(true, || Err::<(), _>(taken()), |_| Ok(()));
        assert_eq!(res.unwrap_err().kind(), io::ErrorKind::AddrInUse);
    }
}
