//! The HTTP/1.1 side of the WebSocket binding (docs/protocol.md §9.1–9.3).
//!
//! A server reads the request head into a bounded buffer and calls
//! [`parse_request`] after each read until it returns a [`Request`]; an
//! upgrade is answered with [`switching_protocols`] after [`choose`] picked a
//! subprotocol, anything else with [`response`] (always `Connection: close`).
//! A client sends [`client_request`] and checks the answer with
//! [`parse_response`].

use crate::SUBPROTOCOL;

/// Most bytes a request or response head may take (request line, headers, blank line).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Most header fields a head may carry.
pub const MAX_HEADERS: usize = 32;

/// Whether a connection's first bytes are an HTTP request rather than QMux
/// over TCP; `None` while fewer than three bytes are known.
///
/// A QMux/TCP stream starts with a record `Size` varint and then the
/// QX_TRANSPORT_PARAMETERS type, whose first byte is `0xff`: its first byte
/// is below `0x40` (then the second is `0xff`) or its third byte is `0xff`
/// (two-byte `Size`), or its first byte is `0x80` or more. An HTTP request
/// starts with a method token; every method is at least three ASCII
/// capitals. So three capitals are HTTP and anything else is not
/// (docs/protocol.md §9.1).
#[must_use]
pub fn is_http_start(first: &[u8]) -> Option<bool> {
    let capital = |b: &u8| b.is_ascii_uppercase();
    match first {
        [a, ..] if !capital(a) => Some(false),
        [_, b, ..] if !capital(b) => Some(false),
        [_, _, c, ..] => Some(capital(c)),
        _ => None,
    }
}

/// Why a request head is refused, and the status that says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The head does not end within [`MAX_HEAD_BYTES`] or has more than [`MAX_HEADERS`] fields (431).
    #[error("request head too large")]
    TooLarge,
    /// Not an HTTP/1.x request head (400).
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    /// A WebSocket upgrade that breaks RFC 6455 §4.2.1 (400).
    #[error("bad websocket upgrade: {0}")]
    BadUpgrade(&'static str),
    /// A WebSocket version other than 13 (426, with `Sec-WebSocket-Version: 13`).
    #[error("unsupported websocket version")]
    Version,
}

impl RequestError {
    /// The HTTP status to answer with.
    #[must_use]
    pub fn status(&self) -> u16 {
        match self {
            RequestError::TooLarge => 431,
            RequestError::Malformed(_) | RequestError::BadUpgrade(_) => 400,
            RequestError::Version => 426,
        }
    }
}

/// A WebSocket upgrade request's handshake fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// `Sec-WebSocket-Key`, as sent (24 base64 characters).
    pub key: String,
    /// The subprotocols offered (`Sec-WebSocket-Protocol`, every field, split at commas), in order.
    pub protocols: Vec<String>,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The method (`GET`, `HEAD`, ...).
    pub method: String,
    /// The request target in origin form: path and `?query` (`/anon?jwt=...`).
    pub target: String,
    /// The upgrade's fields, if this asks for a WebSocket.
    pub upgrade: Option<Upgrade>,
    /// Bytes the head took (what follows belongs to the connection).
    pub head_len: usize,
}

impl Request {
    /// The target's path, without the query.
    #[must_use]
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// Whether a comma-separated header value lists `token` (ASCII case-insensitive).
fn lists(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Parses the request head at the front of `buf`: `Ok(None)` while it is
/// incomplete (read more, up to [`MAX_HEAD_BYTES`]).
///
/// # Errors
/// [`RequestError`] for a head that is too large, malformed, or a broken
/// upgrade; answer with its [`status`](RequestError::status) and close.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(RequestError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooLarge),
        Err(_) => return Err(RequestError::Malformed("not an HTTP/1.x request head")),
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(RequestError::TooLarge);
    }
    let method = req.method.unwrap_or("").to_owned();
    let target = req.path.unwrap_or("");
    if !target.starts_with('/') {
        return Err(RequestError::Malformed("the request target must be a path"));
    }
    let target = target.to_owned();
    let header = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
    };
    let wants_ws = header("upgrade").any(|h| lists(h.value, "websocket"));
    if !wants_ws {
        return Ok(Some(Request {
            method,
            target,
            upgrade: None,
            head_len,
        }));
    }
    // RFC 6455 §4.2.1: what a server must check before it switches.
    if method != "GET" {
        return Err(RequestError::BadUpgrade("an upgrade must be a GET"));
    }
    if req.version != Some(1) {
        return Err(RequestError::BadUpgrade("an upgrade needs HTTP/1.1"));
    }
    if !header("connection").any(|h| lists(h.value, "upgrade")) {
        return Err(RequestError::BadUpgrade("Connection does not list upgrade"));
    }
    if !header("sec-websocket-version").any(|h| h.value.trim_ascii() == b"13") {
        return Err(RequestError::Version);
    }
    let mut keys = header("sec-websocket-key");
    let key = match (keys.next(), keys.next()) {
        (Some(k), None) => k.value.trim_ascii(),
        _ => {
            return Err(RequestError::BadUpgrade(
                "exactly one Sec-WebSocket-Key is needed",
            ));
        }
    };
    // 16 random bytes in base64: 22 characters and "==".
    let base64 = |b: &u8| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/';
    if key.len() != 24 || !key[..22].iter().all(base64) || &key[22..] != b"==" {
        return Err(RequestError::BadUpgrade(
            "Sec-WebSocket-Key is not 16 bytes of base64",
        ));
    }
    let key = String::from_utf8_lossy(key).into_owned();
    let mut protocols = Vec::new();
    for h in header("sec-websocket-protocol") {
        let value = core::str::from_utf8(h.value)
            .map_err(|_| RequestError::BadUpgrade("Sec-WebSocket-Protocol is not text"))?;
        protocols.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
        );
    }
    Ok(Some(Request {
        method,
        target,
        upgrade: Some(Upgrade { key, protocols }),
        head_len,
    }))
}

