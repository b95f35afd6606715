//! Access control against a real relay on loopback (docs/protocol.md §4.10):
//! one test per rule, tokens made by moq-dev's `moq-auth` crate and by
//! `jsonwebtoken` directly, and a flood of bad tokens beside good viewers.
//!
//! moq-lite-05's SETUP has no authorization-token parameter (moq-net reads
//! that option only in moq-transport SETUP), so on TCP a token travels only
//! as `?jwt=` in the SETUP path; the rule for two token places is covered by
//! the unit tests of `skiff_relay::auth`.

mod common;

#[path = "readme/publish.rs"]
mod publish;
#[path = "readme/subscribe.rs"]
mod subscribe;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use skiff_core::model::track;
use skiff_core::session::{Event, SubscriptionId};
use skiff_core::window::{End, Request, Start};
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::session_driver::App;
use skiff_relay::config::AuthConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};
use skiff_testkit::client::{self, ClientCtx, FrameReader, ReadState};

use moq_auth::{Algorithm, Claims, Key, KeyId, Pattern};

/// What a probe session saw.
#[derive(Debug, Default)]
struct Seen {
    /// Its SETUP exchange completed.
    setup: bool,
    /// How the relay closed it: code and reason.
    closed: Option<(u64, String)>,
    /// When it was closed.
    closed_at: Option<Instant>,
    /// The subscription started (first group).
    started: Option<u64>,
    /// The subscription ended with this code.
    sub_closed: Option<Option<u64>>,
    /// Broadcasts announced to it.
    announced: Vec<String>,
}

/// A client session that records how it ends and, if asked, subscribes to
/// one track at once (without waiting for an announcement).
struct Probe {
    seen: Rc<RefCell<Seen>>,
    subscribe: Option<(String, track::Ref<'static, 'static>)>,
    announce: Option<String>,
    sub: Option<SubscriptionId>,
    asked: bool,
}

impl Probe {
    fn new() -> Self {
        Probe {
            seen: Rc::default(),
            subscribe: None,
            announce: None,
            sub: None,
            asked: false,
        }
    }
}

impl App for Probe {
    fn on_event(&mut self, event: &Event<'_>) {
        let mut s = self.seen.borrow_mut();
        match *event {
            Event::Setup { .. } => s.setup = true,
            Event::Closed { code, reason, .. } => {
                s.closed = Some((code, reason.to_owned()));
                s.closed_at = Some(Instant::now());
            }
            Event::Started { group, .. } => s.started = Some(group),
            Event::SubscriptionClosed { code, .. } => s.sub_closed = Some(code),
            Event::Announced { path, .. } => s.announced.push(path.to_owned()),
            _ => {}
        }
    }

    fn act<X: skiff_core::transport::Transport>(
        &mut self,
        session: &mut skiff_core::session::Session<
            '_,
            'static,
            'static,
            { skiff_monoio::session_driver::STREAMS },
            X,
        >,
    ) {
        if !session.is_established() || !session.is_setup() || self.asked {
            return;
        }
        self.asked = true;
        if let Some(prefix) = &self.announce {
            let _ = session.announce_request(prefix);
        }
        if let Some((path, local)) = &self.subscribe {
            let req = Request {
                start: Start::Latest,
                end: End::Open,
                ordered: false,
                priority: 0,
                max_latency: track::DEFAULT_MAX_AGE,
            };
            self.sub = session.subscribe(path, *local, req).ok();
        }
    }
}

/// A relay with `auth` on a free loopback port.
fn relay(auth: AuthConfig) -> ServerHandle {
    let mut cfg = config(1, DriverKind::Legacy);
    cfg.auth = auth;
    server::start(cfg, RelayHandler::factory(1).unwrap()).expect("start relay")
}

/// A fresh scratch directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skiff-auth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A moq-auth key of `alg` (kid `kid`) written where the relay reads it.
fn moq_key(alg: Algorithm, kid: &str, file: &std::path::Path) -> Key {
    let key = Key::generate(alg, Some(KeyId::decode(kid).unwrap())).unwrap();
    key.to_file(file).unwrap();
    key
}

fn pats(texts: &[&str]) -> Vec<Pattern> {
    texts.iter().map(|t| t.parse().unwrap()).collect()
}

