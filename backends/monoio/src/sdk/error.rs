//! The one error type of the client SDK.

use std::io;

use skiff_core::model::group;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not `tcp://host:port[/path]`, `tls://host:port[/path]`,
    /// `ws://host:port[/path][?query]` or `wss://host:port[/path][?query]`,
    /// or its host does not resolve.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A broadcast path or track name is empty, too long or malformed.
    #[error("invalid name {0:?}")]
    InvalidName(String),
    /// A table sized by [`crate::sdk::Config`] is full (tracks, broadcasts,
    /// subscriptions): release something or configure more.
    #[error("the client's {0} table is full")]
    Full(&'static str),
    /// The broadcast is already published by this client.
    #[error("broadcast {0:?} is already published")]
    Duplicate(String),
    /// The relay refused or ended the subscription with this moq-lite
    /// stream error code (e.g. NOT_FOUND 0x33).
    #[error("the relay refused the subscription (code {0:#x})")]
    Refused(u64),
    /// The relay has no such broadcast, track or group to fetch (it
    /// refused with NOT_FOUND 0x33 or UNROUTABLE 0x36).
    #[error("not found")]
    NotFound,
    /// The publisher aborted the track with this code.
    #[error("the track was aborted (code {0:#x})")]
    Aborted(u64),
    /// The group was dropped from the cache before it was read to its end:
    /// the reader fell behind. Read on with the track's next group.
    #[error("the group was evicted before it was read")]
    Evicted,
    /// A frame would take its group past the track's group size limit.
    #[error("the frame does not fit the group's size limit")]
    GroupTooLarge,
    /// The group or track was already finished, or the frame's timestamp is
    /// out of range of the previous one's.
    #[error("cannot write: {0}")]
    Write(group::WriteError),
    /// The client was closed ([`crate::sdk::Client::close`]).
    #[error("the client is closed")]
    Closed,
    /// The TLS handshake failed: the server's certificate does not chain to
    /// the trusted roots or does not name the host, is not the pinned one
    /// ([`crate::tls::PinMismatch`] inside
    /// `InvalidCertificate(CertificateError::Other(_))`), the server is no TLS
    /// server, no common protocol version or ALPN name (docs/protocol.md §9.8).
    #[error("TLS: {}", tls_text(.0))]
    Tls(rustls::Error),
    /// A socket error on the connection.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// What a TLS failure says: rustls's own text, but a certificate refused
/// by a verifier's own error (a [`crate::tls::PinMismatch`]) by that error's
/// text rather than its debug form.
fn tls_text(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            format!("invalid peer certificate: {}", other.0)
        }
        e => e.to_string(),
    }
}

impl From<rustls::Error> for Error {
    fn from(e: rustls::Error) -> Self {
        Error::Tls(e)
    }
}

impl Error {
    /// [`Error::Tls`] for an I/O error that carries a TLS failure, else [`Error::Io`].
    pub(crate) fn from_transport(e: io::Error) -> Self {
        match crate::tls::tls_error(&e) {
            Some(tls) => Error::Tls(tls.clone()),
            None => Error::Io(e),
        }
    }
}

impl From<group::WriteError> for Error {
    fn from(e: group::WriteError) -> Self {
        match e {
            group::WriteError::GroupTooLarge => Error::GroupTooLarge,
            group::WriteError::Aborted(code) => Error::Aborted(code),
            other => Error::Write(other),
        }
    }
}
