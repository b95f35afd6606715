//! Verification keys: JWK files as moq-dev's tools write them (JSON, or
//! base64url of the JSON), one file or a directory of `{kid}.jwk`, and the
//! signature and time checks of a token (docs/protocol.md §4.10).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::claims::{Claims, ClaimsError};

/// The largest key file read; a bigger one is refused unread.
pub const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;
/// Keys of a key directory held parsed at once; past that, one is dropped
/// (and read again from its file when a token names it).
pub const MAX_CACHED_KEYS: usize = 256;
/// The shortest HMAC secret accepted (what moq-dev's tools enforce).
const MIN_SECRET_BYTES: usize = 32;
/// The longest `kid` accepted.
const MAX_KID: usize = 128;

/// Why a key could not be used or a token did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file could not be read (missing, too big, unreadable).
    #[error("cannot read key file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The JWK does not describe a usable verification key.
    #[error("invalid key: {0}")]
    Invalid(String),
    /// The token names no key and a key directory needs one.
    #[error("the token names no key (kid)")]
    MissingKid,
    /// The token's `kid` names no key.
    #[error("the token's key is unknown")]
    UnknownKey,
    /// The token is not a JWT this key signed (format, algorithm, signature).
    #[error("the token does not verify: {0}")]
    Signature(String),
    /// The claims were refused.
    #[error(transparent)]
    Claims(#[from] ClaimsError),
    /// `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is still ahead.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// The claims grant more than the key's scope allows.
    #[error("the token grants more than its key's scope")]
    ScopeExceeded,
}

/// A key's ceiling on what its tokens may grant (the JWK's `scope`).
#[derive(Debug, Clone)]
struct KeyScope(Claims);

impl KeyScope {
    fn allows(&self, claims: &Claims) -> bool {
        let covers = |granted: &moq_pattern::Patterns, asked: &moq_pattern::Patterns| match (
            granted.rooted(&self.0.root),
            asked.rooted(&claims.root),
        ) {
            (Ok(g), Ok(a)) => g.covers(&a),
            _ => false,
        };
        covers(&self.0.publish, &claims.publish) && covers(&self.0.subscribe, &claims.subscribe)
    }
}

