//! A subscriber that reads slowly, through a real relay on loopback: it
//! falls behind, skips to newer groups (the groups it can no longer get are
//! reset or never opened), and the relay's memory stays within its cache
//! budget, while a fast subscriber of the same track gets every frame.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::conn;
use skiff_monoio::driver;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, FrameReader, Publisher, ReadState, Subscriber};
use skiff_testkit::wait::Changes;

const GROUPS: u64 = 40;
const FRAMES: u64 = 10;
const FRAME: usize = 16 * 1024;
/// The relay's cache: a track may hold an eighth of it, at least 1 MiB.
const CACHE: u64 = 8 << 20;

fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = vec![(g * 31 + i) as u8; FRAME];
    p[..8].copy_from_slice(&g.to_le_bytes());
    p[8..16].copy_from_slice(&i.to_le_bytes());
    p
}

#[derive(Default)]
struct Seen {
    frames: Vec<(u64, u64)>,
    bad: u64,
    skipped: u64,
    finished: bool,
}

/// Reads `local` into `seen`, pausing `pause` after every frame.
fn reader(
    ctx: &Rc<ClientCtx>,
    local: skiff_core::model::track::Ref<'static, 'static>,
    pause: Duration,
    seen: Rc<RefCell<Seen>>,
) {
    let notify = ctx.notify().clone();
    monoio::spawn(async move {
        let mut reader = FrameReader::new(local);
        let changes = Changes::new(&notify);
        loop {
            let mut got = 0;
            let st = reader.poll(|f| {
                got += 1;
                let mut s = seen.borrow_mut();
                if f.payload != payload(f.group, f.index).as_slice() {
                    s.bad += 1;
                }
                s.frames.push((f.group, f.index));
            });
            seen.borrow_mut().skipped = reader.lagged + reader.aborted_groups;
            match st {
                ReadState::Pending => {}
                ReadState::Finished => {
                    seen.borrow_mut().finished = true;
                    return;
                }
                ReadState::Aborted(_) => return,
            }
            if got > 0 {
                notify.bump();
                if !pause.is_zero() {
                    monoio::time::sleep(pause * got).await;
                    continue;
                }
            }
            changes.next().await;
        }
    });
}

async fn scenario(url: String) -> (Seen, Seen) {
    let ctx = Rc::new(ClientCtx::new(256 << 20));
    let slow_ctx = Rc::new(ClientCtx::new(64 << 20));
    // The slow subscriber grants little credit: the relay cannot push much
    // into its socket ahead of its reader.
    slow_ctx.set_transport(conn::Config {
        max_stream_data_uni: 64 * 1024,
        max_data: 256 * 1024,
        ..conn::Config::new()
    });
    let (origin, producer) = ctx.publication("race", "video");
    {
        let (ctx, url) = (ctx.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = Publisher::default();
            let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
        });
    }
    let mut g0 = producer.create_group(0).expect("group 0");
    g0.write_frame(0, &payload(0, 0)).expect("frame");
    ctx.notify().bump();

    let mut states = Vec::new();
    let mut seen = Vec::new();
    for (c, pause) in [
        (&ctx, Duration::ZERO),
        (&slow_ctx, Duration::from_millis(10)),
    ] {
        let local = c.track("video");
        let app = Subscriber::new("race", local);
        states.push(app.state.clone());
        let (c2, url) = (c.clone(), url.clone());
        monoio::spawn(async move {
            let mut app = app;
            let _ = client::run(&url, None, &mut app, &c2).await;
        });
        let s = Rc::new(RefCell::new(Seen::default()));
        reader(c, local, pause, s.clone());
        seen.push(s);
    }
    let t0 = Instant::now();
    while states.iter().any(|s| s.started.get().is_none()) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "subscriptions did not start"
        );
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    // A group every 20 ms: 160 KiB each, 8 MB/s; the slow reader takes 100 ms
    // per group. Frames are due on a fixed schedule from the start, so a
    // loaded machine that oversleeps catches up instead of stretching the
    // publication (the slow reader's pauses only grow under load: it falls
    // behind either way).
    let start = Instant::now();
    for g in 0..GROUPS {
        let mut w = if g == 0 {
            None
        } else {
            Some(producer.create_group(g).expect("group"))
        };
        for i in 0..FRAMES {
            if g == 0 && i == 0 {
                continue;
            }
            w.as_mut()
                .unwrap_or(&mut g0)
                .write_frame(g * 100 + i, &payload(g, i))
                .expect("frame");
            ctx.notify().bump();
            let due = start + Duration::from_millis(2) * (g * FRAMES + i + 1) as u32;
            monoio::time::sleep(due.saturating_duration_since(Instant::now())).await;
        }
        match w.as_mut() {
            Some(w) => w.finish().expect("finish"),
            None => g0.finish().expect("finish"),
        }
        ctx.notify().bump();
    }
    let mut producer = producer;
    producer.finish();
    ctx.notify().bump();
    let t1 = Instant::now();
    while !seen.iter().all(|s| s.borrow().finished) {
        if t1.elapsed() > Duration::from_secs(30) {
            let st: Vec<_> = seen
                .iter()
                .map(|s| {
                    let s = s.borrow();
                    (
                        s.frames.len(),
                        s.frames.last().copied(),
                        s.skipped,
                        s.finished,
                    )
                })
                .collect();
            panic!("readers did not finish: {st:?}");
        }
        monoio::time::sleep(Duration::from_millis(10)).await;
    }
    ctx.close_all();
    slow_ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    let mut out = seen.into_iter().map(|s| {
        Rc::try_unwrap(s)
            .map(RefCell::into_inner)
            .unwrap_or_default()
    });
    let fast = out.next().expect("fast");
    let slow = out.next().expect("slow");
    (fast, slow)
}

