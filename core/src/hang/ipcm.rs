//! An H.264 writer that needs no encoder (docs/protocol.md §10.4): a
//! Constrained Baseline stream whose every picture is one IDR slice of I_PCM
//! macroblocks, the samples stored uncompressed, so any decoder reproduces
//! them exactly.
//!
//! [`write_sps`], [`write_pps`] and [`write_idr`] write one NAL unit each
//! (header byte included, no start code or length) into a caller's buffer;
//! [`write_access_unit`] writes all three as a length-prefixed `avc1` access
//! unit. The picture's samples come from a caller's function of
//! ([`Plane`], x, y), so no picture buffer is needed. [`BitWriter`] is the
//! bit-level layer: exp-Golomb codes and emulation prevention.
//!
//! Every picture is its own IDR (`frame_num` 0, `idr_pic_id` chosen by the
//! caller, alternating between consecutive pictures), so every picture is a
//! keyframe and can start a group.

use core::fmt;

use super::avc::{LENGTH_SIZE, NAL_IDR, NAL_PPS, NAL_SPS};

/// Width and height of a macroblock, in luma samples.
pub const MB_SIZE: usize = 16;

/// The most macroblocks a picture may have: level 3.1's maximum frame size.
pub const MAX_MBS: usize = 3600;

/// `profile_idc` of the stream: Baseline.
pub const PROFILE_BASELINE: u8 = 66;

/// The constraint flags byte: constraint_set0 and constraint_set1 (Constrained Baseline).
pub const CONSTRAINTS: u8 = 0xc0;

/// `level_idc` of the stream: 3.1.
pub const LEVEL: u8 = 31;

/// `mb_type` of an I_PCM macroblock in an I slice.
const MB_TYPE_I_PCM: u32 = 25;

/// `slice_type` 7: an I slice, and every slice of the picture is one.
const SLICE_TYPE_I_ALL: u32 = 7;

/// `nal_ref_idc` of every NAL unit written: 3 (highest), as parameter sets and IDRs carry.
const NAL_REF_IDC: u8 = 3;

/// Bytes of the SPS, PPS and slice header this writer emits, at most.
const HEADERS_MAX: usize = 64;

/// Why nothing (or only part of a NAL unit) was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum IpcmError {
    /// A width or height that is zero or not a multiple of [`MB_SIZE`], or a
    /// picture over [`MAX_MBS`] macroblocks.
    BadSize,
    /// The output buffer is too small.
    BufferTooSmall,
}

impl fmt::Display for IpcmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpcmError::BadSize => {
                "i_pcm: size not a non-zero multiple of 16, or over 3600 macroblocks"
            }
            IpcmError::BufferTooSmall => "i_pcm: output buffer too small",
        })
    }
}

impl core::error::Error for IpcmError {}

/// One plane of a 4:2:0 picture; chroma planes have half the luma width and height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Plane {
    /// Luma (Y).
    Y,
    /// Blue-difference chroma (Cb, U).
    Cb,
    /// Red-difference chroma (Cr, V).
    Cr,
}

/// The size of the pictures of a stream, in whole macroblocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Geometry {
    width_mbs: usize,
    height_mbs: usize,
}

impl Geometry {
    /// The geometry of `width`×`height` luma samples.
    ///
    /// # Errors
    /// [`IpcmError::BadSize`] unless both are non-zero multiples of [`MB_SIZE`]
    /// and the picture has at most [`MAX_MBS`] macroblocks.
    pub const fn new(width: usize, height: usize) -> Result<Geometry, IpcmError> {
        if width == 0
            || height == 0
            || !width.is_multiple_of(MB_SIZE)
            || !height.is_multiple_of(MB_SIZE)
        {
            return Err(IpcmError::BadSize);
        }
        let (width_mbs, height_mbs) = (width / MB_SIZE, height / MB_SIZE);
        if width_mbs > MAX_MBS || height_mbs > MAX_MBS / width_mbs {
            return Err(IpcmError::BadSize);
        }
        Ok(Geometry {
            width_mbs,
            height_mbs,
        })
    }

