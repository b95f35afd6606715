//! Replay broadcasts (docs/protocol.md §10.9): for each stored recording of
//! broadcast `P`, the relay publishes broadcast `P/replay` holding
//!
//! * `catalog.json`: the recording's hang catalog (the live catalog's first
//!   version, stored beside the index as [`CATALOG_FILE`]) with a root
//!   `archive` entry naming the timeline track, in milliseconds, the
//!   longest segment so far (`durationMax`) and `"replay":"./replay"`: the
//!   broadcast itself, resolved against its own path's parent;
//! * `timeline.z`: hang's timeline, one record per complete video segment
//!   of the index (its number, content time in ms, and the groups of the
//!   video track and of every audio track whose groups start in its span),
//!   in a DEFLATE-compressed JSON window ([`skiff_archive::window`]): a
//!   record is pushed once its segment is complete and popped when
//!   retention deletes the segment.
//!
//! The publisher is an SDK client on worker 0 dialing the relay's own
//! port, as the recorder's are; its file reads (the directory, the indexes,
//! the stored catalogs) run on a thread of their own ([`Files`]), so a slow
//! disk never stalls the worker. It follows each index as it grows: every
//! [`TICK`] it reads what was appended since the last look (a torn last
//! line is read again on the next), and the whole file again when the
//! writer rewrote it (compaction). The newest `--record-replays` recordings
//! (by their index's modification time) get a replay; the others are
//! counted in `skiff_relay_record_replays_over_limit`. Memory stays bounded
//! by what is stored: a replay keeps its recording's replayed index and at
//! most [`CHECKPOINT_RECORDS`] serialized records (a reader joining late is
//! told older ones are skipped), and a recording whose segments are all
//! deleted has its replay unannounced.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use skiff_archive::window::{Encoder, EncoderConfig, Frame};
use skiff_archive::{Archive, Range, Record, TIMELINE_TRACK};
use skiff_core::hang;
use skiff_core::model::track;
use skiff_monoio::cancel::race;
use skiff_monoio::sdk::{BroadcastProducer, GroupProducer, TrackProducer};
use skiff_monoio::shutdown::Shutdown;
use skiff_monoio::{Client, Config};

use super::clients::Clients;
use super::index::{self, BroadcastIndex, Segment};
use super::{RecordStats, names};

/// The recording's hang catalog, stored beside its index.
pub const CATALOG_FILE: &str = "catalog.json";

/// The last path component of a replay broadcast (`P/replay`).
pub const REPLAY_NAME: &str = "replay";

/// How often the directory and the indexes are looked at.
pub const TICK: Duration = Duration::from_millis(500);

/// Records a timeline group's header restates at most: an hour of
/// one-second segments.
pub const CHECKPOINT_RECORDS: usize = 3600;

/// Replay broadcasts one SDK client publishes.
const REPLAYS_PER_CLIENT: usize = 8;

/// How long a timeline frame may wait for its readers before the group is
/// given up (the next frame restates the window in a new group).
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The thread the replays' file reads run on: jobs in, results handed
/// back through a slot worker 0 looks at until it is filled.
#[derive(Clone)]
pub struct Files {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl Files {
    /// Starts the thread; it ends once every handle is dropped.
    ///
    /// # Errors
    /// If the thread cannot start.
    pub fn start() -> io::Result<Files> {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("skiff-replay-io".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })?;
        Ok(Files { jobs })
    }

