// Generic functions, where-clauses, and `impl Trait` in the return type.
#![deny(warnings)]
#![allow(dead_code)]

use std::fmt::Display;

use dlock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "item:{id}")]
async fn generic<T, E>(id: T, value: T) -> Result<T, E>
where
    T: Display + Send,
    E: From<LockError>,
{
    drop(id);
    Ok(value)
}

#[distributed_lock(key = "item:{id}")]
async fn impl_display(id: u64) -> Result<impl Display, LockError> {
    Ok(format!("item {id}"))
}

#[distributed_lock(key = "item:{id}")]
async fn impl_arg(id: impl Display + Send) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[distributed_lock(key = "slot:{n}")]
async fn const_generic<const N: usize>(n: usize) -> Result<[u8; N], LockError> {
    assert!(n <= N);
    Ok([0; N])
}

struct Cache<K> {
    name: K,
}

impl<K: Display + Sync> Cache<K> {
    #[distributed_lock(key = "cache:{self.name}:{key}")]
    async fn refresh<V>(&self, key: &str, value: V) -> Result<Option<V>, LockError>
    where
        V: Send,
    {
        Ok(Some(value))
    }
}

fn main() {}
