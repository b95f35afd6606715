//! The PROXY protocol (versions 1 and 2) on the TCP listen port: a load
//! balancer in front of the relay opens each connection with a header
//! naming the client it carries, and the relay then counts, limits and logs
//! the connection by that client's address rather than the balancer's.
//!
//! Only connections from the addresses of `--proxy-protocol-from`
//! ([`ProxySources`]) are read this way, and from them the header is
//! required: anyone else could name any address. From every other address
//! the bytes are the relay's own protocols, where a PROXY header is not
//! valid (its `PROXY` line reads as an HTTP request with a bad target, its
//! version 2 signature as a broken QMux record or TLS record).
//!
//! [`decode`] reads a header off the first bytes of a connection with the
//! `ppp` crate's parser; the worker reads at most [`MAX_HEADER_BYTES`]
//! within the handshake timeout.

use std::net::{IpAddr, SocketAddr};

use ppp::PartialResult;

/// Longest header accepted, bytes: a version 1 line is at most 107, and a
/// version 2 header 16 plus its addresses (at most 216) and its TLVs, which
/// load balancers keep short (an endpoint ID, a checksum).
pub const MAX_HEADER_BYTES: usize = 2048;

/// The load balancers whose connections start with a PROXY header
/// (`--proxy-protocol-from`): address blocks, each an address with an
/// optional prefix length (`10.0.0.0/8`, `2001:db8::/32`, `192.0.2.7`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxySources(Vec<ipnet::IpNet>);

impl ProxySources {
    /// The blocks `texts` write (blank ones skipped).
    ///
    /// # Errors
    /// The first text that is neither an address nor an address block,
    /// with the reason.
    pub fn parse<S: AsRef<str>>(texts: &[S]) -> Result<Self, String> {
        let mut nets = Vec::new();
        for text in texts.iter().map(|t| t.as_ref().trim()) {
            if text.is_empty() {
                continue;
            }
            let net = match text.parse::<ipnet::IpNet>() {
                Ok(net) => net.trunc(),
                Err(_) => match text.parse::<IpAddr>() {
                    Ok(ip) => ipnet::IpNet::from(ip),
                    Err(_) => {
                        return Err(format!(
                            "`{text}` is not an IP address or a CIDR block (`10.0.0.0/8`)"
                        ));
                    }
                },
            };
            nets.push(net);
        }
        Ok(ProxySources(nets))
    }

    /// Whether no address may send a PROXY header.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a connection from `ip` must start with a PROXY header (an
    /// IPv4 address written as IPv6, `::ffff:a.b.c.d`, is taken as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// What the first bytes of a connection from a load balancer hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The header is not complete yet: read more (up to
    /// [`MAX_HEADER_BYTES`]).
    Incomplete,
    /// A complete header of `len` bytes. `client` is the address it
    /// carries; `None` for a version 2 LOCAL header (the balancer's own
    /// health check), a version 1 `UNKNOWN` one, or an address family that
    /// is not IP: the connection is then taken as the socket's.
    Complete {
        /// Bytes the header takes at the start of the input.
        len: usize,
        /// The client's address, if the header names one.
        client: Option<SocketAddr>,
    },
}

/// Why a connection's first bytes are not an acceptable PROXY header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// A version 1 (text) header that does not parse.
    #[error("malformed PROXY v1 header: {0}")]
    V1(String),
    /// A version 2 (binary) header that does not parse.
    #[error("malformed PROXY v2 header: {0}")]
    V2(String),
    /// Bytes that start neither header version.
    #[error("no PROXY header (v1 or v2) where the connection starts")]
    Missing,
    /// A header longer than [`MAX_HEADER_BYTES`] (its declared length, or
    /// the bytes read without one complete).
    #[error("PROXY header longer than {MAX_HEADER_BYTES} bytes")]
    TooLong,
}

/// Reads a PROXY header (version 1 or 2) at the start of `input`.
///
/// # Errors
/// [`HeaderError`] when `input` cannot start a valid header, or the header
/// would be longer than [`MAX_HEADER_BYTES`].
pub fn decode(input: &[u8]) -> Result<Header, HeaderError> {
    let input = input.get(..MAX_HEADER_BYTES).unwrap_or(input);
    let starts = |prefix: &[u8]| prefix.starts_with(input.get(..prefix.len()).unwrap_or(input));
    if input.is_empty() {
        Ok(Header::Incomplete)
    } else if starts(V2_SIGNATURE) {
        decode_v2(input)
    } else if starts(V1_PREFIX) {
        decode_v1(input)
    } else {
        Err(HeaderError::Missing)
    }
}

/// [`decode`] of bytes that start like a version 1 header.
fn decode_v1(input: &[u8]) -> Result<Header, HeaderError> {
    // The line is parsed whole: cut after a space, its last field would
    // read as empty rather than not there yet.
    if !input.contains(&b'\n') {
        return if input.len() >= V1_MAX_BYTES {
            Err(HeaderError::V1(format!(
                "no line end within {V1_MAX_BYTES} bytes"
            )))
        } else {
            Ok(Header::Incomplete)
        };
    }
    let h = ppp::v1::Header::try_from(input).map_err(|e| HeaderError::V1(e.to_string()))?;
    let client = match h.addresses {
        ppp::v1::Addresses::Tcp4(a) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Tcp6(a) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        ppp::v1::Addresses::Unknown => None,
    };
    Ok(Header::Complete {
        len: h.header.len(),
        client,
    })
}

