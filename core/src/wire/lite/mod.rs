//! moq-lite-05 messages (docs/protocol.md §3): stream types, control messages, typed
//! subscribe responses, group headers, datagram bodies and error codes.
//!
//! Every decoder borrows from its input (strings are `&'a str` into the received
//! bytes, hop and parameter lists are raw views with iterators) and nothing
//! allocates. Control messages share one framing rule (docs/protocol.md §3.2): a
//! `Message Length (i)` then exactly that many body bytes. Each message type
//! implements [`Message`] for its body only; [`decode_message`] /
//! [`encode_message`] (and their [`Reader`] / [`Writer`] forms) add the length:
//!
//! * the length is checked against the message's limit ([`Message::MAX_BODY`])
//!   *before* waiting for the body, so an oversized message fails at once with
//!   [`DecodeError::TooLarge`];
//! * partial input yields [`DecodeError::Incomplete`] and consumes nothing;
//! * a body that ends before its last field is [`DecodeError::ShortBody`] (the
//!   *body* is short although the input held all of it), and a body with bytes
//!   after its last field is [`DecodeError::TrailingBytes`];
//! * the encoder writes the length from [`Message::body_len`], which also
//!   validates every value, so a failed encode writes nothing.
//!
//! FRAME headers live in [`crate::model::frame`]; path normalization in
//! [`crate::model::path`]. Here broadcast paths and track names are opaque strings.

mod announce;
mod datagram;
mod error;
mod fetch;
mod goaway;
mod group;
mod probe;
mod setup;
mod stream;
mod subscribe;
mod track;

pub use announce::{
    Announce, AnnounceOk, AnnounceRequest, AnnounceStatus, HopIter, Hops, MAX_HOPS,
};
pub use datagram::Datagram;
pub use error::{SessionCode, StreamCode};
pub use fetch::Fetch;
pub use goaway::{Goaway, MAX_GOAWAY_URI};
pub use group::Group;
pub use probe::Probe;
pub use setup::{MAX_SETUP_PARAMS, Param, ParamIter, ProbeLevel, Role, Setup};
pub use stream::{BidiStreamType, UniStreamType};
pub use subscribe::{Subscribe, SubscribeResponse, SubscribeUpdate};
pub use track::{Track, TrackInfo};

use super::{DecodeError, EncodeError, Reader, Writer, varint};
use crate::time::Duration;

/// Largest control-message body accepted on receipt: 64 MiB (docs/protocol.md §3.2).
pub const MAX_CONTROL_BODY: usize = 64 * 1024 * 1024;

/// Largest SETUP body accepted on receipt: 64 KiB (docs/protocol.md §3.2).
pub const MAX_SETUP_BODY: usize = 64 * 1024;

/// Largest body any combination of `n` varints can take (each at most 8 bytes).
const fn varints(n: usize) -> usize {
    8 * n
}

/// A length-prefixed moq-lite control message body (docs/protocol.md §3.2).
///
/// Implementors decode and encode the body only; the framing functions
/// ([`decode_message`], [`read_message`], [`encode_message`], [`write_message`])
/// handle the `Message Length (i)` prefix and its checks.
pub trait Message<'a>: Sized {
    /// Short name for logs.
    const NAME: &'static str;

    /// Largest body accepted on receipt; a larger declared length is
    /// [`DecodeError::TooLarge`] before any body byte is awaited. Messages made of
    /// fixed fields use the largest body those fields can take.
    const MAX_BODY: usize;

    /// Decodes the body from `r`, which holds exactly the body bytes.
    ///
    /// # Errors
    /// Any [`DecodeError`]; [`DecodeError::Incomplete`] from here means the body ended
    /// early and is reported to callers of the framing functions as
    /// [`DecodeError::ShortBody`].
    fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError>;

    /// The exact number of body bytes [`Message::encode_body`] writes, after checking
    /// that every value fits its field.
    ///
    /// # Errors
    /// [`EncodeError::ValueTooLarge`] when a value does not fit its field or a list or
    /// string exceeds its limit.
    fn body_len(&self) -> Result<usize, EncodeError>;

    /// Writes the body. Call [`Message::body_len`] first: it performs the value checks,
    /// so after it succeeds this can only fail for lack of room.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`]; [`EncodeError::ValueTooLarge`] for values
    /// [`Message::body_len`] would have refused.
    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError>;
}

