//! WebTransport over HTTP/3 (docs/protocol.md §12): the sans-IO pieces that
//! read what the peer sends on the streams HTTP/3 keeps for itself, and
//! build what we send on them.
//!
//! The HTTP/3 framing, SETTINGS, the CONNECT request and response (their
//! QPACK field sections, static table only) and the capsules are encoded and
//! decoded by `web-transport-proto`, moq-dev's sans-IO codec, which is what
//! moq-tokio and moq-relay speak. This module adds the parts a connection
//! driver needs around it, each bounded so that a peer cannot make us hold
//! more than a few kilobytes for it:
//!
//! - [`StreamHeader`]: the first varints of a peer's stream (its type, and
//!   for a WebTransport stream the session it belongs to), read without
//!   reading past them;
//! - [`ControlStream`]: the peer's control stream (SETTINGS first, then
//!   frames we skip);
//! - [`ConnectStream`]: the CONNECT stream (the request or response
//!   HEADERS, then the capsules inside DATA frames);
//! - the bytes we send: [`settings`], [`request`], [`response`],
//!   [`close_capsule`].
//!
//! [`QuicTransport`](crate::QuicTransport) drives them in its WebTransport
//! mode.

use std::string::String;
use std::vec::Vec;

use web_transport_proto::{Capsule, ConnectRequest, ConnectResponse, Settings, VarInt};

/// The ALPN of HTTP/3, under which WebTransport runs.
pub const ALPN_H3: &str = "h3";

/// Uni stream type of the HTTP/3 control stream.
pub const STREAM_CONTROL: u64 = 0x00;
/// Uni stream type of a server push (never valid from a client).
pub const STREAM_PUSH: u64 = 0x01;
/// Uni stream type of the QPACK encoder stream.
pub const STREAM_QPACK_ENCODER: u64 = 0x02;
/// Uni stream type of the QPACK decoder stream.
pub const STREAM_QPACK_DECODER: u64 = 0x03;
/// Uni stream type of a WebTransport stream (then the session ID).
pub const STREAM_WEBTRANSPORT: u64 = 0x54;
/// First varint of a WebTransport bidi stream (then the session ID).
pub const BIDI_WEBTRANSPORT: u64 = 0x41;

/// HTTP/3 frame types this module looks at.
const FRAME_DATA: u64 = 0x00;
const FRAME_HEADERS: u64 = 0x01;
const FRAME_SETTINGS: u64 = 0x04;
const FRAME_GOAWAY: u64 = 0x07;

/// Largest HTTP/3 frame we take on the control and CONNECT streams (a
/// field section of 16 KiB is what we advertise as our limit).
pub const FRAME_MAX: usize = 16 * 1024 + 16;
/// Bytes a peer may send on its control stream over the connection's life.
pub const CONTROL_MAX: u64 = 64 * 1024;
/// Bytes a peer may send on each QPACK stream: with a dynamic table of
/// capacity 0 (the default we keep) there is next to nothing to say.
pub const QPACK_MAX: u64 = 4 * 1024;
/// Bytes a peer may send on the CONNECT stream besides its HEADERS: the
/// capsules (a close with its reason fits many times).
pub const CAPSULES_MAX: u64 = 64 * 1024;
/// Streams of the peer held, unread past their header, until the session
/// they name is set up.
pub const EARLY_MAX: usize = 64;

