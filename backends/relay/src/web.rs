//! HTTP on the relay's listen port: the WebSocket upgrade and the plain
//! endpoints a browser player needs (docs/protocol.md §9).
//!
//! A connection whose first three bytes are ASCII capitals is an HTTP
//! request ([`skiff_ws::http::is_http_start`]); `serve_http` reads its head
//! (at most [`MAX_HEAD_BYTES`], within the handshake timeout) and either
//! switches to WebSocket, for the session to run over, or answers and closes:
//!
//! * `GET /certificate.sha256`: the SHA-256 of the served leaf certificate
//!   as 64 lowercase hex digits, no newline, readable cross-origin (what a
//!   browser pins as `serverCertificateHashes` for a `--tls-generate`
//!   certificate; moq-relay answers the same); 404 without TLS (nothing to
//!   pin; the player asks first and then dials WebSocket);
//! * `GET /health`: 200 `ok`;
//! * `GET /announced[/PREFIX]`: a JSON array of the announced broadcast paths;
//!   with `?peers`, an array of objects naming where each comes from
//!   ([`AnnouncedSource`]: the cluster peer and the session serving it);
//! * `GET /` and `GET /FILE`: the web directory's `index.html` and files
//!   (read per request, at most [`MAX_FILE_BYTES`]; no path leaves the
//!   directory); without `index.html`, `/` is a small page listing the
//!   broadcasts that says how to build the player.
//!
//! Every answer but the upgrade says `Connection: close`.

use std::io;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use skiff_ws::http::{self, Choice, MAX_HEAD_BYTES, RequestError};

use skiff_core::model::origin;
use skiff_monoio::session_driver::{ByteRead, ByteWrite};
use skiff_monoio::tls::{Fingerprint, TlsReader};

use crate::conn::Reader;
use crate::conn_name::ConnName;

/// A connection's receiving half while its first bytes are looked at: the
/// bytes received and not handed out yet, and more of them (the plain
/// [`Reader`], or the TLS reader over it for `wss://`).
pub(crate) trait HeadRead: ByteRead {
    /// The bytes received and not returned by a read yet.
    fn pending(&self) -> &[u8];
    /// Reads more, keeping it after the pending bytes (at most `max`
    /// pending in all), within `limit`: false if the peer closed, the time
    /// passed or the server drains.
    fn read_more(
        &mut self,
        max: usize,
        limit: Duration,
    ) -> impl std::future::Future<Output = io::Result<bool>>;
    /// Drops the first `head_len` pending bytes (the HTTP head) and returns
    /// those after them that a WebSocket reader must decode before it reads
    /// from this half (empty when this half still hands them out).
    fn take_after_head(&mut self, head_len: usize) -> Vec<u8>;
}

impl HeadRead for Reader {
    fn pending(&self) -> &[u8] {
        Reader::pending(self)
    }
    async fn read_more(&mut self, max: usize, limit: Duration) -> io::Result<bool> {
        Reader::read_more(self, max, limit).await
    }
    fn take_after_head(&mut self, head_len: usize) -> Vec<u8> {
        self.take_pending(head_len)
    }
}

impl HeadRead for TlsReader<Reader> {
    fn pending(&self) -> &[u8] {
        TlsReader::pending(self)
    }
    async fn read_more(&mut self, max: usize, limit: Duration) -> io::Result<bool> {
        if TlsReader::pending(self).len() >= max {
            return Ok(true);
        }
        TlsReader::read_more(self, limit).await
    }
    fn take_after_head(&mut self, head_len: usize) -> Vec<u8> {
        self.consume(head_len);
        Vec::new()
    }
}

/// Largest file served from the web directory.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// What [`serve_http`] did with the connection.
#[derive(Debug)]
pub(crate) enum Routed {
    /// Switched to WebSocket: run the session over it.
    Upgrade {
        /// The request target (path and query): the session's path.
        target: String,
        /// The application protocol the chosen subprotocol names (`None`:
        /// negotiated in the transport parameters).
        protocol: Option<&'static str>,
        /// Bytes that followed the head (the first WebSocket frames).
        early: Vec<u8>,
    },
    /// Answered; the connection is closed.
    Done,
}

