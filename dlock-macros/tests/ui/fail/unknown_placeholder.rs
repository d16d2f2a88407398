use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{idd}")]
async fn buy(id: u64, qty: u32) -> Result<u64, LockError> {
    Ok(id + u64::from(qty))
}

fn main() {
    let _ = buy(1, 2);
}
