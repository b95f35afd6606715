//! After warm-up, relaying (publisher session in, subscriber sessions out,
//! the thread's notify, timers, reader tasks) does not allocate per frame on
//! the relay worker thread: group bytes live in the block pool, buffers are
//! sized for their bounds once per connection and reused. Fetches of past
//! groups answered from the relay's cache (docs/protocol.md §3.10) do not
//! allocate there either.

mod common;
mod counting;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use counting::*;
use skiff_monoio::driver;
use skiff_relay::handler::WorkerInfo;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{
    self, ClientCtx, Fetcher, FrameReader, Publisher, ReadState, Subscriber,
};
use skiff_testkit::wait::Changes;

#[global_allocator]
static A: Counting = Counting;

const VIEWERS: usize = 5;
const WARM_GROUPS: u64 = 4;
const GROUPS: u64 = 12;
const FRAMES: u64 = 10;

async fn load(url: String, count: Arc<AtomicU64>) -> (u64, u64, u64, u64) {
    let ctx = Rc::new(ClientCtx::new(64 << 20));
    let notify = ctx.notify().clone();
    let (origin, producer) = ctx.publication("cam", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let mut g0 = producer.create_group(0).unwrap();
    g0.write_frame(0, &[7u8; 900]).unwrap();
    let mut states = Vec::new();
    let frames = Rc::new(Cell::new(0u64));
    for _ in 0..VIEWERS {
        let local = ctx.track("video");
        let app = Subscriber::new("cam", local);
        states.push(app.state.clone());
        {
            let (ctx, url) = (ctx.clone(), url.clone());
            monoio::spawn(async move {
                let mut app = app;
                let _ = client::run(&url, None, &mut app, &ctx).await;
            });
        }
        let (notify, frames) = (notify.clone(), frames.clone());
        monoio::spawn(async move {
            let mut reader = FrameReader::new(local);
            let changes = Changes::new(&notify);
            loop {
                let mut got = false;
                if reader.poll(|_| {
                    got = true;
                    frames.set(frames.get() + 1);
                }) != ReadState::Pending
                {
                    return;
                }
                if got {
                    notify.bump();
                }
                changes.next().await;
            }
        });
    }
    // A client that fetches each finished group again, from the relay's cache.
    let fetcher = Fetcher::new("cam");
    let (fetches, fetched) = (fetcher.queue.clone(), fetcher.state.clone());
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = fetcher;
            let _ = client::run(&url, None, &mut app, &ctx).await;
        });
    }
    while !states.iter().all(|s| s.started.get().is_some()) {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    g0.finish().unwrap();
    let mut start = 0;
    for g in 1..=GROUPS {
        if g == WARM_GROUPS {
            monoio::time::sleep(Duration::from_millis(50)).await;
            start = count.load(Ordering::Relaxed);
        }
        let mut w = producer.create_group(g).unwrap();
        for i in 0..FRAMES {
            w.write_frame(i, &[g as u8; 900]).unwrap();
            notify.bump();
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
        w.finish().unwrap();
        if g >= WARM_GROUPS {
            fetches.borrow_mut().push_back((g, ctx.track("video")));
        }
        notify.bump();
    }
    monoio::time::sleep(Duration::from_millis(100)).await;
    let end = count.load(Ordering::Relaxed);
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fetched.failed.get(), 0, "a fetch failed");
    (start, end, frames.get(), fetched.done.get())
}

#[test]
fn steady_state_relaying_allocates_nothing_on_the_worker() {
    for kind in drivers() {
        within(60, move || {
            let count = Arc::new(AtomicU64::new(0));
            let c2 = count.clone();
            let make = RelayHandler::factory(1).unwrap();
            let handle = server::start(config(1, kind), move |w: &WorkerInfo| Probed {
                inner: Rc::new(make(w)),
                count: c2.clone(),
                bytes: Default::default(),
                live: Default::default(),
            })
            .unwrap();
            let url = format!("tcp://{}/", handle.local_addr());
            let c3 = count.clone();
            let (start, end, frames, fetched) =
                driver::block_on(kind, move |_| load(url, c3)).unwrap();
            assert_eq!(fetched, GROUPS - WARM_GROUPS + 1, "groups fetched");
            assert!(
                frames >= VIEWERS as u64 * (GROUPS - WARM_GROUPS) * FRAMES,
                "{frames} frames"
            );
            eprintln!("{kind:?}: worker allocations {start} at warm-up end, {end} at the end");
            // The probe is live: warm-up (sessions, tracks, buffers) allocated.
            assert!(start > 0, "probe never sampled");
            assert_eq!(
                end - start,
                0,
                "{kind:?}: {} allocations while relaying",
                end - start
            );
            handle.shutdown().unwrap();
        });
    }
}
