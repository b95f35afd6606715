//! Cluster peering (README "Running a cluster", docs/protocol.md §4.3,
//! §4.10): the peers this relay dials ([`Cluster`], one per process, shared
//! by the workers), the run-time peer list (`--cluster-connect-api`, read by
//! a thread of its own) and each worker's supervisor, which runs one dial
//! loop per peer ([`RelayHandler::spawn_dial`]) and ends the loops of
//! removed peers.
//!
//! A peer link is one moq-lite session per worker, dialed as a leaf dials
//! its upstream (`tcp://`, `tls://` or `moql://`, the token as `?jwt=` in
//! SETUP's Path): over it this relay asks for the peer's announcements and
//! the peer asks for this relay's, so it carries both directions.

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::config::cluster::parse_peer_list_json;
use crate::config::{ClusterPeer, PeerListError, PeerListSource, RelayConfig};
use crate::metrics::{Metrics, PeerCounters};

use super::*;

/// How often a peer-list file's modification time and size are looked at.
const FILE_POLL: Duration = Duration::from_secs(1);
/// How often a peer-list URL is asked again.
const HTTP_POLL: Duration = Duration::from_secs(10);
/// The longest a peer-list request may take, from connect to the last byte.
const HTTP_DEADLINE: Duration = Duration::from_secs(5);
/// The largest peer list read.
const MAX_LIST_BYTES: u64 = 1 << 20;
/// How often a worker's supervisor looks for a changed peer set.
const SUPERVISE_POLL: StdDuration = StdDuration::from_millis(200);

/// One peer of the cluster, shared by the workers that dial it.
pub struct PeerLink {
    /// The process-wide number of this peer entry (never reused): it keeps
    /// the ids of its sessions apart from every other peer's.
    pub(super) slot: u32,
    /// The peer as configured.
    pub(super) peer: ClusterPeer,
    /// Its identity as log lines and metrics show it (no query).
    shown: &'static str,
    /// What its SETUP's Path carries: path, query and token (owned by the
    /// link and its dial loops: a token rotated in the peer list leaves
    /// nothing behind once the old link's sessions end).
    path: Arc<str>,
    /// Whether it was removed from the peer list (its dial loops end).
    cancelled: AtomicBool,
    /// Whether it comes from `--cluster-connect` (never removed).
    fixed: bool,
    /// Its counters (routes learned, announcements, subscriptions served).
    pub(super) stats: Arc<PeerCounters>,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("slot", &self.slot)
            .field("peer", &self.shown)
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl PeerLink {
    /// Whether the peer was removed from the list.
    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The peer's identity without query.
    pub(super) fn shown(&self) -> &'static str {
        self.shown
    }
}