/// The content type of a file, by extension.
fn content_type(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "map" | "json" => "application/json",
        "wasm" => "application/wasm",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// The file under `dir` that `path` (a request path) names, if it stays
/// inside `dir`: plain segments only (no `..`, no `.`-prefixed names, no
/// percent escapes or backslashes), and after symlinks still under `dir`.
fn file_under(dir: &Path, path: &str) -> Option<std::path::PathBuf> {
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "index.html" } else { rel };
    if rel.contains(['%', '\\', '\0']) || rel.split('/').any(|s| s.is_empty() || s.starts_with('.'))
    {
        return None;
    }
    let rel = Path::new(rel);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    let root = dir.canonicalize().ok()?;
    let full = root.join(rel).canonicalize().ok()?;
    full.starts_with(&root).then_some(full)
}

/// Reads a file of at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    std::fs::read(path).ok()
}

/// Where one announced broadcast comes from (`GET /announced?peers`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AnnouncedSource {
    /// The broadcast's path.
    pub path: String,
    /// The cluster peer whose session serves it (its URL without query);
    /// `None`: a client, a worker link, or the upstream.
    pub peer: Option<&'static str>,
    /// The session serving it, as log lines name it (`tcp 192.0.2.7:50312
    /// w0#7`, `link w0→w1`, `peer tcp://b:4443/ w0 dial 0`); `None` while
    /// none does (a broadcast waiting out its failover grace).
    pub via: Option<String>,
}

/// Whether `path` is `prefix` or below it (whole segments; `""`: all).
fn under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('/'))
}

/// The announced broadcast paths under `prefix` (whole segments; `""`: all).
fn announced(origin: origin::Ref<'static, 'static>, prefix: &str) -> Vec<String> {
    let prefix = prefix.trim_matches('/');
    let mut paths: Vec<String> = origin
        .iter()
        .map(|b| b.path().as_str().to_owned())
        .filter(|p| under(p, prefix))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Escapes text for HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page `/` shows when the player is not built.
fn fallback_page(origin: origin::Ref<'static, 'static>) -> Vec<u8> {
    let items: String = announced(origin, "")
        .iter()
        .map(|p| format!("<li><code>{}</code></li>\n", escape(p)))
        .collect();
    let list = if items.is_empty() {
        "<p>No broadcast is announced.</p>".to_owned()
    } else {
        format!("<ul>\n{items}</ul>")
    };
    format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>skiff-relay</title></head><body>\n\
         <h1>skiff-relay</h1>\n<p>Announced broadcasts:</p>\n{list}\n\
         <p>The web player is not built: run <code>npm --prefix web ci &amp;&amp; npm --prefix web run build</code>, \
         or point <code>--web-dir</code> at a built player.</p>\n</body></html>\n"
    )
    .into_bytes()
}

