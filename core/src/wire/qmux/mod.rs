//! QMux (qmux-01) wire format: records, frames and transport parameters (docs/protocol.md §1–2).
//!
//! Zero-copy and allocation-free: decoders borrow the received bytes,
//! encoders fill a caller's `&mut [u8]`.
//!
//! Receiving: cut a [`Record`] off the front of the TCP input with
//! [`Record::decode`] (bounded by the `max_record_size` we advertised), then
//! walk its [`Frames`]. A decode error other than `Incomplete` is a QMux
//! violation: map it with [`TransportError::from`] and send its
//! [`close_frame`](TransportError::close_frame).
//!
//! Sending: one frame per record with [`encode_record`] (what moq-dev does),
//! or several with [`RecordWriter`]; size STREAM chunks with
//! [`max_stream_payload`].

pub mod error;
pub mod frame;
pub mod params;
pub mod record;
mod stream_id;

pub use error::{HANDSHAKE_TIMEOUT_CLOSE, TransportError, VIOLATION_CODE};
pub use frame::{
    ApplicationClose, ConnectionClose, Datagram, Frame, MAX_STREAM_PAYLOAD, ResetStream,
    STREAM_REF, STREAM_REF_FIN, StopSending, Stream, StreamRef, encode_stream_record_header,
    max_datagram_payload, max_stream_payload,
};
pub use params::{
    DEFAULT_MAX_RECORD_SIZE, ProtocolIter, Protocols, TransportParams, select_protocol,
};
pub use record::{Frames, Record, RecordWriter, encode_record, record_len};
pub use stream_id::{Dir, Side, StreamId};

/// docs/protocol.md §6 vectors that are QMux records, checked byte for byte both ways.
#[cfg(test)]
mod vectors {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::DecodeError;

