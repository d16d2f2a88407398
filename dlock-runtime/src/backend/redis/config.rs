//! Configuration of the Redis engines: `redis://`, `rediss://` (one server) and
//! `redis+cluster://`, `rediss+cluster://` (a cluster, one URL per seed node). Query options
//! the redis client reads (`protocol`, `db`, `user`, `pass`) and `ca` (a PEM file of the
//! certificate authorities to trust for `rediss://`, instead of the webpki roots) are passed
//! on to every node URL; anything else is a typo, not an option.
//!
//! TLS always verifies the server's certificate. The redis client's `#insecure` fragment,
//! which turns verification off, is refused unless the crate is built with the loudly named
//! feature `tls-insecure-skip-verify`.

use std::fmt;
use std::sync::Arc;

use super::RedisBackend;
use crate::LockError;
use crate::backend::url::{EngineUrl, split_pair};
use crate::backend::{Connecting, Context, DynBackend, EngineConfig};

/// The query options of a node URL: the redis client's, and `ca`.
pub(crate) const CLIENT_OPTIONS: [&str; 5] = ["protocol", "db", "user", "pass", "ca"];

/// One server or a cluster.
#[derive(Clone)]
pub(crate) enum RedisConfig {
    Single(String),
    Cluster(Vec<String>),
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single(url) => f.debug_tuple("Single").field(&redact(url)).finish(),
            Self::Cluster(seeds) => f
                .debug_tuple("Cluster")
                .field(&seeds.iter().map(|s| redact(s)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl RedisConfig {
    /// `redis://`, `rediss://`, `redis+cluster://`, `rediss+cluster://`.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        let mut config = match url.scheme.strip_suffix("+cluster") {
            Some(node_scheme) => {
                let hosts = url.hosts(&format!("{}://host1:port1,host2:port2,...", url.scheme))?;
                Self::Cluster(node_urls(url, node_scheme, &hosts))
            }
            None => Self::Single(node_urls(url, url.scheme, &[url.base]).remove(0)),
        };
        url.apply_options(&mut config, &CLIENT_OPTIONS)?;
        Ok(Box::new(config))
    }
}

/// One node URL per host: `node_scheme://host`, plus the URL's client options and fragment.
pub(crate) fn node_urls(url: &EngineUrl<'_>, node_scheme: &str, hosts: &[&str]) -> Vec<String> {
    let client_options: Vec<&str> = url
        .options
        .iter()
        .copied()
        .filter(|pair| CLIENT_OPTIONS.contains(&split_pair(pair).0))
        .collect();
    hosts
        .iter()
        .map(|host| {
            let mut node = format!("{node_scheme}://{host}");
            if !client_options.is_empty() {
                node.push('?');
                node.push_str(&client_options.join("&"));
            }
            if let Some(fragment) = url.fragment {
                node.push('#');
                node.push_str(fragment);
            }
            node
        })
        .collect()
}

/// A `rediss://` URL needs the `tls` feature; `#insecure` needs `tls-insecure-skip-verify`.
pub(crate) fn check_tls(url: &str) -> Result<(), LockError> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(LockError::config(format!(
            "`{}` needs TLS: enable the `tls` feature of dlock-runtime",
            redact(url)
        )));
    }
    if url.ends_with("#insecure") && !cfg!(feature = "tls-insecure-skip-verify") {
        return Err(LockError::config(format!(
            "`{}`: #insecure turns off TLS certificate verification; trust a private CA with `?ca=/path/ca.pem` instead, or enable the `tls-insecure-skip-verify` feature of dlock-runtime",
            redact(url)
        )));
    }
    Ok(())
}

/// Takes the `ca=<path>` option out of a node URL: the URL for the redis client, and the PEM
/// certificates to trust (read now).
pub(crate) fn take_ca(url: &str) -> Result<(String, Option<Vec<u8>>), LockError> {
    let (head, fragment) = match url.split_once('#') {
        Some((head, fragment)) => (head, Some(fragment)),
        None => (url, None),
    };
    let Some((base, query)) = head.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut ca = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("ca=") {
            Some(path) => {
                ca = Some(path);
                false
            }
            None => true,
        })
        .collect();
    let mut out = base.to_owned();
    if !rest.is_empty() {
        out.push('?');
        out.push_str(&rest.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    let pem = match ca {
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            LockError::config(format!("cannot read the CA certificates `{path}`: {e}"))
        })?),
        None => None,
    };
    Ok((out, pem))
}

/// `url` with any password replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl EngineConfig for RedisConfig {
    fn name(&self) -> &'static str {
        match self {
            Self::Single(_) => "redis",
            Self::Cluster(_) => "redis-cluster",
        }
    }

    fn options(&self) -> &'static [&'static str] {
        &CLIENT_OPTIONS
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            let backend = match *self {
                Self::Single(url) => {
                    check_tls(&url)?;
                    RedisBackend::connect(&url, &ctx).await?
                }
                Self::Cluster(seeds) => {
                    if seeds.is_empty() {
                        return Err(LockError::config(
                            "redis_cluster needs at least one seed URL",
                        ));
                    }
                    for seed in &seeds {
                        check_tls(seed)?;
                    }
                    RedisBackend::connect_cluster(&seeds, &ctx).await?
                }
            };
            Ok(Arc::new(backend) as Arc<dyn DynBackend>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://:s3cret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(
            redact("rediss://app:s3cret@h:1?db=2"),
            "rediss://app:***@h:1?db=2"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn ca_is_taken_out_of_the_url() {
        let (url, pem) = take_ca("rediss://h:1/0?db=2").expect("no ca");
        assert_eq!((url.as_str(), pem), ("rediss://h:1/0?db=2", None));
        let err = take_ca("rediss://h:1/?ca=/nonexistent/ca.pem&db=2#x").expect_err("missing file");
        assert!(err.is_invalid_config(), "{err}");
        let path = std::env::temp_dir().join(format!("dlock-ca-{}.pem", std::process::id()));
        std::fs::write(&path, b"pem").expect("write a file");
        let (url, pem) =
            take_ca(&format!("rediss://h:1/?ca={}&db=2#x", path.display())).expect("ca");
        std::fs::remove_file(&path).ok();
        assert_eq!(url, "rediss://h:1/?db=2#x");
        assert_eq!(pem.as_deref(), Some(&b"pem"[..]));
    }

    #[test]
    fn insecure_needs_its_own_feature() {
        let outcome = check_tls("rediss://h:1/#insecure");
        assert_eq!(
            outcome.is_ok(),
            cfg!(feature = "tls-insecure-skip-verify"),
            "{outcome:?}"
        );
    }

    #[test]
    fn node_urls_carry_client_options_and_reject_others() {
        let url = EngineUrl::parse("redis+cluster://a:1,b:2?db=0#insecure").expect("url");
        assert_eq!(
            node_urls(&url, "redis", &["a:1", "b:2"]),
            vec!["redis://a:1?db=0#insecure", "redis://b:2?db=0#insecure"]
        );
        let url = EngineUrl::parse("redis://a:1?dbb=2").expect("url");
        let err = RedisConfig::from_url(&url).expect_err("typo");
        assert!(err.is_invalid_config());
        assert!(err.to_string().contains("`dbb=2`"), "{err}");
    }
}
