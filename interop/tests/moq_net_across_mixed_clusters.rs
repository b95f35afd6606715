//! Mixed clusters of `skiff-relay` and the published `moq-relay` 0.17.10 in a
//! line over plain TCP, skiff — moq-relay — skiff and moq-relay — skiff —
//! moq-relay (each node dials the one before it with `--cluster-connect`,
//! each with its own `--cluster-id`), with clients on every node:
//!
//! - every node has a moq-net 0.3.18 publisher of its own broadcast
//!   (`pub-N`) and a skiff SDK publisher (`sdk-N`), both writing a paced
//!   stream (`moq_net_live::frame`: a frame every 20 ms, five a group, one of
//!   them over 20 KiB) until the test ends;
//! - every node has moq-net viewers ([`reference::dial_subscriber`]) of
//!   every other node's broadcasts and skiff SDK viewers of every other
//!   node's moq-net broadcast, each reading [`GROUPS`] groups from the live
//!   edge: they arrive one after another, every frame with its bytes, order
//!   and timestamp.
//!
//! The restart tests kill the middle node of each line with SIGKILL and start
//! it again on its port, while a moq-net viewer at each end watches the
//! publisher at the other: each reads frames again after the restart, every
//! frame checked, in order within a subscription (a viewer subscribes again
//! when its subscription ends; a gap of groups is allowed).
//!
//! moq-relay is found as `moq_relay_binary` says and skiff-relay next to the
//! test binary (`cargo build -p skiff-relay`) or at `$SKIFF_RELAY_BIN`;
//! without either the tests print a skip line and pass.

mod moq_net_live;
mod moq_relay;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use moq_net_live::{Dial, FRAME_GAP, FRAMES, Watched};
use moq_relay::{INSTALL, MoqRelay, moq_relay_binary};
use skiff_interop::reference::{self, Options, Received, SubscribeRequest};
use skiff_monoio::driver::{self, DriverKind};
use skiff_testkit::relay_process::RelayProcess;

/// SETUP path of every client: the session root, under which its broadcasts
/// cross the cluster (the peers dial the root, `/`).
const PATH: &str = "/anon";
const TRACK: &str = "video";
/// Complete groups each viewer of the cluster tests reads.
const GROUPS: usize = 6;
/// Bound on a viewer's whole run (finding the broadcast across the cluster
/// included).
const VIEW: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------
// The nodes
// ---------------------------------------------------------------------------

/// Which relay a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Skiff,
    Moq,
}

/// The binaries of both relays.
struct Bins {
    skiff: PathBuf,
    moq: PathBuf,
}

/// Both relay binaries, or `None` after printing a skip line.
fn bins() -> Option<Bins> {
    let Some(moq) = moq_relay_binary() else {
        eprintln!("SKIP: no moq-relay; {INSTALL}");
        return None;
    };
    let skiff = std::env::var_os("SKIFF_RELAY_BIN")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            // target/debug/deps/THIS-TEST → target/debug/skiff-relay
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("skiff-relay"))
        })
        .filter(|p| p.is_file());
    let Some(skiff) = skiff else {
        eprintln!(
            "SKIP: no skiff-relay binary (cargo build -p skiff-relay, or set SKIFF_RELAY_BIN)"
        );
        return None;
    };
    Some(Bins { skiff, moq })
}

/// A running relay of either kind, killed when dropped.
enum Relay {
    Skiff(RelayProcess),
    Moq(MoqRelay),
}

/// One node of a line: what it runs, its id, whom it dials, and the relay
/// (none while it is down).
struct Node {
    kind: Kind,
    id: u64,
    peer: Option<String>,
    addr: SocketAddr,
    relay: Option<Relay>,
}

impl Node {
    /// Starts a `kind` relay with cluster id `id`, dialing `peer` if given,
    /// on `addr` (a free port when `None`).
    fn start(
        bins: &Bins,
        kind: Kind,
        id: u64,
        peer: Option<String>,
        addr: Option<SocketAddr>,
    ) -> Node {
        let id_text = id.to_string();
        let mut args = vec!["--cluster-id", id_text.as_str()];
        if let Some(peer) = &peer {
            args.extend(["--cluster-connect", peer.as_str()]);
        }
        let relay = match kind {
            Kind::Skiff => {
                let listen = addr.map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
                // A route lost with its peer is kept this long for the peer's return.
                args.extend(["--failover-grace", "20s"]);
                Relay::Skiff(RelayProcess::start_on(&bins.skiff, &listen, 1, &args))
            }
            Kind::Moq => Relay::Moq(MoqRelay::start_with(&bins.moq, addr, "**", &args)),
        };
        let addr = match &relay {
            Relay::Skiff(r) => r.addr,
            Relay::Moq(r) => r.addr,
        };
        Node {
            kind,
            id,
            peer,
            addr,
            relay: Some(relay),
        }
    }

