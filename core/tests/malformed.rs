//! Malformed-input corpus: every file in `tests/corpus/` is decoded with the decoder
//! its entry in [`CASES`] names and must give exactly the typed error listed there,
//! never a panic; connection-level files are fed to a [`Connection`], which must end
//! closed by a transport close with code 1002 and the listed violation.
//! `tests/corpus/README.md` describes every file and how the test uses it.

use std::fs;
use std::path::PathBuf;

use skiff_core::conn::{CloseCause, Config, Connection, Event};
use skiff_core::hang::frame::{self as hang_frame, FrameError};
use skiff_core::model::frame::Header;
use skiff_core::time::Instant;
use skiff_core::wire::lite::{
    self, Announce, AnnounceRequest, BidiStreamType, Goaway, Group, Probe, Setup, Subscribe,
    SubscribeResponse, Track, TrackInfo, UniStreamType, decode_message, encode_message,
    message_len,
};
use skiff_core::wire::qmux::{
    Frame, Record, Side, TransportError, TransportParams, VIOLATION_CODE, frame,
};
use skiff_core::wire::{DecodeError, Reader, Writer};

// ---- manifest ----

/// Which moq-lite decoder a file is for.
#[derive(Debug, Clone, Copy)]
enum Msg {
    AnnounceRequest,
    Announce,
    Setup,
    Track,
    Subscribe,
    TrackInfo,
    Probe,
    Group,
    Goaway,
    /// `SubscribeResponse::decode` (type outside the length).
    SubscribeResponse,
    UniStreamType,
    BidiStreamType,
    /// The moq-lite datagram body, `lite::Datagram::decode`.
    Datagram,
    /// `model::frame::Header::decode` after a frame at 0, payloads up to 1024 bytes.
    FrameHeader,
}

/// What a file must do.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// `Record::decode(_, 16382)`, then the record's frames: the first error.
    Record(DecodeError),
    /// `TransportParams::decode` of the whole file (a parameter block).
    Params(DecodeError),
    /// A moq-lite decoder on the whole file.
    Lite(Msg, DecodeError),
    /// Received by a connection of this side (after the peer's V1 parameters record
    /// if `HANDSHAKE`): it ends with a 1002 transport close for this violation.
    Conn(Side, bool, TransportError),
    /// The file is a parameter block sent as the peer's first QX_TRANSPORT_PARAMETERS
    /// to a server: it ends with a 1002 transport close for this violation.
    ConnParams(TransportError),
    /// A fuzzer finding that decodes fine but does not survive a round trip; see
    /// `known_issue_max_age_saturation_round_trip`.
    KnownIssue(Msg),
    /// `hang::frame::decode` of the whole file (a legacy media payload).
    Hang(FrameError),
}

/// The connection first receives the peer's valid parameters (docs/protocol.md §6 V1).
const HANDSHAKE: bool = true;
/// The file is the first thing the connection receives.
const FIRST: bool = false;

