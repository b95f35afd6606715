//! TLS on monoio (docs/protocol.md §9.8): a [`ByteRead`] and a [`ByteWrite`]
//! that run a rustls connection over a plain byte stream's halves, so
//! [`drive`] runs a session over TLS exactly as over TCP, and WebSocket
//! ([`crate::ws`]) can sit on top of it for `wss://`.
//!
//! rustls is driven sans-IO: the reader hands each chunk the socket
//! delivered to `read_tls` and `process_new_packets` and copies the
//! decrypted bytes into a plaintext buffer of its own; the writer copies what
//! the session staged (staged bytes and gathered pool ranges, in wire order)
//! into rustls at each flush and moves the records rustls sealed into the
//! inner writer's staging, sent in one write. The reads and writes stay the
//! inner halves' (io_uring, owned buffers, the write-stall limit).
//!
//! * Buffers: the plaintext buffer (`PLAIN_BUFFER_BYTES`) and the
//!   session's staging buffer are made once per connection, when the first
//!   application bytes come or go (a handshake that stalls holds neither);
//!   the inner writer's staging grows to one flush's ciphertext once and is
//!   reused. rustls itself allocates each
//!   sealed record's buffer (one per TLS record of up to 16 KiB, not per
//!   frame) and frees it when the record is copied out.
//! * The two halves share the rustls connection (one thread, never borrowed
//!   across an await). When the reader leaves bytes for the peer (an alert,
//!   a key update, session tickets) it wakes the writer, whose
//!   [`ByteWrite::poll_transport`] then asks [`drive`] for a flush.
//!
//! [`drive`]: crate::session_driver::drive

use std::cell::RefCell;
use std::io::{self, Read as _, Write as _};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};

/// The rustls crate these types come from (root stores, errors), for
/// callers that do not depend on it themselves.
pub use rustls;

use crate::session_driver::{ByteRead, ByteWrite, Guard, HandshakeToken, READ_BUFFER_BYTES};
use crate::staging::Staging;

/// The TLS ALPN name of QMux qmux-01 carrying moq-lite-05, as qmux names its
/// TLS and WebSocket pairs (docs/protocol.md §9.2, §9.8).
pub const ALPN_QMUX: &[u8] = b"qmux-01.moq-lite-05";

/// The TLS ALPN name of HTTP/1.1, which browsers offer for `wss://`.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Capacity of a TLS reader's plaintext buffer: one read buffer plus room for
/// a record that was cut by the previous read, so one socket read's
/// plaintext always fits once the buffer was emptied.
pub(crate) const PLAIN_BUFFER_BYTES: usize = READ_BUFFER_BYTES + 2 * 17 * 1024;

/// The crypto provider every configuration here is built with (aws-lc-rs),
/// named explicitly so no process-wide default is needed; a QUIC endpoint
/// builds its TLS 1.3 configurations and initial keys with the same one.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// What the two halves of one TLS connection share.
struct Shared {
    conn: RefCell<Connection>,
    /// The writer's task, woken when the reader left bytes for the peer.
    waker: RefCell<Option<Waker>>,
}

