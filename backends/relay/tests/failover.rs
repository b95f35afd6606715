//! Publisher failover through a real relay: the publisher is a separate
//! process (this test binary run again as a child), killed with SIGKILL in
//! the middle of a group and started again; ten subscribers stay subscribed
//! and go on at the next group, every frame they get intact and in order.

mod common;

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use skiff_monoio::driver::{self, DriverKind};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;
use skiff_testkit::client::{self, ClientCtx, FrameReader, Publisher, Subscriber};

const SUBSCRIBERS: usize = 10;
const FRAMES: u64 = 10;
/// The child reads its relay URL and first group from these.
const CHILD_URL: &str = "SKIFF_FAILOVER_URL";
const CHILD_FIRST: &str = "SKIFF_FAILOVER_FIRST";

fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(1024);
    p.extend_from_slice(&g.to_le_bytes());
    p.extend_from_slice(&i.to_le_bytes());
    while p.len() < 1024 {
        p.push((g * 7 + i * 3 + p.len() as u64) as u8);
    }
    p
}

/// The publisher, run as a child process: groups of ten frames 5 ms apart
/// from group `first` on, forever, printing `frame G I` after each frame.
#[test]
fn failover_child_publisher() {
    let (Ok(url), Ok(first)) = (std::env::var(CHILD_URL), std::env::var(CHILD_FIRST)) else {
        return; // Only meaningful as the child of `publisher_killed_mid_group_...`.
    };
    let first: u64 = first.parse().expect("first group");
    driver::block_on(DriverKind::Legacy, move |_| async move {
        let ctx = Rc::new(ClientCtx::new(16 << 20));
        let (origin, producer) = ctx.publication("live/cam", "video");
        {
            let ctx = ctx.clone();
            monoio::spawn(async move {
                let mut app = Publisher::default();
                let r = client::run(&url, Some(origin), &mut app, &ctx).await;
                eprintln!("child publisher session ended: {r:?}");
                std::process::exit(3);
            });
        }
        for g in first.. {
            let mut group = producer.create_group(g).expect("group");
            for i in 0..FRAMES {
                group
                    .write_frame(g * 1000 + i, &payload(g, i))
                    .expect("frame");
                ctx.notify().bump();
                println!("frame {g} {i}");
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            group.finish().expect("finish");
            ctx.notify().bump();
        }
    })
    .expect("child runtime");
}

/// A publisher child and the frames it reported writing.
struct Child1 {
    child: Child,
    written: mpsc::Receiver<(u64, u64)>,
}

fn spawn_publisher(url: &str, first: u64) -> Child1 {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "failover_child_publisher",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_URL, url)
        .env(CHILD_FIRST, first.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn publisher");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let mut it = line.split_whitespace();
            if it.next() != Some("frame") {
                continue;
            }
            let (Some(g), Some(i)) = (it.next(), it.next()) else {
                continue;
            };
            if let (Ok(g), Ok(i)) = (g.parse(), i.parse())
                && tx.send((g, i)).is_err()
            {
                break;
            }
        }
    });
    Child1 { child, written: rx }
}

/// Waits (without blocking the runtime) for the child to report writing
/// frame `i` of some group from `from` on; returns that group.
async fn wait_written(p: &Child1, from: u64, i: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        while let Ok((g, f)) = p.written.try_recv() {
            if g >= from && f == i {
                return g;
            }
        }
        assert!(Instant::now() < deadline, "publisher made no progress");
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// What one subscriber saw: frames by group, in arrival order.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<(u64, u64)>,
    errors: Vec<String>,
    aborted_groups: u64,
}

/// The spare's first group in [`Mode::SpareFirst`].
const SPARE_FIRST: u64 = 1000;

/// When the second publisher starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// After the first one was killed (a camera that restarts).
    AfterKill,
    /// Before: it announces while the first is still alive (a camera that
    /// reconnects before the relay knows its old connection is dead); it
    /// starts at group 1000. On the first one's worker it takes the route
    /// over at once (the newest announcement wins) and the first waits as
    /// a spare; on another worker it is a standby there and takes over
    /// when the first is killed (docs/protocol.md §4.4).
    SpareFirst,
}

