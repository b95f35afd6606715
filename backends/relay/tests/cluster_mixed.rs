//! Mixed clusters of `skiff-relay` and the published `moq-relay` 0.17.10
//! (README "Running a cluster"): skiff — moq-relay — skiff and moq-relay —
//! skiff — moq-relay, peering with `--cluster-connect` over plain TCP, a
//! skiff SDK publisher on one end and a skiff SDK viewer on the other, every
//! frame checked (bytes, order, timestamp).
//!
//! moq-relay is found as `skiff_testkit::relay_process::moq_relay_binary`
//! says (`$MOQ_RELAY`, the per-machine cache, `PATH`); without one each test
//! prints a skip line and passes.

mod cluster_nodes;
mod sdk_stream;

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster_nodes::*;
use sdk_stream::PACED;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};
use skiff_testkit::relay_process::moq_relay_binary;

/// Groups the publisher writes (ten frames each).
const GROUPS: u64 = 12;

/// A `moq-relay` process on a free loopback TCP port, anonymous access to
/// everything, dialing `peers`; killed when dropped.
struct MoqRelay {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl MoqRelay {
    fn start(bin: &Path, peers: &[String]) -> MoqRelay {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        Self::start_on(bin, SocketAddr::from(([127, 0, 0, 1], port)), peers)
    }

