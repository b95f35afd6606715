//! Cluster faults between `skiff-relay serve` processes on loopback (README
//! "Running a cluster"): a peer link cut by an nftables rule (every packet
//! of the link dropped) and restored, while a viewer on the far side keeps
//! receiving through the other path; a peer announcing past its quota,
//! refused past it while a viewer elsewhere keeps streaming; and peers
//! connecting and leaving 200 times, each with paths of its own, while the
//! nodes' memory stays flat and their tables come back to idle.

mod cluster_nodes;
mod common;
mod peers;
mod sdk_stream;

use std::time::{Duration, Instant};

use cluster_nodes::{Node, cluster_with, connect_to, wait_for};
use peers::Raw;
use sdk_stream::{PACED, Running};
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin};
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};

/// An nftables table of this test process that drops every packet to or
/// from one TCP port on the loopback interface; deleted when dropped.
struct Cut {
    table: String,
}

impl Cut {
    /// Cuts `port`; `None` when `nft` is not installed.
    fn port(port: u16) -> Option<Cut> {
        let table = format!("skiff_test_{}", std::process::id());
        let script = format!(
            "table inet {table} {{\n\
             \tchain out {{\n\
             \t\ttype filter hook output priority 0; policy accept;\n\
             \t\toifname \"lo\" tcp dport {port} drop\n\
             \t\toifname \"lo\" tcp sport {port} drop\n\
             \t}}\n\
             }}\n"
        );
        let file = std::env::temp_dir().join(format!("{table}.nft"));
        std::fs::write(&file, script).unwrap();
        let out = match std::process::Command::new("nft")
            .arg("-f")
            .arg(&file)
            .output()
        {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("running nft: {e}"),
        };
        let _ = std::fs::remove_file(&file);
        assert!(
            out.status.success(),
            "nft refused the rule: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Cut { table })
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .output();
    }
}

/// A ring of five whose nodes drop an idle session after 2 s, the
/// publisher on node 0 and a viewer on node 3 (shortest path 0-4-3). Every
/// packet of the link 3-4 (node 4's port: only that link uses it) is
/// dropped: the link's sessions go idle and end, node 3 moves the track to
/// 0-1-2-3 and the viewer keeps receiving, in order; the time until frames
/// flow again is printed. The rule is removed: node 3 dials node 4 again
/// and learns its route back.
#[test]
fn a_cut_link_heals_through_the_other_path_and_comes_back() {
    if std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: `nft` is not installed (apt-get install -y nftables)");
        return;
    }
    let (nodes, dir) = cluster_with(
        "cut5",
        5,
        &[(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)],
        &["--idle-timeout", "2s", "--handshake-timeout", "2s"],
    );
    let stream = Running::start(nodes[3].url(), nodes[0].url());
    wait_for("frames before the cut", 30, || stream.seen() >= 50);
    let served_to_3 = |n: &Node| {
        n.sample(&format!(
            "skiff_relay_peer_subscriptions_served{{peer=\"{}\"}}",
            nodes[3].url()
        ))
    };
    // The shortest path: node 2 serves node 3 nothing.
    assert_eq!(served_to_3(&nodes[2]), 0, "node 3's viewer comes by node 4");
    let routes_from_4 = format!("skiff_relay_peer_routes{{peer=\"{}\"}}", nodes[4].url());
    assert_eq!(nodes[3].sample(&routes_from_4), 1);

    let before = stream.seen();
    let cut_at = Instant::now();
    let cut = Cut::port(nodes[4].addr.port()).expect("nft is installed");
    wait_for("frames after the cut", 30, || stream.seen() >= before + 50);
    println!(
        "frames resumed {:?} after the link 3-4 was cut",
        cut_at.elapsed()
    );
    // The dead link was found and ended: node 3 has no session with node
    // 4, and the track comes by node 2.
    wait_for("node 3's session with node 4 ended", 10, || {
        nodes[3].sessions_with(&nodes[4]) == 0
    });
    assert_eq!(served_to_3(&nodes[2]), 1, "the detour 0-1-2-3");
    assert_eq!(nodes[3].sample(&routes_from_4), 0);
    // The link stays down while the rule holds (each dial times out).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(nodes[3].sessions_with(&nodes[4]), 0, "cut links stay cut");

    let restored_at = Instant::now();
    drop(cut);
    wait_for("node 3's session with node 4 again", 20, || {
        nodes[3].sessions_with(&nodes[4]) == 1 && nodes[3].sample(&routes_from_4) == 1
    });
    println!(
        "the link 3-4 was back {:?} after the rule was removed",
        restored_at.elapsed()
    );
    let at = stream.seen();
    wait_for("frames after the link came back", 20, || {
        stream.seen() >= at + 50
    });
    let (written, got) = stream.stop();
    assert!(got.len() as u64 >= at + 50, "{} of {written}", got.len());
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raw cluster peer (a Hop ID, both roles) of `node` announcing the
/// broadcasts of `origin`.
fn raw_peer(node: &Node, hop: u64, origin: origin::Ref<'static, 'static>) -> Raw {
    let mut config = skiff_core::session::Config::new();
    config.hop = hop;
    let mut raw = Raw::connect_with(node.addr, config, None, Some(origin));
    raw.handshake();
    raw
}

/// Announces `path` in `origin` (its state kept for the process's life).
fn announce(origin: origin::Ref<'static, 'static>, path: &str) {
    let state: &'static broadcast::State<'static, 'static, 1> = Box::leak(Box::new(
        broadcast::State::new(Path::new(path).unwrap()).unwrap(),
    ));
    origin.announce(state.handle()).unwrap();
}