/// One verification key.
#[derive(Clone)]
pub struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    decoding: DecodingKey,
    scope: Option<KeyScope>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// Parses a JWK, as JSON or as base64url-encoded JSON (both forms
    /// moq-dev's tools write). `alg` is required and must fit the key type
    /// and curve; `key_ops`, when present, must allow `verify`.
    ///
    /// # Errors
    /// [`KeyError::Invalid`].
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        let json = if text.starts_with('{') {
            text.as_bytes().to_vec()
        } else {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(text)
                .map_err(|e| KeyError::Invalid(format!("neither JSON nor base64url: {e}")))?
        };
        let value: serde_json::Value =
            serde_json::from_slice(&json).map_err(|e| KeyError::Invalid(e.to_string()))?;
        let scope = match value.get("scope") {
            None => None,
            Some(s) => {
                let claims = Claims::from_json(s.to_string().as_bytes())
                    .map_err(|e| KeyError::Invalid(format!("scope: {e}")))?;
                if claims.expires.is_some()
                    || claims.not_before.is_some()
                    || claims.issued.is_some()
                {
                    return Err(KeyError::Invalid(
                        "scope: times are not scope fields".into(),
                    ));
                }
                claims
                    .validate()
                    .map_err(|_| KeyError::Invalid("scope grants nothing".into()))?;
                Some(KeyScope(claims))
            }
        };
        let jwk: Jwk =
            serde_json::from_value(value).map_err(|e| KeyError::Invalid(e.to_string()))?;
        let invalid = |s: &str| KeyError::Invalid(s.to_owned());
        let alg = jwk
            .common
            .key_algorithm
            .ok_or_else(|| invalid("the JWK has no alg"))?;
        let algorithm =
            Algorithm::try_from(alg).map_err(|_| invalid("alg is not a signature algorithm"))?;
        if let Some(ops) = &jwk.common.key_operations
            && !ops.contains(&KeyOperations::Verify)
        {
            return Err(invalid("key_ops does not allow verify"));
        }
        use Algorithm::*;
        let fits = match &jwk.algorithm {
            AlgorithmParameters::OctetKey(p) => {
                let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(p.value.trim_end_matches('='))
                    .map_err(|_| invalid("k is not base64url"))?;
                if secret.len() < MIN_SECRET_BYTES {
                    return Err(KeyError::Invalid(format!(
                        "an oct secret must be at least {MIN_SECRET_BYTES} bytes"
                    )));
                }
                matches!(algorithm, HS256 | HS384 | HS512)
            }
            AlgorithmParameters::EllipticCurve(p) => matches!(
                (&p.curve, algorithm),
                (EllipticCurve::P256, ES256) | (EllipticCurve::P384, ES384)
            ),
            AlgorithmParameters::OctetKeyPair(p) => {
                matches!((&p.curve, algorithm), (EllipticCurve::Ed25519, EdDSA))
            }
            AlgorithmParameters::RSA(_) => {
                matches!(algorithm, RS256 | RS384 | RS512 | PS256 | PS384 | PS512)
            }
            _ => false,
        };
        if !fits {
            return Err(invalid("alg does not fit the key type or curve"));
        }
        let decoding = DecodingKey::from_jwk(&jwk).map_err(|e| KeyError::Invalid(e.to_string()))?;
        Ok(Key {
            kid: jwk.common.key_id,
            algorithm,
            decoding,
            scope,
        })
    }

    /// Reads and parses a key file (at most [`MAX_KEY_FILE_BYTES`]).
    ///
    /// # Errors
    /// [`KeyError::Read`] or [`KeyError::Invalid`].
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        Self::parse(&read_limited(path)?)
    }

    /// The key's `kid`, if it has one.
    #[cfg(test)]
    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// Verifies `token`'s signature with this key, then its times at `now`
    /// (`exp <= now` expired, `nbf > now` not yet valid, no leeway) and that
    /// it grants something within the key's scope.
    ///
    /// # Errors
    /// [`KeyError::Signature`], [`KeyError::Claims`], [`KeyError::Expired`],
    /// [`KeyError::NotYetValid`], [`KeyError::ScopeExceeded`].
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, KeyError> {
        let mut validation = Validation::new(self.algorithm);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).map_err(
            |e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::Json(j) => {
                    KeyError::Claims(ClaimsError::Malformed(j.to_string()))
                }
                _ => KeyError::Signature(e.to_string()),
            },
        )?;
        let claims = data.claims;
        let now = unix_seconds(now);
        if claims.expires.is_some_and(|exp| exp <= now) {
            return Err(KeyError::Expired);
        }
        if claims.not_before.is_some_and(|nbf| nbf > now) {
            return Err(KeyError::NotYetValid);
        }
        claims.validate()?;
        if let Some(scope) = &self.scope
            && !scope.allows(&claims)
        {
            return Err(KeyError::ScopeExceeded);
        }
        Ok(claims)
    }
}

/// Seconds since the unix epoch (negative before it).
pub fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// Reads a file of at most [`MAX_KEY_FILE_BYTES`] as UTF-8.
fn read_limited(path: &Path) -> Result<String, KeyError> {
    let err = |reason: String| KeyError::Read {
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| err(e.to_string()))?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(err(format!("larger than {MAX_KEY_FILE_BYTES} bytes")));
    }
    Ok(text)
}

/// Whether `kid` may name a file: ASCII letters, digits, `-` and `_`, at
/// most 128 bytes (so it never escapes the key directory).
fn valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A parsed key and the file state it was parsed from.
struct Cached {
    modified: Option<SystemTime>,
    len: u64,
    key: Arc<Key>,
}

/// Where the keys a token is verified with come from. Files are looked at
/// again for every token (a `stat`, and a read when they changed), so a key
/// replaced or added on disk is used without a restart.
#[derive(Debug)]
pub enum Keys {
    /// One key file; the token's `kid` is not compared with it.
    File(KeyFiles),
    /// A directory of `{kid}.jwk` files, chosen by the token's `kid`.
    Dir(KeyFiles),
}

/// The parsed keys of a [`Keys`] source, at most [`MAX_CACHED_KEYS`].
pub struct KeyFiles {
    path: PathBuf,
    cache: Mutex<HashMap<String, Cached>>,
}

