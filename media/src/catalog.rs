//! The host-side parser of a hang catalog (docs/protocol.md §10.2), with serde.
//!
//! Only what a viewer needs is kept; unknown keys are ignored, as hang does.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A parsed catalog.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Catalog {
    /// The video section.
    #[serde(default)]
    pub video: Video,
}

/// A catalog's video section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Video {
    /// Renditions by track name.
    #[serde(default)]
    pub renditions: BTreeMap<String, VideoConfig>,
}

/// One video rendition: a WebCodecs decoder configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VideoConfig {
    /// The codec string.
    pub codec: String,
    /// The decoder configuration record, hex in the JSON (avcC for `avc1`).
    #[serde(default, deserialize_with = "hex_bytes")]
    pub description: Option<Vec<u8>>,
    /// Coded width.
    pub coded_width: Option<u32>,
    /// Coded height.
    pub coded_height: Option<u32>,
    /// Frames per second.
    pub framerate: Option<f64>,
    /// Bits per second.
    pub bitrate: Option<u64>,
    /// The frame container.
    #[serde(default)]
    pub container: Container,
}

/// How frames are framed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Container {
    /// `legacy`, `cmaf`, `loc`, …
    pub kind: String,
}

impl Default for Container {
    fn default() -> Container {
        Container {
            kind: "legacy".into(),
        }
    }
}

/// Why a catalog was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not a catalog: bad JSON or wrong field types.
    #[error("catalog: {0}")]
    Json(#[from] serde_json::Error),
}

impl Catalog {
    /// Parses a catalog's JSON.
    ///
    /// # Errors
    /// [`Error::Json`] for bad JSON, a bad hex description or mistyped fields.
    pub fn parse(json: &[u8]) -> Result<Catalog, Error> {
        Ok(serde_json::from_slice(json)?)
    }
}

/// A hex string as bytes.
fn hex_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    let Some(s) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    if !s.len().is_multiple_of(2) {
        return Err(serde::de::Error::custom(
            "description: odd number of hex digits",
        ));
    }
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()
        .map(Some)
        .ok_or_else(|| serde::de::Error::custom("description: not hex"))
}

#[cfg(test)]
mod tests {
    use skiff_core::hang::catalog::{self, VideoRendition};

    use super::*;

    #[test]
    fn parses_what_the_core_writes() {
        let r = VideoRendition {
            track: "video",
            codec: "avc1.42c01f",
            description: Some(&[1, 0xab, 0xcd]),
            coded_width: 320,
            coded_height: 240,
            framerate: Some(30.0),
            bitrate: Some(1_000_000),
        };
        let mut buf = [0u8; 512];
        let n = catalog::write(&[r], &mut buf).unwrap();
        let c = Catalog::parse(&buf[..n]).unwrap();
        let v = &c.video.renditions["video"];
        assert_eq!(v.codec, "avc1.42c01f");
        assert_eq!(v.description.as_deref(), Some(&[1, 0xab, 0xcd][..]));
        assert_eq!((v.coded_width, v.coded_height), (Some(320), Some(240)));
        assert_eq!((v.framerate, v.bitrate), (Some(30.0), Some(1_000_000)));
        assert_eq!(v.container.kind, "legacy");
    }

    #[test]
    fn hang_test_vector_and_bad_input() {
        let c = Catalog::parse(br#"{"video":{"renditions":{"video":{"codec":"avc1.64001f","codedWidth":1280,"codedHeight":720,"bitrate":6000000,"framerate":30.0,"container":{"kind":"legacy"}}}},"extra":1}"#).unwrap();
        assert_eq!(c.video.renditions["video"].coded_width, Some(1280));
        assert!(Catalog::parse(b"{}").unwrap().video.renditions.is_empty());
        for bad in [
            &b""[..],
            b"[",
            b"{\"video\":1}",
            br#"{"video":{"renditions":{"v":{"codec":"x","description":"0g"}}}}"#,
            br#"{"video":{"renditions":{"v":{"codec":"x","description":"abc"}}}}"#,
        ] {
            assert!(
                Catalog::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
