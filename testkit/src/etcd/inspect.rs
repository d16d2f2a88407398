//! Looking into an [`EtcdCluster`] through the `etcd-client` crate: keys, leases, member
//! status and the leader.
//!
//! The calls block the calling thread: each one runs on the kit's own small tokio runtime, so
//! it works from a plain `#[test]` as well as from an async test (inside `block_in_place`),
//! and a test's own runtime never has to drive the harness's connections.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};

use super::EtcdCluster;

/// Connect and request timeout of a readiness probe: short, so that a probe racing the start
/// costs little.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// Connect and request timeout of the harness's requests and health checks (generous: the
/// test box is noisy, and a bound missed by load would fail a test by chance).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A key as read from etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKv {
    /// The key (lossy UTF-8).
    pub key: String,
    /// The value bytes.
    pub value: Vec<u8>,
    /// Revision of the put that created the key (the fencing token of an etcd lock).
    pub create_revision: i64,
    /// Revision of the last put.
    pub mod_revision: i64,
    /// Number of puts since creation.
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

impl From<&etcd_client::KeyValue> for EtcdKv {
    fn from(kv: &etcd_client::KeyValue) -> EtcdKv {
        EtcdKv {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        }
    }
}

/// One member's status (the Maintenance `Status` call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// This member's id.
    pub member_id: u64,
    /// The leader this member knows of (0: none).
    pub leader: u64,
    /// Raft term.
    pub raft_term: u64,
    /// The store's current revision.
    pub revision: i64,
}

impl MemberStatus {
    /// Whether this member is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader != 0 && self.leader == self.member_id
    }
}

impl EtcdCluster {
    /// Writes `key = value` (no lease); returns the new revision.
    pub fn put(&self, key: &str, value: impl AsRef<[u8]>) -> i64 {
        self.put_leased(key, value, 0)
    }

    /// Writes `key = value` attached to lease `lease` (0: none); returns the new revision.
    pub fn put_leased(&self, key: &str, value: impl AsRef<[u8]>, lease: i64) -> i64 {
        let (key, value) = (key.to_owned(), value.as_ref().to_vec());
        self.request("put", move |mut client| {
            let (key, value) = (key.clone(), value.clone());
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            async move {
                let reply = client.put(key, value, options).await?;
                Ok(reply.header().map_or(0, |h| h.revision()))
            }
        })
    }

    /// Reads `key` (linearizable).
    pub fn get(&self, key: &str) -> Option<EtcdKv> {
        self.range(key, GetOptions::new()).into_iter().next()
    }

