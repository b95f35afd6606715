//! What the relay's log lines call a connection: [`ConnName`].
//!
//! Every session the relay runs has a numeric id, which the core uses to
//! tell its sources apart ([`ConnName::id`]). An operator reads the name
//! instead: an accepted client by its transport and address, with the
//! worker that accepted it and its number there (`tls 192.0.2.7:50312
//! w1#7`), a link between two workers as a link (`link w0→w1`), and a
//! worker's session with the upstream relay by the URL it dialed, its query
//! left out, as it may hold a token (`upstream
//! tcp://relay.example:4443/live?… w0 dial 3`).
//!
//! The name is `Copy` and formats itself into the log line's formatter, so
//! a line that is not enabled costs nothing to write. Log lines print it
//! with `?`: its [`fmt::Debug`] form is quoted, as a string field's is
//! (`conn="tls 192.0.2.7:50312 #7"`), so a reader or a parser sees where
//! the value ends; [`fmt::Display`] writes the bare name.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};

/// Ids of worker link sessions: this base plus the other worker's index
/// (above any id an accepted connection takes).
const LINK_ID_BASE: u64 = u64::MAX / 2;
/// Ids of upstream sessions: this base plus the dial's number (after the
/// link ids).
const UPSTREAM_ID_BASE: u64 = LINK_ID_BASE + (1 << 32);

/// How an accepted connection's bytes travel, as far as the relay has
/// learned: a connection starts as `tcp` and is refined once its TLS
/// handshake is done or its first bytes are an HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain TCP: QMux, or bytes not read yet.
    Tcp,
    /// QMux over TLS, or a TLS connection whose first bytes are not read yet.
    Tls,
    /// An HTTP request over plain TCP (a page, a file, or an upgrade on its way).
    Http,
    /// An HTTP request over TLS.
    Https,
    /// QMux over a WebSocket on plain TCP.
    Ws,
    /// QMux over a WebSocket on TLS.
    Wss,
    /// moq-lite over QUIC streams (docs/protocol.md §11).
    Quic,
}

impl Transport {
    /// The word a log line shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Http => "http",
            Transport::Https => "https",
            Transport::Ws => "ws",
            Transport::Wss => "wss",
            Transport::Quic => "quic",
        }
    }
}

/// A relay session's id and what its log lines call it (see the module
/// docs); log it with `?` (quoted), format it with `{}` (bare).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConnName {
    id: u64,
    kind: Kind,
}

