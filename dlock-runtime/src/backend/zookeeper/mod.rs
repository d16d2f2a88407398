//! ZooKeeper (`zk://h1:2181,h2:2181/chroot`): a consensus store (Zab, CP), a queue of ephemeral
//! sequential nodes per key ([`queue`]) on one session ([`session`]).
//!
//! Invariant: a lock lives as long as the runtime's session, so the runtime never counts on more
//! than the *negotiated* session timeout after the send time of its last answered call, whatever
//! the lease. The fence is the node's creation zxid (`czxid`), strictly increasing across holders.

pub(crate) mod config;
mod inspect;
mod path;
mod queue;
mod session;
mod shared;

pub(crate) use path::escape as path_segment;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, SessionState};

use self::path::sequence;
use self::queue::{Queue, marker};
use self::session::{Session, answered, zk_error};
use super::{
    Attempt, Backend, Capabilities, Context, EngineResult, Queued, Queueing, Released, Renewal,
};
use crate::error::LockError;
use crate::inspect::LockInfo;

pub(crate) struct ZooKeeperBackend {
    session: Arc<Session>,
    queue: Queue,
}

impl ZooKeeperBackend {
    /// Connects to `connect` (`host:port,host:port[/chroot]`).
    pub(crate) async fn connect(
        connect: &str,
        session_timeout: Duration,
        ctx: &Context,
    ) -> Result<Self, LockError> {
        let session = Arc::new(Session::start(connect, session_timeout, ctx.timeout).await?);
        Ok(Self {
            queue: Queue::new(session.clone(), &ctx.prefix),
            session,
        })
    }
}

