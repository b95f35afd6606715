//! WebSocket frames to QMux records and back (docs/protocol.md §9.4–9.6).
//!
//! [`Decoder`] reads the frames the peer sends and writes each binary
//! message out as one QMux/TCP record (`Size` varint + the message's bytes),
//! so the session reads the connection as if it came over TCP. Payload is
//! unmasked while it is copied out. A message in one frame (what browsers
//! send) streams through as it arrives; a fragmented one is held until its
//! last fragment, then given its `Size`. Ping payloads are kept for the
//! writer to answer, and a Close is reported.
//!
//! [`encode_header`] writes the header a writer puts in front of a record's
//! frames (masked with a fresh key on a client, [`apply_mask`]).

use std::io::Cursor;

use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};

/// Longest frame header: 2 bytes, an 8-byte length and a 4-byte mask.
pub const MAX_HEADER: usize = 14;

/// Longest control frame payload (RFC 6455 §5.5).
pub const MAX_CONTROL: usize = 125;

/// Largest message a [`Decoder`] accepts whatever it is configured with: a
/// fragmented message's record `Size` is a 4-byte varint.
pub const MAX_MESSAGE: usize = (1 << 30) - 1;

/// Opcode of a binary data frame.
pub const OP_BINARY: u8 = 0x2;
/// Opcode of a Close frame.
pub const OP_CLOSE: u8 = 0x8;
/// Opcode of a Ping frame.
pub const OP_PING: u8 = 0x9;
/// Opcode of a Pong frame.
pub const OP_PONG: u8 = 0xa;

/// Close code: normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code: the endpoint is going away (server shutting down).
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code: a protocol error.
pub const CLOSE_PROTOCOL: u16 = 1002;
/// Close code: a data type we do not accept (a text frame).
pub const CLOSE_UNSUPPORTED: u16 = 1003;
/// Close code: a message too big to process.
pub const CLOSE_TOO_BIG: u16 = 1009;

/// Which end of the connection decodes: a server requires masked frames, a
/// client refuses them (RFC 6455 §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We accepted the connection: the peer's frames are masked.
    Server,
    /// We dialed: the peer's frames are not masked.
    Client,
}

/// Why the peer's frames end the connection, with the close code to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A text message: QMux travels in binary messages only (1003).
    #[error("text message")]
    Text,
    /// A message larger than our record size limit (1009).
    #[error("message larger than {0} bytes")]
    TooBig(usize),
    /// Any other broken framing rule (1002).
    #[error("websocket protocol error: {0}")]
    Protocol(&'static str),
}

impl FrameError {
    /// A short reason for the Close frame.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::Text => "text messages are not accepted",
            FrameError::TooBig(_) => "message too big",
            FrameError::Protocol(why) => why,
        }
    }

    /// The WebSocket close code that reports this error.
    #[must_use]
    pub fn close_code(&self) -> u16 {
        match self {
            FrameError::Text => CLOSE_UNSUPPORTED,
            FrameError::TooBig(_) => CLOSE_TOO_BIG,
            FrameError::Protocol(_) => CLOSE_PROTOCOL,
        }
    }
}

/// The frame whose payload is being read.
#[derive(Debug, Clone, Copy)]
struct Payload {
    remaining: u64,
    mask: Option<[u8; 4]>,
    /// Payload bytes already unmasked (the key's phase).
    done: usize,
    /// `None`: data (goes to the message); else a control opcode.
    control: Option<u8>,
}

/// A data message being received.
#[derive(Debug, Clone, Copy)]
struct Message {
    /// Where its record starts in `out`.
    start: usize,
    /// Bytes so far.
    len: usize,
    /// Fragmented: held in `out` until its last fragment, behind a 4-byte `Size`.
    held: bool,
}

