//! Relay counters and the Prometheus text endpoint.
//!
//! Each worker thread owns one cache-line-aligned [`ThreadCounters`] and
//! updates it with relaxed atomics (no cross-core traffic on the hot path);
//! a scrape sums them. [`MetricsServer`] answers any HTTP/1.1 GET with the
//! Prometheus text exposition, from OS threads of its own: a few connections
//! at once, each within a total deadline.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use skiff_monoio::driver::ActiveDriver;

/// The transport a connection's bytes travel on, as the per-transport
/// counters label it: the outermost layer the relay serves the session
/// over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportLabel {
    /// Plain TCP: QMux, an HTTP request, or a connection whose first bytes
    /// are not read yet.
    Tcp,
    /// TLS on the TCP port: QMux, HTTPS, or WebSocket over TLS (`wss://`).
    Tls,
    /// WebSocket on plain TCP (`ws://`).
    Ws,
    /// QUIC on UDP (`moql://`).
    Quic,
    /// WebTransport over HTTP/3 on the UDP port (`https://`,
    /// docs/protocol.md §12): connections are counted here instead of under
    /// `quic` once HTTP/3 is agreed; bytes are the connections' UDP payloads,
    /// added as each ends (and also in `quic`'s endpoint totals).
    WebTransport,
}

impl TransportLabel {
    /// Every label, in the order the exposition lists them.
    pub const ALL: [TransportLabel; 5] = [
        TransportLabel::Tcp,
        TransportLabel::Tls,
        TransportLabel::Ws,
        TransportLabel::Quic,
        TransportLabel::WebTransport,
    ];

