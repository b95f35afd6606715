//! A flood of bad tokens against a real `skiff-relay` process that verifies
//! tokens (docs/protocol.md §4.10) and lets anonymous clients publish and
//! watch everything: 1,000 connections whose token was signed by a stranger
//! are each closed with UNAUTHORIZED while a publisher streams to ten steady
//! subscribers that must receive every frame. After a warm-up flood, the
//! relay's memory stays flat through the measured one, and its open
//! connections come back to the audience's.

mod common;
mod peers;

use std::net::SocketAddr;
use std::time::{Duration, Instant as StdInstant, SystemTime};

use common::*;
use moq_auth::{Algorithm, Claims, Key, KeyId};
use peers::*;
use skiff_core::session::Config;

/// Connections with a bad token, after the warm-up's.
const BAD: usize = 1_000;
/// Connections with a bad token first, before memory is measured.
const WARM_UP: usize = 500;
/// How much the relay's RSS may grow over [`BAD`] refused connections: about
/// 4 KiB each, a small part of one connection's buffers, so a connection that
/// kept anything would show; below it is the allocator's and the audience's
/// noise.
const MAX_GROWTH: u64 = 4 << 20;
/// Client threads the flood comes from at once.
const THREADS: usize = 10;
/// UNAUTHORIZED (docs/protocol.md §3.15).
const UNAUTHORIZED: u64 = 0x2;

/// A token for everything, signed by a key the relay does not know under the
/// kid it does know.
fn stranger_token() -> String {
    let stranger = Key::generate(Algorithm::ES256, Some(KeyId::decode("es").unwrap())).unwrap();
    let claims = Claims::default()
        .with_root("")
        .with_publish(vec!["**".parse().unwrap()])
        .with_subscribe(vec!["**".parse().unwrap()])
        .with_expires(SystemTime::now() + Duration::from_secs(3600));
    stranger.sign(&claims).unwrap()
}

/// `n` connections dialing `path` from [`THREADS`] threads; returns how many
/// were closed with UNAUTHORIZED.
fn flood(addr: SocketAddr, path: &'static str, n: usize) -> usize {
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut refused = 0;
                for _ in 0..n / THREADS {
                    let config = Config {
                        path: Some(path),
                        ..Config::new()
                    };
                    let mut raw = Raw::connect(addr, config, None);
                    raw.pump_until(IO_TIMEOUT, |r| r.close.is_some());
                    if raw.close == Some((UNAUTHORIZED, true)) {
                        refused += 1;
                    }
                }
                refused
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn bad_tokens_leave_the_relay_where_it_was() {
    within(300, || {
        let dir = std::env::temp_dir().join(format!("skiff-auth-flood-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key_file = dir.join("key.jwk");
        Key::generate(Algorithm::ES256, Some(KeyId::decode("es").unwrap()))
            .unwrap()
            .to_file(&key_file)
            .unwrap();
        let relay = start_relay(&[
            "--auth-key",
            key_file.to_str().unwrap(),
            "--auth-public",
            "**",
        ]);
        let addr = relay.addr;
        let audience = SteadyAudience::start(addr);
        let audience_open = relay.metric("skiff_relay_connections_open");
        let path: &'static str = Box::leak(format!("/?jwt={}", stranger_token()).into_boxed_str());
        let t0 = StdInstant::now();
        // The warm-up: the relay's pools and the audience's group cache fill.
        let warm_refused = flood(addr, path, WARM_UP);
        std::thread::sleep(Duration::from_millis(600));
        let warm = relay.settled_rss();
        let refused = flood(addr, path, BAD);
        std::thread::sleep(Duration::from_millis(600));
        let end = relay.settled_rss();
        let elapsed = t0.elapsed();
        let open = relay.metric("skiff_relay_connections_open");
        let seen = audience.finish();
        eprintln!(
            "auth flood: {WARM_UP} + {BAD} bad-token connections in {:.1} s, {} refused; relay \
             RSS {} KiB after the warm-up, {} KiB at the end; open connections {open} \
             (audience {audience_open})",
            elapsed.as_secs_f64(),
            warm_refused + refused,
            warm / 1024,
            end / 1024,
        );
        assert_eq!(
            warm_refused + refused,
            WARM_UP + BAD,
            "every bad token is refused"
        );
        check_good(&seen);
        let grown = end.saturating_sub(warm);
        assert!(
            grown <= MAX_GROWTH,
            "RSS grew {} KiB over {BAD} refused connections",
            grown / 1024
        );
        assert_eq!(open, audience_open, "no refused connection is left open");
        let _ = std::fs::remove_dir_all(&dir);
    });
}
