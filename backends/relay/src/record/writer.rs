//! The recording writer: one dedicated thread per relay process that owns
//! every file of `--record-dir`, fed through a bounded queue ([`Queue`]).
//!
//! Why a thread and not monoio's io_uring file I/O on a worker: the writes
//! are few and large (one segment per group, about one a second per track),
//! but each also needs `rename`, `unlink` and directory scans (recovery,
//! retention). monoio 0.2.4 submits reads, writes and `fsync` to the ring,
//! but `rename` and `unlink` only with features this crate does not build,
//! has no directory listing, and on the epoll driver (`--driver legacy`,
//! the fallback where io_uring is missing) its file operations block the
//! thread that runs them, and with it every connection of that worker. On
//! its own thread a slow or full disk stalls only this thread, whatever the
//! driver: the queue in front of it fills and further groups are dropped
//! from the recording (counted in [`RecordStats::groups_dropped`] and
//! logged), never from live delivery. One thread for the process also keeps
//! each broadcast's index appended in order by one writer.
//!
//! Crash safety: a segment is written to `.NAME.tmp`, synced, and renamed to
//! NAME; only then is its record appended to the broadcast's index
//! ([`super::index`]) and the index synced. At start the writer cuts each
//! index back to its last good line, deletes temporary files and segment
//! files the index does not name (a crash between rename and append), and
//! marks every recording that was open as ended: a relay killed with SIGKILL
//! serves after its restart every segment completed before the kill and
//! none that was torn.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::fmp4::{self, Rendition, Sample};
use super::index::{self, BroadcastIndex, Record, Segment};
use super::{RecordConfig, RecordStats, names};

/// Jobs the queue holds at most, whatever their size.
const QUEUE_JOBS: usize = 4096;

/// What the recorder asks the writer to do.
#[derive(Debug)]
pub enum Job {
    /// A track of a broadcast starts (again): write its init segment.
    Init {
        /// The broadcast's full path.
        broadcast: String,
        /// The rendition to record.
        rendition: Rendition,
    },
    /// One complete group of a track: write it as a media segment.
    Group {
        /// The broadcast's full path.
        broadcast: String,
        /// The track.
        track: String,
        /// The group's sequence number.
        group: u64,
        /// Its frames.
        samples: Vec<Sample>,
        /// How long its last frame lasts, µs.
        last_duration_us: u32,
    },
    /// The broadcast's hang catalog: stored beside its index
    /// ([`super::replay::CATALOG_FILE`]) for its replay broadcast.
    Catalog {
        /// The broadcast's full path.
        broadcast: String,
        /// The catalog's JSON.
        json: Vec<u8>,
    },
    /// The broadcast ended (its publisher left or the relay stops).
    End {
        /// The broadcast's full path.
        broadcast: String,
    },
}

impl Job {
    /// Bytes of media the job holds (what the queue's byte bound counts).
    fn bytes(&self) -> u64 {
        match self {
            Job::Group { samples, .. } => samples.iter().map(|s| s.data.len() as u64).sum(),
            Job::Init { .. } | Job::Catalog { .. } | Job::End { .. } => 0,
        }
    }
}

/// The sending side of the writer's queue, bounded in bytes
/// (`--record-queue-bytes`) and in jobs.
#[derive(Debug, Clone)]
pub struct Queue {
    tx: SyncSender<Job>,
    stats: Arc<RecordStats>,
    limit: u64,
}

