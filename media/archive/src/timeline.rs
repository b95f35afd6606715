//! A reader's copy of a timeline track: the records currently in its
//! window, kept from the [`Event`]s its frames give, and looked up
//! by content time (which groups hold time T on each track).

use std::collections::VecDeque;

use crate::Record;
use crate::window::{DecodeError, Decoder, DecoderConfig, Event};

/// The records of a timeline track as read so far, oldest first, at most
/// [`DecoderConfig::max_records`] of them (the oldest go first past it).
#[derive(Debug)]
pub struct Timeline {
    decoder: Decoder<Record>,
    /// (window index, record), oldest first.
    records: VecDeque<(u64, Record)>,
    max_records: usize,
}

impl Timeline {
    /// An empty timeline read with `config` (`compression` for a `.z` track).
    pub fn new(config: DecoderConfig) -> Timeline {
        let max_records = config.max_records.max(1);
        Timeline {
            decoder: Decoder::new(config),
            records: VecDeque::new(),
            max_records,
        }
    }

    /// A new moq-lite group of the track begins.
    pub fn start_group(&mut self) {
        self.decoder.start_group();
    }

    /// Reads the next frame of the current group; returns the records it
    /// added.
    ///
    /// # Errors
    /// As [`Decoder::decode`]: the frames after it in its group are refused
    /// too; the records read so far stay.
    pub fn decode(&mut self, payload: &[u8]) -> Result<usize, DecodeError> {
        let mut added = 0;
        for event in self.decoder.decode(payload)? {
            match event {
                Event::Push { index, value } => {
                    self.records.push_back((index, value));
                    added += 1;
                    if self.records.len() > self.max_records {
                        self.records.pop_front();
                    }
                }
                Event::Pop(gone) | Event::Skip(gone) => {
                    while self.records.front().is_some_and(|(i, _)| gone.contains(i)) {
                        self.records.pop_front();
                    }
                }
            }
        }
        Ok(added)
    }

    /// The records in the window, oldest first.
    pub fn records(&self) -> impl DoubleEndedIterator<Item = &Record> + Clone {
        self.records.iter().map(|(_, r)| r)
    }

    /// The record whose span holds content time `pts` (in the archive's
    /// timescale), if one does.
    pub fn at(&self, pts: u64) -> Option<&Record> {
        // Records are in content-time order: the last one starting at or
        // before `pts` is the only candidate.
        let after = self.records.partition_point(|(_, r)| r.pts <= pts);
        let (_, r) = self.records.get(after.checked_sub(1)?)?;
        (pts < r.pts.saturating_add(r.duration)).then_some(r)
    }

    /// The window's indices as read: the oldest, and one past the newest.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.decoder.range()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Range;
    use crate::window::{Encoder, EncoderConfig};

    fn record(n: u64) -> Record {
        let mut r = Record::new(n, 1_000 * n, 1_000);
        r.tracks
            .insert("video".into(), vec![Range::new(n + 5, n + 5)]);
        r
    }

    #[test]
    fn the_window_is_kept_and_looked_up_by_time() {
        let mut e = Encoder::<Record>::new(EncoderConfig {
            compression: true,
            op_ratio: 1,
            ..EncoderConfig::default()
        });
        let mut t = Timeline::new(DecoderConfig {
            compression: true,
            max_records: 4,
            ..DecoderConfig::default()
        });
        let feed = |t: &mut Timeline, f: crate::window::Frame| {
            if f.new_group {
                t.start_group();
            }
            t.decode(&f.payload).unwrap()
        };
        for n in 0..6 {
            let f = e.push(&record(n)).unwrap();
            assert_eq!(feed(&mut t, f), 1);
        }
        // At most four kept: 2..=5.
        let kept: Vec<u64> = t.records().map(|r| r.segment).collect();
        assert_eq!(kept, [2, 3, 4, 5]);
        let f = e.pop(3).unwrap().unwrap();
        feed(&mut t, f);
        let kept: Vec<u64> = t.records().map(|r| r.segment).collect();
        assert_eq!(kept, [3, 4, 5]);
        assert_eq!(t.range(), 3..6);
        assert_eq!(t.at(4_500).map(|r| r.tracks["video"][0].start), Some(9));
        assert_eq!(t.at(3_000).map(|r| r.segment), Some(3));
        assert!(t.at(2_999).is_none());
        assert!(t.at(6_000).is_none());
    }
}
