//! Configuration of ZooKeeper: `zk://h1:2181,h2:2181[/chroot][?session_timeout=10s]` (or
//! `zookeeper://`), or the builder's `.zookeeper("h1:2181,h2:2181/chroot")` and
//! `.session_timeout(d)`.

use std::fmt;
use std::time::Duration;

use super::ZooKeeperBackend;
use crate::backend::url::{EngineUrl, redact};
use crate::backend::{Connecting, Context, DynBackend, EngineConfig, Setting};
use crate::error::LockError;

/// Default ZooKeeper session timeout asked for; the server may grant less (or more), and the
/// timeout it grants is the bound after which a dead holder's lock is freed.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

const OPTIONS: [&str; 1] = ["session_timeout"];

#[derive(Clone)]
pub(crate) struct ZooKeeperConfig {
    /// `host:port,host:port[/chroot]`.
    connect: String,
    session_timeout: Duration,
}

impl fmt::Debug for ZooKeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperConfig")
            .field("connect", &redact(&self.connect))
            .field("session_timeout", &self.session_timeout)
            .finish()
    }
}

impl ZooKeeperConfig {
    pub(crate) fn new(connect: String) -> Self {
        Self {
            connect,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
        }
    }

    /// `zk://h1:p1,h2:p2[/chroot]?session_timeout=..`.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        url.refuse_userinfo("ZooKeeper")?;
        let hosts = url.base.split('/').next().unwrap_or_default();
        if hosts.split(',').any(|h| h.trim().is_empty()) {
            return Err(LockError::config(format!(
                "`{}`: expected zk://host1:port1,host2:port2[/chroot]",
                url.url
            )));
        }
        let mut config = Self::new(url.base.to_owned());
        url.apply_options(&mut config, &[])?;
        Ok(Box::new(config))
    }
}

impl EngineConfig for ZooKeeperConfig {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn set(&mut self, name: &str, value: Setting<'_>) -> Result<bool, LockError> {
        match name {
            "session_timeout" => self.session_timeout = value.positive_duration(name)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn options(&self) -> &'static [&'static str] {
        &OPTIONS
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            let backend =
                ZooKeeperBackend::connect(&self.connect, self.session_timeout, &ctx).await?;
            Ok(DynBackend::new_arc(backend))
        })
    }
}