/// Every corpus file and what it must do.
const CASES: &[(&str, &[Check])] = &[
    (
        "record_size_truncated_varint.bin",
        &[Check::Record(DecodeError::Incomplete)],
    ),
    (
        "record_size_16383_over_limit.bin",
        &[
            Check::Record(DecodeError::TooLarge),
            Check::Conn(Side::Server, FIRST, TransportError::FrameTooLarge),
        ],
    ),
    (
        "record_size_8_byte_varint_max.bin",
        &[
            Check::Record(DecodeError::TooLarge),
            Check::Conn(Side::Client, FIRST, TransportError::FrameTooLarge),
        ],
    ),
    (
        "frame_max_data_truncated_varint.bin",
        &[
            Check::Record(DecodeError::ShortBody),
            Check::Conn(Side::Server, HANDSHAKE, TransportError::ShortFrame),
        ],
    ),
    (
        "frame_ack_0x02.bin",
        &[
            Check::Record(DecodeError::UnknownType(0x02)),
            Check::Conn(
                Side::Server,
                HANDSHAKE,
                TransportError::InvalidFrameType(0x02),
            ),
        ],
    ),
    (
        "frame_reset_stream_at_0x24.bin",
        &[
            Check::Record(DecodeError::UnknownType(0x24)),
            Check::Conn(
                Side::Client,
                HANDSHAKE,
                TransportError::InvalidFrameType(0x24),
            ),
        ],
    ),
    (
        "frame_stream_overruns_record.bin",
        &[
            Check::Record(DecodeError::ShortBody),
            Check::Conn(Side::Server, HANDSHAKE, TransportError::ShortFrame),
        ],
    ),
    (
        "frame_close_reason_overruns_record.bin",
        &[
            Check::Record(DecodeError::ShortBody),
            Check::Conn(Side::Server, HANDSHAKE, TransportError::ShortFrame),
        ],
    ),
    (
        "frame_params_overrun_record.bin",
        &[
            Check::Record(DecodeError::ShortBody),
            Check::Conn(Side::Server, FIRST, TransportError::ShortFrame),
        ],
    ),
    (
        "conn_stream_on_server_uni_3.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::InvalidStreamId,
        )],
    ),
    (
        "conn_stream_on_client_uni_2.bin",
        &[Check::Conn(
            Side::Client,
            HANDSHAKE,
            TransportError::InvalidStreamId,
        )],
    ),
    (
        "conn_stream_on_unopened_server_bidi_1.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::InvalidStreamId,
        )],
    ),
    (
        "conn_stream_index_4_over_grant.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::StreamLimit,
        )],
    ),
    (
        "conn_stream_data_past_stream_credit.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::FlowControl,
        )],
    ),
    (
        "conn_stream_data_past_connection_credit.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::FlowControl,
        )],
    ),
    (
        "conn_max_data_decreasing.bin",
        &[Check::Conn(
            Side::Client,
            HANDSHAKE,
            TransportError::FlowControl,
        )],
    ),
    (
        "conn_datagram_not_advertised.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::DatagramsUnsupported,
        )],
    ),
    (
        "conn_second_transport_parameters.bin",
        &[Check::Conn(
            Side::Server,
            HANDSHAKE,
            TransportError::ProtocolViolation,
        )],
    ),
    (
        "params_duplicate_initial_max_data.bin",
        &[
            Check::Params(DecodeError::Duplicate),
            Check::ConnParams(TransportError::DuplicateParameter),
        ],
    ),
    (
        "params_duplicate_application_protocols.bin",
        &[
            Check::Params(DecodeError::Duplicate),
            Check::ConnParams(TransportError::DuplicateParameter),
        ],
    ),
    (
        "params_forbidden_original_dcid_0x00.bin",
        &[
            Check::Params(DecodeError::InvalidValue),
            Check::ConnParams(TransportError::TransportParameter),
        ],
    ),
    (
        "params_forbidden_stateless_reset_token_0x02.bin",
        &[
            Check::Params(DecodeError::InvalidValue),
            Check::ConnParams(TransportError::TransportParameter),
        ],
    ),
    (
        "params_forbidden_disable_active_migration_0x0c.bin",
        &[
            Check::Params(DecodeError::InvalidValue),
            Check::ConnParams(TransportError::TransportParameter),
        ],
    ),
    (
        "params_max_record_size_100.bin",
        &[
            Check::Params(DecodeError::InvalidValue),
            Check::ConnParams(TransportError::TransportParameter),
        ],
    ),
    (
        "params_reset_stream_at_not_empty.bin",
        &[Check::Params(DecodeError::InvalidValue)],
    ),
    (
        "params_empty_protocol_list.bin",
        &[Check::Params(DecodeError::InvalidValue)],
    ),
    (
        "params_protocol_name_not_utf8.bin",
        &[Check::Params(DecodeError::InvalidUtf8)],
    ),
    (
        "params_value_truncated_varint.bin",
        &[
            Check::Params(DecodeError::ShortBody),
            Check::ConnParams(TransportError::ShortFrame),
        ],
    ),
    (
        "params_length_past_block.bin",
        &[Check::Params(DecodeError::ShortBody)],
    ),
    (
        "params_integer_short_of_len.bin",
        &[Check::Params(DecodeError::TrailingBytes)],
    ),
    (
        "lite_length_truncated_varint.bin",
        &[Check::Lite(Msg::AnnounceRequest, DecodeError::Incomplete)],
    ),
    (
        "lite_announce_request_truncated_varint.bin",
        &[Check::Lite(Msg::AnnounceRequest, DecodeError::ShortBody)],
    ),
    (
        "lite_announce_length_over_64mib.bin",
        &[Check::Lite(Msg::Announce, DecodeError::TooLarge)],
    ),
    (
        "lite_subscribe_length_over_64mib.bin",
        &[Check::Lite(Msg::Subscribe, DecodeError::TooLarge)],
    ),
    (
        "lite_announce_33_hops.bin",
        &[Check::Lite(Msg::Announce, DecodeError::TooLarge)],
    ),
    (
        "lite_announce_duplicate_hop.bin",
        &[Check::Lite(Msg::Announce, DecodeError::Duplicate)],
    ),
    (
        "lite_announce_status_3.bin",
        &[Check::Lite(Msg::Announce, DecodeError::InvalidValue)],
    ),
    (
        "lite_setup_length_over_64kib.bin",
        &[Check::Lite(Msg::Setup, DecodeError::TooLarge)],
    ),
    (
        "lite_setup_65_params.bin",
        &[Check::Lite(Msg::Setup, DecodeError::TooLarge)],
    ),
    (
        "lite_setup_duplicate_probe.bin",
        &[Check::Lite(Msg::Setup, DecodeError::Duplicate)],
    ),
    (
        "lite_setup_duplicate_unknown_id.bin",
        &[Check::Lite(Msg::Setup, DecodeError::Duplicate)],
    ),
    (
        "lite_setup_probe_not_one_varint.bin",
        &[Check::Lite(Msg::Setup, DecodeError::InvalidValue)],
    ),
    (
        "lite_setup_path_not_utf8.bin",
        &[Check::Lite(Msg::Setup, DecodeError::InvalidUtf8)],
    ),
    (
        "lite_setup_param_past_body.bin",
        &[Check::Lite(Msg::Setup, DecodeError::ShortBody)],
    ),
    (
        "lite_track_string_past_body.bin",
        &[Check::Lite(Msg::Track, DecodeError::ShortBody)],
    ),
    (
        "lite_track_string_not_utf8.bin",
        &[Check::Lite(Msg::Track, DecodeError::InvalidUtf8)],
    ),
    (
        "lite_subscribe_string_past_body.bin",
        &[Check::Lite(Msg::Subscribe, DecodeError::ShortBody)],
    ),
    (
        "lite_track_info_timescale_0.bin",
        &[Check::Lite(Msg::TrackInfo, DecodeError::InvalidValue)],
    ),
    (
        "lite_probe_trailing_bytes.bin",
        &[Check::Lite(Msg::Probe, DecodeError::TrailingBytes)],
    ),
    (
        "lite_group_short_body.bin",
        &[Check::Lite(Msg::Group, DecodeError::ShortBody)],
    ),
    (
        "lite_goaway_uri_8193.bin",
        &[Check::Lite(Msg::Goaway, DecodeError::TooLarge)],
    ),
    (
        "lite_goaway_length_8195.bin",
        &[Check::Lite(Msg::Goaway, DecodeError::TooLarge)],
    ),
    (
        "lite_subscribe_response_type_3.bin",
        &[Check::Lite(
            Msg::SubscribeResponse,
            DecodeError::UnknownType(3),
        )],
    ),
    (
        "lite_subscribe_response_start_length_9.bin",
        &[Check::Lite(Msg::SubscribeResponse, DecodeError::TooLarge)],
    ),
    (
        "lite_subscribe_response_drop_truncated_varint.bin",
        &[Check::Lite(Msg::SubscribeResponse, DecodeError::ShortBody)],
    ),
    (
        "lite_uni_stream_type_2.bin",
        &[Check::Lite(Msg::UniStreamType, DecodeError::UnknownType(2))],
    ),
    (
        "lite_bidi_stream_type_0.bin",
        &[Check::Lite(
            Msg::BidiStreamType,
            DecodeError::UnknownType(0),
        )],
    ),
    (
        "lite_datagram_truncated_header.bin",
        &[Check::Lite(Msg::Datagram, DecodeError::ShortBody)],
    ),
    (
        "frame_header_truncated_varint.bin",
        &[Check::Lite(Msg::FrameHeader, DecodeError::Incomplete)],
    ),
    (
        "frame_header_payload_1025_over_1024.bin",
        &[Check::Lite(Msg::FrameHeader, DecodeError::TooLarge)],
    ),
    (
        "frame_header_timestamp_below_zero.bin",
        &[Check::Lite(Msg::FrameHeader, DecodeError::InvalidValue)],
    ),
    (
        "known_trackinfo_max_age_saturates.bin",
        &[Check::KnownIssue(Msg::TrackInfo)],
    ),
    (
        "hang_frame_empty.bin",
        &[Check::Hang(FrameError::Truncated)],
    ),
    (
        "hang_frame_truncated_varint.bin",
        &[Check::Hang(FrameError::Truncated)],
    ),
    (
        "hang_frame_timestamp_2_53.bin",
        &[Check::Hang(FrameError::TimestampTooLarge)],
    ),
];