/// A token signed by `key` for `root`.
fn token(key: &Key, root: &str, publish: &[&str], subscribe: &[&str]) -> String {
    let exp = SystemTime::now() + Duration::from_secs(3600);
    key.sign(
        &Claims::default()
            .with_root(root)
            .with_publish(pats(publish))
            .with_subscribe(pats(subscribe))
            .with_expires(exp),
    )
    .unwrap()
}

/// Runs `probe` against `url` until its session ends (at most 10 s).
async fn run(
    url: &str,
    ctx: &ClientCtx,
    origin: Option<skiff_core::model::origin::Ref<'static, 'static>>,
    mut probe: Probe,
) -> Rc<RefCell<Seen>> {
    let seen = probe.seen.clone();
    let _ = monoio::time::timeout(
        Duration::from_secs(10),
        client::run(url, origin, &mut probe, ctx),
    )
    .await;
    seen
}

/// The close a session dialed at `url` gets (the relay closes refused ones).
fn refusal(url: String) -> (u64, String) {
    let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
        let ctx = ClientCtx::new(1 << 20);
        run(&url, &ctx, None, Probe::new()).await
    })
    .expect("runtime");
    let s = seen.borrow();
    s.closed
        .clone()
        .expect("the relay did not close the session")
}

const UNAUTHORIZED: u64 = 0x2;
const UNROUTABLE: u64 = 0x36;

fn assert_refused(url: String, why: &str) {
    let (code, reason) = refusal(url);
    assert_eq!(code, UNAUTHORIZED, "{reason}");
    assert!(
        reason.contains(why),
        "reason `{reason}` does not say `{why}`"
    );
}

// ---------------------------------------------------------------------------
// Refusals at SETUP
// ---------------------------------------------------------------------------

#[test]
fn tokens_are_checked_at_setup() {
    within(60, || {
        let dir = scratch("setup");
        let key = moq_key(Algorithm::ES256, "es", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let at = |path: &str| format!("tcp://{}/{path}", h.local_addr());
        // No token.
        assert_refused(at("room"), "a token is required");
        // A stranger's key.
        let stranger = Key::generate(Algorithm::ES256, None).unwrap();
        let forged = token(&stranger, "room", &["**"], &[]);
        assert_refused(at(&format!("room?jwt={forged}")), "does not verify");
        // Expired, and not valid yet.
        let expired = key
            .sign(
                &Claims::default()
                    .with_root("room")
                    .with_publish(pats(&["**"]))
                    .with_expires(SystemTime::now() - Duration::from_secs(5)),
            )
            .unwrap();
        assert_refused(at(&format!("room?jwt={expired}")), "expired");
        let future = SystemTime::now() + Duration::from_secs(600);
        let mut early = Claims::default()
            .with_root("room")
            .with_publish(pats(&["**"]));
        early.not_before = Some(future);
        let early = key.sign(&early).unwrap();
        assert_refused(at(&format!("room?jwt={early}")), "not valid yet");
        // Another root.
        let other = token(&key, "other", &["**"], &["**"]);
        assert_refused(at(&format!("room?jwt={other}")), "outside the token's root");
        // A good token is admitted: the session stays up until we leave.
        let good = token(&key, "room", &["**"], &["**"]);
        let url = at(&format!("room/sub?jwt={good}"));
        let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
            let ctx = ClientCtx::new(1 << 20);
            let seen = Rc::new(RefCell::new(Seen::default()));
            let probe = Probe::new();
            let s = probe.seen.clone();
            monoio::spawn(async move {
                let mut probe = probe;
                let _ = client::run(&url, None, &mut probe, &ctx).await;
            });
            monoio::time::sleep(Duration::from_millis(500)).await;
            *seen.borrow_mut() = std::mem::take(&mut *s.borrow_mut());
            seen
        })
        .expect("runtime");
        assert!(seen.borrow().setup, "the good session did not set up");
        assert!(seen.borrow().closed.is_none(), "{:?}", seen.borrow().closed);
        h.shutdown().expect("relay stops");
    });
}

