use dlock_runtime::distributed_lock;

#[distributed_lock(key = "stock:{id}")]
async fn buy(id: u64) -> Result<u32, String> {
    Ok(id as u32)
}

fn main() {
    let _ = buy(1);
}
