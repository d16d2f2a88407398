//! Lock URLs, split once for every engine: `scheme://base?name=value&...#fragment`.
//!
//! The runtime takes its own options (`prefix`, `lease`, `wait`, `timeout`) out of the query;
//! the engine named by the scheme reads the base, the fragment and the remaining options, and
//! rejects what it does not know with its own message.

use std::fmt;

use super::{EngineConfig, Setting};
use crate::error::LockError;

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
    /// Between `://` and `?` (or `#`): userinfos, hosts, path ([`split_authority`]).
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
        let (authority, tail) = split_authority(rest);
        let (path, query, fragment) = split_tail(tail);
        let base = &rest[..authority.len() + path.len()];
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
    /// The comma-separated hosts of the base (before any `/path`), each with its
    /// `userinfo@` if it has one ([`host_entries`]), none of them empty.
    pub(crate) fn hosts(&self, expected: &str) -> Result<Vec<&'a str>, LockError> {
        let (authority, path) = split_authority(self.base);
        let mut hosts: Vec<&str> = host_entries(authority)
            .into_iter()
            .map(|entry| entry.whole)
            .collect();
        // A path stays with the last host, as written (`/0`: its db); a final `/` goes.
        if let Some(last) = hosts.last_mut() {
            let end = authority.len() + path.trim_end_matches('/').len();
            *last = &self.base[authority.len() - last.len()..end];
        }
        let hosts: Vec<&str> = hosts.into_iter().map(str::trim).collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err(LockError::config(format!(
                "`{}`: expected {expected}",
                self.url
            )));
        }
        Ok(hosts)
    }

    #[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
    /// `InvalidConfig` when the URL has a `userinfo@`: for engines that take no credentials
    /// in their URL (the password is not shown, and not sent anywhere).
    pub(crate) fn refuse_userinfo(&self, engine: &str) -> Result<(), LockError> {
        if split_authority(self.base).0.contains('@') {
            return Err(LockError::config(format!(
                "`{}`: {engine} takes no `user:password@` in its URL",
                self.url
            )));
        }
        Ok(())
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

/// Splits what follows `scheme://` into the authority (userinfos and hosts) and the rest
/// (path, query, fragment). A password may hold any character, written as is: `@`, `/`, `?`,
/// `#` too, so the authority runs to the first `/`, `?` or `#` after its **last** `@` (an
/// `@` in a path, an option value or a fragment must therefore be written `%40`).
pub(crate) fn split_authority(rest: &str) -> (&str, &str) {
    let hosts_start = rest.rfind('@').map_or(0, |at| at + 1);
    let end = rest[hosts_start..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| hosts_start + i);
    rest.split_at(end)
}

/// What follows the authority: its path, its query (after `?`) and its fragment (after `#`).
pub(crate) fn split_tail(tail: &str) -> (&str, Option<&str>, Option<&str>) {
    let (head, fragment) = match tail.split_once('#') {
        Some((head, fragment)) => (head, Some(fragment)),
        None => (tail, None),
    };
    match head.split_once('?') {
        Some((path, query)) => (path, Some(query), fragment),
        None => (head, None, fragment),
    }
}

/// One host of an authority, with the `userinfo@` written before it, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostEntry<'a> {
    /// `userinfo@host` as written (or `host`).
    pub(crate) whole: &'a str,
    /// Between the entry's start and the `@` before its host.
    pub(crate) userinfo: Option<&'a str>,
}

/// The entries of an authority `[userinfo@]host[,[userinfo@]host]...`. A host holds neither
/// `,` nor `@`; a userinfo may hold both, so where that is ambiguous the userinfo takes the
/// text: everything before the first `@` is the first entry's userinfo, and after a host the
/// next entry's userinfo starts at the first comma-separated element that is not a plain
/// `host[:port]` (a password such as `pw,x` is never split into a host).
pub(crate) fn host_entries(authority: &str) -> Vec<HostEntry<'_>> {
    let mut entries = Vec::new();
    // Where the entry being read starts, and the `@` that ends its userinfo so far.
    let mut start = 0;
    let mut at: Option<usize> = None;
    for (i, _) in authority.match_indices('@') {
        let Some(userinfo_end) = at else {
            at = Some(i);
            continue;
        };
        // Between two `@`: a host, hosts without userinfo, then the next userinfo (at least
        // the last element). Without a comma the `@` is the userinfo's own.
        let piece = &authority[userinfo_end + 1..i];
        // A comma after something that is no host name is the password's own.
        let Some((host, others)) = piece
            .split_once(',')
            .filter(|(host, _)| is_plain_host(host))
        else {
            at = Some(i);
            continue;
        };
        entries.push(HostEntry {
            whole: &authority[start..userinfo_end + 1 + host.len()],
            userinfo: Some(&authority[start..userinfo_end]),
        });
        let mut next = userinfo_end + 1 + host.len() + 1;
        let mut elements: Vec<&str> = others.split(',').collect();
        elements.pop();
        for element in elements {
            if !is_plain_host(element) {
                break;
            }
            entries.push(HostEntry {
                whole: element,
                userinfo: None,
            });
            next += element.len() + 1;
        }
        start = next;
        at = Some(i);
    }
    let hosts_start = at.map_or(0, |at| at + 1);
    let mut hosts = authority[hosts_start..].split(',');
    let first = hosts.next().unwrap_or_default();
    entries.push(HostEntry {
        whole: &authority[start..hosts_start + first.len()],
        userinfo: at.map(|at| &authority[start..at]),
    });
    entries.extend(hosts.map(|whole| HostEntry {
        whole,
        userinfo: None,
    }));
    entries
}

/// `name`, `name:port` or `[v6]:port`: a host as written, with digits only for a port.
fn is_plain_host(text: &str) -> bool {
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.starts_with('[') => (host, Some(port)),
        _ => (text, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'))
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `url` with every secret replaced by `***`: the password of each `user:password@` (one per
/// host where a URL lists several, found as [`host_entries`] finds them) and the value of a
/// `pass=` or `password=` query option. The rest (scheme, user names, hosts, path, other
/// options) stays, so a message still says which server it is about. Works on anything a user
/// may pass as a URL, well-formed or not; where a password makes it ambiguous, more is hidden.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let (authority, tail) = split_authority(rest);
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    let entries: Vec<String> = host_entries(authority)
        .into_iter()
        .map(|entry| match entry.userinfo {
            Some(userinfo) => {
                let host = &entry.whole[userinfo.len() + 1..];
                match userinfo.split_once(':') {
                    Some((user, _)) => format!("{user}:***@{host}"),
                    None => format!("{userinfo}@{host}"),
                }
            }
            None => entry.whole.to_owned(),
        })
        .collect();
    out.push_str(&entries.join(","));
    let (path, query, fragment) = split_tail(tail);
    out.push_str(path);
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query.split('&').map(redact_pair).collect();
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// [`redact`] of each of `urls` (the endpoints of an engine that takes several).
pub(crate) fn redact_each(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redact(url)).collect()
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
            ("redis://:s3@cret@h:1", "redis://:***@h:1"),
            ("redis://:s3cr#et@h:1/0?db=1", "redis://:***@h:1/0?db=1"),
            ("redis://:s3/cr?et@h:1", "redis://:***@h:1"),
            (
                "redis+cluster://app:pw@a:1,b:2,u:o,wn@c:3",
                "redis+cluster://app:***@a:1,b:2,u:***@c:3",
            ),
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