#[test]
fn anonymous_access_reaches_only_the_public_patterns() {
    within(60, || {
        let dir = scratch("public");
        moq_key(Algorithm::HS256, "hs", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            public: ["anon/**".parse().unwrap()].into_iter().collect(),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        assert_refused(format!("tcp://{addr}/other"), "a token is required");
        assert_refused(format!("tcp://{addr}/anon?jwt=garbage"), "does not verify");
        let url = format!("tcp://{addr}/anon");
        let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
            let ctx = ClientCtx::new(8 << 20);
            // At `/anon` (docs/protocol.md §4.1), `cam` is `anon/cam`.
            let (origin, producer) = ctx.publication("cam", "video");
            let mut g = producer.create_group(0).unwrap();
            g.write_frame(0, b"frame").unwrap();
            ctx.notify().bump();
            let publisher = Probe::new();
            let (u, c) = (url.clone(), Rc::new(ctx));
            let c2 = c.clone();
            monoio::spawn(async move {
                let mut p = publisher;
                let _ = client::run(&u, Some(origin), &mut p, &c2).await;
            });
            monoio::time::sleep(Duration::from_millis(200)).await;
            let mut viewer = Probe::new();
            viewer.subscribe = Some(("cam".into(), c.track("video")));
            let seen = viewer.seen.clone();
            monoio::spawn(async move {
                let mut v = viewer;
                let _ = client::run(&url, None, &mut v, &c).await;
            });
            let t0 = Instant::now();
            while seen.borrow().started.is_none() && t0.elapsed() < Duration::from_secs(5) {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(g);
            seen
        })
        .expect("runtime");
        assert!(seen.borrow().started.is_some(), "{:?}", seen.borrow());
        h.shutdown().expect("relay stops");
    });
}

// ---------------------------------------------------------------------------
// Publish and subscribe grants
// ---------------------------------------------------------------------------

#[test]
fn publish_and_subscribe_stay_inside_their_grants() {
    within(60, || {
        let dir = scratch("grants");
        let key = moq_key(Algorithm::EdDSA, "ed", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        // The publisher may publish `room/alice` only; it also offers `room/bob`.
        let publisher = token(&key, "room", &["alice"], &[]);
        let viewer_all = token(&key, "room", &[], &["**"]);
        let viewer_alice = token(&key, "room", &[], &["alice"]);
        let (pub_url, all_url, alice_url) = (
            format!("tcp://{addr}/room?jwt={publisher}"),
            format!("tcp://{addr}/room?jwt={viewer_all}"),
            format!("tcp://{addr}/room?jwt={viewer_alice}"),
        );
        let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
            let ctx = Rc::new(ClientCtx::new(8 << 20));
            // Rooted at `/room` (docs/protocol.md §4.1): `alice` is `room/alice`.
            let (origin, mut producers) = ctx.publication_tracks("alice", &["video"]);
            let alice = producers.remove(0);
            let (bob_origin, mut bob) = ctx.publication_tracks("bob", &["video"]);
            let bob = bob.remove(0);
            let mut groups = Vec::new();
            for p in [&alice, &bob] {
                let mut g = p.create_group(0).unwrap();
                g.write_frame(0, b"frame").unwrap();
                groups.push(g);
            }
            ctx.notify().bump();
            for (o, u) in [(origin, pub_url.clone()), (bob_origin, pub_url.clone())] {
                let c = ctx.clone();
                monoio::spawn(async move {
                    let mut p = Probe::new();
                    let _ = client::run(&u, Some(o), &mut p, &c).await;
                });
            }
            monoio::time::sleep(Duration::from_millis(300)).await;
            let mut out = Vec::new();
            for (url, path) in [
                (all_url.clone(), "alice"),
                (all_url.clone(), "bob"),
                (alice_url.clone(), "alice"),
                (alice_url.clone(), "bob"),
            ] {
                let mut v = Probe::new();
                v.subscribe = Some((path.into(), ctx.track("video")));
                v.announce = Some(String::new());
                let seen = v.seen.clone();
                let c = ctx.clone();
                monoio::spawn(async move {
                    let _ = client::run(&url, None, &mut v, &c).await;
                });
                out.push(seen);
            }
            let t0 = Instant::now();
            while out
                .iter()
                .any(|s| s.borrow().started.is_none() && s.borrow().sub_closed.is_none())
                && t0.elapsed() < Duration::from_secs(5)
            {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            monoio::time::sleep(Duration::from_millis(100)).await;
            drop(groups);
            out
        })
        .expect("runtime");
        let s: Vec<_> = seen.iter().map(|s| s.borrow()).collect();
        // `room/bob` was announced outside the publisher's grant: not routed.
        assert!(s[0].started.is_some(), "{:?}", s[0]);
        assert_eq!(s[1].sub_closed, Some(Some(UNROUTABLE)), "{:?}", s[1]);
        assert_eq!(s[0].announced, vec!["alice".to_owned()]);
        // A viewer of `alice` only: `bob` is refused and never announced.
        assert!(s[2].started.is_some(), "{:?}", s[2]);
        assert_eq!(s[3].sub_closed, Some(Some(UNROUTABLE)), "{:?}", s[3]);
        assert_eq!(s[3].announced, vec!["alice".to_owned()]);
        h.shutdown().expect("relay stops");
    });
}

