//! The data the examples protect with locks: integer counters (stock) by name.
//!
//! [`Store::get`] and [`Store::set`] are two separate operations on purpose. A
//! read-modify-write made of them is a race between concurrent callers (two buyers read
//! `stock = 1`, both write `0`, two items are sold) unless a lock serializes the callers.
//! Real code would rather make the storage itself reject stale writers, e.g. with the fencing
//! token of [`dlock_runtime::current_fence`]; the examples keep the race visible instead.
//!
//! Two implementations:
//!
//! - [`Store::memory`]: a map in this process, for the `memory://` lock engine (which only
//!   excludes within one process anyway);
//! - [`Store::redis`]: plain `GET`/`SET` on a Redis server, so several processes share the
//!   counters. [`Store::from_env`] picks it when `DLOCK_URL` is a `redis://` URL.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Bound on connecting to Redis and on each command.
const REDIS_TIMEOUT: Duration = Duration::from_secs(3);

/// Query parameters of a lock URL that configure the lock runtime, not the Redis client.
const RUNTIME_PARAMS: [&str; 4] = ["prefix", "lease", "wait", "timeout"];

/// Named integer counters, in this process or in Redis. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Store {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Memory(Arc<Mutex<HashMap<String, i64>>>),
    Redis(ConnectionManager),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("kind", &self.kind()).finish()
    }
}

impl Store {
    /// A process-local store.
    pub fn memory() -> Store {
        Store {
            inner: Inner::Memory(Arc::default()),
        }
    }

    /// A store on the Redis server at `url` (`redis://host:port[/db]`). The runtime options of
    /// a lock URL (`prefix`, `lease`, `wait`, `timeout`) are ignored, so the value of
    /// `DLOCK_URL` can be passed as is.
    pub async fn redis(url: &str) -> Result<Store, StoreError> {
        let url = without_runtime_params(url.trim());
        let client = redis::Client::open(url.as_str())
            .map_err(|e| StoreError::new(format!("bad redis url `{url}`"), e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_response_timeout(Some(REDIS_TIMEOUT));
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| StoreError::new(format!("cannot connect to `{url}`"), e))?;
        Ok(Store {
            inner: Inner::Redis(conn),
        })
    }

    /// The store that goes with `DLOCK_URL`: Redis at that URL when it is a `redis://` or
    /// `rediss://` URL, else a process-local store.
    pub async fn from_env() -> Result<Store, StoreError> {
        match std::env::var("DLOCK_URL") {
            Ok(url) if url.trim().starts_with("redis") => Store::redis(url.trim()).await,
            _ => Ok(Store::memory()),
        }
    }

    /// `"memory"` or `"redis"`.
    pub fn kind(&self) -> &'static str {
        match self.inner {
            Inner::Memory(_) => "memory",
            Inner::Redis(_) => "redis",
        }
    }

    /// The value of `key`, `None` when it was never set.
    pub async fn get(&self, key: &str) -> Result<Option<i64>, StoreError> {
        match &self.inner {
            Inner::Memory(map) => Ok(lock(map).get(key).copied()),
            Inner::Redis(conn) => redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| StoreError::new(format!("GET {key} failed"), e)),
        }
    }

    /// Sets `key` to `value`.
    pub async fn set(&self, key: &str, value: i64) -> Result<(), StoreError> {
        match &self.inner {
            Inner::Memory(map) => {
                lock(map).insert(key.to_owned(), value);
                Ok(())
            }
            Inner::Redis(conn) => redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut conn.clone())
                .await
                .map_err(|e| StoreError::new(format!("SET {key} failed"), e)),
        }
    }
}

fn lock(map: &Mutex<HashMap<String, i64>>) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
    // A map insert cannot be interrupted half-way: a poisoned map is still consistent.
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `url` (a lock URL such as the value of `DLOCK_URL`) without the query parameters that only
/// the lock runtime understands, for opening a plain `redis::Client` on the same server.
pub fn without_runtime_params(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(name, _)| name);
            !pair.is_empty() && !RUNTIME_PARAMS.contains(&name)
        })
        .collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// A failed store operation (Redis unreachable, timed out, or an error reply).
#[derive(Debug)]
pub struct StoreError {
    what: String,
    source: redis::RedisError,
}

impl StoreError {
    fn new(what: String, source: redis::RedisError) -> StoreError {
        StoreError { what, source }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stock store: {}", self.what)
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::without_runtime_params;

    #[test]
    fn runtime_params_are_dropped() {
        assert_eq!(
            without_runtime_params("redis://h:1"),
            "redis://h:1".to_owned()
        );
        assert_eq!(
            without_runtime_params("redis://h:1/2?prefix=x:&lease=3s"),
            "redis://h:1/2".to_owned()
        );
        assert_eq!(
            without_runtime_params("redis://h:1?wait=1s&protocol=resp3&timeout=2s"),
            "redis://h:1?protocol=resp3".to_owned()
        );
    }
}
