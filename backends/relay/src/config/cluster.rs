//! The cluster settings' value types: a peer to dial ([`ClusterPeer`], from
//! `--cluster-connect` or a peer list), the source of a peer list re-read at
//! run time ([`PeerListSource`], `--cluster-connect-api`), and the parser of
//! such a list ([`parse_peer_list`]). The rules are moq-relay 0.17.10's, so
//! one peer list serves a mixed cluster (README "Running a cluster").

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

use super::values::{ParseValueError, Upstream};

/// Largest `--cluster-id`: hop ids are QUIC varints (below 2^62).
pub const MAX_CLUSTER_ID: u64 = (1 << 62) - 1;

/// Hop ids at or above this do not fit older JavaScript clients, which read
/// them as 53-bit integers.
pub const JS_SAFE_CLUSTER_ID: u64 = 1 << 53;

/// Longest hop list accepted or forwarded (`--cluster-max-hops` at most).
pub const MAX_CLUSTER_HOPS: usize = 32;

/// The token a `--cluster-token` file holds: its text trimmed, not empty.
///
/// # Errors
/// The file cannot be read or holds only whitespace; the message names the
/// file, never its content.
pub fn read_token(file: &std::path::Path) -> Result<String, String> {
    match std::fs::read_to_string(file) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_owned()),
        Ok(_) => Err(format!("{} is empty", file.display())),
        Err(e) => Err(format!("cannot read {}: {e}", file.display())),
    }
}

/// One cluster peer to dial: where (a URL `--upstream` accepts, without the
/// `cost` and `jwt` query parameters), the link's cost and its own token.
///
/// Written as a URL (`tcp://b.example:4443/?cost=2&jwt=TOKEN`) or, in TOML
/// and peer lists, as an object `{url, cost, egress, token}`. `cost` is
/// parsed and kept but not sent: moq-lite-05 has no cost on the wire
/// (docs/protocol.md §3.5), so routes are ranked by hop count alone.
/// `egress` must equal `cost` (asymmetric costs are refused, as by
/// moq-relay). An object that sets `cost` or `token` while its URL carries
/// `?cost=` or `?jwt=` is refused rather than given a precedence.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterPeer {
    /// Where to dial; its path (and any other query parameter) goes in SETUP.
    pub addr: Upstream,
    /// The link's price (`?cost=N`); `None`: 1.
    pub cost: Option<u64>,
    /// The token presented to this peer instead of `--cluster-token`.
    pub token: Option<String>,
}

impl fmt::Debug for ClusterPeer {
    /// The token is never shown (configurations are logged and compared in tests).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterPeer")
            .field("url", &format_args!("{}", self.addr))
            .field("cost", &self.cost)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish()
    }
}

impl fmt::Display for ClusterPeer {
    /// The peer's identity: its URL without any query (which may hold a token).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

impl ClusterPeer {
    /// The peer's identity: scheme, host, port and path, without the query
    /// (two entries with the same key are one peer).
    pub fn key(&self) -> String {
        let a = &self.addr;
        let path = a.path.split_once('?').map_or(a.path.as_str(), |(p, _)| p);
        let path = path.trim_matches('/');
        let scheme = a.scheme.name();
        let host = a.host.to_ascii_lowercase();
        if host.contains(':') {
            format!("{scheme}://[{host}]:{}/{path}", a.port)
        } else {
            format!("{scheme}://{host}:{}/{path}", a.port)
        }
    }

    /// The peer of an object entry: `url` with `cost`, `egress` and `token`
    /// applied (see the type's docs for what is refused).
    fn from_parts(
        url: &str,
        cost: Option<u64>,
        egress: Option<u64>,
        token: Option<String>,
    ) -> Result<Self, ParseValueError> {
        let mut peer: ClusterPeer = url.parse()?;
        if (cost.is_some() || egress.is_some()) && peer.cost.is_some() {
            return Err(ParseValueError(format!(
                "peer {peer} sets cost alongside a URL ?cost=; use one or the other"
            )));
        }
        let token = token.filter(|t| !t.is_empty());
        if token.is_some() && peer.token.is_some() {
            return Err(ParseValueError(format!(
                "peer {peer} sets token alongside a URL ?jwt=; use one or the other"
            )));
        }
        peer.cost = cost.or(peer.cost);
        let charged = peer.cost.unwrap_or(1);
        if egress.unwrap_or(charged) != charged {
            return Err(ParseValueError(format!(
                "peer {peer} sets egress different from cost; asymmetric costs are not supported"
            )));
        }
        if token.is_some() {
            peer.token = token;
        }
        Ok(peer)
    }
}

impl FromStr for ClusterPeer {
    type Err = ParseValueError;

