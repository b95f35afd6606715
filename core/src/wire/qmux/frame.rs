//! QMux (qmux-01) frames: the QUIC frames QMux keeps, plus QX_PING and QX_TRANSPORT_PARAMETERS (docs/protocol.md §2).
//!
//! [`Frame::decode`] reads one frame from the rest of a record body and
//! borrows its data; [`Frame::encode`] writes one frame the way moq-dev does.
//! Every frame lives inside one record, so running out of bytes while
//! decoding a frame is [`DecodeError::ShortBody`], never `Incomplete`.

use crate::wire::{DecodeError, EncodeError, Reader, Writer, varint};

use super::params::TransportParams;
use super::stream_id::{Dir, StreamId};

/// Frame type of PADDING (one zero byte, skipped by receivers).
pub const PADDING: u64 = 0x00;
/// Frame type of RESET_STREAM.
pub const RESET_STREAM: u64 = 0x04;
/// Frame type of STOP_SENDING.
pub const STOP_SENDING: u64 = 0x05;
/// Lowest STREAM frame type; `0x08..=0x0f` with the bits below.
pub const STREAM: u64 = 0x08;
/// STREAM type bit: an Offset field is present.
pub const STREAM_OFF: u64 = 0x04;
/// STREAM type bit: a Length field is present (else data runs to the end of the record).
pub const STREAM_LEN: u64 = 0x02;
/// STREAM type bit: this frame ends the stream.
pub const STREAM_FIN: u64 = 0x01;
/// Frame type of MAX_DATA.
pub const MAX_DATA: u64 = 0x10;
/// Frame type of MAX_STREAM_DATA.
pub const MAX_STREAM_DATA: u64 = 0x11;
/// Frame type of MAX_STREAMS for bidirectional streams.
pub const MAX_STREAMS_BIDI: u64 = 0x12;
/// Frame type of MAX_STREAMS for unidirectional streams.
pub const MAX_STREAMS_UNI: u64 = 0x13;
/// Frame type of DATA_BLOCKED.
pub const DATA_BLOCKED: u64 = 0x14;
/// Frame type of STREAM_DATA_BLOCKED.
pub const STREAM_DATA_BLOCKED: u64 = 0x15;
/// Frame type of STREAMS_BLOCKED for bidirectional streams.
pub const STREAMS_BLOCKED_BIDI: u64 = 0x16;
/// Frame type of STREAMS_BLOCKED for unidirectional streams.
pub const STREAMS_BLOCKED_UNI: u64 = 0x17;
/// Frame type of the transport CONNECTION_CLOSE (carries a Frame Type field).
pub const CONNECTION_CLOSE: u64 = 0x1c;
/// Frame type of the application CONNECTION_CLOSE.
pub const APPLICATION_CLOSE: u64 = 0x1d;
/// Frame type of DATAGRAM whose data runs to the end of the record.
pub const DATAGRAM: u64 = 0x30;
/// Frame type of DATAGRAM with a Length field (what moq-dev sends).
pub const DATAGRAM_LEN: u64 = 0x31;
/// Frame type of a QX_PING request (8-byte varint `f4 8c 67 52 9e f8 c7 bd`).
pub const QX_PING_REQUEST: u64 = 0x348c_6752_9ef8_c7bd;
/// Frame type of a QX_PING response (8-byte varint `f4 8c 67 52 9e f8 c7 be`).
pub const QX_PING_RESPONSE: u64 = 0x348c_6752_9ef8_c7be;
/// Frame type of QX_TRANSPORT_PARAMETERS (8-byte varint `ff 51 53 30 0d 0a 0d 0a`).
pub const QX_TRANSPORT_PARAMETERS: u64 = 0x3f51_5330_0d0a_0d0a;

/// Frame type of STREAM_REF, skiff's private frame for in-process links (not
/// QMux): stream data that lies in memory the receiver can read, named by a token.
pub const STREAM_REF: u64 = 0x3f5c_7e10;
/// STREAM_REF with FIN.
pub const STREAM_REF_FIN: u64 = 0x3f5c_7e11;

/// The most STREAM payload moq-dev puts in one frame; receivers it was released with enforce it.
// docs/protocol.md §1.3: "moq-dev never puts more than 16352 bytes of payload in a single STREAM frame".
pub const MAX_STREAM_PAYLOAD: usize = 16352;

/// Stream data passed by reference between two ends of one process (STREAM_REF).
///
/// Only a connection configured for it (`conn::Config::stream_refs`) accepts
/// it; the receiver resolves `token` to the `len` bytes it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamRef {
    /// The stream the data belongs to.
    pub id: StreamId,
    /// Stream position of the first data byte.
    pub offset: u64,
    /// Number of data bytes.
    pub len: u64,
    /// Names the bytes for the receiver.
    pub token: u64,
    /// This frame ends the stream.
    pub fin: bool,
}

