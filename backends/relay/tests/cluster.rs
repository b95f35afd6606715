//! Cluster peering between `skiff-relay serve` processes on loopback
//! (README "Running a cluster"): a line of three nodes carrying every frame
//! from a publisher on one end to a viewer on the other, a peer list file
//! edited at run time, peer admission by token, and the cluster token kept
//! out of the logs. The shapes that need hop-list routing (rings, meshes,
//! healing) are in `tests/cluster_hops.rs`.

mod cluster_nodes;
mod sdk_stream;

use std::time::Duration;

use cluster_nodes::*;
use moq_auth::{Algorithm, Claims, Key, KeyId, Pattern};
use sdk_stream::PACED;
use skiff_monoio::Config;
use skiff_monoio::driver::{self, DriverKind};

/// Groups the publisher writes (ten frames each).
const GROUPS: u64 = 12;

/// An SDK publisher on `publisher` and an SDK viewer on `viewer`: the frame
/// indices the viewer read, each one's bytes and timestamp checked, and
/// what `watched` answered at `GET /announced?peers` and at its metrics
/// address once the subscription reached the publisher.
fn stream_through(publisher: &Node, viewer: &Node, watched: &Node) -> (Vec<u64>, (String, String)) {
    let (p, v) = (publisher.url(), viewer.url());
    let (http, metrics) = (watched.addr, watched.metrics);
    let sources = std::sync::Arc::new(std::sync::Mutex::new((String::new(), String::new())));
    let got = sources.clone();
    let seen = driver::block_on(DriverKind::Legacy, move |_| {
        PACED.view_groups(
            (v, Config::default()),
            (p, Config::default()),
            GROUPS,
            move || *got.lock().unwrap() = (get(http, "/announced?peers").1, get(metrics, "/").1),
        )
    })
    .expect("runtime");
    let sources = sources.lock().unwrap().clone();
    (seen, sources)
}

/// A line of three nodes, A ← B ← C (each dials the one before it, two
/// workers each): a publisher on A reaches a viewer on C through B, every
/// frame intact and in order, with one session per worker on each link.
#[test]
fn a_line_of_three_carries_every_frame() {
    let a = Node::start(2, &[]);
    let b = Node::start(2, &connect_to(&[&a]));
    let c = Node::start(2, &connect_to(&[&b]));
    wait_for("B's sessions with A", 20, || b.sessions_with(&a) == 2);
    wait_for("C's sessions with B", 20, || c.sessions_with(&b) == 2);
    let (seen, (sources, metrics)) = stream_through(&a, &c, &c);
    assert_eq!(seen, (0..GROUPS * 10).collect::<Vec<_>>());
    // While it streamed, each of C's two sessions with B routed `camera`.
    let routes = format!("skiff_relay_peer_routes{{peer=\"{}\"}} 2", b.url());
    assert!(metrics.contains(&routes), "{metrics}");
    // C says the broadcast comes from its peer B. The workers of one node
    // keep one upstream subscription per track: of two equal routes, the
    // one a worker learned first serves, so the worker that answers may name
    // its own session with B or its link to the worker whose session serves.
    let sources: serde_json::Value = serde_json::from_str(&sources).unwrap();
    assert_eq!(sources[0]["path"], "camera", "{sources}");
    let via = sources[0]["via"].as_str().unwrap();
    if via.starts_with("link ") {
        assert_eq!(sources[0]["peer"], serde_json::Value::Null, "{sources}");
    } else {
        assert_eq!(sources[0]["peer"], b.url().as_str(), "{sources}");
        assert!(via.starts_with(&format!("peer {}", b.url())), "{sources}");
    }
    // C learned the broadcast from B (one route per worker session), and
    // B served C's subscription: counted per peer.
    assert!(
        c.sample(&format!(
            "skiff_relay_peer_announcements_received_total{{peer=\"{}\"}}",
            b.url()
        )) >= 1
    );
    assert!(
        c.log().contains("cluster peer connected"),
        "C logs its peer sessions"
    );
}

/// The same line the other way: a publisher on C (the node that dials)
/// reaches a viewer on A (the node dialed), so the announcement travels
/// from each dialing node to the node it dialed, and the subscription back:
/// C's session with B serves B's subscription, counted for peer B.
#[test]
fn a_line_of_three_carries_every_frame_towards_the_dialed_end() {
    let a = Node::start(2, &[]);
    let b = Node::start(2, &connect_to(&[&a]));
    let c = Node::start(2, &connect_to(&[&b]));
    wait_for("B's sessions with A", 20, || b.sessions_with(&a) == 2);
    wait_for("C's sessions with B", 20, || c.sessions_with(&b) == 2);
    let (seen, (sources, metrics)) = stream_through(&c, &a, &c);
    assert_eq!(seen, (0..GROUPS * 10).collect::<Vec<_>>());
    // On C the broadcast is its own client's.
    let sources: serde_json::Value = serde_json::from_str(&sources).unwrap();
    assert_eq!(sources[0]["peer"], serde_json::Value::Null, "{sources}");
    let served = format!(
        "skiff_relay_peer_subscriptions_served{{peer=\"{}\"}} 1",
        b.url()
    );
    assert!(metrics.contains(&served), "{metrics}");
}

