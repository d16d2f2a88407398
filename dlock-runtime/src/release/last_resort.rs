//! The release path that does not depend on the runtime's tokio handle: when the tokio
//! runtime a background release was spawned on shuts down before it finished, the release
//! runs here, on a thread of its own with a tokio runtime of its own and a new connection to
//! the engine, bounded by the runtime's `timeout`. The dropping thread waits for it, so a
//! process that exits right after its tokio runtime has sent the release first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{AnyBackend, Context, EngineConfig, Wakeups};

/// How to reach the engine again, without the runtime's tokio handle.
pub(crate) struct LastResort {
    /// The engine's configuration, to connect again; `None` for an in-process engine, whose
    /// backend does not depend on any tokio runtime.
    config: Option<Box<dyn EngineConfig>>,
    prefix: String,
    /// The runtime's id, as the engines know it.
    origin: String,
    timeout: Duration,
    /// Set after the engine could not be reached this way: later releases do not wait again.
    unreachable: AtomicBool,
}

impl LastResort {
    pub(crate) fn new(
        config: &dyn EngineConfig,
        prefix: String,
        origin: String,
        timeout: Duration,
    ) -> Self {
        Self {
            config: (!config.in_process()).then(|| config.clone_box()),
            prefix,
            origin,
            timeout,
            unreachable: AtomicBool::new(false),
        }
    }
}

/// Notifications have nowhere to go on a connection made only to release.
struct NoWakeups;

impl Wakeups for NoWakeups {
    fn wake(&self, _key: &str) {}
    fn wake_all(&self) {}
}

impl LastResort {
    /// Releases `owner`'s hold on `key` without the runtime's tokio handle, waiting at most about
    /// twice the runtime's `timeout` (connect, then release); `backend` is the runtime's own,
    /// used as it is only for an in-process engine.
    /// A hold that keeps its key until `hold_until` keeps it for what is left then.
    pub(crate) fn release(
        &self,
        backend: &Arc<AnyBackend>,
        key: &str,
        owner: &str,
        hold_until: Option<Instant>,
    ) {
        let last = self;
        if last.unreachable.load(Ordering::Acquire) {
            tracing::warn!(key = %key, "lock not released at shutdown (engine unreachable); it expires with its lease");
            return;
        }
        let (done, finished) = mpsc::channel();
        let (config, backend) = match &last.config {
            Some(config) => (Some(config.clone_box()), None),
            None => (None, Some(backend.clone())),
        };
        let ctx = Context {
            prefix: last.prefix.clone(),
            origin: last.origin.clone(),
            timeout: last.timeout,
            wakeups: Arc::new(NoWakeups),
        };
        let (timeout, key2, owner2) = (last.timeout, key.to_owned(), owner.to_owned());
        let spawned = std::thread::Builder::new()
            .name("dlock-last-release".into())
            .spawn(move || {
                let engine = match (config, backend) {
                    (Some(config), _) => Engine::Connect(config, ctx),
                    (None, Some(backend)) => Engine::InProcess(backend),
                    (None, None) => return,
                };
                let released = release_on_own_runtime(engine, timeout, &key2, &owner2, hold_until);
                let _ = done.send(released);
            });
        if spawned.is_err() {
            tracing::warn!(key = %key, "no thread for the release at shutdown; the lock expires with its lease");
            return;
        }
        let bound = last.timeout * 2 + Duration::from_millis(500);
        match finished.recv_timeout(bound) {
            Ok(Ok(())) => {
                tracing::debug!(key = %key, "lock released after its tokio runtime shut down")
            }
            Ok(Err(err)) => {
                last.unreachable.store(true, Ordering::Release);
                tracing::warn!(key = %key, error = %err, "release at shutdown failed; the lock expires with its lease");
            }
            Err(_) => {
                last.unreachable.store(true, Ordering::Release);
                tracing::warn!(key = %key, "release at shutdown timed out; the lock expires with its lease");
            }
        }
    }
}

/// The engine a last-resort release reaches: connected again, or the in-process one as it is.
enum Engine {
    Connect(Box<dyn EngineConfig>, Context),
    InProcess(Arc<AnyBackend>),
}

fn release_on_own_runtime(
    engine: Engine,
    timeout: Duration,
    key: &str,
    owner: &str,
    hold_until: Option<Instant>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no tokio runtime: {e}"))?;
    runtime.block_on(async {
        let backend: Arc<AnyBackend> = match engine {
            Engine::InProcess(backend) => backend,
            Engine::Connect(config, ctx) => tokio::time::timeout(timeout, config.connect(ctx))
                .await
                .map_err(|_| "connecting timed out".to_owned())?
                .map_err(|e| e.to_string())?,
        };
        let ending = super::end::end_in_engine(backend.as_ref(), key, owner, hold_until);
        tokio::time::timeout(timeout, ending)
            .await
            .map_err(|_| "the release timed out".to_owned())?
            .map(drop)
            .map_err(|e| e.to_string())
    })
}