/// HTTP/3 and WebTransport error codes (RFC 9114 §8.1, RFC 9204 §6,
/// the WebTransport over HTTP/3 draft).
pub mod code {
    /// No error: the connection or stream closes normally.
    pub const H3_NO_ERROR: u64 = 0x100;
    /// A protocol violation not covered by a more specific code.
    pub const H3_GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    /// A stream type or direction that is not allowed.
    pub const H3_STREAM_CREATION_ERROR: u64 = 0x103;
    /// A stream HTTP/3 needs was closed or reset.
    pub const H3_CLOSED_CRITICAL_STREAM: u64 = 0x104;
    /// A frame not allowed where it came.
    pub const H3_FRAME_UNEXPECTED: u64 = 0x105;
    /// A frame that does not parse.
    pub const H3_FRAME_ERROR: u64 = 0x106;
    /// More than we take: too many bytes or streams.
    pub const H3_EXCESSIVE_LOAD: u64 = 0x107;
    /// The control stream did not start with SETTINGS.
    pub const H3_MISSING_SETTINGS: u64 = 0x10a;
    /// A request refused before any of it was processed.
    pub const H3_REQUEST_REJECTED: u64 = 0x10b;
    /// A request stream that ended before the request or response was
    /// complete.
    pub const H3_REQUEST_INCOMPLETE: u64 = 0x10d;
    /// A request or response that is malformed.
    pub const H3_MESSAGE_ERROR: u64 = 0x10e;
    /// A stream for a WebTransport session that was refused or never set up.
    pub const WT_BUFFERED_STREAM_REJECTED: u64 = 0x3994_bd84;
}

/// Reads a QUIC varint from the front of `buf`: its value and length, or
/// `None` when `buf` ends first.
fn varint(buf: &[u8]) -> Option<(u64, usize)> {
    skiff_core::wire::varint::decode(buf).ok()
}

/// Appends `v` as a QUIC varint (values past 2^62 are clamped).
fn put_varint(out: &mut Vec<u8>, v: u64) {
    VarInt::from_u64(v).unwrap_or(VarInt::MAX).encode(out);
}

/// The first varints of a peer's stream: the stream type of a uni stream or
/// the first frame type of a bidi one, then, for a WebTransport stream, the
/// session ID. [`need`](Self::need) says how many bytes to read next, so
/// nothing past the header is taken from the stream.
#[derive(Debug, Default, Clone)]
pub struct StreamHeader {
    buf: [u8; 16],
    len: usize,
}

/// What a complete [`StreamHeader`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A WebTransport stream of session `0`.
    WebTransport(u64),
    /// Another type: a uni stream's type, or a bidi stream's first frame
    /// type (whose bytes, [`StreamHeader::bytes`], start that frame).
    Other(u64),
}

impl StreamHeader {
    /// Bytes to read next (at least 1), or 0 once the header is complete.
    /// `bidi`: the stream is bidirectional (the WebTransport marker is then
    /// 0x41, else 0x54).
    pub fn need(&self, bidi: bool) -> usize {
        let Some(&first) = self.buf.first().filter(|_| self.len > 0) else {
            return 1;
        };
        let l1 = 1usize << (first >> 6);
        if self.len < l1 {
            return l1 - self.len;
        }
        let marker = if bidi {
            BIDI_WEBTRANSPORT
        } else {
            STREAM_WEBTRANSPORT
        };
        match varint(&self.buf[..l1]) {
            Some((t, _)) if t == marker => {}
            _ => return 0,
        }
        if self.len == l1 {
            return 1;
        }
        let l2 = 1usize << (self.buf[l1] >> 6);
        (l1 + l2).saturating_sub(self.len)
    }

