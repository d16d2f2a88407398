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

// Layers, each module importing only from those above it in this list's reverse:
// vocabulary (error, events, duration, lease, inspect), engines (backend, engines),
// primitives (wait, release, watchdog, baton), what a runtime shares and one hold (core,
// held, handoff), a hold's users (chain, guard, acquire), acquiring (lock), and the top
// (protect, runtime, builder). See ARCHITECTURE.md.
mod duration;
mod error;
mod events;
mod inspect;
mod lease;

#[cfg(feature = "axum")]
mod axum;
mod backend;
mod engines;

mod baton;
mod release;
mod wait;
mod watchdog;

mod core;
mod handoff;
mod held;

mod acquire;
mod chain;
mod guard;

mod lock;

mod builder;
mod protect;
mod runtime;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod fenced;

#[doc(hidden)]
pub mod __private;
#[doc(hidden)]
pub mod testing;

pub use acquire::fair::FAIR_PLACE;
#[cfg(feature = "redis")]
pub use backend::redlock::config::DEFAULT_NODE_TIMEOUT;
#[cfg(feature = "zookeeper")]
pub use backend::zookeeper::config::DEFAULT_SESSION_TIMEOUT;
pub use builder::{DEFAULT_LEASE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RuntimeBuilder};
pub use chain::current_fence;
pub use core::MAX_LEASE;
#[cfg(feature = "macros")]
pub use dlock_macros::distributed_lock;
pub use error::{BackendError, LockError};
pub use events::{EVENT_BUFFER, LockEvent};
pub use guard::LockGuard;
pub use inspect::LockInfo;
pub use lock::{LockBuilder, MAX_KEY_LEN, OnLost, lock, lock_all, semaphore};
pub use protect::with_lock;
pub use runtime::Runtime;
