// Bindings introduced by patterns in parameters, axum-style.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

/// Stands in for `axum::extract::Path`.
struct Path<T>(T);

/// Stands in for `axum::extract::State`.
struct State<S>(S);

struct Point {
    x: i32,
    y: i32,
}

#[distributed_lock(key = "stock:<id>")]
async fn handler(Path(id): Path<u64>, State(shop): State<String>) -> Result<String, LockError> {
    Ok(format!("{shop}/{id}"))
}

#[distributed_lock(key = "cell:{a}:{b}")]
async fn tuple((a, b): (u8, u8)) -> Result<u16, LockError> {
    Ok(u16::from(a) + u16::from(b))
}

#[distributed_lock(key = "point:{x}:{py}")]
async fn strukt(Point { x, y: py }: Point) -> Result<i32, LockError> {
    Ok(x + py)
}

#[distributed_lock(key = "n:{n}:{r}")]
async fn modifiers(mut n: u32, ref r: u32, _: u8) -> Result<u32, LockError> {
    n += *r;
    Ok(n)
}

#[distributed_lock(key = "pair:{whole.0}:{first}")]
async fn at_binding(whole @ (first, _): (u8, u8)) -> Result<u8, LockError> {
    Ok(whole.1 + first)
}

#[distributed_lock(key = "ref:{a}")]
async fn reference(&(a, _): &(u8, u8)) -> Result<u8, LockError> {
    Ok(a)
}

fn main() {}