/// What to do with an upgrade's subprotocol offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Switch and answer with this subprotocol (QMux 01, the protocol fixed by the name).
    Speak(&'static str),
    /// Nothing offered: switch without a subprotocol; QMux 01 records, the
    /// application protocol negotiated in the transport parameters as on TCP.
    NoneOffered,
    /// Offers were made and none is ours: answer 400.
    NoMatch,
}

/// Chooses by our own preference among the offered subprotocols
/// (docs/protocol.md §9.2): `qmux-01.moq-lite-05` is the only one skiff
/// speaks (qmux-00 has no records, qmux-02 adds rules we do not enforce, a
/// bare `qmux-01` leaves the moq-lite version to an older SETUP exchange).
#[must_use]
pub fn choose(offered: &[String]) -> Choice {
    const OURS: [&str; 1] = [SUBPROTOCOL];
    if offered.is_empty() {
        return Choice::NoneOffered;
    }
    OURS.into_iter()
        .find(|ours| offered.iter().any(|o| o == ours))
        .map_or(Choice::NoMatch, Choice::Speak)
}

/// The `Sec-WebSocket-Accept` value for a client's key (RFC 6455 §4.2.2).
#[must_use]
pub fn accept_key(key: &str) -> String {
    tungstenite::handshake::derive_accept_key(key.as_bytes())
}

/// The 101 answer that switches to WebSocket, with `protocol` if one was chosen.
#[must_use]
pub fn switching_protocols(key: &str, protocol: Option<&str>) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n",
        accept_key(key)
    );
    if let Some(p) = protocol {
        head.push_str("Sec-WebSocket-Protocol: ");
        head.push_str(p);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// The reason phrase of the statuses skiff sends.
#[must_use]
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Unknown",
    }
}

