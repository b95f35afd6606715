//! Broadcast paths: `/`-separated segments, normalized, matched by whole segment.
//!
//! docs/protocol.md §3.2: a broadcast path is a string of `/`-separated segments;
//! moq-dev strips leading and trailing `/`, collapses `//`, allows at most 32
//! segments, and matches prefixes by whole segment (`room` is a prefix of
//! `room/cam` but not of `roomy`). §3.6: an announced path is the requested
//! prefix joined with the announced suffix. §4.1: everything a session names is
//! relative to the root it dialed, so the relay joins the root in front on the
//! way in and strips it on the way out.
//!
//! Two types, no allocation:
//!
//! * [`Path`] borrows a `&str` that is already normalized. [`Path::new`] trims
//!   leading and trailing `/` for free (it only narrows the slice) and refuses an
//!   inner `//` with [`PathError::NotNormalized`], because collapsing it needs
//!   somewhere to write.
//! * [`PathBuf<N>`] owns up to `N` bytes in a `heapless::String<N>` and is where
//!   collapsing and joining happen. [`Path::new_in`] picks for you: it borrows
//!   when the input is already clean and writes into a caller buffer otherwise.
//!
//! Track names are *not* paths: they are opaque strings, compared byte for byte
//! and never normalized (§3.2), so they stay plain `&str`.

use core::fmt;
use core::iter::FusedIterator;

/// docs/protocol.md §3.2: the most segments a broadcast path may have.
pub const MAX_SEGMENTS: usize = 32;

/// Why a string could not become a [`Path`] or [`PathBuf`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PathError {
    /// The path has more than [`MAX_SEGMENTS`] segments (§3.2).
    TooManySegments,
    /// The path contains `//` between segments; normalize it into a [`PathBuf`].
    NotNormalized,
    /// The normalized path does not fit the [`PathBuf`]'s byte capacity.
    TooLong,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::TooManySegments => "path has more than 32 segments",
            PathError::NotNormalized => "path contains an empty segment (`//`)",
            PathError::TooLong => "path does not fit its buffer",
        })
    }
}

impl core::error::Error for PathError {}

/// A normalized broadcast path borrowed from a string: no leading, trailing or
/// doubled `/`, at most [`MAX_SEGMENTS`] segments.
///
/// The empty path (`""`) has no segments and is a prefix of every path.
/// Equality, ordering and hashing are those of the normalized string.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Path<'a> {
    s: &'a str,
}

impl<'a> Path<'a> {
    /// The empty path: no segments, a prefix of every path.
    pub const EMPTY: Path<'static> = Path { s: "" };

    /// Borrows `s` as a path, trimming any leading and trailing `/`.
    ///
    /// # Errors
    ///
    /// [`PathError::NotNormalized`] if `s` has `//` between segments (use
    /// [`Path::new_in`] or [`PathBuf::normalize`] to collapse it);
    /// [`PathError::TooManySegments`] beyond [`MAX_SEGMENTS`].
    pub fn new(s: &'a str) -> Result<Self, PathError> {
        let s = s.trim_matches('/');
        if s.contains("//") {
            return Err(PathError::NotNormalized);
        }
        let path = Path { s };
        if path.segment_count() > MAX_SEGMENTS {
            return Err(PathError::TooManySegments);
        }
        Ok(path)
    }