/// Decodes one length-prefixed message from the front of `buf`, returning it and the
/// number of bytes it took (prefix included).
///
/// # Errors
/// [`DecodeError::Incomplete`] if `buf` holds less than the whole message (feed more
/// and retry); [`DecodeError::TooLarge`] if the declared length exceeds
/// [`Message::MAX_BODY`]; [`DecodeError::ShortBody`] / [`DecodeError::TrailingBytes`]
/// if the body does not match its length; any error of the body decoder.
pub fn decode_message<'a, M: Message<'a>>(buf: &'a [u8]) -> Result<(M, usize), DecodeError> {
    decode_message_within(buf, usize::MAX)
}

/// [`decode_message`] with a caller limit on the body length (used when the caller's
/// receive buffer is smaller than [`Message::MAX_BODY`]); the tighter limit applies.
///
/// # Errors
/// As [`decode_message`].
pub fn decode_message_within<'a, M: Message<'a>>(
    buf: &'a [u8],
    limit: usize,
) -> Result<(M, usize), DecodeError> {
    let mut r = Reader::new(buf);
    let msg = read_message_within(&mut r, limit)?;
    Ok((msg, r.position()))
}

/// Reads one length-prefixed message from `r`; on any error nothing is consumed.
///
/// # Errors
/// As [`decode_message`].
pub fn read_message<'a, M: Message<'a>>(r: &mut Reader<'a>) -> Result<M, DecodeError> {
    read_message_within(r, usize::MAX)
}

/// [`read_message`] with a caller limit on the body length; the tighter limit applies.
///
/// # Errors
/// As [`decode_message`].
pub fn read_message_within<'a, M: Message<'a>>(
    r: &mut Reader<'a>,
    limit: usize,
) -> Result<M, DecodeError> {
    let mut cur = r.clone();
    let msg = read_framed(&mut cur, limit.min(M::MAX_BODY), M::decode_body).inspect_err(|e| {
        if *e != DecodeError::Incomplete {
            debug!("moq-lite: {} failed to decode: {}", M::NAME, e);
        }
    })?;
    *r = cur;
    Ok(msg)
}

/// Reads `Message Length (i)` (at most `limit`) and decodes exactly that many bytes
/// with `body`. docs/protocol.md §3.2: the length must match the body exactly.
fn read_framed<'a, T>(
    r: &mut Reader<'a>,
    limit: usize,
    body: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    // The limit is checked on the length alone, before the body has arrived.
    let len = r.length(limit)?;
    let mut sub = r.sub(len)?;
    // The whole body is here, so running out inside it means the body is short.
    let value = body(&mut sub).map_err(|e| match e {
        DecodeError::Incomplete => DecodeError::ShortBody,
        e => e,
    })?;
    if !sub.is_empty() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(value)
}

/// The encoded size of `msg` with its length prefix.
///
/// # Errors
/// [`EncodeError::ValueTooLarge`] if a value does not fit or the body exceeds
/// [`Message::MAX_BODY`] (we never send what our own receiver would refuse).
pub fn message_len<'a, M: Message<'a>>(msg: &M) -> Result<usize, EncodeError> {
    let body = msg.body_len()?;
    if body > M::MAX_BODY {
        return Err(EncodeError::ValueTooLarge);
    }
    Ok(vlen(body as u64)? + body)
}

/// Encodes `msg` with its length prefix at the front of `buf`, returning the bytes written.
///
/// # Errors
/// As [`write_message`].
pub fn encode_message<'a, M: Message<'a>>(msg: &M, buf: &mut [u8]) -> Result<usize, EncodeError> {
    let mut w = Writer::new(buf);
    write_message(msg, &mut w)?;
    Ok(w.position())
}

/// Writes `msg` with its length prefix; on error nothing is written.
///
/// # Errors
/// [`EncodeError::ValueTooLarge`] as [`message_len`]; [`EncodeError::BufferTooSmall`]
/// if `w` cannot hold the whole message.
pub fn write_message<'a, M: Message<'a>>(msg: &M, w: &mut Writer<'_>) -> Result<(), EncodeError> {
    let body = msg.body_len()?;
    if body > M::MAX_BODY {
        return Err(EncodeError::ValueTooLarge);
    }
    if vlen(body as u64)? + body > w.remaining() {
        return Err(EncodeError::BufferTooSmall);
    }
    w.varint(body as u64)?;
    let start = w.position();
    msg.encode_body(w)?;
    debug_assert_eq!(
        w.position() - start,
        body,
        "{} body_len disagrees with encode_body",
        M::NAME
    );
    Ok(())
}

