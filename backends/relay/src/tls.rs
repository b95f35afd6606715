//! TLS on the listen port (docs/protocol.md §9.8): the certificate and key
//! files (`--tls-cert`, `--tls-key`), the server configuration every worker
//! reads per handshake, and its reload (SIGHUP).
//!
//! One [`TlsServer`] is shared by every worker thread. Each handshake takes
//! the current `Arc<ServerConfig>` under a read lock held only for the clone;
//! [`TlsServer::reload`] builds a new configuration from the files and swaps
//! it in, so handshakes after it use the new certificate while established
//! connections keep the keys they agreed on. A file that cannot be used
//! leaves the previous certificate in place.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use skiff_monoio::tls::{ALPN_HTTP1, ALPN_QMUX, PemError};

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

/// The relay's TLS server configuration, shared by the workers and replaced
/// by [`TlsServer::reload`].
#[derive(Debug)]
pub struct TlsServer {
    files: TlsFiles,
    /// `None`: every connection is refused ([`TlsServer::refusing`]).
    current: RwLock<Option<Arc<ServerConfig>>>,
}

impl TlsServer {
    /// Reads `files` now.
    ///
    /// # Errors
    /// [`PemError`] naming the file that cannot be used.
    pub fn load(files: TlsFiles) -> Result<Self, PemError> {
        let config = files.server_config()?;
        Ok(TlsServer {
            files,
            current: RwLock::new(Some(Arc::new(config))),
        })
    }

    /// A server that refuses every connection (no certificate to offer):
    /// what the workers use when the files became unusable after the
    /// configuration was checked, so the port never falls back to plain
    /// text. A successful [`TlsServer::reload`] of `files` brings it up.
    pub fn refusing(files: TlsFiles) -> Self {
        TlsServer {
            files,
            current: RwLock::new(None),
        }
    }

    /// The configuration a new handshake uses (`None`: refuse the connection).
    pub fn config(&self) -> Option<Arc<ServerConfig>> {
        match self.current.read() {
            Ok(c) => c.clone(),
            // A panic while the lock was held cannot leave a torn Arc.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The files this configuration is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again: new handshakes use them, established
    /// connections are not touched. On error the previous certificate stays
    /// and the error is logged (and returned).
    ///
    /// # Errors
    /// [`PemError`] naming the file that cannot be used.
    pub fn reload(&self) -> Result<(), PemError> {
        match self.files.server_config() {
            Ok(config) => {
                let mut current = match self.current.write() {
                    Ok(c) => c,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *current = Some(Arc::new(config));
                tracing::info!(
                    cert = %self.files.cert.display(),
                    "TLS certificate reloaded: new connections use it"
                );
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate not reloaded: keeping the previous one");
                Err(e)
            }
        }
    }
}
