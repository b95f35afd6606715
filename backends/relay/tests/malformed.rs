//! Malformed-input corpus of the relay: every file in `tests/corpus/` is
//! decoded by the decoder its name names and must give exactly the error
//! listed in [`CASES`], never a panic (README.md there).

use std::fs;
use std::path::PathBuf;

use skiff_relay::proxy_protocol::{HeaderError, decode};

/// Which error a PROXY header file must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A version 1 header that does not parse.
    V1,
    /// A version 2 header that does not parse.
    V2,
    /// A header longer than the relay reads.
    TooLong,
    /// No PROXY header at all.
    Missing,
}

const CASES: &[(&str, Expect)] = &[
    ("proxy_v1_address_out_of_range.bin", Expect::V1),
    ("proxy_v1_port_leading_zero.bin", Expect::V1),
    ("proxy_v1_unknown_protocol.bin", Expect::V1),
    ("proxy_v1_bare_newline.bin", Expect::V1),
    ("proxy_v1_no_line_end.bin", Expect::V1),
    ("proxy_v2_version_3.bin", Expect::V2),
    ("proxy_v2_command_2.bin", Expect::V2),
    ("proxy_v2_family_4.bin", Expect::V2),
    ("proxy_v2_length_short_of_addresses.bin", Expect::V2),
    ("proxy_v2_length_over_limit.bin", Expect::TooLong),
    ("proxy_not_a_header.bin", Expect::Missing),
];

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn kind(e: &HeaderError) -> Expect {
    match e {
        HeaderError::V1(_) => Expect::V1,
        HeaderError::V2(_) => Expect::V2,
        HeaderError::TooLong => Expect::TooLong,
        HeaderError::Missing => Expect::Missing,
        other => panic!("an error the corpus does not know: {other}"),
    }
}

#[test]
fn every_corpus_file_gives_its_error() {
    for (name, expect) in CASES {
        let bytes = fs::read(corpus().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        match decode(&bytes) {
            Err(e) => assert_eq!(kind(&e), *expect, "{name}: {e}"),
            Ok(h) => panic!("{name}: decoded as {h:?}, expected {expect:?}"),
        }
    }
}

#[test]
fn every_corpus_file_is_listed() {
    for entry in fs::read_dir(corpus()).expect("corpus directory") {
        let name = entry.expect("entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".bin") {
            assert!(
                CASES.iter().any(|(n, _)| *n == name),
                "{name} has no expected error"
            );
        }
    }
}
