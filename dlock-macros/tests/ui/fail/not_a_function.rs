use dlock_runtime::distributed_lock;

#[distributed_lock(key = "stock")]
struct Stock {
    count: u64,
}

fn main() {
    let _ = Stock { count: 1 }.count;
}
