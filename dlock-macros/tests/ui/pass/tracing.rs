// `#[tracing::instrument]` above and below the attribute.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

// Lock outside the span's body: the span covers waiting for the lock.
#[distributed_lock(key = "stock:{id}", lease = "30s")]
#[tracing::instrument]
async fn lock_then_instrument(id: u64) -> Result<u64, LockError> {
    tracing::info!("buying");
    Ok(id)
}

// Instrument first: the span covers the guarded body.
#[tracing::instrument(err)]
#[distributed_lock(key = "stock:{id}", lease = "30s")]
async fn instrument_then_lock(id: u64) -> Result<u64, LockError> {
    if id == 0 {
        return Ok(0);
    }
    Ok(id)
}

struct Shop {
    name: String,
}

impl Shop {
    #[tracing::instrument(skip(self), fields(shop = %self.name))]
    #[distributed_lock(key = "{self.name}:{id}")]
    async fn method(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "{self.name}:{id}")]
    #[tracing::instrument(skip(self))]
    async fn method_mut(&mut self, id: u64) -> Result<u64, LockError> {
        self.name.push('!');
        Ok(id)
    }
}

fn main() {}
