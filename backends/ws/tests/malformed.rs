//! Malformed-input corpus of the WebSocket binding: every file in
//! `tests/corpus/` is decoded by the decoder its name names and must give
//! exactly the error listed in [`CASES`], never a panic (README.md there).

use std::fs;
use std::path::PathBuf;

use skiff_ws::frame::{Decoder, FrameError, Role};
use skiff_ws::http::{self, RequestError};

/// What a file must give.
enum Expect {
    /// The frame decoder (as a server) fails with this error.
    Frame(FrameError),
    /// The request head is refused with this status.
    Http(u16),
}

const CASES: &[(&str, Expect)] = &[
    ("frame_text_message.bin", Expect::Frame(FrameError::Text)),
    (
        "frame_unmasked_from_client.bin",
        Expect::Frame(FrameError::Protocol("client frame not masked")),
    ),
    (
        "frame_message_16383_over_limit.bin",
        Expect::Frame(FrameError::TooBig(16382)),
    ),
    (
        "frame_continuation_without_message.bin",
        Expect::Frame(FrameError::Protocol("continuation without a message")),
    ),
    (
        "frame_ping_fragmented.bin",
        Expect::Frame(FrameError::Protocol("control frame fragmented or too long")),
    ),
    (
        "frame_ping_126_bytes.bin",
        Expect::Frame(FrameError::Protocol("control frame fragmented or too long")),
    ),
    (
        "frame_reserved_opcode_3.bin",
        Expect::Frame(FrameError::Protocol("reserved opcode")),
    ),
    (
        "frame_rsv1_set.bin",
        Expect::Frame(FrameError::Protocol("reserved bits set")),
    ),
    (
        "frame_close_one_byte.bin",
        Expect::Frame(FrameError::Protocol("close payload of one byte")),
    ),
    (
        "frame_binary_inside_fragmented.bin",
        Expect::Frame(FrameError::Protocol("new message inside a fragmented one")),
    ),
    (
        "frame_fragments_over_limit.bin",
        Expect::Frame(FrameError::TooBig(16382)),
    ),
    // Found by the ws_frames fuzz target: a continuation whose 64-bit length
    // overflowed the message total.
    (
        "frame_continuation_length_overflow.bin",
        Expect::Frame(FrameError::TooBig(16382)),
    ),
    ("http_head_over_8k.bin", Expect::Http(431)),
    ("http_target_not_a_path.bin", Expect::Http(400)),
    ("http_method_with_nul.bin", Expect::Http(400)),
    ("http_upgrade_post.bin", Expect::Http(400)),
    ("http_upgrade_version_12.bin", Expect::Http(426)),
    ("http_upgrade_two_keys.bin", Expect::Http(400)),
    ("http_upgrade_without_connection.bin", Expect::Http(400)),
    ("http_upgrade_http10.bin", Expect::Http(400)),
];

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

#[test]
fn every_file_gives_its_error() {
    for (name, expect) in CASES {
        let data = fs::read(corpus().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        match expect {
            Expect::Frame(want) => {
                // Whole and byte by byte: the same error.
                for step in [data.len(), 1] {
                    let mut d = Decoder::new(Role::Server, 16382, 1024);
                    let got = data.chunks(step).find_map(|c| d.feed(c).err());
                    assert_eq!(got.as_ref(), Some(want), "{name} (step {step})");
                }
            }
            Expect::Http(status) => {
                let got = http::parse_request(&data).map_err(|e: RequestError| e.status());
                assert_eq!(got.err(), Some(*status), "{name}");
            }
        }
    }
}

#[test]
fn every_file_is_listed() {
    for entry in fs::read_dir(corpus()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".bin") {
            assert!(
                CASES.iter().any(|(n, _)| *n == name),
                "{name} is not in CASES"
            );
        }
    }
}
