use super::*;

#[test]
fn names_share_one_hash_tag_and_map_back() {
    let n = Names::new("dlock:");
    assert_eq!(n.lock("stock:42"), "dlock:{stock:42}");
    assert_eq!(n.fence("stock:42"), "dlock:{stock:42}:fence");
    assert_eq!(n.channel("stock:42"), "dlock:{stock:42}:released");
    assert_eq!(n.lock("}x"), "dlock:{%7Dx}");
    assert_eq!(n.lock("100%"), "dlock:{100%25}");
    for key in ["stock:42", "a}b{c", "", "ключ {x}", "}", "%7D", "{}"] {
        assert_eq!(n.key_of_channel(&n.channel(key)).as_deref(), Some(key));
    }
    assert_eq!(n.key_of_channel("other:{x}:released"), None);
}

#[test]
fn names_written_in_place_are_the_names() {
    for prefix in ["dlock:", "a{%}b:"] {
        let n = Names::new(prefix);
        let long = "k".repeat(300);
        for key in ["stock:42", "a}b{c", "", "100%", "ключ", &long] {
            let tag = n.tag(key);
            for (name, string) in [
                (n.name(&tag, ""), n.lock(key)),
                (n.name(&tag, FENCE), n.fence(key)),
                (n.name(&tag, TURNS), n.turns(key)),
            ] {
                assert_eq!(name.to_string(), string);
                assert_eq!(name.len(), string.len());
                assert_eq!(
                    redis::cmd("GET").arg(name).get_packed_command(),
                    redis::cmd("GET").arg(&string).get_packed_command(),
                );
                let args = redis::ToRedisArgs::to_redis_args(&name);
                assert_eq!(args, vec![string.into_bytes()]);
            }
        }
    }
}

#[test]
fn lock_names_map_back_and_patterns_match_them_literally() {
    let n = Names::new("app*[x]:");
    for key in ["stock:42", "a}b{c", "ключ", "%7D", "*?[]\\"] {
        assert_eq!(n.key_of_lock(&n.lock(key)).as_deref(), Some(key));
    }
    assert_eq!(n.key_of_lock(&n.fence("k")), None);
    assert_eq!(n.key_of_lock("other:{k}"), None);
    assert_eq!(n.key_of_lock("app*[x]:{a}b}"), None);
    assert_eq!(n.lock_pattern("st*"), "app\\*\\[x\\]:{st\\**");
    assert_eq!(Names::new("dlock:").lock_pattern("a}%"), "dlock:{a%7D%25*");
}

/// Regression (issue "reliability", Cluster hash tags): a key starting with `}` or a prefix
/// with braces gave an empty or foreign hash tag, so a lock's names fell in different slots
/// (CROSSSLOT on every acquire) or every key in one.
#[test]
fn every_key_and_prefix_give_one_slot_per_key_named_by_the_key() {
    for prefix in ["dlock:", "app{", "a{}b:", "}{", "x{y}:", "%7D"] {
        let n = Names::new(prefix);
        for key in ["}abc", "}", "{}", "a}b", "{x}", "k", "%"] {
            let slot = hash_slot(n.lock(key).as_bytes());
            assert_eq!(hash_slot(n.fence(key).as_bytes()), slot, "{prefix} {key}");
            assert_eq!(hash_slot(n.channel(key).as_bytes()), slot, "{prefix} {key}");
            let tag = escape(key, &['%', '}']);
            assert_eq!(slot, hash_slot(tag.as_bytes()), "tag of {prefix:?} {key:?}");
        }
    }
}

#[test]
fn hash_slots_follow_the_cluster_rule() {
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(hash_slot(b"123456789"), 12739);
    assert_eq!(hash_slot(b"foo"), 12182);
    assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
    assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
    let n = Names::new("dlock:");
    let key = "stock:42";
    let slot = hash_slot(n.lock(key).as_bytes());
    assert_eq!(hash_slot(n.fence(key).as_bytes()), slot);
    assert_eq!(hash_slot(n.channel(key).as_bytes()), slot);
}
