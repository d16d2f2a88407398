//! One request per node, answers taken as they come: the caller settles as soon as the answers
//! so far decide the outcome, and the requests still out finish in the background.
//!
//! Invariant: every node's request is polled at least once before [`FanOut::until`] returns,
//! and whatever is started afterwards ([`Background::start`]) is polled once before it is
//! handed to a task, so a request finished in the background still reaches its node before
//! the caller's next request to that node.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::error::LockError;

/// One node's request, bounded by the node timeout, owning what it needs.
pub(super) type NodeCall<T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send>>;

/// One node's answer so far (`None`: not answered yet).
pub(super) type Answer<T> = Option<Result<T, LockError>>;

/// Work left for the background (answers still out, releases being sent).
type Chore = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The answers of one request sent to every node, by node (`None`: not answered yet).
pub(super) struct FanOut<T> {
    calls: Vec<Option<NodeCall<T>>>,
    answers: Vec<Answer<T>>,
    /// Nodes whose answer (or timeout) the outcome waits for whatever the others said: their
    /// connection may be being (re)established, so their request may not be queued on it
    /// yet, and left to the background it could go out after a later request to that node.
    /// Awaited to the end, a request that never went out is dropped with its call instead.
    awaited: Vec<bool>,
}

impl<T: Send + 'static> FanOut<T> {
    /// `calls` by node; `awaited`: whether the node's answer must come before the outcome is
    /// settled (see [`FanOut::awaited`]).
    pub(super) fn new(calls: Vec<(NodeCall<T>, bool)>) -> Self {
        let answers = calls.iter().map(|_| None).collect();
        let (calls, awaited): (Vec<_>, Vec<_>) = calls
            .into_iter()
            .map(|(call, awaited)| (Some(call), awaited))
            .unzip();
        Self {
            calls,
            answers,
            awaited,
        }
    }

    /// Polls every request still out until `settled` says the answers so far decide the
    /// outcome, or every node has answered. Each round polls every request before asking, so
    /// every request has been polled (handed to its connection) when this returns.
    pub(super) async fn until(&mut self, mut settled: impl FnMut(&[Answer<T>]) -> bool) {
        std::future::poll_fn(|cx| {
            let mut out = 0;
            for (call, answer) in self.calls.iter_mut().zip(&mut self.answers) {
                let Some(pending) = call else { continue };
                match pending.as_mut().poll(cx) {
                    Poll::Ready(done) => {
                        *answer = Some(done);
                        *call = None;
                    }
                    Poll::Pending => out += 1,
                }
            }
            let awaited_out = self
                .calls
                .iter()
                .zip(&self.awaited)
                .any(|(call, &awaited)| awaited && call.is_some());
            // Asked every round, the last one too: the caller keeps what it counted.
            if (!awaited_out && settled(&self.answers)) || out == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// The answers so far, by node.
    pub(super) fn answers(&self) -> &[Answer<T>] {
        &self.answers
    }

    /// The requests still out, each ending with `late(node, answer)`, as background work that
    /// comes first in its node's order (see [`Background`]).
    pub(super) fn rest(
        self,
        late: impl Fn(usize, Result<T, LockError>) + Clone + Send + 'static,
    ) -> Background {
        let mut rest = Background::default();
        for (i, call) in self.calls.into_iter().enumerate() {
            if let Some(call) = call {
                let late = late.clone();
                // Already polled: it is in its connection's queue.
                rest.chores.push(Box::pin(async move {
                    let answer = call.await;
                    late(i, answer);
                }));
            }
        }
        rest
    }
}

/// Work that outlives the call that started it: answers still out, and requests sent now whose
/// answers nobody waits for. Polled in the order started (so on one node, a request started
/// later is queued after the earlier ones), then run by one spawned task.
#[derive(Default)]
#[must_use = "spawn it, or the requests it holds are dropped"]
pub(super) struct Background {
    chores: Vec<Chore>,
}

impl Background {
    /// Adds `chore`, polled once now (which queues its request on its node's connection).
    pub(super) fn start(&mut self, chore: impl Future<Output = ()> + Send + 'static) {
        // Unconstrained: tokio's cooperative budget must not turn that first poll into a no-op.
        let mut chore: Chore = Box::pin(tokio::task::unconstrained(chore));
        // The task that runs it polls it again with its own waker; nothing is missed.
        let mut cx = Context::from_waker(Waker::noop());
        if chore.as_mut().poll(&mut cx).is_pending() {
            self.chores.push(chore);
        }
    }

    /// Runs what is left on a task of its own (nothing to spawn when everything is done).
    pub(super) fn spawn(self) {
        if self.chores.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let mut chores = self.chores;
            std::future::poll_fn(|cx| {
                chores.retain_mut(|chore| chore.as_mut().poll(cx).is_pending());
                if chores.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        });
    }
}

#[cfg(test)]
mod tests;