    /// The URL a peer dials (`tcp://ADDR/`).
    fn url(&self) -> String {
        format!("tcp://{}/", self.addr)
    }

    /// Kills its relay at once (SIGKILL), as a crashed node.
    fn kill9(&mut self) {
        match self.relay.take() {
            Some(Relay::Skiff(mut r)) => {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            Some(Relay::Moq(mut r)) => r.kill9(),
            None => {}
        }
    }

    /// Starts its relay again on its port, with the same id and peer.
    fn restart(&mut self, bins: &Bins) {
        let again = Node::start(bins, self.kind, self.id, self.peer.clone(), Some(self.addr));
        self.relay = again.relay;
    }

    /// What moq-relay logged, for a failure's message (skiff-relay's log
    /// shows with `SKIFF_RELAY_LOG=LEVEL`).
    fn log(&self) -> String {
        match &self.relay {
            Some(Relay::Moq(r)) => format!("node {} (moq-relay):\n{}", self.id, r.log_text()),
            _ => String::new(),
        }
    }
}

/// A line of three nodes of `kinds`, each dialing the one before it.
fn line(bins: &Bins, kinds: [Kind; 3]) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    for (n, kind) in kinds.into_iter().enumerate() {
        let peer = nodes.last().map(Node::url);
        nodes.push(Node::start(bins, kind, n as u64 + 1, peer, None));
    }
    nodes
}

// ---------------------------------------------------------------------------
// The skiff SDK publisher
// ---------------------------------------------------------------------------

/// A skiff SDK client dialing `addr` and publishing `broadcast` with the
/// paced stream `seed` (the frames of `moq_net_live::frame`, written as the
/// moq-net publisher writes them) until `stop` is set: the number of groups
/// written.
fn spawn_sdk_publisher(
    addr: SocketAddr,
    broadcast: String,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<u64, String>> {
    use skiff_core::model::track::Info;
    use skiff_monoio::{Config, connect};
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let url = format!("tcp://{addr}{PATH}");
            let (client, runner) =
                connect(&url, Config::default()).map_err(|e| format!("connect: {e:?}"))?;
            monoio::spawn(runner.run());
            let published = client
                .publish(&broadcast)
                .map_err(|e| format!("publish: {e:?}"))?;
            let info = Info::new(TRACK).map_err(|e| format!("track info: {e:?}"))?;
            let mut track = published
                .create_track(info)
                .map_err(|e| format!("track: {e:?}"))?;
            let mut g = 0;
            let result = loop {
                if stop.load(Ordering::SeqCst) {
                    break Ok(g);
                }
                let mut group = match track.create_group(g) {
                    Ok(group) => group,
                    Err(e) => break Err(format!("group {g}: {e:?}")),
                };
                let mut written = Ok(());
                for i in 0..FRAMES {
                    let frame = moq_net_live::frame(seed, g, i);
                    written = group.write_frame(frame.timestamp, &frame.payload).await;
                    if written.is_err() {
                        break;
                    }
                    monoio::time::sleep(FRAME_GAP).await;
                }
                if let Err(e) = written.and_then(|()| group.finish()) {
                    break Err(format!("group {g}: {e:?}"));
                }
                g += 1;
            };
            track.finish();
            drop(published);
            client.close().await;
            result
        })
        .map_err(|e| format!("runtime: {e}"))?
    })
}

