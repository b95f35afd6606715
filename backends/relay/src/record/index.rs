//! The index of one recorded broadcast: an append-only log of text records,
//! each line `CRC BODY\n` where CRC is the CRC-32 (IEEE) of BODY as eight
//! lowercase hex digits.
//!
//! A segment's record is appended only after its file was written in full
//! and renamed into place, so the index names complete segments only. A
//! line cut short by a crash (no newline, or a checksum that does not match)
//! ends the log: [`parse`] stops there and says how many bytes were good, and
//! the writer cuts the file back to them before appending again.
//!
//! Records (fields separated by one space; names as [`super::names`] writes them):
//!
//! ```text
//! I TRACK INIT TRACK_ID KIND                an init segment (TRACK.INIT.init.mp4)
//!                                           of a `video` or `audio` track
//! S TRACK N INIT GROUP START DUR FRAMES BYTES WRITTEN
//!                                           segment N of TRACK (TRACK.N.m4s): group
//!                                           GROUP, content time START..START+DUR µs,
//!                                           written at WRITTEN (Unix ms)
//! D TRACK N                                 segment N was deleted (retention)
//! E WRITTEN                                 the broadcast ended (its publisher left)
//! ```

use std::collections::BTreeMap;

use super::names;

/// The index file's name in a broadcast's directory.
pub const INDEX_FILE: &str = "index.log";

/// Longest index line accepted (a longer one ends the log as torn).
pub const MAX_LINE: usize = 1024;

/// One completed segment as the index records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The track's name.
    pub track: String,
    /// The segment's number in its track: consecutive from 0 (the
    /// track's HLS media sequence), never used twice.
    pub number: u64,
    /// The init segment it is decoded with.
    pub init: u32,
    /// The moq-lite group it was made of.
    pub group: u64,
    /// Content time of its first frame, µs (the broadcast's timestamps).
    pub start_us: u64,
    /// Its duration, µs.
    pub duration_us: u64,
    /// Frames (samples) in it.
    pub frames: u32,
    /// Its file's length in bytes.
    pub bytes: u64,
    /// When it was written, milliseconds since the Unix epoch.
    pub written_ms: u64,
}

/// One index record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An init segment of `track`, number `init`, with MP4 track ID `track_id`.
    Init {
        /// The track's name.
        track: String,
        /// The init segment's number.
        init: u32,
        /// The MP4 track ID its boxes use.
        track_id: u32,
        /// True for an audio track, false for video.
        audio: bool,
    },
    /// A completed segment.
    Segment(Segment),
    /// Segment `number` of `track` was deleted.
    Delete {
        /// The track's name.
        track: String,
        /// The deleted segment's number.
        number: u64,
    },
    /// The broadcast ended at `written_ms` (Unix ms).
    End {
        /// When, milliseconds since the Unix epoch.
        written_ms: u64,
    },
}

impl Record {
    /// The record as one index line, newline included.
    pub fn line(&self) -> String {
        let body = match self {
            Record::Init {
                track,
                init,
                track_id,
                audio,
            } => format!(
                "I {} {init} {track_id} {}",
                names::encode(track),
                if *audio { "audio" } else { "video" }
            ),
            Record::Segment(s) => format!(
                "S {} {} {} {} {} {} {} {} {}",
                names::encode(&s.track),
                s.number,
                s.init,
                s.group,
                s.start_us,
                s.duration_us,
                s.frames,
                s.bytes,
                s.written_ms
            ),
            Record::Delete { track, number } => format!("D {} {number}", names::encode(track)),
            Record::End { written_ms } => format!("E {written_ms}"),
        };
        format!("{:08x} {body}\n", crc32fast::hash(body.as_bytes()))
    }
}

/// What [`parse`] read of an index file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// The records of the good lines, in order.
    pub records: Vec<Record>,
    /// Bytes of the file the good lines take: the rest is torn or corrupt.
    pub valid_len: usize,
}

/// Reads an index file's bytes up to the first line that is incomplete,
/// fails its checksum or does not parse. Never panics, whatever the bytes.
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut rest = bytes;
    while let Some(end) = rest.iter().take(MAX_LINE + 1).position(|&b| b == b'\n') {
        let Some(record) = parse_line(&rest[..end]) else {
            break;
        };
        parsed.records.push(record);
        parsed.valid_len += end + 1;
        rest = &rest[end + 1..];
    }
    parsed
}

/// One line without its newline, or `None` if it is not a good record.
fn parse_line(line: &[u8]) -> Option<Record> {
    let line = std::str::from_utf8(line).ok()?;
    let (crc, body) = line.split_once(' ')?;
    if crc.len() != 8 || !crc.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    if u32::from_str_radix(crc, 16).ok()? != crc32fast::hash(body.as_bytes()) {
        return None;
    }
    let fields: Vec<&str> = body.split(' ').collect();
    let num = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let num32 = |i: usize| fields.get(i)?.parse::<u32>().ok();
    let track = || names::decode(fields.get(1)?).filter(|t| !t.is_empty());
    let record = match (fields.first().copied()?, fields.len()) {
        ("I", 5) => Record::Init {
            track: track()?,
            init: num32(2)?,
            track_id: num32(3)?,
            audio: match fields.get(4).copied()? {
                "audio" => true,
                "video" => false,
                _ => return None,
            },
        },
        ("S", 10) => Record::Segment(Segment {
            track: track()?,
            number: num(2)?,
            init: num32(3)?,
            group: num(4)?,
            start_us: num(5)?,
            duration_us: num(6)?,
            frames: num32(7)?,
            bytes: num(8)?,
            written_ms: num(9)?,
        }),
        ("D", 3) => Record::Delete {
            track: track()?,
            number: num(2)?,
        },
        ("E", 2) => Record::End {
            written_ms: num(1)?,
        },
        _ => return None,
    };
    Some(record)
}

