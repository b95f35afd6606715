//! A moving test card as a hang broadcast (docs/protocol.md §10.4): the
//! pictures a board publishes without a camera or an encoder, and the rule a
//! viewer checks them against, exactly.
//!
//! Picture `n` is a luma gradient scrolling one step per frame, a bright
//! vertical bar at column `n % width`, chroma stripes moving with `n`, and in
//! the top-left corner a black box with `n` (mod [`COUNTER_MODULUS`]) in
//! [`DIGITS`] white digits of a 3×5 font drawn at twice the size, so the
//! frame number reads back from decoded pixels ([`TestCard::read_counter`]).
//! Every sample is in video range (16 to 235 for luma, 16 to 240 for
//! chroma), so I_PCM slices of it need no emulation prevention bytes.
//!
//! [`TestCard::catalog`] writes the broadcast's `catalog.json` (an `avc1`
//! rendition with its avcC description) and [`TestCard::frame`] the legacy
//! frame of picture `n`: SPS, PPS and an I_PCM IDR slice ([`super::ipcm`]).

use core::fmt;

use super::avc::{self, AvcError};
use super::catalog::{self, CatalogError, VideoRendition};
use super::frame::{self, FrameError, MAX_PREFIX_LEN};
use super::ipcm::{self, Geometry, IpcmError, Plane};

/// Digits of the drawn counter.
pub const DIGITS: usize = 8;

/// The drawn counter is the frame number modulo this (10^[`DIGITS`]).
pub const COUNTER_MODULUS: u32 = 100_000_000;

/// Luma of the counter's digits (video-range white).
pub const WHITE: u8 = 235;

/// Luma of the counter's box (video-range black).
pub const BLACK: u8 = 16;

/// Chroma of the counter's box (no colour).
const NEUTRAL: u8 = 128;

/// Font scale: each font cell is a `SCALE`×`SCALE` square of pixels.
const SCALE: usize = 2;

/// Pixels between the box edge and the digits.
const MARGIN: usize = 2;

/// Horizontal distance between the left edges of two digits: 3 cells and a 1-cell gap.
const ADVANCE: usize = 4 * SCALE;

/// Width of the counter's box in luma pixels.
pub const BOX_WIDTH: usize = 2 * MARGIN + DIGITS * ADVANCE - SCALE;

/// Height of the counter's box in luma pixels.
pub const BOX_HEIGHT: usize = 2 * MARGIN + 5 * SCALE;

/// The font: digit `d`'s 3×5 cells, row by row from the top, the most
/// significant of the 15 bits first (1 = white).
const FONT: [u16; 10] = [
    0b111_101_101_101_111, // 0
    0b010_110_010_010_111, // 1
    0b111_001_111_100_111, // 2
    0b111_001_111_001_111, // 3
    0b101_101_111_001_001, // 4
    0b111_100_111_001_111, // 5
    0b111_100_111_101_111, // 6
    0b111_001_001_001_001, // 7
    0b111_101_111_101_111, // 8
    0b111_101_111_001_111, // 9
];

/// Bytes of catalog JSON [`TestCard::catalog`] needs at most.
pub const CATALOG_MAX_LEN: usize = 512;

/// Why the test card wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum TestCardError {
    /// A picture smaller than the counter's box, or one [`Geometry`] refuses.
    BadSize,
    /// A frame rate of zero.
    BadFramerate,
    /// A presentation time above [`frame::MAX_TIMESTAMP`].
    TimestampTooLarge,
    /// The output buffer is too small.
    BufferTooSmall,
}

impl fmt::Display for TestCardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TestCardError::BadSize => "test card: size not macroblock-aligned or below 80x16",
            TestCardError::BadFramerate => "test card: frame rate of zero",
            TestCardError::TimestampTooLarge => "test card: timestamp above 2^53 - 1 µs",
            TestCardError::BufferTooSmall => "test card: output buffer too small",
        })
    }
}

impl core::error::Error for TestCardError {}

impl From<IpcmError> for TestCardError {
    fn from(e: IpcmError) -> Self {
        match e {
            IpcmError::BadSize => TestCardError::BadSize,
            IpcmError::BufferTooSmall => TestCardError::BufferTooSmall,
        }
    }
}

/// The test card of one size and frame rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TestCard {
    geometry: Geometry,
    fps: u32,
}

impl TestCard {
    /// A `width`×`height` card at `fps` frames per second.
    ///
    /// # Errors
    /// [`TestCardError::BadSize`] unless both are multiples of 16 that hold
    /// the counter's box (at least 80×16) and [`Geometry::new`] accepts them;
    /// [`TestCardError::BadFramerate`] for 0 fps.
    pub const fn new(width: usize, height: usize, fps: u32) -> Result<TestCard, TestCardError> {
        if width < BOX_WIDTH || height < BOX_HEIGHT {
            return Err(TestCardError::BadSize);
        }
        if fps == 0 {
            return Err(TestCardError::BadFramerate);
        }
        match Geometry::new(width, height) {
            Ok(geometry) => Ok(TestCard { geometry, fps }),
            Err(_) => Err(TestCardError::BadSize),
        }
    }

