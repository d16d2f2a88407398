//! Redis Cluster: a connection that can be rebuilt, and the sharded subscriptions to restore.
//!
//! Invariant: any timeout asks the maintenance task to rebuild the connection from the seeds (a
//! fresh slot map: the client refreshes it after connection errors only); a disconnect or a
//! rebuild re-issues `SSUBSCRIBE` for every watched channel until all are confirmed, then
//! wakes every waiter.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, ProtocolVersion};
use tokio::sync::Notify;

use super::config::{NodeSettings, TlsFiles, redact};
use super::errors::connect_within;
use super::names::Names;
use super::push::push_handler;
use crate::backend::{Context, Wakeups};
use crate::error::LockError;

/// Retries of one call inside the cluster client (redirects, reconnects, a node rejoining).
const CLIENT_RETRIES: u32 = 4;

/// Bounds of the cluster client's pause before a retry, in milliseconds (it grows from 20 ms
/// by doubling, jittered, up to the upper bound): at most about a quarter of a second in all.
const CLIENT_RETRY_WAIT_MS: (u64, u64) = (5, 100);

pub(super) struct ClusterLink {
    client: ClusterClient,
    conn: RwLock<ClusterConnection>,
    channels: Mutex<HashSet<String>>,
    repair: Arc<Notify>,
    rebuild: AtomicBool,
    timeout: Duration,
}

impl Drop for ClusterLink {
    fn drop(&mut self) {
        // Lets the maintenance task notice that the backend is gone.
        self.repair.notify_one();
    }
}

impl ClusterLink {
    /// Connects through any of `seeds` (one URL per node) and starts the maintenance task.
    pub(super) async fn connect(
        seeds: &[String],
        names: &Names,
        ctx: &Context,
    ) -> Result<Arc<Self>, LockError> {
        let repair = Arc::new(Notify::new());
        let on_push = push_handler(
            ctx.wakeups.clone(),
            names.clone(),
            ctx.origin.clone(),
            Some(repair.clone()),
        );
        let seeds_text = seeds
            .iter()
            .map(|s| redact(s))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::with_capacity(seeds.len());
        let mut tls = TlsFiles::default();
        for seed in seeds {
            let node = NodeSettings::parse(seed)?;
            if tls.is_empty() {
                tls = node.tls;
            }
            nodes.push(node.info);
        }
        share_credentials(&mut nodes, &seeds_text)?;
        let builder = ClusterClientBuilder::new(nodes);
        #[cfg(feature = "tls")]
        let builder = if tls.is_empty() {
            builder
        } else {
            builder.certs(tls.certificates())
        };
        #[cfg(not(feature = "tls"))]
        let _ = tls; // `NodeSettings::parse` refuses TLS files without the feature.
        let client = builder
            // The client retries a call that met a node in trouble (CLUSTERDOWN, TRYAGAIN,
            // LOADING, a dropped connection) by itself, sleeping at least 1.28 s before each of
            // up to 16 retries by default: one call could then answer seconds after it was sent
            // (an acquire whose lease was already spent, a renewal hanging past the lease, right
            // after a master restarted). A few short retries follow MOVED/ASK and reconnect;
            // anything longer is the runtime's to retry, with a fresh lease and its own deadline.
            .retries(CLIENT_RETRIES)
            .min_retry_wait(CLIENT_RETRY_WAIT_MS.0)
            .max_retry_wait(CLIENT_RETRY_WAIT_MS.1)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(on_push)
            // Shorter than the outer bound: a seed that does not answer must not fail the
            // connection while others do.
            .connection_timeout(ctx.timeout / 2)
            .response_timeout(ctx.timeout)
            .build()
            .map_err(|e| LockError::config(format!("bad cluster seeds `{seeds_text}`: {e}")))?;
        let conn = connect_within(
            ctx.timeout,
            &format!("cannot connect to cluster {seeds_text}"),
            seeds.iter().all(|s| s.starts_with("redis://")),
            client.get_async_connection(),
        )
        .await?;
        let link = Arc::new(ClusterLink {
            client,
            conn: RwLock::new(conn),
            channels: Mutex::default(),
            repair: repair.clone(),
            rebuild: AtomicBool::new(false),
            timeout: ctx.timeout,
        });
        tokio::spawn(Self::maintain(
            Arc::downgrade(&link),
            repair,
            ctx.wakeups.clone(),
        ));
        Ok(link)
    }

    pub(super) fn conn(&self) -> ClusterConnection {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The sharded channels to restore after a disconnect or a rebuild.
    pub(super) fn channels(&self) -> MutexGuard<'_, HashSet<String>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A call timed out: rebuild the connection (fresh slot map).
    pub(super) fn note_timeout(&self) {
        self.rebuild.store(true, Ordering::Release);
        self.repair.notify_one();
    }

    /// Rebuilds the connection when asked, then restores every sharded subscription.
    async fn maintain(link: Weak<Self>, repair: Arc<Notify>, wakeups: Arc<dyn Wakeups>) {
        loop {
            repair.notified().await;
            // Let a burst of triggers (many calls timing out at once) settle into one repair.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Some(this) = link.upgrade() else {
                return;
            };
            let mut retry = false;
            if this.rebuild.swap(false, Ordering::AcqRel) {
                match tokio::time::timeout(this.timeout, this.client.get_async_connection()).await {
                    Ok(Ok(conn)) => {
                        *this.conn.write().unwrap_or_else(PoisonError::into_inner) = conn;
                        tracing::debug!("cluster connection rebuilt after a timeout");
                    }
                    _ => {
                        this.rebuild.store(true, Ordering::Release);
                        retry = true;
                    }
                }
            }
            let channels: Vec<String> = this.channels().iter().cloned().collect();
            let mut conn = this.conn();
            for channel in channels {
                let confirmed = tokio::time::timeout(this.timeout, conn.ssubscribe(&channel)).await;
                retry |= !matches!(confirmed, Ok(Ok(())));
            }
            wakeups.wake_all();
            drop(this);
            if retry {
                tokio::time::sleep(Duration::from_millis(500)).await;
                repair.notify_one();
            }
        }
    }
}

/// The seeds of one cluster share one user name and password (the client authenticates with
/// one set on every node it discovers): a seed without any takes those of the others; seeds
/// that disagree are `InvalidConfig` (naming the seeds, never the passwords).
fn share_credentials(nodes: &mut [ConnectionInfo], seeds_text: &str) -> Result<(), LockError> {
    let credentials = |n: &ConnectionInfo| {
        let s = n.redis_settings();
        (
            s.username().map(str::to_owned),
            s.password().map(str::to_owned),
        )
    };
    let mut shared: Option<(Option<String>, Option<String>)> = None;
    for node in nodes.iter() {
        let own = credentials(node);
        if own == (None, None) {
            continue;
        }
        match &shared {
            Some(first) if *first != own => {
                return Err(LockError::config(format!(
                    "the seeds of one cluster must share one user and password: `{seeds_text}`"
                )));
            }
            _ => shared = Some(own),
        }
    }
    let Some((user, pass)) = shared else {
        return Ok(());
    };
    for node in nodes.iter_mut() {
        if credentials(node) == (None, None) {
            let mut settings = node.redis_settings().clone();
            if let Some(user) = &user {
                settings = settings.set_username(user);
            }
            if let Some(pass) = &pass {
                settings = settings.set_password(pass);
            }
            *node = node.clone().set_redis_settings(settings);
        }
    }
    Ok(())
}
