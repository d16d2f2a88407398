// The guarded function's future is `Send` when the body's is: it can be spawned.
#![deny(warnings)]
#![allow(dead_code)]

use std::sync::Arc;

use dlock_runtime::{LockError, distributed_lock};

fn assert_send<T: Send>(_: T) {}

struct Shop {
    name: String,
}

impl Shop {
    #[distributed_lock(key = "{self.name}:{id}")]
    async fn buy(self: Arc<Self>, id: u64) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        Ok(id)
    }

    #[distributed_lock(key = "{self.name}:{id}")]
    async fn buy_ref(&self, id: u64) -> Result<u64, LockError> {
        tokio::task::yield_now().await;
        Ok(id)
    }
}

#[distributed_lock(key = "stock:{id}", wait = "1s")]
async fn buy(id: u64, note: String) -> Result<String, LockError> {
    tokio::task::yield_now().await;
    Ok(format!("{id}{note}"))
}

fn spawns() {
    assert_send(buy(1, String::new()));
    let shop = Arc::new(Shop { name: "s".to_owned() });
    assert_send(shop.clone().buy(1));
    assert_send(async move { shop.buy_ref(2).await });
    drop(tokio::spawn(buy(2, String::new())));
}

fn main() {}
