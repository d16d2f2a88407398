//! Telling a node that restarted, so that its grants do not count while it may have forgotten
//! locks it held: the client-side form of Redlock's *delayed restart*.
//!
//! Invariant: a node's run id (`INFO server`) is read when it is first reached and again after
//! every reconnect or failed call; a node whose run id changed counts again only `rejoin_after`
//! after its restart. A node that refuses `INFO` cannot be checked: its grants count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Wakeups;
use crate::backend::redis::RedisBackend;
use crate::error::LockError;

/// What this runtime knows of one node's server process.
#[derive(Debug)]
pub(super) struct NodeIdentity {
    /// The node's URL, redacted (for logs).
    url: String,
    /// Disconnects and failed calls seen on this node: its run id must be read again.
    epoch: AtomicU64,
    /// One more than the epoch in which the scripts were last loaded (0: never).
    scripts: AtomicU64,
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// The epoch in which the run id was last read (`None`: never).
    checked: Option<u64>,
    run_id: Option<String>,
    /// When the node's current process started, if this runtime saw it restart.
    restarted_at: Option<Instant>,
    /// The node refuses `INFO`: its restarts cannot be told (its grants count).
    unverifiable: bool,
}

impl NodeIdentity {
    pub(super) fn new(url: String) -> Arc<Self> {
        Arc::new(Self {
            url,
            epoch: AtomicU64::new(0),
            scripts: AtomicU64::new(0),
            known: Mutex::default(),
        })
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        // Every update is a few field writes: a poisoned lock is still consistent.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to the node broke or a call failed: the node may have restarted.
    pub(super) fn suspect(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// `Some(epoch)` when the node may not have the scripts (never loaded, or a disconnect or
    /// failure since): they are loaded ahead of the next request, then noted with
    /// [`scripts_loaded`](Self::scripts_loaded)`(epoch)`.
    pub(super) fn needs_scripts(&self) -> Option<u64> {
        let epoch = self.epoch.load(Ordering::Acquire);
        (self.scripts.load(Ordering::Acquire) != epoch + 1).then_some(epoch)
    }

    /// The scripts were loaded in `epoch`.
    pub(super) fn scripts_loaded(&self, epoch: u64) {
        self.scripts.fetch_max(epoch + 1, Ordering::AcqRel);
    }

    /// Whether the run id must be read before the node's next grant counts.
    pub(super) fn needs_check(&self) -> bool {
        let known = self.known();
        !known.unverifiable && known.checked != Some(self.epoch.load(Ordering::Acquire))
    }

    /// Reads the node's run id and uptime (`INFO server`); a changed run id is a restart.
    /// The caller bounds it (the per-node timeout); a node that does not answer stays
    /// unchecked (its grants do not count).
    pub(super) async fn check(&self, node: &RedisBackend) {
        let epoch = self.epoch.load(Ordering::Acquire);
        let answer = node.server_info().await;
        let now = Instant::now();
        let info = match answer {
            Ok(info) => info,
            Err(err) if refused(&err) => {
                let mut known = self.known();
                if !known.unverifiable {
                    tracing::warn!(
                        node = %self.url,
                        error = %err,
                        "redlock node refuses INFO: a restart of this node cannot be told, and its grants count as soon as it is back"
                    );
                }
                known.unverifiable = true;
                return;
            }
            Err(_) => return,
        };
        let Some(run_id) = info_field(&info, "run_id") else {
            self.known().unverifiable = true;
            tracing::warn!(node = %self.url, "redlock node reports no run_id: a restart of this node cannot be told");
            return;
        };
        let uptime = info_field(&info, "uptime_in_seconds")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        let mut known = self.known();
        if known.run_id.as_deref().is_some_and(|old| old != run_id) {
            let restarted_at = latest_restart(now, uptime);
            tracing::warn!(
                node = %self.url,
                uptime_secs = uptime,
                "redlock node restarted (its run id changed): its grants do not count until the longest lease has passed since"
            );
            known.restarted_at = Some(restarted_at);
        }
        known.run_id = Some(run_id.to_owned());
        known.checked = Some(epoch);
    }

    /// Whether a grant from this node counts at `now`: its run id was read since the last
    /// disconnect, and it did not restart within `rejoin_after`.
    pub(super) fn counts(&self, now: Instant, rejoin_after: Duration) -> bool {
        let known = self.known();
        if known.unverifiable {
            return true;
        }
        known.checked == Some(self.epoch.load(Ordering::Acquire))
            && known.restarted_at.is_none_or(|at| now >= at + rejoin_after)
    }

    /// How long until a node that restarted within `rejoin_after` counts again.
    pub(super) fn rejoins_in(&self, now: Instant, rejoin_after: Duration) -> Option<Duration> {
        let at = self.known().restarted_at? + rejoin_after;
        (at > now).then(|| at - now)
    }
}

/// The latest moment a server read at `now` with `uptime_in_seconds` = `uptime` can have
/// started. Redis counts that uptime as the difference of two whole Unix seconds (now, and its
/// start), so it runs up to a second ahead of the real one: a server started at x.9 s reads 1
/// at (x + 1).05 s, after 0.15 s. One second less is a bound the real uptime always exceeds.
fn latest_restart(now: Instant, uptime: u64) -> Instant {
    now.checked_sub(Duration::from_secs(uptime.saturating_sub(1)))
        .unwrap_or(now)
}

/// An error answer from the server itself (e.g. `NOPERM` under an ACL), not a connection
/// problem.
fn refused(err: &LockError) -> bool {
    let Some(source) = std::error::Error::source(err) else {
        return false;
    };
    let Some(err) = source.downcast_ref::<redis::RedisError>() else {
        return false;
    };
    !(err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal())
}

/// `name:value` from an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        (field == name).then(|| value.trim())
    })
}

