use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "doc:{id}", mode = "shared")]
async fn buy(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = buy(1);
}
