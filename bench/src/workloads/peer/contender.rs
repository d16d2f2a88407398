//! The two contenders of the `peer` section behind one face: dlock and rslock, each on its own
//! connection to the same server, with the same 10 s lease.

use std::time::Duration;

use dlock_runtime::{LockGuard, Runtime};

use super::rslock::Rslock;
use crate::BoxError;

/// The lease both contenders write.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// How long a dlock waiter waits before one acquisition gives up: longer than any run.
const DLOCK_WAIT: Duration = Duration::from_secs(60);

/// Which library takes the locks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Dlock,
    Rslock,
}

impl Kind {
    /// Both, in the order the table names them.
    pub(crate) const BOTH: [Kind; 2] = [Kind::Dlock, Kind::Rslock];

    /// The name on the command line of a worker process and in the table.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Dlock => "dlock",
            Kind::Rslock => "rslock",
        }
    }

    /// The kind called `name`.
    pub(crate) fn from_name(name: &str) -> Result<Kind, BoxError> {
        Kind::BOTH
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| format!("unknown contender `{name}`").into())
    }
}

/// A connected contender. Clones share the connection.
#[derive(Clone)]
pub(crate) enum Contender {
    Dlock(Runtime),
    Rslock(Rslock),
}

/// A lock one contender holds.
pub(crate) enum Held {
    Dlock(LockGuard),
    Rslock(rslock::Lock),
}

impl Contender {
    /// `kind` on the server at `url`, its keys (dlock's) under `prefix`.
    pub(crate) async fn connect(
        kind: Kind,
        url: &str,
        prefix: &str,
    ) -> Result<Contender, BoxError> {
        Ok(match kind {
            Kind::Dlock => Contender::Dlock(
                Runtime::builder()
                    .redis(url)
                    .key_prefix(prefix)
                    .default_lease(LEASE)
                    .default_wait(DLOCK_WAIT)
                    .build()
                    .await?,
            ),
            Kind::Rslock => Contender::Rslock(Rslock::new(url, LEASE)?),
        })
    }

    /// Which library this is.
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Contender::Dlock(_) => Kind::Dlock,
            Contender::Rslock(_) => Kind::Rslock,
        }
    }

    /// One wait for `key` as the library waits: dlock up to a minute, rslock one `lock()`
    /// call with its retry budget. `None` when that wait ended without the lock.
    pub(crate) async fn acquire(&self, key: &str) -> Result<Option<Held>, BoxError> {
        match self {
            Contender::Dlock(rt) => match rt.lock(key).acquire().await {
                Ok(guard) => Ok(Some(Held::Dlock(guard))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.into()),
            },
            Contender::Rslock(rslock) => Ok(rslock.lock(key).await?.map(Held::Rslock)),
        }
    }

    /// Releases `held`, which this contender acquired.
    pub(crate) async fn release(&self, held: Held) -> Result<(), BoxError> {
        match (self, held) {
            (_, Held::Dlock(guard)) => guard.release().await?,
            (Contender::Rslock(rslock), Held::Rslock(lock)) => rslock.unlock(lock).await,
            (Contender::Dlock(_), Held::Rslock(_)) => {
                return Err("an rslock lock handed to dlock".into());
            }
        }
        Ok(())
    }

    /// One uncontended acquire + release of `key`.
    pub(crate) async fn pair(&self, key: &str) -> Result<(), BoxError> {
        let held = self
            .acquire(key)
            .await?
            .ok_or_else(|| format!("{}: uncontended key {key} was taken", self.kind().name()))?;
        self.release(held).await
    }
}
