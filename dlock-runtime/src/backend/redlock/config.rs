//! Configuration of Redlock: `redlock://h1:p1,h2:p2,h3:p3[?node_timeout=100ms&min_validity=0.5]`,
//! or the builder's `.redlock([urls])` with one `redis://` URL per node (each may carry its own
//! password, db or TLS) and `.node_timeout(d)`. `min_validity` is the fraction of the lease that
//! must still be valid when a majority has granted it (default one half: the first renewal is
//! due a third of the lease after the request was sent).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::RedlockBackend;
use crate::LockError;
use crate::backend::redis::config::{CLIENT_OPTIONS, check_tls, node_urls, redact};
use crate::backend::url::EngineUrl;
use crate::backend::{Connecting, Context, DynBackend, EngineConfig, Setting};

/// Default per-node timeout of Redlock calls.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);

/// Default fraction of the lease that must be left when a majority has granted it.
const DEFAULT_MIN_VALIDITY: f64 = 0.5;

/// The engine's own options (beside the redis client's).
const OPTIONS: [&str; 9] = [
    "node_timeout",
    "min_validity",
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
    nodes: Vec<String>,
    node_timeout: Duration,
    min_validity: f64,
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
        }
    }

    /// `redlock://h1:p1,h2:p2,h3:p3?node_timeout=..`; the client's options go to every node.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        let hosts = url.hosts("redlock://host1:port1,host2:port2,...")?;
        let mut config = Self::new(node_urls(url, "redis", &hosts));
        url.apply_options(&mut config, &CLIENT_OPTIONS)?;
        Ok(Box::new(config))
    }
}

impl EngineConfig for RedlockConfig {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn set(&mut self, name: &str, value: Setting<'_>) -> Result<bool, LockError> {
        match name {
            "node_timeout" => self.node_timeout = value.positive_duration(name)?,
            "min_validity" => self.min_validity = fraction(name, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn options(&self) -> &'static [&'static str] {
        debug_assert_eq!(&OPTIONS[2..], &CLIENT_OPTIONS);
        &OPTIONS
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            if self.nodes.len() < 3 {
                return Err(LockError::config(format!(
                    "Redlock needs at least 3 independent Redis masters, got {}",
                    self.nodes.len()
                )));
            }
            for node in &self.nodes {
                check_tls(node)?;
            }
            let backend =
                RedlockBackend::connect(&self.nodes, &ctx, self.node_timeout, self.min_validity)?;
            Ok(Arc::new(backend) as Arc<dyn DynBackend>)
        })
    }
}

/// A fraction in `[0, 1)` written as a decimal (`0.5`).
fn fraction(name: &str, value: Setting<'_>) -> Result<f64, LockError> {
    let parsed = match value {
        Setting::Text(text) => text.parse::<f64>().ok(),
        Setting::Duration(_) => None,
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
    }
}