// ---------------------------------------------------------------------------
// Expiry and key rotation
// ---------------------------------------------------------------------------

#[test]
fn a_session_is_closed_when_its_token_expires() {
    within(60, || {
        let dir = scratch("expiry");
        let key = moq_key(Algorithm::HS256, "hs", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        let forever = token(&key, "live", &["**"], &[]);
        // Whole seconds on the wire: at least 2 s from now.
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let exp = SystemTime::UNIX_EPOCH + Duration::from_secs(now + 3);
        let short = key
            .sign(
                &Claims::default()
                    .with_root("live")
                    .with_subscribe(pats(&["**"]))
                    .with_expires(exp),
            )
            .unwrap();
        let (pub_url, sub_url) = (
            format!("tcp://{addr}/live?jwt={forever}"),
            format!("tcp://{addr}/live?jwt={short}"),
        );
        let (seen, frames, closed_wall) =
            driver::block_on(DriverKind::Legacy, move |_| async move {
                let ctx = Rc::new(ClientCtx::new(16 << 20));
                let (origin, producer) = ctx.publication("cam", "video");
                let c = ctx.clone();
                monoio::spawn(async move {
                    let mut p = Probe::new();
                    let _ = client::run(&pub_url, Some(origin), &mut p, &c).await;
                });
                monoio::time::sleep(Duration::from_millis(200)).await;
                let local = ctx.track("video");
                let mut v = Probe::new();
                v.subscribe = Some(("cam".into(), local));
                let seen = v.seen.clone();
                let c = ctx.clone();
                monoio::spawn(async move {
                    let _ = client::run(&sub_url, None, &mut v, &c).await;
                });
                let frames = Rc::new(RefCell::new(0u64));
                let (f, notify) = (frames.clone(), ctx.notify().clone());
                monoio::spawn(async move {
                    let mut reader = FrameReader::new(local);
                    let _: ReadState = reader
                        .read_to_end(&notify, &mut |_: skiff_testkit::client::Frame<'_>| {
                            *f.borrow_mut() += 1
                        })
                        .await;
                });
                // Stream until the relay closes the viewer (deadline: exp + 3 s).
                let deadline = Instant::now() + Duration::from_secs(8);
                let mut g = producer.create_group(0).unwrap();
                let mut i = 0;
                let mut closed_wall = None;
                while Instant::now() < deadline {
                    g.write_frame(i, &[7u8; 500]).unwrap();
                    ctx.notify().bump();
                    i += 1;
                    if seen.borrow().closed.is_some() {
                        closed_wall = Some(SystemTime::now());
                        break;
                    }
                    monoio::time::sleep(Duration::from_millis(20)).await;
                }
                g.finish().unwrap();
                (seen, frames, closed_wall)
            })
            .expect("runtime");
        let s = seen.borrow();
        let (code, reason) = s.closed.clone().expect("not closed at expiry");
        assert_eq!(code, UNAUTHORIZED);
        assert!(reason.contains("expired"), "{reason}");
        assert!(
            *frames.borrow() > 0,
            "the viewer streamed nothing before expiry"
        );
        let closed_wall = closed_wall.unwrap();
        // Not before `exp`, and soon after it (the loop polls every 20 ms).
        assert!(closed_wall >= exp, "closed before exp");
        assert!(
            closed_wall < exp + Duration::from_secs(2),
            "closed {:?} after exp",
            closed_wall.duration_since(exp)
        );
        h.shutdown().expect("relay stops");
    });
}