// ---- field helpers shared by the message modules (docs/protocol.md §0) ----

/// The size of `v` as a varint.
fn vlen(v: u64) -> Result<usize, EncodeError> {
    if v > varint::MAX {
        return Err(EncodeError::ValueTooLarge);
    }
    Ok(varint::len(v))
}

/// The size of an `(s)` string.
fn slen(s: &str) -> Result<usize, EncodeError> {
    Ok(vlen(s.len() as u64)? + s.len())
}

/// Reads an `(s)` string bounded by the control-message limit.
fn read_str<'a>(r: &mut Reader<'a>) -> Result<&'a str, DecodeError> {
    r.str(MAX_CONTROL_BODY)
}

/// Reads an `Opt(i)`: `0` is absent, `n + 1` is `n`.
fn read_opt(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    Ok(r.varint()?.checked_sub(1))
}

/// The wire value of an `Opt(i)`; a value of 2^62 − 1 or more has no `n + 1` encoding.
fn opt_value(v: Option<u64>) -> Result<u64, EncodeError> {
    match v {
        None => Ok(0),
        Some(n) => match n.checked_add(1) {
            Some(n) if n <= varint::MAX => Ok(n),
            _ => Err(EncodeError::ValueTooLarge),
        },
    }
}

/// The size of an `Opt(i)`.
fn opt_len(v: Option<u64>) -> Result<usize, EncodeError> {
    vlen(opt_value(v)?)
}

/// Writes an `Opt(i)`.
fn write_opt(w: &mut Writer<'_>, v: Option<u64>) -> Result<(), EncodeError> {
    w.varint(opt_value(v)?)
}

/// Reads a `Dur(i)` (whole milliseconds).
///
/// A value too large for [`Duration`] saturates to the largest whole number of
/// milliseconds it holds, so decoding what we encode gives the same value back.
fn read_dur(r: &mut Reader<'_>) -> Result<Duration, DecodeError> {
    const MAX_MILLIS: u64 = u64::MAX / 1_000;
    Ok(Duration::from_millis(r.varint()?.min(MAX_MILLIS)))
}

/// The size of a `Dur(i)`; sub-millisecond parts are truncated, and every
/// [`Duration`] fits (its millisecond count is below 2^62).
fn dur_len(d: Duration) -> usize {
    varint::len(d.as_millis())
}