    /// The label's value in the exposition (`transport="tcp"`).
    pub fn as_str(self) -> &'static str {
        match self {
            TransportLabel::Tcp => "tcp",
            TransportLabel::Tls => "tls",
            TransportLabel::Ws => "ws",
            TransportLabel::Quic => "quic",
            TransportLabel::WebTransport => "webtransport",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One transport's counters of one worker thread.
#[derive(Debug, Default)]
struct TransportCounters {
    open: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// One transport's counters, as plain values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportSnapshot {
    /// Connections open on the transport.
    pub open: u64,
    /// Bytes read from peers (for QUIC: UDP payload bytes received).
    pub bytes_in: u64,
    /// Bytes written to peers (for QUIC: UDP payload bytes sent).
    pub bytes_out: u64,
}

/// Counters of one worker thread, on their own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct ThreadCounters {
    accepted: AtomicU64,
    open: AtomicU64,
    refused: AtomicU64,
    accept_errors: AtomicU64,
    /// Open connections and bytes by transport, indexed by
    /// [`TransportLabel`]; the TCP port's bytes in all are their sum.
    transports: [TransportCounters; 5],
    short_reads: AtomicU64,
    prompt_acks: AtomicU64,
    cache_bytes: AtomicU64,
    cache_high_water: AtomicU64,
    lent_bytes: AtomicU64,
    lent_ranges: AtomicU64,
    quota_refused: AtomicU64,
    relay_tracks: AtomicU64,
    broadcasts: AtomicU64,
    quic_open: AtomicU64,
    quic_dropped: AtomicU64,
    quic_retries: AtomicU64,
    /// The QUIC endpoint's receive and send system calls and the datagrams
    /// they moved ([`ThreadCounters::set_quic_io`]).
    quic_recv_calls: AtomicU64,
    quic_recv_datagrams: AtomicU64,
    quic_send_calls: AtomicU64,
    quic_sent_datagrams: AtomicU64,
    /// 0 = not started, 1 = io_uring, 2 = legacy.
    driver: AtomicU8,
    draining: AtomicBool,
}

impl ThreadCounters {
    /// Counts a connection handed to the handler (and now open).
    pub fn connection_opened(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a handled connection that ended.
    pub fn connection_closed(&self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts a QUIC connection handed to the handler (and now open).
    pub fn quic_opened(&self) {
        self.quic_open.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a QUIC connection whose handler ended.
    pub fn quic_closed(&self) {
        self.quic_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// Copies the QUIC endpoint's totals: datagrams dropped (unparsable or
    /// of no connection) and Retry packets sent.
    pub fn set_quic_endpoint(&self, dropped: u64, retries: u64) {
        self.quic_dropped.store(dropped, Ordering::Relaxed);
        self.quic_retries.store(retries, Ordering::Relaxed);
    }

    /// Copies the QUIC endpoint's system-call totals: receive calls and the
    /// datagrams they took, send calls and the datagrams they sent.
    pub fn set_quic_io(
        &self,
        recv_calls: u64,
        recv_datagrams: u64,
        send_calls: u64,
        sent_datagrams: u64,
    ) {
        self.quic_recv_calls.store(recv_calls, Ordering::Relaxed);
        self.quic_recv_datagrams
            .store(recv_datagrams, Ordering::Relaxed);
        self.quic_send_calls.store(send_calls, Ordering::Relaxed);
        self.quic_sent_datagrams
            .store(sent_datagrams, Ordering::Relaxed);
    }

    /// Counts a connection closed at once because the thread was at its limit
    /// (or draining).
    pub fn connection_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed `accept`.
    pub fn accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes read from peers over plain TCP.
    pub fn add_bytes_in(&self, n: usize) {
        self.add_bytes_in_on(TransportLabel::Tcp, n);
    }

    /// Counts bytes read from a peer on the TCP port over transport `t`.
    pub fn add_bytes_in_on(&self, t: TransportLabel, n: usize) {
        self.transports[t.index()]
            .bytes_in
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a connection open on transport `t` (until
    /// [`ThreadCounters::transport_closed`]).
    pub fn transport_opened(&self, t: TransportLabel) {
        self.transports[t.index()]
            .open
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection on transport `t` closed.
    pub fn transport_closed(&self, t: TransportLabel) {
        self.transports[t.index()]
            .open
            .fetch_sub(1, Ordering::Relaxed);
    }

    /// Records the bytes the thread's QUIC endpoint sent and received so far
    /// (UDP payloads, handshakes and acknowledgements included).
    pub fn set_quic_bytes(&self, sent: u64, received: u64) {
        let q = &self.transports[TransportLabel::Quic.index()];
        q.bytes_out.store(sent, Ordering::Relaxed);
        q.bytes_in.store(received, Ordering::Relaxed);
    }

    /// Counts a read that drained a peer's socket, and whether the relay
    /// acknowledged it at once (`TCP_QUICKACK`, for a peer that may publish).
    pub fn short_read(&self, acked_at_once: bool) {
        self.short_reads.fetch_add(1, Ordering::Relaxed);
        if acked_at_once {
            self.prompt_acks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts bytes written to peers over plain TCP.
    pub fn add_bytes_out(&self, n: usize) {
        self.add_bytes_out_on(TransportLabel::Tcp, n);
    }

    /// Counts bytes written to a peer on the TCP port over transport `t`.
    pub fn add_bytes_out_on(&self, t: TransportLabel, n: usize) {
        self.transports[t.index()]
            .bytes_out
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records the bytes the thread lent to other workers so far and the
    /// ranges not returned yet ([`crate::lend`]).
    pub fn set_lent(&self, bytes: u64, ranges: u64) {
        self.lent_bytes.store(bytes, Ordering::Relaxed);
        self.lent_ranges.store(ranges, Ordering::Relaxed);
    }

    /// Counts one request or connection refused by a quota
    /// ([`crate::config::Quotas`]).
    pub fn add_quota_refused(&self) {
        self.quota_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the relay tracks the thread holds (claimed or still serving
    /// their last readers) and the broadcasts it routes.
    pub fn set_tables(&self, relay_tracks: u64, broadcasts: u64) {
        self.relay_tracks.store(relay_tracks, Ordering::Relaxed);
        self.broadcasts.store(broadcasts, Ordering::Relaxed);
    }

    /// Records the bytes of the thread's cache pool in use now and at most so far.
    pub fn set_cache(&self, in_use: u64, high_water: u64) {
        self.cache_bytes.store(in_use, Ordering::Relaxed);
        self.cache_high_water.store(high_water, Ordering::Relaxed);
    }

    /// Records which driver the thread's runtime uses.
    pub fn set_driver(&self, d: ActiveDriver) {
        let v = match d {
            ActiveDriver::IoUring => 1,
            ActiveDriver::Legacy => 2,
        };
        self.driver.store(v, Ordering::Relaxed);
    }

    /// Records that the thread stopped accepting and is draining.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The driver recorded by [`ThreadCounters::set_driver`], if the thread started.
    pub fn driver(&self) -> Option<ActiveDriver> {
        match self.driver.load(Ordering::Relaxed) {
            1 => Some(ActiveDriver::IoUring),
            2 => Some(ActiveDriver::Legacy),
            _ => None,
        }
    }

    /// A consistent-enough copy of the counters (each read is relaxed).
    pub fn snapshot(&self) -> Snapshot {
        let transports = TransportLabel::ALL.map(|t| {
            let c = &self.transports[t.index()];
            TransportSnapshot {
                open: c.open.load(Ordering::Relaxed),
                bytes_in: c.bytes_in.load(Ordering::Relaxed),
                bytes_out: c.bytes_out.load(Ordering::Relaxed),
            }
        });
        // The TCP port's transports; QUIC's datagrams are counted apart.
        let tcp_port = &transports[..TransportLabel::Quic.index()];
        Snapshot {
            accepted: self.accepted.load(Ordering::Relaxed),
            open: self.open.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            accept_errors: self.accept_errors.load(Ordering::Relaxed),
            bytes_in: tcp_port.iter().map(|t| t.bytes_in).sum(),
            bytes_out: tcp_port.iter().map(|t| t.bytes_out).sum(),
            transports,
            short_reads: self.short_reads.load(Ordering::Relaxed),
            prompt_acks: self.prompt_acks.load(Ordering::Relaxed),
            cache_bytes: self.cache_bytes.load(Ordering::Relaxed),
            cache_high_water: self.cache_high_water.load(Ordering::Relaxed),
            lent_bytes: self.lent_bytes.load(Ordering::Relaxed),
            lent_ranges: self.lent_ranges.load(Ordering::Relaxed),
            quota_refused: self.quota_refused.load(Ordering::Relaxed),
            relay_tracks: self.relay_tracks.load(Ordering::Relaxed),
            broadcasts: self.broadcasts.load(Ordering::Relaxed),
            quic_open: self.quic_open.load(Ordering::Relaxed),
            quic_dropped: self.quic_dropped.load(Ordering::Relaxed),
            quic_retries: self.quic_retries.load(Ordering::Relaxed),
            quic_recv_calls: self.quic_recv_calls.load(Ordering::Relaxed),
            quic_recv_datagrams: self.quic_recv_datagrams.load(Ordering::Relaxed),
            quic_send_calls: self.quic_send_calls.load(Ordering::Relaxed),
            quic_sent_datagrams: self.quic_sent_datagrams.load(Ordering::Relaxed),
        }
    }
}

/// Plain values of the counters, per thread or summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Connections accepted and handed to the handler.
    pub accepted: u64,
    /// Connections currently open.
    pub open: u64,
    /// Connections closed at once (over the limit or draining).
    pub refused: u64,
    /// Failed accepts.
    pub accept_errors: u64,
    /// Bytes read from peers on the TCP port.
    pub bytes_in: u64,
    /// Bytes written to peers on the TCP port.
    pub bytes_out: u64,
    /// Open connections and bytes by transport, indexed as
    /// [`TransportLabel::ALL`].
    pub transports: [TransportSnapshot; 5],
    /// Reads that drained a peer's socket.
    pub short_reads: u64,
    /// Of those, the ones acknowledged at once (`TCP_QUICKACK`).
    pub prompt_acks: u64,
    /// Bytes of the cache pool in use (group bytes held), whole blocks.
    pub cache_bytes: u64,
    /// The most cache-pool bytes ever in use at once.
    pub cache_high_water: u64,
    /// Payload bytes lent to other workers instead of copied ([`crate::lend`]).
    pub lent_bytes: u64,
    /// Lent ranges not returned yet.
    pub lent_ranges: u64,
    /// Requests and connections refused by a quota.
    pub quota_refused: u64,
    /// Relay tracks held (claimed, or retired and still serving readers).
    pub relay_tracks: u64,
    /// Broadcasts routed.
    pub broadcasts: u64,
    /// QUIC connections currently open (among `open`).
    pub quic_open: u64,
    /// Datagrams the QUIC endpoint dropped: unparsable, or of no connection.
    pub quic_dropped: u64,
    /// Retry packets the QUIC endpoint sent.
    pub quic_retries: u64,
    /// The QUIC endpoint's receive system calls (`recvmmsg`).
    pub quic_recv_calls: u64,
    /// Datagrams the QUIC endpoint received.
    pub quic_recv_datagrams: u64,
    /// The QUIC endpoint's send system calls (`sendmsg`, GSO batches).
    pub quic_send_calls: u64,
    /// Datagrams the QUIC endpoint sent.
    pub quic_sent_datagrams: u64,
}

impl core::ops::AddAssign for Snapshot {
    fn add_assign(&mut self, o: Snapshot) {
        self.accepted += o.accepted;
        self.open += o.open;
        self.refused += o.refused;
        self.accept_errors += o.accept_errors;
        self.bytes_in += o.bytes_in;
        self.bytes_out += o.bytes_out;
        for (t, o) in self.transports.iter_mut().zip(o.transports) {
            t.open += o.open;
            t.bytes_in += o.bytes_in;
            t.bytes_out += o.bytes_out;
        }
        self.short_reads += o.short_reads;
        self.prompt_acks += o.prompt_acks;
        self.cache_bytes += o.cache_bytes;
        self.cache_high_water += o.cache_high_water;
        self.lent_bytes += o.lent_bytes;
        self.lent_ranges += o.lent_ranges;
        self.quota_refused += o.quota_refused;
        self.relay_tracks += o.relay_tracks;
        self.broadcasts += o.broadcasts;
        self.quic_open += o.quic_open;
        self.quic_dropped += o.quic_dropped;
        self.quic_retries += o.quic_retries;
        self.quic_recv_calls += o.quic_recv_calls;
        self.quic_recv_datagrams += o.quic_recv_datagrams;
        self.quic_send_calls += o.quic_send_calls;
        self.quic_sent_datagrams += o.quic_sent_datagrams;
    }
}

/// All worker threads' counters.
#[derive(Debug)]
pub struct Metrics {
    threads: Box<[ThreadCounters]>,
    /// The workers' QUIC sockets steer datagrams by connection ID.
    quic_steering: AtomicBool,
    /// The counters of each cluster peer this relay dials (one entry per
    /// configured peer: the label's values come from the configuration,
    /// not the network).
    peers: std::sync::Mutex<Vec<Arc<PeerCounters>>>,
    /// Sessions accepted as cluster peers (docs/protocol.md §4.10), and
    /// those whose token refused them that role.
    inbound_peers: AtomicU64,
    refused_peers: AtomicU64,
    /// The recorder's counters (`--record`).
    pub record: std::sync::Arc<crate::record::RecordStats>,
}

/// One cluster peer's counters, summed over the workers' sessions with it:
/// `skiff_relay_peer_*{peer="tcp://host:port/path"}`.
#[derive(Debug)]
pub struct PeerCounters {
    /// The peer's identity (its URL without query).
    pub label: &'static str,
    sessions: AtomicU64,
    routes: AtomicU64,
    announcements_in: AtomicU64,
    announcements_out: AtomicU64,
    served: AtomicU64,
    subscriptions: AtomicU64,
}

impl PeerCounters {
    /// Counters of peer `label`, all zero.
    pub fn new(label: &'static str) -> Self {
        PeerCounters {
            label,
            sessions: AtomicU64::new(0),
            routes: AtomicU64::new(0),
            announcements_in: AtomicU64::new(0),
            announcements_out: AtomicU64::new(0),
            served: AtomicU64::new(0),
            subscriptions: AtomicU64::new(0),
        }
    }

    /// A session with the peer began (`up`) or ended.
    pub fn session(&self, up: bool) {
        step(&self.sessions, up);
    }

    /// An announcement from the peer; `route`: it routes a broadcast it did
    /// not (`Some(true)`), withdraws one it did (`Some(false)`), or changes
    /// nothing about what it routes (`None`: a repeat, a route change).
    pub fn announcement(&self, route: Option<bool>) {
        self.announcements_in.fetch_add(1, Ordering::Relaxed);
        if let Some(up) = route {
            step(&self.routes, up);
        }
    }

    /// `n` more announcements (active and ended) sent to the peer.
    pub fn announced(&self, n: u64) {
        self.announcements_out.fetch_add(n, Ordering::Relaxed);
    }

    /// Routes learned from a session of the peer that ended (`n` of them).
    pub fn forget_routes(&self, n: u64) {
        let _ = self
            .routes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(r.saturating_sub(n))
            });
    }

    /// The subscriptions a session serves the peer went from `from` to `to`;
    /// a rise counts as new subscriptions too.
    pub fn served(&self, from: u64, to: u64) {
        if to > from {
            self.served.fetch_add(to - from, Ordering::Relaxed);
            self.subscriptions.fetch_add(to - from, Ordering::Relaxed);
        } else {
            let _ = self
                .served
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    Some(s.saturating_sub(from - to))
                });
        }
    }

    /// Sessions open with the peer now.
    pub fn sessions(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Broadcasts the peer routes to this relay now.
    pub fn routes(&self) -> u64 {
        self.routes.load(Ordering::Relaxed)
    }

    /// Announcements (active and ended) received from the peer.
    pub fn announcements_in(&self) -> u64 {
        self.announcements_in.load(Ordering::Relaxed)
    }

    /// Announcements (active and ended) sent to the peer.
    pub fn announcements_out(&self) -> u64 {
        self.announcements_out.load(Ordering::Relaxed)
    }

    /// Subscriptions this relay serves the peer now.
    pub fn served_now(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

/// `text` as a Prometheus label value: backslash, double quote and newline
/// escaped (a peer's URL comes from a peer list, which could hold them).
fn label_value(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['\\', '"', '\n']) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 4);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Adds one to `c` (`up`) or takes one off, never below zero.
fn step(c: &AtomicU64, up: bool) {
    if up {
        c.fetch_add(1, Ordering::Relaxed);
    } else {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(1))
        });
    }
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: fn(&Snapshot) -> u64,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "connections_accepted_total",
        kind: "counter",
        help: "Connections accepted and handed to the connection handler.",
        get: |s| s.accepted,
    },
    Family {
        name: "connections_open",
        kind: "gauge",
        help: "Connections currently open.",
        get: |s| s.open,
    },
    Family {
        name: "connections_refused_total",
        kind: "counter",
        help: "Connections accepted and closed at once: over max-connections or draining.",
        get: |s| s.refused,
    },
    Family {
        name: "accept_errors_total",
        kind: "counter",
        help: "Failed accept calls.",
        get: |s| s.accept_errors,
    },
    Family {
        name: "received_bytes_total",
        kind: "counter",
        help: "Bytes read from peers on the TCP port.",
        get: |s| s.bytes_in,
    },
    Family {
        name: "sent_bytes_total",
        kind: "counter",
        help: "Bytes written to peers on the TCP port.",
        get: |s| s.bytes_out,
    },
    Family {
        name: "short_reads_total",
        kind: "counter",
        help: "Reads that drained a peer's socket.",
        get: |s| s.short_reads,
    },
    Family {
        name: "prompt_acks_total",
        kind: "counter",
        help: "Reads that drained the socket of a peer that may publish, acknowledged at once (TCP_QUICKACK).",
        get: |s| s.prompt_acks,
    },
    Family {
        name: "cache_bytes",
        kind: "gauge",
        help: "Bytes of the group cache pool in use (whole blocks), sampled every 10 ms.",
        get: |s| s.cache_bytes,
    },
    Family {
        name: "cache_high_water_bytes",
        kind: "gauge",
        help: "The most group cache pool bytes in use at once (summed over threads in the total).",
        get: |s| s.cache_high_water,
    },
    Family {
        name: "lent_bytes_total",
        kind: "counter",
        help: "Payload bytes lent to other worker threads instead of copied, sampled every 10 ms.",
        get: |s| s.lent_bytes,
    },
    Family {
        name: "lent_ranges",
        kind: "gauge",
        help: "Block ranges lent to other worker threads and not returned yet.",
        get: |s| s.lent_ranges,
    },
    Family {
        name: "quota_refused_total",
        kind: "counter",
        help: "Requests and connections refused by a per-peer quota.",
        get: |s| s.quota_refused,
    },
    Family {
        name: "relay_tracks",
        kind: "gauge",
        help: "Relay tracks held: in use, or given up and still serving their last readers.",
        get: |s| s.relay_tracks,
    },
    Family {
        name: "broadcasts",
        kind: "gauge",
        help: "Broadcasts routed (their source present or within the failover grace).",
        get: |s| s.broadcasts,
    },
    Family {
        name: "quic_connections",
        kind: "gauge",
        help: "QUIC connections currently open (counted in connections_open too).",
        get: |s| s.quic_open,
    },
    Family {
        name: "quic_dropped_datagrams_total",
        kind: "counter",
        help: "UDP datagrams the QUIC endpoint dropped: unparsable, or of no connection, sampled every 100 ms.",
        get: |s| s.quic_dropped,
    },
    Family {
        name: "quic_retries_total",
        kind: "counter",
        help: "Retry packets sent: new QUIC connections asked to prove their address, sampled every 100 ms.",
        get: |s| s.quic_retries,
    },
    Family {
        name: "quic_receive_calls_total",
        kind: "counter",
        help: "Receive system calls of the QUIC endpoint (recvmmsg, several datagrams each), sampled every 100 ms.",
        get: |s| s.quic_recv_calls,
    },
    Family {
        name: "quic_received_datagrams_total",
        kind: "counter",
        help: "UDP datagrams the QUIC endpoint received (each of a GRO train counted), sampled every 100 ms.",
        get: |s| s.quic_recv_datagrams,
    },
    Family {
        name: "quic_send_calls_total",
        kind: "counter",
        help: "Send system calls of the QUIC endpoint (sendmsg, a GSO batch each), sampled every 100 ms.",
        get: |s| s.quic_send_calls,
    },
    Family {
        name: "quic_sent_datagrams_total",
        kind: "counter",
        help: "UDP datagrams the QUIC endpoint sent (each of a GSO batch counted), sampled every 100 ms.",
        get: |s| s.quic_sent_datagrams,
    },
];

impl Metrics {
    /// Counters for `threads` workers, all zero.
    pub fn new(threads: usize) -> Self {
        Metrics {
            threads: (0..threads).map(|_| ThreadCounters::default()).collect(),
            quic_steering: AtomicBool::new(false),
            peers: std::sync::Mutex::new(Vec::new()),
            inbound_peers: AtomicU64::new(0),
            refused_peers: AtomicU64::new(0),
            record: Default::default(),
        }
    }

    /// Registers the counters of cluster peer `label` (listed from now on).
    pub fn add_peer(&self, label: &'static str) -> Arc<PeerCounters> {
        let c = Arc::new(PeerCounters::new(label));
        self.peer_list().push(c.clone());
        c
    }

    /// Stops listing the counters `c` (its peer left the peer list).
    pub fn remove_peer(&self, c: &Arc<PeerCounters>) {
        self.peer_list().retain(|p| !Arc::ptr_eq(p, c));
    }

    /// The counters of the cluster peers dialed now.
    pub fn peers(&self) -> Vec<Arc<PeerCounters>> {
        self.peer_list().clone()
    }

    fn peer_list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PeerCounters>>> {
        match self.peers.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Counts a session accepted as a cluster peer (`true`) or one whose
    /// token refused it that role.
    pub fn inbound_peer(&self, admitted: bool) {
        let c = if admitted {
            &self.inbound_peers
        } else {
            &self.refused_peers
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Records whether QUIC datagrams reach their worker by connection ID
    /// (`true`), or by the kernel's hash of the addresses.
    pub fn set_quic_steering(&self, on: bool) {
        self.quic_steering.store(on, Ordering::Relaxed);
    }

    /// Whether QUIC datagrams reach their worker by connection ID.
    pub fn quic_steering(&self) -> bool {
        self.quic_steering.load(Ordering::Relaxed)
    }

    /// The counters of worker `i`.
    ///
    /// # Panics
    /// If `i` is not a worker's index (worker indices come from the server,
    /// not the network).
    pub fn thread(&self, i: usize) -> &ThreadCounters {
        &self.threads[i]
    }

    /// Every thread's counters summed.
    pub fn total(&self) -> Snapshot {
        let mut sum = Snapshot::default();
        for t in self.threads.iter() {
            sum += t.snapshot();
        }
        sum
    }

    /// The Prometheus text exposition (format 0.0.4) of all counters:
    /// `skiff_relay_*` totals and `skiff_relay_thread_*{thread="i"}` per thread.
    pub fn render(&self) -> String {
        let snaps: Vec<Snapshot> = self.threads.iter().map(ThreadCounters::snapshot).collect();
        let mut total = Snapshot::default();
        for s in &snaps {
            total += *s;
        }
        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# HELP skiff_relay_worker_threads Worker threads, each with its own runtime."
        );
        let _ = writeln!(out, "# TYPE skiff_relay_worker_threads gauge");
        let _ = writeln!(out, "skiff_relay_worker_threads {}", self.threads.len());
        for f in FAMILIES {
            let _ = writeln!(out, "# HELP skiff_relay_{} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE skiff_relay_{} {}", f.name, f.kind);
            let _ = writeln!(out, "skiff_relay_{} {}", f.name, (f.get)(&total));
        }
        for f in FAMILIES {
            let _ = writeln!(
                out,
                "# HELP skiff_relay_thread_{} {} Per worker thread.",
                f.name, f.help
            );
            let _ = writeln!(out, "# TYPE skiff_relay_thread_{} {}", f.name, f.kind);
            for (i, s) in snaps.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "skiff_relay_thread_{}{{thread=\"{i}\"}} {}",
                    f.name,
                    (f.get)(s)
                );
            }
        }
        render_transports(&mut out, &total);
        self.render_peers(&mut out);
        let _ = writeln!(
            out,
            "# HELP skiff_relay_quic_steering 1 if each QUIC datagram reaches the worker its connection ID names, 0 if the kernel picks by address (or no QUIC)."
        );
        let _ = writeln!(out, "# TYPE skiff_relay_quic_steering gauge");
        let _ = writeln!(
            out,
            "skiff_relay_quic_steering {}",
            u8::from(self.quic_steering())
        );
        let _ = writeln!(
            out,
            "# HELP skiff_relay_thread_io_uring 1 if the worker runs on io_uring, 0 if on epoll."
        );
        let _ = writeln!(out, "# TYPE skiff_relay_thread_io_uring gauge");
        for (i, t) in self.threads.iter().enumerate() {
            if let Some(d) = t.driver() {
                let _ = writeln!(
                    out,
                    "skiff_relay_thread_io_uring{{thread=\"{i}\"}} {}",
                    u8::from(d == ActiveDriver::IoUring)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP skiff_relay_thread_draining 1 once the worker stopped accepting."
        );
        let _ = writeln!(out, "# TYPE skiff_relay_thread_draining gauge");
        for (i, t) in self.threads.iter().enumerate() {
            let _ = writeln!(
                out,
                "skiff_relay_thread_draining{{thread=\"{i}\"}} {}",
                u8::from(t.draining.load(Ordering::Relaxed))
            );
        }
        if let Some(bytes) = heap_in_use() {
            let _ = writeln!(
                out,
                "# HELP skiff_relay_heap_bytes Bytes the process holds allocated from its heap now (the allocator's own count, without what it keeps free)."
            );
            let _ = writeln!(out, "# TYPE skiff_relay_heap_bytes gauge");
            let _ = writeln!(out, "skiff_relay_heap_bytes {bytes}");
        }
        self.record.render(&mut out);
        out
    }
}

/// Bytes allocated and not yet freed, by the C allocator's count over all its
/// arenas and mapped blocks; `None` where the allocator cannot say. Walks the
/// allocator's free lists under its locks: for a scrape, never a hot path.
fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct of
        // counters; glibc makes it safe to call from any thread.
        let info = unsafe { libc::mallinfo2() };
        Some((info.uordblks + info.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

impl Metrics {
    /// The cluster series: `skiff_relay_peer_*{peer="…"}` for each peer
    /// dialed, and the sessions accepted or refused as peers.
    fn render_peers(&self, out: &mut String) {
        type Get = fn(&PeerCounters) -> u64;
        let families: [(&str, &str, &str, Get); 6] = [
            (
                "sessions_open",
                "gauge",
                "Sessions open with the cluster peer (one per worker when connected).",
                |p| p.sessions(),
            ),
            (
                "routes",
                "gauge",
                "Broadcasts the cluster peer routes to this relay now (routes learned).",
                |p| p.routes(),
            ),
            (
                "announcements_received_total",
                "counter",
                "Announcements (active and ended) received from the cluster peer.",
                |p| p.announcements_in(),
            ),
            (
                "announcements_sent_total",
                "counter",
                "Announcements (active and ended) sent to the cluster peer.",
                |p| p.announcements_out(),
            ),
            (
                "subscriptions_served",
                "gauge",
                "Subscriptions this relay serves the cluster peer now.",
                |p| p.served_now(),
            ),
            (
                "subscriptions_served_total",
                "counter",
                "Subscriptions this relay served the cluster peer.",
                |p| p.subscriptions.load(Ordering::Relaxed),
            ),
        ];
        let peers = self.peers();
        // Writing to a String cannot fail.
        for (name, kind, help, get) in families {
            let _ = writeln!(out, "# HELP skiff_relay_peer_{name} {help}");
            let _ = writeln!(out, "# TYPE skiff_relay_peer_{name} {kind}");
            for p in &peers {
                let _ = writeln!(
                    out,
                    "skiff_relay_peer_{name}{{peer=\"{}\"}} {}",
                    label_value(p.label),
                    get(p)
                );
            }
        }
        for (name, help, c) in [
            (
                "cluster_peers_accepted_total",
                "Sessions accepted as cluster peers (a hop id in SETUP and a grant of the whole tree both ways, docs/protocol.md §4.10).",
                &self.inbound_peers,
            ),
            (
                "cluster_peers_refused_total",
                "Sessions with a hop id whose token does not grant the whole tree both ways: served as clients, not as cluster peers.",
                &self.refused_peers,
            ),
        ] {
            let _ = writeln!(out, "# HELP skiff_relay_{name} {help}");
            let _ = writeln!(out, "# TYPE skiff_relay_{name} counter");
            let _ = writeln!(out, "skiff_relay_{name} {}", c.load(Ordering::Relaxed));
        }
    }
}

/// The per-transport series, summed over threads:
/// `skiff_relay_transport_*{transport="tcp|tls|ws|quic|webtransport"}`.
fn render_transports(out: &mut String, total: &Snapshot) {
    type Get = fn(&TransportSnapshot) -> u64;
    let families: [(&str, &str, &str, Get); 3] = [
        (
            "connections_open",
            "gauge",
            "Connections open, by transport (tcp until a connection's first bytes say more).",
            |t| t.open,
        ),
        (
            "received_bytes_total",
            "counter",
            "Bytes read from peers, by transport (quic: UDP payloads, sampled every 100 ms; webtransport: its connections' UDP payloads, added as each ends).",
            |t| t.bytes_in,
        ),
        (
            "sent_bytes_total",
            "counter",
            "Bytes written to peers, by transport (quic: UDP payloads, sampled every 100 ms; webtransport: its connections' UDP payloads, added as each ends).",
            |t| t.bytes_out,
        ),
    ];
    // Writing to a String cannot fail.
    for (name, kind, help, get) in families {
        let _ = writeln!(out, "# HELP skiff_relay_transport_{name} {help}");
        let _ = writeln!(out, "# TYPE skiff_relay_transport_{name} {kind}");
        for (label, t) in TransportLabel::ALL.iter().zip(&total.transports) {
            let _ = writeln!(
                out,
                "skiff_relay_transport_{name}{{transport=\"{}\"}} {}",
                label.as_str(),
                get(t)
            );
        }
    }
}

// ---------------------------------------------------------------------------
// HTTP endpoint
// ---------------------------------------------------------------------------

/// Longest request head read before answering 431.
const MAX_REQUEST_HEAD: usize = 8 * 1024;
/// Time one scrape connection may take in all, from accept to the response
/// written: a client sending (or reading) a byte now and then is cut off.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Scrape connections served at once; past that a new one is refused.
const MAX_CONNECTIONS: usize = 16;
/// Timeout of the connect that wakes the accept loop when the server stops.
const WAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// The answer to a connection over [`MAX_CONNECTIONS`].
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

/// How much the endpoint serves at once and for how long.
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Time a connection may take, from accept to the response written.
    deadline: Duration,
    /// Connections served at once.
    connections: usize,
}

impl Limits {
    const DEFAULT: Self = Limits {
        deadline: REQUEST_DEADLINE,
        connections: MAX_CONNECTIONS,
    };
}

/// A tiny blocking HTTP/1.1 server answering every GET or HEAD, whatever the
/// path, with [`Metrics::render`]. Stops when dropped.
///
/// The accept loop runs on its own thread and hands each connection to a
/// short-lived thread of its own: up to 16 at once, each cut off 5 s after
/// it was accepted, whatever it sent by then. A connection past the limit is
/// closed at once, after a 503 written without waiting (best effort), so a
/// few slow or stuck clients cannot hold the endpoint for the scraper.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Connections being served now.
    #[cfg(test)]
    active: Arc<AtomicUsize>,
}

impl MetricsServer {
    /// Binds `addr` and serves `metrics` from new threads, one request per
    /// connection (see the type's docs for the limits).
    ///
    /// # Errors
    /// The address cannot be bound or the thread cannot be spawned.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<Self> {
        Self::start_with(addr, metrics, Limits::DEFAULT)
    }

    fn start_with(addr: SocketAddr, metrics: Arc<Metrics>, limits: Limits) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let (stop2, active2) = (stop.clone(), active.clone());
        let thread = std::thread::Builder::new()
            .name("skiff-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(s) => admit(s, &metrics, &active2, limits),
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics accept failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
            #[cfg(test)]
            active,
        })
    }

    /// The address actually bound (resolves port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Scrape connections being served now.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept; failure means it is already gone.
        let _ = TcpStream::connect_timeout(&self.addr, WAKE_TIMEOUT);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Connection threads still running end by their deadline.
    }
}

/// One connection counted in [`MetricsServer::connections`] while it lives.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `s` on a thread of its own, or refuses it at once when
/// `limits.connections` are being served.
fn admit(s: TcpStream, metrics: &Arc<Metrics>, active: &Arc<AtomicUsize>, limits: Limits) {
    let deadline = Instant::now() + limits.deadline;
    // Only the accept thread adds, so the count cannot pass the limit
    // between this check and the add.
    if active.load(Ordering::Acquire) >= limits.connections {
        tracing::debug!("metrics connection refused: too many at once");
        // Non-blocking: a peer that reads nothing cannot stall the accept loop.
        if s.set_nonblocking(true).is_ok() {
            let _ = (&s).write(BUSY);
        }
        return;
    }
    active.fetch_add(1, Ordering::AcqRel);
    let counted = Active(active.clone());
    let metrics = metrics.clone();
    let spawned = std::thread::Builder::new()
        .name("skiff-metrics-conn".into())
        .spawn(move || {
            let _counted = counted;
            if let Err(e) = serve_one(s, &metrics, deadline) {
                tracing::debug!(error = %e, "metrics request failed");
            }
        });
    // On failure the closure is dropped: the connection closes and its
    // count is given back.
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics connection thread not spawned");
    }
}

/// The time left until `deadline`, or a timed-out error once it passed.
fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "metrics request deadline passed",
        ));
    }
    Ok(left)
}