/// Decodes a peer's WebSocket frames into QMux records; see the module docs.
#[derive(Debug)]
pub struct Decoder {
    role: Role,
    max_message: usize,
    head: [u8; MAX_HEADER],
    head_len: usize,
    payload: Option<Payload>,
    message: Option<Message>,
    /// Records out; the first `ready` bytes may be handed to the session.
    out: Vec<u8>,
    ready: usize,
    control: [u8; MAX_CONTROL],
    control_len: usize,
    ping: Option<([u8; MAX_CONTROL], usize)>,
    pongs: u64,
    close: Option<Option<u16>>,
    /// The current data frame is its message's last.
    last_fin: bool,
}

impl Decoder {
    /// A decoder for `role` that accepts messages of at most `max_message`
    /// bytes (our QMux `max_record_size`; at most [`MAX_MESSAGE`]), with
    /// `capacity` bytes of output buffer allocated once.
    #[must_use]
    pub fn new(role: Role, max_message: usize, capacity: usize) -> Self {
        Decoder {
            role,
            max_message: max_message.min(MAX_MESSAGE),
            head: [0; MAX_HEADER],
            head_len: 0,
            payload: None,
            message: None,
            out: Vec::with_capacity(capacity),
            ready: 0,
            control: [0; MAX_CONTROL],
            control_len: 0,
            ping: None,
            pongs: 0,
            close: None,
            last_fin: false,
        }
    }

    /// Records decoded so far and not consumed: QMux/TCP bytes (may end
    /// inside a record whose message is still arriving).
    #[must_use]
    pub fn records(&self) -> &[u8] {
        self.out.get(..self.ready).unwrap_or(&[])
    }

