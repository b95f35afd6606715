//! Reading what `--record-dir` holds, for `GET /recordings` and `export`:
//! each broadcast's index replayed, only segments whose file is there.
//! Nothing here writes; the writer thread ([`super::writer`]) owns the files.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::index::{self, BroadcastIndex, Segment};
use super::names;

/// One stored broadcast: its path, directory and replayed index.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The broadcast's full path.
    pub path: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Its index, segments whose file is missing left out.
    pub index: BroadcastIndex,
}

/// Reads the index of every broadcast under `dir`, in path order.
///
/// # Errors
/// If `dir` cannot be listed (a missing directory is an empty store).
pub fn list(dir: &Path) -> io::Result<Vec<Stored>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(path) = entry.file_name().to_str().and_then(names::decode) else {
            continue;
        };
        // Files next to the broadcasts' directories (an export) are not recordings.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Some(stored) = open(dir, &path)? {
            out.push(stored);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Reads the index of broadcast `path` under `dir`, `None` if there is none;
/// only segments whose file is there are kept.
///
/// # Errors
/// If the index exists but cannot be read.
pub fn open(dir: &Path, path: &str) -> io::Result<Option<Stored>> {
    let Some(mut stored) = open_index(dir, path)? else {
        return Ok(None);
    };
    let bdir = &stored.dir;
    for (track, t) in &mut stored.index.tracks {
        t.segments
            .retain(|&n, _| bdir.join(index::segment_file(track, n)).is_file());
    }
    Ok(Some(stored))
}

/// [`open`] without looking for each segment's file: for a reader of one
/// segment, whose own read finds a file gone.
///
/// # Errors
/// If the index exists but cannot be read.
pub fn open_index(dir: &Path, path: &str) -> io::Result<Option<Stored>> {
    let bdir = dir.join(names::encode(path));
    let bytes = match fs::read(bdir.join(index::INDEX_FILE)) {
        Ok(b) => b,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(Some(Stored {
        path: path.to_owned(),
        dir: bdir,
        index: BroadcastIndex::replay(&index::parse(&bytes).records),
    }))
}

/// One track of a stored broadcast as `GET /recordings` lists it.
#[derive(Debug, Serialize)]
pub struct TrackSummary {
    /// The track's name.
    pub track: String,
    /// Stored segments.
    pub segments: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Frames in them.
    pub frames: u64,
    /// Content time of the first stored frame, µs.
    pub start_us: Option<u64>,
    /// Content time at the end of the last stored segment, µs.
    pub end_us: Option<u64>,
}

/// One stored broadcast as `GET /recordings` lists it.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// The broadcast's full path.
    pub broadcast: String,
    /// True once it is no longer being recorded.
    pub ended: bool,
    /// Its tracks.
    pub tracks: Vec<TrackSummary>,
}

impl Stored {
    /// What `GET /recordings` says of this broadcast.
    pub fn summary(&self) -> Summary {
        let tracks = self
            .index
            .tracks
            .iter()
            .map(|(track, t)| TrackSummary {
                track: track.clone(),
                segments: t.segments.len(),
                bytes: t.segments.values().map(|s| s.bytes).sum(),
                frames: t.segments.values().map(|s| u64::from(s.frames)).sum(),
                start_us: t.segments.values().map(|s| s.start_us).min(),
                end_us: t
                    .segments
                    .values()
                    .map(|s| s.start_us.saturating_add(s.duration_us))
                    .max(),
            })
            .collect();
        Summary {
            broadcast: self.path.clone(),
            ended: self.index.ended || !super::writer::running(),
            tracks,
        }
    }

    /// The stored segments of `track`, in the order written.
    pub fn segments<'a>(&'a self, track: &str) -> impl Iterator<Item = &'a Segment> + 'a {
        self.index
            .tracks
            .get(track)
            .into_iter()
            .flat_map(|t| t.segments.values())
    }

    /// The file of segment `s`.
    pub fn segment_path(&self, s: &Segment) -> PathBuf {
        self.dir.join(index::segment_file(&s.track, s.number))
    }

    /// The file of init segment `init` of `track`.
    pub fn init_path(&self, track: &str, init: u32) -> PathBuf {
        self.dir.join(index::init_file(track, init))
    }
}

/// The body of `GET /recordings`: a JSON array of [`Summary`], one per
/// stored broadcast; an error object if the directory cannot be read.
pub fn recordings_json(dir: &Path) -> Vec<u8> {
    let body = match list(dir) {
        Ok(all) => serde_json::to_vec(&all.iter().map(Stored::summary).collect::<Vec<_>>()),
        Err(e) => serde_json::to_vec(&serde_json::json!({ "error": e.to_string() })),
    };
    body.unwrap_or_default()
}