/// Answers the one request of `s`, giving up at `deadline`.
fn serve_one(mut s: TcpStream, metrics: &Metrics, deadline: Instant) -> io::Result<()> {
    let mut head = [0u8; MAX_REQUEST_HEAD];
    let mut len = 0;
    let complete = loop {
        let Some(free) = head.get_mut(len..) else {
            break false;
        };
        if free.is_empty() {
            break false;
        }
        // Each read waits at most for what is left of the whole request's time.
        s.set_read_timeout(Some(time_left(deadline)?))?;
        let n = s.read(free)?;
        if n == 0 {
            // Peer closed before finishing the head (e.g. our own wake-up connect).
            return Ok(());
        }
        len += n;
        if head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
    };
    if !complete {
        return respond(
            &mut s,
            deadline,
            "431 Request Header Fields Too Large",
            "text/plain",
            b"request head too large\n",
            true,
        );
    }
    let line_end = head[..len].iter().position(|&b| b == b'\r').unwrap_or(len);
    let line = std::str::from_utf8(&head[..line_end]).unwrap_or("");
    let method = line.split(' ').next().unwrap_or("");
    match method {
        "GET" | "HEAD" => {
            let body = metrics.render();
            respond(
                &mut s,
                deadline,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                body.as_bytes(),
                method == "GET",
            )
        }
        _ => respond(
            &mut s,
            deadline,
            "405 Method Not Allowed",
            "text/plain",
            b"use GET\n",
            true,
        ),
    }
}