    /// Runs `read` on the thread and waits for its result; `None` if the
    /// thread is gone.
    pub async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let slot = Arc::new(Mutex::new(None));
        let filled = slot.clone();
        let job = Box::new(move || {
            let value = read();
            if let Ok(mut s) = filled.lock() {
                *s = Some(value);
            }
        });
        self.jobs.send(job).ok()?;
        loop {
            if let Some(value) = slot.lock().ok()?.take() {
                return Some(value);
            }
            // The job was dropped unrun: nothing will fill the slot.
            if Arc::strong_count(&slot) == 1 {
                return None;
            }
            monoio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// A flag one task sets and another reads.
type Flag = Rc<Cell<bool>>;

/// The replay broadcasts this relay publishes, by path: the recorder does
/// not record them.
pub type ReplayPaths = Rc<RefCell<BTreeSet<String>>>;

/// The path of the replay broadcast of recording `path`.
pub fn replay_path(path: &str) -> String {
    format!("{path}/{REPLAY_NAME}")
}

/// What becomes of one stored recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Among the newest `--record-replays`: replayed.
    Replayed,
    /// Past `--record-replays`: not replayed (counted in the metric).
    OverLimit,
}

/// The outcome of each of `candidates` (path, index modification time):
/// the `limit` newest are replayed, ties broken by path.
pub fn select(candidates: &[(String, SystemTime)], limit: usize) -> Vec<(String, ReplayOutcome)> {
    let mut order: Vec<&(String, SystemTime)> = candidates.iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    order
        .into_iter()
        .enumerate()
        .map(|(i, (path, _))| {
            let outcome = if i < limit {
                ReplayOutcome::Replayed
            } else {
                ReplayOutcome::OverLimit
            };
            (path.clone(), outcome)
        })
        .collect()
}

/// The recordings under `dir` that can be replayed: an index and a stored
/// catalog, with the index's modification time.
fn candidates(dir: &Path) -> Vec<(String, SystemTime)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let path = e.file_name().to_str().and_then(names::decode)?;
            let bdir = e.path();
            let modified = fs::metadata(bdir.join(index::INDEX_FILE))
                .and_then(|m| m.modified())
                .ok()?;
            bdir.join(CATALOG_FILE)
                .is_file()
                .then_some((path, modified))
        })
        .collect()
}

/// The SDK settings of a replay client: room for its replays' catalogs
/// and timeline groups.
pub fn client_config(mut config: Config) -> Config {
    config.pool_bytes = 8 << 20;
    config.limits.publications = REPLAYS_PER_CLIENT;
    config.limits.tracks = 4 * REPLAYS_PER_CLIENT;
    config
}

/// Publishes the replays of the recordings in `dir` until `shutdown`:
/// `url` is the relay's own listen address as the SDK dials it, `limit`
/// the most replays at once (`--record-replays`), `paths` the set of
/// replay paths shared with the recorder.
pub async fn run(
    dir: PathBuf,
    url: String,
    config: Config,
    limit: usize,
    stats: Arc<RecordStats>,
    paths: ReplayPaths,
    shutdown: Shutdown,
) {
    let files = match Files::start() {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %e, "replay: cannot start its reading thread; no replays");
            return;
        }
    };
    let mut clients = Clients::new("replay", url, client_config(config), REPLAYS_PER_CLIENT);
    // Recording path → its task's stop flag and whether it has ended. A
    // stopped task stays listed until it ended, so a path chosen again
    // meanwhile does not get a second task publishing the same broadcast.
    let mut active: BTreeMap<String, (Flag, Flag)> = BTreeMap::new();
    while !shutdown.is_draining() {
        let scan = dir.clone();
        let found = files
            .run(move || candidates(&scan))
            .await
            .unwrap_or_default();
        let outcomes = select(&found, limit);
        let over = outcomes
            .iter()
            .filter(|(_, o)| *o == ReplayOutcome::OverLimit)
            .count();
        stats
            .replays_over_limit
            .store(over as u64, Ordering::Relaxed);
        let wanted: BTreeSet<&str> = outcomes
            .iter()
            .filter(|(_, o)| *o == ReplayOutcome::Replayed)
            .map(|(p, _)| p.as_str())
            .collect();
        active.retain(|path, (stop, ended)| {
            if !wanted.contains(path.as_str()) {
                stop.set(true);
            }
            !ended.get()
        });
        for path in wanted {
            if active.contains_key(path) {
                continue;
            }
            let Some((client, lease)) = clients.lease() else {
                break;
            };
            let (stop, ended) = (Rc::new(Cell::new(false)), Rc::new(Cell::new(false)));
            active.insert(path.to_owned(), (stop.clone(), ended.clone()));
            let task = replay(
                client,
                files.clone(),
                path.to_owned(),
                dir.join(names::encode(path)),
                stats.clone(),
                paths.clone(),
                stop,
            );
            monoio::spawn(async move {
                task.await;
                drop(lease);
                ended.set(true);
            });
        }
        let _ = race(monoio::time::sleep(TICK), shutdown.wait()).await;
    }
    for (stop, _) in active.values() {
        stop.set(true);
    }
    monoio::time::sleep(TICK + Duration::from_millis(100)).await;
    clients.close().await;
}

