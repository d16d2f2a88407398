use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = [])]
async fn transfer(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = transfer(1, 2);
}
