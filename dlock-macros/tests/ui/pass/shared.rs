// `mode = "read" | "write"` and `permits = N`.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "doc:{id}", mode = "read", wait = "1s")]
async fn read_doc(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "doc:{id}", mode = "write")]
async fn write_doc(id: u64) -> Result<u64, LockError> {
    // A read inside the write re-enters it.
    read_doc(id).await
}

#[distributed_lock(key = "api:quota", permits = 8, lease = "10s")]
async fn call_api() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
