//! The load the allocation tests over encrypted transports share (TLS and
//! QUIC): a relay worker with a certificate, one publisher and five viewers
//! of the SDK, and the worker's allocations per frame delivered after
//! warm-up.
#![allow(dead_code)]

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::common::*;
use crate::counting::*;
use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Config, connect};
use skiff_relay::handler::WorkerInfo;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

/// Viewers of the default load.
const VIEWERS: usize = 5;
const WARM_GROUPS: u64 = 4;
const GROUPS: u64 = 12;
const FRAMES: u64 = 10;

/// The worker's allocations after warm-up, per frame delivered.
#[derive(Debug, Clone, Copy)]
pub struct PerFrame {
    /// Allocations per frame.
    pub allocations: f64,
    /// Bytes those allocations asked for, per frame.
    pub bytes: f64,
}

/// The bytes of every frame the load publishes.
pub const FRAME_BYTES: usize = 900;

/// The worker's counters (allocations, bytes) as last sampled.
fn sampled(count: &AtomicU64, bytes: &AtomicU64) -> (u64, u64) {
    (count.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed))
}

/// Publishes and watches over `url`; (worker counters at warm-up end, at
/// the end, frames read).
async fn load(
    url: String,
    config: Config,
    (count, bytes): (Arc<AtomicU64>, Arc<AtomicU64>),
    viewers: usize,
    burst: bool,
) -> ((u64, u64), (u64, u64), u64) {
    let frames = Rc::new(Cell::new(0u64));
    let started = Rc::new(Cell::new(0usize));
    let mut clients = Vec::new();
    for _ in 0..viewers {
        let (client, runner) = connect(&url, config.clone()).unwrap();
        monoio::spawn(runner.run());
        let (frames, started) = (frames.clone(), started.clone());
        clients.push(client.clone());
        monoio::spawn(async move {
            // Every group however far a viewer lags on a busy host (a live-edge
            // request skips groups that fell behind): the test counts
            // allocations per frame, so every frame must arrive.
            let every_group = Request {
                max_latency: skiff_core::time::Duration::from_secs(30),
                ..Request::LIVE
            };
            let Ok(mut track) = client.subscribe("cam", "video", every_group).await else {
                return;
            };
            started.set(started.get() + 1);
            while let Ok(Some(mut group)) = track.next_group().await {
                while let Ok(Some(frame)) = group.read_frame().await {
                    // Every byte of frame `i` of group `g` is `g`.
                    let g = (frame.timestamp / 1000) as u8;
                    assert_eq!(
                        frame.payload.len(),
                        FRAME_BYTES,
                        "frame {}",
                        frame.timestamp
                    );
                    assert!(
                        frame.payload.chunks().flatten().all(|&b| b == g),
                        "frame {} corrupted",
                        frame.timestamp
                    );
                    frames.set(frames.get() + 1);
                }
            }
        });
    }
    let (publisher, runner) = connect(&url, config).unwrap();
    monoio::spawn(runner.run());
    let broadcast = publisher.publish("cam").unwrap();
    let mut track = broadcast.create_track(Info::new("video").unwrap()).unwrap();
    while started.get() < viewers || track.subscribers() == 0 {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut start = (0, 0);
    let mut counted_from = 0;
    for g in 0..GROUPS {
        if g == WARM_GROUPS {
            monoio::time::sleep(Duration::from_millis(50)).await;
            start = sampled(&count, &bytes);
            counted_from = frames.get();
        }
        let mut group = track.append_group().unwrap();
        for i in 0..FRAMES {
            group
                .write_frame(g * 1000 + i, &[g as u8; FRAME_BYTES])
                .await
                .unwrap();
            if !burst {
                monoio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        group.finish().unwrap();
        if burst {
            monoio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    monoio::time::sleep(Duration::from_millis(100)).await;
    let end = sampled(&count, &bytes);
    let delivered = frames.get() - counted_from;
    track.finish();
    publisher.close().await;
    for v in clients {
        v.close().await;
    }
    (start, end, delivered)
}

/// Relays the load over `scheme` (`tls` or `moql`) through a relay worker
/// with a certificate on `kind`'s driver; returns the worker's allocations
/// per frame delivered after warm-up (and prints them).
pub fn allocations_per_frame(kind: DriverKind, scheme: &str) -> PerFrame {
    allocations_per_frame_with(kind, scheme, Shape::default())
}

/// How the load is run: the default, or a small cache with each group
/// written at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    /// The worker's cache (its block pool) in bytes; `None`: the default.
    pub cache_bytes: Option<u64>,
    /// Each group's frames written back to back rather than 2 ms apart, so
    /// many are in flight to every viewer at once.
    pub burst: bool,
    /// Viewers; `None`: the default five.
    pub viewers: Option<usize>,
}

/// As [`allocations_per_frame`], with the load shaped by `shape`.
pub fn allocations_per_frame_with(kind: DriverKind, scheme: &str, shape: Shape) -> PerFrame {
    // A directory of this call's own: the tests of one binary run at once,
    // and one's certificate files must not replace another's.
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "skiff-{scheme}-alloc-{}-{kind:?}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pki = skiff_testkit::pki::Pki::write(&dir, "alloc");
    let count = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let (c2, b2) = (count.clone(), bytes.clone());
    let make = RelayHandler::factory(1).unwrap();
    let base = config(1, kind);
    let cfg = skiff_relay::config::RelayConfig {
        tls: Some(skiff_relay::tls::TlsFiles {
            cert: pki.cert,
            key: pki.key,
        }),
        cache_bytes: shape.cache_bytes.unwrap_or(base.cache_bytes),
        ..base
    };
    let handle = server::start(cfg, move |w: &WorkerInfo| Probed {
        inner: Rc::new(make(w)),
        count: c2.clone(),
        bytes: b2.clone(),
        live: Default::default(),
    })
    .unwrap();
    let url = format!("{scheme}://{}/anon", handle.local_addr());
    let mut client_config = Config::default();
    client_config.tls_roots = Some(Arc::new(
        skiff_monoio::tls::roots_from_pem_file(&pki.ca).unwrap(),
    ));
    let (c3, b3) = (count.clone(), bytes.clone());
    let viewers = shape.viewers.unwrap_or(VIEWERS);
    let (start, end, delivered) = driver::block_on(kind, move |_| {
        load(url, client_config, (c3, b3), viewers, shape.burst)
    })
    .unwrap();
    let wanted = viewers as u64 * (GROUPS - WARM_GROUPS) * FRAMES;
    assert!(delivered >= wanted, "{delivered} of {wanted} frames");
    assert!(start.0 > 0, "probe never sampled");
    let per_frame = PerFrame {
        allocations: (end.0 - start.0) as f64 / delivered as f64,
        bytes: (end.1 - start.1) as f64 / delivered as f64,
    };
    eprintln!(
        "{kind:?}: {} worker allocations ({} bytes) for {delivered} frames delivered over {scheme}:// ({:.2} allocations, {:.0} bytes per frame)",
        end.0 - start.0,
        end.1 - start.1,
        per_frame.allocations,
        per_frame.bytes,
    );
    handle.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    per_frame
}