/// Stream data at an offset, possibly ending the stream (types `0x08`–`0x0f`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stream<'a> {
    /// The stream the data belongs to.
    pub id: StreamId,
    /// Stream position of the first data byte (0 when the OFF bit was clear).
    pub offset: u64,
    /// The data, borrowed from the record.
    pub data: &'a [u8],
    /// True if no data follows this frame on the stream.
    pub fin: bool,
}

impl Stream<'_> {
    /// The stream position just past this frame's data (saturating; flow control caps it far lower).
    #[must_use]
    #[cfg(test)]
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.data.len() as u64)
    }
}

/// The sender abandons its sending side of a stream (type `0x04`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ResetStream {
    /// The stream being reset.
    pub id: StreamId,
    /// Application (moq-lite stream) error code.
    pub code: u64,
    /// Bytes the sender transmitted on the stream.
    pub final_size: u64,
}

/// The sender will not read a stream any more (type `0x05`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StopSending {
    /// The stream to stop.
    pub id: StreamId,
    /// Application (moq-lite stream) error code.
    pub code: u64,
}

/// Transport close (type `0x1c`): a QMux-level violation, moq-dev always uses code 1002.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConnectionClose<'a> {
    /// Transport error code (1002 for every violation moq-dev detects, docs/protocol.md §2.6).
    pub code: u64,
    /// Type of the frame that triggered the close; moq-dev always sends 0.
    pub frame_type: u64,
    /// Human-readable reason; not required to be UTF-8 on receipt.
    pub reason: &'a [u8],
}

/// Application close (type `0x1d`): a clean close carrying a moq-lite session code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ApplicationClose<'a> {
    /// Application (moq-lite session) error code; 0 = done.
    pub code: u64,
    /// Human-readable reason; not required to be UTF-8 on receipt.
    pub reason: &'a [u8],
}

/// An unreliable datagram (types `0x30` / `0x31`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Datagram<'a> {
    /// The payload, borrowed from the record.
    pub data: &'a [u8],
    /// True for `0x31` (Length field); false for `0x30` (data runs to the end of the record).
    ///
    /// An encoded `0x30` frame must be the last one in its record.
    pub length_prefixed: bool,
}

impl<'a> Datagram<'a> {
    /// A length-prefixed (`0x31`) datagram, the form moq-dev sends.
    #[must_use]
    pub const fn new(data: &'a [u8]) -> Self {
        Datagram {
            data,
            length_prefixed: true,
        }
    }

    /// Bytes of the whole encoded frame, the size `max_datagram_frame_size` bounds (docs/protocol.md §2.7).
    #[must_use]
    pub fn frame_size(&self) -> usize {
        let len = self.data.len();
        if self.length_prefixed {
            1 + varint::len(len as u64) + len
        } else {
            1 + len
        }
    }
}

