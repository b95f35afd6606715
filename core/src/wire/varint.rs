//! QUIC variable-length integers (RFC 9000 §16), the integer encoding of QMux and moq-lite-05.
//!
//! The two high bits of the first byte give the length (1, 2, 4 or 8 bytes);
//! the rest is the value, big-endian. We always write the shortest form and
//! accept any form on read, as moq-dev does (docs/protocol.md §0).

use super::{DecodeError, EncodeError};

/// The largest value a varint can carry: 2^62 - 1.
pub const MAX: u64 = (1 << 62) - 1;

/// The number of bytes the shortest encoding of `v` takes (1, 2, 4 or 8).
///
/// Values above [`MAX`] report 8; [`encode`] refuses them.
#[inline]
pub const fn len(v: u64) -> usize {
    if v < (1 << 6) {
        1
    } else if v < (1 << 14) {
        2
    } else if v < (1 << 30) {
        4
    } else {
        8
    }
}

/// The encoded length announced by a varint's first byte.
#[inline]
pub const fn len_from_first(b: u8) -> usize {
    1 << (b >> 6)
}

/// Decodes one varint from the front of `buf`, returning it and the bytes it took.
///
/// # Errors
/// [`DecodeError::Incomplete`] if `buf` ends inside the varint; nothing is consumed.
#[inline]
pub fn decode(buf: &[u8]) -> Result<(u64, usize), DecodeError> {
    let first = *buf.first().ok_or(DecodeError::Incomplete)?;
    let n = len_from_first(first);
    if buf.len() < n {
        return Err(DecodeError::Incomplete);
    }
    let mut v = u64::from(first & 0x3f);
    for b in &buf[1..n] {
        v = (v << 8) | u64::from(*b);
    }
    Ok((v, n))
}

/// Encodes `v` in its shortest form at the front of `buf`, returning the bytes written.
///
/// # Errors
/// [`EncodeError::ValueTooLarge`] if `v > MAX`; [`EncodeError::BufferTooSmall`]
/// if `buf` cannot hold it. Nothing is written on error.
#[inline]
pub fn encode(v: u64, buf: &mut [u8]) -> Result<usize, EncodeError> {
    if v > MAX {
        return Err(EncodeError::ValueTooLarge);
    }
    let n = len(v);
    let out = buf.get_mut(..n).ok_or(EncodeError::BufferTooSmall)?;
    let tag: u64 = match n {
        1 => 0,
        2 => 0b01 << 14,
        4 => 0b10 << 30,
        _ => 0b11 << 62,
    };
    let bytes = (v | tag).to_be_bytes();
    out.copy_from_slice(&bytes[8 - n..]);
    Ok(n)
}

/// Maps a signed value onto a varint with zigzag (docs/protocol.md §0: 0→0, −1→1, 1→2 …).
///
/// # Errors
/// [`EncodeError::ValueTooLarge`] outside ±2^61, where the result would not fit a varint.
#[inline]
pub const fn zigzag_encode(s: i64) -> Result<u64, EncodeError> {
    if s >= (1 << 61) || s < -(1 << 61) {
        return Err(EncodeError::ValueTooLarge);
    }
    Ok(((s << 1) ^ (s >> 63)) as u64)
}

/// Inverse of [`zigzag_encode`].
#[inline]
pub const fn zigzag_decode(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn enc(v: u64) -> heapless::Vec<u8, 8> {
        let mut b = [0u8; 8];
        let n = encode(v, &mut b).unwrap();
        heapless::Vec::from_slice(&b[..n]).unwrap()
    }

    #[test]
    fn protocol_examples() {
        // docs/protocol.md §0.
        assert_eq!(&enc(25)[..], &[0x19]);
        assert_eq!(&enc(100)[..], &[0x40, 0x64]);
        assert_eq!(&enc(250)[..], &[0x40, 0xfa]);
        assert_eq!(&enc(30000)[..], &[0x80, 0x00, 0x75, 0x30]);
        assert_eq!(&enc(1048576)[..], &[0x80, 0x10, 0x00, 0x00]);
        assert_eq!(&enc(16382)[..], &[0x7f, 0xfe]);
        assert_eq!(
            &enc(0x3f5153300d0a0d0a)[..],
            &[0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a]
        );
    }

    #[test]
    fn long_forms_are_accepted() {
        assert_eq!(decode(&[0x40, 0x05]).unwrap(), (5, 2));
        assert_eq!(decode(&[0xc0, 0, 0, 0, 0, 0, 0, 7]).unwrap(), (7, 8));
    }

    #[test]
    fn short_input_consumes_nothing() {
        assert_eq!(decode(&[]), Err(DecodeError::Incomplete));
        assert_eq!(decode(&[0x80, 0x00, 0x75]), Err(DecodeError::Incomplete));
    }

    #[test]
    fn refuses_too_large() {
        assert_eq!(
            encode(MAX + 1, &mut [0; 8]),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(encode(300, &mut [0; 1]), Err(EncodeError::BufferTooSmall));
    }

    #[test]
    fn zigzag_examples() {
        for (s, u) in [
            (0i64, 0u64),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (2, 4),
            (1000, 2000),
            (-33, 65),
        ] {
            assert_eq!(zigzag_encode(s).unwrap(), u);
            assert_eq!(zigzag_decode(u), s);
        }
        assert!(zigzag_encode(1 << 61).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(v in 0..=MAX) {
            let b = enc(v);
            prop_assert_eq!(b.len(), len(v));
            prop_assert_eq!(decode(&b).unwrap(), (v, b.len()));
            for cut in 0..b.len() {
                prop_assert_eq!(decode(&b[..cut]), Err(DecodeError::Incomplete));
            }
        }

        #[test]
        fn zigzag_round_trip(s in -(1i64 << 61)..(1i64 << 61)) {
            prop_assert_eq!(zigzag_decode(zigzag_encode(s).unwrap()), s);
        }
    }
}