#[test]
fn slow_subscriber_skips_ahead_and_the_fast_one_gets_everything() {
    slow_and_fast(1);
}

/// The same on two workers: when the subscribers and the publisher land on
/// different workers, the track crosses the link by reference (lent blocks),
/// and neither worker's pool grows past its cache.
#[test]
fn slow_subscriber_across_workers_keeps_both_caches_bounded() {
    slow_and_fast(2);
}

fn slow_and_fast(threads: usize) {
    for kind in drivers() {
        within(120, move || {
            let mut cfg = config(threads, kind);
            cfg.cache_bytes = CACHE;
            let handle =
                server::start(cfg, RelayHandler::factory(threads).unwrap()).expect("start relay");
            let url = format!("tcp://{}/", handle.local_addr());
            let (fast, slow) = driver::block_on(kind, move |_| scenario(url)).expect("runtime");
            let snap = (0..threads)
                .map(|t| handle.metrics().thread(t).snapshot())
                .max_by_key(|s| s.cache_high_water)
                .unwrap_or_default();
            eprintln!(
                "{threads} workers: lent {} bytes across links",
                handle.metrics().total().lent_bytes
            );
            let groups = |s: &Seen| {
                let mut g: Vec<u64> = s.frames.iter().map(|f| f.0).collect();
                g.dedup();
                g
            };
            let (fg, sg) = (groups(&fast), groups(&slow));
            eprintln!(
                "{kind:?}: fast got {} frames in {} groups; slow got {} frames in {} groups, skipped {} (last {:?}); relay cache high water {:.2} MiB of {} MiB",
                fast.frames.len(),
                fg.len(),
                slow.frames.len(),
                sg.len(),
                slow.skipped,
                sg.last(),
                snap.cache_high_water as f64 / (1 << 20) as f64,
                CACHE >> 20
            );
            assert_eq!(fast.bad + slow.bad, 0, "payloads differ");
            assert_eq!(
                fast.frames.len() as u64,
                GROUPS * FRAMES,
                "fast subscriber missed frames"
            );
            assert!(
                fast.frames.windows(2).all(|w| w[0] < w[1]),
                "fast subscriber out of order"
            );
            assert!(
                (sg.len() as u64) < GROUPS,
                "the slow subscriber did not skip: {} groups",
                sg.len()
            );
            assert!(slow.finished, "the slow subscriber did not reach the end");
            assert!(
                sg.last().is_some_and(|&l| l >= GROUPS - 2),
                "the slow subscriber did not reach the newest groups: {sg:?}"
            );
            assert!(
                sg.windows(2).all(|w| w[0] < w[1]),
                "slow subscriber went back"
            );
            assert!(
                snap.cache_high_water <= CACHE,
                "relay cache grew to {} bytes",
                snap.cache_high_water
            );
            handle.shutdown().expect("relay stops");
        });
    }
}