/// A track's part of a broadcast's index, replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrackIndex {
    /// Init segment number → MP4 track ID.
    pub inits: BTreeMap<u32, u32>,
    /// True for an audio track (as its last init says).
    pub audio: bool,
    /// Segment number → segment, deleted ones left out.
    pub segments: BTreeMap<u64, Segment>,
    /// The highest segment number used (deleted ones included), if any.
    pub last_number: Option<u64>,
}

/// A broadcast's index replayed: what is stored now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BroadcastIndex {
    /// Track name → its inits and segments.
    pub tracks: BTreeMap<String, TrackIndex>,
    /// True if the last record ending or starting something is an end:
    /// the broadcast is not being recorded.
    pub ended: bool,
    /// The highest init number used, if any.
    pub last_init: Option<u32>,
}

impl BroadcastIndex {
    /// The index `records` describe.
    pub fn replay(records: &[Record]) -> BroadcastIndex {
        let mut index = BroadcastIndex::default();
        for record in records {
            index.apply(record);
        }
        index
    }

    /// Applies one more record.
    pub fn apply(&mut self, record: &Record) {
        match record {
            Record::Init {
                track,
                init,
                track_id,
                audio,
            } => {
                let t = self.tracks.entry(track.clone()).or_default();
                t.inits.insert(*init, *track_id);
                t.audio = *audio;
                self.last_init = self.last_init.max(Some(*init));
                self.ended = false;
            }
            Record::Segment(s) => {
                let t = self.tracks.entry(s.track.clone()).or_default();
                t.last_number = t.last_number.max(Some(s.number));
                // A segment whose init is unknown cannot be decoded: not served.
                if t.inits.contains_key(&s.init) {
                    t.segments.insert(s.number, s.clone());
                }
                self.ended = false;
            }
            Record::Delete { track, number } => {
                // Its number stays used (a compacted index may keep only
                // the deletion of the highest one).
                let t = self.tracks.entry(track.clone()).or_default();
                t.last_number = t.last_number.max(Some(*number));
                t.segments.remove(number);
            }
            Record::End { .. } => self.ended = true,
        }
    }

    /// Every stored segment of every track, track by track.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.tracks.values().flat_map(|t| t.segments.values())
    }

    /// The track a player or an export takes by default: the first video
    /// track with a stored segment, else the first track with one.
    pub fn default_track(&self) -> Option<&str> {
        let stored = || self.tracks.iter().filter(|(_, t)| !t.segments.is_empty());
        stored()
            .find(|(_, t)| !t.audio)
            .or_else(|| stored().next())
            .map(|(name, _)| name.as_str())
    }
}

/// The records of `records` a compacted index keeps, in order: every init
/// and end, the segments not deleted, and for each track the last deletion
/// of its highest segment number if that one is gone (so numbers are not
/// used twice). Replayed, they give the same [`BroadcastIndex`].
pub fn compact(records: &[Record]) -> Vec<Record> {
    let index = BroadcastIndex::replay(records);
    let track = |name: &str| index.tracks.get(name);
    let highest = |r: &Record| match r {
        Record::Delete {
            track: name,
            number,
        } => track(name).is_some_and(|t| t.last_number == Some(*number)),
        _ => false,
    };
    records
        .iter()
        .enumerate()
        .filter(|(i, r)| match r {
            Record::Init { .. } | Record::End { .. } => true,
            Record::Segment(s) => {
                track(&s.track).is_some_and(|t| t.segments.contains_key(&s.number))
            }
            // The last of the deletions of a track's highest number.
            Record::Delete { .. } => {
                highest(r) && !records[i + 1..].iter().any(|later| later == *r)
            }
        })
        .map(|(_, r)| r.clone())
        .collect()
}

impl BroadcastIndex {
    /// True if a segment was ever recorded (and maybe deleted since).
    pub fn recorded(&self) -> bool {
        self.tracks.values().any(|t| t.last_number.is_some())
    }
}

/// The file name of segment `number` of `track`.
pub fn segment_file(track: &str, number: u64) -> String {
    format!("{}.{number:010}.m4s", names::encode(track))
}

