//! Access control with moq-dev's tokens (docs/protocol.md §4.10).
//!
//! - [`claims`]: the claims of a token (`root`, `publish`, `subscribe`, the
//!   older `put`/`get`, `exp`, `nbf`, `iat`) and their scope at a dialed path;
//! - [`keys`]: JWK files, one or a directory by `kid`, and verification;
//! - [`path`]: dialed paths and the `jwt` query parameter;
//! - [`gate`]: one session's admission and scope, the core's
//!   [`skiff_core::session::Scope`] hook;
//! - this module: [`Auth`], the decision.
//!
//! With neither keys nor public patterns configured, the relay is open to
//! everyone (and says so at start-up).

pub mod claims;
pub mod gate;
pub mod keys;
pub mod path;

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::SystemTime;

use moq_pattern::Patterns;
use skiff_core::wire::lite::Role;

pub use claims::{Access, Claims, ClaimsError};
pub use gate::Gate;
pub use keys::{Key, KeyError, Keys};

/// A token presented in SETUP's authorization-token option: its type and
/// value. Type 0 is a JWT, the one type verified here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupToken<'a> {
    /// The token type (0: out of band, a JWT).
    pub kind: u64,
    /// The token bytes.
    pub value: &'a [u8],
}

impl SetupToken<'_> {
    /// The token type that carries a JWT.
    pub const JWT: u64 = 0;
}

/// Why a session was refused (the reason of its UNAUTHORIZED close).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No token, and anonymous access does not reach the dialed path.
    #[error("a token is required")]
    TokenRequired,
    /// A token was presented to a relay configured without keys.
    #[error("this relay verifies no tokens")]
    NoKeys,
    /// SETUP's token and the `jwt` query parameter differ.
    #[error("two different tokens were presented")]
    TwoTokens,
    /// A SETUP token of a type other than JWT.
    #[error("unsupported token type")]
    UnsupportedToken,
    /// The token is not valid (see the [`KeyError`]).
    #[error("{0}")]
    Invalid(#[from] KeyError),
    /// The dialed path does not overlap the token's root.
    #[error("the path is outside the token's root")]
    RootMismatch,
    /// Nothing granted reaches the dialed path.
    #[error("nothing is granted at this path")]
    NoAccess,
    /// The SETUP role needs a grant the token lacks.
    #[error("the token does not grant the declared role")]
    Role,
}

impl Refusal {
    /// The reason sent with the UNAUTHORIZED close (static: the core keeps no strings).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::TokenRequired => "unauthorized: a token is required",
            Refusal::NoKeys => "unauthorized: this relay verifies no tokens",
            Refusal::TwoTokens => "unauthorized: two different tokens were presented",
            Refusal::UnsupportedToken => "unauthorized: unsupported token type",
            Refusal::Invalid(KeyError::Expired) => "unauthorized: the token has expired",
            Refusal::Invalid(KeyError::NotYetValid) => "unauthorized: the token is not valid yet",
            Refusal::Invalid(KeyError::UnknownKey | KeyError::MissingKid) => {
                "unauthorized: the token's key is unknown"
            }
            Refusal::Invalid(KeyError::Claims(_)) => "unauthorized: the token's claims are refused",
            Refusal::Invalid(KeyError::ScopeExceeded) => {
                "unauthorized: the token exceeds its key's scope"
            }
            Refusal::Invalid(_) => "unauthorized: the token does not verify",
            Refusal::RootMismatch => "unauthorized: the path is outside the token's root",
            Refusal::NoAccess => "unauthorized: nothing is granted at this path",
            Refusal::Role => "unauthorized: the token does not grant the declared role",
        }
    }
}

/// The relay's credential for the sessions it opens to its own listen port
/// (the recorder's subscribers, the replay publisher): a random token made
/// once per process, presented as `?jwt=` on the dialed root path, granting
/// publish and subscribe over the whole tree. It is never written to a log
/// or a file, so only this process knows it; it is not a JWT, so no key
/// verifies it.
pub fn internal_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut bytes = [0u8; 32];
        rustls::crypto::aws_lc_rs::default_provider()
            .secure_random
            .fill(&mut bytes)
            .expect("the system's random source is unavailable");
        let mut token = String::from("skiff-internal.");
        for b in bytes {
            let _ = write!(token, "{b:02x}");
        }
        token
    })
}

/// Whether `presented` is [`internal_token`], compared in constant time.
fn is_internal(presented: &str) -> bool {
    let want = internal_token().as_bytes();
    let got = presented.as_bytes();
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// Publish and subscribe over the whole tree.
fn everything() -> Access {
    Access {
        publish: Patterns::from(moq_pattern::Pattern::all()),
        subscribe: Patterns::from(moq_pattern::Pattern::all()),
    }
}

/// What an admitted session may do, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Its broadcasts, from the relay's root.
    pub access: Access,
    /// `exp` of its token (unix seconds), if any: the session ends then.
    pub expires: Option<i64>,
}