/// Answers a plain (non-upgrade) request; `fingerprint` is the served
/// certificate's, if any.
fn answer(
    origin: origin::Ref<'static, 'static>,
    sources: &dyn Fn() -> Vec<AnnouncedSource>,
    web_dir: &Path,
    fingerprint: Option<Fingerprint>,
    req: &http::Request,
) -> Vec<u8> {
    let head_only = req.method == "HEAD";
    let text = "text/plain; charset=utf-8";
    if req.method != "GET" && !head_only {
        return http::response(
            405,
            text,
            b"method not allowed\n",
            false,
            &[("Allow", "GET, HEAD")],
        );
    }
    let path = req.path();
    match path {
        "/certificate.sha256" => match fingerprint {
            Some(f) => http::response(
                200,
                text,
                f.to_string().as_bytes(),
                head_only,
                &[("Access-Control-Allow-Origin", "*")],
            ),
            None => http::response(404, text, b"no certificate\n", head_only, &[]),
        },
        "/health" => http::response(200, text, b"ok\n", head_only, &[]),
        _ if path == "/announced" || path.starts_with("/announced/") => {
            let prefix = path.strip_prefix("/announced").unwrap_or("");
            let peers = req.target.split_once('?').is_some_and(|(_, q)| {
                q.split('&')
                    .any(|p| p == "peers" || p.starts_with("peers="))
            });
            let body = if peers {
                let prefix = prefix.trim_matches('/');
                let mut list: Vec<AnnouncedSource> = sources()
                    .into_iter()
                    .filter(|s| under(&s.path, prefix))
                    .collect();
                list.sort_by(|a, b| a.path.cmp(&b.path));
                serde_json::to_vec(&list).unwrap_or_default()
            } else {
                serde_json::to_vec(&announced(origin, prefix)).unwrap_or_default()
            };
            http::response(200, "application/json", &body, head_only, &[])
        }
        _ => match file_under(web_dir, path).and_then(|f| Some((read_bounded(&f)?, f))) {
            Some((body, file)) => http::response(200, content_type(&file), &body, head_only, &[]),
            None if path == "/" => http::response(
                200,
                "text/html; charset=utf-8",
                &fallback_page(origin),
                head_only,
                &[],
            ),
            None => http::response(404, text, b"not found\n", head_only, &[]),
        },
    }
}

/// Recording reads (`GET /recordings`, `GET /hls/…`) under way in this
/// process, each on a thread of its own.
static RECORDING_READS: AtomicUsize = AtomicUsize::new(0);

/// Recording reads at once; past it a request is answered 503 at once.
const MAX_RECORDING_READS: usize = 8;