impl Queue {
    /// Hands `job` to the writer without waiting: false if the queue is
    /// full (the job is dropped and counted) or the writer is gone.
    pub fn offer(&self, job: Job) -> bool {
        let bytes = job.bytes();
        let queued = self.stats.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if queued + bytes > self.limit {
            self.stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.dropped(&job);
            return false;
        }
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                self.stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                self.dropped(&job);
                false
            }
        }
    }

    /// The queue's bound in bytes: a group larger than this is never recorded.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Counts (and logs, as [`Queue::offer`] does) a group the recorder
    /// gave up before offering it: `group` of `track` of `broadcast`.
    pub fn dropped_group(&self, broadcast: &str, track: &str, group: u64) {
        self.dropped(&Job::Group {
            broadcast: broadcast.to_owned(),
            track: track.to_owned(),
            group,
            samples: Vec::new(),
            last_duration_us: 0,
        });
    }

    fn dropped(&self, job: &Job) {
        let n = self.stats.groups_dropped.fetch_add(1, Ordering::Relaxed);
        // The first drop and then one in a hundred: a full disk logs
        // without flooding.
        if n.is_multiple_of(100)
            && let Job::Group {
                broadcast,
                track,
                group,
                ..
            } = job
        {
            tracing::warn!(
                %broadcast, %track, group, dropped = n + 1,
                "recording: group not recorded: the write queue (--record-queue-bytes) is full or smaller than the group"
            );
        }
    }
}

/// Whether a writer runs in this process: without one no recording can
/// still be growing, whatever its index says (a relay killed mid-recording
/// and restarted with `--record-dir` alone never runs the recovery that
/// marks its recordings ended).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Whether this process runs a writer (see [`start`]).
pub fn running() -> bool {
    RUNNING.load(Ordering::Acquire)
}

/// Starts the writer thread on `config`'s directory (recovering what a
/// previous run left, see the module's text) and returns its queue.
///
/// # Errors
/// If the directory cannot be made or the thread cannot start.
pub fn start(config: &RecordConfig, stats: Arc<RecordStats>) -> io::Result<Queue> {
    fs::create_dir_all(&config.dir)?;
    let (tx, rx) = sync_channel(QUEUE_JOBS);
    let mut writer = Writer::recover(config.clone(), stats.clone())?;
    std::thread::Builder::new()
        .name("skiff-record".into())
        .spawn(move || writer.run(rx))?;
    RUNNING.store(true, Ordering::Release);
    Ok(Queue {
        tx,
        stats,
        limit: config.queue_bytes,
    })
}

/// One stored segment in the retention order.
#[derive(Debug, Clone)]
struct Stored {
    written_ms: u64,
    broadcast: String,
    track: String,
    number: u64,
    bytes: u64,
}

/// A broadcast's directory and index as the writer keeps them.
#[derive(Debug)]
struct Open {
    dir: PathBuf,
    index: BroadcastIndex,
    /// The init each track's groups are written with in this run, its MP4
    /// track ID, and whether the track is audio.
    current_init: BTreeMap<String, (u32, u32, bool)>,
    /// The renditions whose init segment could not be written yet (a full
    /// disk): written before their next group.
    pending_init: BTreeMap<String, Rendition>,
}

struct Writer {
    config: RecordConfig,
    stats: Arc<RecordStats>,
    broadcasts: BTreeMap<String, Open>,
    /// Every stored segment, oldest written first.
    retention: VecDeque<Stored>,
    stored_bytes: u64,
    errors: u64,
    /// Per broadcast: deletions appended to its index since it was
    /// compacted, and how many compact it again (see [`COMPACT_AFTER`]).
    dead: BTreeMap<String, (u64, u64)>,
    /// [`COMPACT_AFTER`], smaller in tests.
    compact_after: u64,
}

/// Deletions an index collects before it is compacted, at the least (else
/// as many as it had live segments when last compacted): about 40 KB of
/// dead lines.
const COMPACT_AFTER: u64 = 1024;