/// Pumps `raw` until `cond` holds (failing the test after 10 s).
fn pump_until(raw: &mut Raw, what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        raw.send_output();
        assert!(raw.read_once(), "{what}: the relay ended the session");
        assert!(Instant::now() < until, "timed out waiting for {what}");
    }
}

/// Node A allows each cluster peer 8 broadcasts (`--cluster-max-announces
/// 8`); node B dials A. A raw peer of A announces 100 paths: A routes 8
/// and refuses the rest (counted), B learns the 8, and a publisher on A
/// still reaches a viewer on B, every frame intact. Then 200 peers connect
/// to A one after the other, each announcing 4 paths of its own and
/// leaving (half withdraw them first, half just close): after each, A and B route nothing again (`/announced`,
/// metrics), and both nodes' RSS at the end is within 1 MiB of its value
/// after the first 50.
#[test]
fn a_peer_past_its_quota_is_refused_and_churn_keeps_memory_flat() {
    // A broadcast whose peer left waits this long for another route.
    let grace = ["--failover-grace".to_owned(), "200ms".to_owned()];
    let mut args = vec!["--cluster-max-announces".to_owned(), "8".to_owned()];
    args.extend(grace.clone());
    let a = Node::start(1, &args);
    let mut args = connect_to(&[&a]);
    args.extend(grace);
    let b = Node::start(1, &args);
    wait_for("B's session with A", 20, || b.sessions_with(&a) == 1);
    let routes_from_a = format!("skiff_relay_peer_routes{{peer=\"{}\"}}", a.url());

    let o: &'static origin::State<'static, 'static, 128, 1024> =
        Box::leak(Box::new(origin::State::new()));
    let flood_origin = o.handle();
    for i in 0..100 {
        announce(flood_origin, &format!("flood/{i}"));
    }
    let mut flood = raw_peer(&a, 9_001, flood_origin);
    let refused0 = a.sample("skiff_relay_quota_refused_total");
    pump_until(&mut flood, "A routing 8 paths and B learning them", || {
        a.sample("skiff_relay_broadcasts") == 8 && b.sample(&routes_from_a) == 8
    });
    // The rest refused and counted; nothing more let in meanwhile.
    pump_until(&mut flood, "92 refusals", || {
        a.sample("skiff_relay_quota_refused_total") >= refused0 + 92
    });
    assert_eq!(a.sample("skiff_relay_broadcasts"), 8);
    assert_eq!(a.announced().len(), 8, "{:?}", a.announced());
    // A good stream from A to B through the same link, every frame checked.
    let (pa, vb) = (a.url(), b.url());
    let got = driver::block_on(DriverKind::Legacy, move |_| {
        PACED.view_groups((vb, Config::default()), (pa, Config::default()), 12, || {})
    })
    .expect("runtime");
    assert_eq!(got, (0..120).collect::<Vec<_>>());
    pump_until(&mut flood, "the flood still held", || {
        a.sample("skiff_relay_broadcasts") == 8
    });
    drop(flood);
    wait_for("A and B idle after the flood", 10, || {
        a.sample("skiff_relay_broadcasts") == 0 && b.sample(&routes_from_a) == 0
    });

    // Churn: peers come and go, each with 4 paths of its own.
    let o: &'static origin::State<'static, 'static, 64, 1024> =
        Box::leak(Box::new(origin::State::new()));
    let churn_origin = o.handle();
    let t0 = Instant::now();
    let mut warm = (0, 0);
    for i in 0..200u64 {
        let paths: Vec<String> = (0..4).map(|k| format!("churn/{i}/{k}")).collect();
        for p in &paths {
            announce(churn_origin, p);
        }
        let mut peer = raw_peer(&a, 10_000 + i, churn_origin);
        pump_until(&mut peer, "A and B routing a peer's 4 paths", || {
            a.sample("skiff_relay_broadcasts") == 4 && b.sample(&routes_from_a) == 4
        });
        // Half the peers withdraw their paths before they leave, half
        // leave without a word (their routes end with the session).
        for p in &paths {
            churn_origin.unannounce(Path::new(p).unwrap());
        }
        if i % 2 == 0 {
            pump_until(&mut peer, "A and B dropping a peer's paths", || {
                a.sample("skiff_relay_broadcasts") == 0 && b.sample(&routes_from_a) == 0
            });
        }
        drop(peer);
        wait_for("A and B idle after a peer left", 10, || {
            a.sample("skiff_relay_broadcasts") == 0 && b.sample(&routes_from_a) == 0
        });
        if i == 49 {
            std::thread::sleep(Duration::from_millis(2500));
            warm = (a.settled_rss(), b.settled_rss());
        }
    }
    std::thread::sleep(Duration::from_millis(2500));
    let end = (a.settled_rss(), b.settled_rss());
    println!(
        "200 peers in {:.1} s; RSS after 50: A {} KiB, B {} KiB; at the end: A {} KiB, B {} KiB",
        t0.elapsed().as_secs_f64(),
        warm.0 / 1024,
        warm.1 / 1024,
        end.0 / 1024,
        end.1 / 1024
    );
    assert!(
        end.0 <= warm.0 + (1 << 20) && end.1 <= warm.1 + (1 << 20),
        "RSS grew over 150 peers: A {} -> {} KiB, B {} -> {} KiB",
        warm.0 / 1024,
        end.0 / 1024,
        warm.1 / 1024,
        end.1 / 1024
    );
    assert!(a.announced().is_empty() && b.announced().is_empty());
    assert_eq!(b.sample(&routes_from_a), 0);
}
