use dlock_runtime::distributed_lock;

#[distributed_lock(key = "stock:{id}")]
async fn buy(id: u64) {
    println!("{id}");
}

fn main() {
    let _ = buy(1);
}