    /// The picture size.
    pub const fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Frames per second.
    pub const fn fps(&self) -> u32 {
        self.fps
    }

    /// Presentation time of frame `n` in microseconds: `n / fps` seconds.
    pub const fn pts_us(&self, n: u64) -> u64 {
        n.saturating_mul(1_000_000) / self.fps as u64
    }

    /// An upper bound of a [`Self::frame`] payload's length: a buffer this long always suffices.
    pub const fn max_frame_len(&self) -> usize {
        MAX_PREFIX_LEN + self.geometry.max_access_unit_len()
    }

    /// The sample of `plane` at (`x`, `y`) (that plane's coordinates) of picture `n`.
    pub fn sample(&self, plane: Plane, x: usize, y: usize, n: u32) -> u8 {
        let n = n % COUNTER_MODULUS;
        match plane {
            Plane::Y => {
                if x < BOX_WIDTH && y < BOX_HEIGHT {
                    if counter_pixel(n, x, y) { WHITE } else { BLACK }
                } else if x == n as usize % self.geometry.width() {
                    WHITE
                } else {
                    // 16 to 205.
                    16 + ((x + y + n as usize % 64) % 64) as u8 * 3
                }
            }
            _ if 2 * x < BOX_WIDTH && 2 * y < BOX_HEIGHT => NEUTRAL,
            // 64 to 191.
            Plane::Cb => 64 + ((4 * x + 2 * (n as usize % 64)) % 128) as u8,
            Plane::Cr => 64 + ((8 * y + n as usize % 128) % 128) as u8,
        }
    }

    /// Reads the counter back from a luma plane (`stride` bytes per row, at
    /// least this card's size): the drawn number, or `None` if a digit is not
    /// one of the font's or the plane is too small.
    pub fn read_counter(&self, luma: &[u8], stride: usize) -> Option<u32> {
        if stride < BOX_WIDTH || luma.len() < stride * BOX_HEIGHT {
            return None;
        }
        let mut value = 0u32;
        for d in 0..DIGITS {
            let mut bits = 0u16;
            for row in 0..5 {
                for col in 0..3 {
                    let (x, y) = (MARGIN + d * ADVANCE + col * SCALE, MARGIN + row * SCALE);
                    bits = (bits << 1) | u16::from(luma[y * stride + x] >= 128);
                }
            }
            let digit = FONT.iter().position(|&g| g == bits)?;
            value = value * 10 + digit as u32;
        }
        Some(value)
    }

    /// Writes the broadcast's catalog JSON for the video track `track` into
    /// `out`; returns its length ([`CATALOG_MAX_LEN`] bytes suffice for a
    /// track name of up to 64 bytes).
    ///
    /// # Errors
    /// [`TestCardError::BufferTooSmall`].
    pub fn catalog(&self, track: &str, out: &mut [u8]) -> Result<usize, TestCardError> {
        let mut sps = [0u8; 32];
        let mut pps = [0u8; 16];
        let mut avcc = [0u8; 64];
        let sps_len = ipcm::write_sps(self.geometry, &mut sps)?;
        let pps_len = ipcm::write_pps(&mut pps)?;
        let (sps, pps) = (&sps[..sps_len], &pps[..pps_len]);
        let avcc_len = avc::write_avcc(sps, pps, &mut avcc).map_err(avc_error)?;
        let codec = avc::codec_string(sps).map_err(avc_error)?;
        let rendition = VideoRendition {
            track,
            // The codec string is ASCII hex.
            codec: core::str::from_utf8(&codec).map_err(|_| TestCardError::BufferTooSmall)?,
            description: Some(&avcc[..avcc_len]),
            coded_width: self.geometry.width() as u32,
            coded_height: self.geometry.height() as u32,
            framerate: Some(f64::from(self.fps)),
            bitrate: Some(self.bitrate()),
        };
        catalog::write(&[rendition], out).map_err(|e| match e {
            CatalogError::BufferTooSmall => TestCardError::BufferTooSmall,
            // A positive frame rate and a description are always there.
            CatalogError::InvalidFramerate => TestCardError::BadFramerate,
            CatalogError::MissingDescription | CatalogError::DuplicateTrack => {
                TestCardError::BufferTooSmall
            }
        })
    }

    /// The stream's bit rate: samples plus headers of every frame, in bits per second.
    pub const fn bitrate(&self) -> u64 {
        // About 2 header bytes per macroblock and 40 per access unit.
        let frame = self.geometry.sample_bytes() + 2 * self.geometry.macroblocks() + 40;
        frame as u64 * 8 * self.fps as u64
    }

