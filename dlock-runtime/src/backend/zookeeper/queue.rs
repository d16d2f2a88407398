//! The queue recipe: each contender creates an ephemeral sequential node
//! `/<prefix>/<escaped key>/lock-<owner>-<sequence>` under container parents; the holder is
//! the lowest sequence; each waiter watches only its predecessor (no herd). A node whose
//! delete got no answer is removed in the background until the server answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Acls, CreateMode, Error as ZkError, EventType, SessionState};

use super::path::{self, escape, sequence};
use super::session::{Session, answered};
use super::shared::{self, Waited};
use crate::backend::mode::Mode;
use crate::backend::successor::Successors;
use crate::backend::{Attempt, Queued};
use crate::error::LockError;

pub(super) struct Queue {
    pub(super) session: Arc<Session>,
    pub(super) root: String,
    /// Owner token -> its place in a queue.
    contenders: Mutex<HashMap<String, Place>>,
    /// This runtime's waiters by the node they watch, for hand-overs within the process.
    successors: Successors,
}

/// A contender's place in the queue of its key.
#[derive(Debug, Clone)]
pub(super) struct Place {
    /// Its node's full path.
    pub(super) node: String,
    /// An exclusive contender that acquired (its node heads the queue) and has not yet
    /// handed its key to the waiter of this runtime behind it (see [`Successors`]).
    holding: bool,
}

/// First pause of a background removal; it doubles up to [`REMOVAL_PAUSE_MAX`].
const REMOVAL_PAUSE_FIRST: Duration = Duration::from_millis(100);

/// Longest pause between two attempts of a background removal.
const REMOVAL_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The start of the names of `owner`'s queue nodes: the owner token is in the name, so a
/// node can be found without knowing its sequence number.
pub(super) fn marker(owner: &str) -> String {
    format!("lock-{owner}-")
}

impl Queue {
    /// The queues of the keys under `/<prefix>` on `session`.
    pub(super) fn new(session: Arc<Session>, prefix: &str) -> Self {
        Self {
            session,
            root: format!("/{}", escape(prefix.trim_end_matches(':'))),
            contenders: Mutex::default(),
            successors: Successors::default(),
        }
    }