impl Shared {
    fn wake_if_output(&self) {
        if self.conn.borrow().wants_write()
            && let Some(w) = self.waker.borrow_mut().take()
        {
            w.wake();
        }
    }
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// The receiving half: TLS records in, plaintext out.
pub struct TlsReader<R> {
    inner: R,
    shared: Rc<Shared>,
    /// Decrypted bytes at `start..end` (the whole length is initialized;
    /// empty until the first application data).
    plain: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes the last read returned (dropped at the next).
    given: usize,
    /// The peer closed (EOF or close_notify).
    ended: bool,
}

impl<R> std::fmt::Debug for TlsReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsReader")
            .field("buffered", &(self.end - self.start))
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// The TLS error inside `e`, if the error is one (a failed handshake, a
/// certificate the peer or we refused, a corrupt record).
pub(crate) fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

fn from_tls(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl<R: ByteRead> TlsReader<R> {
    /// Reads one chunk from the socket and decrypts what it completes into
    /// the plaintext buffer; false at end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let data = self.inner.read().await?;
        if data.is_empty() {
            return Ok(false);
        }
        let mut rest = data;
        let mut conn = self.shared.conn.borrow_mut();
        let mut open = true;
        while !rest.is_empty() && open {
            let taken = conn.read_tls(&mut rest)?;
            let state = match conn.process_new_packets() {
                Ok(state) => state,
                Err(e) => {
                    // rustls queued an alert for the peer: the writer sends it.
                    drop(conn);
                    self.shared.wake_if_output();
                    return Err(from_tls(e));
                }
            };
            let want = state.plaintext_bytes_to_read();
            if want > 0 {
                drain(&mut conn, &mut self.plain, &mut self.end, want)?;
            }
            open = !state.peer_has_closed() && taken > 0;
        }
        drop(conn);
        self.shared.wake_if_output();
        if !open {
            // close_notify: what it followed is still handed out.
            self.ended = true;
        }
        Ok(open || self.start < self.end)
    }

    /// The decrypted bytes received and not returned by a read yet.
    pub fn pending(&self) -> &[u8] {
        self.plain.get(self.start..self.end).unwrap_or(&[])
    }

    /// Reads more from the peer, keeping what it decrypts after the pending
    /// bytes, giving up after `limit`: true once more bytes (or none, but
    /// the stream is still open) arrived; false if the peer closed or the
    /// time passed. For the HTTP head of `wss://`, read before any session
    /// state exists.
    ///
    /// # Errors
    /// Socket and TLS errors.
    pub async fn read_more(&mut self, limit: Duration) -> io::Result<bool> {
        if self.ended {
            return Ok(false);
        }
        let before = self.end - self.start;
        match crate::cancel::race(self.fill(), monoio::time::sleep(limit)).await {
            Ok(Ok(true)) => Ok(true),
            Ok(Ok(false)) => {
                self.ended = true;
                Ok(self.end - self.start > before)
            }
            Ok(Err(e)) => Err(e),
            Err(()) => Ok(false),
        }
    }

    /// Drops the first `n` pending bytes (an HTTP head already parsed).
    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// The ALPN name the handshake agreed on, if any.
    pub fn alpn(&self) -> Option<Vec<u8>> {
        self.shared
            .conn
            .borrow()
            .alpn_protocol()
            .map(<[u8]>::to_vec)
    }

    /// True while the TLS handshake is still going on.
    fn is_handshaking(&self) -> bool {
        self.shared.conn.borrow().is_handshaking()
    }
}

/// Moves the `want` decrypted bytes rustls holds into `plain` after `end`.
/// The buffer is made at the first application data, not for the handshake
/// (a stalled handshake holds no plaintext buffer), and grows only when
/// more than one socket read is kept (an HTTP head being parsed).
fn drain(
    conn: &mut Connection,
    plain: &mut Vec<u8>,
    end: &mut usize,
    want: usize,
) -> io::Result<()> {
    if plain.len() < *end + want {
        let grown = (*end + want).max(PLAIN_BUFFER_BYTES);
        plain.resize(grown, 0);
    }
    let room = plain.get_mut(*end..*end + want).unwrap_or(&mut []);
    conn.reader().read_exact(room)?;
    *end += want;
    Ok(())
}

impl<R: ByteRead> ByteRead for TlsReader<R> {
    async fn read(&mut self) -> io::Result<&[u8]> {
        self.start += std::mem::take(&mut self.given);
        while self.start == self.end && !self.ended {
            if !self.fill().await? {
                self.ended = true;
            }
        }
        // At most one read buffer's worth, as the session driver's inbox expects.
        let n = (self.end - self.start).min(READ_BUFFER_BYTES);
        self.given = n;
        Ok(self.plain.get(self.start..self.start + n).unwrap_or(&[]))
    }

