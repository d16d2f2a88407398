use dlock_runtime::distributed_lock;

#[derive(Debug)]
enum ShopError {
    SoldOut,
}

#[distributed_lock(key = "stock:{id}")]
async fn buy(id: u64) -> Result<u64, ShopError> {
    if id == 0 {
        return Err(ShopError::SoldOut);
    }
    Ok(id)
}

fn main() {
    let _ = buy(1);
}
