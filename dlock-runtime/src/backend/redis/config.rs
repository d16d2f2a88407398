//! Configuration of the Redis engines: `redis://`, `rediss://` (one server) and
//! `redis+cluster://`, `rediss+cluster://` (a cluster, one URL per seed node). Query options
//! the redis client reads (`protocol`, `db`, `user`, `pass`) are passed on to every node URL;
//! anything else is a typo, not an option.

use std::fmt;
use std::sync::Arc;

use super::RedisBackend;
use crate::LockError;
use crate::backend::url::{EngineUrl, split_pair};
use crate::backend::{BoxFuture, Context, DynBackend, EngineConfig, Setting};

/// The query options the redis client reads from a node URL.
pub(crate) const CLIENT_OPTIONS: [&str; 4] = ["protocol", "db", "user", "pass"];

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
        let config = match url.scheme.strip_suffix("+cluster") {
            Some(node_scheme) => {
                let hosts = url.hosts(&format!("{}://host1:port1,host2:port2,...", url.scheme))?;
                Self::Cluster(node_urls(url, node_scheme, &hosts, &[])?)
            }
            None => Self::Single(node_urls(url, url.scheme, &[url.base], &[])?.remove(0)),
        };
        Ok(Box::new(config))
    }
}

/// One node URL per host: `node_scheme://host`, plus the URL's client options and fragment.
/// Options other than the client's and `extra` are rejected.
pub(crate) fn node_urls(
    url: &EngineUrl<'_>,
    node_scheme: &str,
    hosts: &[&str],
    extra: &[&str],
) -> Result<Vec<String>, LockError> {
    let mut valid: Vec<&str> = extra.to_vec();
    valid.extend_from_slice(&CLIENT_OPTIONS);
    let mut client_options = Vec::new();
    for pair in &url.options {
        let (name, _) = split_pair(pair);
        if CLIENT_OPTIONS.contains(&name) {
            client_options.push(*pair);
        } else if !extra.contains(&name) {
            return Err(url.unknown_option(pair, &valid));
        }
    }
    Ok(hosts
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
        .collect())
}

/// A `rediss://` URL needs the `tls` feature.
pub(crate) fn check_tls(url: &str) -> Result<(), LockError> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(LockError::config(format!(
            "`{}` needs TLS: enable the `tls` feature of dlock-runtime",
            redact(url)
        )));
    }
    Ok(())
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

    fn set(&mut self, _name: &str, _value: Setting<'_>) -> Result<bool, LockError> {
        Ok(false)
    }

    fn options(&self) -> &'static [&'static str] {
        &CLIENT_OPTIONS
    }

    fn clone_box(&self) -> Box<dyn EngineConfig> {
        Box::new(self.clone())
    }

    fn connect(
        self: Box<Self>,
        ctx: Context,
    ) -> BoxFuture<'static, Result<Arc<dyn DynBackend>, LockError>> {
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
    fn node_urls_carry_client_options_and_reject_others() {
        let url = EngineUrl::parse("redis+cluster://a:1,b:2?db=0#insecure").expect("url");
        assert_eq!(
            node_urls(&url, "redis", &["a:1", "b:2"], &[]).expect("urls"),
            vec!["redis://a:1?db=0#insecure", "redis://b:2?db=0#insecure"]
        );
        let url = EngineUrl::parse("redis://a:1?dbb=2").expect("url");
        let err = node_urls(&url, "redis", &["a:1"], &[]).expect_err("typo");
        assert!(err.is_invalid_config());
    }
}
