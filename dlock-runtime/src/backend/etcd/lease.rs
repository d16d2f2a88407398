//! Leases shared by the renewed locks of one runtime: one lease per TTL (whole seconds), granted
//! on first use and kept alive every quarter of its TTL while the runtime lives; and the
//! keep-alives of a waiting contender's own lease.
//!
//! Invariant: a lock on a shared lease counts as valid from the lease's last confirmed
//! keep-alive (its send time), never from the acquisition: see [`SharedLease::confirmed`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;

use crate::error::LockError;

/// One lease shared by the locks of one TTL.
#[derive(Debug)]
pub(crate) struct SharedLease {
    pub(crate) id: i64,
    /// The TTL the server granted.
    ttl: Duration,
    /// Reference point of `confirmed`.
    base: Instant,
    /// Send time of the last keep-alive (or of the grant) the server confirmed, as nanoseconds
    /// after `base`.
    confirmed: AtomicU64,
    /// The server said the lease is gone (expired or revoked).
    dead: AtomicBool,
    /// The keep-alive task, aborted with the lease.
    keeper: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for SharedLease {
    fn drop(&mut self) {
        if let Some(keeper) = self
            .keeper
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            keeper.abort();
        }
    }
}

impl SharedLease {
    fn new(id: i64, ttl: Duration, granted_at: Instant) -> Self {
        Self {
            id,
            ttl,
            base: granted_at,
            confirmed: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            keeper: std::sync::Mutex::new(None),
        }
    }

    /// When the last keep-alive the server confirmed was sent: every key of the lease lives at
    /// least until then plus the granted TTL, unless deleted.
    pub(crate) fn confirmed(&self) -> Instant {
        self.base + Duration::from_nanos(self.confirmed.load(Ordering::Acquire))
    }

    fn confirm(&self, sent_at: Instant) {
        let nanos = u64::try_from(sent_at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX);
        self.confirmed.fetch_max(nanos, Ordering::AcqRel);
    }

    /// Records that the server no longer has the lease.
    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::Release);
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Fresh enough to attach a new key to without asking the server first: alive as far as
    /// the runtime knows and confirmed within the last half of its TTL (the keeper confirms it
    /// every quarter).
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        !self.is_dead() && now < self.confirmed() + self.ttl / 2
    }

    /// One keep-alive: `Ok(true)` when the server kept the lease (confirmed from the send time),
    /// `Ok(false)` when it is gone, `Err` when the server did not answer within `timeout`.
    pub(crate) async fn refresh(
        &self,
        client: &Client,
        timeout: Duration,
    ) -> Result<bool, LockError> {
        let sent_at = Instant::now();
        let alive = keep_alive(client, self.id, timeout).await?;
        if alive {
            self.confirm(sent_at);
        } else {
            self.kill();
        }
        Ok(alive)
    }
}

/// Keeps `lease` alive every third of its TTL until the returned guard is dropped.
pub(super) fn keep_alive_while_queued(
    client: &Client,
    lease: i64,
    ttl: Duration,
) -> tokio::task::JoinHandle<()> {
    let mut client = client.clone();
    tokio::spawn(async move {
        let Ok((mut keeper, mut stream)) = client.lease_keep_alive(lease).await else {
            return;
        };
        loop {
            tokio::time::sleep(ttl / 3).await;
            if keeper.keep_alive().await.is_err() {
                return;
            }
            match stream.message().await {
                Ok(Some(resp)) if resp.ttl() > 0 => {}
                _ => return,
            }
        }
    })
}

