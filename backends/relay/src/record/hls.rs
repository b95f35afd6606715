//! HLS from the recordings (`GET /hls/PATH/index.m3u8`, PATH the
//! broadcast's full path): a media playlist of the stored fMP4 segments of
//! the broadcast's first recorded video track (else its first track), and the segments themselves, as
//! stored (no re-encoding). While the broadcast is recorded the playlist is
//! live (the recording is its DVR window, as far back as retention keeps
//! it); once it ended, the same URL answers the finished playlist with
//! `#EXT-X-ENDLIST`.

use std::fmt::Write as _;
use std::path::Path;

use super::index;
use super::store::{self, Stored};

/// What to answer to a `/hls/…` request: status, content type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

impl Answer {
    fn not_found(why: &str) -> Answer {
        Answer {
            status: 404,
            content_type: "text/plain; charset=utf-8",
            body: format!("{why}\n").into_bytes(),
        }
    }
}

/// The playlist's file name.
pub const PLAYLIST: &str = "index.m3u8";

/// Answers `GET /hls/REST` (`rest`: `PATH/index.m3u8` or `PATH/FILE`) from
/// the recordings under `dir`.
pub fn answer(dir: &Path, rest: &str) -> Answer {
    let Some((broadcast, file)) = rest.rsplit_once('/') else {
        return Answer::not_found("expected /hls/BROADCAST/index.m3u8");
    };
    let stored = match store::open(dir, broadcast) {
        Ok(Some(s)) => s,
        Ok(None) => return Answer::not_found("no such recording"),
        Err(e) => {
            tracing::warn!(%broadcast, error = %e, "hls: cannot read the recording");
            return Answer::not_found("no such recording");
        }
    };
    let Some(track) = stored.index.default_track().map(str::to_owned) else {
        return Answer::not_found("nothing stored yet");
    };
    if file == PLAYLIST {
        return Answer {
            status: 200,
            content_type: "application/vnd.apple.mpegurl",
            body: playlist(&stored, &track).into_bytes(),
        };
    }
    // Only the files the index names are served: no other path reaches the disk.
    let t = &stored.index.tracks[&track];
    let named = t
        .segments
        .values()
        .any(|s| index::segment_file(&track, s.number) == file)
        || t.inits.keys().any(|&i| index::init_file(&track, i) == file);
    if !named {
        return Answer::not_found("no such segment");
    }
    match std::fs::read(stored.dir.join(file)) {
        Ok(body) => Answer {
            status: 200,
            content_type: "video/mp4",
            body,
        },
        // Deleted by retention since the playlist was read.
        Err(_) => Answer::not_found("segment gone"),
    }
}

/// The media playlist of `track` of `stored`.
pub fn playlist(stored: &Stored, track: &str) -> String {
    let segments: Vec<_> = stored.segments(track).collect();
    let target = segments
        .iter()
        .map(|s| s.duration_us.div_ceil(1_000_000))
        .max()
        .unwrap_or(1)
        .max(1);
    let mut out = String::new();
    let _ = writeln!(out, "#EXTM3U");
    let _ = writeln!(out, "#EXT-X-VERSION:7");
    let _ = writeln!(out, "#EXT-X-TARGETDURATION:{target}");
    let _ = writeln!(
        out,
        "#EXT-X-MEDIA-SEQUENCE:{}",
        segments.first().map_or(0, |s| s.number)
    );
    let mut init = None;
    for s in &segments {
        if init != Some(s.init) {
            // A new init: the broadcast was published again (new
            // decoder configuration, timestamps anew).
            if init.is_some() {
                let _ = writeln!(out, "#EXT-X-DISCONTINUITY");
            }
            let _ = writeln!(
                out,
                "#EXT-X-MAP:URI=\"{}\"",
                index::init_file(track, s.init)
            );
            init = Some(s.init);
        }
        let _ = writeln!(out, "#EXTINF:{:.6},", s.duration_us as f64 / 1e6);
        let _ = writeln!(out, "{}", index::segment_file(track, s.number));
    }
    // With no writer in this process nothing is still being recorded.
    if stored.index.ended || !super::writer::running() {
        let _ = writeln!(out, "#EXT-X-ENDLIST");
    }
    out
}