/// Where a replay is in reading its recording's index.
#[derive(Debug, Default)]
struct Tail {
    /// The index file read (device, inode): a new one means a rewrite.
    file: Option<(u64, u64)>,
    /// Bytes of it read as good lines.
    read: u64,
    /// The index they replay to.
    index: BroadcastIndex,
}

impl Tail {
    /// Reads what was appended to `dir`'s index since the last call (all
    /// of it again if the file was replaced or cut); true if anything was.
    fn refresh(&mut self, dir: &Path) -> io::Result<bool> {
        let path = dir.join(index::INDEX_FILE);
        let meta = fs::metadata(&path)?;
        let file = Some((meta.dev(), meta.ino()));
        if file != self.file || meta.len() < self.read {
            let bytes = fs::read(&path)?;
            let parsed = index::parse(&bytes);
            self.index = BroadcastIndex::replay(&parsed.records);
            self.read = parsed.valid_len as u64;
            self.file = file;
            return Ok(true);
        }
        if meta.len() == self.read {
            return Ok(false);
        }
        let mut f = fs::File::open(&path)?;
        f.seek(SeekFrom::Start(self.read))?;
        let mut bytes = Vec::new();
        f.take(meta.len() - self.read).read_to_end(&mut bytes)?;
        let parsed = index::parse(&bytes);
        for r in &parsed.records {
            self.index.apply(r);
        }
        self.read += parsed.valid_len as u64;
        Ok(!parsed.records.is_empty())
    }
}

/// The groups of each audio track of an index by start time: (content
/// time µs, group), sorted.
pub type AudioGroups = BTreeMap<String, Vec<(u64, u64)>>;

/// The audio groups of `index` that start at `from_us` or later (and
/// those a little earlier: segments are numbered in the order their groups
/// completed, so the scan from the newest stops 10 s before `from_us`).
pub fn audio_groups(index: &BroadcastIndex, from_us: u64) -> AudioGroups {
    index
        .tracks
        .iter()
        .filter(|(_, t)| t.audio)
        .map(|(name, t)| {
            let mut groups: Vec<(u64, u64)> = t
                .segments
                .values()
                .rev()
                .take_while(|a| a.start_us.saturating_add(10_000_000) >= from_us)
                .map(|a| (a.start_us, a.group))
                .collect();
            groups.sort_unstable();
            (name.clone(), groups)
        })
        .collect()
}

/// The timeline record of video segment `s`: its video group and the
/// groups of every audio track in `audio` that start in its span.
pub fn timeline_record(s: &Segment, audio: &AudioGroups) -> Record {
    let pts = s.start_us / 1000;
    let end_us = s.start_us.saturating_add(s.duration_us);
    let mut r = Record::new(s.number, pts, (end_us / 1000).saturating_sub(pts));
    r.tracks
        .insert(s.track.clone(), vec![Range::new(s.group, s.group)]);
    for (name, groups) in audio {
        let first = groups.partition_point(|&(start, _)| start < s.start_us);
        let last = groups.partition_point(|&(start, _)| start < end_us);
        let mut in_span: Vec<u64> = groups[first..last.max(first)]
            .iter()
            .map(|&(_, g)| g)
            .collect();
        in_span.sort_unstable();
        let mut ranges: Vec<Range> = Vec::new();
        for g in in_span {
            match ranges.last_mut() {
                Some(last) if last.end + 1 == g => last.end = g,
                Some(last) if last.end == g => {}
                _ => ranges.push(Range::new(g, g)),
            }
        }
        if !ranges.is_empty() {
            r.tracks.insert(name.clone(), ranges);
        }
    }
    r
}

