use dlock_runtime::{LockError, distributed_lock};

struct Sku(u64);

#[distributed_lock(key = "stock:{sku}")]
async fn buy(sku: Sku) -> Result<u64, LockError> {
    Ok(sku.0)
}

fn main() {
    let _ = buy(Sku(1));
}
