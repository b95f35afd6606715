//! A recorded broadcast's self-description in hang's archive format
//! (docs/protocol.md §10.5–10.8): the catalog's root `archive` entry ([`Archive`]),
//! the timeline track's records ([`Record`], [`Range`]) and the JSON window
//! codec the timeline travels in ([`window`]), with its group-scoped raw
//! DEFLATE ([`flate`]).
//!
//! A viewer reads a timeline track with a [`window::Decoder`]: call
//! [`window::Decoder::start_group`] at each moq-lite group, then
//! [`window::Decoder::decode`] on each frame, which returns the
//! [`window::Event`]s the frame implies (records pushed, popped, or skipped
//! because this reader joined late). A publisher writes one with a
//! [`window::Encoder`]: each [`window::Encoder::push`] or
//! [`window::Encoder::pop`] gives a frame payload and whether it opens a new
//! group. [`timeline::Timeline`] keeps the records a reader has, and finds
//! the one holding a content time.

pub mod flate;
pub mod timeline;
pub mod window;

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// The timeline track's conventional name (`.z`: DEFLATE-compressed).
pub const TIMELINE_TRACK: &str = "timeline.z";

/// The catalog's root `archive` entry: where a broadcast's timeline is and,
/// for a recording, the broadcast it is served back from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Archive {
    /// The track carrying the timeline records.
    pub track: String,
    /// Units per second of the records' `pts` and `duration` (1000: ms).
    #[serde(default = "default_timescale", deserialize_with = "nonzero_timescale")]
    pub timescale: u32,
    /// The longest a segment lasts, in `timescale` units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_max: Option<u64>,
    /// The broadcast serving the recording, relative to the catalog's own
    /// broadcast path (resolved like a URL reference: against the path's
    /// parent, so `./replay` in `a/b/replay` names `a/b/replay`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    /// An object-store URL the recording's objects live under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The recording object format's version, when `store` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
}

fn default_timescale() -> u32 {
    1000
}

/// A timescale must count something: 0 is refused.
fn nonzero_timescale<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match u32::deserialize(d)? {
        0 => Err(serde::de::Error::custom("timescale 0")),
        n => Ok(n),
    }
}

impl Archive {
    /// An entry naming `track` as the timeline, in milliseconds, with
    /// nothing else set.
    pub fn new(track: &str) -> Archive {
        Archive {
            track: track.to_owned(),
            timescale: default_timescale(),
            duration_max: None,
            replay: None,
            store: None,
            version: None,
        }
    }
}

/// A run of consecutive groups of one track, `start..=end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// The first group's sequence number.
    pub start: u64,
    /// The last group's sequence number (inclusive).
    pub end: u64,
    /// Whether the first group opens on a keyframe (written only when not).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub keyframe: bool,
}

fn yes() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_true(b: &bool) -> bool {
    *b
}

impl Range {
    /// Groups `start..=end`, the first opening on a keyframe.
    pub fn new(start: u64, end: u64) -> Range {
        Range {
            start,
            end,
            keyframe: true,
        }
    }
}

/// One timeline record: a complete segment, its span of content time and
/// the group ranges each track carries it in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The segment's number, consecutive within the broadcast.
    pub segment: u64,
    /// Its start, in the archive's timescale.
    pub pts: u64,
    /// Its length, in the archive's timescale.
    pub duration: u64,
    /// Track name → the group ranges holding the segment on that track (a
    /// track left out has nothing in the span).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tracks: BTreeMap<String, Vec<Range>>,
}

impl Record {
    /// Segment `segment` at `pts` lasting `duration`, no tracks yet.
    pub fn new(segment: u64, pts: u64, duration: u64) -> Record {
        Record {
            segment,
            pts,
            duration,
            tracks: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_json_has_the_catalog_shape() {
        let mut a = Archive::new(TIMELINE_TRACK);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"track":"timeline.z","timescale":1000}"#
        );
        a.duration_max = Some(2000);
        a.replay = Some("./replay".into());
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"track":"timeline.z","timescale":1000,"durationMax":2000,"replay":"./replay"}"#
        );
        assert_eq!(serde_json::from_str::<Archive>(&text).unwrap(), a);
        let bare: Archive = serde_json::from_str(r#"{"track":"t"}"#).unwrap();
        assert_eq!(bare.timescale, 1000);
        assert!(serde_json::from_str::<Archive>(r#"{"track":"t","timescale":0}"#).is_err());
    }

    #[test]
    fn record_json_has_the_timeline_shape() {
        let mut r = Record::new(3, 84_000, 6_000);
        r.tracks.insert("video".into(), vec![Range::new(42, 42)]);
        let mut gap = Range::new(7, 9);
        gap.keyframe = false;
        r.tracks.insert("audio".into(), vec![gap]);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"segment":3,"pts":84000,"duration":6000,"tracks":{"#,
                r#""audio":[{"start":7,"end":9,"keyframe":false}],"video":[{"start":42,"end":42}]}}"#
            )
        );
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r);
        assert_eq!(
            serde_json::to_string(&Record::new(1, 2, 3)).unwrap(),
            r#"{"segment":1,"pts":2,"duration":3}"#
        );
    }
}