/// The video track a replay's timeline follows: the first with a stored segment.
fn video_track(index: &BroadcastIndex) -> Option<String> {
    index
        .default_track()
        .filter(|t| index.tracks.get(*t).is_some_and(|t| !t.audio))
        .map(str::to_owned)
}

/// Whether video segment `s` is complete for the timeline: the recording
/// ended, a later video segment exists, or every audio track got past its end.
fn complete(index: &BroadcastIndex, video: &str, s: &Segment) -> bool {
    let end = s.start_us.saturating_add(s.duration_us);
    index.ended
        || index.tracks[video]
            .segments
            .range(s.number + 1..)
            .next()
            .is_some()
        || index.tracks.values().filter(|t| t.audio).all(|t| {
            t.segments
                .values()
                .next_back()
                .is_some_and(|a| a.start_us.saturating_add(a.duration_us) >= end)
        })
}

/// The catalog a replay publishes: the recorded one with the `archive` entry.
fn replay_catalog(recorded: &[u8], duration_max: u64) -> Option<Vec<u8>> {
    let mut json: serde_json::Value = serde_json::from_slice(recorded).ok()?;
    let mut archive = Archive::new(TIMELINE_TRACK);
    archive.duration_max = Some(duration_max);
    archive.replay = Some(format!("./{REPLAY_NAME}"));
    json.as_object_mut()?
        .insert("archive".into(), serde_json::to_value(archive).ok()?);
    serde_json::to_vec(&json).ok()
}

/// One published replay.
struct Published {
    broadcast: BroadcastProducer,
    catalog: TrackProducer,
    /// The newest catalog group, left open while the replay lasts (hang's
    /// browser client forgets a closed group after 5 s, docs/protocol.md §10.2).
    catalog_group: Option<GroupProducer>,
    timeline: TrackProducer,
    /// The open timeline group.
    group: Option<GroupProducer>,
    encoder: Encoder<Record>,
    /// The video segments in the timeline's window, oldest first.
    pushed: VecDeque<u64>,
    /// The first video segment number not pushed yet.
    next: u64,
    /// The `durationMax` of the catalog published.
    duration_max: u64,
    started: Instant,
}

impl Published {
    fn new(client: &Client, path: &str) -> Result<Published, skiff_monoio::Error> {
        let broadcast = client.publish(path)?;
        let catalog = broadcast.create_track(hang::catalog_info())?;
        let info = track::Info::new(TIMELINE_TRACK)
            .map_err(|_| skiff_monoio::Error::InvalidName(TIMELINE_TRACK.into()))?;
        let timeline = broadcast.create_track(info)?;
        Ok(Published {
            broadcast,
            catalog,
            catalog_group: None,
            timeline,
            group: None,
            encoder: Encoder::new(EncoderConfig {
                compression: true,
                checkpoint_records: CHECKPOINT_RECORDS,
                ..EncoderConfig::default()
            }),
            pushed: VecDeque::new(),
            next: 0,
            duration_max: 0,
            started: Instant::now(),
        })
    }

    /// Writes `frame` to the timeline: in a new group for a header.
    async fn write(&mut self, frame: Frame) -> bool {
        if frame.new_group {
            if let Some(g) = self.group.take() {
                let _ = g.finish();
            }
            match self.timeline.append_group() {
                Ok(g) => self.group = Some(g),
                Err(_) => return false,
            }
        }
        let Some(g) = self.group.as_mut() else {
            return false;
        };
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let written = race(
            g.write_frame(ms, &frame.payload),
            monoio::time::sleep(WRITE_TIMEOUT),
        )
        .await;
        if !matches!(written, Ok(Ok(()))) {
            // The group is given up; the next frame restates the window.
            self.group = None;
            self.encoder.resync();
            return false;
        }
        true
    }

