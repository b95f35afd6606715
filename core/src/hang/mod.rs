//! moq-dev's "hang" media format on top of moq-lite (docs/protocol.md §10).
//!
//! A hang broadcast (its name ends in [`BROADCAST_SUFFIX`] by convention) holds
//! a [`CATALOG_TRACK`] describing its media tracks as JSON, and one track per
//! rendition whose frames are [`frame`]s of the legacy container: a varint
//! presentation time in microseconds, then the codec's bytes. Every group of a
//! media track is one GOP and starts with a keyframe.
//!
//! * [`avc`]: H.264 NAL framing, the avcC record and the codec string.
//! * [`frame`]: the legacy container's prefix, written and read without allocating.
//! * [`catalog`]: a catalog writer for video renditions into a caller's buffer.
//! * [`ipcm`]: an H.264 writer without an encoder (I_PCM macroblocks).
//! * [`testcard`]: a moving test card with a drawn frame counter, as catalog
//!   and frames, for boards without a camera, and its check for viewers.
//! * [`catalog_info`], [`video_info`], [`audio_info`]: the TRACK_INFO values
//!   moq-dev's publishers give these tracks.

pub mod avc;
pub mod catalog;
pub mod frame;
pub mod ipcm;
pub mod testcard;

use core::num::NonZeroU64;

use crate::model::track::{Info, NameTooLong};
use crate::time::Duration;

/// The catalog track's name.
pub const CATALOG_TRACK: &str = "catalog.json";

/// The suffix of a hang broadcast's name (`room/alice.hang`).
pub const BROADCAST_SUFFIX: &str = ".hang";

/// Timestamp units per second of hang media tracks: microseconds.
pub const TIMESCALE: NonZeroU64 = match NonZeroU64::new(1_000_000) {
    Some(t) => t,
    None => panic!("1000000 is not zero"),
};

/// Publisher priority of the catalog track.
pub const PRIORITY_CATALOG: u8 = 100;

/// Publisher priority of an audio track (above video: audio gaps are heard first).
pub const PRIORITY_AUDIO: u8 = 80;

/// Publisher priority of a video track.
pub const PRIORITY_VIDEO: u8 = 60;

/// How long a media track keeps non-latest groups: 30 s.
pub const MAX_AGE: Duration = Duration::from_secs(30);

/// The catalog track's [`Info`]: moq-dev's defaults (millisecond timescale,
/// 5 s max age) at [`PRIORITY_CATALOG`].
pub const fn catalog_info() -> Info {
    match Info::new(CATALOG_TRACK) {
        Ok(info) => info.with_priority(PRIORITY_CATALOG),
        Err(_) => panic!("catalog.json is a short name"),
    }
}

/// A media track's [`Info`] at `priority`: [`TIMESCALE`] (µs) and [`MAX_AGE`].
///
/// # Errors
/// [`NameTooLong`] for a name longer than the track name limit.
pub const fn media_info(name: &str, priority: u8) -> Result<Info, NameTooLong> {
    match Info::new(name) {
        Ok(info) => Ok(info
            .with_timescale(TIMESCALE)
            .with_max_age(MAX_AGE)
            .with_priority(priority)),
        Err(e) => Err(e),
    }
}

/// A video track's [`Info`]: [`media_info`] at [`PRIORITY_VIDEO`].
///
/// With this timescale a frame's FRAME timestamp is its presentation time in
/// microseconds, the value the legacy prefix carries: write the frame with
/// `write_frame(pts_us, payload)` where `payload` starts with
/// [`frame::encode_prefix`] of the same `pts_us`.
///
/// # Errors
/// [`NameTooLong`] for a name longer than the track name limit.
pub const fn video_info(name: &str) -> Result<Info, NameTooLong> {
    media_info(name, PRIORITY_VIDEO)
}

/// An audio track's [`Info`]: [`media_info`] at [`PRIORITY_AUDIO`].
///
/// # Errors
/// [`NameTooLong`] for a name longer than the track name limit.
pub const fn audio_info(name: &str) -> Result<Info, NameTooLong> {
    media_info(name, PRIORITY_AUDIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::track::{DEFAULT_MAX_AGE, DEFAULT_TIMESCALE};

    #[test]
    fn track_infos() {
        let c = catalog_info();
        assert_eq!(c.name, "catalog.json");
        assert_eq!(c.priority, 100);
        assert_eq!(c.timescale, DEFAULT_TIMESCALE);
        assert_eq!(c.max_age, DEFAULT_MAX_AGE);
        let v = video_info("video").unwrap();
        assert_eq!(v.name, "video");
        assert_eq!((v.priority, v.timescale.get()), (60, 1_000_000));
        assert_eq!(v.max_age, Duration::from_millis(30_000));
        assert_eq!(audio_info("audio").unwrap().priority, 80);
        // A FRAME timestamp in this timescale is the presentation time in µs.
        assert_eq!(v.instant(1_234_567).as_micros(), 1_234_567);
        assert!(video_info(core::str::from_utf8(&[b'a'; 129]).unwrap()).is_err());
    }
}
