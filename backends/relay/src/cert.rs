//! The relay's server certificate: one shared source of the certificate
//! chain, its private key and the SHA-256 of its leaf, read by every
//! handshake of the listen port's TLS (over TCP, [`crate::tls::TlsServer`])
//! and by the QUIC endpoint, and answered at `GET /certificate.sha256`.
//!
//! It comes from the `--tls-cert`/`--tls-key` files (re-read on SIGHUP,
//! [`ServerCert::reload`]) or is made here (`--tls-generate HOST,...`): a
//! self-signed ECDSA P-256 certificate for those hosts, valid
//! [`GENERATED_VALIDITY`] from a day before it is made (at most 14 days, what
//! browsers accept for `serverCertificateHashes`), renewed once half of that
//! has passed ([`renewal_due`]) by a thread of its own
//! ([`ServerCert::spawn_renewal`]), with no restart. A renewal or reload
//! changes what new handshakes get; established connections keep theirs.

use std::io;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use skiff_monoio::tls::{Fingerprint, PemError};

use crate::tls::{TlsFiles, TlsSource};

/// How long a generated certificate is valid (its `notAfter` minus its
/// `notBefore`): 14 days, the most browsers accept for a certificate pinned
/// by `serverCertificateHashes`.
pub const GENERATED_VALIDITY: Duration = Duration::from_secs(14 * 24 * 3600);

/// How long before it is made a generated certificate's validity starts, so a
/// peer whose clock is behind still takes it.
pub const GENERATED_BACKDATE: Duration = Duration::from_secs(24 * 3600);

/// How often the renewal thread looks at the time, at most (so a suspended
/// machine or a clock step is noticed soon, and the thread ends soon after
/// the certificate is dropped).
const RENEWAL_CHECK: Duration = Duration::from_secs(60);

/// Why a certificate could not be read or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// The certificate or key file cannot be used.
    #[error(transparent)]
    Pem(#[from] PemError),
    /// A host name is neither a DNS name nor an IP address.
    #[error("`{0}` is neither a DNS name nor an IP address")]
    Host(String),
    /// No host names to make a certificate for.
    #[error("no host name to make a certificate for")]
    NoHost,
    /// rcgen or rustls could not make the key or the certificate.
    #[error("cannot make a certificate: {0}")]
    Generate(String),
}

/// Whether a certificate valid from `not_before` to `not_after` should be
/// replaced at `now`: once half of its validity has passed (a generated one:
/// 6 days after it was made, 7 days before it expires), or if its dates are
/// inverted.
pub fn renewal_due(not_before: SystemTime, not_after: SystemTime, now: SystemTime) -> bool {
    let Ok(life) = not_after.duration_since(not_before) else {
        return true;
    };
    now >= not_before + life / 2
}

/// Checks `host` for a certificate's subject alternative names: an IP
/// address or a DNS name.
///
/// # Errors
/// [`CertError::Host`].
pub fn check_host(host: &str) -> Result<(), CertError> {
    if host.parse::<std::net::IpAddr>().is_ok()
        || rustls::pki_types::DnsName::try_from(host).is_ok()
    {
        Ok(())
    } else {
        Err(CertError::Host(host.to_owned()))
    }
}

/// A self-signed certificate made for some hosts.
#[derive(Debug)]
pub struct Generated {
    /// The certificate (DER) and its key, as rustls serves them.
    pub key: CertifiedKey,
    /// When its validity starts.
    pub not_before: SystemTime,
    /// When it expires.
    pub not_after: SystemTime,
}