#[test]
fn a_key_dir_rotates_without_a_restart() {
    within(60, || {
        let dir = scratch("rotation");
        let k1 = moq_key(Algorithm::ES256, "k1", &dir.join("k1.jwk"));
        let h = relay(AuthConfig {
            key_dir: Some(dir.clone()),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        let admitted = |t: &str| {
            let url = format!("tcp://{addr}/r?jwt={t}");
            driver::block_on(DriverKind::Legacy, move |_| async move {
                let ctx = Rc::new(ClientCtx::new(1 << 20));
                let p = Probe::new();
                let s = p.seen.clone();
                let c = ctx.clone();
                monoio::spawn(async move {
                    let mut p = p;
                    let _ = client::run(&url, None, &mut p, &c).await;
                });
                monoio::time::sleep(Duration::from_millis(300)).await;
                let s = s.borrow();
                s.setup && s.closed.is_none()
            })
            .expect("runtime")
        };
        let t1 = token(&k1, "r", &[], &["**"]);
        assert!(admitted(&t1), "k1 refused");
        // A new key appears: its tokens are accepted at once.
        let k2 = moq_key(Algorithm::EdDSA, "k2", &dir.join("k2.jwk"));
        let t2 = token(&k2, "r", &[], &["**"]);
        assert!(admitted(&t2), "k2 refused");
        // The old key is withdrawn: its tokens are refused.
        std::fs::remove_file(dir.join("k1.jwk")).unwrap();
        assert_refused(format!("tcp://{addr}/r?jwt={t1}"), "key is unknown");
        h.shutdown().expect("relay stops");
    });
}

// ---------------------------------------------------------------------------
// A leaf presents its token upstream
// ---------------------------------------------------------------------------

/// A leaf relay with a token file reaches an upstream that needs one; a
/// viewer of the upstream watches a broadcast published on the leaf.
#[test]
fn a_leaf_presents_its_token_upstream() {
    within(60, || {
        let dir = scratch("leaf");
        let key = moq_key(Algorithm::ES256, "es", &dir.join("key.jwk"));
        let up = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let addr = up.local_addr();
        std::fs::write(dir.join("token"), token(&key, "live", &["**"], &["**"])).unwrap();
        let mut cfg = config(1, DriverKind::Legacy);
        cfg.upstream = Some(format!("tcp://{addr}/live").parse().unwrap());
        cfg.upstream_token_file = Some(dir.join("token"));
        let leaf = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("start leaf");
        // The leaf's root is the upstream's `live` (docs/protocol.md §4.1):
        // its `cam` is the upstream's `live/cam`.
        let leaf_url = format!("tcp://{}/", leaf.local_addr());
        let viewer_url = format!(
            "tcp://{addr}/live?jwt={}",
            token(&key, "live", &[], &["**"])
        );
        let seen = driver::block_on(DriverKind::Legacy, move |_| async move {
            let ctx = Rc::new(ClientCtx::new(8 << 20));
            let (origin, producer) = ctx.publication("cam", "video");
            let mut g = producer.create_group(0).unwrap();
            g.write_frame(0, b"frame").unwrap();
            ctx.notify().bump();
            let c = ctx.clone();
            monoio::spawn(async move {
                let mut p = Probe::new();
                let _ = client::run(&leaf_url, Some(origin), &mut p, &c).await;
            });
            let mut v = Probe::new();
            v.announce = Some(String::new());
            let seen = v.seen.clone();
            let c = ctx.clone();
            monoio::spawn(async move {
                let _ = client::run(&viewer_url, None, &mut v, &c).await;
            });
            // The leaf dials, is admitted and announces `cam` upstream, where
            // the viewer at `/live` sees it as `cam`.
            let t0 = Instant::now();
            while !seen.borrow().announced.iter().any(|p| p == "cam")
                && t0.elapsed() < Duration::from_secs(10)
            {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(g);
            seen
        })
        .expect("runtime");
        assert!(
            seen.borrow().announced.iter().any(|p| p == "cam"),
            "the leaf's broadcast did not reach the upstream: {:?}",
            seen.borrow()
        );
        leaf.shutdown().expect("leaf stops");
        up.shutdown().expect("relay stops");
    });
}

// ---------------------------------------------------------------------------
// WebSocket: the token in the request URI
// ---------------------------------------------------------------------------

/// Over WebSocket the request URI's query carries the token: the README's
/// publisher and viewer reach each other through a relay that admits
/// nobody without one.
#[test]
fn over_websocket_the_request_uri_carries_the_token() {
    within(60, || {
        let dir = scratch("ws");
        let key = moq_key(Algorithm::ES256, "es", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        let publisher = format!("ws://{addr}/?jwt={}", token(&key, "", &["camera"], &[]));
        let viewer = format!("ws://{addr}/?jwt={}", token(&key, "", &[], &["camera"]));
        const FRAMES: u64 = 45;
        let frames = driver::block_on(DriverKind::Legacy, move |_| async move {
            let watching = monoio::spawn(async move { subscribe::watch(&viewer).await });
            monoio::time::sleep(Duration::from_millis(200)).await;
            publish::publish(&publisher, FRAMES).await.expect("publish");
            watching.await.expect("watch")
        })
        .expect("runtime");
        assert!(!frames.is_empty(), "the viewer saw nothing");
        assert_eq!(frames.last().unwrap().1, (FRAMES - 1) * 1000 / 30);
        // Without a token the same URL is refused (TCP shows the code).
        assert_refused(format!("tcp://{addr}/"), "a token is required");
        h.shutdown().expect("relay stops");
    });
}

// ---------------------------------------------------------------------------
// Compatibility both ways
// ---------------------------------------------------------------------------

/// A token written with `jsonwebtoken` (as skiff's tooling would) verifies
/// with moq-auth, and with the relay under the same moq-auth key file.
#[test]
fn our_tokens_verify_with_moq_auth() {
    let dir = scratch("compat");
    let file = dir.join("key.jwk");
    let key = moq_key(Algorithm::HS256, "hs", &file);
    // The secret, read back from the JWK moq-auth wrote.
    let jwk: serde_json::Value = {
        use base64::Engine;
        let text = std::fs::read_to_string(&file).unwrap();
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim())
            .unwrap();
        serde_json::from_slice(&json).unwrap()
    };
    let secret = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(jwk["k"].as_str().unwrap())
            .unwrap()
    };
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("hs".into());
    let exp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let ours = jsonwebtoken::encode(
        &header,
        &serde_json::json!({"root":"live","put":["cam"],"get":"","exp":exp,"iss":"skiff"}),
        &jsonwebtoken::EncodingKey::from_secret(&secret),
    )
    .unwrap();
    let claims = key.verify(&ours).expect("moq-auth refuses our token");
    assert_eq!(claims.root, "live");
    let relay_key = skiff_relay::auth::Key::from_file(&file).unwrap();
    let mine = relay_key.verify(&ours, SystemTime::now()).unwrap();
    assert_eq!(mine.root, "live");
    assert!(
        mine.authorize("/live/cam")
            .unwrap()
            .publish
            .matches("live/cam/hd")
    );
}

// ---------------------------------------------------------------------------
// Under load
// ---------------------------------------------------------------------------

/// 200 connections with bad tokens arrive while two good viewers stream:
/// every bad one is refused, the good ones get every frame in order.
#[test]
fn bad_tokens_under_load_do_not_disturb_good_viewers() {
    within(120, || {
        const BAD: usize = 200;
        const FRAMES: u64 = 300;
        let dir = scratch("load");
        let key = moq_key(Algorithm::ES256, "es", &dir.join("key.jwk"));
        let h = relay(AuthConfig {
            key: Some(dir.join("key.jwk")),
            ..AuthConfig::default()
        });
        let addr = h.local_addr();
        let good_pub = format!(
            "tcp://{addr}/live?jwt={}",
            token(&key, "live", &["**"], &[])
        );
        let good_sub = format!(
            "tcp://{addr}/live?jwt={}",
            token(&key, "live", &[], &["**"])
        );
        let stranger = Key::generate(Algorithm::ES256, Some(KeyId::decode("es").unwrap())).unwrap();
        let bad_url = format!(
            "tcp://{addr}/live?jwt={}",
            token(&stranger, "live", &["**"], &["**"])
        );
        let started = Instant::now();
        let (got, refused) = driver::block_on(DriverKind::Legacy, move |_| async move {
            let ctx = Rc::new(ClientCtx::new(32 << 20));
            let (origin, producer) = ctx.publication("cam", "video");
            let c = ctx.clone();
            monoio::spawn(async move {
                let mut p = Probe::new();
                let _ = client::run(&good_pub, Some(origin), &mut p, &c).await;
            });
            monoio::time::sleep(Duration::from_millis(200)).await;
            let mut got = Vec::new();
            let mut viewers = Vec::new();
            for _ in 0..2 {
                let local = ctx.track("video");
                let mut v = Probe::new();
                v.subscribe = Some(("cam".into(), local));
                viewers.push(v.seen.clone());
                let (c, u) = (ctx.clone(), good_sub.clone());
                monoio::spawn(async move {
                    let _ = client::run(&u, None, &mut v, &c).await;
                });
                let frames = Rc::new(RefCell::new(Vec::new()));
                let (f, notify) = (frames.clone(), ctx.notify().clone());
                monoio::spawn(async move {
                    let mut reader = FrameReader::sequential(local, 0);
                    let _ = reader
                        .read_to_end(&notify, &mut |fr: skiff_testkit::client::Frame<'_>| {
                            f.borrow_mut().push(fr.timestamp)
                        })
                        .await;
                });
                got.push(frames);
            }
            // The track has no group yet: wait for the viewers' sessions,
            // then give their SUBSCRIBEs time to reach the publisher.
            while viewers.iter().any(|v| !v.borrow().setup) {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "viewers did not set up"
                );
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            monoio::time::sleep(Duration::from_millis(300)).await;
            // The flood, in waves of 20 over about half a second, while the
            // publisher writes.
            let refused = Rc::new(RefCell::new(0usize));
            {
                let (ctx, refused) = (ctx.clone(), refused.clone());
                monoio::spawn(async move {
                    for _ in 0..BAD / 20 {
                        for _ in 0..20 {
                            let (u, r) = (bad_url.clone(), refused.clone());
                            let c = Rc::new(ctx.sibling());
                            monoio::spawn(async move {
                                let seen = run(&u, &c, None, Probe::new()).await;
                                let code = seen.borrow().closed.as_ref().map(|(code, _)| *code);
                                if code == Some(UNAUTHORIZED) {
                                    *r.borrow_mut() += 1;
                                }
                            });
                        }
                        monoio::time::sleep(Duration::from_millis(50)).await;
                    }
                });
            }
            let mut g = producer.create_group(0).unwrap();
            for i in 0..FRAMES {
                if i > 0 && i % 30 == 0 {
                    g.finish().unwrap();
                    g = producer.create_group(i / 30).unwrap();
                }
                g.write_frame(i, &[i as u8; 1000]).unwrap();
                ctx.notify().bump();
                monoio::time::sleep(Duration::from_millis(3)).await;
            }
            g.finish().unwrap();
            let mut producer = producer;
            producer.finish();
            ctx.notify().bump();
            let t0 = Instant::now();
            while (got.iter().any(|f| (f.borrow().len() as u64) < FRAMES)
                || *refused.borrow() < BAD)
                && t0.elapsed() < Duration::from_secs(20)
            {
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            let got: Vec<Vec<u64>> = got.iter().map(|f| f.borrow().clone()).collect();
            let refused = *refused.borrow();
            (got, refused)
        })
        .expect("runtime");
        eprintln!(
            "{BAD} bad-token connections: {refused} refused; good viewers got {:?} frames in {:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            started.elapsed()
        );
        assert_eq!(refused, BAD, "not every bad token was refused");
        for frames in got {
            assert_eq!(
                frames,
                (0..FRAMES).collect::<Vec<_>>(),
                "a good viewer lost frames"
            );
        }
        h.shutdown().expect("relay stops");
    });
}