/// [`decode`] of bytes that start like a version 2 header.
fn decode_v2(input: &[u8]) -> Result<Header, HeaderError> {
    let parsed = ppp::v2::Header::try_from(input);
    if parsed.is_incomplete() {
        if let Err(ppp::v2::ParseError::Partial(_, declared)) = &parsed
            && declared.saturating_add(V2_FIXED_BYTES) > MAX_HEADER_BYTES
        {
            return Err(HeaderError::TooLong);
        }
        return Ok(Header::Incomplete);
    }
    let h = parsed.map_err(|e| HeaderError::V2(e.to_string()))?;
    let client = match (h.command, &h.addresses) {
        (ppp::v2::Command::Local, _) => None,
        (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv4(a)) => {
            Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port))
        }
        (ppp::v2::Command::Proxy, ppp::v2::Addresses::IPv6(a)) => {
            Some(SocketAddr::new(IpAddr::V6(a.source_address), a.source_port))
        }
        (ppp::v2::Command::Proxy, _) => None,
    };
    Ok(Header::Complete {
        len: h.len(),
        client,
    })
}

/// The signature a version 2 header starts with.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";

/// How a version 1 header starts.
const V1_PREFIX: &[u8] = b"PROXY";

/// Longest version 1 header, its line end included.
const V1_MAX_BYTES: usize = 107;

/// Bytes of a version 2 header before its addresses: the signature, the
/// version and command, the family and protocol, and the length.
const V2_FIXED_BYTES: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 2 PROXY header over TCP from `src` to `dst` (IPv4).
    fn v2(command: u8, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.push(0x20 | command);
        h.push(0x11);
        h.extend_from_slice(&12u16.to_be_bytes());
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h.extend_from_slice(&sport.to_be_bytes());
        h.extend_from_slice(&dport.to_be_bytes());
        h
    }

    #[test]
    fn v1_names_the_client_and_leaves_the_rest() {
        let mut input = b"PROXY TCP4 203.0.113.7 192.0.2.1 50312 4443\r\n".to_vec();
        let len = input.len();
        input.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            decode(&input),
            Ok(Header::Complete {
                len,
                client: Some("203.0.113.7:50312".parse().unwrap())
            })
        );
        let v6 = b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n";
        assert_eq!(
            decode(v6),
            Ok(Header::Complete {
                len: v6.len(),
                client: Some("[2001:db8::7]:4000".parse().unwrap())
            })
        );
        let unknown = b"PROXY UNKNOWN\r\n";
        assert_eq!(
            decode(unknown),
            Ok(Header::Complete {
                len: unknown.len(),
                client: None
            })
        );
    }

    #[test]
    fn v2_proxy_and_local() {
        let mut input = v2(1, [198, 51, 100, 9], 6000, [192, 0, 2, 1], 4443);
        let len = input.len();
        input.extend_from_slice(&[0x16, 0x03, 0x01]);
        assert_eq!(
            decode(&input),
            Ok(Header::Complete {
                len,
                client: Some("198.51.100.9:6000".parse().unwrap())
            })
        );
        let local = v2(0, [0; 4], 0, [0; 4], 0);
        assert_eq!(
            decode(&local),
            Ok(Header::Complete {
                len: local.len(),
                client: None
            })
        );
    }

    #[test]
    fn every_strict_prefix_is_incomplete() {
        let v1 = b"PROXY TCP4 203.0.113.7 192.0.2.1 50312 4443\r\n".to_vec();
        let v2 = v2(1, [198, 51, 100, 9], 6000, [192, 0, 2, 1], 4443);
        for whole in [v1, v2] {
            for n in 0..whole.len() {
                assert_eq!(decode(&whole[..n]), Ok(Header::Incomplete), "{n} bytes");
            }
        }
    }

    #[test]
    fn malformed_and_oversized_headers_are_errors() {
        assert!(matches!(
            decode(b"PROXY TCP4 300.0.0.1 192.0.2.1 1 2\r\n"),
            Err(HeaderError::V1(_))
        ));
        assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(HeaderError::Missing));
        assert_eq!(decode(&[0x16, 0x03, 0x01]), Err(HeaderError::Missing));
        let mut bad_version = v2(1, [1, 2, 3, 4], 1, [5, 6, 7, 8], 2);
        bad_version[12] = 0x31;
        assert!(matches!(decode(&bad_version), Err(HeaderError::V2(_))));
        let mut huge = v2(1, [1, 2, 3, 4], 1, [5, 6, 7, 8], 2);
        huge[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        assert_eq!(decode(&huge), Err(HeaderError::TooLong));
    }

    #[test]
    fn sources_match_blocks_and_single_addresses() {
        let s = ProxySources::parse(&["10.0.0.0/8", " 192.0.2.7 ", "", "2001:db8::/32"]).unwrap();
        assert!(s.contains("10.1.2.3".parse().unwrap()));
        assert!(s.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(s.contains("192.0.2.7".parse().unwrap()));
        assert!(!s.contains("192.0.2.8".parse().unwrap()));
        assert!(s.contains("2001:db8::1".parse().unwrap()));
        assert!(!ProxySources::default().contains("10.1.2.3".parse().unwrap()));
        assert!(ProxySources::parse(&["10.0.0.0/33"]).is_err());
        assert!(ProxySources::parse(&["lb.example"]).is_err());
    }
}
