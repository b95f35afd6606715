//! A broadcast published again after its first source ended it, on a relay
//! that keeps running: the first source finishes its tracks and then
//! finishes its broadcast and closes, or loses its connection; a second
//! source announces the same path with the same track names. A viewer
//! subscribed to the first source gets its end; a new viewer that subscribes
//! afterwards gets the second source's groups, whether they start again at 0
//! (a restarted camera) or continue the sequence.
//!
//! Each case runs on a relay of one worker and of two. With two, a viewer
//! and a source may reach different workers, and the first source's
//! withdrawal may still be crossing the worker link when the second source
//! announces or the new viewer asks: the relay's rules for that (a link's
//! withdrawal waits for the next source within the failover grace, a
//! request the link refuses as unroutable waits with it, a standby takes
//! over) are tested deterministically in the core (`relay::routes`).
//!
//! A source writes its first group, then waits until every viewer read a
//! frame of every track before it writes the rest and stops: a viewer's
//! SUBSCRIBE follows its TRACK request's answer, so the relay subscribes
//! to the source a round trip before the viewer's SUBSCRIBE arrives, and a
//! source that finished and left in between would leave that SUBSCRIBE
//! nothing to find (refused, on one worker as on two).

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::*;
use skiff_core::model::track::Info;
use skiff_monoio::driver::{self, DriverKind};
use skiff_monoio::sdk::Request;
use skiff_monoio::{Client, Config, connect};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server;

const PATH: &str = "cam.hang";
const TRACKS: [&str; 2] = ["catalog.json", "video"];
const GROUPS: u64 = 3;
const FRAMES: u64 = 5;
/// How long a viewer or a publisher waits for anything before the test fails.
const DEADLINE: Duration = Duration::from_secs(15);

/// What a viewer got of one track: (group, timestamp) per frame, and whether
/// the track ended (the publisher finished it) before the deadline.
#[derive(Debug, Default, PartialEq, Eq)]
struct Watched {
    frames: Vec<(u64, u64)>,
    finished: bool,
}

/// Subscribes to `track` of [`PATH`] and reads it until it ends or
/// [`DEADLINE`] passes; counts itself in `reading` at its first frame.
async fn watch(client: Client, track: &'static str, reading: Rc<Cell<usize>>) -> Watched {
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Watched::default();
    let subscribe = client.subscribe(PATH, track, Request::LIVE);
    let Ok(Ok(mut consumer)) = monoio::time::timeout(DEADLINE, subscribe).await else {
        return seen;
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match monoio::time::timeout(left, consumer.next_group()).await {
            Ok(Ok(Some(mut group))) => {
                let left = deadline.saturating_duration_since(Instant::now());
                while let Ok(Ok(Some(frame))) =
                    monoio::time::timeout(left, group.read_frame()).await
                {
                    if seen.frames.is_empty() {
                        reading.set(reading.get() + 1);
                    }
                    seen.frames.push((group.sequence(), frame.timestamp));
                }
            }
            Ok(Ok(None)) => {
                seen.finished = true;
                return seen;
            }
            Ok(Err(_)) | Err(_) => return seen,
        }
    }
}

/// The frames a source writes: groups `first..first + GROUPS` of every track,
/// timestamps from `base` on.
fn frames(first: u64, base: u64) -> Vec<(u64, u64)> {
    (first..first + GROUPS)
        .flat_map(|g| (0..FRAMES).map(move |i| (g, base + (g - first) * FRAMES + i)))
        .collect()
}

/// Checks that `got` holds whole groups of `want`, in order, ending with its
/// last group, and then the track's end. (A live viewer skips the groups it
/// fell behind on.)
fn check(got: &Watched, want: &[(u64, u64)], who: &str) -> Option<String> {
    let groups = |f: &[(u64, u64)]| {
        let mut g: Vec<u64> = f.iter().map(|f| f.0).collect();
        g.dedup();
        g
    };
    let seen = groups(&got.frames);
    let whole: Vec<(u64, u64)> = want
        .iter()
        .filter(|f| seen.contains(&f.0))
        .copied()
        .collect();
    let good = got.frames == whole && seen.last() == want.last().map(|f| &f.0) && got.finished;
    (!good).then(|| {
        format!(
            "{who}: got {got:?}, wanted whole groups of {want:?}, its last one, and the track's end"
        )
    })
}

/// How a source stops once it wrote its groups and finished its tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// It finishes the broadcast and closes its client.
    Clean,
    /// Its connection goes away with the broadcast still announced (the
    /// relay sees a lost source, not a withdrawal).
    Lost,
}

