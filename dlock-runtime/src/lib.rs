#![doc = include_str!("../../README.md")]
//!
//! # Features
//!
//! - `macros` (default): re-exports the [`distributed_lock`] attribute.
//! - `redis` (default): the Redis engine (`redis://`).
//! - `tls`: `rediss://` (TLS through rustls).
//! - `etcd`: the etcd engine (`etcd://`); its client's build needs `protoc`.
//! - `zookeeper`: the ZooKeeper engine (`zk://`).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod duration;
mod error;
mod guard;
mod lock;
mod runtime;
mod wait;
mod watchdog;

#[doc(hidden)]
pub mod __private;
#[doc(hidden)]
pub mod testing;

#[cfg(feature = "macros")]
pub use dlock_macros::distributed_lock;
pub use error::{BackendError, LockError};
pub use guard::LockGuard;
pub use lock::{LockBuilder, OnLost, current_fence, lock, with_lock};
pub use runtime::{
    DEFAULT_LEASE, DEFAULT_NODE_TIMEOUT, DEFAULT_PREFIX, DEFAULT_SESSION_TIMEOUT, DEFAULT_TIMEOUT,
    MAX_LEASE, Runtime, RuntimeBuilder,
};
