//! A small, independent decoder for captured QMux (qmux-01) bytes: records, frames and
//! per-stream reassembly (docs/protocol.md §1.3, §2).
//!
//! It exists to read wire-tap captures in tests. It is written from docs/protocol.md only and
//! shares no code with skiff-core, so it can cross-check skiff's own codecs against the
//! bytes moq-dev really sends. It is strict: anything it does not understand is an error.

use std::collections::BTreeMap;
use std::fmt;

/// Frame type of QX_TRANSPORT_PARAMETERS (docs/protocol.md §1.4).
pub const QX_TRANSPORT_PARAMETERS: u64 = 0x3f51_5330_0d0a_0d0a;
/// Frame type of a QX_PING request (docs/protocol.md §2.5).
pub const QX_PING_REQUEST: u64 = 0x348c_6752_9ef8_c7bd;
/// Frame type of a QX_PING response (docs/protocol.md §2.5).
pub const QX_PING_RESPONSE: u64 = 0x348c_6752_9ef8_c7be;

/// Why captured bytes could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// Input ended inside a varint, a frame or a record.
    Truncated,
    /// A record's frames did not fill it exactly.
    Trailing,
    /// A frame type this decoder (and qmux-01) does not define.
    UnknownFrame(u64),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("truncated input"),
            Self::Trailing => f.write_str("trailing bytes in record"),
            Self::UnknownFrame(ty) => write!(f, "unknown frame type {ty:#x}"),
        }
    }
}

impl std::error::Error for WireError {}

// ---------------------------------------------------------------------------
// Varints (docs/protocol.md §0)
// ---------------------------------------------------------------------------

/// Read one QUIC varint at `*pos`, advancing `pos`.
///
/// # Errors
///
/// [`WireError::Truncated`] if the buffer ends inside the varint.
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let first = *buf.get(*pos).ok_or(WireError::Truncated)?;
    let len = 1usize << (first >> 6);
    let bytes = buf.get(*pos..*pos + len).ok_or(WireError::Truncated)?;
    let mut value = u64::from(first & 0x3f);
    for byte in &bytes[1..] {
        value = (value << 8) | u64::from(*byte);
    }
    *pos += len;
    Ok(value)
}

/// Append the shortest QUIC varint encoding of `value` (must be below 2^62).
///
/// # Panics
///
/// If `value` does not fit in 62 bits (test helper; never fed network input).
pub fn write_varint(value: u64, out: &mut Vec<u8>) {
    match value {
        0..=0x3f => out.push(value as u8),
        0x40..=0x3fff => out.extend_from_slice(&(0x4000 | value as u16).to_be_bytes()),
        0x4000..=0x3fff_ffff => out.extend_from_slice(&(0x8000_0000 | value as u32).to_be_bytes()),
        0x4000_0000..=0x3fff_ffff_ffff_ffff => {
            out.extend_from_slice(&(0xc000_0000_0000_0000 | value).to_be_bytes());
        }
        _ => panic!("varint out of range: {value}"),
    }
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: u64) -> Result<&'a [u8], WireError> {
    let len = usize::try_from(len).map_err(|_| WireError::Truncated)?;
    let end = pos.checked_add(len).ok_or(WireError::Truncated)?;
    let bytes = buf.get(*pos..end).ok_or(WireError::Truncated)?;
    *pos = end;
    Ok(bytes)
}

// ---------------------------------------------------------------------------
// Records (docs/protocol.md §1.3)
// ---------------------------------------------------------------------------

/// Split a byte stream into whole records (each including its `Size` prefix).
/// Returns the records and the incomplete tail, if any.
pub fn split_records(bytes: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut records = Vec::new();
    let mut start = 0;
    loop {
        let mut pos = start;
        let Ok(size) = read_varint(bytes, &mut pos) else {
            break;
        };
        let Some(end) = usize::try_from(size).ok().and_then(|s| pos.checked_add(s)) else {
            break;
        };
        if end > bytes.len() {
            break;
        }
        records.push(&bytes[start..end]);
        start = end;
    }
    (records, &bytes[start..])
}

/// The frames region of one whole record (strips the `Size` prefix).
///
/// # Errors
///
/// [`WireError::Truncated`] / [`WireError::Trailing`] if `Size` does not match.
pub fn record_payload(record: &[u8]) -> Result<&[u8], WireError> {
    let mut pos = 0;
    let size = read_varint(record, &mut pos)?;
    let payload = take(record, &mut pos, size)?;
    if pos != record.len() {
        return Err(WireError::Trailing);
    }
    Ok(payload)
}

// ---------------------------------------------------------------------------
// Frames (docs/protocol.md §2)
// ---------------------------------------------------------------------------