// ---- harness ----

/// docs/protocol.md §6 V1: moq-dev's parameters record, valid for either side.
const V1: &[u8] = &[
    0x40, 0x54, 0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x40, 0x4a, 0x01, 0x04, 0x80, 0x00,
    0x75, 0x30, 0x04, 0x04, 0x80, 0x10, 0x00, 0x00, 0x05, 0x04, 0x80, 0x04, 0x00, 0x00, 0x06, 0x04,
    0x80, 0x04, 0x00, 0x00, 0x07, 0x04, 0x80, 0x04, 0x00, 0x00, 0x08, 0x02, 0x67, 0x10, 0x09, 0x02,
    0x67, 0x10, 0x20, 0x02, 0x7f, 0xfe, 0xc5, 0x71, 0xc5, 0x94, 0x29, 0xcd, 0x08, 0x45, 0x02, 0x7f,
    0xfe, 0xfd, 0x4f, 0x9c, 0x2a, 0x8b, 0x1e, 0x60, 0x75, 0x0c, 0x0b, 0x6d, 0x6f, 0x71, 0x2d, 0x6c,
    0x69, 0x74, 0x65, 0x2d, 0x30, 0x35,
];

/// Stream table size of the tested connections: 4 bidi and 4 uni streams granted.
const SLOTS: usize = 16;

