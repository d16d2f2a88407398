//! The engines this crate knows: one [`Descriptor`] each (its name, URL schemes, cargo
//! feature and how a URL configures it), in one table. URL schemes and the messages that list
//! them come from the table; a new engine is a folder under `backend/` plus one line here.

use crate::backend::EngineConfig;
use crate::backend::url::EngineUrl;
use crate::error::LockError;

/// How a parsed URL configures an engine.
type FromUrl = fn(&EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError>;

/// One engine, as the scheme table knows it.
pub(crate) struct Descriptor {
    /// Its name in messages.
    pub(crate) name: &'static str,
    /// The URL schemes it answers to, the usual one first.
    pub(crate) schemes: &'static [&'static str],
    /// The cargo feature that builds it (`None`: always built).
    pub(crate) feature: Option<&'static str>,
    /// Configures it from a URL of one of its schemes; `None` when its feature is off.
    pub(crate) from_url: Option<FromUrl>,
}

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

/// The descriptor of an engine built under `$feature`, configured by `$config::from_url`.
macro_rules! engine {
    ($name:literal, $feature:literal, [$($scheme:literal),+], $($config:ident)::+) => {
        Descriptor {
            name: $name,
            schemes: &[$($scheme),+],
            feature: Some($feature),
            from_url: {
                #[cfg(feature = $feature)]
                const FROM_URL: Option<FromUrl> = Some(crate::backend::$($config)::+::from_url);
                #[cfg(not(feature = $feature))]
                const FROM_URL: Option<FromUrl> = None;
                FROM_URL
            },
        }
    };
}

/// Every engine, in the order messages list them.
pub(crate) static ENGINES: &[Descriptor] = &[
    engine!(
        "Redis",
        "redis",
        ["redis", "rediss", "redis+cluster", "rediss+cluster"],
        redis::config::RedisConfig
    ),
    engine!(
        "Redlock",
        "redis",
        ["redlock"],
        redlock::config::RedlockConfig
    ),
    engine!("etcd", "etcd", ["etcd"], etcd::config::EtcdConfig),
    engine!(
        "ZooKeeper",
        "zookeeper",
        ["zk", "zookeeper"],
        zookeeper::config::ZooKeeperConfig
    ),
    Descriptor {
        name: "memory",
        schemes: &["memory"],
        feature: None,
        from_url: Some(crate::backend::memory::MemoryConfig::from_url),
    },
];

/// The engine of a URL, configured by its base, fragment and options.
pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
    let Some(engine) = ENGINES.iter().find(|e| e.schemes.contains(&url.scheme)) else {
        return Err(LockError::config(format!(
            "unsupported scheme `{}` in `{}`; expected one of {}",
            url.scheme,
            url.url,
            schemes().collect::<Vec<_>>().join(", ")
        )));
    };
    match engine.from_url {
        Some(from_url) => from_url(url),
        None => Err(LockError::config(format!(
            "`{}://` ({}) needs the `{}` feature of dlock-runtime",
            url.scheme,
            engine.name,
            engine.feature.unwrap_or_default()
        ))),
    }
}

/// Every scheme of every engine, in the table's order.
pub(crate) fn schemes() -> impl Iterator<Item = &'static str> {
    ENGINES.iter().flat_map(|e| e.schemes.iter().copied())
}

/// The in-process engine.
pub(crate) fn memory() -> Result<Box<dyn EngineConfig>, LockError> {
    Ok(Box::new(crate::backend::memory::MemoryConfig))
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
    with_feature!(
        "etcd",
        format!(
            "etcd ({})",
            crate::backend::url::redact_each(&endpoints).join(",")
        ),
        {
            Ok(Box::new(crate::backend::etcd::config::EtcdConfig::new(
                endpoints,
            )))
        }
    )
}

/// ZooKeeper, `host:port,host:port[/chroot]`.
#[cfg_attr(not(feature = "zookeeper"), allow(unused_variables))]
pub(crate) fn zookeeper(connect: String) -> Result<Box<dyn EngineConfig>, LockError> {
    with_feature!(
        "zookeeper",
        format!("zk://{}", crate::backend::url::redact(&connect)),
        {
            Ok(Box::new(
                crate::backend::zookeeper::config::ZooKeeperConfig::new(connect),
            ))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scheme names one engine, and an unknown one is refused with all of them listed.
    #[test]
    fn schemes_name_one_engine_each_and_messages_list_them_all() {
        let all: Vec<&str> = schemes().collect();
        let mut unique = all.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            all.len(),
            "a scheme names two engines: {all:?}"
        );
        let url = EngineUrl::parse("nosuch://h:1").expect("parses");
        assert!(
            ENGINES
                .iter()
                .all(|e| !e.name.is_empty() && !e.schemes.is_empty())
        );
        let err = from_url(&url).map(drop).expect_err("unknown scheme");
        let shown = err.to_string();
        for scheme in all {
            assert!(shown.contains(scheme), "{scheme} missing from: {shown}");
        }
    }
}