/// A complete non-upgrade answer with `Connection: close`: the head and, unless
/// `head_only` (a HEAD request), `body`. `extra` adds header fields.
#[must_use]
pub fn response(
    status: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\nCache-Control: no-cache\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in extra {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A fresh `Sec-WebSocket-Key`: 16 random bytes in base64.
#[must_use]
pub fn client_key() -> String {
    let nonce: [u8; 16] = rand::random();
    data_encoding::BASE64.encode(&nonce)
}

/// The upgrade request a client sends for `target` (path and query) on `host`
/// (`host:port`), offering `protocol`.
#[must_use]
pub fn client_request(host: &str, target: &str, key: &str, protocol: &str) -> Vec<u8> {
    format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
    )
    .into_bytes()
}

/// Why a server's answer to an upgrade is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The head does not end within [`MAX_HEAD_BYTES`].
    #[error("response head too large")]
    TooLarge,
    /// Not an HTTP/1.x response head.
    #[error("malformed response")]
    Malformed,
    /// The server answered with another status than 101.
    #[error("upgrade refused with status {0}")]
    Status(u16),
    /// A 101 whose Upgrade, Connection or Sec-WebSocket-Accept is wrong.
    #[error("bad upgrade answer: {0}")]
    BadUpgrade(&'static str),
    /// The server chose a subprotocol we did not offer.
    #[error("the server chose a subprotocol that was not offered")]
    Protocol,
}

/// Checks the server's answer at the front of `buf` to a request made with
/// `key` offering `offered`: `Ok(None)` while incomplete; else the head's
/// length and the subprotocol chosen (`None`: none).
///
/// # Errors
/// [`ResponseError`] for anything but a valid 101.
pub fn parse_response(
    buf: &[u8],
    key: &str,
    offered: &str,
) -> Result<Option<(usize, Option<String>)>, ResponseError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(httparse::Status::Complete(_)) => return Err(ResponseError::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(ResponseError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooLarge),
        Err(_) => return Err(ResponseError::Malformed),
    };
    let status = res.code.unwrap_or(0);
    if status != 101 {
        return Err(ResponseError::Status(status));
    }
    let header = |name: &'static str| {
        res.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
    };
    if !header("upgrade").any(|h| lists(h.value, "websocket")) {
        return Err(ResponseError::BadUpgrade("Upgrade is not websocket"));
    }
    if !header("connection").any(|h| lists(h.value, "upgrade")) {
        return Err(ResponseError::BadUpgrade(
            "Connection does not list upgrade",
        ));
    }
    let accept = accept_key(key);
    if !header("sec-websocket-accept").any(|h| h.value.trim_ascii() == accept.as_bytes()) {
        return Err(ResponseError::BadUpgrade("wrong Sec-WebSocket-Accept"));
    }
    let chosen = match header("sec-websocket-protocol").next() {
        None => None,
        Some(h) => {
            let p = core::str::from_utf8(h.value)
                .map_err(|_| ResponseError::Protocol)?
                .trim();
            if !offered.split(',').any(|o| o.trim() == p) {
                return Err(ResponseError::Protocol);
            }
            Some(p.to_owned())
        }
    };
    Ok(Some((head_len, chosen)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    fn upgrade(protocols: &str) -> Vec<u8> {
        format!(
            "GET /anon?jwt=x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\nSec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{protocols}\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn first_bytes_tell_http_from_qmux() {
        assert_eq!(is_http_start(b"GE"), None);
        assert_eq!(is_http_start(b"GET /"), Some(true));
        assert_eq!(is_http_start(b"OPTIONS"), Some(true));
        // QMux/TCP: one-byte size then 0xff; two-byte size with a capital first byte then 0xff.
        assert_eq!(is_http_start(&[0x3f, 0xff, 0x51]), Some(false));
        assert_eq!(is_http_start(&[0x41, 0x02, 0xff]), Some(false));
        assert_eq!(is_http_start(&[0x40, 0x56]), Some(false));
        assert_eq!(is_http_start(b"get"), Some(false));
    }

    #[test]
    fn upgrade_is_parsed_and_answered() {
        let mut head = upgrade(
            "Sec-WebSocket-Protocol: qmux-02.moq-lite-05, qmux-01.moq-lite-05\r\nSec-WebSocket-Protocol: qmux-01\r\n",
        );
        head.extend_from_slice(b"\x82\x80");
        let req = parse_request(&head).unwrap().unwrap();
        assert_eq!(req.path(), "/anon");
        assert_eq!(req.target, "/anon?jwt=x");
        assert_eq!(req.head_len, head.len() - 2);
        let up = req.upgrade.unwrap();
        assert_eq!(
            up.protocols,
            ["qmux-02.moq-lite-05", "qmux-01.moq-lite-05", "qmux-01"]
        );
        assert_eq!(choose(&up.protocols), Choice::Speak("qmux-01.moq-lite-05"));
        // RFC 6455 §1.3's example key.
        assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let answer = switching_protocols(KEY, Some(SUBPROTOCOL));
        let (n, p) = parse_response(&answer, KEY, SUBPROTOCOL).unwrap().unwrap();
        assert_eq!((n, p.as_deref()), (answer.len(), Some(SUBPROTOCOL)));
    }

    #[test]
    fn offers_decide() {
        assert_eq!(choose(&[]), Choice::NoneOffered);
        let only_bare = ["qmux-01".to_owned(), "webtransport".to_owned()];
        assert_eq!(choose(&only_bare), Choice::NoMatch);
    }

    #[test]
    fn bad_heads_are_refused() {
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHost"), Ok(None));
        assert_eq!(
            parse_request(&[b'A'; MAX_HEAD_BYTES]).unwrap_err().status(),
            431
        );
        assert_eq!(
            parse_request(b"GET\x00 / HTTP/1.1\r\n\r\n")
                .unwrap_err()
                .status(),
            400
        );
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(
            parse_request(long.as_bytes()).unwrap_err(),
            RequestError::TooLarge
        );
        assert!(matches!(
            parse_request(b"GET http://x/ HTTP/1.1\r\n\r\n"),
            Err(RequestError::Malformed(_))
        ));
        let v12 = String::from_utf8(upgrade(""))
            .unwrap()
            .replace("Version: 13", "Version: 12");
        assert_eq!(parse_request(v12.as_bytes()), Err(RequestError::Version));
        let nokey = String::from_utf8(upgrade(""))
            .unwrap()
            .replace(KEY, "short");
        assert!(matches!(
            parse_request(nokey.as_bytes()),
            Err(RequestError::BadUpgrade(_))
        ));
        let plain = parse_request(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(plain.upgrade.is_none());
    }

    #[test]
    fn bad_answers_are_refused() {
        let answer = switching_protocols(KEY, Some("qmux-00.moq-lite-05"));
        assert_eq!(
            parse_response(&answer, KEY, SUBPROTOCOL),
            Err(ResponseError::Protocol)
        );
        let answer = switching_protocols("x3JJHMbDL1EzLkh9GBhXDw==", None);
        assert!(matches!(
            parse_response(&answer, KEY, SUBPROTOCOL),
            Err(ResponseError::BadUpgrade(_))
        ));
        let refused = response(400, "text/plain", b"no", false, &[]);
        assert_eq!(
            parse_response(&refused, KEY, SUBPROTOCOL),
            Err(ResponseError::Status(400))
        );
        assert!(client_key().len() == 24);
    }
}
