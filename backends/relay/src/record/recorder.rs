//! The recorder's subscriber: skiff SDK clients on worker 0's runtime that
//! dial the relay's own listen port (one per [`BROADCASTS_PER_CLIENT`]
//! recorded broadcasts). It watches the worker's origin for broadcasts
//! matching `--record`, and for each reads the hang catalog and
//! every track [`super::fmp4::catalog`] can store (H.264 video, Opus audio)
//! group by group, handing each complete group to the writer's queue
//! ([`super::writer::Queue`]).
//!
//! To the relay it is more subscribers: the live fan-out is unchanged
//! (its frames are served from the same cache blocks as every viewer's, and
//! a recorder that falls behind is dropped behind like any slow viewer).
//! Its own work (copying a frame out of the pool, collecting a group) runs
//! on worker 0 between that worker's other tasks, and nothing it does waits
//! for the disk: a full queue drops the group from the recording.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use moq_pattern::Patterns;
use skiff_core::hang;
use skiff_core::model::origin;
use skiff_monoio::cancel::race;
use skiff_monoio::sdk::{End, Request, Start};
use skiff_monoio::shutdown::Shutdown;
use skiff_monoio::{Client, Config};

use super::clients::{Clients, Lease};
use super::fmp4::{self, Sample};
use super::replay::ReplayPaths;
use super::writer::{Job, Queue};

/// How often the origin is looked at for broadcasts to start or stop recording.
const SCAN_EVERY: Duration = Duration::from_millis(250);

/// How long a frame lasts when its group has one frame and no earlier
/// group told the frame rate: 1/30 s.
const DEFAULT_FRAME_US: u32 = 33_333;

/// What the recorder asks of every track: each group from the latest on,
/// older ones kept wanted for 30 s (a recording wants every group, not
/// only the live edge), at the lowest priority.
fn request() -> Request {
    Request {
        start: Start::Latest,
        end: End::Open,
        ordered: true,
        priority: 0,
        max_latency: skiff_core::time::Duration::from_secs(30),
    }
}

/// Resolves once `flag` is set (looked at every 100 ms).
async fn stopped(flag: &Cell<bool>) {
    while !flag.get() {
        monoio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Broadcasts one recorder client records at once. Each subscription
/// (catalog, video, audio) holds one of the session's streams, and the
/// relay gives a session a bounded number at once (`--max-streams`): three
/// broadcasts of three tracks leave room for the announce requests.
pub const BROADCASTS_PER_CLIENT: usize = 3;

/// Runs the recorder until `shutdown`: `url` is the relay's own listen
/// address as the SDK dials it, `config` the SDK's settings of each of its
/// clients (pool size, TLS trust); the broadcasts in `replays` (this
/// relay's own replay broadcasts) are never recorded.
pub async fn run(
    origin: origin::Ref<'static, 'static>,
    url: String,
    config: Config,
    patterns: Patterns,
    replays: ReplayPaths,
    queue: Queue,
    shutdown: Shutdown,
) {
    let mut clients = Clients::new("recording", url, config, BROADCASTS_PER_CLIENT);
    // Path → (its task's stop flag, the scan that last saw it).
    let mut active: BTreeMap<String, (Rc<Cell<bool>>, u64)> = BTreeMap::new();
    let mut scan = 0u64;
    // The origin's version at the last walk: an unchanged origin is not walked.
    let mut walked = None;
    while !shutdown.is_draining() {
        let version = origin.version();
        if walked != Some(version) {
            walked = Some(version);
            scan += 1;
            // Marks what is still announced; allocates only for a new broadcast.
            for b in origin.iter() {
                let path = b.path();
                let path = path.as_str();
                if path.is_empty() || !patterns.matches(path) || replays.borrow().contains(path) {
                    continue;
                }
                if let Some((_, seen)) = active.get_mut(path) {
                    *seen = scan;
                    continue;
                }
                let stop = Rc::new(Cell::new(false));
                active.insert(path.to_owned(), (stop.clone(), scan));
                let Some((client, lease)) = clients.lease() else {
                    continue;
                };
                tracing::info!(broadcast = %path, "recording: started");
                monoio::spawn(record_broadcast(
                    client,
                    lease,
                    path.to_owned(),
                    queue.clone(),
                    stop,
                ));
            }
            active.retain(|_, (stop, seen)| {
                let keep = *seen == scan;
                if !keep {
                    stop.set(true);
                }
                keep
            });
        }
        let _ = race(monoio::time::sleep(SCAN_EVERY), shutdown.wait()).await;
    }
    for (stop, _) in active.values() {
        stop.set(true);
    }
    // The broadcasts' tasks see the flag within 100 ms and queue their end.
    monoio::time::sleep(Duration::from_millis(200)).await;
    clients.close().await;
}

/// Records broadcast `path` with `client` until `stop` (holding its share
/// of the client meanwhile): its catalog's first version names the tracks;
/// each rendition stored gets an init segment and a task.
async fn record_broadcast(
    client: Client,
    _lease: Lease,
    path: String,
    queue: Queue,
    stop: Rc<Cell<bool>>,
) {
    let Ok(Some(json)) = race(first_catalog(&client, &path), stopped(&stop)).await else {
        tracing::warn!(broadcast = %path, "recording: no catalog; not recorded");
        return;
    };
    let (renditions, skipped) = match fmp4::catalog(&json) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(broadcast = %path, error = %e, "recording: bad catalog; not recorded");
            return;
        }
    };
    // Stored for the replay broadcast's catalog (`super::replay`).
    queue.offer(Job::Catalog {
        broadcast: path.clone(),
        json,
    });
    if !skipped.is_empty() {
        tracing::info!(broadcast = %path, ?skipped, "recording: tracks not recorded (only H.264 with an avcC description and Opus are)");
    }
    for rendition in renditions {
        let track = rendition.name().to_owned();
        let init = Job::Init {
            broadcast: path.clone(),
            rendition,
        };
        if queue.offer(init) {
            monoio::spawn(record_track(
                client.clone(),
                path.clone(),
                track,
                queue.clone(),
                stop.clone(),
            ));
        }
    }
    stopped(&stop).await;
    tracing::info!(broadcast = %path, "recording: ended");
    queue.offer(Job::End { broadcast: path });
}

