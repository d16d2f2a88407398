//! Secrets out of whatever the tool prints: the password of any URL in a message (a usage
//! error may quote an argument: `dlock redis://:pw@h list` names `redis://:pw@h` as an unknown
//! subcommand), and `pass=` / `password=` query values. The runtime's own errors are redacted
//! already; this is the last line for everything else.

/// Query options whose values are secrets.
const SECRET_OPTIONS: [&str; 2] = ["pass", "password"];

/// `text` with every URL password and secret query value replaced by `***`.
pub(crate) fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The URL runs to the next blank or quote; its userinfo to its last `@` (a password
        // may hold `@`, `/`, `:`; hiding too much is fine, too little is not).
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`'))
            .unwrap_or(tail.len());
        let (url, after) = tail.split_at(end);
        match url.rfind('@') {
            Some(at_sign) => {
                let (userinfo, hosts) = url.split_at(at_sign);
                match userinfo.split_once(':') {
                    Some((user, _)) if !user.contains(['/', '?', '#']) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    _ => out.push_str("***"),
                }
                out.push_str(hosts);
            }
            None => out.push_str(url),
        }
        rest = after;
    }
    out.push_str(rest);
    redact_options(&out)
}

/// `pass=secret` -> `pass=***` wherever such a pair appears (after `?`, `&` or a blank).
fn redact_options(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for name in SECRET_OPTIONS {
            let pair = format!("{name}=");
            let starts = rest.len() >= pair.len()
                && rest.as_bytes()[..pair.len()].eq_ignore_ascii_case(pair.as_bytes());
            let after_separator = out
                .chars()
                .last()
                .is_none_or(|c| matches!(c, '?' | '&' | ';') || c.is_whitespace());
            if starts && after_separator {
                out.push_str(&rest[..pair.len()]);
                out.push_str("***");
                let value = &rest[pair.len()..];
                let end = value
                    .find(|c: char| {
                        c == '&' || c == '#' || c.is_whitespace() || matches!(c, '\'' | '"' | '`')
                    })
                    .unwrap_or(value.len());
                rest = &value[end..];
                continue 'scan;
            }
        }
        let mut chars = rest.chars();
        if let Some(c) = chars.next() {
            out.push(c);
        }
        rest = chars.as_str();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive() {
        let cases = [
            ("redis://:s3cret@h:6379", "redis://:***@h:6379"),
            (
                "error: 'redis://user:s3cret@h:1/0' found",
                "error: 'redis://user:***@h:1/0' found",
            ),
            ("rediss://u:p@ss/w:rd@h:1 x", "rediss://u:***@h:1 x"),
            (
                "redis+cluster://:pw@a:1,b:2",
                "redis+cluster://:***@a:1,b:2",
            ),
            ("redis://token@h:1", "redis://***@h:1"),
            (
                "redis://h:1?user=u&pass=s3cret&db=1",
                "redis://h:1?user=u&pass=***&db=1",
            ),
            ("redis://h:1?PASSWORD=s3cret", "redis://h:1?PASSWORD=***"),
            ("no url here, bypass=1", "no url here, bypass=1"),
            ("memory://", "memory://"),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text), want, "{text}");
        }
    }
}
