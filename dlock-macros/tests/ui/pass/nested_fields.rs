// Placeholders that reach into fields, at any depth, including tuple fields.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

struct User {
    id: u64,
}

struct Order {
    user: User,
    sku: String,
    pair: (u8, u16),
}

#[distributed_lock(key = "order:{order.user.id}:{order.sku}")]
async fn checkout(order: Order) -> Result<String, LockError> {
    Ok(order.sku)
}

#[distributed_lock(key = "order:<order.user.id>:<order.pair.1>")]
async fn checkout_angle(order: &Order) -> Result<u64, LockError> {
    Ok(order.user.id)
}

#[distributed_lock(key = "pair:{pair.0}")]
async fn tuple_field(pair: (u64, String)) -> Result<String, LockError> {
    Ok(pair.1)
}

fn main() {}