/// Makes a self-signed ECDSA P-256 certificate for `hosts` (DNS names or IP
/// addresses, its subject alternative names), valid from
/// [`GENERATED_BACKDATE`] before `now` for [`GENERATED_VALIDITY`].
///
/// # Errors
/// [`CertError`]: a host that is no name or address, no host, or the
/// key or certificate cannot be made.
pub fn generate(hosts: &[String], now: SystemTime) -> Result<Generated, CertError> {
    if hosts.is_empty() {
        return Err(CertError::NoHost);
    }
    for host in hosts {
        check_host(host)?;
    }
    let failed = |e: rcgen::Error| CertError::Generate(e.to_string());
    // Whole seconds: X.509 times have no fractions, so the stored dates
    // and the certificate's agree.
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs());
    let not_before = now.checked_sub(GENERATED_BACKDATE).unwrap_or(now);
    let not_after = not_before + GENERATED_VALIDITY;
    let key_pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(failed)?;
    let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(failed)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "skiff-relay");
    params.not_before = time::OffsetDateTime::from(not_before);
    params.not_after = time::OffsetDateTime::from(not_after);
    let cert = params.self_signed(&key_pair).map_err(failed)?;
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pair.serialize_der()));
    let key = skiff_monoio::tls::certified_key(chain, private)
        .map_err(|e| CertError::Generate(e.to_string()))?;
    Ok(Generated {
        key,
        not_before,
        not_after,
    })
}

/// The certificate being served.
#[derive(Debug, Clone)]
struct Current {
    key: Arc<CertifiedKey>,
    fingerprint: Fingerprint,
    /// A generated certificate's validity (`None` for files: they are
    /// replaced by SIGHUP, not by time).
    validity: Option<(SystemTime, SystemTime)>,
}

impl Current {
    fn new(key: CertifiedKey, validity: Option<(SystemTime, SystemTime)>) -> Self {
        let fingerprint = match key.end_entity_cert() {
            Ok(leaf) => Fingerprint::of(leaf.as_ref()),
            // CertifiedKey::from_der refuses an empty chain before this.
            Err(_) => Fingerprint([0; 32]),
        };
        Current {
            key: Arc::new(key),
            fingerprint,
            validity,
        }
    }
}

/// The relay's current server certificate, shared by every worker thread:
/// the TCP listen port's TLS ([`crate::tls::TlsServer`] hands it to rustls
/// as its [`rustls::server::ResolvesServerCert`]), the QUIC endpoint (give
/// its rustls `ServerConfig` this same `Arc<ServerCert>` as the certificate
/// resolver, or read [`ServerCert::current`] per handshake) and
/// `GET /certificate.sha256` ([`ServerCert::fingerprint_hex`]).
///
/// [`ServerCert::reload`] (SIGHUP) and [`ServerCert::renew_if_due`] swap in a
/// new certificate under a write lock held only for the swap; each handshake
/// clones the current `Arc<CertifiedKey>` under the read lock, so a renewal
/// needs no new `ServerConfig` and established connections are not touched.
#[derive(Debug)]
pub struct ServerCert {
    source: TlsSource,
    /// `None`: no usable certificate; every handshake is refused.
    current: RwLock<Option<Current>>,
}

impl ServerCert {
    /// Reads the files of `source`, or makes its certificate, now.
    ///
    /// # Errors
    /// [`CertError`] naming what cannot be used.
    pub fn load(source: TlsSource) -> Result<Self, CertError> {
        let current = Self::make(&source, SystemTime::now())?;
        Ok(ServerCert {
            source,
            current: RwLock::new(Some(current)),
        })
    }

    /// A certificate source without a certificate: every handshake is
    /// refused (so the port never falls back to plain text) until a
    /// successful [`ServerCert::reload`].
    pub fn refusing(source: TlsSource) -> Self {
        ServerCert {
            source,
            current: RwLock::new(None),
        }
    }

    /// The certificate `source` gives at `now`.
    fn make(source: &TlsSource, now: SystemTime) -> Result<Current, CertError> {
        match source {
            TlsSource::Files(TlsFiles { cert, key }) => {
                let key = skiff_monoio::tls::certified_key_from_pem_files(cert, key)?;
                Ok(Current::new(key, None))
            }
            TlsSource::Generate(hosts) => {
                let made = generate(hosts, now)?;
                Ok(Current::new(
                    made.key,
                    Some((made.not_before, made.not_after)),
                ))
            }
        }
    }

