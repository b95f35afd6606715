//! Publisher failover through a real `skiff-relay` worker over loopback TCP.
//!
//! The publisher of N tracks (1 to 128) closes its sessions and a new one
//! announces the same broadcasts; one iteration is the time from the close
//! until every one of the N subscribers (one per track, each on its own
//! session) holds a group from the new source. The relay's side of the
//! switch is O(tracks): each orphaned broadcast subscribes its tracks again
//! from the new source and no subscriber is touched, so the time must grow
//! linearly (128 tracks within 4.5 times 32 tracks).
//!
//! A publisher session carries at most 16 tracks here (one broadcast each;
//! a session's 64 control streams cover about 30 TRACK+SUBSCRIBE requests at
//! once), so 32 to 128 tracks are published over 2 to 8 sessions that fail
//! over together.
//!
//! `cargo bench -p skiff-benches --bench failover`

use std::cell::Cell;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use skiff_core::model::{origin, track};
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::config::RelayConfig;
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, Publisher, Subscriber};

const TRACKS_PER_SESSION: usize = 16;
const SIZES: [usize; 5] = [1, 8, 32, 64, 128];
/// Bytes each track keeps (a few one-frame groups).
const BUDGET: u64 = 64 * 1024;

type Publication = Vec<(
    origin::Ref<'static, 'static>,
    Vec<track::Producer<'static, 'static>>,
)>;

/// The client side: subscribers and two publications of the same
/// broadcasts, used in turn.
struct Rig {
    url: String,
    base: Rc<ClientCtx>,
    publications: [Publication; 2],
    subscribers: Vec<track::Ref<'static, 'static>>,
    next_group: Cell<u64>,
}

/// Track names per publisher session.
fn sessions(tracks: usize) -> Vec<Vec<String>> {
    (0..tracks.div_ceil(TRACKS_PER_SESSION))
        .map(|s| {
            let n = (tracks - s * TRACKS_PER_SESSION).min(TRACKS_PER_SESSION);
            (0..n).map(|i| format!("t{i}")).collect()
        })
        .collect()
}

impl Rig {
    fn new(url: String, tracks: usize) -> Rig {
        let base = Rc::new(ClientCtx::new(64 << 20));
        let names = sessions(tracks);
        let publish = || -> Publication {
            names
                .iter()
                .enumerate()
                .map(|(s, names)| {
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    base.publication_tracks(&format!("bench/cam{s}"), &refs)
                })
                .collect()
        };
        let publications = [publish(), publish()];
        // A few groups per track are plenty: keep the pool small.
        for publication in &publications {
            for (_, producers) in publication {
                for p in producers {
                    p.track().set_budget(BUDGET);
                }
            }
        }
        let mut subscribers = Vec::new();
        for (s, names) in names.iter().enumerate() {
            for name in names {
                let local = base.track(name);
                local.set_budget(BUDGET);
                subscribers.push(local);
                let app = Subscriber::new(&format!("bench/cam{s}"), local);
                let (ctx, url) = (base.clone(), url.clone());
                monoio::spawn(async move {
                    let mut app = app;
                    let _ = client::run(&url, None, &mut app, &ctx).await;
                });
            }
        }
        Rig {
            url,
            base,
            publications,
            subscribers,
            next_group: Cell::new(0),
        }
    }

    /// Writes one group to every track of publication `which` and starts its
    /// sessions; returns their context and the group's sequence.
    fn start(&self, which: usize) -> (Rc<ClientCtx>, u64) {
        let ctx = Rc::new(self.base.sibling());
        let seq = self.next_group.get();
        self.next_group.set(seq + 1);
        for (origin, producers) in &self.publications[which] {
            for p in producers {
                let mut g = p.create_group(seq).expect("group");
                g.write_frame(seq, b"keyframe").expect("frame");
                g.finish().expect("finish");
            }
            let (origin, url, ctx) = (*origin, self.url.clone(), ctx.clone());
            monoio::spawn(async move {
                let mut app = Publisher::default();
                let _ = client::run(&url, Some(origin), &mut app, &ctx).await;
            });
        }
        self.base.notify().bump();
        (ctx, seq)
    }

    /// Waits until every subscriber holds group `seq` or a later one.
    async fn all_have(&self, seq: u64) {
        let notify = self.base.notify().clone();
        let changes = skiff_testkit::wait::Changes::new(&notify);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self
                .subscribers
                .iter()
                .all(|t| t.latest().is_some_and(|l| l >= seq))
            {
                return;
            }
            if Instant::now() > deadline {
                let have = self
                    .subscribers
                    .iter()
                    .filter(|t| t.latest().is_some_and(|l| l >= seq))
                    .count();
                let states: Vec<_> = self
                    .subscribers
                    .iter()
                    .map(|t| (t.latest(), t.status()))
                    .take(40)
                    .collect();
                panic!(
                    "failover did not complete: {have} of {} subscribers have group {seq}: {states:?}",
                    self.subscribers.len()
                );
            }
            monoio::select! {
                _ = changes.next() => {}
                _ = monoio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    }
}

/// Runs the rig for `tracks` on this thread, answering each request for
/// `n` failovers with their total time.
async fn serve(url: String, tracks: usize, rx: mpsc::Receiver<u64>, tx: mpsc::Sender<Duration>) {
    let rig = Rig::new(url, tracks);
    let (mut current, seq) = rig.start(0);
    rig.all_have(seq).await;
    let mut which = 0;
    loop {
        let n = match rx.try_recv() {
            Ok(n) => n,
            Err(mpsc::TryRecvError::Empty) => {
                monoio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            Err(mpsc::TryRecvError::Disconnected) => break,
        };
        let mut total = Duration::ZERO;
        for _ in 0..n {
            let t0 = Instant::now();
            current.close_all();
            which = 1 - which;
            let (next, seq) = rig.start(which);
            rig.all_have(seq).await;
            total += t0.elapsed();
            current = next;
        }
        if tx.send(total).is_err() {
            break;
        }
    }
    current.close_all();
    rig.base.close_all();
    monoio::time::sleep(Duration::from_millis(50)).await;
}

fn failover(c: &mut Criterion) {
    let mut group = c.benchmark_group("failover");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(4));
    for tracks in SIZES {
        let config = RelayConfig {
            listen: "127.0.0.1:0".parse().expect("addr"),
            threads: std::num::NonZeroUsize::MIN,
            driver: DriverKind::Auto,
            ..RelayConfig::default()
        };
        let relay = server::start(config, RelayHandler::factory(1).expect("mesh")).expect("relay");
        let url = format!("tcp://{}/anon", relay.local_addr());
        let (req_tx, req_rx) = mpsc::channel::<u64>();
        let (res_tx, res_rx) = mpsc::channel::<Duration>();
        let rig = std::thread::spawn(move || {
            driver::block_on(DriverKind::Auto, move |_| {
                serve(url, tracks, req_rx, res_tx)
            })
            .expect("client runtime");
        });
        group.bench_with_input(BenchmarkId::new("tracks", tracks), &tracks, |b, _| {
            b.iter_custom(|iters| {
                req_tx.send(iters).expect("rig alive");
                res_rx.recv().expect("rig answers")
            })
        });
        drop(req_tx);
        let _ = rig.join();
        relay.shutdown().expect("relay stops");
    }
    group.finish();
}

criterion_group!(benches, failover);
criterion_main!(benches);