    fn guard(&self) -> Guard {
        self.inner.guard()
    }

    fn take_handshake(&mut self) -> Option<HandshakeToken> {
        self.inner.take_handshake()
    }

    fn set_prompt_acks(&mut self, on: bool) {
        self.inner.set_prompt_acks(on);
    }
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// The sending half: the session's bytes out as TLS records.
pub struct TlsWriter<W> {
    inner: W,
    shared: Rc<Shared>,
    /// What the session stages (plaintext); made at the session's first
    /// write, not for the handshake.
    staging: Option<Staging>,
    closed: bool,
}

impl<W> std::fmt::Debug for TlsWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsWriter")
            .field("staged", &self.staging.as_ref().map_or(0, Staging::len))
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

/// An `io::Write` that stages into a [`Staging`] (rustls writes its records here).
struct StagingSink<'s>(&'s mut Staging);

impl io::Write for StagingSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            self.0.extend_from_slice(b);
            n += b.len();
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: ByteWrite> TlsWriter<W> {
    /// Hands the staged plaintext to rustls and moves the records it sealed
    /// (and its own messages) into the inner writer's staging.
    fn seal(&mut self) -> io::Result<()> {
        let mut conn = self.shared.conn.borrow_mut();
        if let Some(staging) = self.staging.as_mut().filter(|s| !s.is_empty()) {
            let (bytes, ranges) = staging.parts();
            let mut w = conn.writer();
            let mut pos = 0;
            for (at, slice) in ranges {
                w.write_all(bytes.get(pos..*at).unwrap_or(&[]))?;
                w.write_all(slice.as_bytes())?;
                pos = *at;
            }
            w.write_all(bytes.get(pos..).unwrap_or(&[]))?;
            staging.clear();
        }
        let mut sink = StagingSink(self.inner.buffer());
        while conn.wants_write() {
            conn.write_tls(&mut sink)?;
        }
        Ok(())
    }
}

impl<W: ByteWrite> ByteWrite for TlsWriter<W> {
    fn buffer(&mut self) -> &mut Staging {
        self.staging.get_or_insert_with(|| {
            Staging::new(Vec::with_capacity(
                crate::session_driver::WRITE_BUFFER_BYTES,
            ))
        })
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.seal()?;
        self.inner.flush().await
    }

    async fn close(&mut self) -> io::Result<()> {
        if !std::mem::replace(&mut self.closed, true) {
            self.shared.conn.borrow_mut().send_close_notify();
        }
        self.seal()?;
        self.inner.close().await
    }

    fn poll_transport(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut w = self.shared.waker.borrow_mut();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        let inner = self.inner.poll_transport(cx);
        if self.wants_flush() {
            return Poll::Ready(());
        }
        inner
    }

