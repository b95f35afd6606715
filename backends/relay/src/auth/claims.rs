//! The claims of a token (docs/protocol.md §4.10): what moq-dev's issuers
//! write, read with the same rules, and scoped to the path a session dialed.

use moq_pattern::{Pattern, Patterns};
use serde::{Deserialize, Deserializer};

use super::path;

/// Why claims were refused or grant nothing at a path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimsError {
    /// The claims JSON does not decode (unknown claim, bad pattern, mixed encodings).
    #[error("malformed claims: {0}")]
    Malformed(String),
    /// Neither `publish` nor `subscribe` grants anything.
    #[error("the token grants neither publish nor subscribe")]
    Useless,
    /// The dialed path is neither under the token's root nor a parent of it.
    #[error("the dialed path does not overlap the token root")]
    RootMismatch,
    /// The path overlaps the root but no grant reaches it.
    #[error("the token grants nothing at the dialed path")]
    NoAccess,
}

/// The verified payload of a token: a root and the patterns granted below it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Wire")]
pub struct Claims {
    /// The path the patterns are relative to (`""`: the relay's root).
    pub root: String,
    /// Broadcasts the holder may publish, relative to `root`.
    pub publish: Patterns,
    /// Broadcasts the holder may subscribe to, relative to `root`.
    pub subscribe: Patterns,
    /// `exp`: unix seconds at which the token stops being valid.
    pub expires: Option<i64>,
    /// `nbf`: unix seconds before which the token is not valid yet.
    pub not_before: Option<i64>,
    /// `iat`: unix seconds at which it was issued (informative).
    pub issued: Option<i64>,
}

/// The wire form: unknown claims are refused, since one may be meant to
/// narrow the grant and a misspelled `root` would widen it.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Wire {
    root: String,
    #[serde(deserialize_with = "present")]
    put: Option<Prefixes>,
    #[serde(deserialize_with = "present")]
    get: Option<Prefixes>,
    #[serde(deserialize_with = "present")]
    publish: Option<Patterns>,
    #[serde(deserialize_with = "present")]
    subscribe: Option<Patterns>,
    exp: Option<i64>,
    nbf: Option<i64>,
    iat: Option<i64>,
    // Registered claims that narrow nothing: accepted and ignored.
    iss: Option<serde::de::IgnoredAny>,
    sub: Option<serde::de::IgnoredAny>,
    jti: Option<serde::de::IgnoredAny>,
}

/// The older `put`/`get` form: one prefix or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prefixes {
    One(String),
    Many(Vec<String>),
}

impl Prefixes {
    fn into_vec(self) -> Vec<String> {
        match self {
            Prefixes::One(p) => vec![p],
            Prefixes::Many(v) => v,
        }
    }
}

/// A field that is present must hold a value: an explicit `null` is refused,
/// so it cannot hide one encoding from the mixed-encoding check.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// Prefix `p` of the older form is the subtree `p/**` (`""`: everything).
fn subtrees(prefixes: Option<Prefixes>) -> Result<Patterns, ClaimsError> {
    prefixes
        .map(Prefixes::into_vec)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            Pattern::subtree(p)
                .map_err(|e| ClaimsError::Malformed(format!("legacy prefix {p:?}: {e}")))
        })
        .collect()
}

impl Claims {
    /// Decodes the JSON payload of a token.
    ///
    /// # Errors
    /// [`ClaimsError::Malformed`] for JSON that does not decode, an unknown
    /// claim, a bad pattern, or `put`/`get` mixed with `publish`/`subscribe`.
    pub fn from_json(json: &[u8]) -> Result<Self, ClaimsError> {
        let w: Wire =
            serde_json::from_slice(json).map_err(|e| ClaimsError::Malformed(e.to_string()))?;
        Self::try_from(w)
    }

    /// Refuses claims that grant nothing at all.
    ///
    /// # Errors
    /// [`ClaimsError::Useless`].
    pub fn validate(&self) -> Result<(), ClaimsError> {
        if self.publish.is_empty() && self.subscribe.is_empty() {
            return Err(ClaimsError::Useless);
        }
        Ok(())
    }

    /// What the claims grant a session that dialed `dialed` (a path without
    /// its query), as patterns relative to the relay's root
    /// (docs/protocol.md §4.10): a path under the token's root narrows the
    /// grant to what reaches below it, a parent of the root keeps it whole,
    /// an unrelated path is refused.
    ///
    /// # Errors
    /// [`ClaimsError::RootMismatch`], or [`ClaimsError::NoAccess`] when
    /// nothing granted reaches the path.
    pub fn authorize(&self, dialed: &str) -> Result<Access, ClaimsError> {
        let dialed = path::normalize(dialed);
        let root = path::normalize(&self.root);
        let scope = |patterns: &Patterns| -> Result<Patterns, ClaimsError> {
            if let Some(below) = path::strip_prefix(&dialed, &root) {
                // The session reaches into the grant: keep what each pattern
                // says below the dialed path, named from the relay's root.
                patterns
                    .rebase(below)
                    .rooted(&dialed)
                    .map_err(|e| ClaimsError::Malformed(e.to_string()))
            } else if path::strip_prefix(&root, &dialed).is_some() {
                // The dialed path is a parent of the root: the whole grant.
                patterns
                    .rooted(&root)
                    .map_err(|e| ClaimsError::Malformed(e.to_string()))
            } else {
                Err(ClaimsError::RootMismatch)
            }
        };
        let access = Access {
            publish: scope(&self.publish)?,
            subscribe: scope(&self.subscribe)?,
        };
        if access.is_empty() {
            return Err(ClaimsError::NoAccess);
        }
        Ok(access)
    }
}

