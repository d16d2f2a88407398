//! ZooKeeper (`zk://h1:2181,h2:2181/chroot`): a consensus store (Zab, CP).
//!
//! The standard recipe: each contender creates an ephemeral sequential node
//! `/dlock/<escaped key>/lock-<sequence>` (under container parents, which the server removes
//! once empty); the holder is the lowest sequence; each waiter watches only its predecessor
//! (no herd). The node lives as long as the runtime's ZooKeeper session, so the **session
//! timeout** is the bound after which a dead holder's lock is freed, not the per-lock lease.
//! That is the timeout the server *granted* (negotiated), not the one asked for (runtime option
//! `session_timeout`, default 10 s): the server clamps requests to its `minSessionTimeout` ..
//! `maxSessionTimeout` (by default 2 to 20 ticks). The runtime never counts on more than the
//! negotiated timeout after the send time of its last confirmed call, whatever the lease: the
//! server expires a silent session no earlier than that, so a holder cut off from the server
//! (or frozen) counts its lock lost no later than the server can expire it. The fencing token
//! is the node's creation zxid (`czxid`), strictly increasing across holders.
//!
//! **Hand-over within the runtime**: when an exclusive holder releases and the waiter watching
//! its node (right behind the head) is of this runtime, that waiter is told before the delete
//! is sent and holds at once, without waiting for the delete or its event (`../successor.rs`):
//! the holder's body has ended, the only node ahead of the waiter's is ours and is being
//! deleted, and to every other process the head of the queue is ours throughout, so the queue
//! stays FIFO across processes. Its fence is its own node's `czxid` as always. It takes the
//! hand-over only while its node's session is the one in place, connected, and confirmed by
//! an answer to a call sent within the last half of the negotiated timeout (else it waits for
//! the node's events, as without it); its validity counts from that call's send time, before
//! which the server cannot have expired the session. A holder frozen past its session timeout
//! thus hands nothing to a waiter of its process whose node went with the session.
//!
//! Renewal checks that the session is connected and the node still exists as an ephemeral node
//! of the session in place (not one of a session the client replaced); a session that
//! expired (or a node deleted from outside) is a loss. When the client gives up on its session
//! (the server was unreachable for longer than the client waits, 1.4 × the session timeout),
//! one task recovers for all: it first resumes that session, since a server that restarted
//! restores its sessions from its log and would otherwise keep their nodes — locks and queue
//! places nobody tracks any more — until it expires them; only a session the server no longer
//! knows is replaced by a new one. A resumed session keeps the timeout asked for.
//!
//! A node of a live session never goes by itself, whatever the lease: a release, or a waiter
//! leaving the queue, whose delete got no answer (the connection broke, the server restarted,
//! no reply in time) would leave the node in line ahead of everyone for as long as this process
//! keeps its session. Such a node is removed in the background, retried until the server
//! answers, for as long as the runtime lives.

pub(crate) mod config;
mod inspect;
mod path;
mod shared;

pub(crate) use path::escape as path_segment;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, EventType, SessionState};

use self::path::{escape, sequence};
use super::io_thread::IoThread;
use super::mode::Mode;
use super::successor::Successors;
use super::{Attempt, Backend, Context, EngineResult, Queued, Queueing, Released, Renewal};
use crate::error::LockError;
use crate::inspect::LockInfo;

pub(crate) struct ZooKeeperBackend {
    session: Arc<Session>,
    root: String,
    /// Owner token -> its place in a queue.
    contenders: Mutex<HashMap<String, Place>>,
    /// This runtime's waiters by the node they watch, for hand-overs within the process.
    successors: Successors,
}

/// A contender's place in the queue of its key.
#[derive(Debug, Clone)]
struct Place {
    /// Its node's full path.
    node: String,
    /// An exclusive contender that acquired (its node heads the queue) and has not yet
    /// handed its key to the waiter of this runtime behind it (see [`Successors`]).
    holding: bool,
}

/// The ZooKeeper session the runtime goes on with, shared with the background removals of
/// nodes whose delete got no answer.
struct Session {
    client: RwLock<Client>,
    /// Where the client's session tasks run; they stop when the session drops.
    io: IoThread,
    connect: String,
    /// The session timeout asked for (when a session opens, and when one is resumed).
    requested: Duration,
    /// The session timeout the server granted to the current session, in nanoseconds: what
    /// the runtime counts on (see the module docs).
    negotiated: AtomicU64,
    /// Reference point of `confirmed`.
    base: Instant,
    /// Send time of the latest call the server answered, as nanoseconds after `base`: the
    /// server expires the session no earlier than that plus the negotiated timeout.
    confirmed: AtomicU64,
    timeout: Duration,
    /// Held by the one task recovering a session, so that concurrent failures open one.
    recovering: tokio::sync::Mutex<()>,
    /// Owner tokens whose nodes are being removed in the background (one removal each).
    removing: Mutex<HashSet<String>>,
}