    fn wants_flush(&self) -> bool {
        self.shared.conn.borrow().wants_write() || self.inner.wants_flush()
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

/// Runs the TLS handshake of `conn` (a server or client connection) over
/// `reader` and `writer` and returns the TLS halves. Bytes of the session
/// that came with the handshake's last flight are kept for the first read.
/// A failed handshake sends rustls's alert before it returns. The caller
/// bounds the time (a peer may send nothing).
///
/// # Errors
/// Socket errors; `InvalidData` wrapping a [`rustls::Error`] (see
/// `tls_error`) when the handshake fails; `UnexpectedEof` if the peer
/// closed during it.
pub async fn handshake<R: ByteRead, W: ByteWrite>(
    conn: impl Into<Connection>,
    reader: R,
    writer: W,
) -> io::Result<(TlsReader<R>, TlsWriter<W>)> {
    let mut conn: Connection = conn.into();
    // The staging buffers bound what one flush hands rustls.
    conn.set_buffer_limit(None);
    let shared = Rc::new(Shared {
        conn: RefCell::new(conn),
        waker: RefCell::new(None),
    });
    let mut reader = TlsReader {
        inner: reader,
        shared: shared.clone(),
        plain: Vec::new(),
        start: 0,
        end: 0,
        given: 0,
        ended: false,
    };
    let mut writer = TlsWriter {
        inner: writer,
        shared,
        staging: None,
        closed: false,
    };
    loop {
        writer.seal()?;
        writer.inner.flush().await?;
        if !reader.is_handshaking() {
            return Ok((reader, writer));
        }
        match reader.fill().await {
            Ok(true) => {}
            Ok(false) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed during the TLS handshake",
                ));
            }
            Err(e) => {
                // The alert rustls queued tells the peer why.
                if writer.seal().is_ok() {
                    let _ = writer.inner.flush().await;
                }
                return Err(e);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Certificates and configurations
// ---------------------------------------------------------------------------

/// Why a certificate or key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    /// The file could not be read or parsed as PEM.
    #[error("cannot read {}: {reason}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The file holds no item of the kind wanted.
    #[error("{} holds no {what}", path.display())]
    Empty {
        /// The file.
        path: std::path::PathBuf,
        /// What was looked for ("certificate", "private key").
        what: &'static str,
    },
    /// rustls refused the certificate and key together (a key that does not
    /// match the certificate, an unsupported key type).
    #[error("certificate {} with key {}: {source}", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: std::path::PathBuf,
        /// The key file.
        key: std::path::PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

/// The certificates of the PEM file `path`, in file order.
///
/// # Errors
/// [`PemError::Read`] or [`PemError::Empty`].
pub(crate) fn certs_from_pem_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let read = |reason: String| PemError::Read {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read(path).map_err(|e| read(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read(e.to_string()))?;
    if certs.is_empty() {
        return Err(PemError::Empty {
            path: path.to_owned(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The (first) private key of the PEM file `path` (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// [`PemError::Read`] or [`PemError::Empty`].
pub(crate) fn key_from_pem_file(path: &Path) -> Result<PrivateKeyDer<'static>, PemError> {
    let text = std::fs::read(path).map_err(|e| PemError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => PemError::Empty {
            path: path.to_owned(),
            what: "private key",
        },
        e => PemError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })
}

/// A root store holding the certificates of the PEM file `path` (a CA to
/// trust instead of the system's roots).
///
/// # Errors
/// [`PemError`] if the file cannot be read or holds no usable certificate.
pub fn roots_from_pem_file(path: &Path) -> Result<RootCertStore, PemError> {
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs_from_pem_file(path)?);
    if added == 0 {
        return Err(PemError::Empty {
            path: path.to_owned(),
            what: "usable CA certificate",
        });
    }
    Ok(roots)
}

/// The operating system's trust store (empty if it cannot be read; the
/// reasons are logged).
pub fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system's CA certificates");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, ignored, "system CA certificates");
    roots
}

/// A server configuration with the certificate chain of `cert` and the key
/// of `key` (PEM files), offering `alpn` (best first).
///
/// # Errors
/// [`PemError`] naming the file that cannot be used.
pub fn server_config(cert: &Path, key: &Path, alpn: &[&[u8]]) -> Result<ServerConfig, PemError> {
    let chain = certs_from_pem_file(cert)?;
    let private = key_from_pem_file(key)?;
    let pair = |source| PemError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(pair)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(pair)?;
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(config)
}

/// A certificate chain (the server's certificate first) and its private
/// key, checked to match, as rustls serves them.
///
/// # Errors
/// The key cannot be loaded by the provider (aws-lc-rs) or does not match
/// the certificate.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::sign::CertifiedKey, rustls::Error> {
    rustls::sign::CertifiedKey::from_der(chain, key, &provider())
}

/// The certificate chain of the PEM file `cert` and the key of the PEM
/// file `key`, checked to match ([`certified_key`]).
///
/// # Errors
/// [`PemError`] naming the file that cannot be used.
pub fn certified_key_from_pem_files(
    cert: &Path,
    key: &Path,
) -> Result<rustls::sign::CertifiedKey, PemError> {
    let chain = certs_from_pem_file(cert)?;
    let private = key_from_pem_file(key)?;
    certified_key(chain, private).map_err(|source| PemError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    })
}

/// A server configuration whose certificate `resolver` picks per handshake
/// (so a certificate can change without a new configuration), offering
/// `alpn` (best first).
///
/// # Errors
/// rustls refuses the provider's protocol versions (does not happen with aws-lc-rs).
pub fn server_config_with_resolver(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    alpn: &[&[u8]],
) -> Result<ServerConfig, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(config)
}

/// A client configuration that verifies servers against `roots`, offering `alpn`.
///
/// # Errors
/// rustls refuses the provider's protocol versions (does not happen with aws-lc-rs).
pub fn client_config(
    roots: Arc<RootCertStore>,
    alpn: &[&[u8]],
) -> Result<ClientConfig, rustls::Error> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Ok(config)
}

/// A client connection to `host` (SNI and the name the certificate must
/// carry: a DNS name or an IP address, without port or brackets).
///
/// # Errors
/// `InvalidInput` for a host that is no valid server name.
pub fn client_connection(config: Arc<ClientConfig>, host: &str) -> io::Result<ClientConnection> {
    let name = ServerName::try_from(host.to_owned()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the host is not a valid TLS server name",
        )
    })?;
    ClientConnection::new(config, name).map_err(from_tls)
}

// ---------------------------------------------------------------------------
// Trust: system roots, a CA file, or a pinned certificate fingerprint
// ---------------------------------------------------------------------------

/// The SHA-256 of `der` (a certificate's DER bytes).
pub fn sha256(der: &[u8]) -> [u8; 32] {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, der);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// A certificate's SHA-256 fingerprint: the digest of its DER bytes, what
/// browsers pin as `serverCertificateHashes` and what a relay answers at
/// `GET /certificate.sha256` (as lowercase hex, its [`Display`](std::fmt::Display)).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of the certificate whose DER bytes are `der`.
    pub fn of(der: &[u8]) -> Self {
        Fingerprint(sha256(der))
    }
}

