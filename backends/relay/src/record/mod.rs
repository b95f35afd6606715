//! Recording while relaying (`--record PATTERN --record-dir DIR`): matching
//! broadcasts are stored as they pass through, as fragmented MP4 (CMAF),
//! served back as a listing (`GET /recordings`), as HLS
//! (`GET /hls/PATH/index.m3u8`) and as MP4 files (`skiff-relay export`).
//!
//! * [`recorder`]: the internal subscriber on worker 0 (the hang catalog,
//!   then every H.264 video and Opus audio track, group by group);
//! * [`writer`]: the thread that owns the directory, behind a bounded queue
//!   (`--record-queue-bytes`), with retention (`--record-retain`,
//!   `--record-max-bytes`, oldest first) and crash recovery;
//! * [`fmp4`]: init and media segments, made with the `mp4-atom` crate;
//! * [`index`]: the per-broadcast index (content time → segment), an
//!   append-only log of checksummed lines;
//! * [`store`], [`export`] and [`hls`]: reading what is stored;
//! * [`replay`]: each stored recording served back as broadcast
//!   `PATH/replay`, with hang's `archive` catalog entry and timeline track;
//! * [`fetch`]: FETCH of a past group answered from the stored segment;
//! * [`clients`]: the SDK clients dialing the relay's own port;
//! * [`names`]: broadcast paths and track names as file names.
//!
//! On disk, per broadcast `DIR/<path, %-escaped>/`: `index.log`,
//! `catalog.json` (the broadcast's hang catalog),
//! `<track>.<n>.init.mp4` (`ftyp` + `moov`) and `<track>.<n>.m4s` (one
//! `moof` + `mdat` per moq-lite group, so each segment starts on a
//! keyframe). `cat <track>.<init>.init.mp4 <track>.<n>.m4s` is a playable file.

pub mod clients;
pub mod export;
pub mod fetch;
pub mod fmp4;
pub mod hls;
pub mod index;
pub mod names;
pub mod recorder;
pub mod replay;
pub mod store;
pub mod writer;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::ConfigError;
use crate::config::keys::Values;
use crate::handler::WorkerInfo;
use crate::tls::TlsServer;

/// The recording settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordConfig {
    /// Broadcasts to record (`--record`); empty: none (the directory is
    /// still listed at `GET /recordings`).
    pub patterns: moq_pattern::Patterns,
    /// Where recordings are stored (`--record-dir`).
    pub dir: PathBuf,
    /// Segments older than this are deleted (`--record-retain`).
    pub retain: Option<Duration>,
    /// The recordings are kept below this many bytes (`--record-max-bytes`).
    pub max_bytes: Option<u64>,
    /// Bytes of groups waiting for the writer (`--record-queue-bytes`).
    pub queue_bytes: u64,
    /// Recordings served back as replay broadcasts at once (`--record-replays`).
    pub replays: usize,
}

/// Smallest `--record-queue-bytes`: room for a few groups.
pub const MIN_QUEUE_BYTES: u64 = 64 << 10;

impl RecordConfig {
    /// The recording settings among `v`: `None` without `--record-dir`.
    ///
    /// # Errors
    /// `--record` without `--record-dir`, a pattern that does not parse, a
    /// zero `--record-max-bytes` or `--record-retain`, or a queue below
    /// [`MIN_QUEUE_BYTES`].
    pub fn of(v: &Values) -> Result<Option<RecordConfig>, ConfigError> {
        let invalid = |key, reason: String| ConfigError::Invalid { key, reason };
        let mut patterns = moq_pattern::Patterns::new();
        for text in v
            .record
            .iter()
            .flatten()
            .map(|t| t.trim())
            .filter(|t| !t.is_empty())
        {
            let p: moq_pattern::Pattern = text
                .parse()
                .map_err(|e| invalid("record", format!("`{text}`: {e}")))?;
            patterns.insert(p);
        }
        let Some(dir) = v.record_dir.clone() else {
            if !patterns.is_empty() {
                return Err(invalid("record", "--record needs --record-dir".into()));
            }
            return Ok(None);
        };
        if v.record_max_bytes.is_some_and(|b| b.0 == 0) {
            return Err(invalid("record-max-bytes", "must be at least 1".into()));
        }
        if v.record_retain.is_some_and(|d| d.0.is_zero()) {
            return Err(invalid("record-retain", "must be at least 1ms".into()));
        }
        if v.record_queue_bytes.0 < MIN_QUEUE_BYTES {
            return Err(invalid(
                "record-queue-bytes",
                "must be at least 64KiB".into(),
            ));
        }
        Ok(Some(RecordConfig {
            patterns,
            dir,
            retain: v.record_retain.map(|d| d.0),
            max_bytes: v.record_max_bytes.map(|b| b.0),
            queue_bytes: v.record_queue_bytes.0,
            replays: usize::try_from(v.record_replays).unwrap_or(usize::MAX),
        }))
    }
}

