//! quinn-proto against noq-proto for skiff's use, sans-IO in one thread.
//!
//! For each library, a server endpoint sends to client endpoints through an
//! in-memory datagram queue (5 ms each way, no loss, simulated time), with
//! skiff's transport settings (`skiff-quic`'s `config.rs`: ALPN moq-lite-05,
//! 256 KiB stream window, 2 MiB connection window, 512 KiB send window,
//! CUBIC, GSO batches of up to 16 datagrams) and a self-signed rcgen
//! certificate. The cases: 64 MiB on one uni stream in 1,200-byte writes,
//! the same in 16 KiB writes, and 16 KiB frames to 100 viewers (one
//! connection and one uni stream each, 1 MiB per viewer).
//!
//! Every call into a library is timed and its heap allocations counted
//! (skiff-testkit's counting allocator), charged to the sending side (the
//! server: writes, ACKs it takes in, packets it makes) or the receiving side
//! (the clients: packets they take in, reads, ACKs they make). The handshake
//! is left out; the harness's own work (copying datagrams, the queue) is
//! not counted. Printed: allocations per data packet and per MiB delivered,
//! CPU ms per GB (median of several runs) and datagrams per GB.

use std::sync::Arc;
use std::time::{Duration, Instant};

use skiff_testkit::counting::{Counting, allocs};

#[global_allocator]
static A: Counting = Counting;

/// One-way delay of the simulated link.
const DELAY: Duration = Duration::from_millis(5);
/// Datagrams per `poll_transmit` (GSO), as skiff's QUIC endpoint asks.
const GSO: usize = 16;
/// Runs per case; CPU figures are their median.
const REPS: usize = 9;
const ALPN: &[u8] = b"moq-lite-05";
const STREAM_WINDOW: u64 = 256 * 1024;
const CONNECTION_WINDOW: u64 = 2 * 1024 * 1024;
const SEND_WINDOW: u64 = 512 * 1024;
const MIB: u64 = 1024 * 1024;

/// What one side spent inside the library.
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    allocs: u64,
    nanos: u64,
    datagrams: u64,
}

impl Cost {
    fn minus(self, base: Cost) -> Cost {
        Cost {
            allocs: self.allocs - base.allocs,
            nanos: self.nanos - base.nanos,
            datagrams: self.datagrams - base.datagrams,
        }
    }
}

/// The figures of one run after the handshake.
#[derive(Debug, Clone, Copy)]
struct Run {
    bytes: u64,
    send: Cost,
    recv: Cost,
}

/// Runs `f`, charging its time and allocations to `cost`.
fn timed<R>(cost: &mut Cost, f: impl FnOnce() -> R) -> R {
    let a = allocs();
    let t = Instant::now();
    let r = f();
    cost.nanos += u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
    cost.allocs += allocs() - a;
    r
}

/// The TLS configurations both libraries get: TLS 1.3 over aws-lc-rs, the
/// moq-lite ALPN, a self-signed certificate the client trusts.
struct Tls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

fn tls() -> Tls {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("rcgen");
    let cert = key.cert.der().clone();
    let pkey = rustls::pki_types::PrivatePkcs8KeyDer::from(key.signing_key.serialize_der());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], pkey.into())
        .expect("certificate");
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).expect("root");
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN.to_vec()];
    Tls {
        server: Arc::new(server),
        client: Arc::new(client),
    }
}

