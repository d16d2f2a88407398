// The attribute inside `macro_rules!`, with the key and the parameter coming from the macro.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

macro_rules! guarded {
    ($name:ident, $key:literal, $param:ident) => {
        #[distributed_lock(key = $key, lease = "30s")]
        async fn $name($param: u64) -> Result<u64, LockError> {
            Ok($param)
        }
    };
}

guarded!(buy, "stock:{id}", id);

macro_rules! with_lease {
    ($lease:expr) => {
        #[distributed_lock(key = "k", lease = $lease)]
        async fn leased() -> Result<(), LockError> {
            Ok(())
        }
    };
}

with_lease!("1s");

fn main() {}