    /// Takes the bytes read (no more than [`need`](Self::need) asked for;
    /// more are ignored).
    pub fn push(&mut self, bytes: &[u8]) {
        let room = self.buf.len() - self.len;
        let n = bytes.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    /// The header, once complete (`need` is 0).
    pub fn kind(&self, bidi: bool) -> Option<Kind> {
        if self.need(bidi) != 0 {
            return None;
        }
        let (t, l1) = varint(&self.buf[..self.len])?;
        let marker = if bidi {
            BIDI_WEBTRANSPORT
        } else {
            STREAM_WEBTRANSPORT
        };
        if t == marker {
            let (session, _) = varint(&self.buf[l1..self.len])?;
            Some(Kind::WebTransport(session))
        } else {
            Some(Kind::Other(t))
        }
    }

    /// The bytes read so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Why the peer's HTTP/3 input closes the connection: an HTTP/3 error code
/// and a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H3Error {
    /// The HTTP/3 error code the connection closes with.
    pub code: u64,
    /// What was wrong.
    pub reason: &'static str,
}

const fn err(code: u64, reason: &'static str) -> H3Error {
    H3Error { code, reason }
}

/// One frame split from the front of a buffer: its type, where its payload
/// starts and its length.
struct Frame {
    typ: u64,
    start: usize,
    len: usize,
}

/// Splits the next frame from `buf`; `None` when it is not all there yet.
///
/// # Errors
/// A frame longer than `max`.
fn split_frame(buf: &[u8], max: usize) -> Result<Option<Frame>, H3Error> {
    let Some((typ, a)) = varint(buf) else {
        return Ok(None);
    };
    let Some((len, b)) = varint(&buf[a..]) else {
        return Ok(None);
    };
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    if len > max {
        return Err(err(code::H3_EXCESSIVE_LOAD, "HTTP/3 frame too large"));
    }
    if buf.len() - a - b < len {
        return Ok(None);
    }
    Ok(Some(Frame {
        typ,
        start: a + b,
        len,
    }))
}

/// The peer's control stream, after its type: SETTINGS first, then frames
/// that are skipped (GOAWAY noted).
#[derive(Debug, Default)]
pub struct ControlStream {
    buf: Vec<u8>,
    total: u64,
    settings: Option<bool>,
    goaway: bool,
}

impl ControlStream {
    /// Takes the next bytes of the stream.
    ///
    /// # Errors
    /// The connection error the input calls for: no SETTINGS first, a
    /// second SETTINGS, a frame not allowed here, a malformed SETTINGS, or
    /// more than [`CONTROL_MAX`] bytes.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), H3Error> {
        self.total = self.total.saturating_add(data.len() as u64);
        if self.total > CONTROL_MAX {
            return Err(err(code::H3_EXCESSIVE_LOAD, "control stream too long"));
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        while let Some(f) = split_frame(&self.buf[at..], FRAME_MAX)? {
            let payload = &self.buf[at + f.start..at + f.start + f.len];
            match (f.typ, self.settings.is_some()) {
                (FRAME_SETTINGS, false) => {
                    // The codec reads the stream type first.
                    let mut whole = Vec::with_capacity(f.start + f.len + 1);
                    whole.push(STREAM_CONTROL as u8);
                    whole.extend_from_slice(&self.buf[at..at + f.start + f.len]);
                    let settings = Settings::decode(&mut whole.as_slice())
                        .map_err(|_| err(code::H3_FRAME_ERROR, "malformed SETTINGS"))?;
                    self.settings = Some(settings.supports_webtransport() > 0);
                }
                (_, false) => {
                    return Err(err(
                        code::H3_MISSING_SETTINGS,
                        "control stream without SETTINGS",
                    ));
                }
                (FRAME_SETTINGS | FRAME_DATA | FRAME_HEADERS, true) => {
                    return Err(err(
                        code::H3_FRAME_UNEXPECTED,
                        "frame not allowed on the control stream",
                    ));
                }
                (FRAME_GOAWAY, true) => {
                    let _ = payload;
                    self.goaway = true;
                }
                _ => {}
            }
            at += f.start + f.len;
        }
        self.buf.drain(..at);
        Ok(())
    }

    /// Whether the peer's SETTINGS arrived, and if so whether they enable
    /// WebTransport (datagrams and at least one session).
    pub fn settings(&self) -> Option<bool> {
        self.settings
    }

