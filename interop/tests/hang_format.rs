//! skiff's hang writers (`skiff_core::hang`) read back by the published `hang`
//! crate: the catalog through `hang::Catalog`, frames through hang's legacy
//! container decoder, and the TRACK_INFO values against hang's own.

use hang::catalog::{Container, PRIORITY, VideoCodec};
use hang::container::Frame;
use skiff_core::hang::catalog::{self, VideoRendition};
use skiff_core::hang::{self as skiff_hang, frame};

/// An avcC record of a 320x240 Baseline stream (SPS and PPS as openh264 writes them).
const AVCC: &[u8] = &[
    0x01, 0x42, 0xc0, 0x0d, 0xff, 0xe1, 0x00, 0x0a, 0x67, 0x42, 0xc0, 0x0d, 0x8c, 0x8d, 0x40, 0xa0,
    0xf9, 0x00, 0x01, 0x00, 0x04, 0x68, 0xce, 0x3c, 0x80,
];

fn rendition() -> VideoRendition<'static> {
    VideoRendition {
        track: "video",
        codec: "avc1.42c00d",
        description: Some(AVCC),
        coded_width: 320,
        coded_height: 240,
        framerate: Some(30.0),
        bitrate: Some(800_000),
    }
}

#[test]
fn hang_parses_our_catalog() {
    let mut buf = [0u8; 1024];
    let n = catalog::write(&[rendition()], &mut buf).unwrap();
    let parsed = hang::Catalog::<()>::from_slice(&buf[..n]).expect("hang parses the catalog");
    assert_eq!(parsed.video.renditions.len(), 1);
    let v = &parsed.video.renditions["video"];
    match &v.codec {
        VideoCodec::H264(h) => {
            assert_eq!((h.profile, h.constraints, h.level), (0x42, 0xc0, 0x0d));
            assert!(!h.inline, "avc1, not avc3");
        }
        other => panic!("codec {other:?}"),
    }
    assert_eq!(v.codec.to_string(), "avc1.42c00d");
    assert_eq!(v.description.as_deref(), Some(AVCC));
    assert_eq!((v.coded_width, v.coded_height), (Some(320), Some(240)));
    assert_eq!(v.framerate, Some(30.0));
    assert_eq!(v.bitrate, Some(800_000));
    assert_eq!(v.container, Container::Legacy);
    assert!(parsed.audio.renditions.is_empty());
}

#[test]
fn hang_parses_escaped_names_and_fractional_rates() {
    let r = VideoRendition {
        track: "cam \"one\"\\\u{7}",
        codec: "vp8",
        description: None,
        framerate: Some(29.97),
        bitrate: None,
        ..rendition()
    };
    let second = VideoRendition {
        track: "low",
        coded_width: 160,
        coded_height: 120,
        ..rendition()
    };
    let mut buf = [0u8; 1024];
    let n = catalog::write(&[r, second], &mut buf).unwrap();
    let parsed = hang::Catalog::<()>::from_slice(&buf[..n]).expect("hang parses the catalog");
    let v = &parsed.video.renditions["cam \"one\"\\\u{7}"];
    assert_eq!(v.codec, VideoCodec::VP8);
    assert_eq!(v.framerate, Some(29.97));
    assert_eq!((v.description.as_ref(), v.bitrate), (None, None));
    assert_eq!(parsed.video.renditions["low"].coded_width, Some(160));
}

#[test]
fn hang_decodes_our_frames() {
    let codec = [0x00, 0x00, 0x00, 0x02, 0x65, 0x88];
    for pts in [
        0u64,
        1,
        63,
        64,
        33_333,
        16_383,
        16_384,
        1 << 30,
        frame::MAX_TIMESTAMP,
    ] {
        let mut buf = vec![0u8; frame::MAX_PREFIX_LEN + codec.len()];
        let n = frame::encode_prefix(pts, &mut buf).unwrap();
        buf.truncate(n);
        buf.extend_from_slice(&codec);
        let f = Frame::decode(bytes::Bytes::from(buf.clone())).expect("hang decodes the frame");
        assert_eq!(f.timestamp.as_micros(), u128::from(pts));
        assert_eq!(&f.payload[..], &codec);
        // And the other way round: hang's encoding reads back with ours.
        let mut theirs = bytes::BytesMut::new();
        f.encode(&mut theirs).unwrap();
        assert_eq!(frame::decode(&theirs), Ok((pts, &codec[..])));
        assert_eq!(&theirs[..], &buf[..]);
    }
}

#[test]
fn track_infos_match_hangs() {
    let theirs = hang::container::track_info(PRIORITY.video);
    let ours = skiff_hang::video_info("video").unwrap();
    assert_eq!(ours.priority, theirs.priority);
    assert_eq!(ours.timescale.get(), theirs.timescale.as_u64());
    assert_eq!(ours.max_age.as_micros() as u128, theirs.max_age.as_micros());
    assert_eq!(
        skiff_hang::audio_info("a").unwrap().priority,
        PRIORITY.audio
    );
    let catalog = hang::Catalog::default_track_info();
    let ours = skiff_hang::catalog_info();
    assert_eq!(ours.name.as_str(), hang::Catalog::DEFAULT_NAME);
    assert_eq!(ours.priority, catalog.priority);
    assert_eq!(ours.timescale.get(), catalog.timescale.as_u64());
    assert_eq!(
        ours.max_age.as_micros() as u128,
        catalog.max_age.as_micros()
    );
}
