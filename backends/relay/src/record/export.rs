//! `skiff-relay export`: one MP4 file from a broadcast's stored segments,
//! without re-encoding. The file is fragmented MP4: the track's init
//! segment (`ftyp` + `moov`) with the file's duration
//! ([`fmp4::export_init`]), then the chosen segments in the order they
//! were recorded, their decode times moved so the file starts at time 0
//! ([`fmp4::rebase_segment`]; the media data is copied as stored).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{fmp4, store};

/// What to export.
#[derive(Debug, Clone)]
pub struct Export {
    /// The recording directory.
    pub dir: PathBuf,
    /// The broadcast's full path.
    pub broadcast: String,
    /// The track, or the first one stored.
    pub track: Option<String>,
    /// First content time: the segment holding it comes first.
    pub from: Option<Duration>,
    /// Segments starting at or after this content time are left out.
    pub to: Option<Duration>,
    /// The file to write.
    pub output: PathBuf,
}

/// What [`run`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    /// The track exported.
    pub track: String,
    /// Segments written.
    pub segments: usize,
    /// Frames in them.
    pub frames: u64,
    /// Content time of the first frame and the end of the last segment, µs.
    pub span_us: (u64, u64),
    /// Bytes of the file.
    pub bytes: u64,
}

/// Why nothing was exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The recording directory or a file of it could not be read, or the
    /// output could not be written.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// No such broadcast or track, or no segment in the range.
    #[error("{0}")]
    Nothing(String),
}

/// Writes the MP4 `export` asks for (through a temporary file renamed into place).
///
/// # Errors
/// [`ExportError`].
pub fn run(export: &Export) -> Result<Exported, ExportError> {
    let stored = store::open(&export.dir, &export.broadcast)?.ok_or_else(|| {
        ExportError::Nothing(format!(
            "no recording of `{}` in {}",
            export.broadcast,
            export.dir.display()
        ))
    })?;
    let track = match &export.track {
        Some(t) => t.clone(),
        None => stored
            .index
            .default_track()
            .map(str::to_owned)
            .ok_or_else(|| {
                ExportError::Nothing(format!("`{}` has no stored segment", export.broadcast))
            })?,
    };
    let from_us = export.from.map_or(0, |d| d.as_micros() as u64);
    let to_us = export.to.map_or(u64::MAX, |d| d.as_micros() as u64);
    let chosen: Vec<_> = stored
        .segments(&track)
        .filter(|s| s.start_us.saturating_add(s.duration_us) > from_us && s.start_us < to_us)
        .collect();
    let first = chosen.first().ok_or_else(|| {
        ExportError::Nothing(format!(
            "no segment of `{}` track `{track}` in the range",
            export.broadcast
        ))
    })?;
    // One init per file: the segments decoded with the first one's.
    let init = first.init;
    let chosen: Vec<_> = chosen.into_iter().take_while(|s| s.init == init).collect();
    let tmp = tmp_path(&export.output);
    let result = (|| -> io::Result<Exported> {
        let mut out = io::BufWriter::new(File::create(&tmp)?);
        let mut bytes = 0u64;
        let start = chosen.first().map_or(0, |s| s.start_us);
        let end = chosen.last().map_or(0, |s| s.start_us + s.duration_us);
        let head = fmp4::export_init(
            &fs::read(stored.init_path(&track, init))?,
            end.saturating_sub(start),
        )
        .map_err(io::Error::other)?;
        out.write_all(&head)?;
        bytes += head.len() as u64;
        for s in &chosen {
            let body = fmp4::rebase_segment(&fs::read(stored.segment_path(s))?, start)
                .map_err(io::Error::other)?;
            out.write_all(&body)?;
            bytes += body.len() as u64;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&tmp, &export.output)?;
        let last = chosen.last().map_or(0, |s| s.start_us + s.duration_us);
        Ok(Exported {
            track: track.clone(),
            segments: chosen.len(),
            frames: chosen.iter().map(|s| u64::from(s.frames)).sum(),
            span_us: (chosen.first().map_or(0, |s| s.start_us), last),
            bytes,
        })
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok(result?)
}

/// `output` with `.tmp` appended to its file name.
fn tmp_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    output.with_file_name(name)
}
