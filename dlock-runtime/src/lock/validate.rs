//! The checks every acquisition makes before any I/O: key, lease, `hold_at_least`, mode and
//! fairness against the engine, and which re-entries a call chain may make.

use std::time::Duration;

use super::builder::LockBuilder;
use crate::backend::mode::{self, Mode};
use crate::backend::{Backend, Fairness};
use crate::core::{Core, validate_lease};
use crate::error::LockError;

impl LockBuilder {
    /// The lease, after the checks of key, lease and `hold_at_least` every acquisition makes
    /// before any I/O.
    pub(crate) fn checked_lease(&self, core: &Core) -> Result<Duration, LockError> {
        validate_key(&self.key)?;
        let lease = self.lease.unwrap_or(core.default_lease);
        validate_lease(lease, format_args!("lease of lock `{}`", self.key))?;
        core.backend.lease_margin(lease)?;
        validate_hold(self.hold_at_least, lease, &self.key)?;
        validate_mode(self.mode, self.hold_at_least, &self.key)?;
        if self.mode.is_shared() && !core.caps.shared_modes {
            return Err(LockError::config(format!(
                "`{}`: {}:// has no {} locks: a quorum of independent nodes cannot agree on a \
                 set of holders without fencing; use redis://, redis+cluster://, etcd:// or \
                 zk:// for read-write locks and semaphores",
                self.key,
                core.engine,
                if self.mode == Mode::Read {
                    "read"
                } else {
                    "semaphore"
                }
            )));
        }
        if self.fair && self.mode.is_shared() {
            return Err(LockError::config(format!(
                "fair applies to exclusive locks: lock `{}` is a read lock or a semaphore \
                 permit (use fair(false))",
                self.key
            )));
        }
        if self.fair && core.caps.fairness == Fairness::Unsupported {
            return Err(LockError::config(format!(
                "fair locks are not available on {}: its independent masters keep no common \
                 line of waiters (lock `{}`); use fair(false), or Redis, etcd or ZooKeeper",
                core.engine, self.key
            )));
        }
        Ok(lease)
    }
}

/// Checks a key before any I/O.
pub(crate) fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::config("lock key is empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(LockError::config(format!(
            "lock key of {} bytes is longer than the maximum of {MAX_KEY_LEN} bytes",
            key.len()
        )));
    }
    Ok(())
}

/// `hold_at_least` must not outlast the lease, the "at most" of a scheduled job.
fn validate_hold(hold: Duration, lease: Duration, key: &str) -> Result<(), LockError> {
    if hold > lease {
        return Err(LockError::config(format!(
            "hold_at_least of {hold:?} is longer than the lease of {lease:?} of lock `{key}`: \
             the lease is the longest the key stays taken"
        )));
    }
    Ok(())
}

/// A read lock or a semaphore permit: a positive number of permits, no `hold_at_least`.
fn validate_mode(mode: Mode, hold: Duration, key: &str) -> Result<(), LockError> {
    if mode == Mode::Permits(0) {
        return Err(LockError::config(format!(
            "semaphore `{key}` with 0 permits: nobody could ever hold it; ask for at least 1"
        )));
    }
    if mode.is_shared() && !hold.is_zero() {
        return Err(LockError::config(format!(
            "hold_at_least is for exclusive locks; `{key}` is asked as a {} lock",
            mode.name()
        )));
    }
    Ok(())
}

/// Whether a call chain holding `key` in `held` may re-enter it asking for `asked`: a read
/// inside a write or a read, a write inside a write, a permit inside a permit of the same
/// semaphore. A write inside a read would wait for itself: refused.
pub(super) fn check_reentry(held: Mode, asked: Mode, key: &str) -> Result<(), LockError> {
    match (held, asked) {
        (Mode::Exclusive, Mode::Exclusive | Mode::Read) | (Mode::Read, Mode::Read) => Ok(()),
        (Mode::Permits(a), Mode::Permits(b)) if a == b => Ok(()),
        (Mode::Permits(held), Mode::Permits(asked)) => {
            Err(mode::permits_mismatch(key, asked, held))
        }
        (Mode::Read, Mode::Exclusive) => Err(LockError::config(format!(
            "cannot upgrade a read lock to a write lock: this call chain holds `{key}` for \
             reading; take the write lock first (a read inside a write re-enters it)"
        ))),
        (held, asked) => Err(LockError::config(format!(
            "this call chain holds `{key}` as a {} lock and asks for it as a {} lock",
            held.name(),
            asked.name()
        ))),
    }
}

/// The longest key a lock accepts, in bytes (UTF-8). Longer keys are
/// [`LockError::InvalidConfig`] before any request is sent: every engine stores the key (with
/// the runtime's prefix) in its own names, and a name this long is almost always a bug (a
/// whole request body interpolated into the key).
pub const MAX_KEY_LEN: usize = 1024;