    /// Normalizes `s` without copying when it can: borrows `s` if only its ends
    /// need trimming, otherwise collapses it into `buf` and borrows that.
    ///
    /// This is what a decoder wants for a path off the wire (§3.2: moq-dev
    /// accepts `a//b` and treats it as `a/b`).
    ///
    /// # Errors
    ///
    /// [`PathError::TooManySegments`] beyond [`MAX_SEGMENTS`];
    /// [`PathError::TooLong`] if `s` needed collapsing and does not fit `buf`
    /// (then `buf` is left empty).
    pub fn new_in<'b, const N: usize>(
        s: &'b str,
        buf: &'b mut PathBuf<N>,
    ) -> Result<Path<'b>, PathError> {
        match Path::new(s) {
            Err(PathError::NotNormalized) => {
                buf.clear();
                *buf = PathBuf::normalize(s)?;
                Ok(buf.as_path())
            }
            other => other,
        }
    }

    /// The normalized path as a string slice.
    #[inline]
    pub const fn as_str(&self) -> &'a str {
        self.s
    }

    /// Whether this is the empty path.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.s.is_empty()
    }

    /// Length in bytes (not segments).
    #[inline]
    pub const fn len(&self) -> usize {
        self.s.len()
    }

    /// The segments, first to last; the empty path has none.
    #[inline]
    pub fn segments(&self) -> Segments<'a> {
        Segments {
            rest: if self.s.is_empty() {
                None
            } else {
                Some(self.s)
            },
        }
    }

    /// The number of segments (0 for the empty path).
    pub fn segment_count(&self) -> usize {
        if self.s.is_empty() {
            0
        } else {
            self.s.bytes().filter(|&b| b == b'/').count() + 1
        }
    }

    /// Whether `prefix` is a whole-segment prefix of this path.
    ///
    /// §3.2: `room` prefixes `room` and `room/cam` but not `roomy`; the empty
    /// path prefixes everything.
    #[inline]
    pub fn has_prefix(&self, prefix: Path<'_>) -> bool {
        self.strip_prefix(prefix).is_some()
    }

    /// The rest of this path after the whole-segment `prefix`, or `None` if
    /// `prefix` is not a prefix of it.
    ///
    /// Stripping the path itself gives the empty path; stripping the empty path
    /// gives the path unchanged. This is how a relay turns a full path into the
    /// suffix it announces (§3.6) or into a path relative to a session's root (§4.1).
    pub fn strip_prefix(&self, prefix: Path<'_>) -> Option<Path<'a>> {
        if prefix.is_empty() {
            return Some(*self);
        }
        let rest = self.s.strip_prefix(prefix.s)?;
        if rest.is_empty() {
            return Some(Path::EMPTY);
        }
        // Only a whole segment matches: the next byte must be the separator.
        rest.strip_prefix('/').map(|s| Path { s })
    }
}

impl fmt::Debug for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Path({:?})", self.s)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.s)
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Path<'_> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.s)
    }
}

impl AsRef<str> for Path<'_> {
    fn as_ref(&self) -> &str {
        self.s
    }
}

impl<'a> TryFrom<&'a str> for Path<'a> {
    type Error = PathError;

    fn try_from(s: &'a str) -> Result<Self, PathError> {
        Path::new(s)
    }
}

impl PartialEq<str> for Path<'_> {
    fn eq(&self, other: &str) -> bool {
        self.s == other
    }
}

impl PartialEq<&str> for Path<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.s == *other
    }
}