/// A skiff SDK client dialing `addr` and reading `broadcast` (the paced
/// stream `seed`) from the live edge until it has [`GROUPS`] groups: the
/// (group, frame index) of every frame read, in order, each checked as it
/// came (bytes and timestamp), or what went wrong.
fn spawn_sdk_viewer(
    addr: SocketAddr,
    broadcast: String,
    seed: u64,
) -> std::thread::JoinHandle<Result<Vec<(u64, u64)>, String>> {
    use skiff_monoio::sdk::Request;
    use skiff_monoio::{Config, connect};
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let url = format!("tcp://{addr}{PATH}");
            let (client, runner) =
                connect(&url, Config::default()).map_err(|e| format!("connect: {e:?}"))?;
            monoio::spawn(runner.run());
            let request = Request {
                max_latency: skiff_core::time::Duration::from_secs(10),
                ..Request::LIVE
            };
            let reading = async {
                let mut track = client
                    .subscribe(&broadcast, TRACK, request)
                    .await
                    .map_err(|e| format!("subscribe: {e:?}"))?;
                let mut reads = Vec::new();
                let mut groups = 0;
                while groups < GROUPS {
                    let mut group = match track.next_group().await {
                        Ok(Some(group)) => group,
                        Ok(None) => return Err(format!("track ended after {reads:?}")),
                        Err(e) => return Err(format!("group: {e:?}")),
                    };
                    let g = group.sequence();
                    loop {
                        match group.read_frame().await {
                            Ok(Some(frame)) => {
                                let i = moq_net_live::check(
                                    seed,
                                    g,
                                    frame.timestamp,
                                    &frame.payload.to_vec(),
                                )?;
                                reads.push((g, i));
                            }
                            Ok(None) => break,
                            Err(e) => return Err(format!("group {g}: {e:?} after {reads:?}")),
                        }
                    }
                    groups += 1;
                }
                Ok(reads)
            };
            let result = monoio::select! {
                r = reading => r,
                () = monoio::time::sleep(VIEW) => Err("timed out".to_owned()),
            };
            client.close().await;
            result
        })
        .map_err(|e| format!("runtime: {e}"))?
    })
}

/// Checks what an SDK viewer read: [`GROUPS`] consecutive groups, each with
/// every frame in order.
fn check_sdk_reads(reads: &[(u64, u64)]) -> Result<(), String> {
    let first = reads.first().map_or(0, |&(g, _)| g);
    let want: Vec<(u64, u64)> = (first..first + GROUPS as u64)
        .flat_map(|g| (0..FRAMES).map(move |i| (g, i)))
        .collect();
    if reads == want {
        Ok(())
    } else {
        Err(format!("frames read {reads:?}"))
    }
}

// ---------------------------------------------------------------------------
// Every node publishing, every node viewing
// ---------------------------------------------------------------------------

/// The broadcasts of node `n` (index in the line) and their streams' seeds:
/// the moq-net publisher's and the skiff SDK publisher's.
fn broadcasts(n: usize) -> [(String, u64); 2] {
    let n = n as u64;
    [(format!("pub-{n}"), n), (format!("sdk-{n}"), 100 + n)]
}