    /// Whether the peer sent GOAWAY.
    pub fn goaway(&self) -> bool {
        self.goaway
    }
}

/// The CONNECT stream as one side reads it: the peer's HEADERS (a request
/// on the server, a response on the client), then capsules inside DATA
/// frames, of which the session close is kept.
#[derive(Debug, Default)]
pub struct ConnectStream {
    buf: Vec<u8>,
    headers: Option<Vec<u8>>,
    capsules: Vec<u8>,
    after_headers: u64,
    close: Option<(u32, String)>,
}

impl ConnectStream {
    /// Takes the next bytes of the stream.
    ///
    /// # Errors
    /// A frame larger than [`FRAME_MAX`], a second HEADERS, more than
    /// [`CAPSULES_MAX`] bytes after the HEADERS, or a capsule that does not
    /// parse.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), H3Error> {
        if self.headers.is_some() {
            self.after_headers = self.after_headers.saturating_add(data.len() as u64);
            if self.after_headers > CAPSULES_MAX {
                return Err(err(code::H3_EXCESSIVE_LOAD, "CONNECT stream too long"));
            }
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        while let Some(f) = split_frame(&self.buf[at..], FRAME_MAX)? {
            let end = at + f.start + f.len;
            match f.typ {
                FRAME_HEADERS if self.headers.is_none() => {
                    self.headers = Some(self.buf[at..end].to_vec());
                }
                FRAME_HEADERS => {
                    return Err(err(
                        code::H3_FRAME_UNEXPECTED,
                        "trailers on the CONNECT stream",
                    ));
                }
                FRAME_DATA if self.headers.is_some() => {
                    self.capsules
                        .extend_from_slice(&self.buf[at + f.start..end]);
                    self.read_capsules()?;
                }
                FRAME_DATA => {
                    return Err(err(code::H3_FRAME_UNEXPECTED, "DATA before HEADERS"));
                }
                // Reserved and unknown frame types are skipped.
                _ => {}
            }
            at = end;
        }
        self.buf.drain(..at);
        Ok(())
    }

    fn read_capsules(&mut self) -> Result<(), H3Error> {
        loop {
            let mut rest = self.capsules.as_slice();
            match Capsule::decode(&mut rest) {
                Ok(c) => {
                    let used = self.capsules.len() - rest.len();
                    self.capsules.drain(..used);
                    if let Capsule::CloseWebTransportSession { code, reason } = c
                        && self.close.is_none()
                    {
                        self.close = Some((code, reason));
                    }
                }
                Err(web_transport_proto::CapsuleError::UnexpectedEnd)
                | Err(web_transport_proto::CapsuleError::VarInt(_)) => return Ok(()),
                Err(_) => return Err(err(code::H3_MESSAGE_ERROR, "malformed capsule")),
            }
        }
    }

    /// The HEADERS frame (type, length and field section), once it arrived.
    pub fn headers(&self) -> Option<&[u8]> {
        self.headers.as_deref()
    }

    /// The session close the peer sent (its code and reason), if it did.
    pub fn close(&self) -> Option<&(u32, String)> {
        self.close.as_ref()
    }
}

/// What a CONNECT request asks for, as the server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The path and query of the request (`/room?jwt=…`): the session's
    /// path, as a WebSocket request target is (docs/protocol.md §9.3).
    pub target: String,
    /// The authority the client dialed.
    pub authority: String,
    /// `WT-Available-Protocols`, in the client's order (empty if absent).
    pub protocols: Vec<String>,
}

/// Decodes a CONNECT request from its HEADERS frame.
///
/// # Errors
/// Not an extended CONNECT for WebTransport over https, or malformed.
pub fn decode_request(headers: &[u8]) -> Result<Request, H3Error> {
    let req = ConnectRequest::decode(&mut &headers[..])
        .map_err(|_| err(code::H3_MESSAGE_ERROR, "not a WebTransport CONNECT"))?;
    let mut target = String::from(req.url.path());
    if let Some(q) = req.url.query() {
        target.push('?');
        target.push_str(q);
    }
    let authority = String::from(req.url.authority());
    Ok(Request {
        target,
        authority,
        protocols: req.protocols,
    })
}

