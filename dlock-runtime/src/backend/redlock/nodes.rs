//! The request layer of Redlock: a call on every node at once, each bounded by the per-node
//! timeout, either awaited whole ([`Nodes::on_all`]) or decided as the answers come
//! ([`Nodes::each_node`], see `fanout.rs`); a node that fails is suspected of a restart; a
//! release a node missed is retried in the background.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::config::Tuning;
use super::fanout::{FanOut, NodeCall};
use super::restarts::{NodeIdentity, NodeWakeups};
use crate::backend::redis::RedisBackend;
use crate::backend::redis::config::redact;
use crate::backend::{Backend, Context};
use crate::error::LockError;

/// Background attempts at a release (or an undo) a node did not answer.
const RELEASE_RETRIES: u32 = 5;

/// The nodes, each a lazily connected single-server backend, and how a call reaches them.
pub(super) struct Nodes {
    pub(super) nodes: Arc<[Arc<RedisBackend>]>,
    urls: Vec<Arc<str>>,
    /// What is known of each node's server process (its restarts), by node.
    pub(super) identities: Vec<Arc<NodeIdentity>>,
    pub(super) quorum: usize,
    pub(super) node_timeout: Duration,
}

impl Nodes {
    /// Sets up one lazily connected client per node (a node that is down does not stop the
    /// runtime from starting: it is one of the minority Redlock tolerates). Each node's calls
    /// are bounded by `node_timeout`.
    pub(super) fn connect(
        urls: &[String],
        ctx: &Context,
        tuning: &Tuning,
    ) -> Result<Self, LockError> {
        let redacted: Vec<String> = urls.iter().map(|url| redact(url)).collect();
        let identities: Vec<Arc<NodeIdentity>> = redacted
            .iter()
            .map(|url| NodeIdentity::new(url.clone()))
            .collect();
        let nodes = urls
            .iter()
            .zip(&identities)
            .map(|(url, identity)| {
                // A disconnect of this node's connection marks it for a run id check.
                let node_ctx = Context {
                    timeout: tuning.node_timeout,
                    wakeups: Arc::new(NodeWakeups {
                        inner: ctx.wakeups.clone(),
                        identity: identity.clone(),
                    }),
                    ..ctx.clone()
                };
                RedisBackend::connect_lazy(url, &node_ctx).map(Arc::new)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            nodes: nodes.into(),
            urls: redacted.into_iter().map(Arc::from).collect(),
            identities,
            quorum: tuning.quorum,
            node_timeout: tuning.node_timeout,
        })
    }

    /// The error of node `i` that did not answer within the node timeout.
    pub(super) fn node_timed_out(&self, i: usize, key: Option<&str>) -> LockError {
        timed_out(&self.urls[i], self.node_timeout, key)
    }