impl TryFrom<Wire> for Claims {
    type Error = ClaimsError;

    fn try_from(w: Wire) -> Result<Self, ClaimsError> {
        let legacy = w.put.is_some() || w.get.is_some();
        let (publish, subscribe) = if legacy {
            if w.publish.is_some() || w.subscribe.is_some() {
                return Err(ClaimsError::Malformed(
                    "mixes put/get with publish/subscribe".into(),
                ));
            }
            (subtrees(w.put)?, subtrees(w.get)?)
        } else {
            (
                w.publish.unwrap_or_default(),
                w.subscribe.unwrap_or_default(),
            )
        };
        Ok(Claims {
            root: w.root,
            publish,
            subscribe,
            expires: w.exp,
            not_before: w.nbf,
            issued: w.iat,
        })
    }
}

/// What a session may do, as broadcast patterns from the relay's root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Broadcasts the session may announce.
    pub publish: Patterns,
    /// Broadcasts the session may learn of and subscribe to.
    pub subscribe: Patterns,
}

impl Access {
    /// Whether nothing is granted (a refusal).
    pub fn is_empty(&self) -> bool {
        self.publish.is_empty() && self.subscribe.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pats(texts: &[&str]) -> Patterns {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    fn claims(root: &str, publish: &[&str], subscribe: &[&str]) -> Claims {
        Claims {
            root: root.into(),
            publish: pats(publish),
            subscribe: pats(subscribe),
            ..Default::default()
        }
    }

    // ---- decoding ----

    #[test]
    fn patterns_and_times_decode() {
        let c = Claims::from_json(
            br#"{"root":"live","publish":["cam"],"subscribe":["**"],"exp":20,"nbf":10,"iat":5,"iss":"x","sub":1,"jti":[1]}"#,
        )
        .unwrap();
        assert_eq!(c.root, "live");
        assert_eq!(c.publish, pats(&["cam"]));
        assert_eq!(c.subscribe, pats(&["**"]));
        assert_eq!(
            (c.expires, c.not_before, c.issued),
            (Some(20), Some(10), Some(5))
        );
    }

    #[test]
    fn legacy_prefixes_are_subtrees() {
        let c = Claims::from_json(br#"{"root":"t","put":["a","/b//c/"],"get":""}"#).unwrap();
        assert_eq!(c.publish, pats(&["a/**", "b/c/**"]));
        assert_eq!(c.subscribe, pats(&["**"]));
        let empty = Claims::from_json(br#"{"put":[]}"#).unwrap();
        assert_eq!(empty.validate(), Err(ClaimsError::Useless));
    }

    #[test]
    fn unknown_null_mixed_and_bad_are_refused() {
        for json in [
            r#"{"root":"t","publish":["a"],"get":["b"]}"#,
            r#"{"put":["a"],"cluster":true}"#,
            r#"{"put":null,"publish":["a"]}"#,
            r#"{"publish":null}"#,
            r#"{"put":["a/*"]}"#,
            r#"{"publish":["a/**/b/**"]}"#,
            r#"{"rot":"typo","publish":["**"]}"#,
            r#"{"exp":"soon","publish":["**"]}"#,
            r#"not json"#,
        ] {
            assert!(
                matches!(
                    Claims::from_json(json.as_bytes()),
                    Err(ClaimsError::Malformed(_))
                ),
                "{json}"
            );
        }
    }

    #[test]
    fn both_roles_empty_is_useless() {
        assert_eq!(claims("a", &[], &[]).validate(), Err(ClaimsError::Useless));
        assert!(claims("a", &["x"], &[]).validate().is_ok());
    }

    // ---- the dialed path ----

    #[test]
    fn dialing_the_root_keeps_the_grant() {
        let a = claims("room/1", &["alice/**"], &["**"])
            .authorize("/room/1")
            .unwrap();
        assert_eq!(a.publish, pats(&["room/1/alice/**"]));
        assert_eq!(a.subscribe, pats(&["room/1/**"]));
    }

    #[test]
    fn dialing_below_the_root_narrows() {
        let a = claims("room/1", &["alice/**"], &["bob/**"])
            .authorize("room/1/alice")
            .unwrap();
        assert_eq!(a.publish, pats(&["room/1/alice/**"]));
        assert!(a.subscribe.is_empty());
        // A literal reached exactly is the dialed path itself.
        let a = claims("room", &["alice"], &[])
            .authorize("room/alice")
            .unwrap();
        assert_eq!(a.publish, pats(&["room/alice"]));
    }

    #[test]
    fn dialing_a_parent_keeps_the_root() {
        let a = claims("demo", &["alice/**"], &["**"])
            .authorize("/")
            .unwrap();
        assert_eq!(a.publish, pats(&["demo/alice/**"]));
        assert_eq!(a.subscribe, pats(&["demo/**"]));
    }

    #[test]
    fn unrelated_and_unreached_paths_are_refused() {
        let c = claims("demo", &["**"], &["**"]);
        assert_eq!(c.authorize("other"), Err(ClaimsError::RootMismatch));
        // Segment boundaries: "demo" does not cover "demolition".
        assert_eq!(c.authorize("demolition"), Err(ClaimsError::RootMismatch));
        let c = claims("", &[], &["demo/**"]);
        assert_eq!(c.authorize("other"), Err(ClaimsError::NoAccess));
    }

    #[test]
    fn access_matches_broadcasts() {
        let a = claims("live", &["cam"], &["**"]).authorize("").unwrap();
        assert!(a.publish.matches("live/cam"));
        assert!(!a.publish.matches("live/cam/hd"));
        assert!(a.subscribe.matches("live/anything/deep"));
        assert!(!a.subscribe.matches("lively"));
    }
}