/// The status and chosen protocol of a CONNECT response.
///
/// # Errors
/// Malformed HEADERS; a non-2xx status is `Ok` with that status.
pub fn decode_response(headers: &[u8]) -> Result<(u16, Option<String>), H3Error> {
    match ConnectResponse::decode(&mut &headers[..]) {
        Ok(r) => Ok((r.status.as_u16(), r.protocol)),
        Err(web_transport_proto::ConnectError::WrongStatus(Some(s))) => Ok((s.as_u16(), None)),
        Err(_) => Err(err(code::H3_MESSAGE_ERROR, "malformed CONNECT response")),
    }
}

/// Our control stream's first bytes: its type and SETTINGS enabling
/// WebTransport (one session) and datagrams, as moq-dev's stacks send them.
pub fn settings() -> Vec<u8> {
    let mut s = Settings::default();
    s.enable_webtransport(1);
    let mut out = Vec::with_capacity(64);
    s.encode(&mut out);
    out
}

/// The HEADERS frame of a CONNECT request for `https://{authority}{target}`
/// offering `protocols`; `None` if that is not a URL.
pub fn request(authority: &str, target: &str, protocols: &[&str]) -> Option<Vec<u8>> {
    let url = url::Url::parse(&std::format!("https://{authority}{target}")).ok()?;
    let mut req = ConnectRequest::new(url);
    for p in protocols {
        req = req.with_protocol(*p);
    }
    let mut out = Vec::with_capacity(128);
    req.encode(&mut out).ok()?;
    Some(out)
}

/// The HEADERS frame of a CONNECT response with `status`, choosing
/// `protocol` when given.
pub fn response(status: u16, protocol: Option<&str>) -> Vec<u8> {
    let status = web_transport_proto::http::StatusCode::from_u16(status)
        .unwrap_or(web_transport_proto::http::StatusCode::BAD_REQUEST);
    let mut r = ConnectResponse::new(status);
    if let Some(p) = protocol {
        r = r.with_protocol(p);
    }
    let mut out = Vec::with_capacity(64);
    // A short token always encodes.
    let _ = r.encode(&mut out);
    out
}

/// A DATA frame holding the CLOSE_WEBTRANSPORT_SESSION capsule with `code`
/// and `reason` (cut to 1024 bytes at a character boundary).
pub fn close_capsule(code: u32, reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(1024);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let capsule = Capsule::CloseWebTransportSession {
        code,
        reason: String::from(&reason[..cut]),
    };
    let mut body = Vec::with_capacity(cut + 8);
    capsule.encode(&mut body);
    let mut out = Vec::with_capacity(body.len() + 4);
    put_varint(&mut out, FRAME_DATA);
    put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(&body);
    out
}