async fn scenario(url: String, mode: Mode) -> (Vec<Seen>, u64, u64) {
    let ctx = Rc::new(ClientCtx::new(64 << 20));
    let notify = ctx.notify().clone();
    let first = spawn_publisher(&url, 0);
    // Set before the subscribers' sessions close at the end.
    let done = Rc::new(std::cell::Cell::new(false));
    // The subscribers join while the first publisher runs.
    let mut states = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..SUBSCRIBERS {
        let local = ctx.track("video");
        let app = Subscriber::new("live/cam", local);
        states.push(app.state.clone());
        {
            let (ctx, url) = (ctx.clone(), url.clone());
            monoio::spawn(async move {
                let mut app = app;
                let _ = client::run(&url, None, &mut app, &ctx).await;
            });
        }
        let s = Rc::new(RefCell::new(Seen::default()));
        seen.push(s.clone());
        let (notify, done) = (notify.clone(), done.clone());
        monoio::spawn(async move {
            let mut reader = FrameReader::new(local);
            let st = reader
                .read_to_end(&notify, |f| {
                    let mut s = s.borrow_mut();
                    if f.payload != payload(f.group, f.index).as_slice()
                        || f.timestamp != f.group * 1000 + f.index
                    {
                        s.errors
                            .push(format!("frame {}/{} differs", f.group, f.index));
                    }
                    s.frames.push((f.group, f.index));
                })
                .await;
            let mut s = s.borrow_mut();
            s.aborted_groups = reader.aborted_groups;
            if !done.get() {
                s.errors.push(format!("reader stopped: {st:?}"));
            }
        });
    }
    let all_past = |g: u64| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !seen
                .iter()
                .all(|s| s.borrow().frames.last().is_some_and(|f| f.0 >= g))
            {
                assert!(
                    Instant::now() < deadline,
                    "subscribers never reached group {g}"
                );
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    eprintln!("subscribers started");
    all_past(2).await;
    eprintln!("subscribers past group 2");
    let spare = if mode == Mode::SpareFirst {
        let p = spawn_publisher(&url, SPARE_FIRST);
        wait_written(&p, SPARE_FIRST, 0).await;
        monoio::time::sleep(Duration::from_millis(200)).await;
        Some(p)
    } else {
        None
    };
    // Kill the publisher in the middle of a group (after its 5th frame).
    let mut first = first;
    let mut killed = wait_written(&first, 3, 4).await;
    first.child.kill().expect("kill publisher");
    let _ = first.child.wait();
    // The last frame it reported is where it died (a slow machine may have
    // let it write a few more).
    monoio::time::sleep(Duration::from_millis(50)).await;
    let mut last_frame = 4;
    while let Ok((g, i)) = first.written.try_recv() {
        (killed, last_frame) = (g, i);
    }
    eprintln!("publisher killed in group {killed} after frame {last_frame}");
    for s in &states {
        assert_eq!(
            s.closed.get(),
            None,
            "a subscription ended with the publisher"
        );
    }
    // Start it again: it goes on with the next group.
    let (mut second, next) = match spare {
        Some(p) => (p, SPARE_FIRST),
        None => {
            monoio::time::sleep(Duration::from_millis(200)).await;
            (spawn_publisher(&url, killed + 1), killed + 1)
        }
    };
    all_past(next + 3).await;
    let _ = second.child.kill();
    let _ = second.child.wait();
    for s in &states {
        assert_eq!(s.closed.get(), None, "a subscription ended during failover");
    }
    done.set(true);
    ctx.close_all();
    monoio::time::sleep(Duration::from_millis(100)).await;
    let seen = seen
        .into_iter()
        .map(|s| {
            Rc::try_unwrap(s)
                .map(RefCell::into_inner)
                .unwrap_or_default()
        })
        .collect();
    (seen, killed, next)
}

fn check(seen: &[Seen], killed: u64, next: u64, mode: Mode) {
    for (n, s) in seen.iter().enumerate() {
        assert!(s.errors.is_empty(), "subscriber {n}: {:?}", s.errors);
        let first = s.frames.first().expect("frames").0;
        // Groups from the first seen on, each complete and in order, except
        // the killed one, which stops early; then the new source's groups,
        // each from its start. (A loaded machine may let the publisher finish
        // the killed group before it dies: then the jump follows it.) A
        // spare that took the route over when it announced cut the first
        // publisher's group then, once, before the kill.
        let mut want = (first, s.frames[0].1);
        for &(g, i) in &s.frames {
            if (g, i) != want {
                let after_killed = want.0 == killed || want == (killed + 1, 0);
                let took_over = mode == Mode::SpareFirst && want.0 < next && g >= next;
                assert!(
                    (after_killed || took_over) && i == 0 && g > want.0,
                    "subscriber {n}: got {g}/{i}, wanted {}/{}",
                    want.0,
                    want.1
                );
            }
            want = if i + 1 == FRAMES {
                (g + 1, 0)
            } else {
                (g, i + 1)
            };
        }
        let last = s.frames.last().expect("frames").0;
        assert!(last >= next + 3, "subscriber {n} stopped at group {last}");
    }
}

#[test]
fn publisher_killed_mid_group_subscribers_resume_at_next_group() {
    run(Mode::AfterKill);
}

#[test]
fn spare_publisher_takes_over_when_the_first_is_killed() {
    run(Mode::SpareFirst);
}

fn run(mode: Mode) {
    for threads in [1, 2] {
        for kind in drivers() {
            within(120, move || {
                let handle = server::start(
                    config(threads, kind),
                    RelayHandler::factory(threads).unwrap(),
                )
                .expect("start relay");
                let url = format!("tcp://{}/", handle.local_addr());
                let (seen, killed, next) =
                    driver::block_on(kind, move |_| scenario(url, mode)).expect("client runtime");
                check(&seen, killed, next, mode);
                let aborted: u64 = seen.iter().map(|s| s.aborted_groups).sum();
                eprintln!(
                    "{mode:?}, {threads} worker(s), {kind:?}: killed in group {killed}; {aborted} partial groups seen; every subscriber went on at group {next}"
                );
                handle.shutdown().expect("relay stops");
            });
        }
    }
}