/// Small windows, so the flow-control files stay small: 2048 bytes per connection,
/// 1024 per stream.
const fn config() -> Config {
    Config {
        max_data: 2048,
        max_stream_data_bidi_local: 1024,
        max_stream_data_bidi_remote: 1024,
        max_stream_data_uni: 1024,
        // Strict connection accounting, so data past `max_data` is a violation.
        connection_credit_on_receipt: false,
        stream_refs: false,
        ..Config::new()
    }
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn read(name: &str) -> Vec<u8> {
    fs::read(corpus_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `Record::decode` and then the frames of the record: the first error, if any.
fn record(b: &[u8]) -> Result<(), DecodeError> {
    let rec = Record::decode(b, 16382)?;
    for f in rec.frames() {
        f?;
    }
    Ok(())
}

/// The moq-lite decoder `msg` on `b`, its value dropped.
fn lite(msg: Msg, b: &[u8]) -> Result<(), DecodeError> {
    match msg {
        Msg::AnnounceRequest => decode_message::<AnnounceRequest<'_>>(b).map(drop),
        Msg::Announce => decode_message::<Announce<'_>>(b).map(drop),
        Msg::Setup => decode_message::<Setup<'_>>(b).map(drop),
        Msg::Track => decode_message::<Track<'_>>(b).map(drop),
        Msg::Subscribe => decode_message::<Subscribe<'_>>(b).map(drop),
        Msg::TrackInfo => decode_message::<TrackInfo>(b).map(drop),
        Msg::Probe => decode_message::<Probe>(b).map(drop),
        Msg::Group => decode_message::<Group>(b).map(drop),
        Msg::Goaway => decode_message::<Goaway<'_>>(b).map(drop),
        Msg::SubscribeResponse => SubscribeResponse::decode(b).map(drop),
        Msg::UniStreamType => UniStreamType::decode(b).map(drop),
        Msg::BidiStreamType => BidiStreamType::decode(b).map(drop),
        Msg::Datagram => lite::Datagram::decode(b).map(drop),
        Msg::FrameHeader => Header::decode(&mut Reader::new(b), 0, 1024).map(drop),
    }
}

/// `block` as the body of a one-frame QX_TRANSPORT_PARAMETERS record.
fn params_record(block: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; block.len() + 16];
    let mut w = Writer::new(&mut frame);
    w.varint(frame::QX_TRANSPORT_PARAMETERS).unwrap();
    w.varint(block.len() as u64).unwrap();
    w.bytes(block).unwrap();
    let n = w.position();
    let mut rec = vec![0u8; n + 8];
    let mut w = Writer::new(&mut rec);
    w.varint(n as u64).unwrap();
    w.bytes(&frame[..n]).unwrap();
    let len = w.position();
    rec.truncate(len);
    rec
}

/// Everything `poll_transmit` has to write.
fn drain(conn: &mut Connection<SLOTS>, now: Instant) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let n = conn.poll_transmit(now, &mut buf);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Feeds `input` to a fresh connection `chunk` bytes at a time and returns the
/// closes it reported and everything it wrote after its parameters.
fn run_conn(side: Side, input: &[u8], chunk: usize) -> (Vec<(u64, bool, CloseCause)>, Vec<u8>) {
    let now = Instant::from_micros(1_000_000);
    let mut conn = Connection::<SLOTS>::new(side, config(), now).unwrap();
    let _params = drain(&mut conn, now);
    let mut closes = Vec::new();
    let mut inbox = Vec::new();
    for piece in input.chunks(chunk) {
        inbox.extend_from_slice(piece);
        for _ in 0..1000 {
            let step = conn.handle_input(now, &inbox);
            let consumed = step.consumed;
            let event = step.event.map(|e| match e {
                Event::Closed(c) => Some((c.code, c.application, c.cause)),
                _ => None,
            });
            inbox.drain(..consumed);
            match event {
                None => break,
                Some(Some(close)) => closes.push(close),
                Some(None) => {}
            }
        }
    }
    assert!(conn.is_closed(), "connection still open");
    let sent = drain(&mut conn, now);
    assert!(conn.is_drained());
    (closes, sent)
}

/// Checks a connection fed `input` closes for `error` with a 1002 transport close, whole or in pieces.
fn expect_violation(name: &str, side: Side, input: &[u8], error: TransportError) {
    for chunk in [input.len().max(1), 1, 7] {
        let (closes, sent) = run_conn(side, input, chunk);
        assert_eq!(
            closes,
            [(VIOLATION_CODE, false, CloseCause::Violation(error))],
            "{name} ({side:?}, chunks of {chunk})"
        );
        // The one record sent is the transport close: code 1002, frame type 0, the reason text.
        let rec = Record::decode(&sent, 16382).unwrap();
        assert_eq!(rec.len, sent.len(), "{name}: more than the close was sent");
        let frames: Vec<Frame<'_>> = rec.frames().map(Result::unwrap).collect();
        assert_eq!(frames, [error.close_frame()], "{name}: close frame");
        assert_eq!(error.code(), 1002);
    }
}

// ---- tests ----

#[test]
fn every_file_has_an_entry_and_every_entry_a_file() {
    let mut files: Vec<String> = fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    files.sort();
    let mut names: Vec<String> = CASES.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(files, names);
    let readme = fs::read_to_string(corpus_dir().join("README.md")).unwrap();
    for (name, checks) in CASES {
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} missing from README.md"
        );
        assert!(!checks.is_empty(), "{name} checks nothing");
    }
}