    /// Writes picture `n` as a hang legacy frame presented at `pts_us`
    /// ([`Self::pts_us`] of the stream's frame count, normally) into `out`;
    /// returns the payload, a slice of `out`. The access unit is SPS, PPS and
    /// one I_PCM IDR slice, so every frame is a keyframe.
    ///
    /// # Errors
    /// [`TestCardError::BufferTooSmall`] ([`Self::max_frame_len`] suffices);
    /// [`TestCardError::TimestampTooLarge`] for a `pts_us` above [`frame::MAX_TIMESTAMP`].
    pub fn frame<'o>(
        &self,
        n: u32,
        pts_us: u64,
        out: &'o mut [u8],
    ) -> Result<&'o [u8], TestCardError> {
        let body = out
            .get_mut(MAX_PREFIX_LEN..)
            .ok_or(TestCardError::BufferTooSmall)?;
        let idr_pic_id = (n % 2) as u16;
        let len = ipcm::write_access_unit(
            self.geometry,
            idr_pic_id,
            |plane, x, y| self.sample(plane, x, y, n),
            body,
        )?;
        let start = MAX_PREFIX_LEN - frame::prefix_len(pts_us);
        frame::encode_prefix(pts_us, &mut out[start..]).map_err(|e| match e {
            FrameError::TimestampTooLarge => TestCardError::TimestampTooLarge,
            FrameError::BufferTooSmall | FrameError::Truncated => TestCardError::BufferTooSmall,
        })?;
        Ok(&out[start..MAX_PREFIX_LEN + len])
    }
}

/// Maps the avcC writer's errors; for parameter sets this module wrote, only a small buffer.
fn avc_error(_: AvcError) -> TestCardError {
    TestCardError::BufferTooSmall
}

/// Whether luma pixel (`x`, `y`) inside the counter's box is part of a digit of `n`.
fn counter_pixel(n: u32, x: usize, y: usize) -> bool {
    if x < MARGIN || y < MARGIN {
        return false;
    }
    let (dx, dy) = (x - MARGIN, y - MARGIN);
    let (digit, col, row) = (dx / ADVANCE, (dx % ADVANCE) / SCALE, dy / SCALE);
    if digit >= DIGITS || col >= 3 || row >= 5 {
        return false;
    }
    let value = (n / 10u32.pow((DIGITS - 1 - digit) as u32)) % 10;
    FONT[value as usize] >> (14 - (row * 3 + col)) & 1 == 1
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;

    use super::*;

    #[test]
    fn counter_reads_back() {
        let card = TestCard::new(96, 64, 15).unwrap();
        let (w, h) = (96, 64);
        let mut luma = vec![0u8; w * h];
        for n in [0, 1, 9, 10, 12_345_678, 99_999_999, 100_000_007, u32::MAX] {
            for y in 0..h {
                for x in 0..w {
                    luma[y * w + x] = card.sample(Plane::Y, x, y, n);
                }
            }
            assert_eq!(card.read_counter(&luma, w), Some(n % COUNTER_MODULUS));
        }
        assert_eq!(card.read_counter(&luma[..10], w), None);
        luma.fill(BLACK);
        assert_eq!(card.read_counter(&luma, w), None);
    }

    #[test]
    fn samples_are_in_video_range() {
        let card = TestCard::new(96, 64, 15).unwrap();
        for n in 0..200 {
            for y in 0..64 {
                for x in 0..96 {
                    assert!((16..=235).contains(&card.sample(Plane::Y, x, y, n)));
                    if x < 48 && y < 32 {
                        for p in [Plane::Cb, Plane::Cr] {
                            assert!((16..=240).contains(&card.sample(p, x, y, n)));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn frame_and_catalog() {
        let card = TestCard::new(96, 64, 15).unwrap();
        let mut buf = vec![0u8; card.max_frame_len()];
        let pts = card.pts_us(15);
        assert_eq!(pts, 1_000_000);
        let payload = card.frame(15, pts, &mut buf).unwrap();
        let (t, au) = frame::decode(payload).unwrap();
        assert_eq!(t, 1_000_000);
        // No escapes: three 4-byte lengths, a 7-byte SPS, a 4-byte PPS, and the slice:
        // its header byte, 4 bytes of slice header and mb_type before the first
        // macroblock's samples, 2 bytes before each other one's, the trailing byte.
        assert_eq!(au.len(), 12 + 7 + 4 + 1 + 4 + 384 + 23 * (2 + 384) + 1);
        assert_eq!(au.len(), 9291);
        let mut json = [0u8; CATALOG_MAX_LEN];
        let n = card.catalog("video", &mut json).unwrap();
        let json = core::str::from_utf8(&json[..n]).unwrap();
        assert!(json.starts_with(
            r#"{"video":{"renditions":{"video":{"codec":"avc1.42c01f","description":"0142c01f"#
        ));
        assert!(json.contains(r#""codedWidth":96,"codedHeight":64"#));
        assert!(card.catalog("video", &mut [0u8; 40]).is_err());
        assert_eq!(
            card.frame(0, 0, &mut buf[..100]),
            Err(TestCardError::BufferTooSmall)
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(TestCard::new(64, 64, 15), Err(TestCardError::BadSize));
        assert_eq!(TestCard::new(96, 8, 15), Err(TestCardError::BadSize));
        assert_eq!(TestCard::new(100, 64, 15), Err(TestCardError::BadSize));
        assert_eq!(TestCard::new(96, 64, 0), Err(TestCardError::BadFramerate));
    }
}