    /// Every key starting with `prefix`, in key order.
    pub fn get_prefix(&self, prefix: &str) -> Vec<EtcdKv> {
        let options = if prefix.is_empty() {
            GetOptions::new().with_all_keys()
        } else {
            GetOptions::new().with_prefix()
        };
        self.range(prefix, options)
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> bool {
        let key = key.to_owned();
        self.request("delete", move |mut client| {
            let key = key.clone();
            async move { Ok(client.delete(key, None).await?.deleted() > 0) }
        })
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    pub fn lease_grant(&self, ttl: i64) -> i64 {
        self.request("lease grant", move |mut client| async move {
            Ok(client.lease_grant(ttl, None).await?.id())
        })
    }

    /// Revokes lease `id` (its keys are deleted). Panics if it does not exist.
    pub fn lease_revoke(&self, id: i64) {
        self.request("lease revoke", move |mut client| async move {
            client.lease_revoke(id).await.map(|_| ())
        })
    }

    /// Seconds left on lease `id`; `None` when it expired or never existed.
    pub fn lease_ttl(&self, id: i64) -> Option<i64> {
        self.lease_time_to_live(id).map(|(ttl, _)| ttl)
    }

    /// The TTL lease `id` was granted with (what the server made of the TTL asked for);
    /// `None` when it expired or never existed.
    pub fn lease_granted_ttl(&self, id: i64) -> Option<i64> {
        self.lease_time_to_live(id).map(|(_, granted)| granted)
    }

    /// Whether member `i` is healthy: it knows a leader and answers a linearizable read within
    /// 5 s (false when killed, paused or without a leader).
    pub fn is_healthy(&self, i: usize) -> bool {
        self.is_running(i) && healthy(&self.endpoint(i), REQUEST_TIMEOUT)
    }

    /// Member `i`'s status, or why not (killed, paused, error).
    pub fn status(&self, i: usize) -> Result<MemberStatus, String> {
        if !self.is_running(i) || self.is_paused(i) {
            return Err(format!("etcd member {i} is killed or paused"));
        }
        let endpoint = self.endpoint(i);
        block_on(async move {
            let status = connect(&endpoint, REQUEST_TIMEOUT).await?.status().await?;
            Ok::<_, etcd_client::Error>(MemberStatus {
                member_id: status.header().map_or(0, |h| h.member_id()),
                leader: status.leader(),
                raft_term: status.raft_term(),
                revision: status.header().map_or(0, |h| h.revision()),
            })
        })
        .map_err(|e| format!("status of etcd member {i}: {e}"))
    }

    /// The index of the member that is leader, asking every running (not paused) member whether
    /// it is; `None` if none is (no leader yet, or the leader is killed or paused).
    pub fn leader_index(&self) -> Option<usize> {
        self.running()
            .find(|&i| self.status(i).is_ok_and(|s| s.is_leader()))
    }

    /// Waits until one running member is leader and every running (not paused) member agrees on
    /// it; returns its index. Panics after `within`.
    pub fn wait_for_leader(&self, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            let statuses: Vec<(usize, Result<MemberStatus, String>)> =
                self.running().map(|i| (i, self.status(i))).collect();
            let leader = statuses
                .iter()
                .find(|(_, s)| s.as_ref().is_ok_and(|s| s.is_leader()));
            if let Some(&(index, Ok(ref leader))) = leader {
                let agreed = statuses
                    .iter()
                    .all(|(_, s)| s.as_ref().is_ok_and(|s| s.leader == leader.member_id));
                if agreed {
                    return index;
                }
            }
            assert!(
                start.elapsed() < within,
                "etcd: no leader agreed on by every running member within {within:?}: \
                 {statuses:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn range(&self, key: &str, options: GetOptions) -> Vec<EtcdKv> {
        let key = key.to_owned();
        self.request("get", move |mut client| {
            let (key, options) = (key.clone(), options.clone());
            async move {
                let reply = client.get(key, Some(options)).await?;
                Ok(reply.kvs().iter().map(EtcdKv::from).collect())
            }
        })
    }

    /// `(ttl, granted ttl)` of lease `id`, `None` when it expired or never existed.
    fn lease_time_to_live(&self, id: i64) -> Option<(i64, i64)> {
        self.request("lease time-to-live", move |mut client| async move {
            let reply = client.lease_time_to_live(id, None).await?;
            Ok((reply.ttl() >= 0).then(|| (reply.ttl(), reply.granted_ttl())))
        })
    }

    /// Runs `op` with a client of the first running (not paused) member that answers it;
    /// panics naming `what` with every member's error.
    fn request<T, Fut>(&self, what: &str, op: impl Fn(Client) -> Fut + Send + Sync + 'static) -> T
    where
        T: Send + 'static,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send,
    {
        let endpoints: Vec<String> = self.running().map(|i| self.endpoint(i)).collect();
        let result = block_on(async move {
            let mut errors = Vec::new();
            for endpoint in endpoints {
                let attempt = async { op(connect(&endpoint, REQUEST_TIMEOUT).await?).await };
                match attempt.await {
                    Ok(reply) => return Ok(reply),
                    Err(e) => errors.push(format!("{endpoint}: {e}")),
                }
            }
            if errors.is_empty() {
                errors.push("no etcd member is running".to_owned());
            }
            Err(errors.join("; "))
        });
        result.unwrap_or_else(|e| panic!("etcd {what}: {e}"))
    }
}

/// Whether the member at `endpoint` knows a leader and answers a linearizable read, each
/// within `timeout`.
pub(super) fn healthy(endpoint: &str, timeout: Duration) -> bool {
    let endpoint = endpoint.to_owned();
    block_on(async move {
        let mut client = connect(&endpoint, timeout).await?;
        let status = client.status().await?;
        if status.leader() == 0 {
            return Ok(false);
        }
        client.get("health", None).await?;
        Ok::<_, etcd_client::Error>(true)
    })
    .unwrap_or(false)
}

/// A client of the one member at `endpoint`, with `timeout` to connect and per request.
async fn connect(endpoint: &str, timeout: Duration) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    Client::connect([endpoint], Some(options)).await
}

/// Runs `request` on the kit's etcd runtime and waits for it, blocking the calling thread.
fn block_on<T: Send + 'static>(request: impl Future<Output = T> + Send + 'static) -> T {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-testkit-etcd")
            .enable_all()
            .build()
            .expect("start the test kit's etcd runtime")
    });
    let (reply, replied) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let _ = reply.send(request.await);
    });
    replied
        .recv()
        .expect("the test kit's etcd request panicked")
}
