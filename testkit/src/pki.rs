//! A test PKI: a CA and a server certificate it signed for `127.0.0.1` and
//! `localhost`, written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// The PEM files of a test CA and of the server certificate it signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// The CA's certificate (what a client trusts).
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

impl Pki {
    /// Makes a CA named after `name` and a certificate it signed for
    /// `127.0.0.1` and `localhost`, and writes them into `dir` as
    /// `ca-NAME.pem`, `cert-NAME.pem` and `key-NAME.pem`. Two calls with
    /// different names make two CAs that do not trust each other's
    /// certificates.
    ///
    /// # Panics
    /// If a key or certificate cannot be made or a file written (a test's
    /// setup failing).
    pub fn write(dir: &Path, name: &str) -> Pki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("skiff test CA {name}"));
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("skiff test relay {name}"));
        let cert = params.signed_by(&key, &issuer).expect("server certificate");
        let pki = Pki {
            ca: dir.join(format!("ca-{name}.pem")),
            cert: dir.join(format!("cert-{name}.pem")),
            key: dir.join(format!("key-{name}.pem")),
        };
        std::fs::write(&pki.ca, ca_cert.pem()).expect("write the CA");
        std::fs::write(&pki.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&pki.key, key.serialize_pem()).expect("write the key");
        pki
    }
}
