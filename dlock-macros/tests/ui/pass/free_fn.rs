// Free functions with both placeholder forms, a constant key, escapes and durations.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{id}", lease = "30s", wait = "1s")]
async fn buy(id: u64, qty: u32) -> Result<u64, LockError> {
    Ok(id * u64::from(qty))
}

#[distributed_lock(key = "stock:<id>", lease = "250ms", wait = "0s")]
pub async fn buy_angle(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "jobs:nightly", lease = "2m")]
pub(crate) async fn constant_key() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "{{literal}}:<<{id}>>:<name>", lease = "1h")]
async fn escapes(id: u64, name: &str) -> Result<String, LockError> {
    Ok(format!("{id}{name}"))
}

// Parameters used only by the key, and string slices borrowed by the key and the body.
#[distributed_lock(key = "{tenant}/{resource}")]
async fn borrowed(tenant: &str, resource: String) -> Result<usize, LockError> {
    Ok(resource.len())
}

/// Doc comments and other attributes stay on the function.
#[distributed_lock(key = "k:{n}")]
#[inline]
#[must_use = "the result says whether the lock was taken"]
async fn attributes_kept(mut n: u32) -> Result<u32, LockError> {
    #![allow(unused_mut)]
    n += 1;
    Ok(n)
}

fn main() {}