fn respond(
    s: &mut TcpStream,
    deadline: Instant,
    status: &str,
    ctype: &str,
    body: &[u8],
    with_body: bool,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    write_by(s, head.as_bytes(), deadline)?;
    if with_body {
        write_by(s, body, deadline)?;
    }
    Ok(())
}

/// Writes all of `buf` to `s`, giving up at `deadline` (however slowly the
/// peer reads).
fn write_by(s: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        s.set_write_timeout(Some(time_left(deadline)?))?;
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = buf.get(n..).unwrap_or(&[]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_series_escape_their_labels() {
        let m = Metrics::new(1);
        let p = m.add_peer("tcp://a:1/x\"y");
        p.session(true);
        p.announcement(Some(true));
        p.announcement(None);
        p.announcement(Some(true));
        p.announcement(Some(false));
        p.served(0, 3);
        p.served(3, 1);
        p.announced(2);
        p.announced(5);
        let text = m.render();
        assert!(text.contains("_announcements_sent_total{peer=\"tcp://a:1/x\\\"y\"} 7"));
        assert!(
            text.contains("skiff_relay_peer_sessions_open{peer=\"tcp://a:1/x\\\"y\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("skiff_relay_peer_routes{peer=\"tcp://a:1/x\\\"y\"} 1"),
            "{text}"
        );
        assert!(text.contains("_announcements_received_total{peer=\"tcp://a:1/x\\\"y\"} 4"));
        assert!(
            text.contains("skiff_relay_peer_subscriptions_served{peer=\"tcp://a:1/x\\\"y\"} 1")
        );
        assert!(
            text.contains(
                "skiff_relay_peer_subscriptions_served_total{peer=\"tcp://a:1/x\\\"y\"} 3"
            )
        );
        m.remove_peer(&p);
        assert!(!m.render().contains("peer=\""));
    }

    #[test]
    fn render_sums_threads_and_labels_each() {
        let m = Metrics::new(2);
        m.thread(0).connection_opened();
        m.thread(1).connection_opened();
        m.thread(1).connection_opened();
        m.thread(1).connection_closed();
        m.thread(0).connection_refused();
        m.thread(0).add_bytes_in(10);
        m.thread(1).add_bytes_out(7);
        m.thread(1).set_driver(ActiveDriver::Legacy);
        let text = m.render();
        for want in [
            "skiff_relay_worker_threads 2\n",
            "skiff_relay_connections_accepted_total 3\n",
            "skiff_relay_connections_open 2\n",
            "skiff_relay_connections_refused_total 1\n",
            "skiff_relay_received_bytes_total 10\n",
            "skiff_relay_sent_bytes_total 7\n",
            "skiff_relay_thread_connections_accepted_total{thread=\"1\"} 2\n",
            "skiff_relay_thread_io_uring{thread=\"1\"} 0\n",
            "# TYPE skiff_relay_connections_open gauge\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!text.contains("skiff_relay_thread_io_uring{thread=\"0\"}"));
        assert_eq!(m.total().accepted, 3);
    }

    #[test]
    fn quic_steering_is_one_gauge_for_the_relay() {
        let m = Metrics::new(3);
        assert!(m.render().contains("\nskiff_relay_quic_steering 0\n"));
        m.set_quic_steering(true);
        let text = m.render();
        assert!(text.contains("# TYPE skiff_relay_quic_steering gauge\n"));
        assert!(text.contains("\nskiff_relay_quic_steering 1\n"));
        assert!(!text.contains("skiff_relay_thread_quic_steering"));
    }

    #[test]
    fn transports_are_labelled_and_summed_over_threads() {
        let m = Metrics::new(2);
        m.thread(0).transport_opened(TransportLabel::Tcp);
        m.thread(1).transport_opened(TransportLabel::Quic);
        m.thread(1).transport_opened(TransportLabel::Ws);
        m.thread(1).transport_closed(TransportLabel::Ws);
        m.thread(0).add_bytes_out_on(TransportLabel::Tls, 5);
        m.thread(1).add_bytes_out_on(TransportLabel::Ws, 6);
        m.thread(0).add_bytes_in_on(TransportLabel::Ws, 3);
        m.thread(0).set_quic_bytes(100, 40);
        m.thread(1).set_quic_bytes(1, 2);
        m.thread(0).set_quic_io(3, 50, 7, 90);
        m.thread(1).set_quic_io(1, 4, 2, 3);
        let text = m.render();
        for want in [
            "skiff_relay_transport_connections_open{transport=\"tcp\"} 1\n",
            "skiff_relay_transport_connections_open{transport=\"ws\"} 0\n",
            "skiff_relay_transport_connections_open{transport=\"quic\"} 1\n",
            "skiff_relay_transport_sent_bytes_total{transport=\"tls\"} 5\n",
            "skiff_relay_transport_sent_bytes_total{transport=\"ws\"} 6\n",
            "skiff_relay_transport_sent_bytes_total{transport=\"quic\"} 101\n",
            "skiff_relay_transport_received_bytes_total{transport=\"quic\"} 42\n",
            "skiff_relay_quic_receive_calls_total 4\n",
            "skiff_relay_quic_received_datagrams_total 54\n",
            "skiff_relay_quic_send_calls_total 9\n",
            "skiff_relay_quic_sent_datagrams_total 93\n",
            "skiff_relay_thread_quic_send_calls_total{thread=\"1\"} 2\n",
            // The TCP port's totals leave QUIC's datagrams out.
            "skiff_relay_sent_bytes_total 11\n",
            "skiff_relay_received_bytes_total 3\n",
            "# TYPE skiff_relay_transport_sent_bytes_total counter\n",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    /// Sends a GET and reads the whole response (empty if the server closed
    /// the connection without one).
    fn get(addr: SocketAddr) -> io::Result<String> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(15)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: relay\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    /// Waits (at most 10 s) until `server` serves `n` connections.
    fn wait_connections(server: &MetricsServer, n: usize) {
        let start = Instant::now();
        while server.connections() != n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} connections served, not {n}",
                server.connections()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_trickling_client_neither_holds_up_others_nor_outlasts_its_deadline() {
        let deadline = Duration::from_secs(3);
        let limits = Limits {
            deadline,
            connections: 4,
        };
        let metrics = Arc::new(Metrics::new(1));
        let server =
            MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), metrics, limits).unwrap();
        let addr = server.local_addr();

        // One byte of a request head that never ends, every 200 ms, until
        // the server cuts the connection (or 15 s passed).
        let connected = Instant::now();
        let trickler = TcpStream::connect(addr).unwrap();
        let mut writer = trickler.try_clone().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let trickle = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) && connected.elapsed() < Duration::from_secs(15) {
                if writer.write_all(b"G").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        // When the server closed the trickler's connection (`None`: not
        // within 15 s).
        let cut = std::thread::spawn(move || {
            let mut r = trickler;
            r.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            let mut buf = [0u8; 256];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => return Some(Instant::now()),
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                    {
                        return None;
                    }
                    Err(_) => return Some(Instant::now()),
                }
            }
        });
        // The server is busy with the trickler before the scrape comes.
        std::thread::sleep(Duration::from_millis(300));

        let response = get(addr).expect("scrape while a client trickles");
        let answered = Instant::now();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.contains("skiff_relay_worker_threads 1\n"),
            "{response}"
        );

        let cut = cut.join().unwrap().expect("trickler not cut off");
        stop.store(true, Ordering::Relaxed);
        trickle.join().unwrap();
        assert!(
            answered < cut,
            "the scrape waited for the trickler to be cut off"
        );
        assert!(
            cut.duration_since(connected) >= deadline / 2,
            "cut off after {:?}, before its deadline",
            cut.duration_since(connected)
        );
    }

    #[test]
    fn connections_past_the_limit_are_refused_at_once() {
        let limits = Limits {
            deadline: Duration::from_secs(30),
            connections: 2,
        };
        let metrics = Arc::new(Metrics::new(1));
        let server =
            MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), metrics, limits).unwrap();
        let addr = server.local_addr();
        let idle: Vec<_> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        wait_connections(&server, 2);
        // Refused long before the idle ones' deadline: a 503, or the
        // connection closed (or reset) before it could be read.
        let start = Instant::now();
        let refused = get(addr).unwrap_or_default();
        assert!(
            refused.is_empty() || refused.starts_with("HTTP/1.1 503 "),
            "{refused}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not refused at once"
        );
        assert_eq!(server.connections(), 2);
        drop(idle);
        wait_connections(&server, 0);
        let response = get(addr).unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    }

    #[test]
    fn counters_are_cache_line_aligned() {
        assert_eq!(core::mem::align_of::<ThreadCounters>(), 64);
    }
}
