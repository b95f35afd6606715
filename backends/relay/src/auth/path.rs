//! Paths as dialed: slashes are implicit at boundaries, and a prefix only
//! counts at a segment boundary.

/// `path` with leading, trailing and repeated slashes removed (`/a//b/` is `a/b`).
pub fn normalize(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// What follows `prefix` in `path` (both normalized), if `prefix` ends at a
/// segment boundary of `path`.
pub fn strip_prefix<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(path);
    }
    let rest = path.strip_prefix(prefix)?;
    match rest.as_bytes().first() {
        None => Some(""),
        Some(b'/') => Some(&rest[1..]),
        Some(_) => None,
    }
}

/// The path and the `jwt` query parameter of what a session dialed
/// (`/room?jwt=abc`). The last non-empty `jwt` wins, as moq-dev reads it; a
/// JWT is base64url and is taken verbatim, without unescaping.
pub fn split_dialed(dialed: &str) -> (&str, Option<&str>) {
    let (path, query) = dialed.split_once('?').unwrap_or((dialed, ""));
    let jwt = query
        .split('&')
        .filter_map(|pair| pair.strip_prefix("jwt="))
        .rfind(|jwt| !jwt.is_empty());
    (path, jwt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(normalize(""), "");
        assert_eq!(normalize("/"), "");
        assert_eq!(normalize("//a///b//"), "a/b");
    }

    #[test]
    fn strips_at_boundaries() {
        assert_eq!(strip_prefix("a/b", ""), Some("a/b"));
        assert_eq!(strip_prefix("a/b", "a"), Some("b"));
        assert_eq!(strip_prefix("a/b", "a/b"), Some(""));
        assert_eq!(strip_prefix("ab", "a"), None);
    }

    #[test]
    fn splits_the_query() {
        assert_eq!(split_dialed("/room"), ("/room", None));
        assert_eq!(split_dialed("/room?jwt=abc"), ("/room", Some("abc")));
        assert_eq!(
            split_dialed("/r?a=1&jwt=old&jwt=new&jwt="),
            ("/r", Some("new"))
        );
        assert_eq!(split_dialed("?jwt=&b=2"), ("", None));
        assert_eq!(split_dialed("/r?x=jwt=1"), ("/r", None));
    }
}