    /// Publishes the catalog (again) with `duration_max`.
    async fn publish_catalog(&mut self, recorded: &[u8], duration_max: u64) {
        let Some(json) = replay_catalog(recorded, duration_max) else {
            return;
        };
        let Ok(mut g) = self.catalog.append_group() else {
            return;
        };
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if matches!(
            race(g.write_frame(ms, &json), monoio::time::sleep(WRITE_TIMEOUT)).await,
            Ok(Ok(()))
        ) {
            if let Some(old) = self.catalog_group.replace(g) {
                let _ = old.finish();
            }
            self.duration_max = duration_max;
        }
    }

    /// Ends the replay: pops every record left, finishes the tracks and,
    /// after a moment for the readers to get that, unannounces it.
    async fn end(mut self) {
        let left = self.pushed.len() as u64;
        self.pushed.clear();
        if let Ok(Some(frame)) = self.encoder.pop(left) {
            self.write(frame).await;
        }
        let Published {
            broadcast,
            catalog,
            catalog_group,
            timeline,
            group,
            ..
        } = self;
        for g in [group, catalog_group].into_iter().flatten() {
            let _ = g.finish();
        }
        timeline.finish();
        catalog.finish();
        monoio::time::sleep(Duration::from_secs(1)).await;
        broadcast.finish();
    }

    /// Brings the timeline to `index`: pops the records whose segment is
    /// gone, pushes the complete segments not yet pushed.
    async fn follow(&mut self, index: &BroadcastIndex, video: &str, recorded: &[u8]) {
        let Some(t) = index.tracks.get(video) else {
            return;
        };
        let gone = self
            .pushed
            .iter()
            .take_while(|n| !t.segments.contains_key(n))
            .count();
        if gone > 0 {
            self.pushed.drain(..gone);
            if let Ok(Some(frame)) = self.encoder.pop(gone as u64) {
                self.write(frame).await;
            }
        }
        let fresh: Vec<&Segment> = t
            .segments
            .range(self.next..)
            .map(|(_, s)| s)
            .take_while(|s| complete(index, video, s))
            .collect();
        let audio = fresh
            .first()
            .map(|s| audio_groups(index, s.start_us))
            .unwrap_or_default();
        // The window's indices are the segment numbers: a replay started
        // again (a restart) numbers its records as before.
        if let Some(first) = fresh.first()
            && self.pushed.is_empty()
        {
            self.encoder.skip_to(first.number);
        }
        for s in fresh {
            let record = timeline_record(s, &audio);
            if record.duration > self.duration_max || self.duration_max == 0 {
                self.publish_catalog(recorded, record.duration.max(1)).await;
            }
            match self.encoder.push(&record) {
                Ok(frame) => {
                    self.pushed.push_back(s.number);
                    self.next = s.number + 1;
                    self.write(frame).await;
                }
                Err(e) => {
                    self.next = s.number + 1;
                    tracing::warn!(broadcast = %self.broadcast.path(), error = %e, "replay: timeline record not encoded");
                }
            }
        }
    }
}