/// One decoded QMux frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// PADDING (0x00).
    Padding,
    /// RESET_STREAM (0x04).
    ResetStream {
        /// Stream ID.
        id: u64,
        /// Application error code.
        code: u64,
        /// Final size.
        final_size: u64,
    },
    /// STOP_SENDING (0x05).
    StopSending {
        /// Stream ID.
        id: u64,
        /// Application error code.
        code: u64,
    },
    /// STREAM (0x08..=0x0f).
    Stream {
        /// The frame type byte (OFF/LEN/FIN bits).
        ty: u8,
        /// Stream ID.
        id: u64,
        /// Offset of the first data byte.
        offset: u64,
        /// FIN bit.
        fin: bool,
        /// Stream data.
        data: Vec<u8>,
    },
    /// MAX_DATA (0x10).
    MaxData(u64),
    /// MAX_STREAM_DATA (0x11).
    MaxStreamData {
        /// Stream ID.
        id: u64,
        /// New absolute limit.
        max: u64,
    },
    /// MAX_STREAMS (0x12 bidi / 0x13 uni).
    MaxStreams {
        /// Bidirectional (0x12) or unidirectional (0x13).
        bidi: bool,
        /// New cumulative count.
        max: u64,
    },
    /// DATA_BLOCKED (0x14).
    DataBlocked(u64),
    /// STREAM_DATA_BLOCKED (0x15).
    StreamDataBlocked {
        /// Stream ID.
        id: u64,
        /// Limit.
        limit: u64,
    },
    /// STREAMS_BLOCKED (0x16 bidi / 0x17 uni).
    StreamsBlocked {
        /// Bidirectional or unidirectional.
        bidi: bool,
        /// Limit.
        limit: u64,
    },
    /// CONNECTION_CLOSE (0x1c transport / 0x1d application).
    ConnectionClose {
        /// 0x1d (application) rather than 0x1c (transport).
        application: bool,
        /// Error code.
        code: u64,
        /// Frame type field (transport close only).
        frame_type: Option<u64>,
        /// Reason bytes.
        reason: Vec<u8>,
    },
    /// DATAGRAM (0x30 / 0x31).
    Datagram(Vec<u8>),
    /// QX_PING request or response.
    Ping {
        /// Response rather than request.
        response: bool,
        /// Sequence number.
        sequence: u64,
    },
    /// QX_TRANSPORT_PARAMETERS: `(id, value bytes)` in wire order.
    TransportParameters(Vec<(u64, Vec<u8>)>),
}

/// Decode every frame in one record's frames region.
///
/// # Errors
///
/// Truncated frames or unknown frame types.
pub fn parse_frames(payload: &[u8]) -> Result<Vec<Frame>, WireError> {
    let mut frames = Vec::new();
    let mut pos = 0;
    while pos < payload.len() {
        let ty = read_varint(payload, &mut pos)?;
        let v = |pos: &mut usize| read_varint(payload, pos);
        let frame = match ty {
            0x00 => Frame::Padding,
            0x04 => Frame::ResetStream {
                id: v(&mut pos)?,
                code: v(&mut pos)?,
                final_size: v(&mut pos)?,
            },
            0x05 => Frame::StopSending {
                id: v(&mut pos)?,
                code: v(&mut pos)?,
            },
            0x08..=0x0f => {
                let id = v(&mut pos)?;
                let offset = if ty & 0x04 != 0 { v(&mut pos)? } else { 0 };
                let data = if ty & 0x02 != 0 {
                    let len = v(&mut pos)?;
                    take(payload, &mut pos, len)?.to_vec()
                } else {
                    let rest = payload[pos..].to_vec();
                    pos = payload.len();
                    rest
                };
                Frame::Stream {
                    ty: ty as u8,
                    id,
                    offset,
                    fin: ty & 0x01 != 0,
                    data,
                }
            }
            0x10 => Frame::MaxData(v(&mut pos)?),
            0x11 => Frame::MaxStreamData {
                id: v(&mut pos)?,
                max: v(&mut pos)?,
            },
            0x12 | 0x13 => Frame::MaxStreams {
                bidi: ty == 0x12,
                max: v(&mut pos)?,
            },
            0x14 => Frame::DataBlocked(v(&mut pos)?),
            0x15 => Frame::StreamDataBlocked {
                id: v(&mut pos)?,
                limit: v(&mut pos)?,
            },
            0x16 | 0x17 => Frame::StreamsBlocked {
                bidi: ty == 0x16,
                limit: v(&mut pos)?,
            },
            0x1c | 0x1d => {
                let code = v(&mut pos)?;
                let frame_type = if ty == 0x1c { Some(v(&mut pos)?) } else { None };
                let len = v(&mut pos)?;
                Frame::ConnectionClose {
                    application: ty == 0x1d,
                    code,
                    frame_type,
                    reason: take(payload, &mut pos, len)?.to_vec(),
                }
            }
            0x30 => {
                let rest = payload[pos..].to_vec();
                pos = payload.len();
                Frame::Datagram(rest)
            }
            0x31 => {
                let len = v(&mut pos)?;
                Frame::Datagram(take(payload, &mut pos, len)?.to_vec())
            }
            QX_PING_REQUEST | QX_PING_RESPONSE => Frame::Ping {
                response: ty == QX_PING_RESPONSE,
                sequence: v(&mut pos)?,
            },
            QX_TRANSPORT_PARAMETERS => {
                let len = v(&mut pos)?;
                let body = take(payload, &mut pos, len)?;
                let mut params = Vec::new();
                let mut at = 0;
                while at < body.len() {
                    let id = read_varint(body, &mut at)?;
                    let len = read_varint(body, &mut at)?;
                    params.push((id, take(body, &mut at, len)?.to_vec()));
                }
                Frame::TransportParameters(params)
            }
            other => return Err(WireError::UnknownFrame(other)),
        };
        frames.push(frame);
    }
    Ok(frames)
}

