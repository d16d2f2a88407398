// Inherent methods: `&self`, `&mut self`, `self`, `self: Arc<Self>`, with `{self.field}`.
#![deny(warnings)]
#![allow(dead_code)]

use std::sync::Arc;

use dlock_runtime::{LockError, distributed_lock};

struct Inventory {
    tenant: String,
    shard: u16,
    sold: u64,
}

impl Inventory {
    #[distributed_lock(key = "{self.tenant}:stock:{id}", lease = "30s")]
    async fn shared(&self, id: u64) -> Result<u64, LockError> {
        Ok(self.sold + id)
    }

    #[distributed_lock(key = "<self.tenant>:<self.shard>:stock:<id>")]
    async fn exclusive(&mut self, id: u64) -> Result<u64, LockError> {
        self.sold += id;
        Ok(self.sold)
    }

    #[distributed_lock(key = "{self.tenant}:close")]
    async fn by_value(self) -> Result<String, LockError> {
        Ok(self.tenant)
    }

    #[distributed_lock(key = "{self.tenant}:arc")]
    async fn arc(self: Arc<Self>) -> Result<u64, LockError> {
        Ok(self.sold)
    }

    #[distributed_lock(key = "{self.tenant}:lifetime")]
    async fn explicit_lifetime<'a>(&'a self, name: &'a str) -> Result<&'a str, LockError> {
        if name.is_empty() { Ok(&self.tenant) } else { Ok(name) }
    }

    #[distributed_lock(key = "{self.tenant}:new")]
    async fn returns_self(self: Box<Self>) -> Result<Box<Self>, LockError> {
        Ok(self)
    }
}

struct Tenant(String);

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Tenant {
    // `{self}` formats the receiver itself.
    #[distributed_lock(key = "tenant:{self}")]
    async fn whole(&self) -> Result<usize, LockError> {
        Ok(self.0.len())
    }

    // `{self.0}` reaches a tuple field of the receiver.
    #[distributed_lock(key = "tenant:<self.0>")]
    async fn tuple_field(&self) -> Result<usize, LockError> {
        Ok(self.0.len())
    }
}

fn main() {}
