use dlock_runtime::distributed_lock;

#[distributed_lock(key = "stock:{id}")]
extern "C" fn buy(id: u64) -> u64 {
    id
}

fn main() {
    let _ = buy(1);
}
