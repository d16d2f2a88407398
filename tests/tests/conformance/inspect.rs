//! Inspection (`Runtime::inspect`, `Runtime::list`), seen from another runtime than the
//! holder's: a held lock shows its key, a redacted owner, the lease left, its hold count and,
//! where the engine can tell it, the holder's fence; a released key, a queued waiter, and on
//! the Redis engines a reservation, a foreign value or a key of another type, are no holders.

use std::time::Duration;

use dlock_runtime::{LockInfo, Runtime, current_fence, with_lock};

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, assert_nothing_left};
use dlock_tests::{AcquireExt, HoldExt, eventually, lock_key, waiter_got_it};

/// How many characters of the owner token a `LockInfo` shows, before its `…`.
const OWNER_SHOWN: usize = 8;

/// The fence `inspect` shows for a holder whose guard has `fence` (see
/// [`Params::inspect_shows_fence`](crate::fixture::Params::inspect_shows_fence)).
fn shown_fence(engine: Engine, fence: Option<u64>) -> Option<u64> {
    fence.filter(|_| engine.params().inspect_shows_fence)
}

/// Checks what `info` shows of a lock on `key` held for `LONG_LEASE`.
fn assert_shows(engine: Engine, info: &LockInfo, key: &str, fence: Option<u64>) {
    assert_eq!(
        info.key, key,
        "{engine:?}: the user's key, without the prefix"
    );
    assert!(
        info.owner.ends_with('…') && info.owner.chars().count() == OWNER_SHOWN + 1,
        "{engine:?}: the owner is redacted to {OWNER_SHOWN} digits and `…`: {:?}",
        info.owner
    );
    assert!(
        info.owner[..OWNER_SHOWN]
            .bytes()
            .all(|b| b.is_ascii_hexdigit()),
        "{engine:?}: the owner shows the token's first hex digits: {:?}",
        info.owner
    );
    assert!(
        info.ttl > Duration::ZERO && info.ttl <= LONG_LEASE,
        "{engine:?}: ttl of {key:?} is {:?}, expected within (0, {LONG_LEASE:?}]",
        info.ttl
    );
    assert_eq!(info.holds, 1, "{engine:?}: one hold stored per acquisition");
    assert_eq!(
        info.fence,
        shown_fence(engine, fence),
        "{engine:?}: fence of {key:?}"
    );
    assert_eq!(info.mode, "exclusive");
}

/// The keys `list(prefix)` answers, in its order.
async fn listed(rt: &Runtime, prefix: &str) -> Vec<String> {
    rt.list(prefix)
        .await
        .unwrap_or_else(|e| panic!("list({prefix:?}): {e}"))
        .into_iter()
        .map(|info| info.key)
        .collect()
}

/// Two locks of one runtime and one of another, on keys with and without the listed prefix:
/// another runtime sees each with its key, a redacted owner (the same for both locks of one
/// runtime), the lease left, one hold and the holder's fence where the engine tells it;
/// `list` answers the prefix's keys sorted; a released key is neither listed nor inspected.
pub(crate) async fn held_locks_are_listed_with_their_holder(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [holder, observer] = fixture.each_runtime().await;
    let prefix = "conformance:inspect:";
    let (a, b, other) = (
        "conformance:inspect:b",
        "conformance:inspect:a",
        "conformance:other",
    );
    let guard_a = holder.lock(a).lease(LONG_LEASE).acquire().await.expect("a");
    let guard_b = holder.lock(b).lease(LONG_LEASE).acquire().await.expect("b");
    let guard_other = observer
        .lock(other)
        .lease(LONG_LEASE)
        .acquire()
        .await
        .expect("other");

    let info_a = observer
        .inspect(a)
        .await
        .expect("inspect")
        .unwrap_or_else(|| panic!("{engine:?}: a held lock is inspected"));
    assert_shows(engine, &info_a, a, guard_a.fence());
    let listing = observer.list(prefix).await.expect("list");
    assert_eq!(
        listing.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(),
        [b, a],
        "{engine:?}: the prefix's keys, sorted"
    );
    assert_shows(engine, &listing[0], b, guard_b.fence());
    assert_eq!(
        listing[0].owner, listing[1].owner,
        "{engine:?}: both locks of one runtime show the same redacted owner"
    );
    assert_eq!(
        listed(&observer, "").await,
        [b, a, other],
        "{engine:?}: an empty prefix lists every lock"
    );
    assert_eq!(listed(&observer, "conformance:inspect:a").await, [b]);
    assert!(listed(&observer, "nothing:").await.is_empty());

    guard_a.release().await.expect("release a");
    assert_eq!(
        observer.inspect(a).await.expect("inspect"),
        None,
        "{engine:?}: a released key has no holder"
    );
    assert_eq!(listed(&observer, prefix).await, [b]);
    guard_b.release().await.expect("release b");
    guard_other.release().await.expect("release other");
    assert!(
        listed(&observer, "").await.is_empty(),
        "{engine:?}: nothing held"
    );
}

