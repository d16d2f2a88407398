//! Engine naming rules, exposed for the end-to-end tests so that they check the library's own
//! rules instead of a copy. Not a public API: names and signatures here change without notice.

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of its hash tag, mod 16384).
#[cfg(feature = "redis")]
pub fn hash_slot(key: &[u8]) -> u16 {
    crate::backend::redis::hash_slot(key)
}

/// A user key as the one ZooKeeper path segment the engine stores it under.
#[cfg(feature = "zookeeper")]
pub fn zookeeper_segment(key: &str) -> String {
    crate::backend::zookeeper::escape(key)
}