    pub(super) fn contenders(&self) -> MutexGuard<'_, HashMap<String, Place>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.contenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn parent(&self, key: &str) -> String {
        path::parent(&self.root, key)
    }

    /// Removes `owner`'s nodes in the queue of `key` in the background, after a delete that
    /// got no answer: retried, with pauses growing to a second, until the server answers, for
    /// as long as this runtime lives (then its session ends with it, or expires, and the nodes
    /// with the session). Left alone, a node of a live session would keep its place in line
    /// for as long as the process runs.
    pub(super) fn remove_later(&self, key: &str, owner: &str) {
        self.remove_after(key, owner, REMOVAL_PAUSE_FIRST);
    }

    /// As [`remove_later`](Self::remove_later), first trying once `first` has passed (the end
    /// of a hold that keeps the key: ZooKeeper nodes have no TTL of their own).
    pub(super) fn remove_after(&self, key: &str, owner: &str, first: Duration) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self
            .session
            .removing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner.to_owned())
        {
            // Already being removed.
            return;
        }
        let session = Arc::downgrade(&self.session);
        let (key, owner, parent) = (key.to_owned(), owner.to_owned(), self.parent(key));
        handle.spawn(async move {
            let marker = marker(&owner);
            tokio::time::sleep(first).await;
            let mut pause = REMOVAL_PAUSE_FIRST;
            loop {
                let Some(session) = session.upgrade() else {
                    return;
                };
                match session.delete_marked(&key, &parent, &marker).await {
                    Ok(deleted) => {
                        if deleted {
                            tracing::debug!(key = %key, "a node whose delete went unanswered was removed");
                        }
                        session
                            .removing
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .remove(&owner);
                        return;
                    }
                    Err((err, session_error)) => {
                        tracing::debug!(key = %key, error = %err, "removing a node failed; retrying");
                        if let Some(e) = session_error {
                            let _ = session.recover(&e).await;
                        }
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REMOVAL_PAUSE_MAX);
            }
        });
    }

    /// Queues in `key` until first in line (`Acquired`) or `deadline` (`Busy`, node deleted).
    pub(super) async fn join(
        &self,
        key: &str,
        owner: &str,
        deadline: Instant,
    ) -> Result<Queued, LockError> {
        let client = self.session.client();
        let parent = self.parent(key);
        let acls = Acls::anyone_all();
        let container = CreateMode::Container.with_acls(acls);
        let ephemeral = CreateMode::EphemeralSequential.with_acls(acls);
        // The owner token in the name: a release that lost track of the node (the create was
        // in flight when the acquire was cancelled) still finds it (Curator's "protected" mode).
        let node_prefix = format!("{parent}/{}", marker(owner));
        let created = client.create(&node_prefix, owner.as_bytes(), &ephemeral);
        let (stat, seq) = match self
            .session
            .within(Some(key), "queueing failed", created)
            .await?
        {
            Ok(done) => done,
            // No parent yet (first use, or the server removed the empty container): create
            // the container parents, then the node. The common case is one call.
            Err(ZkError::NoNode) => {
                self.session
                    .bounded(
                        Some(key),
                        "queueing failed",
                        client.mkdir(&parent, &container),
                    )
                    .await?;
                self.session
                    .bounded(
                        Some(key),
                        "queueing failed",
                        client.create(&node_prefix, owner.as_bytes(), &ephemeral),
                    )
                    .await?
            }
            Err(e) => return Err(self.session.failed(Some(key), "queueing failed", e).await),
        };
        let my_seq = seq.into_i64();
        let my_node = format!("{node_prefix}{seq}");
        let place = Place {
            node: my_node.clone(),
            holding: false,
        };
        self.contenders().insert(owner.to_owned(), place);
        let mode = Mode::of(owner);
        if mode.is_shared() {
            let fence = u64::try_from(stat.czxid).ok();
            let waited = shared::wait(
                &self.session,
                key,
                (&parent, &my_node, my_seq),
                deadline,
                mode,
            )
            .await?;
            let attempt = match waited {
                Waited::Holds => Attempt::Acquired { fence },
                Waited::GaveUp => {
                    self.leave(key, owner).await;
                    Attempt::Busy { ttl: None }
                }
                Waited::Refused(err) => {
                    self.leave(key, owner).await;
                    return Err(err);
                }
            };
            return Ok(Queued::kept_alive(attempt));
        }
        let queued = self
            .wait_exclusive(key, owner, (&parent, &my_node, my_seq), &stat, deadline)
            .await?;
        if matches!(queued.attempt, Attempt::Acquired { .. })
            && let Some(place) = self.contenders().get_mut(owner)
        {
            // Its node heads the queue: its release may hand it to the waiter behind.
            place.holding = true;
        }
        Ok(queued)
    }

    /// The release of `owner`'s hold is about to be sent: if it was an exclusive hold that had
    /// not handed its key over yet, tells the waiter of this runtime watching its node (right
    /// behind the head), if there is one.
    pub(super) fn hand_over(&self, owner: &str) {
        let node = self
            .contenders()
            .get_mut(owner)
            .and_then(|place| std::mem::take(&mut place.holding).then(|| place.node.clone()));
        if let Some(node) = node
            && self.successors.hand_over(node.as_bytes())
        {
            tracing::trace!(node = %node, "handed over to the next waiter of this runtime");
        }
    }

    /// Since when the node created with `stat` lives for sure, for the negotiated session
    /// timeout, if it does as far as this client knows: its session is the one in place and
    /// connected, and the server answered a call sent within the last half of the timeout
    /// (the server expires a session no earlier than the timeout after the last call it
    /// heard; the watchdog's renewals call every third of it). `None`: not known.
    fn node_alive_since(&self, stat: &zookeeper_client::Stat) -> Option<Instant> {
        let client = self.session.client();
        let confirmed = self.session.confirmed();
        let in_place = client.state() == SessionState::SyncConnected
            && client.session_id().0 == stat.ephemeral_owner;
        (in_place && Instant::now() < confirmed + self.session.negotiated() / 2)
            .then_some(confirmed)
    }

    /// Waits until the exclusive contender `my_node` (sequence `my_seq`) under `parent` heads
    /// the queue (`Acquired`), or `deadline` (`Busy`, node deleted).
    async fn wait_exclusive(
        &self,
        key: &str,
        owner: &str,
        (parent, my_node, my_seq): (&str, &str, i64),
        stat: &zookeeper_client::Stat,
        deadline: Instant,
    ) -> Result<Queued, LockError> {
        let fence = u64::try_from(stat.czxid).ok();
        let acquired = Queued::kept_alive(Attempt::Acquired { fence });
        let client = self.session.client();
        let parent = parent.to_owned();
        loop {
            let children = self
                .session
                .bounded(
                    Some(key),
                    "queue lookup failed",
                    client.list_children(&parent),
                )
                .await?;
            let lowest = children.iter().filter_map(|name| sequence(name)).min();
            let predecessor = children
                .iter()
                .filter_map(|name| sequence(name).map(|s| (s, name)))
                .filter(|(s, _)| *s < my_seq)
                .max_by_key(|(s, _)| *s);
            // The predecessor heads the queue: once it is deleted nobody is ahead (sequence
            // numbers only grow, so no node can appear between it and us).
            let behind_the_head = predecessor.is_some_and(|(s, _)| Some(s) == lowest);
            let predecessor = predecessor.map(|(_, name)| format!("{parent}/{name}"));
            let Some(predecessor) = predecessor else {
                if !children.iter().any(|c| my_node.ends_with(c.as_str())) {
                    return Err(LockError::backend(
                        Some(key),
                        "the queue node vanished (session expired?)",
                        None,
                    ));
                }
                return Ok(acquired);
            };
            if Instant::now() >= deadline {
                self.leave(key, owner).await;
                return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
            }
            // Known to the holders of this runtime from now until this iteration ends: the
            // predecessor's release, if it is ours, hands the key over (see `Successors`).
            let mut handed = self.successors.watch(predecessor.as_bytes());
            let watched = self.session.bounded(
                Some(key),
                "watch failed",
                client.check_and_watch_stat(&predecessor),
            );
            let woken = async {
                let (exists, watcher) = tokio::select! {
                    biased;
                    () = handed.handed() => return Ok(None),
                    watched = watched => watched?,
                };
                if exists.is_none() {
                    return Ok(Some(None));
                }
                let changed = watcher.changed();
                tokio::pin!(changed);
                tokio::select! {
                    biased;
                    () = handed.handed() => Ok(None),
                    event = &mut changed => Ok(Some(Some(event))),
                }
            };
            let woken: Result<_, LockError> = match tokio::time::timeout_at(deadline, woken).await {
                Ok(woken) => woken,
                Err(_) => {
                    drop(handed);
                    self.leave(key, owner).await;
                    return Ok(Queued::kept_alive(Attempt::Busy { ttl: None }));
                }
            };
            let event = match woken? {
                // The holder ahead is ours and released: first in line, if the node lives for
                // sure, counted from the session's last confirmation (else the node's own
                // events decide, as without the hand-over).
                None => match self.node_alive_since(stat) {
                    Some(since) => {
                        return Ok(Queued {
                            attempt: Attempt::Acquired { fence },
                            confirmed: Some(since),
                        });
                    }
                    None => continue,
                },
                // The predecessor was gone already: look again.
                Some(None) => continue,
                Some(Some(event)) => event,
            };
            if behind_the_head && event.event_type == EventType::NodeDeleted {
                // The holder released (or its session ended): ours, without listing again.
                return Ok(acquired);
            }
        }
    }

    /// Gives up `owner`'s place in the queue of `key`, if it has one.
    pub(super) async fn leave(&self, key: &str, owner: &str) {
        let Some(Place { node, .. }) = self.contenders().remove(owner) else {
            return;
        };
        let client = self.session.client();
        match tokio::time::timeout(self.session.timeout, client.delete(&node, None)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if answered(&e) => {}
            // No answer: the node may still be in line, on a session that lives on.
            _ => self.remove_later(key, owner),
        }
    }
}
