//! The one table from a URL scheme, or a builder method, to an engine's configuration. Adding
//! an engine is a folder under `backend/` plus a line here.

use crate::LockError;
use crate::backend::EngineConfig;
use crate::backend::memory::MemoryConfig;
use crate::backend::url::EngineUrl;

/// `$make` when the crate has `$feature`, else `InvalidConfig` saying which feature `$what`
/// needs.
macro_rules! with_feature {
    ($feature:literal, $what:expr, $make:expr) => {{
        #[cfg(feature = $feature)]
        let made: Result<Box<dyn EngineConfig>, LockError> = $make;
        #[cfg(not(feature = $feature))]
        let made: Result<Box<dyn EngineConfig>, LockError> = Err(LockError::config(format!(
            "{} needs the `{}` feature of dlock-runtime",
            $what, $feature
        )));
        made
    }};
}

/// The engine of a URL, configured by its base, fragment and options.
pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
    match url.scheme {
        "memory" => MemoryConfig::from_url(url),
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => with_feature!(
            "redis",
            format!("`{}://`", url.scheme),
            crate::backend::redis::config::RedisConfig::from_url(url)
        ),
        "redlock" => with_feature!(
            "redis",
            format!("`{}://`", url.scheme),
            crate::backend::redlock::config::RedlockConfig::from_url(url)
        ),
        "etcd" => with_feature!(
            "etcd",
            format!("`{}://`", url.scheme),
            crate::backend::etcd::config::EtcdConfig::from_url(url)
        ),
        "zk" | "zookeeper" => with_feature!(
            "zookeeper",
            format!("`{}://`", url.scheme),
            crate::backend::zookeeper::config::ZooKeeperConfig::from_url(url)
        ),
        other => Err(LockError::config(format!(
            "unsupported scheme `{other}` in `{}`; expected one of redis, rediss, redis+cluster, redlock, etcd, zk, memory",
            url.url
        ))),
    }
}

/// The in-process engine.
pub(crate) fn memory() -> Result<Box<dyn EngineConfig>, LockError> {
    Ok(Box::new(MemoryConfig))
}

/// One Redis server.
#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
pub(crate) fn redis(url: String) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!("redis", "Redis", {
        Ok(Box::new(
            crate::backend::redis::config::RedisConfig::Single(url),
        ))
    })
}

/// A Redis Cluster, one URL per seed node.
#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
pub(crate) fn redis_cluster(seeds: Vec<String>) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!("redis", "Redis Cluster", {
        Ok(Box::new(
            crate::backend::redis::config::RedisConfig::Cluster(seeds),
        ))
    })
}

/// Redlock, one URL per independent master.
#[cfg_attr(not(feature = "redis"), allow(unused_variables))]
pub(crate) fn redlock(nodes: Vec<String>) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!("redis", "Redlock", {
        Ok(Box::new(
            crate::backend::redlock::config::RedlockConfig::new(nodes),
        ))
    })
}

/// etcd, one `http://` endpoint per member.
#[cfg_attr(not(feature = "etcd"), allow(unused_variables))]
pub(crate) fn etcd(endpoints: Vec<String>) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!("etcd", format!("etcd ({})", endpoints.join(",")), {
        Ok(Box::new(crate::backend::etcd::config::EtcdConfig::new(
            endpoints,
        )))
    })
}

/// ZooKeeper, `host:port,host:port[/chroot]`.
#[cfg_attr(not(feature = "zookeeper"), allow(unused_variables))]
pub(crate) fn zookeeper(connect: String) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!("zookeeper", format!("zk://{connect}"), {
        Ok(Box::new(
            crate::backend::zookeeper::config::ZooKeeperConfig::new(connect),
        ))
    })
}
