// `watchdog`, `on_lost`, `hold_at_least` and `crate` with a renamed runtime crate.
#![deny(warnings)]
#![allow(dead_code)]

extern crate dlock_runtime as dl;

use dl::LockError;

#[dl::distributed_lock(key = "tick", lease = "10s", watchdog = false)]
async fn tick() -> Result<(), LockError> {
    Ok(())
}

#[dl::distributed_lock(key = "tick", watchdog = true)]
async fn tick_with_watchdog() -> Result<(), LockError> {
    Ok(())
}

#[dl::distributed_lock(key = "ledger", on_lost = "ignore")]
async fn ledger() -> Result<(), LockError> {
    Ok(())
}

#[dl::distributed_lock(key = "ledger", on_lost = "cancel")]
async fn ledger_cancel() -> Result<(), LockError> {
    Ok(())
}

#[dl::distributed_lock(
    crate = "dl",
    key = "renamed:{id}",
    on_lost = "ignore",
    watchdog = false,
    wait = "0s",
    lease = "5s",
)]
async fn renamed(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[dl::distributed_lock(key = "job:report", lease = "10m", watchdog = false, hold_at_least = "30s")]
async fn report() -> Result<(), LockError> {
    Ok(())
}

#[dl::distributed_lock(key = "job:sweep", hold_at_least = "5s")]
async fn sweep() -> Result<(), LockError> {
    Ok(())
}

mod reexport {
    pub use ::dlock_runtime as locks;
}

#[dl::distributed_lock(key = "reexported", crate = "crate::reexport::locks")]
async fn reexported() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