/// Iterator over a [`Path`]'s segments (from [`Path::segments`]); never yields
/// an empty segment.
#[derive(Clone, Debug)]
pub struct Segments<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        match rest.split_once('/') {
            Some((head, tail)) => {
                self.rest = Some(tail);
                Some(head)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

impl DoubleEndedIterator for Segments<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let rest = self.rest?;
        match rest.rsplit_once('/') {
            Some((head, tail)) => {
                self.rest = Some(head);
                Some(tail)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

impl FusedIterator for Segments<'_> {}

/// An owned, normalized broadcast path of at most `N` bytes, stored inline.
///
/// Holds the same invariant as [`Path`]; build one by normalizing a raw string
/// ([`PathBuf::normalize`]), copying a [`Path`] ([`PathBuf::from_path`]) or
/// joining two ([`PathBuf::join`]). Every failed operation leaves it unchanged.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathBuf<const N: usize> {
    s: heapless::String<N>,
}

impl<const N: usize> PathBuf<N> {
    /// The empty path.
    pub const fn new() -> Self {
        PathBuf {
            s: heapless::String::new(),
        }
    }

    /// Normalizes `s`: strips leading and trailing `/` and collapses runs of `/`.
    ///
    /// # Errors
    ///
    /// [`PathError::TooManySegments`] beyond [`MAX_SEGMENTS`];
    /// [`PathError::TooLong`] if the normalized path exceeds `N` bytes.
    pub fn normalize(s: &str) -> Result<Self, PathError> {
        let mut count = 0usize;
        let mut bytes = 0usize;
        for seg in s.split('/').filter(|seg| !seg.is_empty()) {
            count += 1;
            bytes += seg.len() + usize::from(count > 1);
        }
        if count > MAX_SEGMENTS {
            return Err(PathError::TooManySegments);
        }
        if bytes > N {
            return Err(PathError::TooLong);
        }
        let mut out = PathBuf::new();
        for seg in s.split('/').filter(|seg| !seg.is_empty()) {
            if !out.s.is_empty() {
                out.put("/");
            }
            out.put(seg);
        }
        Ok(out)
    }

    /// Copies `path` into a buffer.
    ///
    /// # Errors
    ///
    /// [`PathError::TooLong`] if `path` exceeds `N` bytes.
    pub fn from_path(path: Path<'_>) -> Result<Self, PathError> {
        let mut out = PathBuf::new();
        out.push(path)?;
        Ok(out)
    }

    /// Joins `prefix` and `suffix` segment-wise (§3.6: announced path = prefix
    /// joined with suffix; an empty side contributes nothing).
    ///
    /// # Errors
    ///
    /// [`PathError::TooManySegments`] if the result would exceed
    /// [`MAX_SEGMENTS`]; [`PathError::TooLong`] if it exceeds `N` bytes.
    pub fn join(prefix: Path<'_>, suffix: Path<'_>) -> Result<Self, PathError> {
        let mut out = PathBuf::from_path(prefix)?;
        out.push(suffix)?;
        Ok(out)
    }

    /// Appends `suffix`'s segments to this path.
    ///
    /// # Errors
    ///
    /// [`PathError::TooManySegments`] if the result would exceed
    /// [`MAX_SEGMENTS`]; [`PathError::TooLong`] if it exceeds `N` bytes. On
    /// error the path is unchanged.
    pub fn push(&mut self, suffix: Path<'_>) -> Result<(), PathError> {
        if suffix.is_empty() {
            return Ok(());
        }
        if self.as_path().segment_count() + suffix.segment_count() > MAX_SEGMENTS {
            return Err(PathError::TooManySegments);
        }
        let sep = usize::from(!self.s.is_empty());
        if self.s.len() + sep + suffix.len() > N {
            return Err(PathError::TooLong);
        }
        if sep == 1 {
            self.put("/");
        }
        self.put(suffix.as_str());
        Ok(())
    }

    /// Empties the path.
    pub fn clear(&mut self) {
        self.s.clear();
    }

    /// Borrows the path.
    #[inline]
    pub fn as_path(&self) -> Path<'_> {
        Path { s: self.s.as_str() }
    }

    /// The normalized path as a string slice.
    #[inline]
    pub fn as_str(&self) -> &str {
        self.s.as_str()
    }

    /// Byte capacity `N`.
    #[cfg(test)]
    pub const fn capacity(&self) -> usize {
        N
    }

    // Appends bytes whose fit the caller has already checked.
    fn put(&mut self, s: &str) {
        let pushed = self.s.push_str(s);
        debug_assert!(pushed.is_ok(), "capacity checked by the caller");
    }
}

impl<const N: usize> fmt::Debug for PathBuf<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PathBuf({:?})", self.s.as_str())
    }
}

impl<const N: usize> fmt::Display for PathBuf<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.s.as_str())
    }
}

#[cfg(feature = "defmt")]
impl<const N: usize> defmt::Format for PathBuf<N> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.s.as_str())
    }
}

impl<const N: usize> AsRef<str> for PathBuf<N> {
    fn as_ref(&self) -> &str {
        self.s.as_str()
    }
}

impl<const N: usize> PartialEq<Path<'_>> for PathBuf<N> {
    fn eq(&self, other: &Path<'_>) -> bool {
        self.s.as_str() == other.s
    }
}

impl<const N: usize> PartialEq<PathBuf<N>> for Path<'_> {
    fn eq(&self, other: &PathBuf<N>) -> bool {
        self.s == other.s.as_str()
    }
}

impl<const N: usize> PartialEq<str> for PathBuf<N> {
    fn eq(&self, other: &str) -> bool {
        self.s.as_str() == other
    }
}

impl<const N: usize> PartialEq<&str> for PathBuf<N> {
    fn eq(&self, other: &&str) -> bool {
        self.s.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;
    use std::string::{String, ToString};
    use std::vec::Vec;

    fn p(s: &str) -> Path<'_> {
        Path::new(s).unwrap()
    }

    // ---- construction and normalization (§3.2) ----

    #[test]
    fn new_trims_leading_and_trailing_slashes() {
        assert_eq!(p("/room/cam/"), "room/cam");
        assert_eq!(p("///room///"), "room");
        assert_eq!(p("room"), "room");
        assert_eq!(p("/"), Path::EMPTY);
        assert_eq!(p("//"), Path::EMPTY);
        assert_eq!(p(""), Path::EMPTY);
        assert!(p("").is_empty());
    }

    #[test]
    fn new_refuses_inner_double_slash() {
        assert_eq!(Path::new("a//b"), Err(PathError::NotNormalized));
        assert_eq!(Path::new("/a/b///c/"), Err(PathError::NotNormalized));
    }