    /// A peer URL: `tcp://`, `tls://` or `moql://` with a port, as
    /// `--upstream`; `?cost=N` (a whole number) and `?jwt=TOKEN` are taken
    /// out of the query, any other parameter stays. A bare `host:port` is
    /// refused (moq-relay refuses it too). An error never repeats the query.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (base, query) = s.split_once('?').unwrap_or((s, ""));
        if !base.contains("://") {
            return Err(ParseValueError(format!(
                "`{base}` is not a URL: write the whole URL, such as tcp://{base}/"
            )));
        }
        let mut cost = None;
        let mut token = None;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "cost" => {
                    let n = value.parse::<u64>().map_err(|_| {
                        ParseValueError(format!("cluster peer {base}: cost must be a whole number"))
                    })?;
                    cost = Some(n);
                }
                // The last non-empty `jwt` counts (docs/protocol.md §4.10).
                "jwt" if !value.is_empty() => token = Some(value.to_owned()),
                "jwt" => {}
                _ => kept.push(pair),
            }
        }
        let mut url = base.to_owned();
        if !kept.is_empty() {
            url.push('?');
            url.push_str(&kept.join("&"));
        }
        let addr: Upstream = url.parse().map_err(|e: ParseValueError| {
            ParseValueError(format!("cluster peer: {}", e.0.replace(&url, base)))
        })?;
        Ok(ClusterPeer { addr, cost, token })
    }
}

impl<'de> Deserialize<'de> for ClusterPeer {
    /// A URL string, or an object with `url` and optionally `cost`,
    /// `egress` and `token` (any other field is refused).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Object {
            url: String,
            #[serde(default)]
            cost: Option<u64>,
            #[serde(default)]
            egress: Option<u64>,
            #[serde(default)]
            token: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Url(String),
            Object(Object),
        }
        let raw = Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "a cluster peer is a URL string or an object with url, cost, egress and token",
            )
        })?;
        match raw {
            Raw::Url(url) => url.parse().map_err(serde::de::Error::custom),
            Raw::Object(o) => ClusterPeer::from_parts(&o.url, o.cost, o.egress, o.token)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// Where `--cluster-connect-api` reads the peer list: a file (watched by its
/// modification time) or an `http://`/`https://` URL (polled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerListSource {
    /// A local file holding a JSON array of peers (`file://` URLs too).
    File(PathBuf),
    /// An HTTP(S) URL answering with a JSON array of peers.
    Http(String),
}

impl fmt::Display for PeerListSource {
    /// The file, or the URL without its query (which may hold a token).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerListSource::File(p) => write!(f, "{}", p.display()),
            PeerListSource::Http(url) => match url.split_once('?') {
                Some((base, _)) => write!(f, "{base}?…"),
                None => f.write_str(url),
            },
        }
    }
}

impl FromStr for PeerListSource {
    type Err = ParseValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ParseValueError("name a file or an http(s):// URL".into()));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            return Ok(PeerListSource::Http(s.to_owned()));
        }
        if let Some(path) = s.strip_prefix("file://") {
            return Ok(PeerListSource::File(PathBuf::from(path)));
        }
        if s.contains("://") {
            return Err(ParseValueError(format!(
                "`{s}` must be a file, a file:// URL or an http(s):// URL"
            )));
        }
        Ok(PeerListSource::File(PathBuf::from(s)))
    }
}

/// Why a peer list was not taken (the last good one stays in use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerListError(pub String);

impl fmt::Display for PeerListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerListError {}

/// The peers of a list (`--cluster-connect`, or a JSON array read from
/// `--cluster-connect-api`), one per identity ([`ClusterPeer::key`]), in
/// the list's order, without the one whose identity is `node`'s
/// (`--cluster-node`: this relay). An entry repeated with a different cost
/// or token refuses the whole list, as a bad entry does: a list is taken
/// whole or not at all.
///
/// # Errors
/// A bad entry (with its index) or conflicting repeats.
pub fn parse_peer_list(
    list: Vec<ClusterPeer>,
    node: Option<&str>,
) -> Result<Vec<ClusterPeer>, PeerListError> {
    let own = node.and_then(|n| n.parse::<ClusterPeer>().ok().map(|p| p.key()));
    let mut out: Vec<ClusterPeer> = Vec::with_capacity(list.len());
    for peer in list {
        let key = peer.key();
        if own.as_deref() == Some(key.as_str()) {
            continue;
        }
        match out.iter().find(|p| p.key() == key) {
            Some(p) if *p == peer => {}
            Some(_) => {
                return Err(PeerListError(format!(
                    "peer {key} is listed twice with different settings"
                )));
            }
            None => out.push(peer),
        }
    }
    Ok(out)
}