/// One keep-alive of `lease`: whether the server still had it.
pub(crate) async fn keep_alive(
    client: &Client,
    lease: i64,
    timeout: Duration,
) -> Result<bool, LockError> {
    let mut client = client.clone();
    let ask = async {
        match client.lease_keep_alive(lease).await {
            Ok((mut keeper, mut stream)) => {
                keeper.keep_alive().await?;
                Ok(stream.message().await?.is_some_and(|r| r.ttl() > 0))
            }
            // The client reports a lease that is gone (revoked, expired) this way.
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
            Err(e) => Err(e),
        }
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok(alive)) => Ok(alive),
        Ok(Err(e)) => Err(LockError::backend(
            None,
            "lease keep-alive failed",
            Some(Arc::new(e)),
        )),
        Err(_) => Err(LockError::backend(
            None,
            format!("lease keep-alive: no reply within {timeout:?}"),
            None,
        )),
    }
}

/// The shared leases of one runtime, by TTL in whole seconds.
#[derive(Debug, Default)]
pub(crate) struct SharedLeases {
    /// Held across a grant, so that concurrent first acquisitions share one lease.
    by_ttl: tokio::sync::Mutex<HashMap<i64, Arc<SharedLease>>>,
}

impl SharedLeases {
    /// The lease for locks of `ttl` seconds: the one in use if it is fresh, else the same one
    /// confirmed now, else a new grant (whose keeper starts at once).
    pub(crate) async fn get(
        &self,
        client: &Client,
        ttl: i64,
        timeout: Duration,
    ) -> Result<Arc<SharedLease>, LockError> {
        // One bound for the whole call: callers queued behind a grant the server does not
        // answer fail within their own timeout, not one timeout after another.
        let deadline = Instant::now() + timeout;
        let late = || {
            LockError::backend(
                None,
                format!("lease grant failed: no reply within {timeout:?}"),
                None,
            )
        };
        let mut leases = tokio::time::timeout_at(deadline, self.by_ttl.lock())
            .await
            .map_err(|_| late())?;
        if let Some(lease) = leases.get(&ttl) {
            if lease.is_fresh(Instant::now()) {
                return Ok(lease.clone());
            }
            // The keeper fell behind (the server was unreachable for a while): ask now.
            let left = deadline.saturating_duration_since(Instant::now());
            if !lease.is_dead() && lease.refresh(client, left).await? {
                return Ok(lease.clone());
            }
        }
        let sent_at = Instant::now();
        let mut c = client.clone();
        let granted = match tokio::time::timeout_at(deadline, c.lease_grant(ttl, None)).await {
            Ok(Ok(granted)) => granted,
            Ok(Err(e)) => {
                return Err(LockError::backend(
                    None,
                    "lease grant failed",
                    Some(Arc::new(e)),
                ));
            }
            Err(_) => return Err(late()),
        };
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let lease = Arc::new(SharedLease::new(granted.id(), granted_ttl, sent_at));
        let keeper = tokio::spawn(keep(Arc::downgrade(&lease), client.clone(), timeout));
        *lease
            .keeper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(keeper.abort_handle());
        tracing::debug!(lease = granted.id(), ttl = ?granted_ttl, "shared lease granted");
        leases.insert(ttl, lease.clone());
        Ok(lease)
    }
}

/// The keeper of one shared lease: a keep-alive every quarter of its TTL (sooner again after a
/// failure) until the server says the lease is gone or the lease is dropped.
async fn keep(lease: Weak<SharedLease>, client: Client, timeout: Duration) {
    let Some(period) = lease.upgrade().map(|l| l.ttl / 4) else {
        return;
    };
    let mut pause = period;
    loop {
        tokio::time::sleep(pause).await;
        let Some(lease) = lease.upgrade() else {
            return;
        };
        match lease.refresh(&client, timeout.min(period)).await {
            Ok(true) => pause = period,
            Ok(false) => {
                tracing::warn!(
                    lease = lease.id,
                    "shared lease gone on the server: its locks are lost"
                );
                return;
            }
            Err(err) => {
                tracing::debug!(lease = lease.id, error = %err, "lease keep-alive failed; retrying");
                pause = (period / 4).max(Duration::from_millis(50));
            }
        }
    }
}