    #[test]
    fn normalize_collapses_and_trims() {
        let b = PathBuf::<32>::normalize("//a///b/c//").unwrap();
        assert_eq!(b, "a/b/c");
        assert_eq!(PathBuf::<8>::normalize("///").unwrap(), "");
        assert_eq!(PathBuf::<8>::normalize("").unwrap(), Path::EMPTY);
    }

    #[test]
    fn normalize_checks_capacity_after_collapsing() {
        // 7 raw bytes, 3 normalized: fits in 3.
        assert_eq!(PathBuf::<3>::normalize("/a///b/").unwrap(), "a/b");
        assert_eq!(PathBuf::<2>::normalize("a/b"), Err(PathError::TooLong));
        assert_eq!(PathBuf::<0>::normalize("//").unwrap(), "");
    }

    #[test]
    fn new_in_borrows_when_clean_and_writes_when_not() {
        let mut buf = PathBuf::<16>::new();
        let raw = "/room/cam/";
        let path = Path::new_in(raw, &mut buf).unwrap();
        assert_eq!(path, "room/cam");
        assert!(
            core::ptr::eq(path.as_str().as_ptr(), raw[1..].as_ptr()),
            "borrowed"
        );

        let mut buf = PathBuf::<16>::new();
        let path = Path::new_in("room//cam", &mut buf).unwrap();
        assert_eq!(path, "room/cam");

        let mut small = PathBuf::<4>::new();
        assert_eq!(
            Path::new_in("room//cam", &mut small),
            Err(PathError::TooLong)
        );
        assert_eq!(small, "");
    }

    #[test]
    fn at_most_32_segments() {
        let ok: String = ["s"; 32].join("/");
        let too_many: String = ["s"; 33].join("/");
        assert_eq!(p(&ok).segment_count(), 32);
        assert_eq!(Path::new(&too_many), Err(PathError::TooManySegments));
        assert_eq!(
            PathBuf::<128>::normalize(&too_many),
            Err(PathError::TooManySegments)
        );
        // Collapsed empty segments do not count.
        let padded = std::format!("//{}//", ["s"; 32].join("//"));
        assert_eq!(
            PathBuf::<128>::normalize(&padded)
                .unwrap()
                .as_path()
                .segment_count(),
            32
        );
        let mut buf = PathBuf::<128>::new();
        assert_eq!(
            Path::new_in(&too_many, &mut buf),
            Err(PathError::TooManySegments)
        );
    }

    // ---- segments ----

    #[test]
    fn segments_iterate_both_ways() {
        let path = p("a/bc/d");
        assert_eq!(path.segments().collect::<Vec<_>>(), ["a", "bc", "d"]);
        assert_eq!(path.segments().rev().collect::<Vec<_>>(), ["d", "bc", "a"]);
        let mut it = path.segments();
        assert_eq!(it.next(), Some("a"));
        assert_eq!(it.next_back(), Some("d"));
        assert_eq!(it.next(), Some("bc"));
        assert_eq!(it.next_back(), None);
        assert_eq!(it.next(), None);
        assert_eq!(Path::EMPTY.segments().count(), 0);
        assert_eq!(Path::EMPTY.segment_count(), 0);
        assert_eq!(p("one").segments().collect::<Vec<_>>(), ["one"]);
    }

    // ---- prefix matching ----

    #[test]
    fn prefix_is_by_whole_segment() {
        let path = p("room/cam");
        assert!(path.has_prefix(p("room")));
        assert!(path.has_prefix(p("room/cam")));
        assert!(!path.has_prefix(p("roo")));
        assert!(!path.has_prefix(p("room/ca")));
        assert!(!path.has_prefix(p("room/cam/hd")));
        assert!(!p("roomy").has_prefix(p("room")));
        assert!(!p("room").has_prefix(p("room/cam")));
    }

    #[test]
    fn empty_is_a_prefix_of_everything() {
        assert!(p("room/cam").has_prefix(Path::EMPTY));
        assert!(Path::EMPTY.has_prefix(Path::EMPTY));
        assert!(!Path::EMPTY.has_prefix(p("room")));
    }

    #[test]
    fn strip_prefix_returns_the_suffix() {
        let path = p("room/cam/hd");
        assert_eq!(path.strip_prefix(p("room")), Some(p("cam/hd")));
        assert_eq!(path.strip_prefix(p("room/cam")), Some(p("hd")));
        assert_eq!(path.strip_prefix(path), Some(Path::EMPTY));
        assert_eq!(path.strip_prefix(Path::EMPTY), Some(path));
        assert_eq!(path.strip_prefix(p("ro")), None);
        assert_eq!(p("roomy").strip_prefix(p("room")), None);
        // The suffix borrows from the original string.
        let raw = "room/cam";
        let suffix = p(raw).strip_prefix(p("room")).unwrap();
        assert!(core::ptr::eq(suffix.as_str().as_ptr(), raw[5..].as_ptr()));
    }

