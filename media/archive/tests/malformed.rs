//! Malformed timeline frames: every file in `tests/corpus/` is decoded
//! by the window decoder and must give exactly the error listed in
//! [`CASES`], never a panic (README.md there).

use std::path::PathBuf;

use skiff_archive::Record;
use skiff_archive::flate::FlateError;
use skiff_archive::window::{DecodeError, Decoder, DecoderConfig};

/// Which error a file must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A frame with no group begun.
    NoGroup,
    /// Bytes that do not continue the group's DEFLATE stream.
    Corrupt,
    /// A frame inflating past the decoder's bound.
    TooLarge,
    /// A frame that is not the JSON it should be.
    Json,
    /// A frame contradicting the window.
    Window,
}

const CASES: &[(&str, Expect)] = &[
    ("header_not_json.bin", Expect::Json),
    ("op_in_place_of_a_header.bin", Expect::Json),
    ("frame_before_any_group.bin", Expect::NoGroup),
    ("pop_past_the_window.bin", Expect::Window),
    ("header_moves_backwards.bin", Expect::Window),
    ("start_before_offset.bin", Expect::Window),
    ("offset_past_2_53.bin", Expect::Window),
    ("record_of_the_wrong_shape.bin", Expect::Json),
    ("deflate_garbage.bin", Expect::Corrupt),
    ("deflate_past_4_mib.bin", Expect::TooLarge),
    ("deflate_frames_out_of_order.bin", Expect::Corrupt),
];

/// The first error decoding `data` gives (the layout of README.md).
fn first_error(data: &[u8]) -> Option<DecodeError> {
    let (&flags, mut rest) = data.split_first()?;
    let mut d = Decoder::<Record>::new(DecoderConfig {
        compression: flags & 1 == 1,
        ..DecoderConfig::default()
    });
    while rest.len() >= 2 {
        let head = u16::from_be_bytes([rest[0], rest[1]]);
        let len = usize::from(head & 0x7fff).min(rest.len() - 2);
        let (frame, next) = rest[2..].split_at(len);
        rest = next;
        if head & 0x8000 != 0 {
            d.start_group();
        }
        if let Err(e) = d.decode(frame) {
            return Some(e);
        }
    }
    None
}

#[test]
fn every_malformed_file_gives_its_error() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    files.sort();
    let mut listed: Vec<String> = CASES.iter().map(|(n, _)| (*n).to_owned()).collect();
    listed.sort();
    assert_eq!(
        files, listed,
        "every corpus file has a case and every case a file"
    );
    for (name, expect) in CASES {
        let data = std::fs::read(dir.join(name)).unwrap();
        let got = first_error(&data).unwrap_or_else(|| panic!("{name}: no error"));
        let kind = match &got {
            DecodeError::NoGroup => Expect::NoGroup,
            DecodeError::Flate(FlateError::Corrupt | FlateError::Unflushed) => Expect::Corrupt,
            DecodeError::Flate(FlateError::TooLarge(_)) => Expect::TooLarge,
            DecodeError::Json(_) => Expect::Json,
            DecodeError::Window(_) => Expect::Window,
        };
        assert_eq!(kind, *expect, "{name}: {got}");
    }
}
