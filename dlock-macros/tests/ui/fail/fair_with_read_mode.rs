use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "doc:{id}", mode = "read", fair = true)]
async fn show(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = show(1);
}
