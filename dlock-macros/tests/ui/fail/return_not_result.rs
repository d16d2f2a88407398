use dlock_runtime::distributed_lock;

#[distributed_lock(key = "stock:{id}")]
async fn buy(id: u64) -> u32 {
    id as u32
}

fn main() {
    let _ = buy(1);
}