/// First pause of a background removal; it doubles up to [`REMOVAL_PAUSE_MAX`].
const REMOVAL_PAUSE_FIRST: Duration = Duration::from_millis(100);

/// Longest pause between two attempts of a background removal.
const REMOVAL_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A duration in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn zk_error(key: Option<&str>, what: &str, err: ZkError) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

/// Whether `err` is the server's answer about a node (it does not exist, may not be touched,
/// ...), rather than a request that got none: a broken connection, a session the client gave
/// up on, a closed client.
fn answered(err: &ZkError) -> bool {
    matches!(
        err,
        ZkError::NoNode
            | ZkError::NoAuth
            | ZkError::BadVersion
            | ZkError::NotEmpty
            | ZkError::NodeExists
            | ZkError::InvalidAcl
            | ZkError::NoChildrenForEphemerals
            | ZkError::BadArguments(_)
    )
}

/// The start of the names of `owner`'s queue nodes: the owner token is in the name, so a
/// node can be found without knowing its sequence number.
fn marker(owner: &str) -> String {
    format!("lock-{owner}-")
}

impl Session {
    async fn new_session(
        io: &IoThread,
        connect: &str,
        session_timeout: Duration,
        timeout: Duration,
    ) -> Result<Client, LockError> {
        let connector = Client::connector().with_session_timeout(session_timeout);
        Self::open(io, connect, connector, timeout).await
    }

