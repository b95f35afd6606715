//! The timeline as the published crates read and write it: moq-json's window
//! decoder reads this crate's frames into hang's timeline records, this
//! crate's decoder reads moq-json's frames, and both make the same bytes
//! for the same edits (same framing, same DEFLATE stream).

use skiff_archive::window::{Decoder, DecoderConfig, Encoder, EncoderConfig, Event, Frame};
use skiff_archive::{Archive, Range, Record};

/// Segment `n` of a camera: one video group, a few audio groups.
fn record(n: u64) -> Record {
    let mut r = Record::new(n, 1_000 * n, 1_000);
    r.tracks
        .insert("video".into(), vec![Range::new(n + 3, n + 3)]);
    let mut audio = Range::new(50 * n, 50 * n + 49);
    audio.keyframe = !n.is_multiple_of(7);
    r.tracks.insert("audio".into(), vec![audio]);
    r
}

fn to_hang(r: &Record) -> hang::timeline::Record {
    let mut h = hang::timeline::Record::<()>::new(r.segment, r.pts, r.duration);
    for (name, ranges) in &r.tracks {
        let ranges = ranges
            .iter()
            .map(|g| {
                let mut h = hang::timeline::Range::new(g.start, g.end);
                h.keyframe = g.keyframe;
                h
            })
            .collect();
        h.tracks.insert(name.clone(), ranges);
    }
    h
}

/// The edits of a sliding window: push `n`, and past 10 records pop one.
fn edits() -> Vec<(bool, u64)> {
    let mut out = Vec::new();
    for n in 0..80 {
        out.push((true, n));
        if n >= 10 {
            out.push((false, 1));
        }
    }
    out
}

fn ours(compression: bool, op_ratio: u32, checkpoint: usize) -> Vec<Frame> {
    let mut e = Encoder::<Record>::new(EncoderConfig {
        compression,
        op_ratio,
        checkpoint_records: checkpoint,
        ..EncoderConfig::default()
    });
    let mut frames = Vec::new();
    for (push, n) in edits() {
        if push {
            frames.push(e.push(&record(n)).unwrap());
        } else {
            frames.extend(e.pop(n).unwrap());
        }
    }
    frames
}

fn theirs(compression: bool, op_ratio: u32, checkpoint: usize) -> Vec<(Vec<u8>, bool)> {
    let config = moq_json::window::ProducerConfig::default()
        .with_compression(compression)
        .with_op_ratio(op_ratio)
        .with_checkpoint_records(checkpoint);
    let mut e = moq_json::window::Encoder::<hang::timeline::Record>::new(config);
    let mut frames = Vec::new();
    for (push, n) in edits() {
        if push {
            let f = e.push(&to_hang(&record(n))).unwrap();
            frames.push((f.payload.to_vec(), f.keyframe));
            f.commit();
        } else if let Some(f) = e.pop(n).unwrap() {
            frames.push((f.payload.to_vec(), f.keyframe));
            f.commit();
        }
    }
    frames
}

const CASES: [(bool, u32, usize); 5] = [
    (true, 8, 3600),
    (true, 1, 4),
    (true, 0, 3600),
    (false, 8, 3600),
    (false, 2, 3),
];

#[test]
fn moq_json_reads_our_frames_into_hang_records() {
    for (compression, op_ratio, checkpoint) in CASES {
        let frames = ours(compression, op_ratio, checkpoint);
        assert!(frames[0].new_group);
        let config = moq_json::window::ConsumerConfig::default().with_compression(compression);
        let mut decoder = moq_json::window::Decoder::<hang::timeline::Record>::new(config);
        let mut pushed = Vec::new();
        let mut popped = 0;
        let mut i = 0;
        while i < frames.len() {
            let mut group = decoder.group();
            group.decode(&frames[i].payload).unwrap();
            i += 1;
            while i < frames.len() && !frames[i].new_group {
                group.decode(&frames[i].payload).unwrap();
                i += 1;
            }
            while let Some(event) = decoder.next_event() {
                match event {
                    moq_json::window::Event::Push { index, value } => pushed.push((index, value)),
                    moq_json::window::Event::Pop(r) => popped += r.end - r.start,
                    other => panic!("{other:?}"),
                }
            }
        }
        let want: Vec<(u64, hang::timeline::Record)> =
            (0..80).map(|n| (n, to_hang(&record(n)))).collect();
        assert_eq!(pushed, want, "{compression} {op_ratio} {checkpoint}");
        assert_eq!(popped, 70);
    }
}

