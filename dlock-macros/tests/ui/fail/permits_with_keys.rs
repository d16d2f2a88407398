use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(keys = ["api:a", "api:b"], permits = 8)]
async fn call() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = call();
}