    /// Connects with `connector` within `timeout`, the client's session task on `io`.
    async fn open(
        io: &IoThread,
        connect: &str,
        connector: zookeeper_client::Connector,
        timeout: Duration,
    ) -> Result<Client, LockError> {
        let connector = connector
            .with_connection_timeout(timeout)
            .with_fail_eagerly();
        let cluster = connect.to_owned();
        let connecting = io.run(async move { connector.connect(&cluster).await });
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Err(stopped)) => Err(stopped),
            Ok(Ok(Ok(client))) => {
                let negotiated = client.session_timeout();
                tracing::debug!(
                    ?negotiated,
                    "ZooKeeper session established; the server granted this session timeout"
                );
                Ok(client)
            }
            Ok(Ok(Err(e @ ZkError::BadArguments(_)))) => Err(LockError::config(format!(
                "bad ZooKeeper connect string `{connect}`: {e}"
            ))),
            Ok(Ok(Err(e))) => Err(zk_error(
                None,
                &format!("cannot connect to ZooKeeper {connect}"),
                e,
            )),
            Err(_) => Err(LockError::backend(
                None,
                format!("cannot connect to ZooKeeper {connect} within {timeout:?}"),
                None,
            )),
        }
    }

    /// The session timeout the server granted (the current session's).
    fn negotiated(&self) -> Duration {
        Duration::from_nanos(self.negotiated.load(Ordering::Acquire))
    }

    /// Records that the server answered a call sent at `sent_at`.
    fn confirm(&self, sent_at: Instant) {
        let after = nanos(sent_at.saturating_duration_since(self.base));
        self.confirmed.fetch_max(after, Ordering::AcqRel);
    }

    /// When the latest call the server answered was sent.
    fn confirmed(&self) -> Instant {
        self.base + Duration::from_nanos(self.confirmed.load(Ordering::Acquire))
    }

    fn client(&self) -> Client {
        self.client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After the client's session ended (expired, or the client gave up on it), the session
    /// the runtime goes on with: the same one resumed if the server still keeps it, else a new
    /// one (every ephemeral node of the old one is then gone, and their holders learn it at
    /// their next renewal). One task does this for all; the others find it done. `true` when
    /// a live session is in place afterwards.
    async fn recover(&self, err: &ZkError) -> bool {
        if !matches!(err, ZkError::SessionExpired | ZkError::ClientClosed) {
            return false;
        }
        let _only_one = self.recovering.lock().await;
        let old = self.client();
        if !matches!(old.state(), SessionState::Expired | SessionState::Closed) {
            // Recovered by another task meanwhile (or the error came from an older client).
            return true;
        }
        // A server that was down for longer than the client waited restores the session from
        // its log when it starts, with its nodes: resume it rather than leave them to the
        // server's expiry (the client's "expired" was its own verdict, not the server's). With
        // the timeout asked for: a resume asks for one too, and the server applies it to the
        // session from then on.
        let resume = Client::connector()
            .with_session(old.session().clone())
            .with_session_timeout(self.requested);
        let (client, resumed) = match Self::open(&self.io, &self.connect, resume, self.timeout)
            .await
        {
            Ok(client) => (client, true),
            Err(_) => {
                match Self::new_session(&self.io, &self.connect, self.requested, self.timeout).await
                {
                    Ok(client) => (client, false),
                    Err(_) => return false,
                }
            }
        };
        // Before the client is published: a lock taken on the new session is counted with
        // the new session's timeout (a server restarted with other limits may grant another).
        self.negotiated
            .store(nanos(client.session_timeout()), Ordering::Release);
        // Answers on the session replaced say nothing of this one.
        self.confirmed.store(0, Ordering::Release);
        *self.client.write().unwrap_or_else(PoisonError::into_inner) = client;
        if resumed {
            tracing::warn!(
                "ZooKeeper session lost by the client, still kept by the server: resumed it"
            );
        } else {
            tracing::warn!("ZooKeeper session expired: reconnected with a new session");
        }
        true
    }

    /// `fut` bounded by the timeout: only a missing answer is an error here (`Backend`); the
    /// engine's own answer is the caller's to read (e.g. `NoNode`).
    async fn within<T>(
        &self,
        key: Option<&str>,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, ZkError>>,
    ) -> Result<Result<T, ZkError>, LockError> {
        let sent_at = Instant::now();
        let answer = tokio::time::timeout(self.timeout, fut).await.map_err(|_| {
            LockError::backend(
                key,
                format!("{what}: no reply within {:?}", self.timeout),
                None,
            )
        })?;
        if answer.as_ref().map_or_else(answered, |_| true) {
            self.confirm(sent_at);
        }
        Ok(answer)
    }

    /// An engine error as `Backend`, opening a new session first if the old one expired.
    async fn failed(&self, key: Option<&str>, what: &str, err: ZkError) -> LockError {
        let _ = self.recover(&err).await;
        zk_error(key, what, err)
    }

    /// `fut` bounded by the timeout, every error as `Backend`.
    async fn bounded<T>(
        &self,
        key: Option<&str>,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, ZkError>>,
    ) -> Result<T, LockError> {
        match self.within(key, what, fut).await? {
            Ok(v) => Ok(v),
            Err(e) => Err(self.failed(key, what, e).await),
        }
    }

    /// Deletes the nodes in the queue `parent` whose names start with `marker` (one owner's):
    /// `Ok(true)` when one was deleted, `Ok(false)` when the server had none, `Err` when an
    /// answer is missing (a node may still be there), with the session error if there was one.
    async fn delete_marked(
        &self,
        key: &str,
        parent: &str,
        marker: &str,
    ) -> Result<bool, (LockError, Option<ZkError>)> {
        let client = self.client();
        let what = "release failed";
        let children = match self
            .within(Some(key), what, client.list_children(parent))
            .await
        {
            Ok(Ok(children)) => children,
            // No parent: no node of anyone's.
            Ok(Err(ZkError::NoNode)) => return Ok(false),
            Ok(Err(e)) => return Err((zk_error(Some(key), what, e.clone()), Some(e))),
            Err(e) => return Err((e, None)),
        };
        let mut deleted = false;
        for name in children.iter().filter(|n| n.starts_with(marker)) {
            let node = format!("{parent}/{name}");
            match self
                .within(Some(key), what, client.delete(&node, None))
                .await
            {
                Ok(Ok(())) => deleted = true,
                Ok(Err(e)) if answered(&e) => {}
                Ok(Err(e)) => return Err((zk_error(Some(key), what, e.clone()), Some(e))),
                Err(e) => return Err((e, None)),
            }
        }
        Ok(deleted)
    }
}

impl ZooKeeperBackend {
    /// Connects to `connect` (`host:port,host:port[/chroot]`).
    pub(crate) async fn connect(
        connect: &str,
        session_timeout: Duration,
        ctx: &Context,
    ) -> Result<Self, LockError> {
        let (prefix, timeout) = (ctx.prefix.as_str(), ctx.timeout);
        // The client's session task lives on a thread of the backend's own (see
        // `io_thread.rs`): a holder blocking its thread must not hold it up.
        let io = IoThread::start("dlock-zookeeper")?;
        let client = Session::new_session(&io, connect, session_timeout, timeout).await?;
        let root = format!("/{}", escape(prefix.trim_end_matches(':')));
        let session = Session {
            negotiated: AtomicU64::new(nanos(client.session_timeout())),
            base: Instant::now(),
            confirmed: AtomicU64::new(0),
            client: RwLock::new(client),
            io,
            connect: connect.to_owned(),
            requested: session_timeout,
            timeout,
            recovering: tokio::sync::Mutex::new(()),
            removing: Mutex::default(),
        };
        Ok(Self {
            session: Arc::new(session),
            root,
            contenders: Mutex::default(),
            successors: Successors::default(),
        })
    }

    fn contenders(&self) -> MutexGuard<'_, HashMap<String, Place>> {
        // Map operations cannot be interrupted half-way: a poisoned lock is consistent.
        self.contenders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn parent(&self, key: &str) -> String {
        format!("{}/{}", self.root, escape(key))
    }