/// Publishes [`PATH`] with [`TRACKS`] from a new client once the relay
/// subscribed to every track (or [`DEADLINE`] passed): groups from `first`
/// on with timestamps from `base`, the second one once `reading` counts
/// every track (each viewer's subscription is served); then finishes every
/// track and stops.
async fn publish(url: &str, first: u64, base: u64, stop: Stop, reading: Rc<Cell<usize>>) {
    let (client, runner) = connect(url, Config::default()).unwrap();
    monoio::spawn(runner.run());
    let broadcast = client.publish(PATH).unwrap();
    let mut tracks: Vec<_> = TRACKS
        .iter()
        .map(|name| broadcast.create_track(Info::new(name).unwrap()).unwrap())
        .collect();
    // The relay subscribes once per track, whatever the number of viewers.
    let deadline = Instant::now() + DEADLINE;
    while tracks.iter().any(|t| t.subscribers() == 0) && Instant::now() < deadline {
        monoio::time::sleep(Duration::from_millis(5)).await;
    }
    // One more pass: the subscriptions are set up before the first group.
    client.flushed().await;
    for (g, ts) in frames(first, base).chunks(FRAMES as usize).map(|c| c[0]) {
        if g > first {
            // The viewers' SUBSCRIBEs are in: the relay serves each of them.
            while reading.get() < TRACKS.len() && Instant::now() < deadline {
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        for t in &mut tracks {
            let mut group = t.create_group(g).unwrap();
            for i in 0..FRAMES {
                group
                    .write_frame(ts + i, &(ts + i).to_le_bytes())
                    .await
                    .unwrap();
            }
            group.finish().unwrap();
        }
        // One group at a time reaches the relay, so live viewers get each.
        client.flushed().await;
    }
    for t in tracks {
        t.finish();
    }
    match stop {
        Stop::Clean => {
            broadcast.finish();
            // The ends go out before the session closes.
            client.flushed().await;
            client.close().await;
        }
        Stop::Lost => {
            // The tracks' ends reach the relay, the withdrawal never does.
            client.flushed().await;
            client.close().await;
            drop(broadcast);
        }
    }
}

/// Subscribes to every track with `client`: the watchers, spawned, each
/// counted in `reading` once it read a frame.
fn watch_all(client: &Client, reading: &Rc<Cell<usize>>) -> Vec<monoio::task::JoinHandle<Watched>> {
    TRACKS
        .iter()
        .map(|name| monoio::spawn(watch(client.clone(), name, reading.clone())))
        .collect()
}

async fn scenario(url: String, second_first: u64, stop: Stop, threads: usize) {
    // The first viewer subscribes once the first source announced.
    let (viewer, runner) = connect(&url, Config::default()).unwrap();
    monoio::spawn(runner.run());
    let reading = Rc::new(Cell::new(0));
    let first = monoio::spawn({
        let (url, reading) = (url.clone(), reading.clone());
        async move { publish(&url, 0, 0, stop, reading).await }
    });
    announced(&url, true).await;
    let first_watch = watch_all(&viewer, &reading);
    let mut wrong = Vec::new();
    first.await;
    for (name, w) in TRACKS.iter().zip(first_watch) {
        wrong.extend(check(
            &w.await,
            &frames(0, 0),
            &format!("the first viewer's {name}"),
        ));
    }
    // The relay no longer lists the broadcast once the first source left.
    announced(&url, false).await;
    // The second source, and a new viewer once it announced.
    let (fresh, runner) = connect(&url, Config::default()).unwrap();
    monoio::spawn(runner.run());
    let reading = Rc::new(Cell::new(0));
    let second = monoio::spawn({
        let (url, reading) = (url.clone(), reading.clone());
        async move { publish(&url, second_first, 1000, Stop::Clean, reading).await }
    });
    announced(&url, true).await;
    let watches = watch_all(&fresh, &reading);
    second.await;
    for (w, name) in watches.into_iter().zip(TRACKS) {
        let want = frames(second_first, 1000);
        wrong.extend(check(&w.await, &want, &format!("a new viewer's {name}")));
    }
    fresh.close().await;
    viewer.close().await;
    assert!(
        wrong.is_empty(),
        "{threads} worker(s): {}",
        wrong.join("\n")
    );
}

/// Waits until the relay at `url` lists [`PATH`] (`listed`) or no longer does.
async fn announced(url: &str, listed: bool) {
    let deadline = Instant::now() + DEADLINE;
    while announced_paths(url).iter().any(|p| p == PATH) != listed {
        assert!(Instant::now() < deadline, "{PATH} listed: {}", !listed);
        monoio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The broadcast paths the relay at `url` lists on `GET /announced`.
fn announced_paths(url: &str) -> Vec<String> {
    let addr = url
        .trim_start_matches("tcp://")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (_, body) = http_get(addr, "/announced");
    body.trim_matches(|c| c == '[' || c == ']' || c == '\n')
        .split(',')
        .map(|p| p.trim().trim_matches('"').to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn run(second_first: u64, stop: Stop) {
    for threads in [1, 2] {
        within(120, move || {
            let handle = server::start(
                config(threads, DriverKind::Legacy),
                RelayHandler::factory(threads).unwrap(),
            )
            .expect("start relay");
            let url = format!("tcp://{}/", handle.local_addr());
            driver::block_on(DriverKind::Legacy, move |_| {
                scenario(url, second_first, stop, threads)
            })
            .expect("client runtime");
            handle.shutdown().expect("relay stops");
        });
    }
}

#[test]
fn a_restarted_source_starting_at_group_0_reaches_new_viewers() {
    run(0, Stop::Clean);
}

#[test]
fn a_new_source_continuing_the_sequence_reaches_new_viewers() {
    run(GROUPS, Stop::Clean);
}

#[test]
fn after_a_lost_source_that_finished_its_tracks_a_restarted_one_reaches_new_viewers() {
    run(0, Stop::Lost);
}

#[test]
fn after_a_lost_source_that_finished_its_tracks_a_continuing_one_reaches_new_viewers() {
    run(GROUPS, Stop::Lost);
}