/// One QMux frame, borrowing any variable-length data from the record it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Frame<'a> {
    /// `0x00`: one padding byte.
    Padding,
    /// `0x04`: RESET_STREAM.
    ResetStream(ResetStream),
    /// `0x05`: STOP_SENDING.
    StopSending(StopSending),
    /// `0x08`–`0x0f`: STREAM (always encoded as `0x0e`/`0x0f`).
    Stream(Stream<'a>),
    /// STREAM_REF (skiff links only): stream data passed by reference.
    StreamRef(StreamRef),
    /// `0x10`: new absolute connection-wide limit on bytes the sender accepts.
    MaxData(u64),
    /// `0x11`: new absolute limit for one stream.
    MaxStreamData {
        /// The stream.
        id: StreamId,
        /// The new limit in bytes.
        max: u64,
    },
    /// `0x12` / `0x13`: new cumulative count of streams of `dir` the peer may open.
    MaxStreams {
        /// Which kind of stream.
        dir: Dir,
        /// The new count.
        max: u64,
    },
    /// `0x14`: the sender is blocked by the connection limit (advisory).
    DataBlocked(u64),
    /// `0x15`: the sender is blocked by a stream limit (advisory).
    StreamDataBlocked {
        /// The stream.
        id: StreamId,
        /// The limit it hit.
        limit: u64,
    },
    /// `0x16` / `0x17`: the sender is blocked by the stream count (advisory).
    StreamsBlocked {
        /// Which kind of stream.
        dir: Dir,
        /// The limit it hit.
        limit: u64,
    },
    /// `0x1c`: transport CONNECTION_CLOSE.
    ConnectionClose(ConnectionClose<'a>),
    /// `0x1d`: application CONNECTION_CLOSE.
    ApplicationClose(ApplicationClose<'a>),
    /// `0x30` / `0x31`: DATAGRAM.
    Datagram(Datagram<'a>),
    /// QX_PING request carrying a sequence number.
    PingRequest(u64),
    /// QX_PING response echoing the request's sequence number.
    PingResponse(u64),
    /// QX_TRANSPORT_PARAMETERS, validated on decode.
    TransportParameters(TransportParams<'a>),
}

impl<'a> Frame<'a> {
    /// Decodes one frame from `r`, which must span the rest of a record body.
    ///
    /// On success `r` is advanced past the frame; on error it is left
    /// untouched. A STREAM frame without LEN and a `0x30` DATAGRAM take every
    /// remaining byte. Every length field is checked against the bytes left
    /// before anything is borrowed.
    ///
    /// # Errors
    /// [`DecodeError::UnknownType`] for any type not in docs/protocol.md §2 (ACK,
    /// CRYPTO, RESET_STREAM_AT `0x24`, …); [`DecodeError::ShortBody`] if the
    /// frame or one of its length fields runs past `r`; the transport
    /// parameter errors of [`TransportParams::decode`].
    pub fn decode(r: &mut Reader<'a>) -> Result<Frame<'a>, DecodeError> {
        let mut c = r.clone();
        let frame = Self::decode_fields(&mut c).map_err(|e| match e {
            DecodeError::Incomplete => DecodeError::ShortBody,
            e => e,
        })?;
        *r = c;
        Ok(frame)
    }

    fn decode_fields(r: &mut Reader<'a>) -> Result<Frame<'a>, DecodeError> {
        let ty = r.varint()?;
        Ok(match ty {
            PADDING => Frame::Padding,
            RESET_STREAM => Frame::ResetStream(ResetStream {
                id: StreamId(r.varint()?),
                code: r.varint()?,
                final_size: r.varint()?,
            }),
            STOP_SENDING => Frame::StopSending(StopSending {
                id: StreamId(r.varint()?),
                code: r.varint()?,
            }),
            0x08..=0x0f => {
                let id = StreamId(r.varint()?);
                let offset = if ty & STREAM_OFF != 0 { r.varint()? } else { 0 };
                let data = if ty & STREAM_LEN != 0 {
                    let n = body_len(r)?;
                    r.bytes(n)?
                } else {
                    // docs/protocol.md §1.3: no LEN bit, the data is the rest of the record.
                    r.bytes(r.remaining())?
                };
                Frame::Stream(Stream {
                    id,
                    offset,
                    data,
                    fin: ty & STREAM_FIN != 0,
                })
            }
            STREAM_REF | STREAM_REF_FIN => Frame::StreamRef(StreamRef {
                id: StreamId(r.varint()?),
                offset: r.varint()?,
                len: r.varint()?,
                token: r.varint()?,
                fin: ty == STREAM_REF_FIN,
            }),
            MAX_DATA => Frame::MaxData(r.varint()?),
            MAX_STREAM_DATA => Frame::MaxStreamData {
                id: StreamId(r.varint()?),
                max: r.varint()?,
            },
            MAX_STREAMS_BIDI => Frame::MaxStreams {
                dir: Dir::Bidi,
                max: r.varint()?,
            },
            MAX_STREAMS_UNI => Frame::MaxStreams {
                dir: Dir::Uni,
                max: r.varint()?,
            },
            DATA_BLOCKED => Frame::DataBlocked(r.varint()?),
            STREAM_DATA_BLOCKED => Frame::StreamDataBlocked {
                id: StreamId(r.varint()?),
                limit: r.varint()?,
            },
            STREAMS_BLOCKED_BIDI => Frame::StreamsBlocked {
                dir: Dir::Bidi,
                limit: r.varint()?,
            },
            STREAMS_BLOCKED_UNI => Frame::StreamsBlocked {
                dir: Dir::Uni,
                limit: r.varint()?,
            },
            CONNECTION_CLOSE => {
                let code = r.varint()?;
                let frame_type = r.varint()?;
                let n = body_len(r)?;
                Frame::ConnectionClose(ConnectionClose {
                    code,
                    frame_type,
                    reason: r.bytes(n)?,
                })
            }
            APPLICATION_CLOSE => {
                let code = r.varint()?;
                let n = body_len(r)?;
                Frame::ApplicationClose(ApplicationClose {
                    code,
                    reason: r.bytes(n)?,
                })
            }
            DATAGRAM => Frame::Datagram(Datagram {
                data: r.bytes(r.remaining())?,
                length_prefixed: false,
            }),
            DATAGRAM_LEN => {
                let n = body_len(r)?;
                Frame::Datagram(Datagram {
                    data: r.bytes(n)?,
                    length_prefixed: true,
                })
            }
            QX_PING_REQUEST => Frame::PingRequest(r.varint()?),
            QX_PING_RESPONSE => Frame::PingResponse(r.varint()?),
            QX_TRANSPORT_PARAMETERS => {
                let n = body_len(r)?;
                Frame::TransportParameters(TransportParams::decode(r.bytes(n)?)?)
            }
            t => return Err(DecodeError::UnknownType(t)),
        })
    }

    /// The frame type [`encode`](Self::encode) writes.
    #[must_use]
    pub fn frame_type(&self) -> u64 {
        match self {
            Frame::Padding => PADDING,
            Frame::ResetStream(_) => RESET_STREAM,
            Frame::StopSending(_) => STOP_SENDING,
            Frame::Stream(s) => stream_type(s.fin),
            Frame::StreamRef(s) if s.fin => STREAM_REF_FIN,
            Frame::StreamRef(_) => STREAM_REF,
            Frame::MaxData(_) => MAX_DATA,
            Frame::MaxStreamData { .. } => MAX_STREAM_DATA,
            Frame::MaxStreams { dir: Dir::Bidi, .. } => MAX_STREAMS_BIDI,
            Frame::MaxStreams { dir: Dir::Uni, .. } => MAX_STREAMS_UNI,
            Frame::DataBlocked(_) => DATA_BLOCKED,
            Frame::StreamDataBlocked { .. } => STREAM_DATA_BLOCKED,
            Frame::StreamsBlocked { dir: Dir::Bidi, .. } => STREAMS_BLOCKED_BIDI,
            Frame::StreamsBlocked { dir: Dir::Uni, .. } => STREAMS_BLOCKED_UNI,
            Frame::ConnectionClose(_) => CONNECTION_CLOSE,
            Frame::ApplicationClose(_) => APPLICATION_CLOSE,
            Frame::Datagram(d) => {
                if d.length_prefixed {
                    DATAGRAM_LEN
                } else {
                    DATAGRAM
                }
            }
            Frame::PingRequest(_) => QX_PING_REQUEST,
            Frame::PingResponse(_) => QX_PING_RESPONSE,
            Frame::TransportParameters(_) => QX_TRANSPORT_PARAMETERS,
        }
    }

    /// True if the encoded frame takes the rest of its record (only a `0x30` DATAGRAM; STREAM is always written with LEN).
    #[must_use]
    pub fn is_rest_of_record(&self) -> bool {
        matches!(
            self,
            Frame::Datagram(Datagram {
                length_prefixed: false,
                ..
            })
        )
    }

    /// Bytes [`encode`](Self::encode) writes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        let v = |x: u64| varint::len(x);
        let prefixed = |b: &[u8]| varint::len(b.len() as u64) + b.len();
        v(self.frame_type())
            + match self {
                Frame::Padding => 0,
                Frame::ResetStream(f) => v(f.id.0) + v(f.code) + v(f.final_size),
                Frame::StopSending(f) => v(f.id.0) + v(f.code),
                Frame::Stream(s) => v(s.id.0) + v(s.offset) + prefixed(s.data),
                Frame::StreamRef(s) => v(s.id.0) + v(s.offset) + v(s.len) + v(s.token),
                Frame::MaxData(x)
                | Frame::DataBlocked(x)
                | Frame::PingRequest(x)
                | Frame::PingResponse(x)
                | Frame::MaxStreams { max: x, .. }
                | Frame::StreamsBlocked { limit: x, .. } => v(*x),
                Frame::MaxStreamData { id, max: x } | Frame::StreamDataBlocked { id, limit: x } => {
                    v(id.0) + v(*x)
                }
                Frame::ConnectionClose(c) => v(c.code) + v(c.frame_type) + prefixed(c.reason),
                Frame::ApplicationClose(c) => v(c.code) + prefixed(c.reason),
                Frame::Datagram(d) => d.frame_size() - 1,
                Frame::TransportParameters(p) => {
                    let n = p.encoded_len();
                    v(n as u64) + n
                }
            }
    }

    /// Writes the frame; STREAM always carries OFF and LEN (type `0x0e`/`0x0f`) like moq-dev.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if fewer than [`encoded_len`](Self::encoded_len)
    /// bytes are left (nothing is written); [`EncodeError::ValueTooLarge`] if a
    /// field exceeds 2^62 - 1 (the writer may then hold a partial frame).
    pub fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if w.remaining() < self.encoded_len() {
            return Err(EncodeError::BufferTooSmall);
        }
        w.varint(self.frame_type())?;
        match self {
            Frame::Padding => Ok(()),
            Frame::ResetStream(f) => {
                w.varint(f.id.0)?;
                w.varint(f.code)?;
                w.varint(f.final_size)
            }
            Frame::StopSending(f) => {
                w.varint(f.id.0)?;
                w.varint(f.code)
            }
            Frame::Stream(s) => {
                w.varint(s.id.0)?;
                w.varint(s.offset)?;
                prefixed(w, s.data)
            }
            Frame::StreamRef(s) => {
                w.varint(s.id.0)?;
                w.varint(s.offset)?;
                w.varint(s.len)?;
                w.varint(s.token)
            }
            Frame::MaxData(x)
            | Frame::DataBlocked(x)
            | Frame::PingRequest(x)
            | Frame::PingResponse(x)
            | Frame::MaxStreams { max: x, .. }
            | Frame::StreamsBlocked { limit: x, .. } => w.varint(*x),
            Frame::MaxStreamData { id, max: x } | Frame::StreamDataBlocked { id, limit: x } => {
                w.varint(id.0)?;
                w.varint(*x)
            }
            Frame::ConnectionClose(c) => {
                w.varint(c.code)?;
                w.varint(c.frame_type)?;
                prefixed(w, c.reason)
            }
            Frame::ApplicationClose(c) => {
                w.varint(c.code)?;
                prefixed(w, c.reason)
            }
            Frame::Datagram(d) => {
                if d.length_prefixed {
                    prefixed(w, d.data)
                } else {
                    w.bytes(d.data)
                }
            }
            Frame::TransportParameters(p) => {
                w.varint(p.encoded_len() as u64)?;
                p.encode(w)
            }
        }
    }
}

/// Reads a length field that must not exceed what is left of the record body.
fn body_len(r: &mut Reader<'_>) -> Result<usize, DecodeError> {
    let n = r.varint()?;
    if n > r.remaining() as u64 {
        return Err(DecodeError::ShortBody);
    }
    Ok(n as usize)
}

/// Writes `Length (i)` then the bytes.
fn prefixed(w: &mut Writer<'_>, b: &[u8]) -> Result<(), EncodeError> {
    w.varint(b.len() as u64)?;
    w.bytes(b)
}

/// The type of a STREAM frame as we send it: OFF and LEN always set, FIN as given.
const fn stream_type(fin: bool) -> u64 {
    STREAM | STREAM_OFF | STREAM_LEN | if fin { STREAM_FIN } else { 0 }
}

/// Writes the record of one STREAM frame up to its payload: the record `Size`,
/// the frame type (`0x0e`, `0x0f` with FIN), the stream ID, the offset and the
/// payload length; returns the bytes written.
///
/// The `len` payload bytes must follow on the wire: together they are exactly
/// what [`encode_record`](super::record::encode_record) writes for the whole
/// frame, so a sender can hand the payload to the kernel from where it lies
/// (a gathered write) instead of copying it behind the header.
///
/// # Errors
/// [`EncodeError::BufferTooSmall`] if `out` cannot hold the header (nothing is
/// written); [`EncodeError::ValueTooLarge`] if a field exceeds 2^62 - 1.
pub fn encode_stream_record_header(
    id: StreamId,
    offset: u64,
    len: usize,
    fin: bool,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let ty = stream_type(fin);
    let len = len as u64;
    let body = varint::len(ty) + varint::len(id.0) + varint::len(offset) + varint::len(len);
    let size = body as u64 + len;
    if out.len() < varint::len(size) + body {
        return Err(EncodeError::BufferTooSmall);
    }
    let mut w = Writer::new(out);
    w.varint(size)?;
    w.varint(ty)?;
    w.varint(id.0)?;
    w.varint(offset)?;
    w.varint(len)?;
    Ok(w.position())
}

/// The largest `n` with `n + varint::len(n) <= avail`: a payload and its length field.
fn max_prefixed_payload(avail: u64) -> u64 {
    // For each width, the largest value that width can carry and still fit;
    // any such value's own varint is at most that wide, so it fits too.
    [
        (1u64, 63u64),
        (2, 16383),
        (4, (1 << 30) - 1),
        (8, varint::MAX),
    ]
    .into_iter()
    .filter(|&(width, _)| avail >= width)
    .map(|(width, max)| (avail - width).min(max))
    .max()
    .unwrap_or(0)
}

/// The largest STREAM payload whose `0x0e`/`0x0f` frame for `id` at `offset` fits in `max_record_size` bytes.
///
/// Pass the peer's `max_record_size` for a one-frame record, or the room left
/// in a record being batched. The result is also capped at
/// [`MAX_STREAM_PAYLOAD`] (16352), as moq-dev's sender caps it. 0 means not
/// even an empty frame fits.
#[must_use]
pub fn max_stream_payload(max_record_size: u64, id: StreamId, offset: u64) -> usize {
    let header = 1 + varint::len(id.0) as u64 + varint::len(offset) as u64;
    let n = max_prefixed_payload(max_record_size.saturating_sub(header));
    n.min(MAX_STREAM_PAYLOAD as u64) as usize
}

/// The largest payload of a `0x31` DATAGRAM whose frame is at most `max_frame_size` bytes.
///
/// Pass the smaller of the peer's `max_datagram_frame_size` and its
/// `max_record_size` (docs/protocol.md §2.7: the whole frame is bounded). Values
/// past `usize::MAX` saturate.
#[must_use]
pub fn max_datagram_payload(max_frame_size: u64) -> usize {
    let n = max_prefixed_payload(max_frame_size.saturating_sub(1));
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::qmux::params::Protocols;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn stream_record_header_plus_payload_is_the_record(
            id in 0u64..(1 << 62),
            offset in 0u64..(1 << 62),
            len in 0usize..20_000,
            fin: bool,
        ) {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let frame = Frame::Stream(Stream { id: StreamId(id), offset, data: &data, fin });
            let mut whole = [0u8; 20_100];
            let n = crate::wire::qmux::encode_record(&frame, u64::MAX, &mut whole).unwrap();
            let mut head = [0u8; 64];
            let h = encode_stream_record_header(StreamId(id), offset, len, fin, &mut head).unwrap();
            prop_assert_eq!(h + len, n);
            prop_assert_eq!(&head[..h], &whole[..h]);
            prop_assert_eq!(&whole[h..n], &data[..]);
            prop_assert_eq!(
                encode_stream_record_header(StreamId(id), offset, len, fin, &mut head[..h - 1]),
                Err(EncodeError::BufferTooSmall)
            );
        }
    }

    fn enc(f: &Frame<'_>) -> Vec<u8> {
        let mut buf = [0u8; 20_000];
        let mut w = Writer::new(&mut buf);
        f.encode(&mut w).unwrap();
        assert_eq!(w.position(), f.encoded_len(), "encoded_len of {f:?}");
        w.written().to_vec()
    }

    fn dec(b: &[u8]) -> Result<(Frame<'_>, usize), DecodeError> {
        let mut r = Reader::new(b);
        let f = Frame::decode(&mut r)?;
        Ok((f, r.position()))
    }

    /// Encodes, checks the bytes decode back to the same frame using every byte.
    fn round_trip(f: Frame<'_>) {
        let b = enc(&f);
        let (g, n) = dec(&b).unwrap();
        assert_eq!(g, f);
        assert_eq!(n, b.len());
    }

    // ---- STREAM type variants ----

    #[test]
    fn all_eight_stream_types_decode() {
        let data = [0xaa, 0xbb];
        // (type, bytes after the type, expected offset, fin)
        let cases: [(u8, &[u8], u64, bool); 8] = [
            (0x08, &[0x03, 0xaa, 0xbb], 0, false),
            (0x09, &[0x03, 0xaa, 0xbb], 0, true),
            (0x0a, &[0x03, 0x02, 0xaa, 0xbb], 0, false),
            (0x0b, &[0x03, 0x02, 0xaa, 0xbb], 0, true),
            (0x0c, &[0x03, 0x07, 0xaa, 0xbb], 7, false),
            (0x0d, &[0x03, 0x07, 0xaa, 0xbb], 7, true),
            (0x0e, &[0x03, 0x07, 0x02, 0xaa, 0xbb], 7, false),
            (0x0f, &[0x03, 0x07, 0x02, 0xaa, 0xbb], 7, true),
        ];
        for (ty, rest, offset, fin) in cases {
            let mut b = Vec::from([ty]);
            b.extend_from_slice(rest);
            let (f, n) = dec(&b).unwrap();
            assert_eq!(n, b.len());
            assert_eq!(
                f,
                Frame::Stream(Stream {
                    id: StreamId(3),
                    offset,
                    data: &data,
                    fin
                }),
                "type {ty:#x}"
            );
        }
    }

    #[test]
    fn stream_without_len_takes_the_rest() {
        let b = [0x08, 0x00, 0x01, 0x02, 0x03];
        let (f, n) = dec(&b).unwrap();
        assert_eq!(n, 5);
        assert_eq!(
            f,
            Frame::Stream(Stream {
                id: StreamId(0),
                offset: 0,
                data: &[1, 2, 3],
                fin: false
            })
        );
        // Empty rest is an empty payload.
        assert_eq!(
            dec(&[0x09, 0x04]).unwrap().0,
            Frame::Stream(Stream {
                id: StreamId(4),
                offset: 0,
                data: &[],
                fin: true
            })
        );
    }

    #[test]
    fn stream_len_is_checked_against_the_body() {
        assert_eq!(
            dec(&[0x0e, 0x00, 0x00, 0x05, 1, 2, 3, 4]),
            Err(DecodeError::ShortBody)
        );
        // An 8-byte Length claiming 2^62 - 1 bytes.
        let b = [
            0x0a, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00,
        ];
        assert_eq!(dec(&b), Err(DecodeError::ShortBody));
    }

    #[test]
    fn encoder_always_writes_off_and_len() {
        let f = Frame::Stream(Stream {
            id: StreamId(0),
            offset: 0,
            data: &[],
            fin: false,
        });
        assert_eq!(enc(&f), [0x0e, 0x00, 0x00, 0x00]);
        let f = Frame::Stream(Stream {
            id: StreamId(2),
            offset: 20,
            data: &[],
            fin: true,
        });
        assert_eq!(enc(&f), [0x0f, 0x02, 0x14, 0x00]);
    }

    // ---- other frames ----

    #[test]
    fn unknown_types() {
        // ACK, ACK_ECN, CRYPTO, NEW_TOKEN, NEW_CONNECTION_ID, HANDSHAKE_DONE, RESET_STREAM_AT, PING.
        for t in [0x02u8, 0x03, 0x06, 0x07, 0x18, 0x1e, 0x24, 0x01, 0x3f] {
            assert_eq!(
                dec(&[t, 0, 0, 0, 0]),
                Err(DecodeError::UnknownType(u64::from(t)))
            );
        }
        assert_eq!(
            dec(&[0x80, 0x01, 0x00, 0x00]),
            Err(DecodeError::UnknownType(0x10000))
        );
    }

    #[test]
    fn long_form_types_are_accepted() {
        // moq-dev decodes the type as a varint, so `40 10` is MAX_DATA.
        assert_eq!(dec(&[0x40, 0x10, 0x05]).unwrap(), (Frame::MaxData(5), 3));
    }

    #[test]
    fn close_reason_is_bounded_and_not_utf8_checked() {
        assert_eq!(
            dec(&[0x1d, 0x00, 0x03, 0xff, 0xfe]),
            Err(DecodeError::ShortBody)
        );
        assert_eq!(
            dec(&[0x1c, 0x00, 0x00, 0x03, 0xff]),
            Err(DecodeError::ShortBody)
        );
        let (f, _) = dec(&[0x1d, 0x05, 0x02, 0xff, 0xfe]).unwrap();
        assert_eq!(
            f,
            Frame::ApplicationClose(ApplicationClose {
                code: 5,
                reason: &[0xff, 0xfe]
            })
        );
    }

    #[test]
    fn datagram_forms() {
        let (f, n) = dec(&[0x30, 1, 2, 3]).unwrap();
        assert_eq!(n, 4);
        let d = Datagram {
            data: &[1, 2, 3],
            length_prefixed: false,
        };
        assert_eq!(f, Frame::Datagram(d));
        assert_eq!(d.frame_size(), 4);
        assert_eq!(Datagram::new(&[1, 2, 3]).frame_size(), 5);
        assert_eq!(dec(&[0x31, 0x04, 1, 2, 3]), Err(DecodeError::ShortBody));
        assert_eq!(enc(&f), [0x30, 1, 2, 3]);
    }

    #[test]
    fn params_length_is_bounded() {
        // Length 4 but only 3 bytes of parameters left in the record.
        let mut b = Vec::from([
            0xff, 0x51, 0x53, 0x30, 0x0d, 0x0a, 0x0d, 0x0a, 0x04, 0x01, 0x01, 0x05,
        ]);
        assert_eq!(dec(&b), Err(DecodeError::ShortBody));
        // Length 3 frames the block exactly; a following byte is the next frame.
        b[8] = 0x03;
        b.push(0x00);
        let (f, n) = dec(&b).unwrap();
        assert_eq!(n, 12);
        let Frame::TransportParameters(p) = f else {
            panic!("{f:?}")
        };
        assert_eq!(p.max_idle_timeout, 5);
    }

    #[test]
    fn truncated_frames_are_short_and_consume_nothing() {
        let frames = [
            Frame::ResetStream(ResetStream {
                id: StreamId(7),
                code: 0x34,
                final_size: 21,
            }),
            Frame::MaxStreamData {
                id: StreamId(7),
                max: 393_217,
            },
            Frame::PingRequest(1 << 40),
            Frame::ConnectionClose(ConnectionClose {
                code: 1002,
                frame_type: 0,
                reason: b"x",
            }),
            Frame::Datagram(Datagram::new(b"abc")),
        ];
        for f in frames {
            let b = enc(&f);
            for cut in 1..b.len() {
                let mut r = Reader::new(&b[..cut]);
                assert_eq!(
                    Frame::decode(&mut r),
                    Err(DecodeError::ShortBody),
                    "{f:?} cut {cut}"
                );
                assert_eq!(r.position(), 0);
            }
        }
    }

    #[test]
    fn encode_into_small_buffer_writes_nothing() {
        let f = Frame::Stream(Stream {
            id: StreamId(0),
            offset: 0,
            data: &[1, 2, 3],
            fin: false,
        });
        let mut buf = [0u8; 6];
        let mut w = Writer::new(&mut buf);
        assert_eq!(f.encode(&mut w), Err(EncodeError::BufferTooSmall));
        assert_eq!(w.position(), 0);
        let mut buf = [0u8; 16];
        assert_eq!(
            Frame::MaxData(u64::MAX).encode(&mut Writer::new(&mut buf)),
            Err(EncodeError::ValueTooLarge)
        );
    }

    // ---- payload sizing ----

    #[test]
    fn moq_dev_payload_cap() {
        // With the default record size the 16352 cap binds, whatever the header.
        assert_eq!(max_stream_payload(16382, StreamId(0), 0), 16352);
        assert_eq!(max_stream_payload(16382, StreamId(1 << 40), 1 << 40), 16352);
        // Small budgets: 1 type + 1 id + 1 offset + 1 len = 4 bytes of header.
        assert_eq!(max_stream_payload(4, StreamId(0), 0), 0);
        assert_eq!(max_stream_payload(3, StreamId(0), 0), 0);
        assert_eq!(max_stream_payload(67, StreamId(0), 0), 63);
        assert_eq!(max_stream_payload(68, StreamId(0), 0), 63); // 64 needs a 2-byte length
        assert_eq!(max_stream_payload(69, StreamId(0), 0), 64);
        assert_eq!(max_stream_payload(u64::MAX, StreamId(0), 0), 16352);
        assert_eq!(max_datagram_payload(16382), 16379);
        assert_eq!(max_datagram_payload(0), 0);
        assert_eq!(max_datagram_payload(2), 0);
        assert_eq!(max_datagram_payload(3), 1);
    }

    proptest! {
        #[test]
        fn stream_payload_fills_the_budget(budget in 0u64..20_000, id in 0..=varint::MAX, offset in 0..=varint::MAX) {
            let n = max_stream_payload(budget, StreamId(id), offset);
            let framed = |n: usize| 1 + varint::len(id) + varint::len(offset) + varint::len(n as u64) + n;
            if n > 0 {
                prop_assert!(framed(n) as u64 <= budget);
            }
            if n < MAX_STREAM_PAYLOAD {
                prop_assert!(framed(n + 1) as u64 > budget);
            }
        }

        #[test]
        fn datagram_payload_fills_the_budget(budget in 0u64..100_000) {
            let n = max_datagram_payload(budget);
            let size = |n: usize| 1 + varint::len(n as u64) + n;
            if n > 0 {
                prop_assert!(size(n) as u64 <= budget);
            }
            prop_assert!(size(n + 1) as u64 > budget);
        }
    }

    // ---- round trips, one property per frame type ----

    fn v() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..64, 0u64..20_000, 0..=varint::MAX]
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..300)
    }

    fn dir() -> impl Strategy<Value = Dir> {
        prop_oneof![Just(Dir::Bidi), Just(Dir::Uni)]
    }

    #[test]
    fn padding_round_trip() {
        round_trip(Frame::Padding);
        assert_eq!(enc(&Frame::Padding), [0x00]);
    }

    proptest! {
        #[test]
        fn reset_stream_rt(id in v(), code in v(), final_size in v()) {
            round_trip(Frame::ResetStream(ResetStream { id: StreamId(id), code, final_size }));
        }

        #[test]
        fn stop_sending_rt(id in v(), code in v()) {
            round_trip(Frame::StopSending(StopSending { id: StreamId(id), code }));
        }

        #[test]
        fn stream_rt(id in v(), offset in v(), data in bytes(), fin in any::<bool>()) {
            round_trip(Frame::Stream(Stream { id: StreamId(id), offset, data: &data, fin }));
        }

        #[test]
        fn max_data_rt(x in v()) {
            round_trip(Frame::MaxData(x));
            round_trip(Frame::DataBlocked(x));
        }

        #[test]
        fn max_stream_data_rt(id in v(), x in v()) {
            round_trip(Frame::MaxStreamData { id: StreamId(id), max: x });
            round_trip(Frame::StreamDataBlocked { id: StreamId(id), limit: x });
        }

        #[test]
        fn max_streams_rt(dir in dir(), x in v()) {
            round_trip(Frame::MaxStreams { dir, max: x });
            round_trip(Frame::StreamsBlocked { dir, limit: x });
        }

        #[test]
        fn close_rt(code in v(), frame_type in v(), reason in bytes()) {
            round_trip(Frame::ConnectionClose(ConnectionClose { code, frame_type, reason: &reason }));
            round_trip(Frame::ApplicationClose(ApplicationClose { code, reason: &reason }));
        }

        #[test]
        fn datagram_rt(data in bytes(), length_prefixed in any::<bool>()) {
            round_trip(Frame::Datagram(Datagram { data: &data, length_prefixed }));
        }

        #[test]
        fn ping_rt(seq in v()) {
            round_trip(Frame::PingRequest(seq));
            round_trip(Frame::PingResponse(seq));
        }

        #[test]
        fn transport_parameters_rt(
            ints in proptest::collection::vec(v(), 8),
            record in proptest::option::of(16382..=varint::MAX),
            reset_stream_at in any::<bool>(),
            names in proptest::option::of(proptest::collection::vec("[a-z0-9-]{1,12}", 1..4)),
        ) {
            let list: Option<Vec<&str>> = names.as_ref().map(|n| n.iter().map(|s| s.as_str()).collect());
            round_trip(Frame::TransportParameters(TransportParams {
                max_idle_timeout: ints[0],
                initial_max_data: ints[1],
                initial_max_stream_data_bidi_local: ints[2],
                initial_max_stream_data_bidi_remote: ints[3],
                initial_max_stream_data_uni: ints[4],
                initial_max_streams_bidi: ints[5],
                initial_max_streams_uni: ints[6],
                max_datagram_frame_size: ints[7],
                reset_stream_at,
                max_record_size: record,
                application_protocols: list.as_deref().map(Protocols::from_list),
            }));
        }

        #[test]
        fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&b);
            match Frame::decode(&mut r) {
                Ok(_) => prop_assert!(r.position() >= 1 && r.position() <= b.len()),
                Err(e) => {
                    prop_assert_eq!(r.position(), 0);
                    prop_assert!(e != DecodeError::Incomplete);
                }
            }
        }
    }
}
