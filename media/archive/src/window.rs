//! The JSON window a timeline track travels in (docs/protocol.md §10.7): a
//! run of records the publisher appends to and drops from the front of,
//! which a reader may join at any group.
//!
//! The first frame of every group is a header restating the window:
//! `{"offset":N,"start":M,"records":[...]}`, `N` the index of the oldest
//! record still in the window and `records` the newest ones from index `M`
//! (`start` is left out when it equals `offset`: the header holds them all).
//! Later frames of the group are `{"push":RECORD}` (the next index) and
//! `{"pop":COUNT}` (drop from the front). The publisher opens a new group
//! when the ops written in the current one outgrow `op_ratio` times its
//! header, so a late reader never reads far; a reader that followed every
//! group gets each record once whatever the group boundaries, and one that
//! joined late or fell behind is told which indices it will never get.
//!
//! With compression on, each group is one raw DEFLATE stream, one sync
//! flush per frame ([`crate::flate`]).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::Range;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::flate::{Deflater, FlateError, Inflater};

/// The largest index a window uses: integers above 2^53 − 1 are not exact
/// in JavaScript readers.
pub const MAX_INDEX: u64 = (1 << 53) - 1;

/// How an [`Encoder`] frames the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderConfig {
    /// A group takes ops while the ops already in it total at most this
    /// many times its header's size; 0: every edit restates the window in
    /// a new group.
    pub op_ratio: u32,
    /// DEFLATE each group ([`crate::flate`]).
    pub compression: bool,
    /// The most records a header restates (at least 1): a reader joining
    /// later is told the older ones are skipped.
    pub checkpoint_records: usize,
    /// Frames in a group, header included, before a new one is opened.
    pub max_group_frames: usize,
    /// Bytes of a group (its frames' payloads) before a new one is opened;
    /// a header larger than this is an error.
    pub max_group_bytes: u64,
    /// The longest record, serialized.
    pub max_record_bytes: usize,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            op_ratio: 8,
            compression: false,
            checkpoint_records: usize::MAX,
            max_group_frames: 1024,
            max_group_bytes: 16 << 20,
            max_record_bytes: 64 << 10,
        }
    }
}

