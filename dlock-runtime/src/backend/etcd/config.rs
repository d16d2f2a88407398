//! Configuration of etcd: `etcd://h1:2379,h2:2379` (plain HTTP to each member), or the
//! builder's `.etcd(["http://h1:2379", ..])`. etcd has no engine option: leases, waits and the
//! call timeout are the runtime's.

use std::fmt;

use super::EtcdBackend;
use crate::backend::url::{EngineUrl, redact_each};
use crate::backend::{Connecting, Context, DynBackend, EngineConfig};
use crate::error::LockError;

#[derive(Clone)]
pub(crate) struct EtcdConfig {
    endpoints: Vec<String>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &redact_each(&self.endpoints))
            .finish()
    }
}

impl EtcdConfig {
    /// One `http://host:port` endpoint per member.
    pub(crate) fn new(endpoints: Vec<String>) -> Self {
        Self { endpoints }
    }

    /// `etcd://h1:p1,h2:p2`.
    pub(crate) fn from_url(url: &EngineUrl<'_>) -> Result<Box<dyn EngineConfig>, LockError> {
        let hosts = url.hosts("etcd://host1:port1,host2:port2,...")?;
        url.refuse_userinfo("etcd")?;
        let mut config = Self::new(hosts.iter().map(|h| format!("http://{h}")).collect());
        url.apply_options(&mut config, &[])?;
        Ok(Box::new(config))
    }
}

impl EngineConfig for EtcdConfig {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn connect(self: Box<Self>, ctx: Context) -> Connecting {
        Box::pin(async move {
            if self.endpoints.is_empty() {
                return Err(LockError::config("etcd needs at least one endpoint"));
            }
            let backend = EtcdBackend::connect(&self.endpoints, &ctx).await?;
            Ok(DynBackend::new_arc(backend))
        })
    }
}