/// Answers `GET /recordings` and `GET /hls/…` from the recordings in
/// `dir`; `None` for any other path. The index of an hour of recording is
/// thousands of lines and its segment files are checked one by one, so the
/// read runs on a thread of its own while this worker serves its other
/// connections.
async fn recording(dir: &Path, req: &http::Request) -> Option<Vec<u8>> {
    let path = req.path();
    if path != "/recordings" && !path.starts_with("/hls/") {
        return None;
    }
    let head_only = req.method == "HEAD";
    let cors = [("Access-Control-Allow-Origin", "*")];
    let busy = || {
        http::response(
            503,
            "text/plain; charset=utf-8",
            b"busy reading recordings, try again\n",
            head_only,
            &[("Retry-After", "1"), cors[0]],
        )
    };
    // Taken back when this request is done, or dropped with its connection.
    struct Slot;
    impl Drop for Slot {
        fn drop(&mut self) {
            RECORDING_READS.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let _slot = Slot;
    if RECORDING_READS.fetch_add(1, Ordering::AcqRel) >= MAX_RECORDING_READS {
        return Some(busy());
    }
    let (dir, path) = (dir.to_path_buf(), path.to_owned());
    let response =
        crate::offload::on_thread("skiff-http-rec", move || match path.strip_prefix("/hls/") {
            None => http::response(
                200,
                "application/json",
                &crate::record::store::recordings_json(&dir),
                head_only,
                &cors,
            ),
            Some(rest) => {
                let a = crate::record::hls::answer(&dir, rest);
                http::response(a.status, a.content_type, &a.body, head_only, &cors)
            }
        })
        .await;
    Some(response.unwrap_or_else(busy))
}

/// Sends `response` and closes the connection.
async fn reply<W: ByteWrite>(writer: &mut W, response: &[u8]) -> io::Result<Routed> {
    writer.buffer().extend_from_slice(response);
    writer.flush().await?;
    let _ = writer.close().await;
    Ok(Routed::Done)
}

/// Reads an HTTP request head whose first bytes are pending in `reader`
/// and serves it; see the module docs. The head must arrive within
/// `limit` (else 408). `fingerprint` is the served certificate's, if any.
///
/// # Errors
/// Socket errors.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve_http<R: HeadRead, W: ByteWrite>(
    origin: origin::Ref<'static, 'static>,
    sources: &dyn Fn() -> Vec<AnnouncedSource>,
    web_dir: &Path,
    record_dir: Option<&Path>,
    fingerprint: Option<Fingerprint>,
    reader: &mut R,
    writer: &mut W,
    conn: ConnName,
    limit: Duration,
) -> io::Result<Routed> {
    let deadline = Instant::now() + limit;
    let text = "text/plain; charset=utf-8";
    let req = loop {
        match http::parse_request(reader.pending()) {
            Ok(Some(req)) => break req,
            Ok(None) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !reader.read_more(MAX_HEAD_BYTES, left).await? {
                    tracing::debug!(conn = ?conn, "http: no complete request head in time");
                    let r = http::response(
                        408,
                        text,
                        b"request head not received in time\n",
                        false,
                        &[],
                    );
                    return reply(writer, &r).await;
                }
            }
            Err(e) => {
                tracing::debug!(conn = ?conn, error = %e, "http: request refused");
                let body = format!("{e}\n");
                let extra: &[(&str, &str)] = match e {
                    RequestError::Version => &[("Sec-WebSocket-Version", "13")],
                    _ => &[],
                };
                let r = http::response(e.status(), text, body.as_bytes(), false, extra);
                return reply(writer, &r).await;
            }
        }
    };
    let Some(upgrade) = &req.upgrade else {
        tracing::debug!(conn = ?conn, method = req.method, path = req.path(), "http request");
        let recorded = match record_dir {
            Some(dir) if req.method == "GET" || req.method == "HEAD" => recording(dir, &req).await,
            _ => None,
        };
        let r = recorded.unwrap_or_else(|| answer(origin, sources, web_dir, fingerprint, &req));
        return reply(writer, &r).await;
    };
    let (protocol, application) = match http::choose(&upgrade.protocols) {
        Choice::Speak(p) => (Some(p), Some(skiff_ws::APPLICATION)),
        Choice::NoneOffered => (None, None),
        Choice::NoMatch => {
            tracing::debug!(conn = ?conn, offered = ?upgrade.protocols, "websocket: no subprotocol we speak");
            let body = format!(
                "no supported subprotocol: offer {}\n",
                skiff_ws::SUBPROTOCOL
            );
            let r = http::response(400, text, body.as_bytes(), false, &[]);
            return reply(writer, &r).await;
        }
    };
    writer
        .buffer()
        .extend_from_slice(&http::switching_protocols(&upgrade.key, protocol));
    writer.flush().await?;
    // The target's query may hold a token (`jwt=`): only its path is logged.
    tracing::debug!(conn = ?conn.upgraded(), path = req.path(), ?protocol, "websocket: upgraded");
    Ok(Routed::Upgrade {
        target: req.target.clone(),
        protocol: application,
        early: reader.take_after_head(req.head_len),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_directory() {
        let dir = std::env::temp_dir().join(format!("skiff-web-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("assets")).unwrap();
        std::fs::write(dir.join("index.html"), "<p>hi</p>").unwrap();
        std::fs::write(dir.join("assets/app.js"), "x").unwrap();
        assert_eq!(
            file_under(&dir, "/"),
            Some(dir.canonicalize().unwrap().join("index.html"))
        );
        assert!(file_under(&dir, "/assets/app.js").is_some());
        for bad in [
            "/../etc/passwd",
            "/assets/../index.html",
            "/%2e%2e/x",
            "/.git",
            "//etc",
            "/a\\b",
        ] {
            assert_eq!(file_under(&dir, bad), None, "{bad}");
        }
        assert_eq!(
            content_type(Path::new("a.mjs")),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("a.wasm")), "application/wasm");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