impl std::fmt::Display for Fingerprint {
    /// 64 lowercase hex digits, no separators.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Why a fingerprint text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// Not 64 characters (32 bytes as hex) once surrounding blanks are trimmed.
    #[error("a SHA-256 fingerprint is 64 hex digits, this has {0} characters")]
    Length(usize),
    /// A character that is no hex digit, at this index (from 0).
    #[error("character {0} of the fingerprint is no hex digit")]
    NotHex(usize),
}

impl std::str::FromStr for Fingerprint {
    type Err = FingerprintError;

    /// 64 hex digits (either case), surrounding blanks ignored.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let count = text.chars().count();
        if count != 64 {
            return Err(FingerprintError::Length(count));
        }
        let mut out = [0u8; 32];
        for (i, c) in text.chars().enumerate() {
            let d = c.to_digit(16).ok_or(FingerprintError::NotHex(i))? as u8;
            out[i / 2] |= if i % 2 == 0 { d << 4 } else { d };
        }
        Ok(Fingerprint(out))
    }
}

/// Which server certificates a client accepts.
#[derive(Debug, Clone, Default)]
pub enum Trust {
    /// Certificates that chain to the operating system's trust store and
    /// name the host ([`system_roots`]).
    #[default]
    System,
    /// Certificates that chain to these CAs ([`roots_from_pem_file`] reads
    /// a PEM file) and name the host.
    Roots(Arc<RootCertStore>),
    /// Exactly the leaf certificate with this SHA-256, whatever its issuer,
    /// names or dates ([`PinnedVerifier`]): a self-signed certificate such
    /// as a relay's `--tls-generate` one.
    Pinned(Fingerprint),
}

