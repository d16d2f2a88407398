//! Key and channel names of one lock, every one in the same hash slot:
//! - lock hash `<prefix>{<key>}`: `owner`, `count` (hold count), `fence`; its TTL is the lease;
//! - fence counter `<prefix>{<key>}:fence`;
//! - release channel `<prefix>{<key>}:released`.

/// Key and channel names for one prefix.
#[derive(Debug, Clone)]
pub(super) struct Names {
    pub(super) prefix: String,
}

impl Names {
    pub(super) fn lock(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }

    pub(super) fn fence(&self, key: &str) -> String {
        format!("{}{{{key}}}:fence", self.prefix)
    }

    pub(super) fn channel(&self, key: &str) -> String {
        format!("{}{{{key}}}:released", self.prefix)
    }

    /// The user key of a release channel, if the channel is one of ours.
    pub(super) fn key_of_channel<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('{')?
            .strip_suffix("}:released")
    }
}

/// The hash slot of a key (CRC16/XMODEM of its hash tag, mod 16384), as Redis Cluster computes
/// it: renewals are batched per slot there.
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag_and_map_back() {
        let n = Names {
            prefix: "dlock:".into(),
        };
        assert_eq!(n.lock("stock:42"), "dlock:{stock:42}");
        assert_eq!(n.fence("stock:42"), "dlock:{stock:42}:fence");
        assert_eq!(n.channel("stock:42"), "dlock:{stock:42}:released");
        for key in ["stock:42", "a}b{c", "", "ключ {x}"] {
            assert_eq!(n.key_of_channel(&n.channel(key)), Some(key));
        }
        assert_eq!(n.key_of_channel("other:{x}:released"), None);
    }

    #[test]
    fn hash_slots_follow_the_cluster_rule() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(hash_slot(b"123456789"), 12739);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        let n = Names {
            prefix: "dlock:".into(),
        };
        let key = "stock:42";
        let slot = hash_slot(n.lock(key).as_bytes());
        assert_eq!(hash_slot(n.fence(key).as_bytes()), slot);
        assert_eq!(hash_slot(n.channel(key).as_bytes()), slot);
    }
}