/// The peers this relay dials: those of `--cluster-connect` and those of
/// the current `--cluster-connect-api` list.
pub struct Cluster {
    peers: Mutex<Vec<Arc<PeerLink>>>,
    /// Bumped at every change of `peers` (the supervisors compare it).
    version: AtomicU64,
    next_slot: AtomicU32,
    /// The token of `--cluster-token`, for peers without one of their own.
    token: Option<String>,
    /// `--cluster-node`: this relay's own URL.
    node: Option<String>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("peers", &self.snapshot().len())
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// The cluster of `config` (its token file read now), with its fixed
    /// peers; `None` when it names no peer and no peer list. A peer list
    /// source starts its reader thread.
    pub fn start(config: &RelayConfig, metrics: Arc<Metrics>) -> Option<Arc<Cluster>> {
        if let Some(id) = config.cluster_id
            && id >= crate::config::cluster::JS_SAFE_CLUSTER_ID
        {
            tracing::warn!(
                cluster_id = id,
                "--cluster-id is 2^53 or more: older JavaScript clients cannot read it"
            );
        }
        if config.cluster_connect.is_empty() && config.cluster_connect_api.is_none() {
            return None;
        }
        let token = config.cluster_token.as_ref().and_then(|file| {
            crate::config::cluster::read_token(file)
                .map_err(|e| tracing::warn!(error = %e, "no --cluster-token for the peers"))
                .ok()
        });
        let cluster = Arc::new(Cluster {
            peers: Mutex::new(Vec::new()),
            version: AtomicU64::new(0),
            next_slot: AtomicU32::new(0),
            token,
            node: config.cluster_node.clone(),
            metrics,
        });
        {
            let mut peers = cluster.lock();
            for p in &config.cluster_connect {
                peers.push(cluster.link(p.clone(), true));
            }
        }
        cluster.version.fetch_add(1, Ordering::Release);
        tracing::info!(
            peers = config.cluster_connect.len(),
            list = config
                .cluster_connect_api
                .as_ref()
                .map(tracing::field::display),
            "cluster peering on"
        );
        if let Some(source) = config.cluster_connect_api.clone() {
            let weak = Arc::downgrade(&cluster);
            let spawned = std::thread::Builder::new()
                .name("skiff-peer-list".into())
                .spawn(move || watch_list(weak, source));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the peer list reader");
            }
        }
        Some(cluster)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PeerLink>>> {
        match self.peers.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The peers dialed now.
    pub fn snapshot(&self) -> Vec<Arc<PeerLink>> {
        self.lock().clone()
    }

    /// The identities of the peers dialed now, in the order they were added.
    pub fn peer_keys(&self) -> Vec<String> {
        self.lock().iter().map(|p| p.shown.to_owned()).collect()
    }

    /// A new link to `peer` (its counters registered with the metrics).
    fn link(&self, peer: ClusterPeer, fixed: bool) -> Arc<PeerLink> {
        let shown = intern(peer.key());
        let mut path = format!("/{}", peer.addr.path);
        if let Some(token) = peer.token.as_deref().or(self.token.as_deref()) {
            path.push(if path.contains('?') { '&' } else { '?' });
            path.push_str("jwt=");
            path.push_str(token);
        }
        Arc::new(PeerLink {
            slot: self.next_slot.fetch_add(1, Ordering::Relaxed),
            peer,
            shown,
            path: Arc::from(path),
            cancelled: AtomicBool::new(false),
            fixed,
            stats: self.metrics.add_peer(shown),
        })
    }

    /// Takes `list` as the run-time peer list: its peers not dialed yet are
    /// added, those of the last list not in it are removed (their sessions
    /// closed), and a peer whose entry changed (cost, token) is dialed anew.
    /// `--cluster-connect` peers stay whatever the list says.
    pub fn apply_list(&self, list: Vec<ClusterPeer>) {
        let mut peers = self.lock();
        let mut changed = false;
        peers.retain(|p| {
            let keep = p.fixed || list.iter().any(|q| *q == p.peer);
            if !keep {
                p.cancelled.store(true, Ordering::Relaxed);
                self.metrics.remove_peer(&p.stats);
                tracing::info!(peer = %p.shown, "cluster peer left the list: closing its sessions");
                changed = true;
            }
            keep
        });
        for q in list {
            if peers.iter().any(|p| p.peer.key() == q.key()) {
                continue;
            }
            tracing::info!(peer = %q, "cluster peer joined the list: dialing it");
            let link = self.link(q, false);
            peers.push(link);
            changed = true;
        }
        if changed {
            self.version.fetch_add(1, Ordering::Release);
        }
    }

    /// Parses a peer list's text and takes it ([`Cluster::apply_list`]).
    ///
    /// # Errors
    /// The text is not a valid peer list; the current one stays.
    pub fn apply_json(&self, text: &str) -> Result<(), PeerListError> {
        let list = parse_peer_list_json(text, self.node.as_deref())?;
        self.apply_list(list);
        Ok(())
    }
}

/// The most peer identities kept for the life of the process ([`intern`]).
const MAX_INTERNED: usize = 4096;

/// The identity shown for peers past [`MAX_INTERNED`].
const OVERFLOW_NAME: &str = "cluster-peer";

/// The peer identities kept so far ([`intern`]).
static INTERNED: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();

/// A peer identity (a URL without its query, so never a token) kept for
/// the life of the process, once per distinct value: the names of sessions
/// and the metrics' labels borrow it. The table holds at most
/// [`MAX_INTERNED`] identities; past that, peers are shown as
/// [`OVERFLOW_NAME`] (a warning says so once), so a peer list that keeps
/// naming new hosts cannot grow it forever. SETUP paths, which hold the
/// tokens, are owned by their links instead.
fn intern(s: String) -> &'static str {
    let set = INTERNED.get_or_init(|| Mutex::new(HashSet::new()));
    let mut set = match set.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(s) = set.get(s.as_str()) {
        return s;
    }
    if set.len() >= MAX_INTERNED {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                max = MAX_INTERNED,
                "more distinct cluster peers than names kept: further ones are shown as `{OVERFLOW_NAME}`"
            );
        }
        return OVERFLOW_NAME;
    }
    let leaked: &'static str = Box::leak(s.into_boxed_str());
    set.insert(leaked);
    leaked
}