/// A rustls server certificate verifier that accepts exactly one leaf
/// certificate, named by its SHA-256 ([`Fingerprint`]), as browsers do with
/// `serverCertificateHashes`: the chain, the server name and the dates are
/// not looked at, the handshake signature is verified with the provider's
/// algorithms (so the server must hold the certificate's key).
#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Fingerprint,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl PinnedVerifier {
    /// A verifier accepting the leaf whose SHA-256 is `pin`.
    pub fn new(pin: Fingerprint) -> Self {
        PinnedVerifier {
            pin,
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

/// The error a [`PinnedVerifier`] refuses another certificate with.
#[derive(Debug, thiserror::Error)]
#[error("the server's certificate has SHA-256 {got}, not the pinned {pinned}")]
pub struct PinMismatch {
    /// The fingerprint of the certificate the server sent.
    pub got: Fingerprint,
    /// The fingerprint the client pinned.
    pub pinned: Fingerprint,
}

impl rustls::client::danger::ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let got = Fingerprint::of(end_entity.as_ref());
        if got == self.pin {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        let mismatch = PinMismatch {
            got,
            pinned: self.pin,
        };
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(mismatch))),
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration that accepts the servers `trust` names, offering
/// `alpn` (best first): what `tls://` and `wss://` dial with, and what a
/// QUIC client builds its crypto configuration from.
///
/// # Errors
/// rustls refuses the provider's protocol versions (does not happen with aws-lc-rs).
pub fn client_config_for(trust: &Trust, alpn: &[&[u8]]) -> Result<ClientConfig, rustls::Error> {
    let roots = match trust {
        Trust::System => Arc::new(system_roots()),
        Trust::Roots(roots) => roots.clone(),
        Trust::Pinned(pin) => {
            let mut config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(PinnedVerifier::new(*pin)))
                .with_no_client_auth();
            config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
            return Ok(config);
        }
    };
    client_config(roots, alpn)
}

