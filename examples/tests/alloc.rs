//! The camera node's publishing path allocates nothing per frame once warm:
//! drawing the stamped pattern, the hang prefix and the SDK's `append_group`,
//! `write_frame` and `finish` are counted (on this thread, inside their own
//! polls only) while the camera publishes H.264 through a relay to a
//! subscriber on the same runtime, pacing included. openh264's encoder is
//! left out of the count (a real codec may allocate); the allocation audit's
//! `camera_frame` and `camera_encode` cases (`benches/src/audit.rs`) report
//! the same split.

use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

#[path = "../../backends/relay/tests/common/mod.rs"]
mod common;

use common::within;
use skiff_core::hang;
use skiff_media::h264::{EncodeOptions, Encoder, Payload};
use skiff_media::node;
use skiff_media::pattern::{self, Stamp};
use skiff_media::picture::Picture;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::{GroupProducer, Request};
use skiff_monoio::{Config, connect};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::counting::{Counting, measure};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

thread_local! {
    /// The allocations counted on this thread so far.
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f`, counting the allocations it makes on this thread.
fn counted<T>(f: impl FnOnce() -> T) -> T {
    let (out, allocs) = measure(f);
    COUNT.with(|c| c.set(c.get() + allocs.count));
    out
}

/// A future whose own polls are counted (not the other tasks' between them).
struct Counted<'a, F>(Pin<&'a mut F>);

impl<F: Future> Future for Counted<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        counted(|| self.0.as_mut().poll(cx))
    }
}

/// Frames published before counting (three groups).
const WARM: u64 = 90;
/// Frames counted (five groups, so five group changes).
const MEASURED: u64 = 150;

#[test]
fn publishing_a_camera_frame_allocates_nothing() {
    within(60, || {
        // The counter counts.
        let before = COUNT.with(Cell::get);
        counted(|| drop(std::hint::black_box(Box::new(1u64))));
        assert_eq!(COUNT.with(Cell::get), before + 1);
        let cfg = RelayConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            threads: NonZeroUsize::MIN,
            drain_timeout: Duration::from_secs(2),
            ..RelayConfig::default()
        };
        let relay = server::start(cfg, RelayHandler::factory(1).unwrap()).expect("relay starts");
        let url = format!("tcp://{}/anon", relay.local_addr());
        let allocs = driver::block_on(DriverKind::Auto, move |_| async move {
            let (camera, runner) = connect(&url, node::client_config(320, 240, 1_000_000)).unwrap();
            let camera_runner = monoio::spawn(runner.run());
            let (viewer, runner) = connect(&url, Config::default()).unwrap();
            let viewer_runner = monoio::spawn(runner.run());
            let broadcast = camera.publish("cam.hang").unwrap();
            let mut track = broadcast
                .create_track(hang::video_info("video").unwrap())
                .unwrap();
            let reader = monoio::spawn({
                let viewer = viewer.clone();
                async move {
                    let mut t = viewer
                        .subscribe("cam.hang", "video", Request::LIVE)
                        .await
                        .unwrap();
                    let mut frames = 0u64;
                    while let Ok(Some(mut g)) = t.next_group().await {
                        while let Ok(Some(_)) = g.read_frame().await {
                            frames += 1;
                        }
                    }
                    frames
                }
            });
            while track.subscribers() == 0 {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut picture = Picture::new(320, 240);
            let mut encoder = Encoder::new(EncodeOptions {
                width: 320,
                height: 240,
                fps: 30.0,
                gop: 30,
                bitrate: 1_000_000,
            })
            .unwrap();
            let mut payload = Payload::with_capacity(256 << 10);
            let mut group: Option<GroupProducer> = None;
            let mut measured = 0;
            for n in 0..WARM + MEASURED {
                let before = COUNT.with(Cell::get);
                counted(|| {
                    let stamp = Stamp {
                        frame: n as u32,
                        time_us: node::wall_clock_us(),
                    };
                    pattern::draw(&mut picture, stamp);
                });
                // Not counted: openh264.
                if !encoder.encode(&picture, &mut payload).unwrap() {
                    continue;
                }
                let pts_us = n * 1_000_000 / 30;
                if payload.is_keyframe() {
                    counted(|| {
                        if let Some(g) = group.take() {
                            g.finish().unwrap();
                        }
                        group = Some(track.append_group().unwrap());
                    });
                }
                let bytes = counted(|| payload.frame(pts_us).unwrap());
                let g = group.as_mut().unwrap();
                let write = pin!(g.write_frame(pts_us, bytes));
                Counted(write).await.unwrap();
                if n >= WARM {
                    measured += COUNT.with(Cell::get) - before;
                }
                monoio::time::sleep(Duration::from_millis(1)).await;
            }
            if let Some(g) = group.take() {
                g.finish().unwrap();
            }
            track.finish();
            camera.flushed().await;
            let frames = reader.await;
            assert!(frames > 0, "the viewer read nothing");
            viewer.close().await;
            camera.close().await;
            camera_runner.await;
            viewer_runner.await;
            drop(broadcast);
            measured
        })
        .expect("client runtime");
        relay.shutdown().expect("relay stops");
        assert_eq!(allocs, 0, "allocations over {MEASURED} frames");
    });
}