    /// Runs `op` on every node at once and waits for every answer; each answer is bounded by
    /// the per-node timeout.
    pub(super) async fn on_all<'a, T, F>(
        &'a self,
        key: Option<&'a str>,
        op: impl Fn(usize, &'a RedisBackend) -> F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Future<Output = Result<T, LockError>>,
    {
        let answers: Vec<Result<T, LockError>> =
            join_all(self.nodes.iter().enumerate().map(|(i, node)| {
                let call = op(i, node);
                async move {
                    match tokio::time::timeout(self.node_timeout, call).await {
                        Ok(answer) => answer,
                        Err(_) => {
                            node.note_timeout(self.node_timeout);
                            Err(self.node_timed_out(i, key))
                        }
                    }
                }
            }))
            .await;
        // A node that failed may have restarted: read its run id before its next grant counts.
        for (identity, answer) in self.identities.iter().zip(&answers) {
            if answer.is_err() {
                identity.suspect();
            }
        }
        answers
    }

    /// `op` on every node, each call owning what it needs (so that what is still out when the
    /// outcome is known can finish in the background), bounded by the per-node timeout; a node
    /// that fails is suspected of a restart (its run id is read again before its next grant
    /// counts), whenever its answer comes.
    pub(super) fn each_node<T, F>(
        &self,
        key: Option<&Arc<str>>,
        op: impl Fn(usize, Arc<RedisBackend>) -> F,
    ) -> FanOut<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, LockError>> + Send + 'static,
    {
        let calls = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let identity = self.identities[i].clone();
                // A node that may not have the scripts may not be connected either (first
                // contact, a disconnect or failure since): its answer is awaited (see
                // `FanOut`).
                let needs_scripts = identity.needs_scripts();
                let awaited = needs_scripts.is_some();
                // Sent ahead of the call (polled first), on the same connection.
                let load = needs_scripts.map(|epoch| {
                    let (node, identity) = (node.clone(), identity.clone());
                    async move {
                        if node.load_scripts().await.is_ok() {
                            identity.scripts_loaded(epoch);
                        }
                    }
                });
                // Boxed as it is made: the future below moves a pointer, not the request's
                // whole state, each time it is wrapped or polled first.
                let call = Box::pin(op(i, node.clone()));
                let timeout = self.node_timeout;
                let silent = node.clone();
                // Only for the message of a node that does not answer (made if it does not).
                let (url, key) = (self.urls[i].clone(), key.cloned());
                // Unconstrained: tokio's cooperative budget must not keep the first poll from
                // queueing the request on its connection (see `fanout`).
                let call = Box::pin(tokio::task::unconstrained(async move {
                    let call = async move {
                        match load {
                            Some(load) => tokio::join!(load, call).1,
                            None => call.await,
                        }
                    };
                    let answer = match tokio::time::timeout(timeout, call).await {
                        Ok(answer) => answer,
                        Err(_) => {
                            silent.note_timeout(timeout);
                            Err(timed_out(&url, timeout, key.as_deref()))
                        }
                    };
                    if answer.is_err() {
                        identity.suspect();
                    }
                    answer
                })) as NodeCall<T>;
                (call, awaited)
            })
            .collect();
        FanOut::new(calls)
    }

    /// Retries, in the background, a release `node` did not answer (see [`release_at`]).
    pub(super) fn release_later(&self, node: usize, key: &Arc<str>, owner: &Arc<str>) {
        release_at(
            self.nodes[node].clone(),
            key.clone(),
            owner.clone(),
            Duration::ZERO,
            self.node_timeout,
        );
    }

    /// An owner-checked release of an attempt's copy on `node`, retried in the background if
    /// the node does not answer.
    pub(super) fn undo(
        &self,
        node: usize,
        key: &Arc<str>,
        owner: &Arc<str>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (node, key, owner) = (self.nodes[node].clone(), key.clone(), owner.clone());
        let timeout = self.node_timeout;
        async move {
            let undone = tokio::time::timeout(timeout, node.release(&key, &owner)).await;
            if !matches!(undone, Ok(Ok(_))) {
                release_at(node, key, owner, Duration::ZERO, timeout);
            }
        }
    }

    /// The error when too many nodes failed for a majority to be possible (`answered`: nodes
    /// that answered without an error).
    pub(super) fn no_quorum(
        &self,
        key: &str,
        answered: usize,
        first_error: Option<&LockError>,
    ) -> LockError {
        let source =
            first_error.map(|e| Arc::new(e.clone()) as Arc<dyn std::error::Error + Send + Sync>);
        LockError::backend(
            Some(key),
            format!(
                "redlock quorum not reached: {} of {} nodes answered, {} needed",
                answered,
                self.nodes.len(),
                self.quorum
            ),
            source,
        )
    }

    /// [`on_all`](Self::on_all) for `key`: the answers, or [`no_quorum_of`](Self::no_quorum_of)
    /// when no node answered.
    pub(super) async fn on_any<'a, T, F>(
        &'a self,
        key: &'a str,
        op: impl Fn(usize, &'a RedisBackend) -> F,
    ) -> Result<Vec<Result<T, LockError>>, LockError>
    where
        F: Future<Output = Result<T, LockError>>,
    {
        let answers = self.on_all(Some(key), op).await;
        if answers.iter().all(Result::is_err) {
            return Err(self.no_quorum_of(key, &answers));
        }
        Ok(answers)
    }

    /// [`no_quorum`](Self::no_quorum) from a full set of answers.
    pub(super) fn no_quorum_of<T>(&self, key: &str, answers: &[Result<T, LockError>]) -> LockError {
        let first_error = answers.iter().find_map(|a| a.as_ref().err());
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        self.no_quorum(key, answered, first_error)
    }
}

/// Retries, in the background, a release `node` did not answer: otherwise that node keeps
/// its copy of the lock until the lease runs out. Owner-checked, so harmless where the first
/// attempt did land. Starts `after` from now (the end of a hold that keeps the key).
pub(super) fn release_at(
    node: Arc<RedisBackend>,
    key: Arc<str>,
    owner: Arc<str>,
    after: Duration,
    timeout: Duration,
) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let mut delay = Duration::from_millis(100);
        for _ in 0..RELEASE_RETRIES {
            tokio::time::sleep(delay).await;
            if let Ok(Ok(_)) = tokio::time::timeout(timeout, node.release(&key, &owner)).await {
                return;
            }
            delay *= 2;
        }
        tracing::debug!(key = %key, "a redlock node missed a release; its copy expires with the lease");
    });
}

/// The error of the node at `url` that did not answer within `timeout`.
fn timed_out(url: &str, timeout: Duration, key: Option<&str>) -> LockError {
    LockError::backend(
        key,
        format!("redlock node {url} did not answer within {timeout:?}"),
        None,
    )
}