/// The first frame of the first catalog group of broadcast `path`.
async fn first_catalog(client: &Client, path: &str) -> Option<Vec<u8>> {
    let mut catalog = client
        .subscribe(path, hang::CATALOG_TRACK, request())
        .await
        .ok()?;
    let mut group = catalog.next_group().await.ok()??;
    let frame = group.read_frame().await.ok()??;
    Some(frame.payload.to_vec())
}

/// Records `track` of broadcast `path` until `stop` or the track's end.
async fn record_track(
    client: Client,
    path: String,
    track: String,
    queue: Queue,
    stop: Rc<Cell<bool>>,
) {
    let Ok(Ok(mut consumer)) =
        race(client.subscribe(&path, &track, request()), stopped(&stop)).await
    else {
        tracing::warn!(broadcast = %path, %track, "recording: cannot subscribe to the track");
        return;
    };
    let mut frame_us = DEFAULT_FRAME_US;
    loop {
        let mut group = match race(consumer.next_group(), stopped(&stop)).await {
            Ok(Ok(Some(g))) => g,
            Ok(Ok(None)) | Err(()) => return,
            Ok(Err(e)) => {
                tracing::debug!(broadcast = %path, %track, error = %e, "recording: track ended");
                return;
            }
        };
        let sequence = group.sequence();
        let mut samples: Vec<Sample> = Vec::new();
        let mut bytes = 0u64;
        let complete = loop {
            match race(group.read_frame(), stopped(&stop)).await {
                Ok(Ok(Some(frame))) => {
                    // A group the queue could never take is not collected:
                    // worker 0's memory stays bounded by the queue's size.
                    bytes += frame.payload.len() as u64;
                    if bytes > queue.limit() {
                        queue.dropped_group(&path, &track, sequence);
                        break false;
                    }
                    let mut data = frame.payload.to_vec();
                    let Ok((pts_us, au_len)) =
                        hang::frame::decode(&data).map(|(pts, au)| (pts, au.len()))
                    else {
                        break false;
                    };
                    data.drain(..data.len() - au_len);
                    samples.push(Sample { pts_us, data });
                }
                Ok(Ok(None)) => break true,
                // Aborted or evicted: the group is incomplete, not recorded.
                Ok(Err(_)) => break false,
                Err(()) => return,
            }
        };
        if !complete || samples.is_empty() {
            continue;
        }
        if let [.., a, b] = samples.as_slice()
            && let Some(d) = b
                .pts_us
                .checked_sub(a.pts_us)
                .and_then(|d| u32::try_from(d).ok())
            && d > 0
        {
            frame_us = d;
        }
        queue.offer(Job::Group {
            broadcast: path.clone(),
            track: track.clone(),
            group: sequence,
            samples,
            last_duration_us: frame_us,
        });
    }
}