/// The peers of a JSON peer list (an array of URL strings and objects),
/// as [`parse_peer_list`] takes them.
///
/// # Errors
/// Not a JSON array of peers, or as [`parse_peer_list`].
pub fn parse_peer_list_json(
    text: &str,
    node: Option<&str>,
) -> Result<Vec<ClusterPeer>, PeerListError> {
    let values: Vec<serde_json::Value> = serde_json::from_str(text)
        .map_err(|e| PeerListError(format!("not a JSON array of peers: {e}")))?;
    let mut list = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let peer = ClusterPeer::deserialize(v)
            .map_err(|e| PeerListError(format!("invalid peer at index {i}: {e}")))?;
        list.push(peer);
    }
    parse_peer_list(list, node)
}

/// Deserializes `cluster-connect` from TOML: one peer (a URL or an
/// object) or an array of them.
pub(super) fn one_or_many<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<ClusterPeer>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        Many(Vec<serde_json::Value>),
        One(serde_json::Value),
    }
    let values = match OneOrMany::deserialize(d)? {
        OneOrMany::Many(v) => v,
        OneOrMany::One(v) => vec![v],
    };
    let mut peers = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let peer = ClusterPeer::deserialize(v)
            .map_err(|e| serde::de::Error::custom(format!("cluster peer at index {i}: {e}")))?;
        peers.push(peer);
    }
    Ok(Some(peers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamScheme;

    #[test]
    fn peer_urls_take_cost_and_token_out_of_the_query() {
        let p: ClusterPeer = "tcp://b.example:4443/?cost=3&jwt=SECRET&x=1"
            .parse()
            .unwrap();
        assert_eq!(p.cost, Some(3));
        assert_eq!(p.token.as_deref(), Some("SECRET"));
        assert_eq!(p.addr.path, "?x=1");
        assert_eq!(p.addr.scheme, UpstreamScheme::Tcp);
        assert_eq!(p.key(), "tcp://b.example:4443/");
        assert!(!format!("{p:?}").contains("SECRET"));
        assert!(!format!("{p}").contains("SECRET"));
        let p: ClusterPeer = "moql://[::1]:4443/live".parse().unwrap();
        assert_eq!(p.key(), "moql://[::1]:4443/live");
        assert_eq!((p.cost, p.token), (None, None));
    }

    #[test]
    fn bad_peer_urls_are_refused_without_their_token() {
        for bad in [
            "b.example:4443",
            "http://b.example:4443/",
            "tcp://b.example/",
            "tcp://b.example:4443/?cost=cheap&jwt=SECRET",
            "tcp://b.example:0/?jwt=SECRET",
        ] {
            let e = bad.parse::<ClusterPeer>().unwrap_err();
            assert!(!e.0.contains("SECRET"), "{bad}: {e}");
        }
    }

    #[test]
    fn objects_follow_moq_relays_rules() {
        let list = parse_peer_list_json(
            r#"["tcp://a:1/", {"url": "tcp://b:2/", "cost": 2, "token": "T"}, {"url": "tcp://c:3/", "cost": 4, "egress": 4}]"#,
            None,
        )
        .unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[1].cost, Some(2));
        assert_eq!(list[1].token.as_deref(), Some("T"));
        for bad in [
            r#"[{"url": "tcp://b:2/?cost=1", "cost": 2}]"#,
            r#"[{"url": "tcp://b:2/?jwt=A", "token": "B"}]"#,
            r#"[{"url": "tcp://b:2/", "cost": 2, "egress": 3}]"#,
            r#"[{"url": "tcp://b:2/", "colour": "red"}]"#,
            r#"["tcp://b:2/?cost=1", "tcp://b:2/?cost=2"]"#,
            r#"{"url": "tcp://b:2/"}"#,
            r#"[3]"#,
        ] {
            assert!(parse_peer_list_json(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_own_node_and_repeats_are_skipped() {
        let list = parse_peer_list_json(
            r#"["tcp://a:1/", "tcp://A:1/?jwt=X", "tcp://b:2/", "tcp://b:2"]"#,
            Some("tcp://a:1"),
        );
        // `a` is listed twice with different tokens, which would conflict,
        // but it is this node: it is skipped before repeats are compared.
        let keys: Vec<String> = list.unwrap().iter().map(ClusterPeer::key).collect();
        assert_eq!(keys, ["tcp://b:2/"]);
    }

    #[test]
    fn list_sources() {
        assert_eq!(
            "peers.json".parse::<PeerListSource>(),
            Ok(PeerListSource::File("peers.json".into()))
        );
        assert_eq!(
            "file:///etc/peers.json".parse::<PeerListSource>(),
            Ok(PeerListSource::File("/etc/peers.json".into()))
        );
        assert!(matches!(
            "https://api.example/peers?key=K".parse::<PeerListSource>(),
            Ok(PeerListSource::Http(_))
        ));
        let shown = "https://api.example/peers?key=K"
            .parse::<PeerListSource>()
            .unwrap()
            .to_string();
        assert!(!shown.contains('K'), "{shown}");
        assert!("ftp://x/peers".parse::<PeerListSource>().is_err());
    }
}
