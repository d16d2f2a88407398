//! A thread with a tokio runtime of the engine's own for a client library's background tasks
//! (its connections: etcd, ZooKeeper).
//!
//! Invariant: those tasks are never woken onto a caller's worker, so a holder that blocks its
//! thread cannot stall the connection its renewals go over.

use std::future::Future;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

use crate::error::LockError;

/// A current-thread tokio runtime on a thread of its own, running until dropped.
pub(crate) struct IoThread {
    handle: Handle,
    /// Dropped with the value: the thread then returns, and its runtime drops every task.
    _stop: oneshot::Sender<()>,
}

impl IoThread {
    /// Starts the thread, named `name`.
    pub(crate) fn start(name: &str) -> Result<Self, LockError> {
        let failed = |e: std::io::Error| {
            LockError::backend(
                None,
                format!("cannot start the {name} thread"),
                Some(std::sync::Arc::new(e)),
            )
        };
        let runtime = Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(failed)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Runs the spawned tasks until the sender drops.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(failed)?;
        Ok(Self {
            handle,
            _stop: stop,
        })
    }

    /// Runs `work` on the thread (whatever it spawns stays there) and returns its output.
    /// Dropping the returned future cancels `work`.
    pub(crate) async fn run<F>(&self, work: F) -> Result<F::Output, LockError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let mut task = AbortOnDrop(self.handle.spawn(work));
        (&mut task.0).await.map_err(|e| {
            LockError::backend(
                None,
                "the engine's connection thread stopped",
                Some(std::sync::Arc::new(e)),
            )
        })
    }
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `run` spawns lives on the thread: it keeps running while the calling runtime's
    /// only worker is blocked, and stops when the thread is dropped.
    #[tokio::test]
    // `run` yields the ticker's handle, awaited at the end (after the thread is dropped).
    #[allow(clippy::async_yields_async)]
    async fn tasks_spawned_by_run_live_on_the_thread_until_it_drops() {
        let io = IoThread::start("dlock-test-io").expect("thread");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let ticker = io
            .run(async move {
                tokio::spawn(async move {
                    for n in 0.. {
                        if tx.send(n).is_err() {
                            return;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                })
            })
            .await
            .expect("run");
        // The caller's (current-thread) runtime is blocked: the ticker runs anyway.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut seen = 0;
        while rx.try_recv().is_ok() {
            seen += 1;
        }
        assert!(seen >= 5, "only {seen} ticks while the caller was blocked");
        drop(io);
        let ended = ticker.await;
        assert!(
            ended.is_err_and(|e| e.is_cancelled()),
            "the task ends with the thread"
        );
    }

    /// Dropping `run`'s future cancels the work.
    #[tokio::test]
    async fn dropping_run_cancels_the_work() {
        let io = IoThread::start("dlock-test-io").expect("thread");
        let (tx, rx) = oneshot::channel::<()>();
        let work = io.run(async move {
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        let _ = tokio::time::timeout(std::time::Duration::from_millis(20), work).await;
        assert!(rx.await.is_err(), "the cancelled work dropped its sender");
    }
}
