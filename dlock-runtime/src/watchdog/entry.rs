//! One tracked lock: when it is due for renewal, until when it is valid, and its lost signal.

use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::LostSignal;

#[derive(Debug)]
pub(super) struct Entry {
    /// The owner token then the key, in one allocation (see [`Entry::key`], [`Entry::owner`]).
    pub(super) owner_key: String,
    pub(super) owner_len: usize,
    pub(super) lease: Duration,
    /// Part of the lease not counted on (engine clock drift).
    pub(super) drift: Duration,
    pub(super) renew: bool,
    pub(super) due: Instant,
    pub(super) valid_until: Instant,
    pub(super) in_flight: bool,
    pub(super) lost: Arc<LostSignal>,
}

impl Entry {
    pub(super) fn key(&self) -> &str {
        self.owner_key.get(self.owner_len..).unwrap_or_default()
    }

    pub(super) fn owner(&self) -> &str {
        self.owner_key.get(..self.owner_len).unwrap_or_default()
    }

    /// The part of the lease counted on (renewals come every third of it).
    pub(super) fn effective(&self) -> Duration {
        self.lease.saturating_sub(self.drift)
    }

    /// When the scheduler must look at this entry next.
    pub(super) fn next_look(&self) -> Instant {
        if self.renew && !self.in_flight {
            self.due.min(self.valid_until)
        } else {
            self.valid_until
        }
    }
}

/// Hashes the scheduler's own entry ids (consecutive numbers, never chosen by a caller):
/// one multiplication instead of SipHash's rounds.
#[derive(Debug, Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive ids over the high bits the table reads.
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}