/// Why an edit could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The record does not serialize to JSON.
    #[error("record: {0}")]
    Json(#[from] serde_json::Error),
    /// The record or the header is longer than the configured bound.
    #[error("{0} longer than the configured bound")]
    TooLarge(&'static str),
    /// The window's indices reached [`MAX_INDEX`].
    #[error("window index past 2^53 - 1")]
    IndexExhausted,
    /// The compressor failed.
    #[error(transparent)]
    Flate(#[from] FlateError),
}

/// One frame to write, and whether it opens a new group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's payload.
    pub payload: Vec<u8>,
    /// True for a header: the frame must be the first of a new group.
    pub new_group: bool,
}

/// Turns window edits into frames, deciding where groups begin.
///
/// Frames must be written in the order they are made, each header as the
/// first frame of a new group. If a frame could not be written, call
/// [`Encoder::resync`]: the next frame then restates the window in a new
/// group (the edit stays in the window).
#[derive(Debug)]
pub struct Encoder<T> {
    config: EncoderConfig,
    /// The newest records (at most `checkpoint_records`), serialized.
    window: VecDeque<Vec<u8>>,
    /// Index of the oldest record in the window.
    offset: u64,
    /// Index of `window[0]` (≥ `offset` once older records left the checkpoint).
    start: u64,
    deflater: Option<Deflater>,
    /// Payload bytes of the ops in the current group.
    op_bytes: u64,
    /// Payload bytes of the current group's header.
    header_bytes: u64,
    /// Frames in the current group.
    frames: usize,
    /// The next frame must be a header.
    resync: bool,
    _record: PhantomData<fn(&T)>,
}

impl<T: Serialize> Encoder<T> {
    /// An encoder of an empty window starting at index 0.
    pub fn new(config: EncoderConfig) -> Encoder<T> {
        let mut config = config;
        config.checkpoint_records = config.checkpoint_records.max(1);
        Encoder {
            config,
            window: VecDeque::new(),
            offset: 0,
            start: 0,
            deflater: None,
            op_bytes: 0,
            header_bytes: 0,
            frames: 0,
            resync: true,
            _record: PhantomData,
        }
    }

    /// The indices in the window: the oldest, and one past the newest.
    pub fn range(&self) -> Range<u64> {
        self.offset..self.start + self.window.len() as u64
    }

    /// Moves an empty window forward to start at `index` (its next record
    /// gets that index), so a publisher can number records after something
    /// of its own, such as segment numbers; the next frame is a header.
    /// Does nothing to a window holding records, or to move it backwards.
    pub fn skip_to(&mut self, index: u64) {
        let end = self.range().end;
        if self.offset == end && index > end && index < MAX_INDEX {
            self.offset = index;
            self.start = index;
            self.window.clear();
            self.resync();
        }
    }

    /// Makes the next frame a header opening a new group.
    pub fn resync(&mut self) {
        self.resync = true;
        self.deflater = None;
    }

    /// Appends `record` to the window: a push in the current group, or a
    /// header restating the window in a new group.
    ///
    /// # Errors
    /// A record that does not serialize or is too long, or an exhausted
    /// index (the window is unchanged); a header too long (the record is in
    /// the window, and the next frame will restate it).
    pub fn push(&mut self, record: &T) -> Result<Frame, EncodeError> {
        let bytes = serde_json::to_vec(record)?;
        if bytes.len() > self.config.max_record_bytes {
            return Err(EncodeError::TooLarge("record"));
        }
        if self.range().end >= MAX_INDEX {
            return Err(EncodeError::IndexExhausted);
        }
        let mut op = Vec::with_capacity(bytes.len() + 9);
        op.extend_from_slice(b"{\"push\":");
        op.extend_from_slice(&bytes);
        op.push(b'}');
        self.window.push_back(bytes);
        while self.window.len() > self.config.checkpoint_records {
            self.window.pop_front();
            self.start += 1;
        }
        self.frame(op)
    }

    /// Drops the `count` oldest records (fewer if the window holds fewer):
    /// `None` if nothing is dropped, else a pop in the current group or a
    /// header restating what is left in a new group.
    ///
    /// # Errors
    /// As [`Encoder::push`]'s header case.
    pub fn pop(&mut self, count: u64) -> Result<Option<Frame>, EncodeError> {
        let count = count.min(self.range().end - self.offset);
        if count == 0 {
            return Ok(None);
        }
        self.offset += count;
        let gone = self
            .offset
            .saturating_sub(self.start)
            .min(self.window.len() as u64);
        self.window
            .drain(..usize::try_from(gone).unwrap_or(usize::MAX));
        self.start += gone;
        self.frame(format!("{{\"pop\":{count}}}").into_bytes())
            .map(Some)
    }

    /// The frame for the edit just applied: `op` in the current group if
    /// it has room, else the window's header in a new one.
    fn frame(&mut self, op: Vec<u8>) -> Result<Frame, EncodeError> {
        let room = self.config.op_ratio != 0
            && !self.resync
            && self.frames > 0
            && self.frames < self.config.max_group_frames
            && self.op_bytes <= u64::from(self.config.op_ratio) * self.header_bytes;
        if room {
            let payload = match &mut self.deflater {
                Some(d) => d.frame(&op)?,
                None => op,
            };
            let bytes = payload.len() as u64;
            if self.header_bytes + self.op_bytes + bytes <= self.config.max_group_bytes {
                self.op_bytes += bytes;
                self.frames += 1;
                return Ok(Frame {
                    payload,
                    new_group: false,
                });
            }
        }
        self.header()
    }

    /// The header restating the window, opening a new group.
    fn header(&mut self) -> Result<Frame, EncodeError> {
        self.resync();
        let size: usize = self.window.iter().map(|r| r.len() + 1).sum();
        let mut text = Vec::with_capacity(size + 64);
        text.extend_from_slice(format!("{{\"offset\":{}", self.offset).as_bytes());
        if self.start != self.offset {
            text.extend_from_slice(format!(",\"start\":{}", self.start).as_bytes());
        }
        text.extend_from_slice(b",\"records\":[");
        for (i, r) in self.window.iter().enumerate() {
            if i > 0 {
                text.push(b',');
            }
            text.extend_from_slice(r);
        }
        text.extend_from_slice(b"]}");
        let (payload, deflater) = if self.config.compression {
            let mut d = Deflater::new();
            (d.frame(&text)?, Some(d))
        } else {
            (text, None)
        };
        if payload.len() as u64 > self.config.max_group_bytes {
            return Err(EncodeError::TooLarge("header"));
        }
        self.deflater = deflater;
        self.header_bytes = payload.len() as u64;
        self.op_bytes = 0;
        self.frames = 1;
        self.resync = false;
        Ok(Frame {
            payload,
            new_group: true,
        })
    }
}

/// How a [`Decoder`] reads frames, and its bounds on untrusted input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecoderConfig {
    /// The frames are DEFLATE-compressed per group.
    pub compression: bool,
    /// The most bytes one frame may hold once inflated.
    pub max_frame_bytes: usize,
    /// The most records one header may restate.
    pub max_records: usize,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig {
            compression: false,
            max_frame_bytes: 4 << 20,
            max_records: 65_536,
        }
    }
}