/// How many peer identities [`intern`] keeps.
#[cfg(test)]
fn interned() -> usize {
    INTERNED
        .get()
        .map_or(0, |s| s.lock().map_or(0, |g| g.len()))
}

impl RelayHandler {
    /// Runs this worker's cluster supervisor: one dial loop per peer of
    /// `cluster` (started as peers join), each ending once its peer is
    /// removed or the worker drains.
    pub(super) fn spawn_cluster(&self, info: &WorkerInfo, cluster: Arc<Cluster>) {
        let handler = self.clone();
        let info = info.clone();
        monoio::spawn(async move {
            let mut seen = u64::MAX;
            let mut running: HashSet<u32> = HashSet::new();
            let mut tls_configs: HashMap<&'static str, Result<Arc<rustls::ClientConfig>, String>> =
                HashMap::new();
            while !info.shutdown.is_draining() {
                let version = cluster.version.load(Ordering::Acquire);
                if version != seen {
                    seen = version;
                    let peers = cluster.snapshot();
                    running.retain(|slot| peers.iter().any(|p| p.slot == *slot));
                    for p in peers {
                        if !running.insert(p.slot) {
                            continue;
                        }
                        let scheme = p.peer.addr.scheme;
                        let tls = scheme.is_secure().then(|| {
                            tls_configs
                                .entry(scheme.name())
                                .or_insert_with(|| upstream_tls(&info, scheme))
                                .clone()
                        });
                        let dial = Dial {
                            up: p.peer.addr.clone(),
                            path: p.path.clone(),
                            shown: p.shown,
                            tls,
                            peer: Some(p),
                        };
                        handler.spawn_dial(&info, dial);
                    }
                }
                monoio::select! {
                    _ = monoio::time::sleep(SUPERVISE_POLL) => {}
                    _ = info.shutdown.wait() => {}
                }
            }
        });
    }
}

/// What the peer list reader remembers of its source between reads.
#[derive(Default)]
struct Seen {
    /// A file's modification time and size at the last read.
    stamp: Option<(Option<std::time::SystemTime>, u64)>,
    /// An HTTP answer's `ETag` and `Last-Modified`.
    etag: Option<String>,
    last_modified: Option<String>,
}

/// The peer list reader's thread: reads `source` now and again (a file
/// when its modification time or size changes, a URL every
/// [`HTTP_POLL`]), hands each good list to the cluster and keeps the last
/// good one when a read or parse fails; ends once the cluster is gone.
fn watch_list(cluster: Weak<Cluster>, source: PeerListSource) {
    let mut seen = Seen::default();
    let mut failing = false;
    loop {
        let Some(c) = cluster.upgrade() else {
            return;
        };
        let read = match &source {
            PeerListSource::File(path) => read_file(path, &mut seen),
            PeerListSource::Http(url) => fetch_url(url, c.node.as_deref(), &mut seen),
        };
        match read.and_then(|text| match text {
            Some(text) => c.apply_json(&text).map(|()| true),
            None => Ok(false),
        }) {
            Ok(fresh) => {
                if fresh || failing {
                    tracing::info!(list = %source, peers = c.peer_keys().len(), "peer list read");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(list = %source, error = %e, "peer list not taken: keeping the last good one");
                }
                failing = true;
                // Read again at the next poll even if nothing changed.
                seen.stamp = None;
            }
        }
        drop(c);
        std::thread::sleep(match source {
            PeerListSource::File(_) => FILE_POLL,
            PeerListSource::Http(_) => HTTP_POLL,
        });
    }
}