/// The file name of init segment `init` of `track`.
pub fn init_file(track: &str, init: u32) -> String {
    format!("{}.{init}.init.mp4", names::encode(track))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(n: u64) -> Record {
        Record::Segment(Segment {
            track: "video".into(),
            number: n,
            init: 0,
            group: n + 7,
            start_us: n * 1_000_000,
            duration_us: 1_000_000,
            frames: 30,
            bytes: 1234,
            written_ms: 1_700_000_000_000 + n,
        })
    }

    fn init() -> Record {
        Record::Init {
            track: "video".into(),
            init: 0,
            track_id: 1,
            audio: false,
        }
    }

    #[test]
    fn records_round_trip() {
        let records = vec![
            init(),
            segment(0),
            segment(1),
            Record::Delete {
                track: "video".into(),
                number: 0,
            },
            Record::End { written_ms: 5 },
        ];
        let text: String = records.iter().map(Record::line).collect();
        let parsed = parse(text.as_bytes());
        assert_eq!(parsed.records, records);
        assert_eq!(parsed.valid_len, text.len());
        let index = BroadcastIndex::replay(&parsed.records);
        assert!(index.ended);
        assert_eq!(index.tracks["video"].last_number, Some(1));
        let kept: Vec<u64> = index.segments().map(|s| s.number).collect();
        assert_eq!(kept, [1]);
    }

    #[test]
    fn a_compacted_index_replays_the_same() {
        let mut records = vec![init()];
        for n in 0..10 {
            records.push(segment(n));
        }
        for n in 0..6 {
            records.push(Record::Delete {
                track: "video".into(),
                number: n,
            });
        }
        records.push(Record::End { written_ms: 9 });
        let kept = compact(&records);
        assert_eq!(kept.len(), 1 + 4 + 1);
        assert_eq!(
            BroadcastIndex::replay(&kept),
            BroadcastIndex::replay(&records)
        );
        // Every segment deleted: the highest number's deletion is kept.
        for n in 6..10 {
            records.push(Record::Delete {
                track: "video".into(),
                number: n,
            });
        }
        let kept = compact(&records);
        let index = BroadcastIndex::replay(&kept);
        assert_eq!(index, BroadcastIndex::replay(&records));
        assert_eq!(index.tracks["video"].last_number, Some(9));
        assert_eq!(kept.len(), 1 + 1 + 1);
    }

    #[test]
    fn a_torn_or_corrupt_line_ends_the_log() {
        let good = format!("{}{}", init().line(), segment(0).line());
        let torn = segment(1).line();
        // Cut anywhere inside the last line: only the good lines count.
        for cut in 0..torn.len() {
            let text = format!("{good}{}", &torn[..cut]);
            let parsed = parse(text.as_bytes());
            assert_eq!(parsed.records.len(), 2, "cut at {cut}");
            assert_eq!(parsed.valid_len, good.len());
        }
        // One flipped byte anywhere in a line: that line and the rest are dropped.
        let text = format!("{good}{torn}");
        for at in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[at] ^= 0x01;
            let parsed = parse(&bytes);
            let line_of = text[..at].matches('\n').count();
            assert_eq!(parsed.records.len(), line_of, "flip at {at}");
        }
    }

    #[test]
    fn mutated_indexes_parse_to_a_good_prefix() {
        // The fuzz target's properties on 20 000 deterministic mutations of
        // a good index (xorshift: the same inputs on every run).
        let mut records = vec![init()];
        records.extend((0..6).map(segment));
        records.push(Record::Delete {
            track: "video".into(),
            number: 2,
        });
        records.push(Record::End { written_ms: 7 });
        let good: Vec<u8> = records
            .iter()
            .map(Record::line)
            .collect::<String>()
            .into_bytes();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                match next() % 3 {
                    0 => bytes[at] = next() as u8,
                    1 => bytes.insert(at, next() as u8),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            let parsed = parse(&bytes);
            assert!(parsed.valid_len <= bytes.len());
            let again: String = parsed.records.iter().map(Record::line).collect();
            assert_eq!(again.as_bytes(), &bytes[..parsed.valid_len]);
            let index = BroadcastIndex::replay(&parsed.records);
            assert_eq!(BroadcastIndex::replay(&compact(&parsed.records)), index);
        }
    }

    #[test]
    fn malformed_input_is_refused_without_panic() {
        let checked = |body: &str| format!("{:08x} {body}\n", crc32fast::hash(body.as_bytes()));
        let mut inputs: Vec<Vec<u8>> = ["", "\n", "zzzzzzzz S\n", "00000000 \n", "0000000 E 1\n"]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
        inputs.push(vec![0xff, 0xfe, b'\n']);
        // Good checksums over bad records: an unknown kind, a wrong field
        // count, a track name that is no file name, a number out of range.
        for body in [
            "X 1",
            "E",
            "I .. 0 1 video",
            "I video 0 4294967296 video",
            "I video 0 1 text",
            "I video 0 1",
            "S video 1 2 3",
        ] {
            inputs.push(checked(body).into_bytes());
        }
        for input in inputs {
            let parsed = parse(&input);
            assert!(parsed.records.is_empty(), "{input:?}");
            assert_eq!(parsed.valid_len, 0);
        }
        // A line longer than MAX_LINE is not read at all.
        let long = format!("{:08x} {}\n", 0, "E".repeat(MAX_LINE + 10));
        assert!(parse(long.as_bytes()).records.is_empty());
    }
}