/// What is at the other end of the session.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A client connection accepted by worker `worker`.
    Client {
        ip: IpAddr,
        port: u16,
        transport: Transport,
        worker: u16,
    },
    /// The link from worker `from` (this one) to worker `to`.
    Link { from: u16, to: u16 },
    /// Worker `worker`'s session with the upstream relay dialed at `url`
    /// (the dial's number is the id's offset from [`UPSTREAM_ID_BASE`]).
    Upstream { url: &'static str, worker: u16 },
    /// Worker `worker`'s session with the cluster peer dialed at `url`
    /// (the dial's number is the low bits of the id's offset from
    /// [`UPSTREAM_ID_BASE`], the peer's slot the bits above).
    Peer { url: &'static str, worker: u16 },
}

/// Bits of a cluster peer session's id that count its dials.
const PEER_DIAL_BITS: u32 = 40;

impl ConnName {
    /// Client connection number `id` of worker `worker`, from `peer`, over
    /// plain TCP until it says more.
    pub fn client(worker: usize, id: u64, peer: SocketAddr) -> Self {
        ConnName {
            id,
            kind: Kind::Client {
                ip: peer.ip(),
                port: peer.port(),
                transport: Transport::Tcp,
                worker: worker_index(worker),
            },
        }
    }

    /// QUIC connection number `id` of worker `worker`, from `peer`.
    pub fn quic(worker: usize, id: u64, peer: SocketAddr) -> Self {
        Self::client(worker, id, peer).refined(|_| Transport::Quic)
    }

    /// The link session of worker `from` with worker `to` (its id is the
    /// same on every worker that links to `to`: ids are per worker).
    pub fn link(from: usize, to: usize) -> Self {
        ConnName {
            id: LINK_ID_BASE + to as u64,
            kind: Kind::Link {
                from: worker_index(from),
                to: worker_index(to),
            },
        }
    }

    /// Worker `worker`'s `dial`-th session (from 0) with the upstream relay
    /// at `url` (whose query, if any, is never shown).
    pub fn upstream(worker: usize, dial: u64, url: &'static str) -> Self {
        ConnName {
            id: UPSTREAM_ID_BASE.wrapping_add(dial),
            kind: Kind::Upstream {
                url,
                worker: worker_index(worker),
            },
        }
    }

    /// Worker `worker`'s `dial`-th session (from 0) with cluster peer number
    /// `slot` (a process-wide number, never reused), dialed at `url` (whose
    /// query, if any, is never shown). Its id is apart from every other
    /// peer's and the upstream's.
    pub fn cluster_peer(worker: usize, slot: u32, dial: u64, url: &'static str) -> Self {
        let offset =
            ((u64::from(slot) + 1) << PEER_DIAL_BITS) | (dial & ((1 << PEER_DIAL_BITS) - 1));
        ConnName {
            id: UPSTREAM_ID_BASE.wrapping_add(offset),
            kind: Kind::Peer {
                url,
                worker: worker_index(worker),
            },
        }
    }

    /// The numeric id the core knows the session by (its `Peer` and source id).
    pub fn id(self) -> u64 {
        self.id
    }

    /// The client's address; `None` for a link or the upstream.
    pub fn peer(self) -> Option<SocketAddr> {
        match self.kind {
            Kind::Client { ip, port, .. } => Some(SocketAddr::new(ip, port)),
            _ => None,
        }
    }

    /// The client's transport; `None` for a link or the upstream.
    #[cfg(test)]
    pub(crate) fn transport(self) -> Option<Transport> {
        match self.kind {
            Kind::Client { transport, .. } => Some(transport),
            _ => None,
        }
    }

    /// The same connection once its TLS handshake is done.
    #[must_use]
    pub fn over_tls(self) -> Self {
        self.refined(|t| match t {
            Transport::Tcp => Transport::Tls,
            t => t,
        })
    }

    /// The same connection once its first bytes are an HTTP request.
    #[must_use]
    pub fn over_http(self) -> Self {
        self.refined(|t| match t {
            Transport::Tcp => Transport::Http,
            Transport::Tls => Transport::Https,
            t => t,
        })
    }

    /// The same connection once its HTTP request became a WebSocket.
    #[must_use]
    pub fn upgraded(self) -> Self {
        self.refined(|t| match t {
            Transport::Tcp | Transport::Http => Transport::Ws,
            Transport::Tls | Transport::Https => Transport::Wss,
            t => t,
        })
    }

    fn refined(mut self, f: impl FnOnce(Transport) -> Transport) -> Self {
        if let Kind::Client { transport, .. } = &mut self.kind {
            *transport = f(*transport);
        }
        self
    }
}

impl fmt::Display for ConnName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Client {
                ip,
                port,
                transport,
                worker,
            } => write!(
                f,
                "{} {} w{worker}#{}",
                transport.as_str(),
                SocketAddr::new(ip, port),
                self.id
            ),
            Kind::Link { from, to } => write!(f, "link w{from}→w{to}"),
            Kind::Upstream { url, worker } => {
                // The query may hold a token (`jwt=`): only its presence shows.
                let (shown, query) = url.split_once('?').unwrap_or((url, ""));
                let hidden = if query.is_empty() { "" } else { "?…" };
                let dial = self.id.wrapping_sub(UPSTREAM_ID_BASE);
                write!(f, "upstream {shown}{hidden} w{worker} dial {dial}")
            }
            Kind::Peer { url, worker } => {
                let (shown, query) = url.split_once('?').unwrap_or((url, ""));
                let hidden = if query.is_empty() { "" } else { "?…" };
                let dial = self.id.wrapping_sub(UPSTREAM_ID_BASE) & ((1 << PEER_DIAL_BITS) - 1);
                write!(f, "peer {shown}{hidden} w{worker} dial {dial}")
            }
        }
    }
}

/// A worker index as a name holds it (workers are far fewer than 65,535).
fn worker_index(worker: usize) -> u16 {
    u16::try_from(worker).unwrap_or(u16::MAX)
}

impl fmt::Debug for ConnName {
    /// The [`fmt::Display`] form quoted and escaped as a string's Debug
    /// form is (never the fields: they hold a URL whose query stays out
    /// of logs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        write!(Escaped(f), "{self}")?;
        f.write_char('"')
    }
}

