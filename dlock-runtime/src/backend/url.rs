//! Lock URLs, split once for every engine: `scheme://base?name=value&...#fragment`.
//!
//! The runtime takes its own options (`prefix`, `lease`, `wait`, `timeout`) out of the query;
//! the engine named by the scheme reads the base, the fragment and the remaining options, and
//! rejects what it does not know with its own message.

use std::fmt;

use super::{EngineConfig, Setting};
use crate::LockError;

/// The options every lock URL takes: the runtime's, whatever the engine.
pub(crate) const RUNTIME_OPTIONS: [&str; 4] = ["prefix", "lease", "wait", "timeout"];

/// Query options whose value is a secret: shown as `***` in every message.
const SECRET_OPTIONS: [&str; 2] = ["pass", "password"];

/// A lock URL split into its parts. `Debug` shows the redacted URL only.
#[derive(Clone)]
pub(crate) struct EngineUrl<'a> {
    /// The whole URL with its secrets redacted ([`redact`]), for messages.
    pub(crate) url: String,
    pub(crate) scheme: &'a str,
    /// Between `://` and `?` (or `#`): hosts, path.
    pub(crate) base: &'a str,
    pub(crate) fragment: Option<&'a str>,
    /// Query pairs not taken by the runtime, as written (`name=value`).
    pub(crate) options: Vec<&'a str>,
}

impl<'a> EngineUrl<'a> {
    /// Splits `url`; every query pair goes to `options` (the runtime takes its own out).
    pub(crate) fn parse(url: &'a str) -> Result<Self, LockError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::config(format!(
                "`{}` is not a lock URL; expected e.g. redis://host:port or memory://",
                redact(url)
            ))
        })?;
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let (base, query) = match rest.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (rest, None),
        };
        let options = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
            .collect();
        Ok(Self {
            url: redact(url),
            scheme,
            base,
            fragment,
            options,
        })
    }

    /// Removes and returns the options named in `names`, as `(name, value)`.
    pub(crate) fn take_options(&mut self, names: &[&str]) -> Vec<(&'a str, &'a str)> {
        let mut taken = Vec::new();
        self.options.retain(|pair| {
            let (name, value) = split_pair(pair);
            if names.contains(&name) {
                taken.push((name, value));
                false
            } else {
                true
            }
        });
        taken
    }

    #[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
    /// The comma-separated hosts of the base (before any `/path`), none of them empty.
    pub(crate) fn hosts(&self, expected: &str) -> Result<Vec<&'a str>, LockError> {
        let hosts: Vec<&str> = self
            .base
            .trim_end_matches('/')
            .split(',')
            .map(str::trim)
            .collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(LockError::config(format!(
                "`{}`: expected {expected}",
                self.url
            )));
        }
        Ok(hosts)
    }

    /// Gives every option to `config`, except those in `pass_through` (read by the engine's
    /// client from its node URLs); an option `config` does not know is `InvalidConfig`
    /// naming every valid one.
    pub(crate) fn apply_options(
        &self,
        config: &mut dyn EngineConfig,
        pass_through: &[&str],
    ) -> Result<(), LockError> {
        for pair in &self.options {
            let (name, value) = split_pair(pair);
            if !pass_through.contains(&name) && !config.set(name, Setting::Text(value))? {
                return Err(self.unknown_option(pair, config.options()));
            }
        }
        Ok(())
    }

    /// The error for an option the engine does not know, listing every valid one.
    pub(crate) fn unknown_option(&self, pair: &str, engine_options: &[&str]) -> LockError {
        let mut valid: Vec<&str> = RUNTIME_OPTIONS.to_vec();
        valid.extend_from_slice(engine_options);
        let (last, rest) = valid.split_last().map_or(("", &[][..]), |(l, r)| (*l, r));
        LockError::config(format!(
            "unknown option `{}` in `{}`; expected {} or {last}",
            redact_pair(pair),
            self.url,
            rest.join(", ")
        ))
    }
}

impl fmt::Debug for EngineUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EngineUrl").field(&self.url).finish()
    }
}

/// `url` with every secret replaced by `***`: the password of each `user:password@` (one per
/// host where a URL lists several) and the value of a `pass=` or `password=` query option. The
/// rest (scheme, user names, hosts, path, other options) stays, so a message still says which
/// server it is about. Works on anything a user may pass as a URL, well-formed or not.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    out.push_str(&redact_authority(authority));
    let (before_fragment, fragment) = match tail.split_once('#') {
        Some((head, fragment)) => (head, Some(fragment)),
        None => (tail, None),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let pairs: Vec<String> = query.split('&').map(redact_pair).collect();
            out.push_str(&pairs.join("&"));
        }
        None => out.push_str(before_fragment),
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// `name=***` when `name` is a secret option, else `pair` as written.
pub(crate) fn redact_pair(pair: &str) -> String {
    let (name, _) = split_pair(pair);
    if pair.contains('=') && SECRET_OPTIONS.iter().any(|s| s.eq_ignore_ascii_case(name)) {
        format!("{name}=***")
    } else {
        pair.to_owned()
    }
}

