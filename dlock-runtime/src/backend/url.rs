//! Lock URLs, split once for every engine: `scheme://base?name=value&...#fragment`.
//!
//! The runtime takes its own options (`prefix`, `lease`, `wait`, `timeout`) out of the query;
//! the engine named by the scheme reads the base, the fragment and the remaining options, and
//! rejects what it does not know with its own message.

use super::{EngineConfig, Setting};
use crate::LockError;

/// The options every lock URL takes: the runtime's, whatever the engine.
pub(crate) const RUNTIME_OPTIONS: [&str; 4] = ["prefix", "lease", "wait", "timeout"];

/// A lock URL split into its parts.
#[derive(Debug, Clone)]
pub(crate) struct EngineUrl<'a> {
    /// The whole URL, for messages.
    pub(crate) url: &'a str,
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
                "`{url}` is not a lock URL; expected e.g. redis://host:port or memory://"
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
            url,
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
            "unknown option `{pair}` in `{}`; expected {} or {last}",
            self.url,
            rest.join(", ")
        ))
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
    fn unknown_options_list_the_valid_ones() {
        let url = EngineUrl::parse("zk://h:1?x=1").expect("valid url");
        let err = url.unknown_option("x=1", &["session_timeout"]).to_string();
        assert!(
            err.contains("expected prefix, lease, wait, timeout or session_timeout"),
            "{err}"
        );
    }
}
