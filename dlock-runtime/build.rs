//! Names for the sets of engine features the code asks about, set once here instead of
//! `any(feature = ...)` lists kept by hand across the crate.

fn main() {
    cfg_aliases::cfg_aliases! {
        // Engines with a queue of their own: waiters queue in the engine.
        queued_engines: { any(feature = "etcd", feature = "zookeeper") },
        // Engines with a server (everything but the in-process one).
        server_engines: { any(feature = "redis", feature = "etcd", feature = "zookeeper") },
    }
}
