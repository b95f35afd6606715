//! H.264 framing for hang (docs/protocol.md §10.3): NAL units in Annex-B and
//! length-prefixed form, the avcC record and the `avc1.PPCCLL` codec string.
//!
//! Everything here borrows the caller's bytes and writes into the caller's
//! buffers: no allocation, no panic on any input.

use core::fmt;

/// NAL unit type of a non-IDR slice.
pub const NAL_SLICE: u8 = 1;
/// NAL unit type of an IDR slice (a keyframe).
pub const NAL_IDR: u8 = 5;
/// NAL unit type of supplemental enhancement information.
pub const NAL_SEI: u8 = 6;
/// NAL unit type of a sequence parameter set.
pub const NAL_SPS: u8 = 7;
/// NAL unit type of a picture parameter set.
pub const NAL_PPS: u8 = 8;
/// NAL unit type of an access unit delimiter.
pub const NAL_AUD: u8 = 9;

/// Bytes of the length before each NAL unit of an `avc1` access unit.
pub const LENGTH_SIZE: usize = 4;

/// The length of a codec string `avc1.PPCCLL`.
pub const CODEC_LEN: usize = 11;

/// Why H.264 framing was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AvcError {
    /// A length prefix or a record field runs past the end of the input.
    Truncated,
    /// A zero-length NAL unit, or a NAL header with its forbidden bit set.
    BadNal,
    /// An SPS shorter than its four fixed bytes, or a NAL that is not the SPS/PPS it should be.
    BadParameterSet,
    /// An avcC record with a version other than 1, or no SPS or PPS in it.
    BadRecord,
    /// The output buffer is too small.
    BufferTooSmall,
}

impl fmt::Display for AvcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AvcError::Truncated => "h264: a length runs past the end of the data",
            AvcError::BadNal => "h264: empty NAL unit or forbidden bit set",
            AvcError::BadParameterSet => "h264: malformed SPS or PPS",
            AvcError::BadRecord => "h264: malformed avcC record",
            AvcError::BufferTooSmall => "h264: output buffer too small",
        })
    }
}

impl core::error::Error for AvcError {}

/// The type of the NAL unit starting with `header` (its low five bits).
pub const fn nal_type(header: u8) -> u8 {
    header & 0x1f
}

/// True for a slice NAL (types 1 to 5) whose first macroblock is 0: the
/// first slice of a new picture.
pub fn starts_picture(nal: &[u8]) -> bool {
    match nal {
        // first_mb_in_slice is ue(v): a leading 1 bit is the value 0.
        [h, b, ..] => (NAL_SLICE..=NAL_IDR).contains(&nal_type(*h)) && b & 0x80 != 0,
        _ => false,
    }
}

/// The NAL units of an Annex-B byte stream, start codes (`00 00 01`, `00 00 00 01`) removed.
///
/// Bytes before the first start code are skipped; trailing zero bytes of a
/// NAL (part of the next 4-byte start code) are not part of it.
#[derive(Debug, Clone)]
pub struct AnnexB<'a> {
    rest: &'a [u8],
}

impl<'a> AnnexB<'a> {
    /// The NAL units of `stream`.
    pub fn new(stream: &'a [u8]) -> AnnexB<'a> {
        let rest = match find_start(stream) {
            Some((_, end)) => stream.get(end..).unwrap_or(&[]),
            None => &[],
        };
        AnnexB { rest }
    }
}

/// The first start code in `b`: (its first byte, the byte after it).
pub fn find_start(b: &[u8]) -> Option<(usize, usize)> {
    let i = b.windows(3).position(|w| w == [0, 0, 1])?;
    Some((i, i + 3))
}

impl<'a> Iterator for AnnexB<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (nal, rest) = match find_start(self.rest) {
                Some((start, end)) => (&self.rest[..start], &self.rest[end..]),
                None => (self.rest, &[][..]),
            };
            self.rest = rest;
            let mut len = nal.len();
            while len > 0 && nal[len - 1] == 0 {
                len -= 1;
            }
            if len > 0 {
                return Some(&nal[..len]);
            }
        }
    }
}

/// The NAL units of a length-prefixed (`avc1`) access unit, [`LENGTH_SIZE`]-byte lengths.
///
/// Yields an error, then nothing, at the first length that is zero or runs
/// past the end.
#[derive(Debug, Clone)]
pub struct LengthPrefixed<'a> {
    rest: &'a [u8],
}

