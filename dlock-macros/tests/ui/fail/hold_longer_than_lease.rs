use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "job:report", lease = "10m", watchdog = false, hold_at_least = "1h")]
async fn report() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = report();
}
