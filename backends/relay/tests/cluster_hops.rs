//! Five-node skiff clusters that need hop-list routing (docs/protocol.md
//! §4.3): a line whose links are dialed away from the publisher, a ring and
//! a full mesh, with a publisher on node 0 and a viewer on every node, every
//! frame verified; and a ring healing after a node is killed with SIGKILL.
//!
//! A peer session carries announcements both ways only once the relay
//! offers its peers what it learned from other peers (with hop lists, loops
//! dropped, shortest path first): these tests check that routing end to
//! end over real processes.

mod cluster_nodes;
mod sdk_stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster_nodes::*;
use sdk_stream::{PACED, Running, Until};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::{Config, connect};

/// Nodes in each cluster.
const NODES: usize = 5;
/// Groups the publisher writes (ten frames each).
const GROUPS: u64 = 10;

/// Five nodes linked by `links` ([`cluster_with`]).
fn cluster(name: &str, links: &[(usize, usize)]) -> (Vec<Node>, std::path::PathBuf) {
    cluster_with(name, NODES, links, &[])
}

/// A publisher on node 0 and a viewer on every node: the frames each viewer
/// read, every one checked (bytes and timestamp); the publisher starts a
/// group once every viewer has the one before.
fn stream_to_all(nodes: &[Node]) -> Vec<Vec<u64>> {
    let urls: Vec<String> = nodes.iter().map(Node::url).collect();
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let mut reads = Vec::new();
        let mut watching = Vec::new();
        for url in &urls {
            let (viewer, runner) = connect(url, Config::default()).unwrap();
            monoio::spawn(runner.run());
            let read = Arc::new(AtomicU64::new(0));
            reads.push(read.clone());
            watching.push(monoio::spawn(PACED.view(
                viewer,
                Until::Frames(GROUPS * PACED.per_group),
                read,
            )));
        }
        // The publisher paces itself on the slowest viewer.
        let slowest = Arc::new(AtomicU64::new(0));
        {
            let (reads, slowest) = (reads.clone(), slowest.clone());
            monoio::spawn(async move {
                loop {
                    let min = reads.iter().map(|r| r.load(Ordering::SeqCst)).min();
                    slowest.store(min.unwrap_or(0), Ordering::SeqCst);
                    monoio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
        let (publisher, runner) = connect(&urls[0], Config::default()).unwrap();
        monoio::spawn(runner.run());
        let (_broadcast, mut track) = PACED.publish(&publisher).await;
        // Every viewer's subscription reached the publisher (one upstream
        // subscription per node, merged on the way).
        let t0 = Instant::now();
        monoio::time::timeout(
            Duration::from_secs(30),
            PACED.write_groups(&mut track, GROUPS, &slowest),
        )
        .await
        .expect("every viewer kept up within 30 s");
        let mut seen = Vec::new();
        for w in watching {
            let left = Duration::from_secs(30).saturating_sub(t0.elapsed());
            seen.push(
                monoio::time::timeout(left, w)
                    .await
                    .expect("every viewer got every frame in time"),
            );
        }
        publisher.close().await;
        seen
    })
    .expect("runtime")
}

/// Runs the five-node `links` shape and checks every viewer got every
/// frame, and that announcements stay bounded once settled (no loop: each
/// node's count is the same a second later).
fn shape(name: &str, links: &[(usize, usize)]) {
    let (nodes, dir) = cluster(name, links);
    let seen = stream_to_all(&nodes);
    let all: Vec<u64> = (0..GROUPS * PACED.per_group).collect();
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(*s, all, "node {i}'s viewer");
    }
    let count = |n: &Node| {
        n.metrics_text()
            .lines()
            .filter(|l| l.starts_with("skiff_relay_peer_announcements_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    // The publisher's withdrawal crosses the cluster after the stream; then
    // the counts stay put for a second (a loop would keep them growing).
    // Before they settle, each node may try the other routes it knows
    // (every withdrawal makes a node fall back to a longer route it holds,
    // which its peers then learn and withdraw in turn), so a session
    // carries at most one announcement and one withdrawal per route length
    // and per peer that could offer one: `2 * NODES * NODES`.
    let mut last: Vec<u64> = nodes.iter().map(count).collect();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now: Vec<u64> = nodes.iter().map(count).collect();
        if now == last {
            break;
        }
        assert!(
            Instant::now() < until,
            "announcements never settle: {now:?}"
        );
        last = now;
    }
    for (i, n) in last.iter().enumerate() {
        let sessions = links.iter().filter(|(from, _)| *from == i).count() as u64;
        assert!(
            *n <= 2 * (NODES * NODES) as u64 * sessions,
            "node {i}: {n} announcements over {sessions} sessions"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_line_of_five_dialed_away_from_the_publisher() {
    shape("line5", &[(0, 1), (1, 2), (2, 3), (3, 4)]);
}

#[test]
fn a_ring_of_five() {
    shape("ring5", &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]);
}

#[test]
fn a_full_mesh_of_five() {
    let links: Vec<(usize, usize)> = (0..NODES)
        .flat_map(|i| (i + 1..NODES).map(move |j| (i, j)))
        .collect();
    shape("mesh5", &links);
}

/// Announcements (active and ended) `n` received from the peers it dials
/// and sent to them, summed over its peers.
fn announcement_counts(n: &Node) -> (u64, u64) {
    let text = n.metrics_text();
    let sum = |family: &str| {
        text.lines()
            .filter(|l| l.starts_with(family))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>()
    };
    (
        sum("skiff_relay_peer_announcements_received_total{"),
        sum("skiff_relay_peer_announcements_sent_total{"),
    )
}

/// A viewer of the test broadcast on `url` reading `frames` frames, each
/// checked, on a thread of its own: the indices it read.
fn late_viewer(url: String, frames: u64) -> std::thread::JoinHandle<Vec<u64>> {
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (viewer, runner) = connect(&url, Config::default()).unwrap();
            monoio::spawn(runner.run());
            let read = Arc::new(AtomicU64::new(0));
            let s = sdk_stream::Stream {
                check_timestamps: true,
                ..PACED
            };
            let got = monoio::time::timeout(
                Duration::from_secs(30),
                s.view(viewer.clone(), Until::Frames(frames), read),
            )
            .await
            .expect("the late viewer read its frames in time");
            viewer.close().await;
            got
        })
        .expect("runtime")
    })
}

/// A ring of five with the publisher on node 0 and a viewer on node 3: the
/// shortest path is 0-4-3. Node 4 is killed with SIGKILL while the viewer
/// watches: the viewer keeps receiving through 0-1-2-3, in order, without
/// subscribing again (the group node 4 was sending may be reset, and the
/// viewer goes on at the next), and the time until frames flow again is
/// printed. Node 4 is then started again (same port, same `--cluster-id`,
/// same peer list): its links come back, node 3's viewer goes back to the
/// shortest path (node 2 stops serving node 3 once the old route's linger
/// ends), a viewer on node 4 gets frames, and the 5 s after the restart
/// and the restart with the 5 s after its links are back carry a bounded
/// number of announcements on every node (no storm).
#[test]
fn a_ring_heals_after_a_node_is_killed() {
    let (mut nodes, dir) = cluster("heal5", &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)]);
    let stream = Running::start(nodes[3].url(), nodes[0].url());
    wait_for("frames before the kill", 30, || stream.seen() >= 50);
    let before = stream.seen();
    let killed_at = Instant::now();
    nodes[4].kill9();
    wait_for("frames after the kill", 30, || stream.seen() >= before + 50);
    println!(
        "frames resumed {:?} after node 4 was killed",
        killed_at.elapsed()
    );
    // The detour 3-2-1-0: node 2 serves node 3 (the session node 2 dials).
    wait_for("node 2 serving node 3 on the detour", 10, || {
        nodes[2].sample(&format!(
            "skiff_relay_peer_subscriptions_served{{peer=\"{}\"}}",
            nodes[3].url()
        )) == 1
    });

    // Node 4 comes back: same address, id and peer list.
    let before_restart: Vec<(u64, u64)> = nodes[..4].iter().map(announcement_counts).collect();
    let restarted_at = Instant::now();
    nodes[4] = Node::start(
        1,
        &[
            "--listen".to_owned(),
            nodes[4].addr.to_string(),
            "--cluster-connect-api".to_owned(),
            dir.join("peers-4.json").display().to_string(),
            "--cluster-id".to_owned(),
            "5".to_owned(),
        ],
    );
    wait_for("node 4's session with node 0", 15, || {
        nodes[4].sessions_with(&nodes[0]) == 1
    });
    wait_for("node 3's session with node 4 again", 15, || {
        nodes[3].sessions_with(&nodes[4]) == 1
    });
    println!(
        "node 4's links back {:?} after its restart",
        restarted_at.elapsed()
    );
    // The restart and the 5 s after its links are back: what every node received from and sent to
    // the peers it dials. One broadcast is in the cluster; a restart
    // re-announces it over each link that came back, and each node whose
    // best route changed tells its peers (a withdrawal and a new route at
    // most per peer and per route length): a storm would be far beyond.
    std::thread::sleep(Duration::from_secs(5));
    let mut deltas = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let (r, s) = announcement_counts(n);
        let (r0, s0) = before_restart.get(i).copied().unwrap_or((0, 0));
        deltas.push((r - r0, s - s0));
    }
    println!(
        "announcements (received, sent) per node in the 5 s after the links came back: {deltas:?}"
    );
    for (i, (r, s)) in deltas.iter().enumerate() {
        assert!(
            *r <= 2 * NODES as u64 && *s <= 2 * NODES as u64,
            "node {i}: {r} received, {s} sent in the 5 s after the links came back"
        );
    }
    // Node 3 learns the short route again and its viewer moves to it: the
    // detour's subscription at node 2 ends after its linger.
    wait_for("node 3's viewer back on the shortest path", 15, || {
        nodes[2].sample(&format!(
            "skiff_relay_peer_subscriptions_served{{peer=\"{}\"}}",
            nodes[3].url()
        )) == 0
    });
    let late = late_viewer(nodes[4].url(), 20).join().unwrap();
    assert_eq!(late.len(), 20, "the viewer on the restarted node");
    assert!(late.windows(2).all(|w| w[0] < w[1]), "in order");
    let at = stream.seen();
    wait_for("node 3's viewer still receiving", 10, || {
        stream.seen() >= at + 20
    });
    let (written, got) = stream.stop();
    assert!(
        got.len() as u64 >= before + 50,
        "{} of {written}",
        got.len()
    );
    // Frames arrive in order: at most a gap, never a step back.
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
    let _ = std::fs::remove_dir_all(&dir);
}
