//! [`RedisKeys`]: raw commands on a server's or a cluster's keys, behind the runtime's back.

use std::time::Duration;

use super::connect;

/// Connect and response timeout of the raw connections (generous: the test box is noisy).
const RAW_TIMEOUT: Duration = Duration::from_secs(5);

/// Raw access to the keys of one `redis-server` or of a Redis Cluster (through a slot-routed
/// client), for inspecting lock keys or changing them behind a holder's back. Each call opens
/// a fresh connection and panics when the command fails.
///
/// [`RedisServer`](crate::RedisServer) and [`RedisCluster`](crate::cluster::RedisCluster)
/// dereference to it: `server.exists(&lock_key("k")).await`.
#[derive(Debug, Clone)]
pub struct RedisKeys {
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
    /// `redis://` or `rediss://` URL of one server.
    Server(String),
    /// Seed URLs of the cluster nodes that run and are not paused.
    Cluster(Vec<String>),
}

impl RedisKeys {
    pub(crate) fn server(url: String) -> RedisKeys {
        RedisKeys {
            target: Target::Server(url),
        }
    }

    pub(crate) fn cluster(seeds: Vec<String>) -> RedisKeys {
        RedisKeys {
            target: Target::Cluster(seeds),
        }
    }

    /// Runs one raw command and returns its reply; a key command goes to the master serving
    /// the key on a cluster.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let reply: redis::RedisResult<T> = async {
            match &self.target {
                Target::Server(url) => cmd.query_async(&mut connect(url, RAW_TIMEOUT).await?).await,
                Target::Cluster(seeds) => cmd.query_async(&mut connect_cluster(seeds).await?).await,
            }
        }
        .await;
        reply.unwrap_or_else(|e| panic!("raw redis command {:?} failed: {e}", cmd_name(cmd)))
    }

    /// `EXISTS key`.
    pub async fn exists(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("EXISTS").arg(key)).await;
        n == 1
    }

    /// `PTTL key`: milliseconds left, -1 without expiry, -2 when the key is missing.
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key)).await
    }

    /// `DEL key`; true if it existed.
    pub async fn del(&self, key: &str) -> bool {
        let n: u64 = self.query(redis::cmd("DEL").arg(key)).await;
        n == 1
    }

    /// `HGET key field`.
    pub async fn hget(&self, key: &str, field: &str) -> Option<String> {
        self.query(redis::cmd("HGET").arg(key).arg(field)).await
    }

    /// The owner token written at the lock `key` (`GET`, without the `+` a waiter appends to
    /// be notified), or `None` when the key is free.
    pub async fn lock_owner(&self, key: &str) -> Option<String> {
        let held: Option<String> = self.query(redis::cmd("GET").arg(key)).await;
        held.map(|h| h.strip_suffix('+').map(str::to_owned).unwrap_or(h))
    }

    /// Whether nobody holds the lock `key`: the key is missing, or it is only the reservation
    /// a flagged release leaves for a few milliseconds (`><runtime id>`: for the runtime first
    /// in line; `~<runtime id>`: for every runtime but the releaser's).
    pub async fn lock_is_free(&self, key: &str) -> bool {
        self.lock_owner(key)
            .await
            .is_none_or(|value| value.starts_with(['~', '>']))
    }

    /// The fence counter of the lock `key` (`GET <key>:fence`): the last token of the block
    /// the latest attempt reserved (every attempt reserves one).
    pub async fn fence_counter(&self, key: &str) -> Option<u64> {
        let value: Option<String> = self
            .query(redis::cmd("GET").arg(format!("{key}:fence")))
            .await;
        value.and_then(|v| v.parse().ok())
    }

    /// The fence of the acquisition that reserved the counter's last block: the first token of
    /// that block. The current holder's fence when it acquired in Redis and nobody else tried
    /// the key since.
    pub async fn latest_acquired_fence(&self, key: &str) -> Option<u64> {
        let block = dlock_runtime::testing::scripts::FENCE_BLOCK;
        Some(self.fence_counter(key).await? - (block - 1))
    }
}

/// A slot-routed connection (the redis crate's async cluster client) through `seeds`, with
/// generous timeouts.
pub(crate) async fn connect_cluster(
    seeds: &[String],
) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
    redis::cluster::ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(RAW_TIMEOUT)
        .response_timeout(RAW_TIMEOUT)
        .build()?
        .get_async_connection()
        .await
}

/// The command's name, for messages (its first argument).
fn cmd_name(cmd: &redis::Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).into_owned(),
        _ => String::new(),
    }
}