/// Writes what it is given with quotes, backslashes and control characters
/// escaped, straight into the formatter.
struct Escaped<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for Escaped<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '"' | '\\' => {
                    self.0.write_char('\\')?;
                    self.0.write_char(c)?;
                }
                c if c.is_control() => write!(self.0, "{}", c.escape_default())?,
                c => self.0.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(worker: usize, id: u64, peer: &str) -> ConnName {
        ConnName::client(worker, id, peer.parse().unwrap())
    }

    #[test]
    fn clients_show_transport_address_worker_and_number() {
        let c = client(1, 7, "127.0.0.1:50312");
        assert_eq!(c.to_string(), "tcp 127.0.0.1:50312 w1#7");
        assert_eq!(c.over_tls().to_string(), "tls 127.0.0.1:50312 w1#7");
        assert_eq!(c.over_http().to_string(), "http 127.0.0.1:50312 w1#7");
        assert_eq!(
            c.over_tls().over_http().to_string(),
            "https 127.0.0.1:50312 w1#7"
        );
        assert_eq!(
            c.over_http().upgraded().to_string(),
            "ws 127.0.0.1:50312 w1#7"
        );
        assert_eq!(
            c.over_tls().over_http().upgraded().to_string(),
            "wss 127.0.0.1:50312 w1#7"
        );
        assert_eq!(
            client(0, 12, "[2001:db8::1]:443").over_tls().to_string(),
            "tls [2001:db8::1]:443 w0#12"
        );
        // Logged with `?`: quoted, as a string field is.
        assert_eq!(format!("{c:?}"), "\"tcp 127.0.0.1:50312 w1#7\"");
        // The core's id is the accept number, whatever the transport.
        assert_eq!(c.over_tls().over_http().upgraded().id(), 7);
        assert_eq!(c.over_http().upgraded().transport(), Some(Transport::Ws));
        let quic = ConnName::quic(0, 3, "127.0.0.1:4443".parse().unwrap());
        assert_eq!(quic.to_string(), "quic 127.0.0.1:4443 w0#3");
        assert_eq!(quic.transport(), Some(Transport::Quic));
        assert_eq!(
            c.upgraded().peer(),
            Some("127.0.0.1:50312".parse().unwrap())
        );
    }

    #[test]
    fn links_and_upstreams_are_named_as_such() {
        let link = ConnName::link(0, 1);
        assert_eq!(link.to_string(), "link w0→w1");
        assert_eq!(format!("{link:?}"), "\"link w0→w1\"");
        assert_eq!(link.id(), LINK_ID_BASE + 1);
        assert_eq!(link.over_tls(), link);
        assert_eq!(link.transport(), None);
        assert_eq!(link.peer(), None);

        let up = ConnName::upstream(2, 3, "tcp://relay.example:4443/live");
        assert_eq!(
            up.to_string(),
            "upstream tcp://relay.example:4443/live w2 dial 3"
        );
        assert_eq!(up.id(), UPSTREAM_ID_BASE + 3);
        assert!(up.id() > ConnName::link(0, usize::from(u16::MAX)).id());
    }

    #[test]
    fn an_upstream_token_never_shows() {
        let up = ConnName::upstream(0, 0, "tls://[2001:db8::2]:443/live?jwt=eyJhbGciOi.secret");
        let bare = "upstream tls://[2001:db8::2]:443/live?… w0 dial 0";
        assert_eq!(up.to_string(), bare);
        assert_eq!(format!("{up:?}"), format!("\"{bare}\""));
        for shown in [up.to_string(), format!("{up:?}")] {
            assert!(!shown.contains("jwt") && !shown.contains("secret"));
        }
        // A URL's odd characters are escaped as a string's would be.
        let odd = ConnName::upstream(0, 1, "tcp://h:1/a\"b\\c\n");
        assert_eq!(
            format!("{odd:?}"),
            r#""upstream tcp://h:1/a\"b\\c\n w0 dial 1""#
        );
        assert_eq!(format!("{odd:?}"), format!("{:?}", odd.to_string()));
    }

    #[test]
    fn a_name_stays_small() {
        // It is held by each connection's task and session: four words at most.
        assert!(std::mem::size_of::<ConnName>() <= 32);
    }
}
