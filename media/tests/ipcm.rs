//! skiff-core's I_PCM writer (docs/protocol.md §10.4) against a real decoder:
//! openh264 must give back every sample exactly, I_PCM being lossless.

use openh264::formats::YUVSource;
use skiff_core::hang::catalog;
use skiff_core::hang::frame;
use skiff_core::hang::ipcm::{self, Geometry, Plane};
use skiff_core::hang::testcard::{CATALOG_MAX_LEN, TestCard};
use skiff_media::catalog::Catalog;
use skiff_media::h264::Decoder;

/// Compares a decoded picture with `expected(plane, x, y)`, sample by sample.
fn assert_picture(
    yuv: &impl YUVSource,
    g: Geometry,
    what: &str,
    expected: impl Fn(Plane, usize, usize) -> u8,
) {
    assert_eq!(yuv.dimensions(), (g.width(), g.height()), "{what}: size");
    let (sy, su, sv) = yuv.strides();
    let planes = [
        (Plane::Y, yuv.y(), sy, 1),
        (Plane::Cb, yuv.u(), su, 2),
        (Plane::Cr, yuv.v(), sv, 2),
    ];
    for (plane, data, stride, sub) in planes {
        for y in 0..g.height() / sub {
            for x in 0..g.width() / sub {
                assert_eq!(
                    data[y * stride + x],
                    expected(plane, x, y),
                    "{what}: {plane:?} sample at ({x}, {y})"
                );
            }
        }
    }
}

#[test]
fn test_card_decodes_exactly_and_its_counter_reads_back() {
    let card = TestCard::new(96, 64, 15).unwrap();
    let g = card.geometry();
    // The catalog's description configures the decoder, as the viewer does.
    let mut json = [0u8; CATALOG_MAX_LEN];
    let n = card.catalog("video", &mut json).unwrap();
    let parsed = Catalog::parse(&json[..n]).unwrap();
    let config = &parsed.video.renditions["video"];
    assert_eq!(config.codec, "avc1.42c01f");
    let mut decoder = Decoder::new().unwrap();
    decoder
        .configure(config.description.as_deref().unwrap())
        .unwrap();
    let mut buf = vec![0u8; card.max_frame_len()];
    for n in (0..40).chain([99_999_998, 99_999_999, 100_000_000]) {
        let payload = card.frame(n, card.pts_us(n.into()), &mut buf).unwrap();
        let (_, au) = frame::decode(payload).unwrap();
        let yuv = decoder
            .decode(au)
            .unwrap()
            .unwrap_or_else(|| panic!("frame {n}: no picture"));
        assert_picture(&yuv, g, &format!("frame {n}"), |p, x, y| {
            card.sample(p, x, y, n)
        });
        assert_eq!(
            card.read_counter(yuv.y(), yuv.strides().0),
            Some(n % 100_000_000)
        );
    }
}

#[test]
fn any_samples_decode_exactly_even_with_escapes() {
    // Full-range samples with runs of zeros: the slice needs emulation
    // prevention bytes, which the decoder must strip back out.
    for (w, h) in [(16, 16), (48, 32), (176, 144)] {
        let g = Geometry::new(w, h).unwrap();
        let sample = |p: Plane, x: usize, y: usize| -> u8 {
            let v = (x * 31 + y * 17 + p as usize * 101).wrapping_mul(2_654_435_761) >> 13;
            if v.is_multiple_of(3) { 0 } else { v as u8 }
        };
        let mut buf = vec![0u8; g.max_access_unit_len()];
        let mut decoder = Decoder::new().unwrap();
        for id in 0..3u16 {
            let n = ipcm::write_access_unit(g, id % 2, sample, &mut buf).unwrap();
            let escapes = buf[..n].windows(3).filter(|t| t == &[0, 0, 3]).count();
            assert!(escapes > 0, "{w}x{h}: the test needs escaped bytes");
            let yuv = decoder.decode(&buf[..n]).unwrap().unwrap();
            assert_picture(&yuv, g, &format!("{w}x{h} picture {id}"), sample);
        }
    }
}

#[test]
fn catalog_writer_accepts_the_test_card() {
    // The test card's rendition is a plain avc1 one: the generic writer agrees.
    let card = TestCard::new(160, 96, 10).unwrap();
    let mut json = [0u8; CATALOG_MAX_LEN];
    let n = card.catalog("cam", &mut json).unwrap();
    let parsed = Catalog::parse(&json[..n]).unwrap();
    let c = &parsed.video.renditions["cam"];
    assert_eq!((c.coded_width, c.coded_height), (Some(160), Some(96)));
    assert_eq!(c.framerate, Some(10.0));
    assert!(catalog::write(&[], &mut json).is_ok());
}