    /// As [`MoqRelay::start`], listening on `addr`.
    fn start_on(bin: &Path, addr: SocketAddr, peers: &[String]) -> MoqRelay {
        let port = addr.port();
        let log = std::env::temp_dir().join(format!(
            "skiff-cluster-moq-relay-{}-{port}.log",
            std::process::id()
        ));
        let out = File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = Command::new(bin);
        cmd.args(["--listen-tcp-bind", &addr.to_string()])
            .args(["--auth-public", "**"])
            .args(["--log-level", "info"]);
        for p in peers {
            cmd.args(["--cluster-connect", p]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn moq-relay");
        let relay = MoqRelay { child, addr, log };
        let until = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < until,
                "moq-relay did not listen:\n{}",
                relay.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        relay
    }

    fn url(&self) -> String {
        format!("tcp://{}/", self.addr)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for MoqRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The moq-relay binary, or `None` after printing a skip line.
fn moq_relay() -> Option<std::path::PathBuf> {
    let bin = moq_relay_binary();
    if bin.is_none() {
        eprintln!("SKIP: no moq-relay (bash .ci/moq-relay, or set MOQ_RELAY)");
    }
    bin
}

/// An SDK publisher dialing `publisher` and an SDK viewer dialing `viewer`:
/// the frame indices the viewer read, each checked.
fn stream(publisher: String, viewer: String) -> Vec<u64> {
    driver::block_on(DriverKind::Legacy, move |_| {
        PACED.view_groups(
            (viewer, Config::default()),
            (publisher, Config::default()),
            GROUPS,
            || {},
        )
    })
    .expect("runtime")
}

/// skiff A ← moq-relay M ← skiff C (M dials A, C dials M): a publisher on
/// A reaches a viewer on C through moq-relay.
#[test]
fn skiff_moq_relay_skiff() {
    let Some(bin) = moq_relay() else { return };
    let a = Node::start(2, &[]);
    let m = MoqRelay::start(&bin, &[a.url()]);
    wait_for("M's session with A (a peer on A)", 20, || {
        a.sample("skiff_relay_cluster_peers_accepted_total") >= 1
    });
    let c = Node::start(2, &["--cluster-connect".to_owned(), m.url()]);
    wait_for("C's sessions with M", 20, || {
        c.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{}\"}}",
            m.url()
        )) == 2
    });
    let seen = stream(a.url(), c.url());
    assert_eq!(
        seen,
        (0..GROUPS * 10).collect::<Vec<_>>(),
        "{}",
        m.log_text()
    );
}

/// moq-relay M1 ← skiff S ← moq-relay M2 (S dials M1, M2 dials S): a
/// publisher on M1 reaches a viewer on M2 through skiff.
#[test]
fn moq_relay_skiff_moq_relay() {
    let Some(bin) = moq_relay() else { return };
    let m1 = MoqRelay::start(&bin, &[]);
    let s = Node::start(2, &["--cluster-connect".to_owned(), m1.url()]);
    wait_for("S's sessions with M1", 20, || {
        s.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{}\"}}",
            m1.url()
        )) == 2
    });
    let m2 = MoqRelay::start(&bin, &[s.url()]);
    wait_for("M2's session with S (a peer on S)", 20, || {
        s.sample("skiff_relay_cluster_peers_accepted_total") >= 1
    });
    let seen = stream(m1.url(), m2.url());
    assert_eq!(
        seen,
        (0..GROUPS * 10).collect::<Vec<_>>(),
        "M1:\n{}\nM2:\n{}",
        m1.log_text(),
        m2.log_text()
    );
}

/// What a viewer that lives through a node's restart saw.
struct Watched {
    /// Frame indices read, in order, for each subscription it made (one:
    /// it never had to subscribe again).
    frames: Vec<Vec<u64>>,
}

/// A publisher on `publisher` writing a group of ten frames every 100 ms
/// and a viewer on `viewer`, until `stop` is set; `seen` counts the frames
/// the viewer read. A group that breaks off (its source went away) is left
/// for the next; a subscription that ends before `stop` is made again.
/// Every frame read is checked.
fn watch(
    publisher: String,
    viewer: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Watched {
    use skiff_core::model::track::Info;
    use skiff_monoio::connect;
    use skiff_monoio::sdk::Request;
    use std::sync::atomic::Ordering;
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let (v, runner) = connect(&viewer, Config::default()).unwrap();
        monoio::spawn(runner.run());
        let (p, runner) = connect(&publisher, Config::default()).unwrap();
        monoio::spawn(runner.run());
        let broadcast = p.publish("camera").unwrap();
        let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
        let writing = {
            let stop = stop.clone();
            monoio::spawn(async move {
                let mut i = 0u64;
                let mut g = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let mut group = track.create_group(g).unwrap();
                    for _ in 0..10 {
                        PACED.write_frame(&mut group, i).await;
                        i += 1;
                        monoio::time::sleep(Duration::from_millis(10)).await;
                    }
                    let _ = group.finish();
                    g += 1;
                }
                track.finish();
                i
            })
        };
        let request = Request {
            max_latency: skiff_core::time::Duration::from_secs(10),
            ..Request::LIVE
        };
        let mut watched = Watched { frames: Vec::new() };
        'subscribe: while !stop.load(Ordering::SeqCst) {
            let mut t = match v.subscribe("camera", "video", request).await {
                Ok(t) => t,
                Err(_) => {
                    monoio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            watched.frames.push(Vec::new());
            loop {
                let mut group = match t.next_group().await {
                    Ok(Some(g)) => g,
                    _ => continue 'subscribe,
                };
                while let Ok(Some(frame)) = group.read_frame().await {
                    let bytes = frame.payload.to_vec();
                    let i = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                    assert_eq!(bytes, (PACED.payload)(i), "frame {i} damaged");
                    assert_eq!(frame.timestamp, i * PACED.tick, "frame {i}'s timestamp");
                    if let Some(f) = watched.frames.last_mut() {
                        f.push(i);
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                if stop.load(Ordering::SeqCst) {
                    break 'subscribe;
                }
            }
        }
        let _ = writing.await;
        drop(broadcast);
        p.close().await;
        v.close().await;
        watched
    })
    .expect("runtime")
}

/// Runs [`watch`] on a thread; kills the middle node with `kill` once the
/// viewer has 50 frames, restarts it with `restart` and waits for 50 more:
/// the frames the viewer read, after printing how long the gap was and
/// checking their order (`strict`: a skiff node serves the viewer).
fn through_a_restart(
    publisher: String,
    viewer: String,
    strict: bool,
    kill: impl FnOnce(),
    restart: impl FnOnce(),
) -> Watched {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let watching = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || watch(publisher, viewer, stop, seen))
    };
    wait_for("50 frames before the kill", 30, || {
        seen.load(Ordering::SeqCst) >= 50
    });
    let killed = Instant::now();
    kill();
    std::thread::sleep(Duration::from_millis(300));
    restart();
    let before = seen.load(Ordering::SeqCst);
    wait_for("frames after the restart", 40, || {
        seen.load(Ordering::SeqCst) > before
    });
    println!(
        "the viewer read frames again {:?} after the kill",
        killed.elapsed()
    );
    wait_for("50 frames after the restart", 30, || {
        seen.load(Ordering::SeqCst) >= before + 50
    });
    stop.store(true, Ordering::SeqCst);
    let watched = watching.join().unwrap();
    // `strict`: within a subscription frames come in order, gaps allowed.
    // Else a group may also come again from its start, or after a newer one
    // (moq-relay, taking a track from a new route, sends the groups it gets
    // from there, older ones too, within the viewer's latency); within a
    // group frames still come in order.
    let group = |i: u64| i / 10;
    for f in &watched.frames {
        let ordered = f.windows(2).all(|w| {
            w[1] > w[0] || (!strict && (group(w[1]) != group(w[0]) || w[1] == group(w[1]) * 10))
        });
        assert!(ordered, "frames in order: {f:?}");
    }
    watched
}

