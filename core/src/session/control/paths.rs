//! Broadcast paths off the wire: normalized, or joined to a request's prefix.

use crate::model::path::{Path, PathBuf};
use crate::session::MAX_PATH;

/// `prefix` joined with `suffix` segment-wise (docs/protocol.md §3.6).
pub(in crate::session) fn join(prefix: &str, suffix: &str) -> Result<PathBuf<{ MAX_PATH }>, ()> {
    let mut suffix_buf = PathBuf::<{ MAX_PATH }>::new();
    let suffix = Path::new_in(suffix, &mut suffix_buf).map_err(|_| ())?;
    let prefix = Path::new(prefix).map_err(|_| ())?;
    PathBuf::join(prefix, suffix).map_err(|_| ())
}

/// A broadcast path off the wire, normalized (in `buf` if it had to be collapsed).
pub(in crate::session) fn normalize<'s>(
    s: &'s str,
    buf: &'s mut PathBuf<{ MAX_PATH }>,
) -> Option<Path<'s>> {
    Path::new_in(s, buf).ok()
}

/// A broadcast path the peer named, in our origin's terms: `root` (the path
/// the peer dialed) joined with it, normalized (docs/protocol.md §4.1); in
/// `buf` unless `root` is empty and `s` needed no collapsing.
pub(in crate::session) fn rooted<'s>(
    root: &PathBuf<{ MAX_PATH }>,
    s: &'s str,
    buf: &'s mut PathBuf<{ MAX_PATH }>,
) -> Option<Path<'s>> {
    if root.as_str().is_empty() {
        return normalize(s, buf);
    }
    *buf = join(root.as_str(), s).ok()?;
    Some(buf.as_path())
}

/// One of our origin's paths as the peer names it: relative to `root`
/// (docs/protocol.md §4.1); `None` when it lies outside the root.
pub(in crate::session) fn unrooted<'f>(
    root: &PathBuf<{ MAX_PATH }>,
    full: Path<'f>,
) -> Option<Path<'f>> {
    full.strip_prefix(root.as_path())
}
