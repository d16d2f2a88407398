//! The one error type of the crate.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Why a lock could not be acquired, kept, or released.
///
/// Messages are lowercase and name the key where there is one. Engine errors keep their
/// cause in [`source()`](std::error::Error::source).
///
/// ```
/// use dlock_runtime::LockError;
/// use std::time::Duration;
/// let err = LockError::Timeout {
///     key: "stock:42".into(),
///     waited: Duration::from_secs(1),
///     holder_ttl: Some(Duration::from_secs(3)),
/// };
/// assert_eq!(err.holder_ttl(), Some(Duration::from_secs(3)));
/// assert!(err.is_timeout());
/// assert_eq!(err.to_string(), "lock `stock:42` not acquired within 1s");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was busy and was not acquired within the `wait` budget.
    Timeout {
        /// The user's key (without the runtime's prefix).
        key: String,
        /// How long the caller waited.
        waited: Duration,
        /// What the holder had left of its lease when the acquisition gave up, as the
        /// engine's last busy answer said (counted down to the moment the error was made);
        /// `None` when unknown. See [`LockError::holder_ttl`].
        holder_ttl: Option<Duration>,
    },
    /// The lease was lost while held: the engine says another owner (or nobody) holds the key,
    /// or the lease ran out without a confirmed renewal.
    Lost {
        /// The user's key.
        key: String,
    },
    /// The engine was unreachable, timed out, or answered with an error.
    Backend(BackendError),
    /// No runtime is installed and none is in scope.
    NotInstalled,
    /// [`Runtime::install`](crate::Runtime::install) was called a second time.
    AlreadyInstalled,
    /// A URL, builder option or lock option is invalid; the message names the problem.
    InvalidConfig(String),
}

impl LockError {
    /// `true` for [`LockError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }

    /// `true` for [`LockError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// `true` for [`LockError::Backend`].
    pub fn is_backend(&self) -> bool {
        matches!(self, Self::Backend(_))
    }

    /// `true` for [`LockError::InvalidConfig`].
    pub fn is_invalid_config(&self) -> bool {
        matches!(self, Self::InvalidConfig(_))
    }

    /// For [`LockError::Timeout`]: the holder's remaining lease when the acquisition gave up
    /// (captured as the error was made, from the engine's last busy answer). What
    /// `Retry-After` is made of (feature `axum`). `None` when unknown: an engine that does not
    /// say (etcd and ZooKeeper queues), a key held by the caller's own call chain, or a lease
    /// already over.
    pub fn holder_ttl(&self) -> Option<Duration> {
        match self {
            Self::Timeout { holder_ttl, .. } => *holder_ttl,
            _ => None,
        }
    }

    /// The key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Timeout { key, .. } | Self::Lost { key } => Some(key),
            Self::Backend(err) => err.key(),
            _ => None,
        }
    }

    pub(crate) fn backend(
        key: Option<&str>,
        message: impl Into<String>,
        source: Option<Arc<dyn StdError + Send + Sync>>,
    ) -> Self {
        Self::Backend(BackendError {
            key: key.map(str::to_owned),
            message: message.into(),
            source,
        })
    }

    /// An engine error about no key in particular, attributed to `key`.
    #[cfg(feature = "etcd")]
    pub(crate) fn for_key(self, key: &str) -> Self {
        match self {
            Self::Backend(mut err) if err.key.is_none() => {
                err.key = Some(key.to_owned());
                Self::Backend(err)
            }
            other => other,
        }
    }

    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::InvalidConfig(message.into())
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout { key, waited, .. } => {
                write!(f, "lock `{key}` not acquired within {waited:?}")
            }
            Self::Lost { key } => write!(f, "lease of lock `{key}` was lost while held"),
            Self::Backend(err) => err.fmt(f),
            Self::NotInstalled => f.write_str(
                "no lock runtime installed: call `Runtime::install` at startup or run inside `Runtime::scope`",
            ),
            Self::AlreadyInstalled => f.write_str("a lock runtime is already installed"),
            Self::InvalidConfig(msg) => write!(f, "invalid lock configuration: {msg}"),
        }
    }
}

impl StdError for LockError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Backend(err) => err.source(),
            _ => None,
        }
    }
}

/// An engine error: unreachable, timed out, or an error reply.
#[derive(Debug, Clone)]
pub struct BackendError {
    key: Option<String>,
    message: String,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl BackendError {
    /// The key of the operation that failed, if it concerned one.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// What went wrong, without the key.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "lock backend error on `{key}`: {}", self.message)?,
            None => write!(f, "lock backend error: {}", self.message)?,
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_and_name_the_key() {
        let lost = LockError::Lost { key: "k1".into() };
        assert_eq!(lost.to_string(), "lease of lock `k1` was lost while held");
        assert_eq!(lost.key(), Some("k1"));
        let io = std::io::Error::other("connection refused");
        let err = LockError::backend(Some("k2"), "acquire failed", Some(Arc::new(io)));
        assert_eq!(
            err.to_string(),
            "lock backend error on `k2`: acquire failed: connection refused"
        );
        assert!(err.source().is_some());
        assert!(err.is_backend());
        for e in [
            &lost,
            &err,
            &LockError::NotInstalled,
            &LockError::AlreadyInstalled,
        ] {
            let first = e.to_string().chars().next().unwrap_or('x');
            assert!(first.is_lowercase(), "{e}");
        }
    }
}