    /// Width in luma samples.
    pub const fn width(self) -> usize {
        self.width_mbs * MB_SIZE
    }

    /// Height in luma samples.
    pub const fn height(self) -> usize {
        self.height_mbs * MB_SIZE
    }

    /// Macroblocks per picture.
    pub const fn macroblocks(self) -> usize {
        self.width_mbs * self.height_mbs
    }

    /// Bytes of samples per picture: 1.5 per pixel (4:2:0, 8 bits).
    pub const fn sample_bytes(self) -> usize {
        self.macroblocks() * 384
    }

    /// An upper bound of [`write_access_unit`]'s output for this geometry,
    /// whatever the samples: a buffer this long never gets
    /// [`IpcmError::BufferTooSmall`].
    ///
    /// Emulation prevention adds at most one byte per two bytes of payload
    /// (only after two zero bytes); samples in video range (16 to 235) never
    /// need it, and the access unit is then close to [`Self::sample_bytes`].
    pub const fn max_access_unit_len(self) -> usize {
        // Two header bytes per macroblock (mb_type and alignment), then samples.
        let slice = self.macroblocks() * (2 + 384);
        3 * LENGTH_SIZE + HEADERS_MAX + slice + slice / 2 + 1
    }
}

/// Writes bits MSB first into a NAL unit's payload, inserting an emulation
/// prevention byte (`0x03`) wherever two zero bytes would be followed by a
/// byte of `0x00` to `0x03` (H.264 §7.4.1), so the payload never contains a
/// start code.
///
/// Running out of room is latched: later writes are ignored and
/// [`BitWriter::finish`] reports [`IpcmError::BufferTooSmall`].
#[derive(Debug)]
pub struct BitWriter<'a> {
    out: &'a mut [u8],
    /// Bytes of `out` written.
    pos: usize,
    /// Bits not yet forming a whole byte, in the low `pending` bits.
    acc: u8,
    /// How many bits `acc` holds (0 to 7).
    pending: u8,
    /// Zero bytes just written (0, 1 or 2), for emulation prevention.
    zeros: u8,
    /// Set once a byte did not fit.
    overflow: bool,
}

