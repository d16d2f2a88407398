//! Server processes for dlock's tests and benchmarks.
//!
//! Every test that needs an engine starts its own server: on free loopback ports (never an
//! engine's default port), in a fresh temp dir, ready when the server itself says it serves,
//! and killed with SIGKILL by PID when the handle drops. If the test is failing at that point,
//! the server's log is printed to stderr. A missing server binary fails the test with a message
//! saying how to install it; nothing is skipped.
//!
//! - [`process`]: [`TestProcess`], one child process with its log, readiness wait and faults
//!   (kill -9, SIGSTOP/SIGCONT, restart on the same port), plus free ports and binaries.
//! - [`redis`]: [`RedisServer`], plain or TLS (feature `tls`), and [`RedisKeys`] to inspect
//!   keys behind the runtime's back.
//! - [`cluster`]: [`RedisCluster`](cluster::RedisCluster), three masters and three replicas.
//! - `etcd` (feature `etcd`): one member or a cluster, inspected through `etcd-client`.
//! - [`zookeeper`]: a standalone ZooKeeper under `java`.
//! - [`holder`]: [`HolderProcess`], a lock holder in its own OS process.
//! - [`limits`]: each engine's limits the tests count on (short lease, dead-holder bound,
//!   restart extension, wake bound), one table for the conformance suite and the torture
//!   program.
//! - [`net`]: [`FaultProxy`], one client↔server link with latency, black hole, reset,
//!   half-close and cut faults.
//!
//! The kit panics instead of returning errors: it is test code, where a panic is how a check
//! fails.

pub mod cluster;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod holder;
pub mod limits;
pub mod net;
pub mod process;
pub mod redis;
pub mod zookeeper;

pub use holder::HolderProcess;
pub use net::FaultProxy;
pub use process::TestProcess;
pub use redis::{RedisKeys, RedisServer};
