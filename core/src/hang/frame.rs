//! The hang legacy container (docs/protocol.md §10.3): a frame's payload is
//! `varint(pts_us)` followed by the codec's bytes.
//!
//! The varint is a QUIC varint (RFC 9000 §16), shortest form on write, any
//! form on read. The timestamp stays below [`MAX_TIMESTAMP`] (2^53, where a
//! browser's numbers stop being exact). An empty codec part is a marker
//! players skip; [`decode`] returns it as an empty slice and leaves the
//! decision to the caller.

use core::fmt;

use crate::wire::varint;

/// The longest prefix [`encode_prefix`] writes, in bytes.
pub const MAX_PREFIX_LEN: usize = 8;

/// The largest presentation time the container carries, in microseconds: 2^53 − 1.
pub const MAX_TIMESTAMP: u64 = (1 << 53) - 1;

/// Why a legacy frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FrameError {
    /// The payload ends inside (or before) the timestamp varint.
    Truncated,
    /// The timestamp is above [`MAX_TIMESTAMP`].
    TimestampTooLarge,
    /// The caller's buffer cannot hold the prefix.
    BufferTooSmall,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameError::Truncated => "hang frame: payload ends inside its timestamp",
            FrameError::TimestampTooLarge => "hang frame: timestamp above 2^53 - 1 µs",
            FrameError::BufferTooSmall => "hang frame: buffer too small for the prefix",
        })
    }
}

impl core::error::Error for FrameError {}

/// The bytes [`encode_prefix`] writes for `pts_us` (1, 2, 4 or 8).
pub const fn prefix_len(pts_us: u64) -> usize {
    varint::len(pts_us)
}

/// Writes the prefix of a frame presented at `pts_us` at the front of `buf`;
/// the codec bytes go right after it. Returns the prefix length.
///
/// A caller that already holds the codec bytes at offset [`MAX_PREFIX_LEN`]
/// of its buffer can write the prefix into `buf[MAX_PREFIX_LEN - n..]`
/// (`n` from [`prefix_len`]) and send the frame without moving them.
///
/// # Errors
/// [`FrameError::TimestampTooLarge`] above [`MAX_TIMESTAMP`];
/// [`FrameError::BufferTooSmall`] if `buf` is shorter than the prefix.
/// Nothing is written on error.
pub fn encode_prefix(pts_us: u64, buf: &mut [u8]) -> Result<usize, FrameError> {
    if pts_us > MAX_TIMESTAMP {
        return Err(FrameError::TimestampTooLarge);
    }
    varint::encode(pts_us, buf).map_err(|_| FrameError::BufferTooSmall)
}

/// Splits a legacy frame's payload into its presentation time (µs) and codec bytes.
///
/// # Errors
/// [`FrameError::Truncated`] if the payload ends inside the varint;
/// [`FrameError::TimestampTooLarge`] above [`MAX_TIMESTAMP`].
pub fn decode(payload: &[u8]) -> Result<(u64, &[u8]), FrameError> {
    let (pts, n) = varint::decode(payload).map_err(|_| FrameError::Truncated)?;
    if pts > MAX_TIMESTAMP {
        return Err(FrameError::TimestampTooLarge);
    }
    Ok((pts, payload.get(n..).unwrap_or(&[])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trips() {
        let mut buf = [0u8; 32];
        for pts in [0, 1, 63, 64, 33_333, 1 << 30, MAX_TIMESTAMP] {
            let n = encode_prefix(pts, &mut buf).unwrap();
            assert_eq!(n, prefix_len(pts));
            assert!(n <= MAX_PREFIX_LEN);
            buf[n..n + 3].copy_from_slice(b"abc");
            assert_eq!(decode(&buf[..n + 3]), Ok((pts, &b"abc"[..])));
        }
    }

    #[test]
    fn known_bytes() {
        // 33 333 µs: a 4-byte varint (above 2^14).
        let mut buf = [0u8; 8];
        assert_eq!(encode_prefix(33_333, &mut buf), Ok(4));
        assert_eq!(buf[..4], [0x80, 0x00, 0x82, 0x35]);
        assert_eq!(decode(&[0x00]), Ok((0, &[][..])));
        // A long form of 5 is accepted.
        assert_eq!(decode(&[0x40, 0x05, 0xaa]), Ok((5, &[0xaa][..])));
    }

    #[test]
    fn in_place_prefix() {
        let mut buf = [0u8; MAX_PREFIX_LEN + 2];
        buf[MAX_PREFIX_LEN..].copy_from_slice(&[0x65, 0x88]);
        let pts = 1_000_000;
        let start = MAX_PREFIX_LEN - prefix_len(pts);
        encode_prefix(pts, &mut buf[start..]).unwrap();
        assert_eq!(decode(&buf[start..]), Ok((pts, &[0x65, 0x88][..])));
    }

    #[test]
    fn bad_input_is_named() {
        assert_eq!(decode(&[]), Err(FrameError::Truncated));
        assert_eq!(decode(&[0x80, 0x00]), Err(FrameError::Truncated));
        assert_eq!(
            decode(&[0xc0, 0x20, 0, 0, 0, 0, 0, 0]),
            Err(FrameError::TimestampTooLarge)
        );
        let mut buf = [0u8; 8];
        assert_eq!(
            encode_prefix(MAX_TIMESTAMP + 1, &mut buf),
            Err(FrameError::TimestampTooLarge)
        );
        assert_eq!(
            encode_prefix(100, &mut buf[..1]),
            Err(FrameError::BufferTooSmall)
        );
        assert_eq!(buf, [0; 8]);
    }
}