/// The text of the peer-list file at `path`, or `None` if its modification
/// time and size are those of the last read.
fn read_file(path: &std::path::Path, seen: &mut Seen) -> Result<Option<String>, PeerListError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| PeerListError(format!("cannot read {}: {e}", path.display())))?;
    let stamp = (meta.modified().ok(), meta.len());
    if seen.stamp == Some(stamp) {
        return Ok(None);
    }
    if meta.len() > MAX_LIST_BYTES {
        return Err(PeerListError(format!(
            "{} is larger than {MAX_LIST_BYTES} bytes",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| PeerListError(format!("cannot read {}: {e}", path.display())))?;
    seen.stamp = Some(stamp);
    Ok(Some(text))
}

/// The body of a GET of the peer-list `url` (with `?node=` when this relay
/// names itself), or `None` when the server answers 304 Not Modified to the
/// `ETag`/`Last-Modified` of the last answer. HTTP/1.0 (no chunked bodies),
/// within [`HTTP_DEADLINE`].
fn fetch_url(
    url: &str,
    node: Option<&str>,
    seen: &mut Seen,
) -> Result<Option<String>, PeerListError> {
    let err = |what: &str| PeerListError(format!("peer list request failed: {what}"));
    let (secure, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(err("not an http(s) URL"));
    };
    let (authority, target) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    let mut target = target;
    if let Some(node) = node {
        target.push(if target.contains('?') { '&' } else { '?' });
        target.push_str("node=");
        for b in node.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                target.push(b as char);
            } else {
                target.push_str(&format!("%{b:02X}"));
            }
        }
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h, p.parse::<u16>().map_err(|_| err("bad port"))?)
        }
        _ => (authority, if secure { 443 } else { 80 }),
    };
    let host_name = host.trim_start_matches('[').trim_end_matches(']');
    let deadline = Instant::now() + HTTP_DEADLINE;
    use std::net::ToSocketAddrs;
    let addr = (host_name, port)
        .to_socket_addrs()
        .map_err(|e| err(&e.to_string()))?
        .next()
        .ok_or_else(|| err("the host has no address"))?;
    let stream = std::net::TcpStream::connect_timeout(&addr, HTTP_DEADLINE)
        .map_err(|e| err(&e.to_string()))?;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let _ = stream.set_read_timeout(Some(left()));
    let _ = stream.set_write_timeout(Some(left()));
    let mut request = format!(
        "GET {target} HTTP/1.0\r\nHost: {authority}\r\nAccept: application/json\r\nUser-Agent: skiff-relay\r\n"
    );
    if let Some(tag) = &seen.etag {
        request.push_str(&format!("If-None-Match: {tag}\r\n"));
    }
    if let Some(date) = &seen.last_modified {
        request.push_str(&format!("If-Modified-Since: {date}\r\n"));
    }
    request.push_str("\r\n");
    let mut raw = Vec::new();
    if secure {
        let config = skiff_monoio::tls::client_config_for(
            &skiff_monoio::tls::Trust::System,
            &[b"http/1.1".as_slice()],
        )
        .map_err(|e| err(&e.to_string()))?;
        let name = rustls::pki_types::ServerName::try_from(host_name.to_owned())
            .map_err(|e| err(&e.to_string()))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| err(&e.to_string()))?;
        let mut tls = rustls::StreamOwned::new(conn, stream);
        tls.write_all(request.as_bytes())
            .map_err(|e| err(&e.to_string()))?;
        read_bounded(&mut tls, &mut raw, deadline).map_err(|e| err(&e.to_string()))?;
    } else {
        let mut stream = stream;
        stream
            .write_all(request.as_bytes())
            .map_err(|e| err(&e.to_string()))?;
        read_bounded(&mut stream, &mut raw, deadline).map_err(|e| err(&e.to_string()))?;
    }
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| err("no complete answer"))?;
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| err("no status line"))?;
    if status == 304 {
        return Ok(None);
    }
    if !(200..300).contains(&status) {
        return Err(err(&format!("status {status}")));
    }
    let (mut etag, mut last_modified) = (None, None);
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "etag" => etag = Some(value.trim().to_owned()),
                "last-modified" => last_modified = Some(value.trim().to_owned()),
                _ => {}
            }
        }
    }
    let text = String::from_utf8(body.to_vec()).map_err(|_| err("the body is not UTF-8"))?;
    // The validators count only once the list is taken; a list refused is
    // asked for in full again.
    seen.etag = etag;
    seen.last_modified = last_modified;
    Ok(Some(text))
}