/// Rewrites the index in `dir` with [`index::compact`]'s records, through a
/// temporary file renamed over it; returns the live segments it holds.
fn compact_index(dir: &Path) -> io::Result<usize> {
    let path = dir.join(index::INDEX_FILE);
    let parsed = index::parse(&fs::read(&path)?);
    let kept = index::compact(&parsed.records);
    let text: String = kept.iter().map(Record::line).collect();
    write_atomic(dir, index::INDEX_FILE, text.as_bytes())?;
    Ok(kept
        .iter()
        .filter(|r| matches!(r, Record::Segment(_)))
        .count())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads `dir/index.log`, cutting a torn tail off the file.
fn load_index(dir: &Path) -> io::Result<BroadcastIndex> {
    let path = dir.join(index::INDEX_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let parsed = index::parse(&bytes);
    if parsed.valid_len < bytes.len() {
        tracing::warn!(
            index = %path.display(),
            dropped = bytes.len() - parsed.valid_len,
            "recording: cut the index's torn tail"
        );
        let f = OpenOptions::new().write(true).open(&path)?;
        f.set_len(parsed.valid_len as u64)?;
        f.sync_all()?;
    }
    Ok(BroadcastIndex::replay(&parsed.records))
}

/// Recovers the recording in `dir` after a stop or a crash: cuts its
/// index's torn tail, removes temporary files and segments the index does
/// not name, and ends the recording if it was open. Returns its index.
fn recover_broadcast(dir: &Path, now: u64) -> io::Result<BroadcastIndex> {
    let mut index = load_index(dir)?;
    let named: std::collections::HashSet<String> = index
        .segments()
        .map(|s| index::segment_file(&s.track, s.number))
        .collect();
    for file in fs::read_dir(dir)? {
        let file = file?;
        let name = file.file_name();
        let Some(name) = name.to_str() else { continue };
        let stray = name.ends_with(".tmp") || (name.ends_with(".m4s") && !named.contains(name));
        if stray {
            tracing::info!(file = %file.path().display(), "recording: removed an incomplete file");
            fs::remove_file(file.path())?;
        }
    }
    if !index.ended && index.recorded() {
        let end = Record::End { written_ms: now };
        append(dir, &end)?;
        index.apply(&end);
    }
    Ok(index)
}

/// Appends `record` to the index in `dir` and syncs it. If that fails (a
/// full disk), the file is cut back to its length before, so a partial
/// line never sits in front of later records.
fn append(dir: &Path, record: &Record) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(index::INDEX_FILE))?;
    let before = f.metadata()?.len();
    let result = f
        .write_all(record.line().as_bytes())
        .and_then(|()| f.sync_data());
    if result.is_err() {
        let _ = f.set_len(before);
    }
    result
}

/// Writes `bytes` to `dir/name` through a temporary file, synced before the rename.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()?;
        fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

impl Open {
    /// Writes the init segments still pending (see [`Open::pending_init`]).
    fn write_pending_init(&mut self) -> io::Result<()> {
        while let Some((name, rendition)) = self.pending_init.pop_first() {
            // A track keeps its MP4 track ID across inits; a new one takes the next.
            let track_id = match self.index.tracks.get(&name) {
                Some(t) => t.inits.values().next().copied().unwrap_or(1),
                None => u32::try_from(self.index.tracks.len()).unwrap_or(u32::MAX - 1) + 1,
            };
            let bytes = fmp4::init_segment(track_id, &rendition).map_err(io::Error::other)?;
            let audio = rendition.is_audio();
            let init = self.index.last_init.map_or(0, |i| i + 1);
            let record = Record::Init {
                track: name.clone(),
                init,
                track_id,
                audio,
            };
            let written = write_atomic(&self.dir, &index::init_file(&name, init), &bytes)
                .and_then(|()| append(&self.dir, &record));
            if let Err(e) = written {
                self.pending_init.insert(name, rendition);
                return Err(e);
            }
            self.index.apply(&record);
            self.current_init.insert(name, (init, track_id, audio));
        }
        Ok(())
    }
}