    /// Drops the first `n` bytes of [`Decoder::records`] (at most all of them).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.ready);
        self.out.drain(..n);
        if let Some(m) = self.message.as_mut() {
            m.start = m.start.saturating_sub(n);
        }
        self.ready -= n;
    }

    /// Bytes held in the output (ready or not).
    #[must_use]
    pub fn buffered(&self) -> usize {
        self.out.len()
    }

    /// The payload of the latest Ping not answered yet (send it back in a Pong).
    pub fn take_ping(&mut self) -> Option<([u8; MAX_CONTROL], usize)> {
        self.ping.take()
    }

    /// Pongs received so far.
    #[must_use]
    pub fn pongs(&self) -> u64 {
        self.pongs
    }

    /// The peer's Close, once received: its code if it sent one.
    #[must_use]
    pub fn closed(&self) -> Option<Option<u16>> {
        self.close
    }

    /// Decodes all of `input`, unmasking payload in place in the output;
    /// bytes after the peer's Close are ignored.
    ///
    /// # Errors
    /// [`FrameError`] on the first broken rule: close with its code; the
    /// decoder must not be fed again.
    pub fn feed(&mut self, mut input: &[u8]) -> Result<(), FrameError> {
        while !input.is_empty() && self.close.is_none() {
            match self.payload {
                None => {
                    let used = self.header(input)?;
                    input = &input[used..];
                }
                Some(p) => {
                    let take = usize::try_from(p.remaining)
                        .unwrap_or(usize::MAX)
                        .min(input.len());
                    let (now, rest) = input.split_at(take);
                    self.payload_bytes(now, p.mask, p.done)?;
                    input = rest;
                    let p = Payload {
                        remaining: p.remaining - take as u64,
                        done: p.done + take,
                        ..p
                    };
                    self.payload = Some(p);
                    if p.remaining == 0 {
                        self.payload = None;
                        self.frame_done(p)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes a frame header from the front of `input` (with bytes kept from
    /// before); how many bytes of `input` it used.
    fn header(&mut self, input: &[u8]) -> Result<usize, FrameError> {
        let kept = self.head_len;
        let room = MAX_HEADER - kept;
        let add = room.min(input.len());
        self.head[kept..kept + add].copy_from_slice(&input[..add]);
        let avail = kept + add;
        let mut cursor = Cursor::new(&self.head[..avail]);
        let parsed =
            FrameHeader::parse(&mut cursor).map_err(|_| FrameError::Protocol("reserved opcode"))?;
        let Some((h, len)) = parsed else {
            // Incomplete: everything given is kept (less than a header).
            self.head_len = avail;
            return Ok(add);
        };
        let used = usize::try_from(cursor.position()).unwrap_or(MAX_HEADER) - kept;
        self.head_len = 0;
        if h.rsv1 || h.rsv2 || h.rsv3 {
            return Err(FrameError::Protocol("reserved bits set"));
        }
        match (self.role, h.mask.is_some()) {
            (Role::Server, false) => return Err(FrameError::Protocol("client frame not masked")),
            (Role::Client, true) => return Err(FrameError::Protocol("server frame masked")),
            _ => {}
        }
        let control = match h.opcode {
            OpCode::Data(Data::Text) => return Err(FrameError::Text),
            OpCode::Data(Data::Binary) => {
                if self.message.is_some() {
                    return Err(FrameError::Protocol("new message inside a fragmented one"));
                }
                self.start_message(len, h.is_final)?;
                None
            }
            OpCode::Data(Data::Continue) => {
                let Some(m) = self.message else {
                    return Err(FrameError::Protocol("continuation without a message"));
                };
                if (m.len as u64).saturating_add(len) > self.max_message as u64 {
                    return Err(FrameError::TooBig(self.max_message));
                }
                None
            }
            OpCode::Control(c) => {
                if !h.is_final || len > MAX_CONTROL as u64 {
                    return Err(FrameError::Protocol("control frame fragmented or too long"));
                }
                self.control_len = 0;
                Some(match c {
                    Control::Close => OP_CLOSE,
                    Control::Ping => OP_PING,
                    Control::Pong => OP_PONG,
                    Control::Reserved(_) => return Err(FrameError::Protocol("reserved opcode")),
                })
            }
            OpCode::Data(Data::Reserved(_)) => return Err(FrameError::Protocol("reserved opcode")),
        };
        // Which data frame ends its message is known from its header.
        let fin_data = control.is_none() && h.is_final;
        let p = Payload {
            remaining: len,
            mask: h.mask,
            done: 0,
            control,
        };
        if control.is_none() {
            self.last_fin = fin_data;
        }
        if len == 0 {
            self.frame_done(p)?;
        } else {
            self.payload = Some(p);
        }
        Ok(used)
    }

    /// Begins a binary message of a first frame of `len` bytes.
    fn start_message(&mut self, len: u64, fin: bool) -> Result<(), FrameError> {
        if len > self.max_message as u64 {
            return Err(FrameError::TooBig(self.max_message));
        }
        let start = self.out.len();
        let mut size = [0u8; 8];
        let n = if fin {
            // One frame: its length is the record's Size, and bytes stream through.
            skiff_core::wire::varint::encode(len, &mut size).unwrap_or(0)
        } else {
            // Fragmented: a 4-byte Size written when the last fragment is in.
            4
        };
        self.out.extend_from_slice(&size[..n]);
        self.message = Some(Message {
            start,
            len: 0,
            held: !fin,
        });
        if fin {
            self.ready = self.out.len();
        }
        Ok(())
    }

    /// Stores payload bytes of the current frame, unmasked with `mask` at `phase`.
    fn payload_bytes(
        &mut self,
        bytes: &[u8],
        mask: Option<[u8; 4]>,
        phase: usize,
    ) -> Result<(), FrameError> {
        let Some(p) = self.payload else { return Ok(()) };
        match p.control {
            None => {
                let Some(m) = self.message.as_mut() else {
                    return Err(FrameError::Protocol("data outside a message"));
                };
                m.len += bytes.len();
                if m.len > self.max_message {
                    return Err(FrameError::TooBig(self.max_message));
                }
                let at = self.out.len();
                self.out.extend_from_slice(bytes);
                if let (Some(mask), Some(tail)) = (mask, self.out.get_mut(at..)) {
                    apply_mask(tail, mask, phase);
                }
                if !m.held {
                    self.ready = self.out.len();
                }
            }
            Some(_) => {
                let end = self.control_len + bytes.len();
                let Some(room) = self.control.get_mut(self.control_len..end) else {
                    return Err(FrameError::Protocol("control frame too long"));
                };
                room.copy_from_slice(bytes);
                if let Some(mask) = mask {
                    apply_mask(room, mask, phase);
                }
                self.control_len = end;
            }
        }
        Ok(())
    }

    /// A frame's payload is complete.
    fn frame_done(&mut self, p: Payload) -> Result<(), FrameError> {
        match p.control {
            None => {
                if !self.last_fin {
                    return Ok(());
                }
                let Some(m) = self.message.take() else {
                    return Ok(());
                };
                if m.held {
                    // The 4-byte Size of a fragmented message: 0b10 prefix.
                    let size = (m.len as u32 | 0x8000_0000).to_be_bytes();
                    if let Some(at) = self.out.get_mut(m.start..m.start + 4) {
                        at.copy_from_slice(&size);
                    }
                }
                self.ready = self.out.len();
            }
            Some(OP_PING) => {
                self.ping = Some((self.control, self.control_len));
            }
            Some(OP_PONG) => self.pongs += 1,
            Some(_) => {
                let body = &self.control[..self.control_len];
                self.close = Some(match body {
                    [] => None,
                    [_] => return Err(FrameError::Protocol("close payload of one byte")),
                    [a, b, reason @ ..] => {
                        if core::str::from_utf8(reason).is_err() {
                            return Err(FrameError::Protocol("close reason is not UTF-8"));
                        }
                        Some(u16::from_be_bytes([*a, *b]))
                    }
                });
            }
        }
        Ok(())
    }
}

/// XORs `buf` with `mask`, `phase` bytes into the payload (RFC 6455 §5.3).
pub fn apply_mask(buf: &mut [u8], mask: [u8; 4], phase: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= mask[(phase + i) & 3];
    }
}

/// A fresh masking key from the thread's CSPRNG.
#[must_use]
pub fn new_mask() -> [u8; 4] {
    rand::random()
}

/// Writes a final frame's header for `len` payload bytes of `opcode` into
/// `out` (at least [`MAX_HEADER`] bytes); how many bytes it wrote.
#[must_use]
pub fn encode_header(opcode: u8, len: u64, mask: Option<[u8; 4]>, out: &mut [u8]) -> usize {
    let opcode = match opcode {
        OP_CLOSE => OpCode::Control(Control::Close),
        OP_PING => OpCode::Control(Control::Ping),
        OP_PONG => OpCode::Control(Control::Pong),
        _ => OpCode::Data(Data::Binary),
    };
    let h = FrameHeader {
        opcode,
        mask,
        ..FrameHeader::default()
    };
    let want = h.len(len);
    let Some(slot) = out.get_mut(..want) else {
        return 0;
    };
    let mut w = Cursor::new(slot);
    match h.format(len, &mut w) {
        Ok(()) => want,
        Err(_) => 0,
    }
}

/// A Close frame's payload: `code` and as much of `reason` as fits (whole characters).
#[must_use]
pub fn close_payload(code: u16, reason: &str) -> ([u8; MAX_CONTROL], usize) {
    let mut out = [0u8; MAX_CONTROL];
    out[..2].copy_from_slice(&code.to_be_bytes());
    let mut n = reason.len().min(MAX_CONTROL - 2);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    out[2..2 + n].copy_from_slice(&reason.as_bytes()[..n]);
    (out, 2 + n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let mut head = [0u8; MAX_HEADER];
        let n = encode_header(opcode, payload.len() as u64, Some(mask), &mut head);
        head[0] = (head[0] & 0xf0) | opcode;
        if !fin {
            head[0] &= 0x7f;
        }
        let mut out = head[..n].to_vec();
        let mut body = payload.to_vec();
        apply_mask(&mut body, mask, 0);
        out.extend_from_slice(&body);
        out
    }

    fn decode(bytes: &[u8], step: usize) -> Result<(Vec<u8>, Decoder), FrameError> {
        let mut d = Decoder::new(Role::Server, 16382, 1024);
        let mut out = Vec::new();
        for chunk in bytes.chunks(step) {
            d.feed(chunk)?;
            out.extend_from_slice(d.records());
            d.consume(d.records().len());
        }
        Ok((out, d))
    }

    #[test]
    fn binary_messages_become_records_at_any_split() {
        let big = vec![7u8; 300];
        let mut wire = frame(OP_BINARY, true, b"abc");
        wire.extend(frame(OP_PING, true, b"hi"));
        wire.extend(frame(OP_BINARY, true, &big));
        wire.extend(frame(OP_BINARY, true, b""));
        let mut want = vec![3, b'a', b'b', b'c', 0x41, 0x2c];
        want.extend_from_slice(&big);
        want.push(0);
        for step in [1, 2, 5, 13, 1000] {
            let (out, mut d) = decode(&wire, step).unwrap();
            assert_eq!(out, want, "step {step}");
            let (ping, n) = d.take_ping().unwrap();
            assert_eq!(&ping[..n], b"hi");
        }
    }

    #[test]
    fn fragments_are_held_then_sized() {
        let mut wire = frame(OP_BINARY, false, b"ab");
        wire.extend(frame(OP_PONG, true, b""));
        let mut cont = frame(OP_BINARY, true, b"cd");
        cont[0] = 0x80; // FIN, continuation
        wire.extend(cont);
        for step in [1, 3, 100] {
            let (out, d) = decode(&wire, step).unwrap();
            assert_eq!(out, [0x80, 0, 0, 4, b'a', b'b', b'c', b'd'], "step {step}");
            assert_eq!(d.pongs(), 1);
            assert_eq!(skiff_core::wire::varint::decode(&out).unwrap(), (4, 4));
        }
    }

    #[test]
    fn bad_frames_close_with_their_code() {
        let text = frame(0x1, true, b"hi");
        assert_eq!(
            decode(&text, 100).unwrap_err().close_code(),
            CLOSE_UNSUPPORTED
        );
        let big = frame(OP_BINARY, true, &[0; 16383]);
        assert_eq!(decode(&big, 100).unwrap_err().close_code(), CLOSE_TOO_BIG);
        let mut unmasked = [0u8; MAX_HEADER];
        let n = encode_header(OP_BINARY, 0, None, &mut unmasked);
        assert_eq!(
            decode(&unmasked[..n], 100).unwrap_err().close_code(),
            CLOSE_PROTOCOL
        );
        let mut cont = frame(OP_BINARY, true, b"x");
        cont[0] = 0x80;
        assert_eq!(decode(&cont, 1).unwrap_err().close_code(), CLOSE_PROTOCOL);
        let long_ping = frame(OP_PING, true, &[0; 126]);
        assert!(decode(&long_ping, 100).is_err());
        let reserved = frame(0x3, true, b"");
        assert!(decode(&reserved, 100).is_err());
    }

    #[test]
    fn close_is_reported_and_ends_input() {
        let (payload, n) = close_payload(CLOSE_NORMAL, "bye");
        let mut wire = frame(OP_CLOSE, true, &payload[..n]);
        wire.extend(frame(OP_BINARY, true, b"late"));
        let (out, d) = decode(&wire, 4).unwrap();
        assert!(out.is_empty());
        assert_eq!(d.closed(), Some(Some(CLOSE_NORMAL)));
    }

    #[test]
    fn headers_match_rfc_examples() {
        let mut out = [0u8; MAX_HEADER];
        // RFC 6455 §5.7: an unmasked "Hello" is 0x81 0x05 for text; binary is 0x82.
        let n = encode_header(OP_BINARY, 5, None, &mut out);
        assert_eq!(&out[..n], [0x82, 0x05]);
        let n = encode_header(OP_BINARY, 256, None, &mut out);
        assert_eq!(&out[..n], [0x82, 0x7e, 0x01, 0x00]);
        assert_eq!(encode_header(OP_BINARY, 65536, None, &mut out), 10);
        assert_eq!(encode_header(OP_PONG, 0, Some([0; 4]), &mut out), 6);
    }
}