#[test]
fn decoders_return_the_listed_error() {
    for (name, checks) in CASES {
        let b = read(name);
        for check in *checks {
            let got = match *check {
                Check::Record(want) => (record(&b), want),
                Check::Params(want) => (TransportParams::decode(&b).map(drop), want),
                Check::Lite(msg, want) => (lite(msg, &b), want),
                Check::Hang(want) => {
                    assert_eq!(hang_frame::decode(&b).map(drop), Err(want), "{name}");
                    continue;
                }
                Check::Conn(..) | Check::ConnParams(_) | Check::KnownIssue(_) => continue,
            };
            assert_eq!(got.0, Err(got.1), "{name}");
        }
    }
}

#[test]
fn connection_closes_with_a_1002_transport_close() {
    for (name, checks) in CASES {
        let b = read(name);
        for check in *checks {
            match *check {
                Check::Conn(side, handshake, error) => {
                    let mut input = if handshake { V1.to_vec() } else { Vec::new() };
                    input.extend_from_slice(&b);
                    expect_violation(name, side, &input, error);
                }
                Check::ConnParams(error) => {
                    expect_violation(name, Side::Server, &params_record(&b), error);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn known_issue_files_decode() {
    for (name, checks) in CASES {
        for check in *checks {
            if let Check::KnownIssue(msg) = *check {
                assert_eq!(lite(msg, &read(name)), Ok(()), "{name}");
            }
        }
    }
}

/// Fuzzer finding (`lite_messages`): a `Dur(i)` above 18446744073709551 ms
/// saturates to the largest whole number of milliseconds, so a round trip keeps
/// the value (`Duration::MAX` itself is not whole milliseconds).
#[test]
fn max_age_saturation_round_trips() {
    let b = read("known_trackinfo_max_age_saturates.bin");
    let (info, _) = decode_message::<TrackInfo>(&b).unwrap();
    let mut out = vec![0u8; message_len(&info).unwrap()];
    encode_message(&info, &mut out).unwrap();
    let (again, _) = decode_message::<TrackInfo>(&out).unwrap();
    assert_eq!(again, info);
}