/// Publishes the replay of recording `path` (stored in `dir`) until `stop`.
async fn replay(
    client: Client,
    files: Files,
    path: String,
    dir: PathBuf,
    stats: Arc<RecordStats>,
    paths: ReplayPaths,
    stop: Rc<Cell<bool>>,
) {
    let replay = replay_path(&path);
    let mut tail = Some(Tail::default());
    let mut published: Option<Published> = None;
    let mut recorded: Option<Vec<u8>> = None;
    let mut refused = false;
    while !stop.get() {
        // The tail goes to the reading thread and comes back refreshed.
        let mut t = tail.take().unwrap_or_default();
        let d = dir.clone();
        let Some((mut t, read)) = files
            .run(move || {
                let read = t.refresh(&d);
                (t, read)
            })
            .await
        else {
            break;
        };
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => t = Tail::default(),
            Err(e) => {
                tracing::debug!(broadcast = %path, error = %e, "replay: index not read");
            }
        }
        let tail = tail.insert(t);
        match video_track(&tail.index) {
            // Nothing left to replay: the broadcast goes away.
            None => {
                if let Some(p) = published.take() {
                    p.end().await;
                    paths.borrow_mut().remove(&replay);
                    stats.replays.fetch_sub(1, Ordering::Relaxed);
                    tracing::info!(broadcast = %replay, "replay: ended (nothing stored)");
                }
            }
            Some(video) => {
                if recorded.is_none() {
                    let file = dir.join(CATALOG_FILE);
                    recorded = files.run(move || fs::read(file).ok()).await.flatten();
                }
                if published.is_none()
                    && let Some(json) = &recorded
                    && serde_json::from_slice::<serde_json::Value>(json)
                        .is_ok_and(|v| v.is_object())
                {
                    paths.borrow_mut().insert(replay.clone());
                    match Published::new(&client, &replay) {
                        Ok(p) => {
                            tracing::info!(broadcast = %replay, "replay: published");
                            stats.replays.fetch_add(1, Ordering::Relaxed);
                            published = Some(p);
                        }
                        Err(e) => {
                            paths.borrow_mut().remove(&replay);
                            // Tried again every tick; logged once.
                            if !refused {
                                tracing::warn!(broadcast = %replay, error = %e, "replay: not published");
                            }
                            refused = true;
                        }
                    }
                }
                if let (Some(p), Some(json)) = (published.as_mut(), recorded.as_deref()) {
                    p.follow(&tail.index, &video, json).await;
                }
            }
        }
        monoio::time::sleep(TICK).await;
    }
    if published.take().is_some() {
        stats.replays.fetch_sub(1, Ordering::Relaxed);
    }
    paths.borrow_mut().remove(&replay);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::index::Record as Line;

    fn seg(track: &str, number: u64, group: u64, start_ms: u64, dur_ms: u64) -> Line {
        Line::Segment(Segment {
            track: track.into(),
            number,
            init: 0,
            group,
            start_us: start_ms * 1000,
            duration_us: dur_ms * 1000,
            frames: 1,
            bytes: 1,
            written_ms: 0,
        })
    }

    fn init(track: &str, audio: bool) -> Line {
        Line::Init {
            track: track.into(),
            init: 0,
            track_id: 1,
            audio,
        }
    }

    #[test]
    fn a_record_names_the_video_group_and_the_audio_groups_in_its_span() {
        let mut lines = vec![init("video", false), init("audio", true)];
        lines.push(seg("video", 0, 7, 0, 1000));
        lines.push(seg("video", 1, 8, 1000, 1000));
        // Audio groups 20..=28 every 200 ms from 0, then 31 (29 and 30 were lost).
        for (n, g) in (20..29).chain([31]).enumerate() {
            lines.push(seg("audio", n as u64, g, n as u64 * 200, 200));
        }
        let index = BroadcastIndex::replay(&lines);
        let s0 = &index.tracks["video"].segments[&0];
        let audio = audio_groups(&index, 0);
        let r = timeline_record(s0, &audio);
        assert_eq!((r.segment, r.pts, r.duration), (0, 0, 1000));
        assert_eq!(r.tracks["video"], [Range::new(7, 7)]);
        assert_eq!(r.tracks["audio"], [Range::new(20, 24)]);
        let r = timeline_record(&index.tracks["video"].segments[&1], &audio);
        assert_eq!(r.tracks["audio"], [Range::new(25, 28), Range::new(31, 31)]);
        assert!(complete(&index, "video", s0));
        // Segment 1 is the last; audio reached its end (2000 ms).
        assert!(complete(
            &index,
            "video",
            &index.tracks["video"].segments[&1]
        ));
        let mut short = lines[..4].to_vec();
        short.push(seg("audio", 0, 20, 0, 200));
        let index = BroadcastIndex::replay(&short);
        assert!(!complete(
            &index,
            "video",
            &index.tracks["video"].segments[&1]
        ));
    }

    #[test]
    fn the_newest_are_replayed_and_the_rest_are_over_the_limit() {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let c = vec![
            ("a".to_string(), at(3)),
            ("b".to_string(), at(9)),
            ("c".to_string(), at(5)),
        ];
        assert_eq!(
            select(&c, 2),
            vec![
                ("b".to_string(), ReplayOutcome::Replayed),
                ("c".to_string(), ReplayOutcome::Replayed),
                ("a".to_string(), ReplayOutcome::OverLimit),
            ]
        );
        assert!(
            select(&c, 0)
                .iter()
                .all(|(_, o)| *o == ReplayOutcome::OverLimit)
        );
    }

    #[test]
    fn the_catalog_gets_an_archive_entry_naming_itself() {
        let json = replay_catalog(br#"{"video":{"renditions":{}}}"#, 2000).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            v["archive"],
            serde_json::json!({"track":"timeline.z","timescale":1000,"durationMax":2000,"replay":"./replay"})
        );
        assert!(replay_catalog(b"[1]", 1).is_none());
        assert!(replay_catalog(b"not json", 1).is_none());
    }

    #[test]
    fn file_reads_run_on_their_thread_and_a_lost_job_is_none() {
        use skiff_monoio::driver::{self, DriverKind};
        let worker = std::thread::current().id();
        let (elsewhere, lost) = driver::block_on(DriverKind::Legacy, move |_| async move {
            let files = Files::start().unwrap();
            let elsewhere = files
                .run(move || std::thread::current().id() != worker)
                .await;
            // A read that fails its thread: its result never comes.
            let lost = files
                .run(|| -> u8 { std::panic::resume_unwind(Box::new("read failed")) })
                .await;
            (elsewhere, lost)
        })
        .unwrap();
        assert_eq!(elsewhere, Some(true));
        assert_eq!(lost, None);
    }

    #[test]
    fn the_tail_reads_appends_torn_lines_and_rewrites() {
        let dir = std::env::temp_dir().join(format!("skiff-replay-tail-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join(index::INDEX_FILE);
        let text = |lines: &[Line]| lines.iter().map(Line::line).collect::<String>();
        let mut lines = vec![init("video", false), seg("video", 0, 1, 0, 1000)];
        fs::write(&file, text(&lines)).unwrap();
        let mut tail = Tail::default();
        assert!(tail.refresh(&dir).unwrap());
        assert!(!tail.refresh(&dir).unwrap());
        // A torn line is not read until it is whole.
        let next = seg("video", 1, 2, 1000, 1000).line();
        let mut all = text(&lines);
        all.push_str(&next[..10]);
        fs::write(&file, &all).unwrap();
        assert!(!tail.refresh(&dir).unwrap());
        all.push_str(&next[10..]);
        fs::write(&file, &all).unwrap();
        assert!(tail.refresh(&dir).unwrap());
        assert_eq!(tail.index.tracks["video"].segments.len(), 2);
        // A rewrite (a new file renamed over it) is read whole.
        lines.push(Line::Delete {
            track: "video".into(),
            number: 0,
        });
        let tmp = dir.join(".index.tmp");
        fs::write(&tmp, text(&lines)).unwrap();
        fs::rename(&tmp, &file).unwrap();
        assert!(tail.refresh(&dir).unwrap());
        assert_eq!(tail.index.tracks["video"].segments.len(), 0);
        let _ = fs::remove_dir_all(&dir);
    }
}