/// skiff A ← moq-relay M ← skiff C with the viewer on C: M is killed with
/// SIGKILL and started again on its port; C dials it again, learns A's
/// broadcast again within its failover grace, and the viewer goes on
/// without subscribing again.
#[test]
fn a_moq_relay_node_killed_and_restarted() {
    let Some(bin) = moq_relay() else { return };
    let a = Node::start(1, &[]);
    let mut m = Some(MoqRelay::start(&bin, &[a.url()]));
    let m_addr = m.as_ref().unwrap().addr;
    let m_url = m.as_ref().unwrap().url();
    let c = Node::start(
        1,
        &[
            "--cluster-connect".to_owned(),
            m_url.clone(),
            "--failover-grace".to_owned(),
            "20s".to_owned(),
        ],
    );
    wait_for("C's session with M", 20, || {
        c.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{m_url}\"}}"
        )) == 1
    });
    let mut restarted = None;
    let watched = through_a_restart(
        a.url(),
        c.url(),
        true,
        || drop(m.take()),
        || restarted = Some(MoqRelay::start_on(&bin, m_addr, &[a.url()])),
    );
    assert_eq!(watched.frames.len(), 1, "the viewer never subscribed again");
}

/// moq-relay M1 ← skiff S ← moq-relay M2 with the viewer on M2: S is
/// killed with SIGKILL and started again on its port; it dials M1 again,
/// M2 dials it again, and the viewer reads frames again (subscribing again
/// if M2 ended its subscription: moq-relay closes a broadcast as soon as its
/// last route is gone; it may also send the group in progress again from
/// its start once the route is back).
#[test]
fn a_skiff_node_killed_and_restarted() {
    let Some(bin) = moq_relay() else { return };
    let m1 = MoqRelay::start(&bin, &[]);
    let args = vec!["--cluster-connect".to_owned(), m1.url()];
    let mut s = Some(Node::start(1, &args));
    let s_addr = s.as_ref().unwrap().addr;
    let m2 = MoqRelay::start(&bin, &[s.as_ref().unwrap().url()]);
    wait_for("M2's session with S", 20, || {
        s.as_ref()
            .unwrap()
            .sample("skiff_relay_cluster_peers_accepted_total")
            >= 1
    });
    let mut restarted = None;
    let mut again = args.clone();
    again.extend(["--listen".to_owned(), s_addr.to_string()]);
    let watched = through_a_restart(
        m1.url(),
        m2.url(),
        false,
        || {
            if let Some(mut s) = s.take() {
                s.kill9();
            }
        },
        || restarted = Some(Node::start(1, &again)),
    );
    println!("subscriptions: {}", watched.frames.len());
}
