//! The errors every wire codec reports: [`DecodeError`] and [`EncodeError`].

use core::fmt;

/// Why bytes could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DecodeError {
    /// The input ends before the item does; feed more bytes and retry (nothing was consumed).
    Incomplete,
    /// A declared length exceeds the configured limit; checked before any of it is read.
    TooLarge,
    /// A length-delimited body holds bytes past its last field.
    TrailingBytes,
    /// A length-delimited body ends before its last field.
    ShortBody,
    /// A type code this codec does not know.
    UnknownType(u64),
    /// A field holds a value outside its allowed range.
    InvalidValue,
    /// A string field is not UTF-8.
    InvalidUtf8,
    /// A parameter or field that may appear once appeared twice.
    Duplicate,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Incomplete => f.write_str("input ends early"),
            DecodeError::TooLarge => f.write_str("declared length over the limit"),
            DecodeError::TrailingBytes => f.write_str("trailing bytes after the last field"),
            DecodeError::ShortBody => f.write_str("body ends before its last field"),
            DecodeError::UnknownType(t) => write!(f, "unknown type {t:#x}"),
            DecodeError::InvalidValue => f.write_str("field value out of range"),
            DecodeError::InvalidUtf8 => f.write_str("string is not UTF-8"),
            DecodeError::Duplicate => f.write_str("duplicate field"),
        }
    }
}

impl core::error::Error for DecodeError {}

/// Why a value could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum EncodeError {
    /// The output buffer is too small; nothing usable was written.
    BufferTooSmall,
    /// An integer does not fit a varint (over 2^62 - 1), or a length over its limit.
    ValueTooLarge,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BufferTooSmall => f.write_str("output buffer too small"),
            EncodeError::ValueTooLarge => f.write_str("value too large for its field"),
        }
    }
}

impl core::error::Error for EncodeError {}