    /// Parses "40 54 ff …" (whitespace and newlines ignored).
    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    /// The frames of a whole record that must use every input byte.
    fn frames(rec: &[u8]) -> Vec<Frame<'_>> {
        let r = Record::decode(rec, DEFAULT_MAX_RECORD_SIZE).unwrap();
        assert_eq!(r.len, rec.len(), "record length");
        r.frames().collect::<Result<_, _>>().unwrap()
    }

    /// Checks `frame` encodes to the record `rec` and `rec` decodes to exactly `frame`.
    fn both_ways(rec: &[u8], frame: Frame<'_>) {
        let mut buf = [0u8; 256];
        let n = encode_record(&frame, DEFAULT_MAX_RECORD_SIZE, &mut buf).unwrap();
        assert_eq!(&buf[..n], rec, "encoding {frame:?}");
        assert_eq!(frames(rec), [frame]);
    }

    const V1: &str = "40 54
        ff 51 53 30 0d 0a 0d 0a
        40 4a
        01 04 80 00 75 30
        04 04 80 10 00 00
        05 04 80 04 00 00
        06 04 80 04 00 00
        07 04 80 04 00 00
        08 02 67 10
        09 02 67 10
        20 02 7f fe
        c5 71 c5 94 29 cd 08 45 02 7f fe
        fd 4f 9c 2a 8b 1e 60 75 0c
        0b 6d 6f 71 2d 6c 69 74 65 2d 30 35";

    const LITE05: &[&str] = &["moq-lite-05"];

    #[test]
    fn v1_moq_dev_transport_parameters() {
        let rec = hex(V1);
        assert_eq!(rec.len(), 86);
        let want = TransportParams {
            max_idle_timeout: 30_000,
            initial_max_data: 1_048_576,
            initial_max_stream_data_bidi_local: 262_144,
            initial_max_stream_data_bidi_remote: 262_144,
            initial_max_stream_data_uni: 262_144,
            initial_max_streams_bidi: 10_000,
            initial_max_streams_uni: 10_000,
            max_datagram_frame_size: 16_382,
            reset_stream_at: false,
            max_record_size: Some(16_382),
            application_protocols: Some(Protocols::from_list(LITE05)),
        };
        both_ways(&rec, Frame::TransportParameters(want));
        // The decoded list borrows the record and selects lite-05 against ours.
        let [Frame::TransportParameters(p)] = frames(&rec)[..] else {
            panic!()
        };
        let theirs = p.application_protocols.unwrap();
        assert_eq!(theirs.iter().collect::<Vec<_>>(), ["moq-lite-05"]);
        assert_eq!(
            select_protocol(Protocols::from_list(LITE05), theirs),
            Some("moq-lite-05")
        );
        assert_eq!(p.record_size_limit(), 16382);
    }

    #[test]
    fn v2_lean_transport_parameters() {
        let rec = hex(
            "3e ff 51 53 30 0d 0a 0d 0a 35 04 04 80 10 00 00 05 04 80 04 00 00 06 04 80 04 00 00
             07 04 80 04 00 00 08 02 40 64 09 02 40 64 fd 4f 9c 2a 8b 1e 60 75 0c 0b 6d 6f 71 2d
             6c 69 74 65 2d 30 35",
        );
        let want = TransportParams {
            initial_max_data: 1_048_576,
            initial_max_stream_data_bidi_local: 262_144,
            initial_max_stream_data_bidi_remote: 262_144,
            initial_max_stream_data_uni: 262_144,
            initial_max_streams_bidi: 100,
            initial_max_streams_uni: 100,
            // "default record size": the parameter is absent.
            max_record_size: None,
            application_protocols: Some(Protocols::from_list(LITE05)),
            ..Default::default()
        };
        both_ways(&rec, Frame::TransportParameters(want));
    }

    #[test]
    fn v3_stream_and_fin() {
        both_ways(
            &hex("09 0e 00 00 05 01 03 00 62 22"),
            Frame::Stream(Stream {
                id: StreamId(0),
                offset: 0,
                data: &[0x01, 0x03, 0x00, 0x62, 0x22],
                fin: false,
            }),
        );
        // FIN on client uni stream 2 after 20 bytes.
        both_ways(
            &hex("04 0f 02 14 00"),
            Frame::Stream(Stream {
                id: StreamId(2),
                offset: 20,
                data: &[],
                fin: true,
            }),
        );
        // V12's FIN on server uni stream 7 after 21 bytes.
        both_ways(
            &hex("04 0f 07 15 00"),
            Frame::Stream(Stream {
                id: StreamId(7),
                offset: 21,
                data: &[],
                fin: true,
            }),
        );
    }

    #[test]
    fn v4_credit() {
        both_ways(
            &hex("06 11 07 80 06 00 01"),
            Frame::MaxStreamData {
                id: StreamId(7),
                max: 262_144 + 131_073,
            },
        );
        both_ways(&hex("05 10 80 18 00 00"), Frame::MaxData(1_572_864));
        both_ways(
            &hex("03 12 67 11"),
            Frame::MaxStreams {
                dir: Dir::Bidi,
                max: 10_001,
            },
        );
    }

    #[test]
    fn v13_datagram_record() {
        // Body: sub 0, group 7, timestamp 3000 (`4b b8`), "hi" = 6 bytes; frame `31 06 …` = 8 bytes.
        let frame = Frame::Datagram(Datagram::new(&[0x00, 0x07, 0x4b, 0xb8, 0x68, 0x69]));
        both_ways(&hex("08 31 06 00 07 4b b8 68 69"), frame);
        // With Size `09` (one more than the 8 bytes that follow) the record is
        // incomplete, as docs/protocol.md §6 V13 notes.
        let printed = hex("09 31 06 00 07 4b b8 68 69");
        assert_eq!(
            Record::decode(&printed, DEFAULT_MAX_RECORD_SIZE),
            Err(DecodeError::Incomplete)
        );
    }

    #[test]
    fn v14_control() {
        both_ways(&hex("09 f4 8c 67 52 9e f8 c7 bd 00"), Frame::PingRequest(0));
        both_ways(
            &hex("09 f4 8c 67 52 9e f8 c7 be 00"),
            Frame::PingResponse(0),
        );
        both_ways(
            &hex("03 1d 00 00"),
            Frame::ApplicationClose(ApplicationClose {
                code: 0,
                reason: &[],
            }),
        );
        both_ways(
            &hex("17 1c 43 ea 00 12 66 6c 6f 77 20 63 6f 6e 74 72 6f 6c 20 65 72 72 6f 72"),
            Frame::ConnectionClose(ConnectionClose {
                code: 1002,
                frame_type: 0,
                reason: b"flow control error",
            }),
        );
        both_ways(
            &hex("04 04 07 34 15"),
            Frame::ResetStream(ResetStream {
                id: StreamId(7),
                code: 0x34,
                final_size: 21,
            }),
        );
        both_ways(
            &hex("03 05 07 01"),
            Frame::StopSending(StopSending {
                id: StreamId(7),
                code: 1,
            }),
        );
        both_ways(
            &hex("03 05 08 00"),
            Frame::StopSending(StopSending {
                id: StreamId(8),
                code: 0,
            }),
        );
    }

    #[test]
    fn v16_relay_parameters_size() {
        // The relay's full default list makes a 197-byte record body (`40 c5`).
        let relay: &[&str] = &[
            "moq-lite-06",
            "moq-lite-05",
            "moq-lite-04",
            "moq-lite-03",
            "moql",
            "moqt-22",
            "moqt-21",
            "moqt-20",
            "moqt-19",
            "moqt-18",
            "moqt-17",
            "moqt-16",
            "moqt-15",
            "moq-00",
        ];
        let p = TransportParams {
            max_idle_timeout: 30_000,
            initial_max_data: 1_048_576,
            initial_max_stream_data_bidi_local: 262_144,
            initial_max_stream_data_bidi_remote: 262_144,
            initial_max_stream_data_uni: 262_144,
            initial_max_streams_bidi: 10_000,
            initial_max_streams_uni: 10_000,
            max_datagram_frame_size: 16_382,
            reset_stream_at: false,
            max_record_size: Some(16_382),
            application_protocols: Some(Protocols::from_list(relay)),
        };
        let mut buf = [0u8; 256];
        let n = encode_record(&Frame::TransportParameters(p), 16382, &mut buf).unwrap();
        assert_eq!(&buf[..2], &[0x40, 0xc5]);
        let proto_id = [0xfd, 0x4f, 0x9c, 0x2a, 0x8b, 0x1e, 0x60, 0x75, 0x40, 0x7c];
        assert!(buf[..n].windows(proto_id.len()).any(|w| w == proto_id));
        let [Frame::TransportParameters(q)] = frames(&buf[..n])[..] else {
            panic!()
        };
        assert_eq!(
            select_protocol(
                q.application_protocols.unwrap(),
                Protocols::from_list(LITE05)
            ),
            Some("moq-lite-05")
        );
    }
}