/// The WebTransport stream header we write on a stream we open: the uni
/// type 0x54 or the bidi marker 0x41, then the session ID.
pub fn stream_header(bidi: bool, session: u64, out: &mut [u8; 16]) -> usize {
    use skiff_core::wire::varint;
    let kind = if bidi {
        BIDI_WEBTRANSPORT
    } else {
        STREAM_WEBTRANSPORT
    };
    // Two varints of at most 8 bytes each always fit the 16; a session ID
    // past 2^62 is clamped, as put_varint does.
    let a = varint::encode(kind, out).unwrap_or(0);
    let b = varint::encode(session.min(varint::MAX), &mut out[a..]).unwrap_or(0);
    a + b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_exactly() {
        let mut h = StreamHeader::default();
        assert_eq!(h.need(false), 1);
        h.push(&[0x40]);
        assert_eq!(h.need(false), 1);
        h.push(&[0x54]);
        assert_eq!(h.need(false), 1);
        h.push(&[0x00]);
        assert_eq!(h.need(false), 0);
        assert_eq!(h.kind(false), Some(Kind::WebTransport(0)));
        let mut h = StreamHeader::default();
        h.push(&[0x00]);
        assert_eq!(h.kind(false), Some(Kind::Other(0)));
        let mut h = StreamHeader::default();
        h.push(&[0x40]);
        h.push(&[0x41]);
        h.push(&[0x44]);
        assert_eq!(h.need(true), 1);
        h.push(&[0x00]);
        assert_eq!(h.kind(true), Some(Kind::WebTransport(0x400)));
    }

    #[test]
    fn a_request_round_trips_and_the_close_capsule_is_read() {
        let wire = request("localhost:4443", "/room?jwt=abc", &["moq-lite-05"]).unwrap();
        let mut c = ConnectStream::default();
        for b in &wire {
            c.feed(&[*b]).unwrap();
        }
        let req = decode_request(c.headers().unwrap()).unwrap();
        assert_eq!(req.target, "/room?jwt=abc");
        assert_eq!(req.protocols, ["moq-lite-05"]);
        c.feed(&close_capsule(7, "bye")).unwrap();
        assert_eq!(c.close(), Some(&(7, String::from("bye"))));
        let ok = response(200, Some("moq-lite-05"));
        assert_eq!(
            decode_response(&ok).unwrap(),
            (200, Some(String::from("moq-lite-05")))
        );
        assert_eq!(decode_response(&response(403, None)).unwrap(), (403, None));
    }

    #[test]
    fn control_streams_need_settings_first_and_are_bounded() {
        let s = settings();
        let mut c = ControlStream::default();
        c.feed(&s[1..]).unwrap();
        assert_eq!(c.settings(), Some(true));
        // A GOAWAY, then a reserved frame type.
        c.feed(&[0x07, 0x01, 0x00, 0x21, 0x00]).unwrap();
        assert!(c.goaway());
        assert_eq!(c.feed(&s[1..]).unwrap_err().code, code::H3_FRAME_UNEXPECTED);
        let mut c = ControlStream::default();
        assert_eq!(
            c.feed(&[0x07, 0x01, 0x00]).unwrap_err().code,
            code::H3_MISSING_SETTINGS
        );
        let mut c = ControlStream::default();
        c.feed(&s[1..]).unwrap();
        let grease = [0x21u8, 0x00];
        let mut fed = Ok(());
        for _ in 0..CONTROL_MAX {
            fed = c.feed(&grease);
            if fed.is_err() {
                break;
            }
        }
        assert_eq!(fed.unwrap_err().code, code::H3_EXCESSIVE_LOAD);
    }

    /// Pseudo-random inputs, and mutations of valid ones, through every
    /// reader (the fuzz target's checks, deterministically): no panic, the
    /// bounds hold.
    #[test]
    fn arbitrary_input_never_panics() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let valid = [
            settings()[1..].to_vec(),
            request("localhost:1", "/a?jwt=b", &["moq-lite-05"]).unwrap(),
            response(200, Some("moq-lite-05")),
            close_capsule(3, "x"),
        ];
        for round in 0..4000 {
            let mut data = valid[round % valid.len()].clone();
            if round % 3 == 0 {
                data = (0..next() % 64).map(|_| next() as u8).collect();
            } else {
                for _ in 0..1 + next() % 4 {
                    if !data.is_empty() {
                        let at = (next() as usize) % data.len();
                        data[at] = next() as u8;
                    }
                }
            }
            let chunk = 1 + (next() as usize) % 7;
            let mut control = ControlStream::default();
            let mut connect = ConnectStream::default();
            for part in data.chunks(chunk) {
                let _ = control.feed(part);
                if connect.feed(part).is_err() {
                    break;
                }
            }
            if let Some(h) = connect.headers() {
                if let Ok(r) = decode_request(h) {
                    assert!(r.target.starts_with('/'));
                }
                let _ = decode_response(h);
            }
            for bidi in [false, true] {
                let mut h = StreamHeader::default();
                let mut at = 0;
                while h.need(bidi) > 0 && at < data.len() {
                    let n = h.need(bidi).min(data.len() - at);
                    h.push(&data[at..at + n]);
                    at += n;
                }
                assert!(at <= 16);
                assert_eq!(h.need(bidi) == 0, h.kind(bidi).is_some());
            }
        }
    }
}