    // ---- join ----

    #[test]
    fn join_is_segment_wise() {
        assert_eq!(
            PathBuf::<32>::join(p("room"), p("cam")).unwrap(),
            "room/cam"
        );
        assert_eq!(PathBuf::<32>::join(Path::EMPTY, p("cam")).unwrap(), "cam");
        assert_eq!(PathBuf::<32>::join(p("room"), Path::EMPTY).unwrap(), "room");
        assert_eq!(PathBuf::<32>::join(Path::EMPTY, Path::EMPTY).unwrap(), "");
        assert_eq!(PathBuf::<32>::join(p("/a/b/"), p("/c/")).unwrap(), "a/b/c");
    }

    #[test]
    fn join_respects_limits_and_leaves_buffer_unchanged() {
        assert_eq!(
            PathBuf::<7>::join(p("room"), p("cam")),
            Err(PathError::TooLong)
        );
        assert_eq!(PathBuf::<8>::join(p("room"), p("cam")).unwrap(), "room/cam");
        let left: String = ["l"; 20].join("/");
        let right: String = ["r"; 13].join("/");
        assert_eq!(
            PathBuf::<256>::join(p(&left), p(&right)),
            Err(PathError::TooManySegments)
        );

        let mut buf = PathBuf::<6>::from_path(p("room")).unwrap();
        assert_eq!(buf.push(p("cam")), Err(PathError::TooLong));
        assert_eq!(buf, "room");
        buf.push(p("c")).unwrap();
        assert_eq!(buf, "room/c");
        assert_eq!(buf.capacity(), 6);
    }

    #[test]
    fn join_then_strip_round_trips() {
        // §4.1: a session at root `room` publishing `cam` creates `room/cam`.
        let root = p("room");
        let full = PathBuf::<32>::join(root, p("cam")).unwrap();
        assert_eq!(full.as_path().strip_prefix(root), Some(p("cam")));
    }

    #[test]
    fn display_and_debug() {
        assert_eq!(std::format!("{}", p("a/b")), "a/b");
        assert_eq!(std::format!("{:?}", p("a/b")), "Path(\"a/b\")");
        let b = PathBuf::<8>::normalize("a//b").unwrap();
        assert_eq!(std::format!("{b}"), "a/b");
        assert_eq!(std::format!("{b:?}"), "PathBuf(\"a/b\")");
        assert_eq!(
            PathError::TooLong.to_string(),
            "path does not fit its buffer"
        );
    }

    // ---- properties ----

    fn raw_path() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![Just(""), Just("/"), Just("a"), Just("bc"), Just("ab")],
            0..12,
        )
        .prop_map(|parts| parts.concat())
    }

    proptest! {
        #[test]
        fn normalize_matches_split_filter(raw in raw_path()) {
            let expected: Vec<&str> = raw.split('/').filter(|s| !s.is_empty()).collect();
            let buf = PathBuf::<64>::normalize(&raw).unwrap();
            prop_assert_eq!(buf.as_path().segments().collect::<Vec<_>>(), expected.clone());
            prop_assert_eq!(buf.as_str(), expected.join("/"));
            // Path::new agrees whenever it accepts.
            if let Ok(path) = Path::new(&raw) {
                prop_assert_eq!(path, buf.as_path());
            }
            let mut scratch = PathBuf::<64>::new();
            prop_assert_eq!(Path::new_in(&raw, &mut scratch).unwrap(), buf.as_path());
        }

        #[test]
        fn prefix_agrees_with_segment_model(a in raw_path(), b in raw_path()) {
            let a = PathBuf::<64>::normalize(&a).unwrap();
            let b = PathBuf::<64>::normalize(&b).unwrap();
            let sa: Vec<&str> = a.as_path().segments().collect();
            let sb: Vec<&str> = b.as_path().segments().collect();
            let model = sa.starts_with(&sb);
            prop_assert_eq!(a.as_path().has_prefix(b.as_path()), model);
            if model {
                let rest = a.as_path().strip_prefix(b.as_path()).unwrap();
                prop_assert_eq!(rest.segments().collect::<Vec<_>>(), sa[sb.len()..].to_vec());
                let joined = PathBuf::<128>::join(b.as_path(), rest).unwrap();
                prop_assert_eq!(joined.as_path(), a.as_path());
            }
        }
    }
}