impl<'a> BitWriter<'a> {
    /// A writer at the start of `out`.
    pub fn new(out: &'a mut [u8]) -> BitWriter<'a> {
        BitWriter {
            out,
            pos: 0,
            acc: 0,
            pending: 0,
            zeros: 0,
            overflow: false,
        }
    }

    /// Writes the NAL header byte (`forbidden_zero_bit` 0, `ref_idc`, `nal_type`).
    pub fn nal_header(&mut self, ref_idc: u8, nal_type: u8) {
        self.bits(u32::from(((ref_idc & 3) << 5) | (nal_type & 0x1f)), 8);
    }

    /// Appends one whole byte to the output, escaping it if needed.
    fn push(&mut self, byte: u8) {
        if self.zeros >= 2 && byte <= 3 {
            self.raw(0x03);
            self.zeros = 0;
        }
        self.raw(byte);
        self.zeros = if byte == 0 { self.zeros + 1 } else { 0 };
    }

    fn raw(&mut self, byte: u8) {
        match self.out.get_mut(self.pos) {
            Some(b) if !self.overflow => {
                *b = byte;
                self.pos += 1;
            }
            _ => self.overflow = true,
        }
    }

    /// Writes the low `n` bits of `value` (`n` up to 32), most significant first.
    pub fn bits(&mut self, value: u32, n: u8) {
        for i in (0..n.min(32)).rev() {
            self.bit((value >> i) & 1 == 1);
        }
    }

    /// Writes one bit.
    pub fn bit(&mut self, one: bool) {
        self.acc = (self.acc << 1) | u8::from(one);
        self.pending += 1;
        if self.pending == 8 {
            let byte = self.acc;
            self.acc = 0;
            self.pending = 0;
            self.push(byte);
        }
    }

    /// Writes a whole byte; faster than [`Self::bits`] when the writer is byte-aligned.
    pub fn byte(&mut self, byte: u8) {
        if self.pending == 0 {
            self.push(byte);
        } else {
            self.bits(u32::from(byte), 8);
        }
    }

    /// Writes `value` as an unsigned exp-Golomb code `ue(v)` (H.264 §9.1).
    pub fn ue(&mut self, value: u32) {
        self.exp_golomb(u64::from(value));
    }

    /// Writes `value` as a signed exp-Golomb code `se(v)` (H.264 §9.1.1):
    /// positive values map to odd codes, the others to even ones.
    pub fn se(&mut self, value: i32) {
        let magnitude = u64::from(value.unsigned_abs());
        self.exp_golomb(if value > 0 {
            2 * magnitude - 1
        } else {
            2 * magnitude
        });
    }

    /// `code_num` as `len - 1` zero bits then `code_num + 1` in `len` bits
    /// (`code_num` below 2^33).
    fn exp_golomb(&mut self, code_num: u64) {
        let code = code_num + 1;
        let len = 64 - code.leading_zeros(); // bits of `code`, 1 to 34
        for _ in 1..len {
            self.bit(false);
        }
        for i in (0..len).rev() {
            self.bit((code >> i) & 1 == 1);
        }
    }

    /// Whether the writer is at a byte boundary.
    #[cfg(test)]
    pub fn is_aligned(&self) -> bool {
        self.pending == 0
    }

    /// Writes zero bits up to the next byte boundary (`pcm_alignment_zero_bit`).
    pub fn align_zero(&mut self) {
        while self.pending != 0 {
            self.bit(false);
        }
    }

    /// Writes `rbsp_trailing_bits`: a one bit, then zero bits to the byte boundary.
    pub fn trailing_bits(&mut self) {
        self.bit(true);
        self.align_zero();
    }

    /// Ends the NAL unit; returns the bytes written. Call after
    /// [`Self::trailing_bits`]: a partial byte is not written.
    ///
    /// # Errors
    /// [`IpcmError::BufferTooSmall`] if the output did not hold everything.
    pub fn finish(self) -> Result<usize, IpcmError> {
        if self.overflow {
            Err(IpcmError::BufferTooSmall)
        } else {
            Ok(self.pos)
        }
    }
}

/// Writes the sequence parameter set of `geometry` (id 0): Constrained
/// Baseline at [`LEVEL`], 4:2:0, `frame_num` of 4 bits, picture order from
/// `frame_num` (type 2), one reference frame, progressive, no cropping, no VUI.
/// Returns its length.
///
/// # Errors
/// [`IpcmError::BufferTooSmall`].
pub fn write_sps(geometry: Geometry, out: &mut [u8]) -> Result<usize, IpcmError> {
    let mut w = BitWriter::new(out);
    w.nal_header(NAL_REF_IDC, NAL_SPS);
    w.byte(PROFILE_BASELINE);
    w.byte(CONSTRAINTS);
    w.byte(LEVEL);
    w.ue(0); // seq_parameter_set_id
    w.ue(0); // log2_max_frame_num_minus4
    w.ue(2); // pic_order_cnt_type
    w.ue(1); // max_num_ref_frames
    w.bit(false); // gaps_in_frame_num_value_allowed_flag
    // Both fit: at most MAX_MBS macroblocks.
    w.ue(geometry.width_mbs as u32 - 1); // pic_width_in_mbs_minus1
    w.ue(geometry.height_mbs as u32 - 1); // pic_height_in_map_units_minus1
    w.bit(true); // frame_mbs_only_flag
    w.bit(true); // direct_8x8_inference_flag
    w.bit(false); // frame_cropping_flag
    w.bit(false); // vui_parameters_present_flag
    w.trailing_bits();
    w.finish()
}

/// Writes the picture parameter set (id 0, of SPS 0): CAVLC, one slice group,
/// QP 26, deblocking control present (the slices turn it off). Returns its length.
///
/// # Errors
/// [`IpcmError::BufferTooSmall`].
pub fn write_pps(out: &mut [u8]) -> Result<usize, IpcmError> {
    let mut w = BitWriter::new(out);
    w.nal_header(NAL_REF_IDC, NAL_PPS);
    w.ue(0); // pic_parameter_set_id
    w.ue(0); // seq_parameter_set_id
    w.bit(false); // entropy_coding_mode_flag (CAVLC)
    w.bit(false); // bottom_field_pic_order_in_frame_present_flag
    w.ue(0); // num_slice_groups_minus1
    w.ue(0); // num_ref_idx_l0_default_active_minus1
    w.ue(0); // num_ref_idx_l1_default_active_minus1
    w.bit(false); // weighted_pred_flag
    w.bits(0, 2); // weighted_bipred_idc
    w.se(0); // pic_init_qp_minus26
    w.se(0); // pic_init_qs_minus26
    w.se(0); // chroma_qp_index_offset
    w.bit(true); // deblocking_filter_control_present_flag
    w.bit(false); // constrained_intra_pred_flag
    w.bit(false); // redundant_pic_cnt_present_flag
    w.trailing_bits();
    w.finish()
}

/// Writes one picture as an IDR slice of I_PCM macroblocks, its samples read
/// from `sample(plane, x, y)` (coordinates in that plane: chroma planes are
/// half as wide and high). `idr_pic_id` must differ between consecutive
/// pictures (alternate 0 and 1). Returns the NAL unit's length.
///
/// # Errors
/// [`IpcmError::BufferTooSmall`] (the buffer then holds a partial NAL unit).
pub fn write_idr<F>(
    geometry: Geometry,
    idr_pic_id: u16,
    mut sample: F,
    out: &mut [u8],
) -> Result<usize, IpcmError>
where
    F: FnMut(Plane, usize, usize) -> u8,
{
    let mut w = BitWriter::new(out);
    w.nal_header(NAL_REF_IDC, NAL_IDR);
    // slice_header()
    w.ue(0); // first_mb_in_slice
    w.ue(SLICE_TYPE_I_ALL);
    w.ue(0); // pic_parameter_set_id
    w.bits(0, 4); // frame_num (log2_max_frame_num = 4)
    w.ue(u32::from(idr_pic_id));
    // dec_ref_pic_marking() of an IDR
    w.bit(false); // no_output_of_prior_pics_flag
    w.bit(false); // long_term_reference_flag
    w.se(0); // slice_qp_delta
    w.ue(1); // disable_deblocking_filter_idc: off
    // slice_data(): each macroblock_layer() is mb_type, alignment, then samples.
    for mby in 0..geometry.height_mbs {
        for mbx in 0..geometry.width_mbs {
            w.ue(MB_TYPE_I_PCM);
            w.align_zero();
            for y in 0..MB_SIZE {
                for x in 0..MB_SIZE {
                    w.byte(sample(Plane::Y, mbx * MB_SIZE + x, mby * MB_SIZE + y));
                }
            }
            for plane in [Plane::Cb, Plane::Cr] {
                for y in 0..MB_SIZE / 2 {
                    for x in 0..MB_SIZE / 2 {
                        w.byte(sample(plane, mbx * 8 + x, mby * 8 + y));
                    }
                }
            }
        }
    }
    w.trailing_bits(); // rbsp_slice_trailing_bits
    w.finish()
}

/// Writes SPS, PPS and the IDR slice of one picture (see [`write_idr`]) as an
/// `avc1` access unit: each NAL unit after its length in [`LENGTH_SIZE`]
/// big-endian bytes. Returns its length.
///
/// # Errors
/// [`IpcmError::BufferTooSmall`]; [`Geometry::max_access_unit_len`] bytes always suffice.
pub fn write_access_unit<F>(
    geometry: Geometry,
    idr_pic_id: u16,
    sample: F,
    out: &mut [u8],
) -> Result<usize, IpcmError>
where
    F: FnMut(Plane, usize, usize) -> u8,
{
    let mut pos = 0;
    let sps = prefixed(out, &mut pos, |o| write_sps(geometry, o))?;
    let pps = prefixed(out, &mut pos, write_pps)?;
    let idr = prefixed(out, &mut pos, |o| {
        write_idr(geometry, idr_pic_id, sample, o)
    })?;
    debug_assert!(sps + pps + idr + 3 * LENGTH_SIZE == pos);
    Ok(pos)
}

/// Runs `write` on `out[*pos + LENGTH_SIZE..]`, puts the length in front and
/// moves `pos` past the NAL unit; returns the NAL unit's length.
fn prefixed(
    out: &mut [u8],
    pos: &mut usize,
    write: impl FnOnce(&mut [u8]) -> Result<usize, IpcmError>,
) -> Result<usize, IpcmError> {
    let body = out
        .get_mut(*pos + LENGTH_SIZE..)
        .ok_or(IpcmError::BufferTooSmall)?;
    let n = write(body)?;
    let len = u32::try_from(n).map_err(|_| IpcmError::BufferTooSmall)?;
    out[*pos..*pos + LENGTH_SIZE].copy_from_slice(&len.to_be_bytes());
    *pos += LENGTH_SIZE + n;
    Ok(n)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use proptest::prelude::*;

    use super::*;
    use crate::hang::avc;

    /// Removes emulation prevention bytes, as a decoder does; `None` if the
    /// payload holds a start code or a misplaced escape.
    fn unescape(nal: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut zeros = 0;
        let mut i = 0;
        while i < nal.len() {
            let b = nal[i];
            if zeros >= 2 && b <= 3 {
                if b != 3 {
                    return None;
                }
                // The escape must be followed by 0..=3 or end the payload.
                if nal.get(i + 1).is_some_and(|&n| n > 3) {
                    return None;
                }
                zeros = 0;
                i += 1;
                continue;
            }
            out.push(b);
            zeros = if b == 0 { zeros + 1 } else { 0 };
            i += 1;
        }
        Some(out)
    }

    /// Reads bits of an RBSP, as a decoder does.
    struct Reader<'a> {
        data: &'a [u8],
        bit: usize,
    }

