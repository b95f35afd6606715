//! A TLS client certificate verifier that trusts any server, for the
//! relay tests that dial its TLS port without its CA (kept apart from
//! `common`, which the interop tests share and which has no rustls).
#![allow(dead_code)]

/// A TLS client's certificate verifier that accepts any certificate and
/// keeps the leaf it was shown last: for tests that learn what the relay
/// serves without trusting it first, or check what it logs, not who it is.
#[derive(Debug)]
pub struct TrustAny {
    /// The leaf certificate of the last handshake (DER), if any.
    pub leaf: std::sync::Mutex<Option<Vec<u8>>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl TrustAny {
    /// A verifier that checks handshake signatures with `algorithms`.
    pub fn new(algorithms: rustls::crypto::WebPkiSupportedAlgorithms) -> TrustAny {
        TrustAny {
            leaf: std::sync::Mutex::new(None),
            algorithms,
        }
    }
}

impl rustls::client::danger::ServerCertVerifier for TrustAny {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.leaf.lock().unwrap() = Some(end_entity.to_vec());
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
