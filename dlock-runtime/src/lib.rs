#![doc = include_str!("../README.md")]
//!
//! # Features
//!
//! - `macros` (default): re-exports the [`distributed_lock`] attribute.
//! - `redis` (default): the Redis engines (`redis://`, `redis+cluster://`, `redlock://`), and
//!   [`fenced`], storage on Redis that rejects writes from stale lock holders.
//! - `tls`: `rediss://` (TLS through rustls, server certificates verified).
//! - `etcd`: the etcd engine (`etcd://`); its client's build needs `protoc`.
//! - `zookeeper`: the ZooKeeper engine (`zk://`).
//! - `metrics`: acquisition and hold times, renewals, losses, timeouts and held locks through
//!   the `metrics` facade, labelled by engine (see "Events, metrics and tracing" above).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
#[cfg(feature = "axum")]
mod axum;
mod backend;
mod builder;
mod chain;
mod core;
mod duration;
mod engines;
mod error;
mod events;
mod fair;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod fenced;
mod guard;
mod handoff;
mod held;
mod inspect;
mod last_resort;
mod lock;
mod lost;
mod multi;
mod runtime;
mod wait;
mod watchdog;

#[doc(hidden)]
pub mod __private;
#[doc(hidden)]
pub mod testing;

#[cfg(feature = "redis")]
pub use backend::redlock::config::DEFAULT_NODE_TIMEOUT;
#[cfg(feature = "zookeeper")]
pub use backend::zookeeper::config::DEFAULT_SESSION_TIMEOUT;
pub use builder::RuntimeBuilder;
pub use chain::current_fence;
pub use core::MAX_LEASE;
#[cfg(feature = "macros")]
pub use dlock_macros::distributed_lock;
pub use error::{BackendError, LockError};
pub use events::{EVENT_BUFFER, LockEvent};
pub use fair::FAIR_PLACE;
pub use guard::LockGuard;
pub use inspect::LockInfo;
pub use lock::{LockBuilder, MAX_KEY_LEN, OnLost, lock, lock_all, semaphore, with_lock};
pub use runtime::{DEFAULT_LEASE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, Runtime};