/// The recorder's counters, shown on `--metrics` as `skiff_relay_record_*`.
#[derive(Debug, Default)]
pub struct RecordStats {
    /// Groups written as segments.
    pub groups_recorded: AtomicU64,
    /// Groups not recorded because the write queue was full.
    pub groups_dropped: AtomicU64,
    /// Jobs that failed on the disk (full, read-only, …).
    pub write_errors: AtomicU64,
    /// Bytes of segments written.
    pub bytes_written: AtomicU64,
    /// Segments deleted by retention.
    pub segments_deleted: AtomicU64,
    /// Bytes waiting in the write queue.
    pub queued_bytes: AtomicU64,
    /// Bytes of segments stored.
    pub stored_bytes: AtomicU64,
    /// Replay broadcasts published.
    pub replays: AtomicU64,
    /// Stored recordings without a replay: past `--record-replays`.
    pub replays_over_limit: AtomicU64,
}

impl RecordStats {
    /// Appends the counters in Prometheus text format to `out`.
    pub fn render(&self, out: &mut String) {
        let rows: [(&str, &str, &str, &AtomicU64); 9] = [
            (
                "groups_recorded_total",
                "counter",
                "Groups written to --record-dir as segments.",
                &self.groups_recorded,
            ),
            (
                "groups_dropped_total",
                "counter",
                "Groups not recorded: the write queue (--record-queue-bytes) was full.",
                &self.groups_dropped,
            ),
            (
                "write_errors_total",
                "counter",
                "Recording writes that failed (disk full, read-only directory); the group is not recorded.",
                &self.write_errors,
            ),
            (
                "bytes_written_total",
                "counter",
                "Bytes of segments written.",
                &self.bytes_written,
            ),
            (
                "segments_deleted_total",
                "counter",
                "Segments deleted by --record-retain or --record-max-bytes.",
                &self.segments_deleted,
            ),
            (
                "queued_bytes",
                "gauge",
                "Bytes waiting in the recording write queue.",
                &self.queued_bytes,
            ),
            (
                "stored_bytes",
                "gauge",
                "Bytes of segments stored in --record-dir.",
                &self.stored_bytes,
            ),
            (
                "replays",
                "gauge",
                "Recordings served back as replay broadcasts (PATH/replay).",
                &self.replays,
            ),
            (
                "replays_over_limit",
                "gauge",
                "Stored recordings not served back: past --record-replays, the newest first.",
                &self.replays_over_limit,
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP skiff_relay_record_{name} {help}");
            let _ = writeln!(out, "# TYPE skiff_relay_record_{name} {kind}");
            let _ = writeln!(
                out,
                "skiff_relay_record_{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
    }
}

/// Starts recording on worker 0 of a relay whose configuration has
/// `--record-dir`: the replay publisher ([`replay`]), the writer thread,
/// then the recorder task; both tasks dial the relay at
/// `info.config.listen` (TLS pinned to the relay's own certificate when the
/// listen port speaks TLS).
///
/// A recorder that cannot start is logged and the relay runs without it.
pub fn start(
    info: &WorkerInfo,
    origin: skiff_core::model::origin::Ref<'static, 'static>,
    tls: Option<&Arc<TlsServer>>,
) {
    let Some(config) = &info.config.record else {
        return;
    };
    // Each client's pool: a few seconds of groups of the broadcasts it
    // records (`recorder::BROADCASTS_PER_CLIENT`).
    let mut sdk = skiff_monoio::Config::default();
    sdk.pool_bytes = 16 << 20;
    let addr = info.config.listen;
    let url = match tls.filter(|t| t.on_tcp()) {
        Some(t) => {
            sdk.tls_fingerprint = t.cert().fingerprint();
            format!("tls://{addr}/?jwt={}", crate::auth::internal_token())
        }
        None => format!("tcp://{addr}/?jwt={}", crate::auth::internal_token()),
    };
    let replays = replay::ReplayPaths::default();
    if config.replays > 0 {
        monoio::spawn(replay::run(
            config.dir.clone(),
            url.clone(),
            sdk.clone(),
            config.replays,
            info.metrics.record.clone(),
            replays.clone(),
            info.shutdown.clone(),
        ));
    }
    if config.patterns.is_empty() {
        return;
    }
    let queue = match writer::start(config, info.metrics.record.clone()) {
        Ok(q) => q,
        Err(e) => {
            tracing::error!(dir = %config.dir.display(), error = %e, "recording: cannot open --record-dir; recording is off");
            return;
        }
    };
    tracing::info!(dir = %config.dir.display(), patterns = config.patterns.len(), "recording");
    monoio::spawn(recorder::run(
        origin,
        url,
        sdk,
        config.patterns.clone(),
        replays,
        queue,
        info.shutdown.clone(),
    ));
}