/// A change to the window as one reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<T> {
    /// Record `index` joined the window.
    Push {
        /// Its index.
        index: u64,
        /// The record.
        value: T,
    },
    /// These records, delivered before, left the window.
    Pop(Range<u64>),
    /// These records existed but this reader will never get them (it joined
    /// or fell behind after they left a header's restatement).
    Skip(Range<u64>),
}

/// Why a frame could not be decoded. The frames after it in the same
/// group are refused too; the next group's header puts the reader back.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A frame before [`Decoder::start_group`], or after an error in its group.
    #[error("no group to decode the frame in")]
    NoGroup,
    /// The frame does not inflate.
    #[error(transparent)]
    Flate(#[from] FlateError),
    /// The frame is not the JSON it should be.
    #[error("frame JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The frame contradicts the window (an index out of range, a window
    /// moving backwards, a pop of more than it holds, too many records).
    #[error("window: {0}")]
    Window(&'static str),
}

/// A group's header, as read.
#[derive(serde::Deserialize)]
struct Header<T> {
    offset: u64,
    #[serde(default)]
    start: Option<u64>,
    records: Vec<T>,
}

/// An op frame, as read.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
enum Op<T> {
    Push(T),
    Pop(u64),
}

/// Turns a window's frames into [`Event`]s for one reader.
#[derive(Debug)]
pub struct Decoder<T> {
    config: DecoderConfig,
    /// Index of the oldest record in the window.
    front: u64,
    /// Records in the window.
    len: u64,
    /// The next index not yet delivered; `None` before the first header.
    delivered: Option<u64>,
    /// The current group: `None` before [`Decoder::start_group`] or after an error.
    group: Option<GroupState>,
    /// Inflated frame bytes, reused.
    buf: Vec<u8>,
    _record: PhantomData<fn() -> T>,
}

#[derive(Debug)]
struct GroupState {
    inflater: Option<Inflater>,
    /// The header was read.
    positioned: bool,
}

impl<T: DeserializeOwned> Decoder<T> {
    /// A reader that has seen nothing yet.
    pub fn new(config: DecoderConfig) -> Decoder<T> {
        Decoder {
            config,
            front: 0,
            len: 0,
            delivered: None,
            group: None,
            buf: Vec::new(),
            _record: PhantomData,
        }
    }

    /// The indices in the window as read so far.
    pub fn range(&self) -> Range<u64> {
        self.front..self.front + self.len
    }

    /// A new group begins: its first frame is a header, and with
    /// compression its stream starts afresh.
    pub fn start_group(&mut self) {
        self.group = Some(GroupState {
            inflater: self
                .config
                .compression
                .then(|| Inflater::new(self.config.max_frame_bytes)),
            positioned: false,
        });
    }

    /// The events frame `payload` (the next of the current group) implies.
    ///
    /// # Errors
    /// See [`DecodeError`]; the window is left as it was before the frame.
    pub fn decode(&mut self, payload: &[u8]) -> Result<Vec<Event<T>>, DecodeError> {
        let result = self.decode_frame(payload);
        if result.is_err() {
            self.group = None;
        }
        result
    }

    fn decode_frame(&mut self, payload: &[u8]) -> Result<Vec<Event<T>>, DecodeError> {
        let group = self.group.as_mut().ok_or(DecodeError::NoGroup)?;
        let mut buf = std::mem::take(&mut self.buf);
        let bytes: &[u8] = match &mut group.inflater {
            Some(inflater) => {
                inflater.frame(payload, &mut buf)?;
                &buf
            }
            None if payload.len() > self.config.max_frame_bytes => {
                return Err(DecodeError::Flate(FlateError::TooLarge(
                    self.config.max_frame_bytes,
                )));
            }
            None => payload,
        };
        let positioned = group.positioned;
        let events = if positioned {
            let op: Op<T> = serde_json::from_slice(bytes)?;
            match op {
                Op::Push(value) => self.push(value)?,
                Op::Pop(count) => self.pop(count)?,
            }
        } else {
            let header: Header<T> = serde_json::from_slice(bytes)?;
            let events = self.header(header)?;
            if let Some(g) = &mut self.group {
                g.positioned = true;
            }
            events
        };
        self.buf = buf;
        Ok(events)
    }

    fn header(&mut self, h: Header<T>) -> Result<Vec<Event<T>>, DecodeError> {
        let start = h.start.unwrap_or(h.offset);
        if h.records.len() > self.config.max_records {
            return Err(DecodeError::Window("header restates too many records"));
        }
        if h.offset > MAX_INDEX || start < h.offset {
            return Err(DecodeError::Window("header offset out of range"));
        }
        let end = start
            .checked_add(h.records.len() as u64)
            .filter(|&e| e <= MAX_INDEX)
            .ok_or(DecodeError::Window("header end past 2^53 - 1"))?;
        let mut events = Vec::with_capacity(h.records.len() + 2);
        let delivered = match self.delivered {
            None => {
                if h.offset < start {
                    events.push(Event::Skip(h.offset..start));
                }
                h.offset
            }
            Some(delivered) => {
                if h.offset < self.front || end < delivered {
                    return Err(DecodeError::Window("header moved backwards"));
                }
                let popped = self.front..delivered.min(h.offset);
                if !popped.is_empty() {
                    events.push(Event::Pop(popped));
                }
                let skipped = delivered..start;
                if !skipped.is_empty() {
                    events.push(Event::Skip(skipped));
                }
                delivered
            }
        };
        for (index, value) in (start..).zip(h.records) {
            if index >= delivered {
                events.push(Event::Push { index, value });
            }
        }
        self.front = h.offset;
        self.len = end - h.offset;
        self.delivered = Some(delivered.max(end));
        Ok(events)
    }

    fn push(&mut self, value: T) -> Result<Vec<Event<T>>, DecodeError> {
        let delivered = self.delivered.ok_or(DecodeError::NoGroup)?;
        let index = self.front + self.len;
        if index >= MAX_INDEX {
            return Err(DecodeError::Window("push past 2^53 - 1"));
        }
        self.len += 1;
        if index < delivered {
            return Ok(Vec::new());
        }
        self.delivered = Some(index + 1);
        Ok(vec![Event::Push { index, value }])
    }

    fn pop(&mut self, count: u64) -> Result<Vec<Event<T>>, DecodeError> {
        let delivered = self.delivered.ok_or(DecodeError::NoGroup)?;
        if count > self.len {
            return Err(DecodeError::Window(
                "pop of more records than the window holds",
            ));
        }
        let end = self.front + count;
        let mut events = Vec::new();
        let popped = self.front..delivered.min(end);
        if !popped.is_empty() {
            events.push(Event::Pop(popped));
        }
        let skipped = delivered.max(self.front)..end;
        if !skipped.is_empty() {
            events.push(Event::Skip(skipped));
        }
        self.front = end;
        self.len -= count;
        self.delivered = Some(delivered.max(end));
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames grouped as a track would carry them.
    fn groups(frames: &[Frame]) -> Vec<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<Vec<u8>>> = Vec::new();
        for f in frames {
            if f.new_group || out.is_empty() {
                out.push(Vec::new());
            }
            if let Some(g) = out.last_mut() {
                g.push(f.payload.clone());
            }
        }
        out
    }

    fn read(config: DecoderConfig, groups: &[Vec<Vec<u8>>]) -> Vec<Event<u64>> {
        let mut d = Decoder::<u64>::new(config);
        let mut events = Vec::new();
        for g in groups {
            d.start_group();
            for f in g {
                events.extend(d.decode(f).unwrap());
            }
        }
        events
    }

    #[test]
    fn frames_have_the_wire_shapes() {
        let mut e = Encoder::<u64>::new(EncoderConfig::default());
        let f = e.push(&7).unwrap();
        assert_eq!(
            (f.payload.as_slice(), f.new_group),
            (&b"{\"offset\":0,\"records\":[7]}"[..], true)
        );
        let f = e.push(&8).unwrap();
        assert_eq!(
            (f.payload.as_slice(), f.new_group),
            (&b"{\"push\":8}"[..], false)
        );
        let f = e.pop(1).unwrap().unwrap();
        assert_eq!(f.payload, b"{\"pop\":1}");
        assert!(e.pop(0).unwrap().is_none());
        e.resync();
        let f = e.push(&9).unwrap();
        assert_eq!(f.payload, b"{\"offset\":1,\"records\":[8,9]}");
        assert_eq!(e.range(), 1..3);
        let mut c = Encoder::<u64>::new(EncoderConfig {
            checkpoint_records: 2,
            op_ratio: 0,
            ..EncoderConfig::default()
        });
        for n in 0..4 {
            c.push(&n).unwrap();
        }
        c.pop(1).unwrap();
        let f = c.push(&4).unwrap();
        assert_eq!(f.payload, b"{\"offset\":1,\"start\":3,\"records\":[3,4]}");
    }

    #[test]
    fn an_empty_window_moves_forward_to_a_chosen_index() {
        let mut e = Encoder::<u64>::new(EncoderConfig::default());
        e.skip_to(40);
        let f = e.push(&1).unwrap();
        assert_eq!(f.payload, b"{\"offset\":40,\"records\":[1]}");
        // A window with records, or a move backwards, stays as it is.
        e.skip_to(50);
        e.skip_to(3);
        assert_eq!(e.range(), 40..41);
        e.pop(1).unwrap();
        e.skip_to(45);
        let f = e.push(&2).unwrap();
        assert_eq!(
            (f.payload.as_slice(), f.new_group),
            (&b"{\"offset\":45,\"records\":[2]}"[..], true)
        );
        let events = read(DecoderConfig::default(), &[vec![f.payload]]);
        assert_eq!(
            events,
            vec![Event::Push {
                index: 45,
                value: 2
            }]
        );
    }

    #[test]
    fn a_reader_following_every_group_gets_each_record_once() {
        for compression in [false, true] {
            for op_ratio in [0, 1, 8] {
                let mut e = Encoder::<u64>::new(EncoderConfig {
                    compression,
                    op_ratio,
                    checkpoint_records: 5,
                    ..EncoderConfig::default()
                });
                let mut frames = Vec::new();
                for n in 0..60 {
                    frames.push(e.push(&n).unwrap());
                    if n >= 10 {
                        frames.extend(e.pop(1).unwrap());
                    }
                }
                let events = read(
                    DecoderConfig {
                        compression,
                        ..DecoderConfig::default()
                    },
                    &groups(&frames),
                );
                let pushed: Vec<u64> = events
                    .iter()
                    .filter_map(|e| match e {
                        Event::Push { index, value } => {
                            assert_eq!(index, value);
                            Some(*value)
                        }
                        _ => None,
                    })
                    .collect();
                assert_eq!(
                    pushed,
                    (0..60).collect::<Vec<_>>(),
                    "{compression} {op_ratio}"
                );
                let popped: u64 = events
                    .iter()
                    .map(|e| match e {
                        Event::Pop(r) => r.end - r.start,
                        _ => 0,
                    })
                    .sum();
                assert_eq!(popped, 50);
                assert!(!events.iter().any(|e| matches!(e, Event::Skip(_))));
            }
        }
    }

    #[test]
    fn a_late_reader_starts_at_the_last_header_and_is_told_what_it_missed() {
        let mut e = Encoder::<u64>::new(EncoderConfig {
            checkpoint_records: 3,
            ..EncoderConfig::default()
        });
        let mut frames = Vec::new();
        for n in 0..10 {
            frames.push(e.push(&n).unwrap());
        }
        e.resync();
        frames.push(e.push(&10).unwrap());
        let all = groups(&frames);
        let events = read(DecoderConfig::default(), &all[all.len() - 1..]);
        assert_eq!(
            events,
            vec![
                Event::Skip(0..8),
                Event::Push { index: 8, value: 8 },
                Event::Push { index: 9, value: 9 },
                Event::Push {
                    index: 10,
                    value: 10
                },
            ]
        );
    }

    #[test]
    fn groups_roll_on_the_op_budget_and_the_frame_cap() {
        let mut e = Encoder::<u64>::new(EncoderConfig {
            op_ratio: 1,
            ..EncoderConfig::default()
        });
        let new: Vec<bool> = (0..6).map(|n| e.push(&n).unwrap().new_group).collect();
        // Header "{"offset":0,"records":[0]}" is 26 bytes; each push of 11
        // bytes fits while the ops so far are at most 26.
        assert_eq!(new, [true, false, false, false, true, false]);
        let mut e = Encoder::<u64>::new(EncoderConfig {
            max_group_frames: 3,
            ..EncoderConfig::default()
        });
        let new: Vec<bool> = (0..7).map(|n| e.push(&n).unwrap().new_group).collect();
        assert_eq!(new, [true, false, false, true, false, false, true]);
    }

    #[test]
    fn bad_frames_are_refused_and_the_next_group_recovers() {
        let mut d = Decoder::<u64>::new(DecoderConfig {
            max_records: 2,
            ..DecoderConfig::default()
        });
        assert!(matches!(d.decode(b"{}"), Err(DecodeError::NoGroup)));
        d.start_group();
        assert!(d.decode(b"{\"offset\":0,\"records\":[1,2,3]}").is_err());
        assert!(matches!(
            d.decode(b"{\"push\":1}"),
            Err(DecodeError::NoGroup)
        ));
        for bad in [
            &b"{\"offset\":9007199254740992,\"records\":[]}"[..],
            b"{\"offset\":5,\"start\":4,\"records\":[]}",
            b"{\"offset\":0,\"start\":9007199254740991,\"records\":[1]}",
            b"not json",
            b"{\"push\":1}",
        ] {
            d.start_group();
            assert!(d.decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        d.start_group();
        assert_eq!(
            d.decode(b"{\"offset\":4,\"records\":[1]}").unwrap(),
            vec![Event::Push { index: 4, value: 1 }]
        );
        assert!(d.decode(b"{\"pop\":2}").is_err());
        d.start_group();
        assert!(d.decode(b"{\"offset\":3,\"records\":[]}").is_err());
        d.start_group();
        assert_eq!(
            d.decode(b"{\"offset\":5,\"records\":[2]}").unwrap(),
            vec![Event::Pop(4..5), Event::Push { index: 5, value: 2 }]
        );
        let mut z = Decoder::<u64>::new(DecoderConfig {
            compression: true,
            max_frame_bytes: 64,
            ..DecoderConfig::default()
        });
        z.start_group();
        let big = crate::flate::Deflater::new().frame(&[b' '; 1000]).unwrap();
        assert!(matches!(
            z.decode(&big),
            Err(DecodeError::Flate(FlateError::TooLarge(64)))
        ));
        z.start_group();
        assert!(z.decode(b"\x00garbage").is_err());
    }

    #[test]
    fn mutated_frames_never_panic() {
        let mut e = Encoder::<u64>::new(EncoderConfig {
            compression: true,
            ..EncoderConfig::default()
        });
        let frames: Vec<Frame> = (0..20).map(|n| e.push(&n).unwrap()).collect();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..5_000 {
            let mut d = Decoder::<u64>::new(DecoderConfig {
                compression: next() % 2 == 0,
                ..DecoderConfig::default()
            });
            d.start_group();
            for f in &frames {
                let mut bytes = f.payload.clone();
                if !bytes.is_empty() && next() % 4 == 0 {
                    let at = (next() % bytes.len() as u64) as usize;
                    bytes[at] ^= next() as u8 | 1;
                }
                let _ = d.decode(&bytes);
                if next() % 8 == 0 {
                    d.start_group();
                }
            }
        }
    }
}
