use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "printer", fair = "yes")]
async fn print() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = print();
}