/// A peer list file edited at run time: an empty list dials nobody; a
/// list naming A dials it (a session per worker); a list that does not
/// parse keeps the last good one (logged); a list without A closes its
/// sessions and drops its metrics.
#[test]
fn a_peer_list_file_adds_and_removes_a_node() {
    let dir = scratch("list");
    let list = dir.join("peers.json");
    write_atomically(&list, "[]");
    let a = Node::start(2, &[]);
    let b = Node::start(
        2,
        &[
            "--cluster-connect-api".to_owned(),
            list.display().to_string(),
        ],
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!b.lists_peer(&a), "an empty list dials nobody");
    assert_eq!(a.sample("skiff_relay_connections_open"), 0);

    write_atomically(
        &list,
        &format!("[{{\"url\": \"{}\", \"cost\": 2}}]", a.url()),
    );
    wait_for("B dials A from the list", 20, || b.sessions_with(&a) == 2);
    wait_for("A sees B's sessions", 20, || {
        a.sample("skiff_relay_connections_open") == 2
    });

    write_atomically(&list, "[not json");
    wait_for("the bad list logged", 20, || {
        b.log()
            .contains("peer list not taken: keeping the last good one")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.sessions_with(&a), 2, "the last good list stays");

    write_atomically(&list, "[]");
    wait_for("A's sessions closed", 20, || {
        a.sample("skiff_relay_connections_open") == 0
    });
    wait_for("A gone from B's metrics", 20, || !b.lists_peer(&a));
    assert!(b.log().contains("cluster peer left the list"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn pats(texts: &[&str]) -> Vec<Pattern> {
    texts.iter().map(|t| t.parse().unwrap()).collect()
}

/// A token signed by `key` for the relay's root.
fn token(key: &Key, publish: &[&str], subscribe: &[&str]) -> String {
    let exp = std::time::SystemTime::now() + Duration::from_secs(3600);
    key.sign(
        &Claims::default()
            .with_publish(pats(publish))
            .with_subscribe(pats(subscribe))
            .with_expires(exp),
    )
    .unwrap()
}

/// Holds a broadcast `camera` published on `node` until `done` says so.
fn publish_until(node: &Node, done: std::sync::mpsc::Receiver<()>) -> std::thread::JoinHandle<()> {
    let url = node.url();
    std::thread::spawn(move || {
        driver::block_on(DriverKind::Legacy, move |_| async move {
            let (publisher, runner) = skiff_monoio::connect(&url, Config::default()).unwrap();
            monoio::spawn(runner.run());
            let _broadcast = publisher.publish("camera").unwrap();
            while done.try_recv().is_err() {
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
            publisher.close().await;
        })
        .expect("runtime");
    })
}

/// Peer admission by token (docs/protocol.md §4.10): B verifies tokens.
/// Node V dials it with a viewer's token (subscribe only) as its cluster
/// token: B serves it as a viewer, not as a peer, and a broadcast published
/// on V never reaches B. Node P dials it with a token granting publish and
/// subscribe over the whole tree: B takes it as a peer and learns P's
/// broadcast. Neither token appears in any node's log, at debug level.
#[test]
fn a_viewers_token_is_refused_as_a_peer_and_tokens_are_never_logged() {
    let dir = scratch("tokens");
    let key_file = dir.join("key.jwk");
    let key = Key::generate(Algorithm::HS256, Some(KeyId::decode("k1").unwrap())).unwrap();
    key.to_file(&key_file).unwrap();
    let viewer_token = token(&key, &[], &["**"]);
    let peer_token = token(&key, &["**"], &["**"]);
    let viewer_file = dir.join("viewer.jwt");
    let peer_file = dir.join("peer.jwt");
    std::fs::write(&viewer_file, format!("{viewer_token}\n")).unwrap();
    std::fs::write(&peer_file, &peer_token).unwrap();
    let debug = ["--log".to_owned(), "debug".to_owned()];

    let b = Node::start(
        1,
        &[
            "--auth-key".to_owned(),
            key_file.display().to_string(),
            "--log".to_owned(),
            "debug".to_owned(),
        ],
    );
    let mut args = connect_to(&[&b]);
    args.extend([
        "--cluster-token".to_owned(),
        viewer_file.display().to_string(),
    ]);
    args.extend(debug.clone());
    let v = Node::start(1, &args);
    wait_for("V's session with B", 20, || v.sessions_with(&b) == 1);
    wait_for("B refused V as a peer", 20, || {
        b.sample("skiff_relay_cluster_peers_refused_total") == 1
    });
    let (stop_v, done) = std::sync::mpsc::channel();
    let publishing = publish_until(&v, done);
    wait_for("V announces its broadcast", 20, || {
        v.announced() == ["camera"]
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        b.announced().is_empty(),
        "a viewer's token routes nothing to B"
    );
    assert_eq!(b.sample("skiff_relay_cluster_peers_accepted_total"), 0);
    stop_v.send(()).unwrap();
    publishing.join().unwrap();

    let mut args = connect_to(&[&b]);
    args.extend([
        "--cluster-token".to_owned(),
        peer_file.display().to_string(),
    ]);
    args.extend(debug);
    let p = Node::start(1, &args);
    wait_for("B took P as a peer", 20, || {
        b.sample("skiff_relay_cluster_peers_accepted_total") == 1
    });
    let (stop_p, done) = std::sync::mpsc::channel();
    let publishing = publish_until(&p, done);
    wait_for("P's broadcast reaches B", 20, || {
        b.announced() == ["camera"]
    });
    stop_p.send(()).unwrap();
    publishing.join().unwrap();

    assert!(b.log().contains("not a cluster peer"), "B logs the refusal");
    assert!(b.log().contains("cluster peer joined"), "B logs the peer");
    for (name, node) in [("B", &b), ("V", &v), ("P", &p)] {
        let log = node.log();
        for t in [&viewer_token, &peer_token] {
            assert!(!log.contains(t.as_str()), "{name} logged a token");
            // Not even its signature (the last part).
            let sig = t.rsplit('.').next().unwrap();
            assert!(!log.contains(sig), "{name} logged a token's signature");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer list served over HTTP (`--cluster-connect-api http://…`): asked
/// at start and every 10 s with `?node=` and the last answer's `ETag`; a
/// 304 changes nothing, a 500 keeps the last good list, and a new list
/// without A closes B's sessions with it.
#[test]
fn a_peer_list_url_is_polled_with_its_etag() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Mutex};
    let a = Node::start(1, &[]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let api = listener.local_addr().unwrap();
    // What the server answers next: (status, etag, body); and the request
    // heads it read.
    let answer = Arc::new(Mutex::new((
        200,
        "\"v1\"".to_owned(),
        format!("[\"{}\"]", a.url()),
    )));
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let (answer, heads) = (answer.clone(), heads.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = String::new();
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    head.push_str(&line);
                }
                let (status, etag, body) = answer.lock().unwrap().clone();
                let not_modified = head.contains(&format!("If-None-Match: {etag}"));
                heads.lock().unwrap().push(head);
                let reply = if status == 200 && not_modified {
                    "HTTP/1.0 304 Not Modified\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.0 {status} X\r\nETag: {etag}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = conn.write_all(reply.as_bytes());
            }
        });
    }
    let b = Node::start(
        1,
        &[
            "--cluster-connect-api".to_owned(),
            format!("http://{api}/peers"),
            "--cluster-node".to_owned(),
            "tcp://127.0.0.1:1/".to_owned(),
        ],
    );
    wait_for("B dials A from the URL's list", 20, || {
        b.sessions_with(&a) == 1
    });
    // The second ask carries the ETag and gets a 304: nothing changes.
    wait_for("a second ask", 25, || heads.lock().unwrap().len() >= 2);
    {
        let heads = heads.lock().unwrap();
        assert!(
            heads[0].starts_with("GET /peers?node=tcp%3A%2F%2F127.0.0.1%3A1%2F HTTP/1.0"),
            "{}",
            heads[0]
        );
        assert!(heads[1].contains("If-None-Match: \"v1\""), "{}", heads[1]);
    }
    assert_eq!(b.sessions_with(&a), 1);
    // A failing answer keeps the last good list.
    *answer.lock().unwrap() = (500, "\"v2\"".to_owned(), "oops".to_owned());
    wait_for("a third ask", 25, || heads.lock().unwrap().len() >= 3);
    wait_for("the failure logged", 5, || {
        b.log()
            .contains("peer list not taken: keeping the last good one")
    });
    assert_eq!(b.sessions_with(&a), 1);
    // A list without A closes the sessions with it.
    *answer.lock().unwrap() = (200, "\"v3\"".to_owned(), "[]".to_owned());
    wait_for("A's session closed", 25, || {
        a.sample("skiff_relay_connections_open") == 0
    });
    assert!(!b.lists_peer(&a));
}

/// A peer dialed over QUIC (`moql://`), its generated certificate pinned
/// with `--upstream-fingerprint`: a publisher on A reaches a viewer on B,
/// every frame intact.
#[test]
fn a_peer_dialed_over_quic_with_its_certificate_pinned() {
    let a = Node::start(1, &["--tls-generate".to_owned(), "localhost".to_owned()]);
    let (status, pin) = get(a.addr, "/certificate.sha256");
    assert!(status.contains("200"), "{status}");
    let peer = format!("moql://localhost:{}/", a.addr.port());
    let b = Node::start(
        2,
        &[
            "--cluster-connect".to_owned(),
            peer.clone(),
            "--upstream-fingerprint".to_owned(),
            pin.trim().to_owned(),
        ],
    );
    wait_for("B's QUIC sessions with A", 20, || {
        b.sample(&format!(
            "skiff_relay_peer_sessions_open{{peer=\"{peer}\"}}"
        )) == 2
    });
    let (seen, _) = stream_through(&a, &b, &b);
    assert_eq!(seen, (0..GROUPS * 10).collect::<Vec<_>>());
}