impl std::fmt::Debug for KeyFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyFiles")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl KeyFiles {
    fn new(path: PathBuf) -> Self {
        KeyFiles {
            path,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The key in `file` (cached under `name`), read again if it changed.
    fn load(&self, name: &str, file: &Path) -> Result<Arc<Key>, KeyError> {
        let meta = std::fs::metadata(file).map_err(|e| KeyError::Read {
            path: file.display().to_string(),
            reason: e.to_string(),
        })?;
        let (modified, len) = (meta.modified().ok(), meta.len());
        let mut cache = match self.cache.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if let Some(c) = cache.get(name)
            && c.modified == modified
            && c.len == len
            && modified.is_some()
        {
            return Ok(c.key.clone());
        }
        let key = Arc::new(Key::from_file(file)?);
        if cache.len() >= MAX_CACHED_KEYS
            && !cache.contains_key(name)
            && let Some(evict) = cache.keys().next().cloned()
        {
            cache.remove(&evict);
        }
        cache.insert(
            name.to_owned(),
            Cached {
                modified,
                len,
                key: key.clone(),
            },
        );
        Ok(key)
    }
}

impl Keys {
    /// One key file, checked now (a relay must not start with a bad key).
    ///
    /// # Errors
    /// The key's [`KeyError`].
    pub fn file(path: PathBuf) -> Result<Self, KeyError> {
        let files = KeyFiles::new(path);
        files.load("", &files.path)?;
        Ok(Keys::File(files))
    }

    /// A key directory, checked now to be a readable directory.
    ///
    /// # Errors
    /// [`KeyError::Read`].
    pub fn dir(path: PathBuf) -> Result<Self, KeyError> {
        std::fs::read_dir(&path).map_err(|e| KeyError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(Keys::Dir(KeyFiles::new(path)))
    }

    /// Verifies `token` with the key it names (see [`Key::verify`]).
    ///
    /// # Errors
    /// [`KeyError::MissingKid`] or [`KeyError::UnknownKey`] for a key
    /// directory, else the errors of [`Key::verify`].
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, KeyError> {
        let key = match self {
            Keys::File(files) => files.load("", &files.path)?,
            Keys::Dir(files) => {
                let header = jsonwebtoken::decode_header(token)
                    .map_err(|e| KeyError::Signature(e.to_string()))?;
                let kid = header.kid.ok_or(KeyError::MissingKid)?;
                if !valid_kid(&kid) {
                    return Err(KeyError::UnknownKey);
                }
                let file = files.path.join(format!("{kid}.jwk"));
                files.load(&kid, &file).map_err(|e| match e {
                    KeyError::Read { .. } => KeyError::UnknownKey,
                    other => other,
                })?
            }
        };
        key.verify(token, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use std::time::Duration;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn hs_jwk(kid: &str) -> String {
        let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(SECRET);
        format!(
            r#"{{"kty":"oct","alg":"HS256","k":"{k}","kid":"{kid}","key_ops":["sign","verify"]}}"#
        )
    }

    fn sign(kid: Option<&str>, payload: &str) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = kid.map(str::to_owned);
        let claims: serde_json::Value = serde_json::from_str(payload).unwrap();
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(SECRET)).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    // ---- parsing ----

    #[test]
    fn json_and_base64url_forms_parse() {
        let json = hs_jwk("a");
        assert_eq!(Key::parse(&json).unwrap().kid(), Some("a"));
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.as_bytes());
        assert_eq!(Key::parse(&format!("{b64}\n")).unwrap().kid(), Some("a"));
    }

    #[test]
    fn unfit_keys_are_refused() {
        let short = r#"{"kty":"oct","alg":"HS256","k":"c2hvcnQ"}"#;
        let no_alg = r#"{"kty":"oct","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#;
        let wrong =
            r#"{"kty":"oct","alg":"ES256","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#;
        let sign_only = r#"{"kty":"oct","alg":"HS256","key_ops":["sign"],"k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}"#;
        for bad in [short, no_alg, wrong, sign_only, "{", "!!"] {
            assert!(
                matches!(Key::parse(bad), Err(KeyError::Invalid(_))),
                "{bad}"
            );
        }
    }

    // ---- verification ----

    #[test]
    fn a_good_token_verifies() {
        let key = Key::parse(&hs_jwk("a")).unwrap();
        let t = sign(Some("a"), r#"{"root":"r","publish":["**"],"exp":100}"#);
        let c = key.verify(&t, at(99)).unwrap();
        assert_eq!(c.root, "r");
    }

    #[test]
    fn times_have_no_leeway() {
        let key = Key::parse(&hs_jwk("a")).unwrap();
        let t = sign(None, r#"{"publish":["**"],"exp":100,"nbf":50}"#);
        assert_eq!(key.verify(&t, at(100)).unwrap_err(), KeyError::Expired);
        assert_eq!(key.verify(&t, at(49)).unwrap_err(), KeyError::NotYetValid);
        assert!(key.verify(&t, at(50)).is_ok());
    }

    #[test]
    fn bad_signatures_algorithms_and_claims_are_refused() {
        let key = Key::parse(&hs_jwk("a")).unwrap();
        let t = sign(None, r#"{"publish":["**"]}"#);
        let mut forged = t.clone();
        forged.pop();
        forged.push(if t.ends_with('A') { 'B' } else { 'A' });
        assert!(matches!(
            key.verify(&forged, at(0)),
            Err(KeyError::Signature(_))
        ));
        assert!(matches!(
            key.verify("garbage", at(0)),
            Err(KeyError::Signature(_))
        ));
        let other = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &serde_json::json!({"publish":["**"]}),
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert!(matches!(
            key.verify(&other, at(0)),
            Err(KeyError::Signature(_))
        ));
        let unknown = sign(None, r#"{"publish":["**"],"admin":true}"#);
        assert!(matches!(
            key.verify(&unknown, at(0)),
            Err(KeyError::Claims(_))
        ));
        let useless = sign(None, r#"{"root":"a"}"#);
        assert_eq!(
            key.verify(&useless, at(0)).unwrap_err(),
            KeyError::Claims(ClaimsError::Useless)
        );
    }

    #[test]
    fn a_key_scope_caps_its_tokens() {
        let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(SECRET);
        let jwk = format!(
            r#"{{"kty":"oct","alg":"HS256","k":"{k}","scope":{{"root":"p","publish":["live/**"]}}}}"#
        );
        let key = Key::parse(&jwk).unwrap();
        let inside = sign(None, r#"{"root":"p/live/room","publish":["**"]}"#);
        assert!(key.verify(&inside, at(0)).is_ok());
        let outside = sign(None, r#"{"root":"p","publish":["**"]}"#);
        assert_eq!(
            key.verify(&outside, at(0)).unwrap_err(),
            KeyError::ScopeExceeded
        );
        let role = sign(None, r#"{"root":"p/live","subscribe":["**"]}"#);
        assert_eq!(
            key.verify(&role, at(0)).unwrap_err(),
            KeyError::ScopeExceeded
        );
    }

    // ---- sources ----

    #[test]
    fn a_key_dir_chooses_by_kid_and_sees_changes() {
        let dir = std::env::temp_dir().join(format!("skiff-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = Keys::dir(dir.clone()).unwrap();
        let t = sign(Some("k1"), r#"{"publish":["**"]}"#);
        assert_eq!(keys.verify(&t, at(0)).unwrap_err(), KeyError::UnknownKey);
        std::fs::write(dir.join("k1.jwk"), hs_jwk("k1")).unwrap();
        assert!(keys.verify(&t, at(0)).is_ok());
        let bare = sign(None, r#"{"publish":["**"]}"#);
        assert_eq!(keys.verify(&bare, at(0)).unwrap_err(), KeyError::MissingKid);
        let escape = sign(Some("../k1"), r#"{"publish":["**"]}"#);
        assert_eq!(
            keys.verify(&escape, at(0)).unwrap_err(),
            KeyError::UnknownKey
        );
        std::fs::remove_file(dir.join("k1.jwk")).unwrap();
        assert_eq!(keys.verify(&t, at(0)).unwrap_err(), KeyError::UnknownKey);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn oversized_key_files_are_refused() {
        let file = std::env::temp_dir().join(format!("skiff-big-{}.jwk", std::process::id()));
        std::fs::write(&file, vec![b' '; MAX_KEY_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            Keys::file(file.clone()),
            Err(KeyError::Read { .. })
        ));
        let _ = std::fs::remove_file(&file);
    }
}