    /// Removes `owner`'s nodes in the queue of `key` in the background, after a delete that
    /// got no answer: retried, with pauses growing to a second, until the server answers, for
    /// as long as this runtime lives (then its session ends with it, or expires, and the nodes
    /// with the session). Left alone, a node of a live session would keep its place in line
    /// for as long as the process runs.
    fn remove_later(&self, key: &str, owner: &str) {
        self.remove_after(key, owner, REMOVAL_PAUSE_FIRST);
    }

    /// As [`remove_later`](Self::remove_later), first trying once `first` has passed (the end
    /// of a hold that keeps the key: ZooKeeper nodes have no TTL of their own).
    fn remove_after(&self, key: &str, owner: &str, first: Duration) {
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
    async fn queue(&self, key: &str, owner: &str, deadline: Instant) -> Result<Queued, LockError> {
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
            let attempt = self
                .wait_shared(
                    key,
                    owner,
                    (&parent, &my_node, my_seq),
                    fence,
                    deadline,
                    mode,
                )
                .await?;
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
    fn hand_over(&self, owner: &str) {
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
    async fn leave(&self, key: &str, owner: &str) {
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

impl Backend for ZooKeeperBackend {
    fn has_queue(&self) -> bool {
        // Waiting happens in ZooKeeper's own queue (`acquire_queued`), watching the
        // predecessor.
        true
    }

    async fn try_acquire(&self, key: &str, owner: &str, _lease: Duration) -> EngineResult<Attempt> {
        Ok(self.queue(key, owner, Instant::now()).await?.attempt)
    }

    async fn acquire_queued(
        &self,
        key: &str,
        owner: &str,
        ask: Queueing,
    ) -> Result<Queued, LockError> {
        // The session (pinged every third of its timeout) keeps the node alive.
        self.queue(key, owner, ask.deadline).await
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
            let Some(node) = self.contenders().get(&item.owner).map(|p| p.node.clone()) else {
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
        self.hand_over(owner);
        let Some(node) = self.contenders().get(owner).map(|p| p.node.clone()) else {
            // No record: a create may have landed after its acquire was cancelled. Its name
            // carries the owner token.
            return match session
                .delete_marked(key, &self.parent(key), &marker(owner))
                .await
            {
                Ok(true) => Ok(Released::Freed),
                Ok(false) => Ok(Released::NotOwner),
                Err((err, session_error)) => {
                    self.remove_later(key, owner);
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
                self.contenders().remove(owner);
                return Ok(Released::Freed);
            }
            // Gone already (its session expired, or it was deleted from outside).
            Ok(Err(ZkError::NoNode)) => {
                self.contenders().remove(owner);
                return Ok(Released::NotOwner);
            }
            Ok(Err(e)) if answered(&e) => return Err(zk_error(Some(key), what, e)),
            Ok(Err(e)) => zk_error(Some(key), what, e),
            Err(e) => e,
        };
        // No answer: the node may still be there, on a session that lives on (or that a
        // restarted server restored). Removed in the background until the server answers.
        self.contenders().remove(owner);
        self.remove_later(key, owner);
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
        let Some(node) = self.contenders().get(owner).map(|p| p.node.clone()) else {
            // No record (a release from a new connection): a node of this owner, if any, goes
            // when the hold ends.
            self.remove_after(key, owner, hold);
            return Ok(Released::Kept);
        };
        let client = self.session.client();
        let found = self
            .session
            .within(Some(key), "release failed", client.check_stat(&node))
            .await;
        match found {
            Ok(Ok(Some(_))) => {
                self.contenders().remove(owner);
                self.remove_after(key, owner, hold);
                Ok(Released::Kept)
            }
            Ok(Ok(None)) => {
                self.contenders().remove(owner);
                Ok(Released::NotOwner)
            }
            Ok(Err(e)) => {
                self.contenders().remove(owner);
                self.remove_after(key, owner, hold);
                Err(self.session.failed(Some(key), "release failed", e).await)
            }
            Err(e) => {
                self.contenders().remove(owner);
                self.remove_after(key, owner, hold);
                Err(e)
            }
        }
    }

    async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let client = self.session.client();
        let parent = self.parent(key);
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
        let parent = self.parent(key);
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
        self.holder(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>, LockError> {
        self.holders(prefix).await
    }

    fn lease_margin(&self, lease: Duration) -> Result<Duration, LockError> {
        // The negotiated session timeout bounds the hold, whatever the lease: the runtime
        // counts on `lease - margin` = at most that after its last confirmed call.
        Ok(lease.saturating_sub(self.session.negotiated()))
    }

    fn renew_batch_limit(&self) -> usize {
        64
    }
}
