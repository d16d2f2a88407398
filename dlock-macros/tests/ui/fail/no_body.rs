use dlock_runtime::{LockError, distributed_lock};

trait Shop {
    #[distributed_lock(key = "stock:{id}")]
    async fn buy(&self, id: u64) -> Result<u64, LockError>;
}

fn main() {}