/// A node's notifications: passed on to the runtime, and a disconnect (the connection's
/// `wake_all`) marks the node suspect, so that its run id is read again before its grants
/// count.
pub(super) struct NodeWakeups {
    pub(super) inner: Arc<dyn Wakeups>,
    pub(super) identity: Arc<NodeIdentity>,
}

impl Wakeups for NodeWakeups {
    fn wake(&self, key: &str) {
        self.inner.wake(key);
    }

    fn wake_all(&self) {
        self.identity.suspect();
        self.inner.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_are_read_by_name() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc123\r\nuptime_in_seconds:42\r\n";
        assert_eq!(info_field(info, "run_id"), Some("abc123"));
        assert_eq!(info_field(info, "uptime_in_seconds"), Some("42"));
        assert_eq!(info_field(info, "run"), None);
    }

    /// An uptime of whole seconds may run a second ahead of the real one: the restart is
    /// taken as one second later than it says, never earlier than the truth.
    #[test]
    fn a_restart_is_dated_no_earlier_than_it_can_have_been() {
        let now = Instant::now();
        // Read 0.15 s after a start at x.9 s: uptime 1.
        assert_eq!(latest_restart(now, 1), now);
        assert_eq!(latest_restart(now, 0), now);
        assert_eq!(latest_restart(now, 5), now - Duration::from_secs(4));
    }

    #[test]
    fn scripts_are_loaded_again_after_a_disconnect() {
        let node = NodeIdentity::new("redis://h:1".into());
        assert_eq!(node.needs_scripts(), Some(0), "never loaded");
        node.scripts_loaded(0);
        assert_eq!(node.needs_scripts(), None);
        node.suspect();
        assert_eq!(node.needs_scripts(), Some(1), "a disconnect since");
        node.scripts_loaded(0);
        assert_eq!(
            node.needs_scripts(),
            Some(1),
            "a load of an older epoch does not count"
        );
        node.scripts_loaded(1);
        assert_eq!(node.needs_scripts(), None);
    }

    #[test]
    fn a_node_counts_only_when_checked_since_the_last_disconnect() {
        let node = NodeIdentity::new("redis://h:1".into());
        let now = Instant::now();
        let rejoin = Duration::from_secs(30);
        assert!(node.needs_check());
        assert!(!node.counts(now, rejoin), "never checked");
        {
            let mut known = node.known();
            known.checked = Some(0);
            known.run_id = Some("a".into());
        }
        assert!(!node.needs_check());
        assert!(node.counts(now, rejoin));
        node.suspect();
        assert!(node.needs_check());
        assert!(!node.counts(now, rejoin), "disconnected since the check");
        {
            let mut known = node.known();
            known.checked = Some(1);
            known.restarted_at = Some(now);
        }
        assert!(!node.counts(now, rejoin), "restarted just now");
        assert_eq!(node.rejoins_in(now, rejoin), Some(rejoin));
        assert!(node.counts(now + rejoin, rejoin));
        assert_eq!(node.rejoins_in(now + rejoin, rejoin), None);
    }
}