/// A line of `kinds` with both publishers on every node and a moq-net
/// viewer on every node of every other node's broadcasts.
fn every_node(kinds: [Kind; 3]) {
    let Some(bins) = bins() else { return };
    let nodes = line(&bins, kinds);
    let stop = Arc::new(AtomicBool::new(false));
    let mut publishers = Vec::new();
    let mut sdk_publishers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let [(moq_net, moq_seed), (sdk, sdk_seed)] = broadcasts(n);
        let dial = Dial::tcp(node.addr, PATH, 0x100 + n as u64);
        publishers.push((
            moq_net.clone(),
            moq_net_live::spawn_paced_publisher(dial, &moq_net, TRACK, moq_seed, stop.clone()),
        ));
        sdk_publishers.push((
            sdk.clone(),
            spawn_sdk_publisher(node.addr, sdk, sdk_seed, stop.clone()),
        ));
    }
    // Each viewer has its own hop: a node drops an announcement whose hop
    // list holds the hop of the session it would go to.
    let mut viewers = Vec::new();
    for (v, node) in nodes.iter().enumerate() {
        for m in (0..nodes.len()).filter(|&m| m != v) {
            for (broadcast, seed) in broadcasts(m) {
                let hop = 0x1000 + viewers.len() as u64;
                let opts = Options::client()
                    .with_hop(hop)
                    .with_path(Some(PATH))
                    .with_timeout(VIEW);
                let request = SubscribeRequest {
                    broadcast: broadcast.clone(),
                    track: TRACK.into(),
                    priority: 3,
                    max_age_ms: 10_000,
                    start: None,
                    end: None,
                    stop_after: Some(GROUPS),
                };
                let running =
                    reference::dial_subscriber(node.addr, opts, request).expect("start viewer");
                viewers.push((v, broadcast, seed, running));
            }
        }
    }
    // And on every node a skiff SDK viewer of each other node's moq-net broadcast.
    let mut sdk_viewers = Vec::new();
    for (v, node) in nodes.iter().enumerate() {
        for m in (0..nodes.len()).filter(|&m| m != v) {
            let [(broadcast, seed), _] = broadcasts(m);
            let viewer = spawn_sdk_viewer(node.addr, broadcast.clone(), seed);
            sdk_viewers.push((v, broadcast, viewer));
        }
    }
    let mut failures = Vec::new();
    for (v, broadcast, viewer) in sdk_viewers {
        let verdict = match viewer.join() {
            Ok(Ok(reads)) => check_sdk_reads(&reads),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("panicked".to_owned()),
        };
        match verdict {
            Ok(()) => println!("node {v} viewed {broadcast} with the SDK: {GROUPS} groups intact"),
            Err(e) => failures.push(format!("SDK viewer on node {v}, {broadcast}: {e}")),
        }
    }
    for (v, broadcast, seed, running) in viewers {
        let received: Result<Received, _> = running.join();
        let verdict = match received {
            Ok(r) => moq_net_live::check_received(seed, GROUPS, &r),
            Err(e) => Err(format!("viewer: {e}")),
        };
        match verdict {
            Ok(()) => println!("node {v} viewed {broadcast}: {GROUPS} groups intact"),
            Err(e) => failures.push(format!("node {v}, {broadcast}: {e}")),
        }
    }
    stop.store(true, Ordering::SeqCst);
    join_publishers(publishers.into_iter().chain(sdk_publishers), &mut failures);
    assert_no_failures(kinds, &failures, &nodes);
}

/// Joins the publisher threads (each with its broadcast's name), adding a
/// line to `failures` for each that failed or panicked.
fn join_publishers(
    publishers: impl IntoIterator<Item = (String, std::thread::JoinHandle<Result<u64, String>>)>,
    failures: &mut Vec<String>,
) {
    for (broadcast, p) in publishers {
        match p.join() {
            Ok(Ok(groups)) => println!("{broadcast}: {groups} groups written"),
            Ok(Err(e)) => failures.push(format!("publisher {broadcast}: {e}")),
            Err(_) => failures.push(format!("publisher {broadcast} panicked")),
        }
    }
}

/// Fails the test with `failures` and every node's log unless `failures`
/// is empty.
fn assert_no_failures(kinds: [Kind; 3], failures: &[String], nodes: &[Node]) {
    let logs: Vec<String> = nodes.iter().map(Node::log).collect();
    assert!(
        failures.is_empty(),
        "{kinds:?}:\n{}\n{}",
        failures.join("\n"),
        logs.join("\n")
    );
}

/// skiff — moq-relay — skiff.
#[test]
fn moq_net_and_sdk_on_every_node_of_skiff_moq_relay_skiff() {
    every_node([Kind::Skiff, Kind::Moq, Kind::Skiff]);
}

/// moq-relay — skiff — moq-relay.
#[test]
fn moq_net_and_sdk_on_every_node_of_moq_relay_skiff_moq_relay() {
    every_node([Kind::Moq, Kind::Skiff, Kind::Moq]);
}

// ---------------------------------------------------------------------------
// The middle node killed and restarted
// ---------------------------------------------------------------------------

