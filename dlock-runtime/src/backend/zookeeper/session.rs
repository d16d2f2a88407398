//! The ZooKeeper session the runtime goes on with: every call bounded by the timeout, the
//! send time of the latest answered call (the server expires the session no earlier than that
//! plus the negotiated timeout), and one recovery for all callers when the client gives up on
//! the session (the same session resumed if the server keeps it, else a new one).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, Error as ZkError, SessionState};

use crate::backend::io_thread::IoThread;
use crate::backend::url::redact;
use crate::error::LockError;

/// The ZooKeeper session the runtime goes on with, shared with the background removals of
/// nodes whose delete got no answer.
pub(super) struct Session {
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
    pub(super) timeout: Duration,
    /// Held by the one task recovering a session, so that concurrent failures open one.
    recovering: tokio::sync::Mutex<()>,
    /// Owner tokens whose nodes are being removed in the background (one removal each).
    pub(super) removing: Mutex<HashSet<String>>,
}

/// A duration in nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(super) fn zk_error(key: Option<&str>, what: &str, err: ZkError) -> LockError {
    LockError::backend(key, what, Some(Arc::new(err)))
}

/// Whether `err` is the server's answer about a node (it does not exist, may not be touched,
/// ...), rather than a request that got none: a broken connection, a session the client gave
/// up on, a closed client.
pub(super) fn answered(err: &ZkError) -> bool {
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

impl Session {
    /// Opens a session with `connect` (`host:port,host:port[/chroot]`), the client's session
    /// task on a thread of the backend's own (see `io_thread.rs`: a holder blocking its
    /// thread must not hold it up).
    pub(super) async fn start(
        connect: &str,
        session_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        let io = IoThread::start("dlock-zookeeper")?;
        let client = Self::new_session(&io, connect, session_timeout, timeout).await?;
        Ok(Self {
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
        })
    }

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
        // Messages show the connect string with its credentials hidden.
        let shown = redact(connect);
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
                "bad ZooKeeper connect string `{shown}`: {e}"
            ))),
            Ok(Ok(Err(e))) => Err(zk_error(
                None,
                &format!("cannot connect to ZooKeeper {shown}"),
                e,
            )),
            Err(_) => Err(LockError::backend(
                None,
                format!("cannot connect to ZooKeeper {shown} within {timeout:?}"),
                None,
            )),
        }
    }

    /// The session timeout the server granted (the current session's).
    pub(super) fn negotiated(&self) -> Duration {
        Duration::from_nanos(self.negotiated.load(Ordering::Acquire))
    }

    /// Records that the server answered a call sent at `sent_at`.
    fn confirm(&self, sent_at: Instant) {
        let after = nanos(sent_at.saturating_duration_since(self.base));
        self.confirmed.fetch_max(after, Ordering::AcqRel);
    }

    /// When the latest call the server answered was sent.
    pub(super) fn confirmed(&self) -> Instant {
        self.base + Duration::from_nanos(self.confirmed.load(Ordering::Acquire))
    }

    pub(super) fn client(&self) -> Client {
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
    pub(super) async fn recover(&self, err: &ZkError) -> bool {
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
    pub(super) async fn within<T>(
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
    pub(super) async fn failed(&self, key: Option<&str>, what: &str, err: ZkError) -> LockError {
        let _ = self.recover(&err).await;
        zk_error(key, what, err)
    }

    /// `fut` bounded by the timeout, every error as `Backend`.
    pub(super) async fn bounded<T>(
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
    pub(super) async fn delete_marked(
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// The credentials of a connect string never reach the message of a failed connection.
    #[tokio::test]
    async fn a_failed_connection_does_not_show_the_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let err = crate::runtime::Runtime::builder()
            .zookeeper(format!("u:s3cret@127.0.0.1:{port}"))
            .timeout(Duration::from_millis(500))
            .build()
            .await
            .map(drop)
            .expect_err("nothing listens there");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("127.0.0.1"), "{shown}");
    }
}