impl<'a> LengthPrefixed<'a> {
    /// The NAL units of `access_unit`.
    pub fn new(access_unit: &'a [u8]) -> LengthPrefixed<'a> {
        LengthPrefixed { rest: access_unit }
    }
}

impl<'a> Iterator for LengthPrefixed<'a> {
    type Item = Result<&'a [u8], AvcError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let out = (|| {
            let len: [u8; LENGTH_SIZE] = self
                .rest
                .get(..LENGTH_SIZE)
                .and_then(|l| l.try_into().ok())
                .ok_or(AvcError::Truncated)?;
            let len = u32::from_be_bytes(len) as usize;
            let nal = self
                .rest
                .get(LENGTH_SIZE..LENGTH_SIZE.saturating_add(len))
                .ok_or(AvcError::Truncated)?;
            match nal.first() {
                Some(h) if h & 0x80 == 0 => Ok(nal),
                _ => Err(AvcError::BadNal),
            }
        })();
        match out {
            Ok(nal) => self.rest = &self.rest[LENGTH_SIZE + nal.len()..],
            Err(_) => self.rest = &[],
        }
        Some(out)
    }
}

/// Writes `nal` with its [`LENGTH_SIZE`]-byte length into `out`; returns the bytes written.
///
/// # Errors
/// [`AvcError::BufferTooSmall`]; [`AvcError::BadNal`] for an empty NAL or one over 4 GiB.
#[cfg(test)]
pub fn write_length_prefixed(nal: &[u8], out: &mut [u8]) -> Result<usize, AvcError> {
    let len = u32::try_from(nal.len()).map_err(|_| AvcError::BadNal)?;
    if len == 0 {
        return Err(AvcError::BadNal);
    }
    let n = LENGTH_SIZE + nal.len();
    let dst = out.get_mut(..n).ok_or(AvcError::BufferTooSmall)?;
    dst[..LENGTH_SIZE].copy_from_slice(&len.to_be_bytes());
    dst[LENGTH_SIZE..].copy_from_slice(nal);
    Ok(n)
}