/// Writes a `Dur(i)`.
fn write_dur(w: &mut Writer<'_>, d: Duration) -> Result<(), EncodeError> {
    w.varint(d.as_millis())
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Helpers shared by the lite codec tests.
    extern crate std;
    use std::vec::Vec;

    /// Parses "01 0a ff" into bytes.
    pub fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("test hex"))
            .collect()
    }

    /// Asserts that `$msg` encodes to `$bytes` and that `$bytes` decodes to `$msg`
    /// (as type `$ty`), that every strict prefix is `Incomplete`, and that the
    /// reported lengths agree.
    macro_rules! assert_vector {
        ($ty:ty, $msg:expr, $bytes:expr) => {{
            let msg: $ty = $msg;
            let bytes: &[u8] = &$bytes;
            let mut buf = std::vec![0u8; bytes.len()];
            let n = $crate::wire::lite::encode_message(&msg, &mut buf).expect("encode");
            assert_eq!(&buf[..n], bytes, "encode {}", stringify!($ty));
            assert_eq!($crate::wire::lite::message_len(&msg).unwrap(), bytes.len());
            $crate::wire::lite::test_util::assert_round_trip!($ty, msg);
            let (got, used) = $crate::wire::lite::decode_message::<$ty>(bytes).expect("decode");
            assert_eq!(used, bytes.len());
            assert_eq!(got, msg, "decode {}", stringify!($ty));
        }};
    }
    pub(crate) use assert_vector;

    /// Asserts that `$msg` survives encode → decode, that every strict prefix of the
    /// encoding is `Incomplete`, and that a too-small output buffer writes nothing.
    macro_rules! assert_round_trip {
        ($ty:ty, $msg:expr) => {{
            use $crate::wire::{DecodeError, EncodeError, Writer};
            let msg: &$ty = &$msg;
            let len = $crate::wire::lite::message_len(msg).expect("message_len");
            let mut buf = std::vec![0u8; len];
            let n = $crate::wire::lite::encode_message(msg, &mut buf).expect("encode");
            assert_eq!(n, len);
            let (got, used) = $crate::wire::lite::decode_message::<$ty>(&buf).expect("decode");
            assert_eq!(used, len);
            assert_eq!(&got, msg);
            for cut in 0..len {
                assert_eq!(
                    $crate::wire::lite::decode_message::<$ty>(&buf[..cut]).err(),
                    Some(DecodeError::Incomplete),
                    "prefix of {} bytes",
                    cut
                );
            }
            let mut small = std::vec![0u8; len - 1];
            let mut w = Writer::new(&mut small);
            assert_eq!($crate::wire::lite::write_message(msg, &mut w), Err(EncodeError::BufferTooSmall));
            assert_eq!(w.position(), 0);
        }};
    }
    pub(crate) use assert_round_trip;

    /// Arbitrary varint values, biased towards the edges of each length class.
    pub fn any_varint() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            0u64..64,
            64u64..16384,
            Just(crate::wire::varint::MAX),
            0..=crate::wire::varint::MAX,
        ]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::test_util::hex;
    use super::*;
    use proptest::prelude::*;

    /// A message with one varint and one string, to exercise the framing rule.
    #[derive(Debug, PartialEq)]
    struct Pair<'a>(u64, &'a str);

    impl<'a> Message<'a> for Pair<'a> {
        const NAME: &'static str = "PAIR";
        const MAX_BODY: usize = 32;
        fn decode_body(r: &mut Reader<'a>) -> Result<Self, DecodeError> {
            Ok(Pair(r.varint()?, read_str(r)?))
        }
        fn body_len(&self) -> Result<usize, EncodeError> {
            Ok(vlen(self.0)? + slen(self.1)?)
        }
        fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
            w.varint(self.0)?;
            w.str(self.1)
        }
    }

    // ---- framing rule (docs/protocol.md §3.2) ----

    #[test]
    fn length_prefix_is_written_from_body_len() {
        let mut buf = [0u8; 8];
        let n = encode_message(&Pair(5, "ab"), &mut buf).unwrap();
        assert_eq!(&buf[..n], &[0x04, 0x05, 0x02, b'a', b'b']);
    }

    #[test]
    fn partial_input_is_incomplete_and_consumes_nothing() {
        let bytes = hex("04 05 02 61 62");
        for cut in 0..bytes.len() {
            let mut r = Reader::new(&bytes[..cut]);
            assert_eq!(
                read_message::<Pair<'_>>(&mut r),
                Err(DecodeError::Incomplete)
            );
            assert_eq!(r.position(), 0);
        }
        let mut r = Reader::new(&bytes);
        assert_eq!(read_message::<Pair<'_>>(&mut r), Ok(Pair(5, "ab")));
        assert!(r.is_empty());
    }

    #[test]
    fn length_is_checked_before_the_body_arrives() {
        // 33 > MAX_BODY 32: refused with only the length byte in hand.
        assert_eq!(
            decode_message::<Pair<'_>>(&[0x21]).err(),
            Some(DecodeError::TooLarge)
        );
        // A caller limit tightens it.
        assert_eq!(
            decode_message_within::<Pair<'_>>(&[0x05], 4).err(),
            Some(DecodeError::TooLarge)
        );
        assert_eq!(
            decode_message_within::<Pair<'_>>(&[0x05], 5).err(),
            Some(DecodeError::Incomplete)
        );
        // An 8-byte length of 2^62 - 1.
        let huge = hex("ff ff ff ff ff ff ff ff");
        assert_eq!(
            decode_message::<Pair<'_>>(&huge).err(),
            Some(DecodeError::TooLarge)
        );
    }

    #[test]
    fn short_body_is_not_incomplete_input() {
        // Length 2 but the string inside announces 2 bytes after the varint: the body ends
        // early even though the input holds the whole body (and more).
        let bytes = hex("02 05 02 61 62");
        assert_eq!(
            decode_message::<Pair<'_>>(&bytes).err(),
            Some(DecodeError::ShortBody)
        );
        // The varint itself cut by the length.
        assert_eq!(
            decode_message::<Pair<'_>>(&hex("01 40 05 00")).err(),
            Some(DecodeError::ShortBody)
        );
        // Zero-length body.
        assert_eq!(
            decode_message::<Pair<'_>>(&hex("00")).err(),
            Some(DecodeError::ShortBody)
        );
    }

    #[test]
    fn trailing_bytes_inside_the_body_are_rejected() {
        assert_eq!(
            decode_message::<Pair<'_>>(&hex("05 05 02 61 62 00")).err(),
            Some(DecodeError::TrailingBytes)
        );
        // Bytes after the body belong to the next message.
        assert_eq!(
            decode_message::<Pair<'_>>(&hex("04 05 02 61 62 00")),
            Ok((Pair(5, "ab"), 5))
        );
    }

    #[test]
    fn encoder_refuses_bodies_over_the_limit_and_writes_nothing_on_error() {
        let long = "0123456789012345678901234567890"; // body 1 + 1 + 31 = 33 > 32
        assert_eq!(message_len(&Pair(0, long)), Err(EncodeError::ValueTooLarge));
        let mut buf = [0u8; 64];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            write_message(&Pair(0, long), &mut w),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(
            write_message(&Pair(1 << 62, ""), &mut w),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(w.position(), 0);
        let mut buf = [0u8; 4];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            write_message(&Pair(5, "ab"), &mut w),
            Err(EncodeError::BufferTooSmall)
        );
        assert_eq!(w.position(), 0);
    }

    #[test]
    fn long_form_length_is_accepted() {
        assert_eq!(
            decode_message::<Pair<'_>>(&hex("40 04 05 02 61 62")),
            Ok((Pair(5, "ab"), 6))
        );
    }

    // ---- field helpers (docs/protocol.md §0) ----

    #[test]
    fn opt_encoding() {
        assert_eq!(opt_value(None), Ok(0));
        assert_eq!(opt_value(Some(0)), Ok(1));
        assert_eq!(opt_value(Some(varint::MAX - 1)), Ok(varint::MAX));
        // 2^62 - 1 has no n + 1 form.
        assert_eq!(
            opt_value(Some(varint::MAX)),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(opt_value(Some(u64::MAX)), Err(EncodeError::ValueTooLarge));
        assert_eq!(read_opt(&mut Reader::new(&[0])), Ok(None));
        assert_eq!(read_opt(&mut Reader::new(&[6])), Ok(Some(5)));
    }

    #[test]
    fn duration_saturates_and_truncates() {
        // Beyond what microseconds in a u64 can hold: saturates to whole milliseconds,
        // so a round trip gives the same value back.
        let d = read_dur(&mut Reader::new(&hex("ff ff ff ff ff ff ff ff"))).unwrap();
        assert_eq!(d, Duration::from_millis(u64::MAX / 1_000));
        let mut buf = [0u8; 8];
        let mut w = Writer::new(&mut buf);
        write_dur(&mut w, d).unwrap();
        let n = w.position();
        assert_eq!(read_dur(&mut Reader::new(&buf[..n])).unwrap(), d);
        assert_eq!(dur_len(Duration::MAX), 8);
        assert_eq!(Duration::from_micros(250_999).as_millis(), 250);
    }

    proptest! {
        #[test]
        fn framing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..48)) {
            let _ = decode_message::<Pair<'_>>(&bytes);
        }

        /// Random bodies behind a matching length prefix reach every body decoder.
        #[test]
        fn every_decoder_survives_random_bodies(body in proptest::collection::vec(any::<u8>(), 0..63)) {
            let mut msg = std::vec![body.len() as u8];
            msg.extend_from_slice(&body);
            let _ = decode_message::<Setup<'_>>(&msg);
            let _ = decode_message::<AnnounceRequest<'_>>(&msg);
            let _ = decode_message::<AnnounceOk>(&msg);
            let _ = decode_message::<Announce<'_>>(&msg);
            let _ = decode_message::<Track<'_>>(&msg);
            let _ = decode_message::<TrackInfo>(&msg);
            let _ = decode_message::<Subscribe<'_>>(&msg);
            let _ = decode_message::<SubscribeUpdate>(&msg);
            let _ = decode_message::<Group>(&msg);
            let _ = decode_message::<Fetch<'_>>(&msg);
            let _ = decode_message::<Probe>(&msg);
            let _ = decode_message::<Goaway<'_>>(&msg);
            for t in 0u8..4 {
                let mut typed = std::vec![t];
                typed.extend_from_slice(&msg);
                let _ = SubscribeResponse::decode(&typed);
            }
            let _ = Datagram::decode(&body);
        }
    }
}