/// The relay's access policy: the keys tokens are verified with and the
/// patterns anonymous sessions get.
#[derive(Debug, Default)]
pub struct Auth {
    keys: Option<Keys>,
    public: Patterns,
    /// Refuse everyone (the configured keys could not be read).
    closed: bool,
}

impl Auth {
    /// A policy with `keys` (if any) and anonymous access to `public`
    /// (publish and subscribe, rooted at the relay's root).
    pub fn new(keys: Option<Keys>, public: Patterns) -> Self {
        Auth {
            keys,
            public,
            closed: false,
        }
    }

    /// A policy that refuses every session.
    pub fn refuse_all() -> Self {
        Auth {
            closed: true,
            ..Auth::default()
        }
    }

    /// Whether the relay lets everyone do everything (no keys, no public patterns).
    pub fn is_open(&self) -> bool {
        !self.closed && self.keys.is_none() && self.public.is_empty()
    }

    /// Decides a session (docs/protocol.md §4.10). `dialed` is the path and
    /// query as dialed (the SETUP path on TCP, the request URI over
    /// WebSocket), `setup_token` SETUP's authorization token if the
    /// transport carries one, `role` the declared role, `now` the wall clock.
    ///
    /// The token is the `jwt` query parameter or the SETUP token; the same
    /// token in both counts once, two different ones are refused. A token
    /// that does not verify is refused, never treated as anonymous.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn admit(
        &self,
        dialed: Option<&str>,
        setup_token: Option<SetupToken<'_>>,
        role: Role,
        now: SystemTime,
    ) -> Result<Grant, Refusal> {
        if self.is_open() {
            return Ok(Grant {
                access: everything(),
                expires: None,
            });
        }
        let (path, query_jwt) = path::split_dialed(dialed.unwrap_or(""));
        let jwt = match (setup_token, query_jwt) {
            (Some(t), Some(q)) if t.kind == SetupToken::JWT && t.value == q.as_bytes() => Some(q),
            (Some(_), Some(_)) => return Err(Refusal::TwoTokens),
            (Some(t), None) if t.kind == SetupToken::JWT => Some(
                std::str::from_utf8(t.value)
                    .map_err(|_| Refusal::Invalid(KeyError::Signature("not UTF-8".into())))?,
            ),
            (Some(_), None) => return Err(Refusal::UnsupportedToken),
            (None, q) => q,
        };
        if path.trim_matches('/').is_empty() && jwt.is_some_and(is_internal) {
            return Ok(Grant {
                access: everything(),
                expires: None,
            });
        }
        let (claims, anonymous) = match jwt {
            Some(jwt) => {
                let keys = self.keys.as_ref().ok_or(Refusal::NoKeys)?;
                (keys.verify(jwt, now)?, false)
            }
            None => {
                if self.public.is_empty() {
                    return Err(Refusal::TokenRequired);
                }
                let public = Claims {
                    publish: self.public.clone(),
                    subscribe: self.public.clone(),
                    ..Default::default()
                };
                (public, true)
            }
        };
        let access = claims.authorize(path).map_err(|e| match (e, anonymous) {
            (_, true) => Refusal::TokenRequired,
            (ClaimsError::RootMismatch, _) => Refusal::RootMismatch,
            (ClaimsError::NoAccess, _) => Refusal::NoAccess,
            (e, _) => Refusal::Invalid(KeyError::Claims(e)),
        })?;
        let wanted = match role {
            Role::Publisher => !access.publish.is_empty(),
            Role::Subscriber => !access.subscribe.is_empty(),
            Role::Both => true,
        };
        if !wanted {
            return Err(Refusal::Role);
        }
        Ok(Grant {
            access,
            expires: claims.expires,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use std::time::Duration;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn key_file(name: &str) -> std::path::PathBuf {
        let k = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(SECRET);
        let p = std::env::temp_dir().join(format!("skiff-auth-{}-{name}.jwk", std::process::id()));
        std::fs::write(&p, format!(r#"{{"kty":"oct","alg":"HS256","k":"{k}"}}"#)).unwrap();
        p
    }

    fn sign(payload: serde_json::Value) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &payload,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
    }

    fn pats(texts: &[&str]) -> Patterns {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1000)
    }

    fn with_keys(name: &str, public: &[&str]) -> Auth {
        Auth::new(Some(Keys::file(key_file(name)).unwrap()), pats(public))
    }

    #[test]
    fn open_relay_admits_everyone() {
        let a = Auth::default();
        assert!(a.is_open());
        let g = a.admit(None, None, Role::Both, now()).unwrap();
        assert!(g.access.publish.matches("any/thing"));
    }

    #[test]
    fn the_relays_own_token_opens_the_whole_tree_at_the_root_only() {
        let a = with_keys("internal", &[]);
        let own = format!("/?jwt={}", internal_token());
        let g = a.admit(Some(&own), None, Role::Both, now()).unwrap();
        assert!(g.access.publish.matches("any/thing/replay"));
        assert!(g.access.subscribe.matches("any/thing"));
        assert_eq!(g.expires, None);
        // One character off, or under a path, it is just an invalid token.
        let mut wrong = internal_token().to_string();
        let last = if wrong.ends_with('0') { "1" } else { "0" };
        wrong.replace_range(wrong.len() - 1.., last);
        assert!(matches!(
            a.admit(Some(&format!("/?jwt={wrong}")), None, Role::Both, now()),
            Err(Refusal::Invalid(_))
        ));
        let under = format!("/room?jwt={}", internal_token());
        assert!(matches!(
            a.admit(Some(&under), None, Role::Both, now()),
            Err(Refusal::Invalid(_))
        ));
        assert_eq!(internal_token(), internal_token());
    }

    #[test]
    fn token_in_the_query_or_setup() {
        let a = with_keys("places", &[]);
        let t = sign(serde_json::json!({"root":"room","publish":["**"],"exp":2000}));
        let dialed = format!("/room?jwt={t}");
        let g = a.admit(Some(&dialed), None, Role::Both, now()).unwrap();
        assert_eq!(g.access.publish, pats(&["room/**"]));
        assert_eq!(g.expires, Some(2000));
        let setup = SetupToken {
            kind: 0,
            value: t.as_bytes(),
        };
        assert!(
            a.admit(Some("/room"), Some(setup), Role::Both, now())
                .is_ok()
        );
        // The same token twice counts once.
        assert!(
            a.admit(Some(&dialed), Some(setup), Role::Both, now())
                .is_ok()
        );
        let other = sign(serde_json::json!({"root":"room","subscribe":["**"]}));
        let two = SetupToken {
            kind: 0,
            value: other.as_bytes(),
        };
        assert_eq!(
            a.admit(Some(&dialed), Some(two), Role::Both, now()),
            Err(Refusal::TwoTokens)
        );
        let cat = SetupToken {
            kind: 1,
            value: t.as_bytes(),
        };
        assert_eq!(
            a.admit(Some("/room"), Some(cat), Role::Both, now()),
            Err(Refusal::UnsupportedToken)
        );
    }

    #[test]
    fn anonymous_access_follows_the_public_patterns() {
        let a = with_keys("public", &["anon/**"]);
        let g = a
            .admit(Some("/anon/room"), None, Role::Both, now())
            .unwrap();
        assert_eq!(g.access.subscribe, pats(&["anon/room/**"]));
        assert!(a.admit(Some("/"), None, Role::Both, now()).is_ok());
        assert_eq!(
            a.admit(Some("/other"), None, Role::Both, now()),
            Err(Refusal::TokenRequired)
        );
        // A bad token is never anonymous.
        assert!(matches!(
            a.admit(Some("/anon?jwt=bad"), None, Role::Both, now()),
            Err(Refusal::Invalid(_))
        ));
        let no_keys = Auth::new(None, pats(&["anon/**"]));
        assert_eq!(
            no_keys.admit(Some("/anon?jwt=x"), None, Role::Both, now()),
            Err(Refusal::NoKeys)
        );
        let closed = with_keys("closed", &[]);
        assert_eq!(
            closed.admit(Some("/anon"), None, Role::Both, now()),
            Err(Refusal::TokenRequired)
        );
    }

    #[test]
    fn paths_roles_and_times() {
        let a = with_keys("paths", &[]);
        let t = sign(serde_json::json!({"root":"room","publish":["alice/**"],"subscribe":["bob"]}));
        let at = |p: &str, role| a.admit(Some(&format!("{p}?jwt={t}")), None, role, now());
        assert_eq!(at("/other", Role::Both), Err(Refusal::RootMismatch));
        assert_eq!(at("/room/carol", Role::Both), Err(Refusal::NoAccess));
        assert_eq!(at("/room/alice", Role::Subscriber), Err(Refusal::Role));
        assert!(at("/room/alice", Role::Publisher).is_ok());
        let expired = sign(serde_json::json!({"publish":["**"],"exp":1000}));
        assert_eq!(
            a.admit(Some(&format!("/?jwt={expired}")), None, Role::Both, now()),
            Err(Refusal::Invalid(KeyError::Expired))
        );
        let early = sign(serde_json::json!({"publish":["**"],"nbf":1001}));
        assert_eq!(
            a.admit(Some(&format!("/?jwt={early}")), None, Role::Both, now()),
            Err(Refusal::Invalid(KeyError::NotYetValid))
        );
    }
}