/// Waits (up to `secs`) until `cond` holds; `Err` naming `what` otherwise.
fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        if Instant::now() >= until {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Frames each viewer reads before the kill and again after the restart.
const FRAMES_EACH_SIDE: u64 = 3 * FRAMES;

/// Checks what a viewer through the restart read: within each subscription
/// frames come in order (group, then index), each group from its first frame
/// on, a gap of groups allowed; a later subscription starts no earlier than
/// the group the one before it ended in (which may come again, whole).
fn check_watched(watched: &Watched) -> Result<(), String> {
    let mut last_group = 0;
    for reads in &watched.subscriptions {
        let ordered = reads.windows(2).all(|w| {
            let ((g0, i0), (g1, i1)) = (w[0], w[1]);
            (g1 == g0 && i1 == i0 + 1) || (g1 > g0 && i1 == 0)
        });
        let first = reads.first().copied();
        if !ordered || first.is_some_and(|(g, i)| i != 0 || g < last_group) {
            return Err(format!(
                "frames out of order (after group {last_group}): {reads:?}"
            ));
        }
        last_group = reads.last().map_or(last_group, |&(g, _)| g);
    }
    Ok(())
}

/// A line of `kinds` with a moq-net publisher at each end and a moq-net
/// viewer of it at the other end; the middle node is killed (SIGKILL) once
/// both viewers read frames, and started again on its port.
fn middle_restarted(kinds: [Kind; 3]) {
    let Some(bins) = bins() else { return };
    let mut nodes = line(&bins, kinds);
    let stop = Arc::new(AtomicBool::new(false));
    let ends = [(0usize, 2usize), (2, 0)];
    let mut publishers = Vec::new();
    let mut viewers = Vec::new();
    for (k, &(p, v)) in ends.iter().enumerate() {
        let (broadcast, seed) = (format!("pub-{p}"), p as u64);
        let dial = Dial::tcp(nodes[p].addr, PATH, 0x100 + p as u64);
        publishers.push((
            broadcast.clone(),
            moq_net_live::spawn_paced_publisher(dial, &broadcast, TRACK, seed, stop.clone()),
        ));
        let seen = Arc::new(AtomicU64::new(0));
        let dial = Dial::tcp(nodes[v].addr, PATH, 0x1000 + k as u64);
        let watcher =
            moq_net_live::spawn_watcher(dial, &broadcast, TRACK, seed, stop.clone(), seen.clone());
        viewers.push((broadcast, seen, watcher));
    }
    let result = (|| {
        for (broadcast, seen, _) in &viewers {
            wait_for(&format!("{broadcast}'s frames before the kill"), 40, || {
                seen.load(Ordering::SeqCst) >= FRAMES_EACH_SIDE
            })?;
        }
        let killed = Instant::now();
        nodes[1].kill9();
        std::thread::sleep(Duration::from_millis(300));
        nodes[1].restart(&bins);
        let before: Vec<u64> = viewers
            .iter()
            .map(|(_, seen, _)| seen.load(Ordering::SeqCst))
            .collect();
        for ((broadcast, seen, _), before) in viewers.iter().zip(before) {
            wait_for(
                &format!("{broadcast}'s first frame after the restart"),
                60,
                || seen.load(Ordering::SeqCst) > before,
            )?;
            println!(
                "{broadcast}: a frame again {:?} after the kill",
                killed.elapsed()
            );
            wait_for(
                &format!("{broadcast}'s frames after the restart"),
                30,
                || seen.load(Ordering::SeqCst) >= before + FRAMES_EACH_SIDE,
            )?;
        }
        Ok::<(), String>(())
    })();
    stop.store(true, Ordering::SeqCst);
    let mut failures: Vec<String> = result.err().into_iter().collect();
    for (broadcast, _, watcher) in viewers {
        match watcher.join() {
            Ok(Ok(watched)) => {
                println!(
                    "{broadcast}: {} subscriptions, {} frames",
                    watched.subscriptions.len(),
                    watched.subscriptions.iter().map(Vec::len).sum::<usize>()
                );
                if let Err(e) = check_watched(&watched) {
                    failures.push(format!("viewer of {broadcast}: {e}"));
                }
            }
            Ok(Err(e)) => failures.push(format!("viewer of {broadcast}: {e}")),
            Err(_) => failures.push(format!("viewer of {broadcast} panicked")),
        }
    }
    join_publishers(publishers, &mut failures);
    assert_no_failures(kinds, &failures, &nodes);
}

/// skiff — moq-relay — skiff, moq-relay killed and restarted.
#[test]
fn a_moq_relay_node_killed_and_restarted_under_moq_net_viewers() {
    middle_restarted([Kind::Skiff, Kind::Moq, Kind::Skiff]);
}

/// moq-relay — skiff — moq-relay, skiff-relay killed and restarted.
#[test]
fn a_skiff_node_killed_and_restarted_under_moq_net_viewers() {
    middle_restarted([Kind::Moq, Kind::Skiff, Kind::Moq]);
}