impl Backend for ZooKeeperBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            queue: true,
            renew_batch_limit: 64,
            ..Capabilities::DEFAULT
        }
    }

    async fn try_acquire(&self, key: &str, owner: &str, _lease: Duration) -> EngineResult<Attempt> {
        Ok(self.queue.join(key, owner, Instant::now()).await?.attempt)
    }

    async fn acquire_queued(
        &self,
        key: &str,
        owner: &str,
        ask: Queueing,
    ) -> Result<Queued, LockError> {
        // The session (pinged every third of its timeout) keeps the node alive.
        self.queue.join(key, owner, ask.deadline).await
    }

    async fn renew(&self, batch: &[Renewal]) -> Result<Vec<Option<bool>>, LockError> {
        let mut client = self.session.client();
        if matches!(client.state(), SessionState::Expired | SessionState::Closed) {
            // The session ended on the client: resume it or open a new one; the nodes are
            // then looked up on whatever session is in place (a resumed one still has them).
            let _ = self.session.recover(&ZkError::SessionExpired).await;
            client = self.session.client();
        }
        let state = client.state();
        let mut out = Vec::with_capacity(batch.len());
        for item in batch {
            let Some(node) = self
                .queue
                .contenders()
                .get(&item.owner)
                .map(|p| p.node.clone())
            else {
                out.push(Some(false));
                continue;
            };
            out.push(match state {
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                    Some(false)
                }
                SessionState::Disconnected => None,
                _ => match self
                    .session
                    .within(None, "renewal failed", client.check_stat(&node))
                    .await
                    .map_err(|_| ())
                {
                    // Ours only while it is an ephemeral node of the session in place: a node
                    // of a session the client replaced (the server keeps it until it expires
                    // that session) or one written from outside is not kept alive by us.
                    Ok(Ok(Some(stat))) => Some(stat.ephemeral_owner == client.session_id().0),
                    Ok(Ok(None)) => Some(false),
                    Ok(Err(e)) => {
                        let _ = self.session.recover(&e).await;
                        matches!(e, ZkError::SessionExpired).then_some(false)
                    }
                    Err(_) => None,
                },
            });
        }
        Ok(out)
    }

    async fn release(&self, key: &str, owner: &str) -> Result<Released, LockError> {
        let session = &self.session;
        let what = "release failed";
        // Before the delete is sent: the waiter of this runtime right behind the holder takes
        // over now (see `Successors`); the delete's answer is still this release's.
        self.queue.hand_over(owner);
        let Some(node) = self.queue.contenders().get(owner).map(|p| p.node.clone()) else {
            // No record: a create may have landed after its acquire was cancelled. Its name
            // carries the owner token.
            return match session
                .delete_marked(key, &self.queue.parent(key), &marker(owner))
                .await
            {
                Ok(true) => Ok(Released::Freed),
                Ok(false) => Ok(Released::NotOwner),
                Err((err, session_error)) => {
                    self.queue.remove_later(key, owner);
                    if let Some(e) = session_error {
                        let _ = session.recover(&e).await;
                    }
                    Err(err)
                }
            };
        };
        let client = session.client();
        let mut deleted = session
            .within(Some(key), what, client.delete(&node, None))
            .await;
        if let Ok(Err(e @ (ZkError::SessionExpired | ZkError::ClientClosed))) = &deleted
            && session.recover(e).await
        {
            // The session in place now may be the same one resumed, with the node still there.
            let client = session.client();
            deleted = session
                .within(Some(key), what, client.delete(&node, None))
                .await;
        }
        let unanswered = match deleted {
            Ok(Ok(())) => {
                self.queue.contenders().remove(owner);
                return Ok(Released::Freed);
            }
            // Gone already (its session expired, or it was deleted from outside).
            Ok(Err(ZkError::NoNode)) => {
                self.queue.contenders().remove(owner);
                return Ok(Released::NotOwner);
            }
            Ok(Err(e)) if answered(&e) => return Err(zk_error(Some(key), what, e)),
            Ok(Err(e)) => zk_error(Some(key), what, e),
            Err(e) => e,
        };
        // No answer: the node may still be there, on a session that lives on (or that a
        // restarted server restored). Removed in the background until the server answers.
        self.queue.contenders().remove(owner);
        self.queue.remove_later(key, owner);
        Err(unanswered)
    }

    async fn release_after(
        &self,
        key: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<Released, LockError> {
        // Nodes are ephemeral, with no TTL: the node stays, and a task of this runtime deletes
        // it when the hold ends (retried until the server answers). Should the process exit
        // (or its session expire) before that, the server deletes it with the session: the
        // key frees early then.
        let Some(node) = self.queue.contenders().get(owner).map(|p| p.node.clone()) else {
            // No record (a release from a new connection): a node of this owner, if any, goes
            // when the hold ends.
            self.queue.remove_after(key, owner, hold);
            return Ok(Released::Kept);
        };
        let client = self.session.client();
        let found = self
            .session
            .within(Some(key), "release failed", client.check_stat(&node))
            .await;
        match found {
            Ok(Ok(Some(_))) => {
                self.queue.contenders().remove(owner);
                self.queue.remove_after(key, owner, hold);
                Ok(Released::Kept)
            }
            Ok(Ok(None)) => {
                self.queue.contenders().remove(owner);
                Ok(Released::NotOwner)
            }
            Ok(Err(e)) => {
                self.queue.contenders().remove(owner);
                self.queue.remove_after(key, owner, hold);
                Err(self.session.failed(Some(key), "release failed", e).await)
            }
            Err(e) => {
                self.queue.contenders().remove(owner);
                self.queue.remove_after(key, owner, hold);
                Err(e)
            }
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let client = self.session.client();
        let parent = self.queue.parent(key);
        let listed = self
            .session
            .within(
                Some(key),
                "force unlock failed",
                client.list_children(&parent),
            )
            .await?;
        let children = match listed {
            Ok(children) => children,
            Err(ZkError::NoNode) => return Ok(false),
            Err(e) => {
                return Err(self
                    .session
                    .failed(Some(key), "force unlock failed", e)
                    .await);
            }
        };
        // Only the holders are removed (the first node, or every reader or permit holding
        // now); waiters keep their places.
        let mut removed = false;
        for (node, _) in inspect::holding_nodes(&children) {
            let node = format!("{parent}/{node}");
            removed |= self
                .session
                .bounded(Some(key), "force unlock failed", client.delete(&node, None))
                .await
                .is_ok();
        }
        Ok(removed)
    }

    async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        let client = self.session.client();
        let parent = self.queue.parent(key);
        match self
            .session
            .within(Some(key), "lookup failed", client.list_children(&parent))
            .await?
        {
            Ok(children) => Ok(children.iter().any(|c| sequence(c).is_some())),
            Err(ZkError::NoNode) => Ok(false),
            Err(e) => Err(self.session.failed(Some(key), "lookup failed", e).await),
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        inspect::holder(&self.session, &self.queue.root, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        inspect::holders(&self.session, &self.queue.root, prefix).await
    }

    fn lease_margin(&self, lease: Duration) -> Result<Duration, LockError> {
        // The negotiated session timeout bounds the hold, whatever the lease: the runtime
        // counts on `lease - margin` = at most that after its last confirmed call.
        Ok(lease.saturating_sub(self.session.negotiated()))
    }
}