impl Writer {
    /// The writer of `config.dir` after recovery (see the module's text).
    fn recover(config: RecordConfig, stats: Arc<RecordStats>) -> io::Result<Writer> {
        let mut stored = Vec::new();
        let now = now_ms();
        for entry in fs::read_dir(&config.dir)? {
            let entry = entry?;
            let Some(broadcast) = entry.file_name().to_str().and_then(names::decode) else {
                continue;
            };
            if !entry.file_type()?.is_dir() {
                continue;
            }
            // One broadcast's directory that cannot be read is logged and
            // left as it is; the others are recovered and recording goes on.
            match recover_broadcast(&entry.path(), now) {
                Ok(index) => stored.extend(index.segments().map(|s| Stored {
                    written_ms: s.written_ms,
                    broadcast: broadcast.clone(),
                    track: s.track.clone(),
                    number: s.number,
                    bytes: s.bytes,
                })),
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), error = %e, "recording: cannot recover a recording; left as it is");
                }
            }
        }
        stored.sort_by_key(|s| (s.written_ms, s.number));
        let stored_bytes = stored.iter().map(|s| s.bytes).sum();
        stats.stored_bytes.store(stored_bytes, Ordering::Relaxed);
        let mut w = Writer {
            config,
            stats,
            broadcasts: BTreeMap::new(),
            retention: stored.into(),
            stored_bytes,
            errors: 0,
            dead: BTreeMap::new(),
            compact_after: COMPACT_AFTER,
        };
        w.retain();
        Ok(w)
    }

    fn run(&mut self, rx: Receiver<Job>) {
        loop {
            let job = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(job) => job,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // Age-based retention runs even while nothing is recorded.
                    self.retain();
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let bytes = job.bytes();
            let result = self.handle(job);
            self.stats.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if let Err(e) = result {
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                if self.errors.is_multiple_of(100) {
                    tracing::warn!(error = %e, errors = self.errors + 1, "recording: write failed; group not recorded");
                }
                self.errors += 1;
            }
        }
    }

    /// The open broadcast `path`, its directory made and index loaded.
    fn open(&mut self, path: &str) -> io::Result<&mut Open> {
        if !self.broadcasts.contains_key(path) {
            let dir = self.config.dir.join(names::encode(path));
            fs::create_dir_all(&dir)?;
            let index = load_index(&dir)?;
            self.broadcasts.insert(
                path.to_owned(),
                Open {
                    dir,
                    index,
                    current_init: BTreeMap::new(),
                    pending_init: BTreeMap::new(),
                },
            );
        }
        self.broadcasts
            .get_mut(path)
            .ok_or_else(|| io::Error::other("broadcast not open"))
    }

    fn handle(&mut self, job: Job) -> io::Result<()> {
        match job {
            Job::Init {
                broadcast,
                rendition,
            } => {
                let open = self.open(&broadcast)?;
                open.current_init.remove(rendition.name());
                open.pending_init
                    .insert(rendition.name().to_owned(), rendition);
                open.write_pending_init()
            }
            Job::Group {
                broadcast,
                track,
                group,
                samples,
                last_duration_us,
            } => {
                let open = self.open(&broadcast)?;
                if open.pending_init.contains_key(&track) {
                    open.write_pending_init()?;
                }
                let Some(&(init, track_id, audio)) = open.current_init.get(&track) else {
                    return Err(io::Error::other(format!(
                        "{broadcast} {track}: a group before its init segment"
                    )));
                };
                let number = open
                    .index
                    .tracks
                    .get(&track)
                    .and_then(|t| t.last_number)
                    .map_or(0, |n| n + 1);
                let sequence = u32::try_from(number % (1 << 31)).unwrap_or(0) + 1;
                let (bytes, duration_us) =
                    fmp4::media_segment(sequence, track_id, &samples, last_duration_us, audio)
                        .map_err(io::Error::other)?;
                write_atomic(&open.dir, &index::segment_file(&track, number), &bytes)?;
                let segment = Segment {
                    track: track.clone(),
                    number,
                    init,
                    group,
                    start_us: samples.first().map_or(0, |s| s.pts_us),
                    duration_us,
                    frames: u32::try_from(samples.len()).unwrap_or(u32::MAX),
                    bytes: bytes.len() as u64,
                    written_ms: now_ms(),
                };
                let record = Record::Segment(segment.clone());
                if let Err(e) = append(&open.dir, &record) {
                    // Not indexed, so not kept: the file goes too.
                    let _ = fs::remove_file(open.dir.join(index::segment_file(&track, number)));
                    return Err(e);
                }
                open.index.apply(&record);
                self.retention.push_back(Stored {
                    written_ms: segment.written_ms,
                    broadcast,
                    track,
                    number,
                    bytes: segment.bytes,
                });
                self.stored_bytes += segment.bytes;
                self.stats.groups_recorded.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes_written
                    .fetch_add(segment.bytes, Ordering::Relaxed);
                self.retain();
                Ok(())
            }
            Job::Catalog { broadcast, json } => {
                let open = self.open(&broadcast)?;
                write_atomic(&open.dir, super::replay::CATALOG_FILE, &json)
            }
            Job::End { broadcast } => {
                let open = self.open(&broadcast)?;
                let record = Record::End {
                    written_ms: now_ms(),
                };
                append(&open.dir, &record)?;
                open.index.apply(&record);
                open.current_init.clear();
                self.broadcasts.remove(&broadcast);
                Ok(())
            }
        }
    }

    /// Deletes the oldest segments while the recordings are over
    /// `--record-max-bytes` or a segment is older than `--record-retain`.
    fn retain(&mut self) {
        self.retain_at(now_ms());
    }

    /// [`Writer::retain`] at `now` (Unix ms).
    fn retain_at(&mut self, now: u64) {
        let max_age_ms = self
            .config
            .retain
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        while let Some(front) = self.retention.front() {
            let over_size = self.config.max_bytes.is_some_and(|m| self.stored_bytes > m);
            let too_old = max_age_ms.is_some_and(|age| now.saturating_sub(front.written_ms) > age);
            if !over_size && !too_old {
                break;
            }
            let Some(s) = self.retention.pop_front() else {
                break;
            };
            self.stored_bytes = self.stored_bytes.saturating_sub(s.bytes);
            if let Err(e) = self.delete(&s) {
                tracing::warn!(broadcast = %s.broadcast, track = %s.track, number = s.number, error = %e, "recording: cannot delete a segment");
            }
            self.stats.segments_deleted.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .stored_bytes
            .store(self.stored_bytes, Ordering::Relaxed);
    }

    /// Records the deletion of `s` in its index, then removes its file: a
    /// crash in between leaves a file the index does not name, which the
    /// next start removes.
    fn delete(&mut self, s: &Stored) -> io::Result<()> {
        let record = Record::Delete {
            track: s.track.clone(),
            number: s.number,
        };
        let dir = match self.broadcasts.get_mut(&s.broadcast) {
            Some(open) => {
                open.index.apply(&record);
                open.dir.clone()
            }
            None => self.config.dir.join(names::encode(&s.broadcast)),
        };
        append(&dir, &record)?;
        match fs::remove_file(dir.join(index::segment_file(&s.track, s.number))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        // A long recording under retention appends a deletion per segment:
        // the index is rewritten once the dead lines outnumber the live ones.
        let (dead, threshold) = self
            .dead
            .entry(s.broadcast.clone())
            .or_insert((0, self.compact_after));
        *dead += 1;
        if *dead >= *threshold {
            let live = compact_index(&dir)? as u64;
            *dead = 0;
            *threshold = live.max(self.compact_after);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("skiff-writer-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn video() -> Rendition {
        let card = skiff_core::hang::testcard::TestCard::new(160, 96, 30).unwrap();
        let mut buf = [0u8; skiff_core::hang::testcard::CATALOG_MAX_LEN];
        let n = card.catalog("video", &mut buf).unwrap();
        let (mut tracks, _) = fmp4::catalog(&buf[..n]).unwrap();
        tracks.remove(0)
    }

    fn group(n: u64) -> Job {
        Job::Group {
            broadcast: "anon/cam.hang".into(),
            track: "video".into(),
            group: n,
            samples: vec![Sample {
                pts_us: n * 1_000_000,
                data: vec![0, 0, 0, 1, 0x65],
            }],
            last_duration_us: 1_000_000,
        }
    }

    fn writer(dir: &Path, retain: Option<Duration>, max_bytes: Option<u64>) -> Writer {
        fs::create_dir_all(dir).unwrap();
        let config = RecordConfig {
            patterns: moq_pattern::Patterns::new(),
            dir: dir.to_owned(),
            retain,
            max_bytes,
            queue_bytes: 1 << 20,
            replays: 0,
        };
        Writer::recover(config, Arc::default()).unwrap()
    }

    #[test]
    fn age_retention_deletes_the_oldest_first_and_a_restart_keeps_the_rest() {
        let dir = scratch("age");
        let mut w = writer(&dir, Some(Duration::from_secs(10)), None);
        w.handle(Job::Init {
            broadcast: "anon/cam.hang".into(),
            rendition: video(),
        })
        .unwrap();
        for n in 0..3 {
            w.handle(group(n)).unwrap();
        }
        // Simulated write times: 1 s, 2 s and 3 s after the epoch.
        for (i, s) in w.retention.iter_mut().enumerate() {
            s.written_ms = 1_000 * (i as u64 + 1);
        }
        // At 12.5 s the first two are older than 10 s.
        w.retain_at(12_500);
        assert_eq!(w.retention.len(), 1);
        assert_eq!(w.stats.segments_deleted.load(Ordering::Relaxed), 2);
        let stored = super::super::store::open(&dir, "anon/cam.hang")
            .unwrap()
            .unwrap();
        let kept: Vec<u64> = stored.segments("video").map(|s| s.number).collect();
        assert_eq!(kept, [2]);
        drop(w);
        // A restart reads the same: one segment, and the recording ended.
        let w = writer(&dir, None, None);
        assert_eq!(w.retention.len(), 1);
        let stored = super::super::store::open(&dir, "anon/cam.hang")
            .unwrap()
            .unwrap();
        assert!(stored.index.ended);
        assert_eq!(stored.segments("video").count(), 1);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn size_retention_compacts_the_index_and_keeps_its_numbers() {
        let dir = scratch("compact");
        // Each one-frame segment is about 120 bytes: the bound keeps two.
        let mut w = writer(&dir, None, Some(250));
        w.compact_after = 4;
        w.handle(Job::Init {
            broadcast: "anon/cam.hang".into(),
            rendition: video(),
        })
        .unwrap();
        for n in 0..12 {
            w.handle(group(n)).unwrap();
        }
        let stored = super::super::store::open(&dir, "anon/cam.hang")
            .unwrap()
            .unwrap();
        let kept: Vec<u64> = stored.segments("video").map(|s| s.number).collect();
        assert_eq!(kept, [10, 11]);
        // Ten deletions, compacted at the fourth and the eighth: the two
        // after it are still there, with the lines of the segments they
        // delete (8 and 9); the lines of the other eight are gone.
        let text = fs::read_to_string(dir.join("anon%2Fcam.hang").join(index::INDEX_FILE)).unwrap();
        let count = |kind: &str| text.lines().filter(|l| l.contains(kind)).count();
        assert_eq!((count(" D "), count(" S ")), (2, 4), "{text}");
        drop(w);
        // A restart goes on with the next number.
        let mut w = writer(&dir, None, Some(250));
        w.handle(Job::Init {
            broadcast: "anon/cam.hang".into(),
            rendition: video(),
        })
        .unwrap();
        w.handle(group(12)).unwrap();
        let stored = super::super::store::open(&dir, "anon/cam.hang")
            .unwrap()
            .unwrap();
        let kept: Vec<u64> = stored.segments("video").map(|s| s.number).collect();
        assert_eq!(kept, [11, 12]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_group_before_its_init_is_refused_and_an_init_waits_for_the_disk() {
        let dir = scratch("order");
        let mut w = writer(&dir, None, None);
        assert!(w.handle(group(0)).is_err());
        // An init whose write failed is written before the next group.
        let open = w.open("anon/cam.hang").unwrap();
        open.pending_init.insert("video".into(), video());
        w.handle(group(1)).unwrap();
        let stored = super::super::store::open(&dir, "anon/cam.hang")
            .unwrap()
            .unwrap();
        let kept: Vec<u64> = stored.segments("video").map(|s| s.group).collect();
        assert_eq!(kept, [1]);
        let _ = fs::remove_dir_all(&dir);
    }
}
