// Native `async fn` in a trait, guarded in the implementation and in a default body.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

trait Stock {
    async fn reserve(&self, id: u64) -> Result<u64, LockError>;

    #[distributed_lock(key = "stock:default:{id}")]
    async fn release(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

struct Warehouse {
    name: String,
}

impl Stock for Warehouse {
    #[distributed_lock(key = "stock:{self.name}:{id}", wait = "1s")]
    async fn reserve(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {}