/// The host part of `host:port` (`[v6]:port` loses its brackets), for SNI.
pub(crate) fn host_of(authority: &str) -> &str {
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split_once(']').map_or(v6, |(h, _)| h);
    }
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_without_port() {
        assert_eq!(host_of("example.com:443"), "example.com");
        assert_eq!(host_of("127.0.0.1:4443"), "127.0.0.1");
        assert_eq!(host_of("[::1]:4443"), "::1");
    }

    #[test]
    fn fingerprints_parse_and_print_as_lowercase_hex() {
        let hex = "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff";
        let f: Fingerprint = format!(" {hex}\n").parse().unwrap();
        assert_eq!(f.0[..4], [0x00, 0x11, 0x22, 0x33]);
        assert_eq!(f.0[31], 0xff);
        assert_eq!(f.to_string(), hex.to_ascii_lowercase());
        assert_eq!(
            "abc".parse::<Fingerprint>(),
            Err(FingerprintError::Length(3))
        );
        let bad = format!("{}g", &hex[..63]);
        assert_eq!(
            bad.parse::<Fingerprint>(),
            Err(FingerprintError::NotHex(63))
        );
        let multibyte = format!("{}é", &hex[..63]);
        assert_eq!(
            multibyte.parse::<Fingerprint>(),
            Err(FingerprintError::NotHex(63))
        );
        // SHA-256 of the empty input.
        assert_eq!(
            Fingerprint::of(b"").to_string(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// A self-signed certificate for `localhost` and its key.
    fn self_signed() -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        (cert.der().clone(), PrivateKeyDer::Pkcs8(der))
    }

    /// Serves exactly this chain and key, matching or not.
    #[derive(Debug)]
    struct Serve(Arc<rustls::sign::CertifiedKey>);

    impl rustls::server::ResolvesServerCert for Serve {
        fn resolve(
            &self,
            _hello: rustls::server::ClientHello<'_>,
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(self.0.clone())
        }
    }

    /// Runs a handshake in memory between `client` (dialing `host`) and a
    /// server presenting `cert` and signing with `key`; the client's
    /// error, if it failed.
    fn handshake_in_memory(
        client: ClientConfig,
        host: &str,
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), rustls::Error> {
        let signer = provider().key_provider.load_private_key(key).unwrap();
        let served = rustls::sign::CertifiedKey::new(vec![cert], signer);
        let server = server_config_with_resolver(Arc::new(Serve(Arc::new(served))), &[]).unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        let name = ServerName::try_from(host.to_owned()).unwrap();
        let mut client = ClientConnection::new(Arc::new(client), name).unwrap();
        for _ in 0..10 {
            let mut bytes = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut bytes).unwrap();
            }
            let mut rd = &bytes[..];
            while !rd.is_empty() {
                server.read_tls(&mut rd).unwrap();
            }
            // The server's own failures show up as the client's alert.
            let _ = server.process_new_packets();
            let mut bytes = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut bytes).unwrap();
            }
            let mut rd = &bytes[..];
            while !rd.is_empty() {
                client.read_tls(&mut rd).unwrap();
            }
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake neither finished nor failed");
    }

    #[test]
    fn a_pin_accepts_its_certificate_only_and_checks_the_key() {
        let (cert, key) = self_signed();
        let (other_cert, other_key) = self_signed();
        let pin = Fingerprint::of(cert.as_ref());
        let pinned = || client_config_for(&Trust::Pinned(pin), &[]).unwrap();
        // The pinned certificate: accepted whatever name is dialed.
        handshake_in_memory(pinned(), "localhost", cert.clone(), key.clone_key()).unwrap();
        handshake_in_memory(pinned(), "elsewhere.example", cert.clone(), key.clone_key()).unwrap();
        // Another certificate: refused, both digests named.
        let e = handshake_in_memory(
            pinned(),
            "localhost",
            other_cert.clone(),
            other_key.clone_key(),
        )
        .unwrap_err();
        let rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) = &e else {
            panic!("{e}");
        };
        let mismatch = other.0.downcast_ref::<PinMismatch>().unwrap();
        assert_eq!(mismatch.got, Fingerprint::of(other_cert.as_ref()));
        assert_eq!(mismatch.pinned, pin);
        // The pinned certificate from a server without its key: the
        // handshake signature does not verify.
        let e = handshake_in_memory(pinned(), "localhost", cert.clone(), other_key).unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)
            ),
            "{e}"
        );
        // Trusted as roots instead: a root store holding the certificate
        // accepts it for its name only; the system's store does not know it.
        let mut roots = RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        let roots = Trust::Roots(Arc::new(roots));
        let by_roots = || client_config_for(&roots, &[]).unwrap();
        handshake_in_memory(by_roots(), "localhost", cert.clone(), key.clone_key()).unwrap();
        let e = handshake_in_memory(
            by_roots(),
            "elsewhere.example",
            cert.clone(),
            key.clone_key(),
        )
        .unwrap_err();
        assert!(matches!(e, rustls::Error::InvalidCertificate(_)), "{e}");
        let system = client_config_for(&Trust::System, &[]).unwrap();
        let e = handshake_in_memory(system, "localhost", cert, key).unwrap_err();
        assert!(
            matches!(
                e,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
            ),
            "{e}"
        );
    }

    #[test]
    fn missing_files_name_the_file() {
        let e = certs_from_pem_file(Path::new("/nonexistent/cert.pem")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/cert.pem"), "{e}");
        let dir = std::env::temp_dir().join(format!("skiff-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        assert!(matches!(
            certs_from_pem_file(&empty),
            Err(PemError::Empty { .. })
        ));
        assert!(matches!(
            key_from_pem_file(&empty),
            Err(PemError::Empty { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