/// The simulation, written once over the API both libraries share; the
/// items passed in bridge the few calls whose signatures differ.
macro_rules! harness {
    ($name:ident, $lib:ident, { $($bridge:item)* }) => {
        mod $name {
            use std::collections::{HashMap, VecDeque};
            use std::net::SocketAddr;
            use std::sync::Arc;
            use std::time::{Duration, Instant};

            use bytes::BytesMut;
            use $lib as q;

            use super::{Cost, Run, Tls, timed, DELAY};

            $($bridge)*

            /// skiff's transport settings (`skiff-quic`'s `transport_config`).
            fn transport(client: bool) -> q::TransportConfig {
                let mut t = q::TransportConfig::default();
                t.max_concurrent_bidi_streams(q::VarInt::from_u32(64))
                    .max_concurrent_uni_streams(q::VarInt::from_u32(64))
                    .stream_receive_window(q::VarInt::from_u64(super::STREAM_WINDOW).unwrap_or(q::VarInt::MAX))
                    .receive_window(q::VarInt::from_u64(super::CONNECTION_WINDOW).unwrap_or(q::VarInt::MAX))
                    .send_window(super::SEND_WINDOW)
                    .max_idle_timeout(q::IdleTimeout::try_from(Duration::from_secs(30)).ok())
                    .keep_alive_interval(client.then_some(Duration::from_secs(10)))
                    .datagram_receive_buffer_size(None)
                    .enable_segmentation_offload(true);
                t
            }

            /// One connection and the one uni stream it carries.
            struct Conn {
                conn: q::Connection,
                connected: bool,
                stream: Option<q::StreamId>,
                to_send: u64,
                writable: bool,
                readable: bool,
                received: u64,
                fin: bool,
            }

            /// An endpoint with its connections.
            struct Node {
                addr: SocketAddr,
                ep: q::Endpoint,
                conns: HashMap<q::ConnectionHandle, Conn>,
                cost: Cost,
            }

            /// Datagrams in flight: due time, destination node, source, the
            /// GSO batch and its segment size.
            type Net = VecDeque<(Instant, usize, SocketAddr, Vec<u8>, usize)>;

            /// Sends `per_viewer` bytes from one server to each of `viewers`
            /// clients on one uni stream each, in writes of `write` bytes.
            pub fn run(tls: &Tls, viewers: usize, per_viewer: u64, write: usize) -> Run {
                let crypto = q::crypto::rustls::QuicServerConfig::try_from(tls.server.clone()).expect("server TLS");
                let mut server_config = q::ServerConfig::with_crypto(Arc::new(crypto));
                server_config.transport_config(Arc::new(transport(false)));
                let crypto = q::crypto::rustls::QuicClientConfig::try_from(tls.client.clone()).expect("client TLS");
                let mut client_config = q::ClientConfig::new(Arc::new(crypto));
                client_config.transport_config(Arc::new(transport(true)));

                let start = Instant::now();
                let mut now = start;
                let server_addr: SocketAddr = ([127, 0, 0, 1], 4433).into();
                let mut nodes = vec![Node {
                    addr: server_addr,
                    ep: endpoint(Some(Arc::new(server_config))),
                    conns: HashMap::new(),
                    cost: Cost::default(),
                }];
                for i in 0..viewers {
                    let port = 10_000 + u16::try_from(i).expect("viewers");
                    let mut ep = endpoint(None);
                    let (ch, conn) = ep.connect(now, client_config.clone(), server_addr, "localhost").expect("connect");
                    let mut conns = HashMap::new();
                    conns.insert(ch, new_conn(conn));
                    nodes.push(Node { addr: ([127, 0, 0, 2], port).into(), ep, conns, cost: Cost::default() });
                }
                let index: HashMap<SocketAddr, usize> = nodes.iter().enumerate().map(|(i, n)| (n.addr, i)).collect();
                let mut net = Net::new();
                let mut buf = Vec::with_capacity(64 * 1024);

                // The handshake, not measured.
                let all_connected = |nodes: &[Node]| {
                    nodes[0].conns.len() == viewers && nodes.iter().all(|n| n.conns.values().all(|c| c.connected))
                };
                while !all_connected(&nodes) {
                    now = step(&mut nodes, &index, &mut net, &mut buf, now, write);
                    assert!(now - start < Duration::from_secs(60), "handshake stalled");
                }
                let base = (nodes[0].cost, recv_cost(&nodes));
                for c in nodes[0].conns.values_mut() {
                    c.to_send = per_viewer;
                    c.writable = true;
                }
                let done = |nodes: &[Node]| nodes[1..].iter().all(|n| n.conns.values().all(|c| c.fin));
                while !done(&nodes) {
                    now = step(&mut nodes, &index, &mut net, &mut buf, now, write);
                    assert!(now - start < Duration::from_secs(3600), "transfer stalled");
                }
                let bytes = nodes[1..].iter().flat_map(|n| n.conns.values()).map(|c| c.received).sum::<u64>();
                assert_eq!(bytes, per_viewer * viewers as u64);
                Run { bytes, send: nodes[0].cost.minus(base.0), recv: recv_cost(&nodes).minus(base.1) }
            }

            fn new_conn(conn: q::Connection) -> Conn {
                Conn { conn, connected: false, stream: None, to_send: 0, writable: false, readable: false, received: 0, fin: false }
            }

            fn recv_cost(nodes: &[Node]) -> Cost {
                nodes[1..].iter().fold(Cost::default(), |a, n| Cost {
                    allocs: a.allocs + n.cost.allocs,
                    nanos: a.nanos + n.cost.nanos,
                    datagrams: a.datagrams + n.cost.datagrams,
                })
            }

            /// Delivers what is due at `now`, lets every connection act, and
            /// returns the next time something is due.
            fn step(nodes: &mut [Node], index: &HashMap<SocketAddr, usize>, net: &mut Net, buf: &mut Vec<u8>, now: Instant, write: usize) -> Instant {
                static PAYLOAD: [u8; 16 * 1024] = [7; 16 * 1024];
                while net.front().is_some_and(|p| p.0 <= now) {
                    let Some((_, to, from, batch, segment)) = net.pop_front() else { break };
                    let node = &mut nodes[to];
                    for datagram in batch.chunks(segment) {
                        let data = BytesMut::from(datagram);
                        buf.clear();
                        let cost = &mut node.cost;
                        match timed(cost, || handle(&mut node.ep, now, from, data, buf)) {
                            Some(q::DatagramEvent::ConnectionEvent(ch, event)) => {
                                if let Some(c) = node.conns.get_mut(&ch) {
                                    timed(cost, || c.conn.handle_event(event));
                                }
                            }
                            Some(q::DatagramEvent::NewConnection(incoming)) => {
                                let accepted = timed(cost, || node.ep.accept(incoming, now, buf, None).ok());
                                let (ch, conn) = accepted.expect("accept");
                                node.conns.insert(ch, new_conn(conn));
                            }
                            Some(q::DatagramEvent::Response(t)) => {
                                let to = index[&t.destination];
                                net.push_back((now + DELAY, to, node.addr, buf[..t.size].to_vec(), t.segment_size.unwrap_or(t.size)));
                            }
                            None => {}
                        }
                    }
                }
                let mut next = net.front().map_or(now + Duration::from_secs(3600), |p| p.0);
                for node in nodes.iter_mut() {
                    let cost = &mut node.cost;
                    for (&ch, c) in node.conns.iter_mut() {
                        if c.conn.poll_timeout().is_some_and(|t| t <= now) {
                            timed(cost, || c.conn.handle_timeout(now));
                        }
                        while let Some(event) = timed(cost, || c.conn.poll()) {
                            match event {
                                q::Event::Connected => c.connected = true,
                                q::Event::Stream(q::StreamEvent::Writable { .. }) => c.writable = true,
                                q::Event::Stream(q::StreamEvent::Opened { .. } | q::StreamEvent::Readable { .. }) => c.readable = true,
                                q::Event::ConnectionLost { reason } => panic!("connection lost: {reason}"),
                                _ => {}
                            }
                        }
                        if c.connected && c.stream.is_none() && node.addr.port() == 4433 {
                            c.stream = timed(cost, || c.conn.streams().open(q::Dir::Uni));
                        }
                        if c.writable && c.to_send > 0 && let Some(id) = c.stream {
                            timed(cost, || {
                                let mut s = c.conn.send_stream(id);
                                while c.to_send > 0 {
                                    let n = write.min(usize::try_from(c.to_send).unwrap_or(write));
                                    match s.write(&PAYLOAD[..n]) {
                                        Ok(sent) => c.to_send -= sent as u64,
                                        Err(_) => { c.writable = false; break; }
                                    }
                                }
                                if c.to_send == 0 {
                                    let _ = s.finish();
                                }
                            });
                        }
                        if c.readable {
                            c.readable = false;
                            timed(cost, || {
                                if c.stream.is_none() {
                                    c.stream = c.conn.streams().accept(q::Dir::Uni);
                                }
                                let Some(id) = c.stream else { return };
                                let mut s = c.conn.recv_stream(id);
                                let Ok(mut chunks) = s.read(true) else { return };
                                loop {
                                    match chunks.next(usize::MAX) {
                                        Ok(Some(chunk)) => c.received += chunk.bytes.len() as u64,
                                        Ok(None) => { c.fin = true; break; }
                                        Err(_) => break,
                                    }
                                }
                                let _ = chunks.finalize();
                            });
                        }
                        while let Some(event) = timed(cost, || c.conn.poll_endpoint_events()) {
                            if let Some(back) = timed(cost, || node.ep.handle_event(ch, event)) {
                                timed(cost, || c.conn.handle_event(back));
                            }
                        }
                        loop {
                            buf.clear();
                            let Some(t) = timed(cost, || transmit(&mut c.conn, now, buf)) else { break };
                            let segment = t.segment_size.unwrap_or(t.size);
                            cost.datagrams += t.size.div_ceil(segment) as u64;
                            net.push_back((now + DELAY, index[&t.destination], node.addr, buf[..t.size].to_vec(), segment));
                        }
                        if let Some(t) = c.conn.poll_timeout() {
                            next = next.min(t);
                        }
                    }
                }
                next.max(now + Duration::from_micros(1))
            }
        }
    };
}