// ---------------------------------------------------------------------------
// Stream reassembly
// ---------------------------------------------------------------------------

/// Everything one direction sent on one stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamLog {
    /// Concatenated STREAM payloads, in arrival order.
    pub data: Vec<u8>,
    /// A STREAM frame with FIN was seen.
    pub fin: bool,
    /// RESET_STREAM `(code, final size)`, if the sender reset it.
    pub reset: Option<(u64, u64)>,
    /// STOP_SENDING code this direction sent for the stream, if any.
    pub stop_sending: Option<u64>,
    /// Index (in the frame sequence given) of the first frame naming the stream.
    pub first_seen: usize,
    /// Whether every STREAM frame's offset equalled the bytes already received.
    pub contiguous: bool,
}

/// Group one direction's frames by stream ID.
pub fn reassemble<'a>(frames: impl IntoIterator<Item = &'a Frame>) -> BTreeMap<u64, StreamLog> {
    let mut streams: BTreeMap<u64, StreamLog> = BTreeMap::new();
    for (index, frame) in frames.into_iter().enumerate() {
        let id = match frame {
            Frame::Stream { id, .. }
            | Frame::ResetStream { id, .. }
            | Frame::StopSending { id, .. } => *id,
            _ => continue,
        };
        let log = streams.entry(id).or_insert_with(|| StreamLog {
            first_seen: index,
            contiguous: true,
            ..StreamLog::default()
        });
        match frame {
            Frame::Stream {
                offset, fin, data, ..
            } => {
                if *offset != log.data.len() as u64 {
                    log.contiguous = false;
                }
                log.data.extend_from_slice(data);
                log.fin |= *fin;
            }
            Frame::ResetStream {
                code, final_size, ..
            } => log.reset = Some((*code, *final_size)),
            Frame::StopSending { code, .. } => log.stop_sending = Some(*code),
            _ => {}
        }
    }
    streams
}

// ---------------------------------------------------------------------------
// Hex
// ---------------------------------------------------------------------------

/// Lowercase hex bytes separated by spaces (docs/protocol.md's test-vector notation).
pub fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, byte) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Parse hex bytes; whitespace anywhere is ignored. `None` on any other character or
/// an odd digit count.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(pair, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- varints -----------------------------------------------------------

    #[test]
    fn varint_examples_from_protocol_md() {
        for (value, hex) in [
            (25u64, "19"),
            (100, "40 64"),
            (250, "40 fa"),
            (30000, "80 00 75 30"),
            (1_048_576, "80 10 00 00"),
            (16382, "7f fe"),
            (QX_TRANSPORT_PARAMETERS, "ff 51 53 30 0d 0a 0d 0a"),
        ] {
            let mut out = Vec::new();
            write_varint(value, &mut out);
            assert_eq!(to_hex(&out), hex);
            let mut pos = 0;
            assert_eq!(read_varint(&out, &mut pos), Ok(value));
            assert_eq!(pos, out.len());
        }
    }

    #[test]
    fn truncated_varint_is_an_error() {
        let mut pos = 0;
        assert_eq!(
            read_varint(&[0x80, 0x00], &mut pos),
            Err(WireError::Truncated)
        );
    }

    // --- records and frames ------------------------------------------------

    #[test]
    fn splits_records_and_keeps_the_tail() {
        let bytes = from_hex("04 0f 02 14 00  03 05 08 00  05 10").unwrap();
        let (records, tail) = split_records(&bytes);
        assert_eq!(records.len(), 2);
        assert_eq!(tail, &[0x05, 0x10]);
        let frames = parse_frames(record_payload(records[0]).unwrap()).unwrap();
        assert_eq!(
            frames,
            vec![Frame::Stream {
                ty: 0x0f,
                id: 2,
                offset: 0x14,
                fin: true,
                data: vec![]
            }]
        );
    }

    #[test]
    fn reassembles_streams() {
        let frames = parse_frames(
            &from_hex("0e 07 00 02 aa bb 0e 07 02 01 cc 0f 07 03 00 05 07 00").unwrap(),
        )
        .unwrap();
        let streams = reassemble(&frames);
        let log = &streams[&7];
        assert_eq!(log.data, vec![0xaa, 0xbb, 0xcc]);
        assert!(log.fin && log.contiguous);
        assert_eq!(log.stop_sending, Some(0));
    }

    #[test]
    fn unknown_frame_type_is_an_error() {
        assert_eq!(parse_frames(&[0x02]), Err(WireError::UnknownFrame(2)));
    }
}
