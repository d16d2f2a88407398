//! Node names: a user key as one path segment, and the sequence number of a queue node.

/// The node of `key`'s queue under `root`: `<root>/<escaped key>`.
pub(super) fn parent(root: &str, key: &str) -> String {
    format!("{root}/{}", escape(key))
}

/// A key as one path segment: `%`, `/`, and every character ZooKeeper rejects in a path
/// (controls, U+007F-U+009F, U+E000-U+F8FF, U+FFF0-U+FFFF, and everything outside the Basic
/// Multilingual Plane, which Java sees as surrogates) percent-encoded as UTF-8; the names `.`
/// and `..` avoided.
pub(crate) fn escape(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        let code = u32::from(c);
        let rejected = c == '%'
            || c == '/'
            || code < 0x20
            || (0x7f..=0x9f).contains(&code)
            || (0xe000..=0xf8ff).contains(&code)
            || (0xfff0..=0xffff).contains(&code)
            || code > 0xffff;
        if rejected {
            let mut buf = [0u8; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    match out.as_str() {
        "" | "." | ".." => format!("%{out}"),
        _ => out,
    }
}

/// The key a path segment made by [`escape`] stands for (`None` for a segment it cannot
/// have made).
pub(super) fn unescape(segment: &str) -> Option<String> {
    let segment = match segment {
        "%" => return Some(String::new()),
        "%." => return Some(".".to_owned()),
        "%.." => return Some("..".to_owned()),
        other => other,
    };
    let mut bytes = Vec::with_capacity(segment.len());
    let mut rest = segment.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The sequence number at the end of a `lock-<owner>-<sequence>` node name.
pub(super) fn sequence(name: &str) -> Option<i64> {
    name.strip_prefix("lock-")?.rsplit('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_path_segment() {
        assert_eq!(escape("stock:42"), "stock:42");
        assert_eq!(escape("🔒 lock"), "%F0%9F%94%92 lock");
        assert_eq!(escape("tab\there"), "tab%09here");
        assert_eq!(escape("a/b"), "a%2Fb");
        assert_eq!(escape("100%"), "100%25");
        assert_eq!(escape(".."), "%..");
        assert_eq!(escape("ключ {x}"), "ключ {x}");
    }

    #[test]
    fn segments_map_back_to_their_keys() {
        for key in [
            "stock:42",
            "🔒 lock",
            "tab\there",
            "a/b",
            "100%",
            "..",
            ".",
            "",
            "%2F",
            "ключ {x}",
        ] {
            assert_eq!(unescape(&escape(key)).as_deref(), Some(key), "{key:?}");
        }
        assert_eq!(unescape("bad%2"), None);
        assert_eq!(unescape("bad%zz"), None);
    }

    #[test]
    fn sequences_parse_from_node_names() {
        assert_eq!(sequence("lock-0000000042"), Some(42));
        assert_eq!(
            sequence("lock-0123456789abcdef0123456789abcdef-0000000042"),
            Some(42)
        );
        assert_eq!(sequence("other"), None);
    }
}
