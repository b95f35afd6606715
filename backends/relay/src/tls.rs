//! TLS on the listen port (docs/protocol.md §9.8): where the certificate
//! comes from ([`TlsSource`]: the `--tls-cert`/`--tls-key` files or
//! `--tls-generate`), and the server configuration every worker reads per
//! handshake.
//!
//! One [`TlsServer`] is shared by every worker thread. Its one
//! `ServerConfig` takes each handshake's certificate from the shared
//! [`ServerCert`] (its certificate resolver); [`TlsServer::reload`] (SIGHUP)
//! and the renewal of a generated certificate swap the certificate there, so
//! handshakes after it use the new one while established connections keep
//! the keys they agreed on. A file that cannot be used leaves the previous
//! certificate in place.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use skiff_monoio::tls::{ALPN_HTTP1, ALPN_QMUX, PemError};

use crate::cert::{CertError, ServerCert};

/// The ALPN names the relay accepts, best first: qmux's name for QMux
/// qmux-01 with moq-lite-05, and HTTP/1.1 for `wss://` (browsers offer
/// `h2, http/1.1`). A client that offers no ALPN is accepted too; one that
/// offers only other names is refused by the handshake (no_application_protocol).
pub const ALPN: &[&[u8]] = &[ALPN_QMUX, ALPN_HTTP1];

/// The certificate chain and private key files of the listen port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// A server configuration from the files as they are now.
    ///
    /// # Errors
    /// [`PemError`] naming the file that cannot be used.
    pub fn server_config(&self) -> Result<ServerConfig, PemError> {
        skiff_monoio::tls::server_config(&self.cert, &self.key, ALPN)
    }
}

/// Where the listen port's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// `--tls-cert` and `--tls-key`, re-read on SIGHUP.
    Files(TlsFiles),
    /// `--tls-generate`: a self-signed certificate made for these hosts
    /// (DNS names or IP addresses) and renewed before it expires
    /// ([`crate::cert`]).
    Generate(Vec<String>),
}

impl std::fmt::Display for TlsSource {
    /// The certificate file, or `generated for HOST,...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsSource::Files(files) => write!(f, "{}", files.cert.display()),
            TlsSource::Generate(hosts) => write!(f, "generated for {}", hosts.join(",")),
        }
    }
}

/// The relay's TLS server configuration over TCP, shared by the workers:
/// one rustls `ServerConfig` whose certificate is resolved per handshake
/// from the shared [`ServerCert`], so a reload or a renewal needs no new
/// configuration.
#[derive(Debug)]
pub struct TlsServer {
    cert: Arc<ServerCert>,
    /// `None` only if rustls refused to make the configuration (it does
    /// not with aws-lc-rs): every connection is refused then.
    config: Option<Arc<ServerConfig>>,
}

impl TlsServer {
    /// Serves `cert` (which the QUIC endpoint may share).
    pub fn new(cert: Arc<ServerCert>) -> Self {
        let config = match skiff_monoio::tls::server_config_with_resolver(cert.clone(), ALPN) {
            Ok(config) => Some(Arc::new(config)),
            Err(e) => {
                tracing::error!(error = %e, "no TLS configuration: every connection is refused");
                None
            }
        };
        TlsServer { cert, config }
    }

    /// Reads the files of `source`, or makes its certificate, now; a
    /// generated one is renewed by a thread of its own
    /// ([`ServerCert::spawn_renewal`]).
    ///
    /// # Errors
    /// [`CertError`] naming what cannot be used.
    pub fn load(source: TlsSource) -> Result<Self, CertError> {
        let cert = Arc::new(ServerCert::load(source)?);
        if let Err(e) = cert.spawn_renewal() {
            tracing::error!(error = %e, "cannot start the certificate renewal thread");
        }
        Ok(Self::new(cert))
    }

    /// Whether the listen port's TCP side speaks TLS with this certificate:
    /// certificate files, yes; a generated (self-signed) certificate serves
    /// QUIC only, which clients pin by its hash, and TCP stays plain, so
    /// `GET /certificate.sha256` can be read before anything is trusted
    /// (as moq-relay serves it from its plain HTTP listener).
    pub fn on_tcp(&self) -> bool {
        matches!(self.cert.source(), TlsSource::Files(_))
    }

    /// A server that refuses every connection (no certificate to offer):
    /// what the workers use when the source became unusable after the
    /// configuration was checked, so the port never falls back to plain
    /// text. A successful [`TlsServer::reload`] brings it up.
    pub fn refusing(source: TlsSource) -> Self {
        Self::new(Arc::new(ServerCert::refusing(source)))
    }

    /// The configuration a new handshake uses (`None`: no certificate,
    /// refuse the connection).
    pub fn config(&self) -> Option<Arc<ServerConfig>> {
        self.cert.current().and(self.config.clone())
    }

    /// The certificate served, shared with the QUIC endpoint and
    /// `GET /certificate.sha256`.
    pub fn cert(&self) -> &Arc<ServerCert> {
        &self.cert
    }

    /// SIGHUP: [`ServerCert::reload`]. New handshakes use the new
    /// certificate, established connections are not touched; on error the
    /// previous certificate stays and the error is logged (and returned).
    ///
    /// # Errors
    /// [`CertError`] naming what cannot be used.
    pub fn reload(&self) -> Result<(), CertError> {
        self.cert.reload()
    }
}