/// `h1,user:pw@h2,:pw@h3` with each password replaced. Hosts never contain `,` or `@`; a
/// password may (unencoded), so whatever is ambiguous is hidden whole.
fn redact_authority(authority: &str) -> String {
    let pieces: Vec<&str> = authority.split('@').collect();
    let Some((last, before)) = pieces.split_last() else {
        return String::new();
    };
    let mut out = String::with_capacity(authority.len());
    for (i, piece) in before.iter().enumerate() {
        // Each piece ends where a userinfo meets its host: the hosts before it (after the
        // previous `@`) end at the first comma. Before the first `@` a comma may belong to
        // the password, so all of it counts as userinfo.
        let (hosts, userinfo) = match (i, piece.find(',')) {
            (0, _) => ("", *piece),
            (_, Some(comma)) => piece.split_at(comma + 1),
            // Between two `@` with no host list: part of a password.
            (_, None) => ("", ""),
        };
        out.push_str(hosts);
        match userinfo.split_once(':') {
            Some((user, _)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None if i == 0 || !hosts.is_empty() => out.push_str(userinfo),
            None => out.push_str("***"),
        }
        out.push('@');
    }
    out.push_str(last);
    out
}

/// `name=value` (a bare `name` has an empty value).
pub(crate) fn split_pair(pair: &str) -> (&str, &str) {
    pair.split_once('=').unwrap_or((pair, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_scheme_base_query_and_fragment() {
        let mut url =
            EngineUrl::parse("redis://h:1/2?prefix=a:&db=3&&lease=1s#insecure").expect("valid url");
        assert_eq!(url.scheme, "redis");
        assert_eq!(url.base, "h:1/2");
        assert_eq!(url.fragment, Some("insecure"));
        assert_eq!(
            url.take_options(&RUNTIME_OPTIONS),
            vec![("prefix", "a:"), ("lease", "1s")]
        );
        assert_eq!(url.options, vec!["db=3"]);
        assert!(EngineUrl::parse("localhost:6379").is_err());
    }

    #[test]
    fn hosts_must_not_be_empty() {
        let url = EngineUrl::parse("etcd://a:1, b:2/").expect("valid url");
        assert_eq!(
            url.hosts("etcd://h1,h2").expect("hosts"),
            vec!["a:1", "b:2"]
        );
        let url = EngineUrl::parse("etcd://a:1,,b:2").expect("valid url");
        assert!(url.hosts("etcd://h1,h2").is_err());
    }

    #[test]
    fn secrets_are_redacted() {
        let cases = [
            ("redis://:s3cret@h:1/0", "redis://:***@h:1/0"),
            ("rediss://app:s3cret@h:1?db=2", "rediss://app:***@h:1?db=2"),
            ("redis://h:1", "redis://h:1"),
            ("redis://app@h:1", "redis://app@h:1"),
            (
                "redis://h:1/?db=1&pass=s3cret#x",
                "redis://h:1/?db=1&pass=***#x",
            ),
            (
                "redis://h:1?PASSWORD=s3cret&user=app",
                "redis://h:1?PASSWORD=***&user=app",
            ),
            (
                "redis+cluster://app:s3cret@a:1,b:2,c:3?prefix=p:",
                "redis+cluster://app:***@a:1,b:2,c:3?prefix=p:",
            ),
            (
                // Over-hidden rather than under: before the first `@` a comma may be a password's.
                "redlock://a:1,:s3cret@b:2,u:s3cret@c:3",
                "redlock://a:***@b:2,u:***@c:3",
            ),
            ("redis://:s3@cret@h:1", "redis://:***@***@h:1"),
            ("redis://:s3cr,et@h:1", "redis://:***@h:1"),
            ("app:s3cret@h:1", "app:***@h:1"),
            ("", ""),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
            assert!(!redact(url).contains("s3"), "{url}");
        }
        let err = EngineUrl::parse(":s3cret@h:1").expect_err("no scheme");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let url = EngineUrl::parse("zk://u:s3cret@h:1?pass=s3cret").expect("valid url");
        assert!(!format!("{url:?}").contains("s3cret"));
        let err = url.unknown_option("pass=s3cret", &[]).to_string();
        assert!(
            !err.contains("s3cret") && err.contains("`pass=***`"),
            "{err}"
        );
    }

    #[test]
    fn unknown_options_list_the_valid_ones() {
        let url = EngineUrl::parse("zk://h:1?x=1").expect("valid url");
        let err = url.unknown_option("x=1", &["session_timeout"]).to_string();
        assert!(
            err.contains("expected prefix, lease, wait, timeout or session_timeout"),
            "{err}"
        );
    }
}
