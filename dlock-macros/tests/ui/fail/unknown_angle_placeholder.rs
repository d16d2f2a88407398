use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "order:<order.id>")]
async fn pay(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = pay(1);
}