#[test]
fn we_read_moq_json_frames() {
    for (compression, op_ratio, checkpoint) in CASES {
        let frames = theirs(compression, op_ratio, checkpoint);
        let mut d = Decoder::<Record>::new(DecoderConfig {
            compression,
            ..DecoderConfig::default()
        });
        let mut pushed = Vec::new();
        let mut popped = 0;
        for (payload, keyframe) in &frames {
            if *keyframe {
                d.start_group();
            }
            for event in d.decode(payload).unwrap() {
                match event {
                    Event::Push { index, value } => pushed.push((index, value)),
                    Event::Pop(r) => popped += r.end - r.start,
                    Event::Skip(r) => panic!("skip {r:?}"),
                }
            }
        }
        let want: Vec<(u64, Record)> = (0..80).map(|n| (n, record(n))).collect();
        assert_eq!(pushed, want, "{compression} {op_ratio} {checkpoint}");
        assert_eq!(popped, 70);
        // A reader joining at the last header gets what it restates.
        let last = frames.iter().rposition(|(_, k)| *k).unwrap();
        let mut late = Decoder::<Record>::new(DecoderConfig {
            compression,
            ..DecoderConfig::default()
        });
        late.start_group();
        let mut got = Vec::new();
        for (payload, _) in &frames[last..] {
            got.extend(late.decode(payload).unwrap());
        }
        assert_eq!(late.range(), 70..80);
        let last_push = got.iter().rev().find_map(|e| match e {
            Event::Push { index, .. } => Some(*index),
            _ => None,
        });
        assert_eq!(last_push, Some(79));
    }
}

#[test]
fn same_edits_same_bytes() {
    // Plain numbers serialize the same through both encoders, so the
    // framing decisions and the DEFLATE stream can be compared byte for byte.
    for (compression, op_ratio, checkpoint) in CASES {
        let config = moq_json::window::ProducerConfig::default()
            .with_compression(compression)
            .with_op_ratio(op_ratio)
            .with_checkpoint_records(checkpoint);
        let mut theirs = moq_json::window::Encoder::<u64>::new(config);
        let mut ours = Encoder::<u64>::new(EncoderConfig {
            compression,
            op_ratio,
            checkpoint_records: checkpoint,
            ..EncoderConfig::default()
        });
        for (push, n) in edits() {
            if push {
                let t = theirs.push(&(n * 1_000_003)).unwrap();
                let o = ours.push(&(n * 1_000_003)).unwrap();
                assert_eq!(
                    (o.payload.as_slice(), o.new_group),
                    (&t.payload[..], t.keyframe)
                );
                t.commit();
            } else {
                let t = theirs.pop(n).unwrap().unwrap();
                let o = ours.pop(n).unwrap().unwrap();
                assert_eq!(
                    (o.payload.as_slice(), o.new_group),
                    (&t.payload[..], t.keyframe)
                );
                t.commit();
            }
        }
        assert_eq!(ours.range(), theirs.range());
    }
}

#[test]
fn flate_slices_match_moq_flate() {
    let frames: Vec<Vec<u8>> = (0..50)
        .map(|n| serde_json::to_vec(&record(n)).unwrap())
        .collect();
    let mut theirs = moq_flate::Encoder::new();
    let mut ours = skiff_archive::flate::Deflater::new();
    let mut inflate = moq_flate::Decoder::new();
    for f in &frames {
        let o = ours.frame(f).unwrap();
        assert_eq!(o, theirs.frame(f).to_vec());
        assert_eq!(inflate.frame(&o).unwrap().to_vec(), *f);
    }
}

#[test]
fn the_archive_entry_parses_as_hangs_and_names_the_replay_broadcast() {
    let mut a = Archive::new(skiff_archive::TIMELINE_TRACK);
    a.duration_max = Some(2_000);
    a.replay = Some("./replay".into());
    let catalog = format!(r#"{{"archive":{}}}"#, serde_json::to_string(&a).unwrap());
    let parsed: hang::Catalog = hang::Catalog::from_slice(catalog.as_bytes()).unwrap();
    let archive = parsed.archive.expect("archive entry");
    assert_eq!(archive.track, hang::timeline::DEFAULT_NAME);
    assert_eq!(archive.timescale, 1000);
    assert_eq!(archive.duration_max, Some(2_000));
    let replay = archive.replay.clone().expect("replay");
    let base = moq_net::Path::new("anon/cam.hang/replay");
    assert_eq!(base.resolve(&replay).as_str(), "anon/cam.hang/replay");
    // And hang's own entry reads back as ours.
    let back: Archive = serde_json::from_str(&serde_json::to_string(&archive).unwrap()).unwrap();
    assert_eq!(back.track, a.track);
    assert_eq!(back.duration_max, a.duration_max);
}
