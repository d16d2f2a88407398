// `keys = [..]` with placeholders of parameters, fields and `self`, and `fair`.
#![deny(warnings)]
#![allow(dead_code)]

use dlock_runtime::{LockError, distributed_lock};

struct Transfer {
    from: u64,
    to: u64,
}

#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], wait = "1s")]
async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, LockError> {
    Ok(from + to + amount)
}

#[distributed_lock(keys = ["acct:{t.from}", "acct:<t.to>", "ledger"])]
async fn transfer_fields(t: &Transfer) -> Result<u64, LockError> {
    Ok(t.from + t.to)
}

struct Bank {
    branch: String,
}

impl Bank {
    #[distributed_lock(keys = ["branch:{self.branch}", "acct:{id}"], fair = true)]
    async fn close(&self, id: u64) -> Result<u64, LockError> {
        if id == 0 {
            return Ok(0);
        }
        Ok(id)
    }
}

#[distributed_lock(keys = ["one:{id}"])]
async fn one_key_set(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(key = "printer", fair = true, wait = "5s")]
async fn print() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(key = "printer", fair = false)]
async fn print_unfair() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