    impl Reader<'_> {
        fn bit(&mut self) -> u32 {
            let b = (self.data[self.bit / 8] >> (7 - self.bit % 8)) & 1;
            self.bit += 1;
            u32::from(b)
        }
        fn bits(&mut self, n: u32) -> u32 {
            (0..n).fold(0, |v, _| (v << 1) | self.bit())
        }
        fn ue(&mut self) -> u64 {
            let mut zeros = 0;
            while self.bit() == 0 {
                zeros += 1;
            }
            let mut v = 1u64;
            for _ in 0..zeros {
                v = (v << 1) | u64::from(self.bit());
            }
            v - 1
        }
        fn se(&mut self) -> i64 {
            let k = self.ue() as i64;
            if k % 2 == 1 { (k + 1) / 2 } else { -(k / 2) }
        }
    }

    #[test]
    fn exp_golomb_known_codes() {
        // H.264 Table 9-2: 0 → 1, 1 → 010, 2 → 011, 3 → 00100; then trailing bits.
        let mut buf = [0u8; 8];
        let mut w = BitWriter::new(&mut buf);
        for v in [0, 1, 2, 3] {
            w.ue(v);
        }
        w.trailing_bits();
        let n = w.finish().unwrap();
        assert_eq!(buf[..n], [0b1010_0110, 0b0100_1000]);
        // Table 9-3: se 1 → 010, -1 → 011, 2 → 00100.
        let mut buf = [0u8; 8];
        let mut w = BitWriter::new(&mut buf);
        for v in [1, -1, 2] {
            w.se(v);
        }
        w.trailing_bits();
        let n = w.finish().unwrap();
        assert_eq!(buf[..n], [0b0100_1100, 0b1001_0000]);
    }

    #[test]
    fn exp_golomb_round_trips_exhaustively_near_zero() {
        let mut buf = std::vec![0u8; 1 << 20];
        let mut w = BitWriter::new(&mut buf);
        for v in 0..70_000u32 {
            w.ue(v);
        }
        for v in -35_000..35_000i32 {
            w.se(v);
        }
        w.trailing_bits();
        let n = w.finish().unwrap();
        let rbsp = unescape(&buf[..n]).unwrap();
        let mut r = Reader {
            data: &rbsp,
            bit: 0,
        };
        for v in 0..70_000u64 {
            assert_eq!(r.ue(), v);
        }
        for v in -35_000..35_000i64 {
            assert_eq!(r.se(), v);
        }
        assert_eq!(r.bit(), 1);
    }

    proptest! {
        #[test]
        fn fields_round_trip(fields in proptest::collection::vec((0u8..4, any::<u32>(), 1u8..=32, any::<i32>()), 0..64)) {
            let mut buf = std::vec![0u8; 4096];
            let mut w = BitWriter::new(&mut buf);
            for &(kind, v, n, s) in &fields {
                match kind {
                    0 => w.ue(v),
                    1 => w.se(s),
                    2 => w.bits(v, n),
                    _ => { w.align_zero(); w.byte(v as u8) }
                }
            }
            w.trailing_bits();
            let len = w.finish().unwrap();
            let rbsp = unescape(&buf[..len]).unwrap();
            let mut r = Reader { data: &rbsp, bit: 0 };
            for &(kind, v, n, s) in &fields {
                match kind {
                    0 => prop_assert_eq!(r.ue(), u64::from(v)),
                    1 => prop_assert_eq!(r.se(), i64::from(s)),
                    2 => prop_assert_eq!(r.bits(u32::from(n)), if n == 32 { v } else { v & ((1 << n) - 1) }),
                    _ => {
                        while !r.bit.is_multiple_of(8) { prop_assert_eq!(r.bit(), 0); }
                        prop_assert_eq!(r.bits(8), u32::from(v as u8));
                    }
                }
            }
            prop_assert_eq!(r.bit(), 1);
            while !r.bit.is_multiple_of(8) { prop_assert_eq!(r.bit(), 0); }
            prop_assert_eq!(r.bit, rbsp.len() * 8);
        }

        #[test]
        fn escaping_leaves_no_start_code(bytes in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(3u8), any::<u8>()], 0..512)) {
            let mut buf = std::vec![0u8; 1024];
            let mut w = BitWriter::new(&mut buf);
            for &b in &bytes {
                w.byte(b);
            }
            let n = w.finish().unwrap();
            let escaped = &buf[..n];
            prop_assert!(escaped.windows(3).all(|t| !(t[0] == 0 && t[1] == 0 && t[2] <= 2)));
            prop_assert!(n <= bytes.len() + bytes.len() / 2 + 1);
            prop_assert_eq!(unescape(escaped).unwrap(), bytes);
        }

        #[test]
        fn access_unit_fits_its_bound(w in 1usize..8, h in 1usize..8, fill in any::<u8>(), zero_every in 1usize..5) {
            let g = Geometry::new(w * 16, h * 16).unwrap();
            let mut buf = std::vec![0u8; g.max_access_unit_len()];
            let mut i = 0usize;
            let n = write_access_unit(g, 0, |_, _, _| { i += 1; if i.is_multiple_of(zero_every) { fill } else { 0 } }, &mut buf).unwrap();
            prop_assert!(n <= buf.len());
        }
    }

    #[test]
    fn parameter_sets_parse_back() {
        let g = Geometry::new(96, 64).unwrap();
        let mut sps = [0u8; 32];
        let n = write_sps(g, &mut sps).unwrap();
        let sps = &sps[..n];
        assert_eq!(&avc::codec_string(sps).unwrap(), b"avc1.42c01f");
        let rbsp = unescape(&sps[4..]).unwrap();
        let mut r = Reader {
            data: &rbsp,
            bit: 0,
        };
        // id, log2_max_frame_num_minus4, poc type, ref frames, gaps, width, height.
        assert_eq!([r.ue(), r.ue(), r.ue(), r.ue()], [0, 0, 2, 1]);
        assert_eq!(r.bit(), 0);
        assert_eq!([r.ue(), r.ue()], [5, 3]);
        assert_eq!(r.bits(4), 0b1100);
        assert_eq!(r.bit(), 1);

        let mut pps = [0u8; 16];
        let n = write_pps(&mut pps).unwrap();
        assert_eq!(pps[0], 0x68);
        assert!(n >= 2);
        let mut avcc = [0u8; 64];
        avc::write_avcc(sps, &pps[..n], &mut avcc).unwrap();
    }

    #[test]
    fn idr_layout() {
        // One macroblock of 0x80 samples: header, mb_type, alignment, 384 samples, trailing byte.
        let g = Geometry::new(16, 16).unwrap();
        let mut buf = [0u8; 512];
        let n = write_idr(g, 1, |_, _, _| 0x80, &mut buf).unwrap();
        assert_eq!(buf[0], 0x65);
        let rbsp = unescape(&buf[1..n]).unwrap();
        let mut r = Reader {
            data: &rbsp,
            bit: 0,
        };
        assert_eq!([r.ue(), r.ue(), r.ue()], [0, 7, 0]);
        assert_eq!(r.bits(4), 0); // frame_num
        assert_eq!(r.ue(), 1); // idr_pic_id
        assert_eq!(r.bits(2), 0);
        assert_eq!(r.se(), 0);
        assert_eq!(r.ue(), 1);
        assert_eq!(r.ue(), 25);
        while !r.bit.is_multiple_of(8) {
            assert_eq!(r.bit(), 0);
        }
        let start = r.bit / 8;
        assert!(rbsp[start..start + 384].iter().all(|&b| b == 0x80));
        assert_eq!(rbsp[start + 384..], [0x80]);
    }

    #[test]
    fn access_unit_is_length_prefixed() {
        let g = Geometry::new(32, 16).unwrap();
        let mut buf = std::vec![0u8; g.max_access_unit_len()];
        let n = write_access_unit(g, 0, |p, x, y| (x + y) as u8 + p as u8, &mut buf).unwrap();
        let types: Vec<u8> = avc::LengthPrefixed::new(&buf[..n])
            .map(|nal| avc::nal_type(nal.unwrap()[0]))
            .collect();
        assert_eq!(types, [avc::NAL_SPS, avc::NAL_PPS, avc::NAL_IDR]);
        // Video-range samples need no escapes: the slice is samples plus headers.
        let n = write_access_unit(g, 0, |_, _, _| 16, &mut buf).unwrap();
        assert!(n > g.sample_bytes() && n < g.sample_bytes() + 64);
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(Geometry::new(0, 16), Err(IpcmError::BadSize));
        assert_eq!(Geometry::new(17, 16), Err(IpcmError::BadSize));
        assert_eq!(Geometry::new(16, 8), Err(IpcmError::BadSize));
        assert_eq!(
            Geometry::new(1280, 720).map(Geometry::macroblocks),
            Ok(3600)
        );
        assert_eq!(Geometry::new(1296, 720), Err(IpcmError::BadSize));
        assert_eq!(Geometry::new(usize::MAX & !15, 16), Err(IpcmError::BadSize));
        let g = Geometry::new(16, 16).unwrap();
        let mut small = [0u8; 100];
        assert_eq!(
            write_access_unit(g, 0, |_, _, _| 1, &mut small),
            Err(IpcmError::BufferTooSmall)
        );
        assert_eq!(write_sps(g, &mut []), Err(IpcmError::BufferTooSmall));
        assert_eq!(write_pps(&mut small[..1]), Err(IpcmError::BufferTooSmall));
    }
}
