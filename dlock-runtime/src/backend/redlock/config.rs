//! Configuration of Redlock:
//! `redlock://h1:p1,h2:p2,h3:p3[?node_timeout=100ms&min_validity=0.5&quorum=2&rejoin_after=30s]`,
//! or the builder's `.redlock([urls])` with one `redis://` URL per node.
//!
//! `min_validity`: the fraction of the lease still valid when the quorum granted (default ½);
//! `quorum`: nodes that must grant (default a majority, at most N); `rejoin_after`: how long
//! after a restart a node's grants count again (default the longest lease used; zero: never
//! checked).

use std::fmt;
use std::time::Duration;

use crate::backend::redis::config::{CLIENT_OPTIONS, node_urls, redact};
use crate::backend::url::EngineUrl;
use crate::backend::{EngineConfig, Setting};
use crate::error::LockError;

/// Default per-node timeout of Redlock calls.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// Default fraction of the lease that must be left when a majority has granted it.
const DEFAULT_MIN_VALIDITY: f64 = 0.5;

/// The engine's own options (beside the redis client's).
pub(super) const OPTIONS: [&str; 11] = [
    "node_timeout",
    "min_validity",
    "quorum",
    "rejoin_after",
    "protocol",
    "db",
    "user",
    "pass",
    "ca",
    "cert",
    "key",
];

#[derive(Clone)]
pub(crate) struct RedlockConfig {
    pub(super) nodes: Vec<String>,
    pub(super) node_timeout: Duration,
    pub(super) min_validity: f64,
    /// `None`: a majority.
    pub(super) quorum: Option<u32>,
    /// `None`: the longest lease used.
    pub(super) rejoin_after: Option<Duration>,
}

/// The settings the backend runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tuning {
    pub(crate) node_timeout: Duration,
    /// Fraction of the lease that must still be valid when the quorum has granted it.
    pub(crate) min_validity: f64,
    /// Grants needed.
    pub(crate) quorum: usize,
    /// How long after its restart a node's grants count again (`None`: the longest lease
    /// used; zero: restarts are not checked).
    pub(crate) rejoin_after: Option<Duration>,
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockConfig")
            .field(
                "nodes",
                &self.nodes.iter().map(|n| redact(n)).collect::<Vec<_>>(),
            )
            .field("node_timeout", &self.node_timeout)
            .field("min_validity", &self.min_validity)
            .field("quorum", &self.quorum)
            .field("rejoin_after", &self.rejoin_after)
            .finish()
    }
}

impl RedlockConfig {
    /// One `redis://` URL per node.
    pub(crate) fn new(nodes: Vec<String>) -> Self {
        Self {
            nodes,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            min_validity: DEFAULT_MIN_VALIDITY,
            quorum: None,
            rejoin_after: None,
        }
    }

    /// The quorum: a majority unless set; from a majority to every node.
    pub(super) fn quorum(&self) -> Result<usize, LockError> {
        let n = self.nodes.len();
        let majority = n / 2 + 1;
        let Some(quorum) = self.quorum else {
            return Ok(majority);
        };
        let quorum = usize::try_from(quorum).unwrap_or(usize::MAX);
        if !(majority..=n).contains(&quorum) {
            return Err(LockError::config(format!(
                "quorum {quorum} is out of range for {n} Redlock nodes: expected from a majority ({majority}) to {n}"
            )));
        }
        Ok(quorum)
    }

    /// `redlock://h1:p1,h2:p2,h3:p3?node_timeout=..`; the client's options go to every node.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        let hosts = url.hosts("redlock://host1:port1,host2:port2,...")?;
        let mut config = Self::new(node_urls(url, "redis", &hosts));
        url.apply_options(&mut config, &CLIENT_OPTIONS)?;
        Ok(Box::new(config))
    }
}

/// A fraction in `[0, 1)` written as a decimal (`0.5`).
pub(super) fn fraction(name: &str, value: Setting<'_>) -> Result<f64, LockError> {
    let parsed = match value {
        Setting::Text(text) => text.parse::<f64>().ok(),
        Setting::Fraction(f) => Some(f),
        Setting::Duration(_) | Setting::Count(_) => None,
    };
    match parsed {
        Some(f) if (0.0..1.0).contains(&f) => Ok(f),
        _ => Err(LockError::config(format!(
            "{name} must be a fraction of the lease from 0 to below 1, e.g. {name}=0.5"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_validity_is_a_fraction_below_one() {
        assert_eq!(fraction("m", Setting::Text("0.25")).ok(), Some(0.25));
        for bad in ["1", "1.5", "-0.1", "half", ""] {
            assert!(fraction("m", Setting::Text(bad)).is_err(), "{bad}");
        }
        assert_eq!(fraction("m", Setting::Fraction(0.75)).ok(), Some(0.75));
        assert!(fraction("m", Setting::Fraction(f64::NAN)).is_err());
        assert!(fraction("m", Setting::Fraction(1.0)).is_err());
    }

    #[test]
    fn quorum_is_from_a_majority_to_every_node() {
        let nodes = |n: usize| RedlockConfig::new(vec!["redis://127.0.0.1:1".into(); n]);
        assert_eq!(nodes(3).quorum().ok(), Some(2));
        assert_eq!(nodes(5).quorum().ok(), Some(3));
        assert_eq!(nodes(4).quorum().ok(), Some(3));
        for (n, q, ok) in [
            (3, 2, true),
            (3, 3, true),
            (3, 1, false),
            (3, 4, false),
            (5, 3, true),
            (5, 2, false),
            (4, 2, false),
            (4, 3, true),
            (3, 0, false),
        ] {
            let mut config = nodes(n);
            config.set("quorum", Setting::Count(q)).expect("a count");
            let quorum = config.quorum();
            assert_eq!(quorum.is_ok(), ok, "n={n} quorum={q}: {quorum:?}");
            if let Err(err) = quorum {
                assert!(err.is_invalid_config(), "{err:?}");
            }
        }
        let mut config = nodes(3);
        assert!(config.set("quorum", Setting::Text("two")).is_err());
        assert!(config.set("quorum", Setting::Text("3")).is_ok());
        assert_eq!(config.quorum().ok(), Some(3));
    }
}
