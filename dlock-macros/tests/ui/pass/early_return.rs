// `return` and `?` inside the body keep their meaning: they leave the guarded function.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

#[derive(Debug)]
enum ShopError {
    SoldOut,
    Parse(std::num::ParseIntError),
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(err: LockError) -> Self {
        ShopError::Lock(err)
    }
}

impl From<std::num::ParseIntError> for ShopError {
    fn from(err: std::num::ParseIntError) -> Self {
        ShopError::Parse(err)
    }
}

async fn stock_of(id: u64) -> Result<u64, ShopError> {
    Ok(id)
}

#[distributed_lock(key = "stock:{id}", lease = "30s", wait = "1s")]
async fn buy(id: u64, qty: &str) -> Result<u64, ShopError> {
    let qty: u64 = qty.parse()?;
    let stock = stock_of(id).await?;
    if stock < qty {
        return Err(ShopError::SoldOut);
    }
    if qty == 0 {
        return Ok(stock);
    }
    Ok(stock - qty)
}

// `?` on a `LockError` inside the body, and an error type that is `LockError` itself.
#[distributed_lock(key = "outer:{id}")]
async fn nested(id: u64) -> Result<(), LockError> {
    let _guard = dlock_runtime::lock(format!("inner:{id}")).acquire().await?;
    Ok(())
}

// A boxed error also carries a `LockError`.
#[distributed_lock(key = "boxed")]
async fn boxed() -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    let n: u8 = "7".parse()?;
    Ok(n)
}

// A body that ends in a diverging expression.
#[distributed_lock(key = "never")]
async fn diverges() -> Result<(), LockError> {
    loop {
        tokio::task::yield_now().await;
    }
}

fn main() {}