/// Reads `r` to its end into `out`, at most [`MAX_LIST_BYTES`] and 16 KiB of
/// head, before `deadline`.
fn read_bounded(
    r: &mut impl std::io::Read,
    out: &mut Vec<u8>,
    deadline: Instant,
) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        if Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "too slow",
            ));
        }
        let n = match r.read(&mut buf) {
            Ok(n) => n,
            // A TLS peer that closes without close_notify: the body is whole
            // when it is JSON that parses.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(());
        }
        out.extend_from_slice(&buf[..n]);
        if out.len() as u64 > MAX_LIST_BYTES + 16 * 1024 {
            return Err(std::io::Error::other("the answer is too large"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter() {
        let mut j = upstream::Jitter::new(7);
        let base = StdDuration::from_millis(1000);
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            let d = j.spread(base);
            assert!(d >= StdDuration::from_millis(750) && d <= StdDuration::from_millis(1250));
            seen.insert(d.as_millis());
        }
        assert!(seen.len() > 100, "spread over the range: {}", seen.len());
    }

    /// A cluster of `connect` (fixed peers) with its metrics.
    fn cluster(connect: &[&str]) -> (Arc<Cluster>, Arc<Metrics>) {
        let config = RelayConfig {
            cluster_connect: connect.iter().map(|u| u.parse().unwrap()).collect(),
            cluster_node: Some("tcp://me:1/".to_owned()),
            ..RelayConfig::default()
        };
        let metrics = Arc::new(Metrics::new(1));
        let c = Cluster::start(&config, metrics.clone()).expect("peers configured");
        (c, metrics)
    }

    #[test]
    fn lists_add_change_and_remove_peers_around_the_fixed_ones() {
        let (c, metrics) = cluster(&["tcp://a:1/"]);
        let v0 = c.version.load(Ordering::Acquire);
        c.apply_json(r#"["tcp://b:2/", "tcp://a:1/?jwt=X", "tcp://me:1/"]"#)
            .unwrap();
        assert_eq!(
            c.peer_keys(),
            ["tcp://a:1/", "tcp://b:2/"],
            "own node skipped, fixed kept"
        );
        assert_eq!(metrics.peers().len(), 2);
        let b = c.snapshot()[1].clone();
        let v1 = c.version.load(Ordering::Acquire);
        assert!(v1 > v0);
        // The same list again changes nothing.
        c.apply_json(r#"["tcp://b:2/", "tcp://a:1/?jwt=X"]"#)
            .unwrap();
        assert_eq!(c.version.load(Ordering::Acquire), v1);
        // A list that does not parse changes nothing either.
        assert!(c.apply_json("[oops").is_err());
        assert!(c.apply_json(r#"["b:2"]"#).is_err());
        assert_eq!(c.peer_keys().len(), 2);
        assert!(!b.is_cancelled());
        // A new token for b: the old link ends, a new one is dialed.
        c.apply_json(r#"["tcp://b:2/?jwt=NEW"]"#).unwrap();
        assert!(b.is_cancelled());
        let b2 = c.snapshot()[1].clone();
        assert_ne!(b2.slot, b.slot);
        assert!(b2.path.ends_with("?jwt=NEW"), "the peer's own token");
        assert!(
            !format!("{b2:?} {c:?}").contains("NEW"),
            "Debug hides tokens"
        );
        // An empty list leaves the fixed peer only.
        c.apply_json("[]").unwrap();
        assert!(b2.is_cancelled());
        assert_eq!(c.peer_keys(), ["tcp://a:1/"]);
        assert_eq!(metrics.peers().len(), 1);
    }

    /// A peer whose token the list rotates 1,000 times: each rotation
    /// dials a new link, and nothing of the old ones stays (their SETUP
    /// paths are dropped with them, the identity is kept once).
    #[test]
    fn rotating_a_peers_token_keeps_nothing_behind() {
        let (c, metrics) = cluster(&["tcp://fixed:9/"]);
        c.apply_json(r#"["tcp://rotated:7/room?jwt=T0"]"#).unwrap();
        let first = Arc::downgrade(&c.snapshot()[1]);
        let kept = interned();
        let mut old = Vec::new();
        for i in 1..=1000 {
            c.apply_json(&format!(r#"["tcp://rotated:7/room?jwt=T{i}"]"#))
                .unwrap();
            let links = c.snapshot();
            assert_eq!(links.len(), 2);
            assert!(links[1].path.ends_with(&format!("?jwt=T{i}")));
            old.push(Arc::downgrade(&links[1]));
        }
        // Other tests of this process intern their own peers meanwhile, but
        // never this one's rotations.
        assert!(
            interned() <= kept + 16,
            "interned {} after 1,000 rotations (was {kept})",
            interned()
        );
        old.pop();
        assert!(first.upgrade().is_none(), "the first link is gone");
        assert!(
            old.iter().all(|w| w.upgrade().is_none()),
            "every replaced link is gone, its token with it"
        );
        assert_eq!(metrics.peers().len(), 2, "two peers' counters listed");
    }

    #[test]
    fn interned_strings_are_kept_once() {
        let a = intern("tcp://a:1/".to_owned());
        let b = intern("tcp://a:1/".to_owned());
        assert!(std::ptr::eq(a, b));
    }
}
