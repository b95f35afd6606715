//! File names of recorded broadcasts and tracks: a broadcast path or a track
//! name becomes one path component that cannot leave the recording
//! directory (`/`, `..` and every byte but `[A-Za-z0-9_-.]` are written
//! `%XX`; a leading `.` too), and is read back exactly.

/// `name` as one safe path component (empty for an empty name).
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if plain {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The name [`encode`] wrote as `component`, or `None` if it is not one of
/// its outputs (a stray file in the directory).
pub fn decode(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hi = hex_value(*bytes.get(i + 1)?)?;
            let lo = hex_value(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (encode(&name) == component).then_some(name)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_one_component_and_come_back() {
        for name in [
            "anon/cam.hang",
            "..",
            ".hidden",
            "a b",
            "ü/x",
            "video",
            "a%2F",
        ] {
            let c = encode(name);
            assert!(!c.contains('/') && c != ".." && !c.starts_with('.'), "{c}");
            assert_eq!(decode(&c).as_deref(), Some(name));
        }
        assert_eq!(encode("anon/cam.hang"), "anon%2Fcam.hang");
        for bad in ["..", "%2", "%zz", "a/b", "%2f", ".x"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