harness!(quinn, quinn_proto, {
    fn endpoint(server: Option<Arc<q::ServerConfig>>) -> q::Endpoint {
        q::Endpoint::new(Arc::new(q::EndpointConfig::default()), server, true, None)
    }
    fn handle(
        ep: &mut q::Endpoint,
        now: Instant,
        from: SocketAddr,
        data: BytesMut,
        buf: &mut Vec<u8>,
    ) -> Option<q::DatagramEvent> {
        ep.handle(now, from, None, None, data, buf)
    }
    fn transmit(conn: &mut q::Connection, now: Instant, buf: &mut Vec<u8>) -> Option<q::Transmit> {
        conn.poll_transmit(now, super::GSO, buf)
    }
});

harness!(noq, noq_proto, {
    fn endpoint(server: Option<Arc<q::ServerConfig>>) -> q::Endpoint {
        q::Endpoint::new(Arc::new(q::EndpointConfig::default()), server, true)
    }
    fn handle(
        ep: &mut q::Endpoint,
        now: Instant,
        from: SocketAddr,
        data: BytesMut,
        buf: &mut Vec<u8>,
    ) -> Option<q::DatagramEvent> {
        ep.handle(now, q::FourTuple::new(from, None), None, data, buf)
    }
    fn transmit(conn: &mut q::Connection, now: Instant, buf: &mut Vec<u8>) -> Option<q::Transmit> {
        conn.poll_transmit(
            now,
            std::num::NonZeroUsize::new(super::GSO).expect("GSO > 0"),
            buf,
        )
    }
});

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let tls = tls();
    type RunFn = fn(&Tls, usize, u64, usize) -> Run;
    let libs: [(&str, RunFn); 2] = [
        ("quinn-proto 0.11.19", quinn::run),
        ("noq-proto 1.4.0", noq::run),
    ];
    let cases = [
        ("1 stream, 1,200 B writes", 1, 64 * MIB, 1200),
        ("1 stream, 16 KiB writes", 1, 64 * MIB, 16 * 1024),
        ("100 viewers, 16 KiB frames", 100, MIB, 16 * 1024),
    ];
    println!(
        "| library | case | send allocs/pkt | send allocs/MiB | recv allocs/pkt | recv allocs/MiB | send CPU ms/GB | recv CPU ms/GB | total CPU ms/GB | data datagrams/GB | ACK datagrams/GB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (case, viewers, per_viewer, write) in cases {
        for (lib, run) in libs {
            let runs: Vec<Run> = (0..REPS)
                .map(|_| run(&tls, viewers, per_viewer, write))
                .collect();
            let per = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
            let gb = |r: &Run| r.bytes as f64 / 1e9;
            let mib = |r: &Run| r.bytes as f64 / MIB as f64;
            let row = [
                per(&|r| r.send.allocs as f64 / r.send.datagrams as f64),
                per(&|r| r.send.allocs as f64 / mib(r)),
                per(&|r| r.recv.allocs as f64 / r.send.datagrams as f64),
                per(&|r| r.recv.allocs as f64 / mib(r)),
                per(&|r| r.send.nanos as f64 / 1e6 / gb(r)),
                per(&|r| r.recv.nanos as f64 / 1e6 / gb(r)),
                per(&|r| (r.send.nanos + r.recv.nanos) as f64 / 1e6 / gb(r)),
                per(&|r| r.send.datagrams as f64 / gb(r)),
                per(&|r| r.recv.datagrams as f64 / gb(r)),
            ];
            println!(
                "| {lib} | {case} | {:.2} | {:.0} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8]
            );
        }
    }
}