    fn read(&self) -> Option<Current> {
        match self.current.read() {
            Ok(c) => c.clone(),
            // A panic while the lock was held cannot leave a torn value.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, current: Current) {
        let mut slot = match self.current.write() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        *slot = Some(current);
    }

    /// Where the certificate comes from.
    pub fn source(&self) -> &TlsSource {
        &self.source
    }

    /// The chain and key a new handshake uses (`None`: refuse it).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        match self.current.read() {
            Ok(c) => c.as_ref().map(|c| c.key.clone()),
            Err(poisoned) => poisoned.into_inner().as_ref().map(|c| c.key.clone()),
        }
    }

    /// The SHA-256 of the current leaf certificate's DER.
    pub fn fingerprint(&self) -> Option<Fingerprint> {
        self.read().map(|c| c.fingerprint)
    }

    /// [`ServerCert::fingerprint`] as 64 lowercase hex digits, what
    /// `GET /certificate.sha256` answers.
    pub fn fingerprint_hex(&self) -> Option<String> {
        self.fingerprint().map(|f| f.to_string())
    }

    /// A generated certificate's `notBefore` and `notAfter` (`None` for
    /// files, or without a certificate).
    pub fn validity(&self) -> Option<(SystemTime, SystemTime)> {
        self.read().and_then(|c| c.validity)
    }

    /// When a generated certificate is to be renewed (`None` for files).
    pub fn renewal_time(&self) -> Option<SystemTime> {
        let (not_before, not_after) = self.validity()?;
        let life = not_after.duration_since(not_before).unwrap_or_default();
        Some(not_before + life / 2)
    }

    /// SIGHUP: files are read again; a generated certificate is renewed
    /// only if due (a pinned fingerprint stays good until then). On error
    /// the previous certificate stays and the error is logged (and
    /// returned).
    ///
    /// # Errors
    /// [`CertError`] naming what cannot be used.
    pub fn reload(&self) -> Result<(), CertError> {
        if matches!(self.source, TlsSource::Generate(_)) && self.read().is_some() {
            return self.renew_if_due(SystemTime::now()).map(|_| ());
        }
        match Self::make(&self.source, SystemTime::now()) {
            Ok(current) => {
                let fingerprint = current.fingerprint;
                self.replace(current);
                tracing::info!(
                    source = %self.source,
                    sha256 = %fingerprint,
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

    /// Replaces a generated certificate with a new one if half of its
    /// validity has passed at `now` ([`renewal_due`]); true if it did.
    /// Certificates from files are left alone.
    ///
    /// # Errors
    /// [`CertError::Generate`]: the previous certificate stays (and is
    /// tried again at the next call).
    pub fn renew_if_due(&self, now: SystemTime) -> Result<bool, CertError> {
        let TlsSource::Generate(_) = &self.source else {
            return Ok(false);
        };
        let due = match self.read().and_then(|c| c.validity) {
            Some((not_before, not_after)) => renewal_due(not_before, not_after, now),
            None => true,
        };
        if !due {
            return Ok(false);
        }
        match Self::make(&self.source, now) {
            Ok(current) => {
                let fingerprint = current.fingerprint;
                self.replace(current);
                tracing::info!(
                    sha256 = %fingerprint,
                    "generated TLS certificate renewed: new connections use it"
                );
                Ok(true)
            }
            Err(e) => {
                tracing::error!(error = %e, "generated TLS certificate not renewed: keeping the previous one");
                Err(e)
            }
        }
    }

    /// For a generated certificate, starts the thread that renews it when
    /// due ([`ServerCert::renew_if_due`], looked at least every minute);
    /// the thread ends once this certificate is dropped. Nothing for files.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn spawn_renewal(self: &Arc<Self>) -> io::Result<()> {
        if !matches!(self.source, TlsSource::Generate(_)) {
            return Ok(());
        }
        let weak: Weak<ServerCert> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("skiff-cert-renew".into())
            .spawn(move || {
                loop {
                    let wait = match weak.upgrade().and_then(|c| c.renewal_time()) {
                        Some(at) => at
                            .duration_since(SystemTime::now())
                            .unwrap_or_default()
                            .min(RENEWAL_CHECK),
                        None => RENEWAL_CHECK,
                    };
                    std::thread::sleep(wait.max(Duration::from_millis(100)));
                    let Some(cert) = weak.upgrade() else {
                        return;
                    };
                    // Errors are logged; the previous certificate stays.
                    let _ = cert.renew_if_due(SystemTime::now());
                }
            })?;
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServerCert {
    fn resolve(&self, _client_hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn at(days: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + DAY * days as u32
    }

    #[test]
    fn renewal_is_due_at_half_the_validity() {
        let (from, to) = (at(0), at(14));
        assert!(!renewal_due(from, to, at(0)));
        assert!(!renewal_due(from, to, at(7) - Duration::from_secs(1)));
        assert!(renewal_due(from, to, at(7)));
        assert!(renewal_due(from, to, at(13)));
        assert!(renewal_due(from, to, at(30)));
        // Inverted dates: replace at once.
        assert!(renewal_due(to, from, at(0)));
    }

    #[test]
    fn a_generated_certificate_is_valid_14_days_at_most_and_renewed_at_half() {
        let hosts = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let made = generate(&hosts, at(0)).unwrap();
        assert_eq!(made.not_before, at(0) - GENERATED_BACKDATE);
        assert_eq!(made.not_after - GENERATED_VALIDITY, made.not_before);
        assert!(GENERATED_VALIDITY <= 14 * DAY);
        let leaf = made.key.end_entity_cert().unwrap();
        // The certificate says the same dates: notBefore and notAfter as
        // UTCTime (YYMMDDHHMMSSZ) in the DER.
        let utc = |t: SystemTime| {
            let t = time::OffsetDateTime::from(t);
            format!(
                "{:02}{:02}{:02}{:02}{:02}{:02}Z",
                t.year() % 100,
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            )
        };
        let der = leaf.as_ref();
        let has = |text: String| der.windows(text.len()).any(|w| w == text.as_bytes());
        assert!(has(utc(made.not_before)), "notBefore");
        assert!(has(utc(made.not_after)), "notAfter");
        // The hosts are its names: a DNS name and the 4 bytes of an address.
        assert!(der.windows(9).any(|w| w == b"localhost"));
        assert!(der.windows(4).any(|w| w == [127, 0, 0, 1]));

        let cert = ServerCert {
            source: TlsSource::Generate(hosts),
            current: RwLock::new(Some(Current::new(
                made.key,
                Some((made.not_before, made.not_after)),
            ))),
        };
        let first = cert.fingerprint().unwrap();
        assert_eq!(first, Fingerprint::of(leaf_of(&cert).as_ref()));
        // Not due: six days after it was made, less a second.
        assert!(!cert.renew_if_due(at(6) - Duration::from_secs(1)).unwrap());
        assert_eq!(cert.fingerprint(), Some(first));
        assert_eq!(cert.renewal_time(), Some(at(6)));
        // Due at half its validity: a new certificate, valid from then.
        assert!(cert.renew_if_due(at(6)).unwrap());
        let second = cert.fingerprint().unwrap();
        assert_ne!(second, first);
        assert_eq!(second, Fingerprint::of(leaf_of(&cert).as_ref()));
        assert_eq!(
            cert.validity(),
            Some((at(6) - GENERATED_BACKDATE, at(5) + GENERATED_VALIDITY))
        );
        assert!(!cert.renew_if_due(at(7)).unwrap());
    }

    fn leaf_of(cert: &ServerCert) -> CertificateDer<'static> {
        let key = cert.current().unwrap();
        key.end_entity_cert().unwrap().clone().into_owned()
    }

    #[test]
    fn hosts_must_be_names_or_addresses() {
        assert!(check_host("relay.example").is_ok());
        assert!(check_host("::1").is_ok());
        assert!(check_host("10.0.0.1").is_ok());
        for bad in ["", "a b", "exa mple.com", "-", "x/y"] {
            assert!(
                matches!(check_host(bad), Err(CertError::Host(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(generate(&[], at(0)), Err(CertError::NoHost)));
    }

    #[test]
    fn files_are_not_renewed_by_time() {
        let cert = ServerCert::refusing(TlsSource::Files(TlsFiles {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
        }));
        assert!(!cert.renew_if_due(at(100)).unwrap());
        assert!(cert.current().is_none());
        assert!(cert.fingerprint_hex().is_none());
        assert!(cert.reload().is_err());
    }
}
