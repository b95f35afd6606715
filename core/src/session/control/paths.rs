//! Broadcast paths off the wire: normalized, or joined to a request's prefix.

use crate::model::path::{Path, PathBuf};
use crate::session::MAX_PATH;

/// `prefix` joined with `suffix` segment-wise (docs/protocol.md §3.6).
pub(super) fn join(prefix: &str, suffix: &str) -> Result<PathBuf<{ MAX_PATH }>, ()> {
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