/// The codec string `avc1.PPCCLL` of the stream whose SPS NAL (header included) is `sps`.
///
/// # Errors
/// [`AvcError::BadParameterSet`] if `sps` is not an SPS of at least four bytes.
pub fn codec_string(sps: &[u8]) -> Result<[u8; CODEC_LEN], AvcError> {
    let [h, profile, constraints, level, ..] = *sps else {
        return Err(AvcError::BadParameterSet);
    };
    if nal_type(h) != NAL_SPS {
        return Err(AvcError::BadParameterSet);
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = *b"avc1.000000";
    for (i, b) in [profile, constraints, level].into_iter().enumerate() {
        out[5 + 2 * i] = HEX[usize::from(b >> 4)];
        out[6 + 2 * i] = HEX[usize::from(b & 0xf)];
    }
    Ok(out)
}

/// Writes the avcC record (ISO/IEC 14496-15 §5.3.3.1: version 1, 4-byte
/// lengths, one SPS, one PPS) into `out`; returns its length.
///
/// # Errors
/// [`AvcError::BadParameterSet`] for an `sps` or `pps` of the wrong type, or
/// over 65535 bytes; [`AvcError::BufferTooSmall`].
pub fn write_avcc(sps: &[u8], pps: &[u8], out: &mut [u8]) -> Result<usize, AvcError> {
    let (Ok(sps_len), Ok(pps_len)) = (u16::try_from(sps.len()), u16::try_from(pps.len())) else {
        return Err(AvcError::BadParameterSet);
    };
    codec_string(sps)?;
    if pps.first().is_none_or(|h| nal_type(*h) != NAL_PPS) {
        return Err(AvcError::BadParameterSet);
    }
    let n = 6 + 2 + sps.len() + 1 + 2 + pps.len();
    let dst = out.get_mut(..n).ok_or(AvcError::BufferTooSmall)?;
    dst[..6].copy_from_slice(&[1, sps[1], sps[2], sps[3], 0xfc | 3, 0xe0 | 1]);
    dst[6..8].copy_from_slice(&sps_len.to_be_bytes());
    dst[8..8 + sps.len()].copy_from_slice(sps);
    let p = 8 + sps.len();
    dst[p] = 1;
    dst[p + 1..p + 3].copy_from_slice(&pps_len.to_be_bytes());
    dst[p + 3..].copy_from_slice(pps);
    Ok(n)
}

/// The first SPS and PPS of an avcC record, and its NAL length size (1 to 4).
///
/// # Errors
/// [`AvcError::BadRecord`] for another version or a record without SPS or PPS;
/// [`AvcError::Truncated`] when a field runs past the end.
pub fn parse_avcc(record: &[u8]) -> Result<(&[u8], &[u8], usize), AvcError> {
    let head = record.get(..6).ok_or(AvcError::Truncated)?;
    if head[0] != 1 {
        return Err(AvcError::BadRecord);
    }
    let length_size = usize::from(head[4] & 3) + 1;
    let mut at = 6;
    let first = |count: usize, at: &mut usize| -> Result<Option<&[u8]>, AvcError> {
        let mut found = None;
        for _ in 0..count {
            let len = record.get(*at..*at + 2).ok_or(AvcError::Truncated)?;
            let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
            let set = record
                .get(*at + 2..*at + 2 + len)
                .ok_or(AvcError::Truncated)?;
            found = found.or(Some(set));
            *at += 2 + len;
        }
        Ok(found)
    };
    let sps = first(usize::from(head[5] & 0x1f), &mut at)?;
    let count = usize::from(*record.get(at).ok_or(AvcError::Truncated)?);
    at += 1;
    let pps = first(count, &mut at)?;
    match (sps, pps) {
        (Some(s), Some(p)) if !s.is_empty() && !p.is_empty() => Ok((s, p, length_size)),
        _ => Err(AvcError::BadRecord),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPS: &[u8] = &[0x67, 0x42, 0xc0, 0x0d, 0x8c, 0x8d, 0x40];
    const PPS: &[u8] = &[0x68, 0xce, 0x3c, 0x80];

    #[test]
    fn annex_b_splits_on_both_start_codes() {
        let stream = [
            0xff, 0, 0, 0, 1, 0x67, 1, 2, 0, 0, 1, 0x68, 3, 0, 0, 0, 1, 0x65, 0x88, 0, 0, 1, 0, 0,
            1, 0x41,
        ];
        let nals: heapless::Vec<&[u8], 8> = AnnexB::new(&stream).collect();
        assert_eq!(
            &nals[..],
            &[&[0x67, 1, 2][..], &[0x68, 3], &[0x65, 0x88], &[0x41]]
        );
        assert_eq!(AnnexB::new(&[1, 2, 3]).count(), 0);
        assert_eq!(AnnexB::new(&[]).count(), 0);
    }

    #[test]
    fn length_prefixed_round_trip_and_errors() {
        let mut buf = [0u8; 32];
        let a = write_length_prefixed(&[0x65, 1, 2], &mut buf).unwrap();
        let b = write_length_prefixed(&[0x41], &mut buf[a..]).unwrap();
        let nals: heapless::Vec<Result<&[u8], AvcError>, 4> =
            LengthPrefixed::new(&buf[..a + b]).collect();
        assert_eq!(&nals[..], &[Ok(&[0x65, 1, 2][..]), Ok(&[0x41][..])]);
        let mut it = LengthPrefixed::new(&buf[..a + b - 1]);
        assert_eq!(it.next(), Some(Ok(&[0x65, 1, 2][..])));
        assert_eq!(it.next(), Some(Err(AvcError::Truncated)));
        assert_eq!(it.next(), None);
        let bad: [&[u8]; 4] = [
            &[0, 0, 1],
            &[0, 0, 0, 0],
            &[0, 0, 0, 1, 0x80],
            &[0xff, 0xff, 0xff, 0xff, 1],
        ];
        for b in bad {
            assert!(LengthPrefixed::new(b).next().unwrap().is_err(), "{b:?}");
        }
        let mut buf = [0u8; 8];
        assert_eq!(write_length_prefixed(&[], &mut buf), Err(AvcError::BadNal));
        assert_eq!(
            write_length_prefixed(&[1, 2], &mut buf[..5]),
            Err(AvcError::BufferTooSmall)
        );
    }

    #[test]
    fn avcc_and_codec_string() {
        assert_eq!(&codec_string(SPS).unwrap(), b"avc1.42c00d");
        assert_eq!(codec_string(PPS), Err(AvcError::BadParameterSet));
        assert_eq!(codec_string(&SPS[..3]), Err(AvcError::BadParameterSet));
        let mut buf = [0u8; 64];
        let n = write_avcc(SPS, PPS, &mut buf).unwrap();
        assert_eq!(
            &buf[..8],
            &[1, 0x42, 0xc0, 0x0d, 0xff, 0xe1, 0, SPS.len() as u8]
        );
        assert_eq!(parse_avcc(&buf[..n]), Ok((SPS, PPS, 4)));
        for cut in 0..n {
            assert!(parse_avcc(&buf[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            write_avcc(SPS, PPS, &mut buf[..n - 1]),
            Err(AvcError::BufferTooSmall)
        );
        assert_eq!(
            write_avcc(PPS, SPS, &mut buf),
            Err(AvcError::BadParameterSet)
        );
        let mut bad = buf;
        bad[0] = 2;
        assert_eq!(parse_avcc(&bad[..n]), Err(AvcError::BadRecord));
        // No SPS in the record.
        assert_eq!(
            parse_avcc(&[1, 0x42, 0, 0, 0xff, 0xe0, 0]),
            Err(AvcError::BadRecord)
        );
    }

    #[test]
    fn picture_starts() {
        assert!(starts_picture(&[0x65, 0x88]));
        assert!(starts_picture(&[0x41, 0x9a]));
        assert!(!starts_picture(&[0x41, 0x1a]));
        assert!(!starts_picture(&[0x67, 0x88]));
        assert!(!starts_picture(&[0x65]));
    }
}