/// A lock re-entered within its call chain is one hold in the engine, with the outer fence:
/// `inspect` shows it once, with the outer guard's fence, during and after the inner hold.
pub(crate) async fn reentered_lock_is_one_hold_with_the_outer_fence(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [holder, observer] = fixture.each_runtime().await;
    let key = "conformance:inspect:reentered";
    with_lock(holder.lock(key).lease(LONG_LEASE), async {
        let outer = current_fence();
        let inner = with_lock(holder.lock(key).lease(LONG_LEASE), async {
            let info = observer.inspect(key).await.expect("inspect").expect("held");
            assert_shows(engine, &info, key, outer);
            current_fence()
        })
        .await
        .expect("re-entered");
        assert_eq!(inner, outer);
        let info = observer.inspect(key).await.expect("inspect").expect("held");
        assert_shows(engine, &info, key, outer);
        assert_eq!(listed(&observer, key).await, [key]);
    })
    .await
    .expect("outer hold");
    assert_nothing_left(&observer, key, "after the outer exit").await;
    assert_eq!(observer.inspect(key).await.expect("inspect"), None);
}

/// A waiter for a held key (queued in the engine on etcd and ZooKeeper, subscribed on the
/// Redis engines) is not shown: `inspect` and `list` show the holder alone, and the waiter
/// once it got the key.
pub(crate) async fn waiters_are_not_holders(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [holder, waiting, observer] = fixture.each_runtime().await;
    let key = "conformance:inspect:queued";
    let guard = holder.hold(key, LONG_LEASE).await;
    let before = observer.inspect(key).await.expect("inspect").expect("held");
    let waiter = waiting
        .lock(key)
        .lease(LONG_LEASE)
        .wait(Duration::from_secs(20))
        .spawn();
    if engine == Engine::Memory {
        tokio::time::sleep(Duration::from_millis(200)).await;
    } else {
        fixture
            .wait_for_waiters(key, 1, Duration::from_secs(5))
            .await;
    }
    let listing = observer.list(key).await.expect("list");
    assert_eq!(listing.len(), 1, "{engine:?}: one holder: {listing:?}");
    assert_eq!(
        listing[0].owner, before.owner,
        "{engine:?}: the holder, not the waiter"
    );
    assert_eq!(listing[0].fence, before.fence);

    guard.release().await.expect("release");
    let (next, _) = waiter_got_it(waiter, Duration::from_secs(10), "the waiter").await;
    let what = format!("{engine:?}: the waiter shown as the holder");
    eventually(Duration::from_secs(5), &what, || async {
        observer
            .inspect(key)
            .await
            .expect("inspect")
            .is_some_and(|info| info.fence == shown_fence(engine, next.fence()))
    })
    .await;
    let now = observer.inspect(key).await.expect("inspect").expect("held");
    assert_shows(engine, &now, key, next.fence());
    next.release().await.expect("release");
}

/// On the Redis engines, what the runtime did not write as a hold is skipped, not an error: a
/// reservation after a flagged release (`~<runtime id>`), a value that is not an owner token,
/// and a key of another type under the lock's name; on Redlock also an owner token that fewer
/// nodes than the quorum show. Elsewhere there is nothing of the kind to
/// write, and the check is that a listing around held locks answers them alone.
pub(crate) async fn reservations_and_foreign_values_are_not_holders(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let [holder, observer] = fixture.each_runtime().await;
    let prefix = "conformance:inspect:raw:";
    let held = "conformance:inspect:raw:held";
    let guard = holder.hold(held, LONG_LEASE).await;
    let (reserved, foreign, hash) = (
        "conformance:inspect:raw:reserved",
        "conformance:inspect:raw:foreign",
        "conformance:inspect:raw:hash",
    );
    for node in fixture.redis_nodes() {
        let set = |key: &str, value: &str| {
            redis::cmd("SET")
                .arg(lock_key(key))
                .arg(value)
                .arg("PX")
                .arg(30_000)
                .clone()
        };
        let _: () = node.query(&set(reserved, "~0123456789abcdef+")).await;
        let _: () = node.query(&set(foreign, "not-an-owner-token")).await;
        let _: i64 = node
            .query(redis::cmd("HSET").arg(lock_key(hash)).arg("owner").arg("x"))
            .await;
    }
    let minority = "conformance:inspect:raw:minority";
    let nodes = fixture.redis_nodes();
    if nodes.len() >= 3 {
        let _: () = nodes[0]
            .query(
                redis::cmd("SET")
                    .arg(lock_key(minority))
                    .arg("0123456789abcdef0123456789abcdef")
                    .arg("PX")
                    .arg(30_000),
            )
            .await;
    }
    for key in [reserved, foreign, hash, minority] {
        assert_eq!(
            observer
                .inspect(key)
                .await
                .expect("inspect skips, never fails"),
            None,
            "{engine:?}: {key:?} has no holder"
        );
    }
    assert_eq!(
        listed(&observer, prefix).await,
        [held],
        "{engine:?}: only the held lock is listed"
    );
    guard.release().await.expect("release");
    assert!(listed(&observer, prefix).await.is_empty());
}
