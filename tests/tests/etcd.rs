//! What is particular to the etcd backend, end to end against real `etcd` processes started by
//! the harness: exclusion across OS processes, FIFO hand-off in arrival order, the key and lease
//! layout (fence = create revision, every exit and every waiter that gives up removes its key,
//! renewed locks share their runtime's lease, hard-capped ones have their own), a kill -9'd
//! holder freed after about its lease (and its election timeout later across a restart), lease loss from outside (lease revoked, key deleted),
//! the leases the watchdog is granted, the requests per acquisition, a killed cluster
//! leader during a hold, the etcd 3.4 hazard of a queued waiter whose lease expired, and bad
//! endpoints. The behaviours every engine shares are in the conformance suite
//! (`tests/conformance/`).
//!
//! Layout under test: one key per contender, `dlock:<key>/<owner token>`, attached to the
//! runtime's shared lease of the lock's TTL (a lease of its own under `watchdog(false)`); the
//! holder is the lowest create revision, which is also its fence.
//!
//! etcd leases are whole seconds and this server (3.4, default 100 ms heartbeat and 1 s
//! election timeout) raises anything shorter to 2 s, so lease bounds here are in seconds and
//! generous: the box has two cores shared by etcd, the holder processes and the tests.
//!
//! The harness's calls to etcd (through `etcd-client`) block; from async tests they run through
//! [`blocking`] (`block_in_place`), so the runtimes' background tasks keep running meanwhile.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::{current_fence, with_lock};
use dlock_tests::etcd::{EtcdCluster, EtcdKv, EtcdServer};
use dlock_tests::handover::{self, QueueEngine};
use dlock_tests::{
    AcquireExt, BuildExt, Counting, HoldExt, LockGuard, LongBody, RedisServer, Runtime,
    count_in_processes, finish_within, hold_fenced_in_process, waiter_got_it, while_held,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

/// The runtime's default key prefix.
const PREFIX: &str = "dlock:";

/// Runs a blocking harness call (a request to etcd, a signal, a process start) without stalling
/// the other tasks of the test's runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The contender keys of lock `key` (`dlock:<key>/...`), oldest first: the holder, then the
/// waiters in arrival order.
fn queue(etcd: &EtcdCluster, key: &str) -> Vec<EtcdKv> {
    let mut kvs = blocking(|| etcd.get_prefix(&format!("{PREFIX}{key}/")));
    kvs.sort_by_key(|kv| kv.create_revision);
    kvs
}

/// Key names only, for messages.
fn names(kvs: &[EtcdKv]) -> Vec<String> {
    kvs.iter()
        .map(|kv| {
            format!(
                "{} (rev {}, lease {})",
                kv.key, kv.create_revision, kv.lease
            )
        })
        .collect()
}

/// Waits until the queue of `key` has exactly `len` contenders; returns them oldest first.
async fn wait_for_queue(
    etcd: &EtcdCluster,
    key: &str,
    len: usize,
    within: Duration,
) -> Vec<EtcdKv> {
    let start = Instant::now();
    loop {
        let kvs = queue(etcd, key);
        if kvs.len() == len {
            return kvs;
        }
        assert!(
            start.elapsed() < within,
            "queue of `{key}`: expected {len} contender keys within {within:?}, have {:?}",
            names(&kvs)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The one contender key of `key` (the holder, nobody waiting).
fn only_holder(etcd: &EtcdCluster, key: &str) -> EtcdKv {
    let kvs = queue(etcd, key);
    assert_eq!(
        kvs.len(),
        1,
        "`{key}` must have exactly one contender key (the holder): {:?}",
        names(&kvs)
    );
    kvs.into_iter().next().expect("one key")
}

/// Whether lease `id` is still alive on the server.
fn lease_alive(etcd: &EtcdCluster, id: i64) -> bool {
    blocking(|| etcd.lease_ttl(id)).is_some()
}

/// The TTL lease `id` was granted with: what the server made of the runtime's whole-second
/// TTL.
fn granted_ttl(etcd: &EtcdCluster, id: i64) -> Option<i64> {
    blocking(|| etcd.lease_granted_ttl(id))
}

/// Revokes lease `id` behind the runtime's back.
fn revoke_lease(etcd: &EtcdCluster, id: i64) {
    blocking(|| etcd.lease_revoke(id));
}

/// Waits until the contender key `held` is gone; returns how long that took. Panics after
/// `within`.
async fn wait_until_key_gone(
    etcd: &EtcdCluster,
    key: &str,
    held: &EtcdKv,
    within: Duration,
    what: &str,
) -> Duration {
    let start = Instant::now();
    loop {
        let kvs = queue(etcd, key);
        if kvs.iter().all(|kv| kv.key != held.key) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{what}: after {within:?} the key {} is still there (queue {:?})",
            held.key,
            names(&kvs)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A runtime on every member of `etcd`, default options.
async fn runtime(etcd: &EtcdCluster) -> Runtime {
    Runtime::builder().etcd(etcd.endpoints()).built().await
}

/// `errors` in short: how many, and the first three (an etcd error carries its whole cause).
fn summary(errors: &[String]) -> String {
    let first: Vec<&str> = errors.iter().take(3).map(|e| e.as_str()).collect();
    format!("{} errors, first {first:#?}", errors.len())
}

// ---------------------------------------------------------------------------------------------
// Mutual exclusion
// ---------------------------------------------------------------------------------------------

/// Three OS processes, each with its own etcd runtime, increment a counter kept on a separate
/// redis-server (GET, sleep 1 ms, SET: exact only under mutual exclusion).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_increment_a_counter_exactly() {
    const RUNS: (u64, u64) = (3, 20);
    let (etcd, store) = (EtcdServer::start(), RedisServer::start());
    let start = Instant::now();
    let (url, key) = (etcd.url(), "etcd:processes");
    let total = count_in_processes(Counting::Guard, &url, &store, key, RUNS).await;
    println!("{RUNS:?} processes x increments in {:?}", start.elapsed());
    assert_eq!(total, RUNS.0 * RUNS.1);
    assert!(queue(etcd.cluster(), "etcd:processes").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_arrival_order() {
    let etcd = EtcdServer::start();
    let key = "etcd:fifo";
    let holder_rt = runtime(etcd.cluster()).await;
    let holder = holder_rt.lock(key).held("A acquires").await;
    let holder_fence = holder.fence().expect("fence");
    // (waiter, acquired at, released at, fence)
    type Record = (usize, Instant, Instant, Option<u64>);
    let order: Arc<Mutex<Vec<Record>>> = Arc::default();
    let mut waiters = Vec::new();
    for w in 1..=3 {
        let rt = runtime(etcd.cluster()).await;
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = rt
                .lock(key)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap_or_else(|e| panic!("W{w} acquires within 30 s: {e:?}"));
            let acquired = Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            order
                .lock()
                .unwrap()
                .push((w, acquired, Instant::now(), guard.fence()));
            guard.release().await.expect("release");
        }));
        // W<w> is in the queue before W<w+1> starts: arrival order is 1, 2, 3.
        wait_for_queue(etcd.cluster(), key, w + 1, Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arrived = queue(etcd.cluster(), key);
    assert_eq!(
        arrived.len(),
        4,
        "A and three waiters: {:?}",
        names(&arrived)
    );
    assert_eq!(arrived[0].create_revision, holder_fence as i64);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        order.lock().unwrap().is_empty(),
        "a waiter got the lock while A held it"
    );

    let released = Instant::now();
    holder.release().await.expect("A releases");
    finish_within(waiters, Duration::from_secs(10)).await;
    let order = order.lock().unwrap().clone();
    let ids: Vec<usize> = order.iter().map(|r| r.0).collect();
    assert_eq!(ids, [1, 2, 3], "acquisition order must equal arrival order");
    let mut previous_release = released;
    for (i, &(w, acquired, done, fence)) in order.iter().enumerate() {
        let hand_off = acquired.saturating_duration_since(previous_release);
        println!("W{w} acquired {hand_off:?} after its predecessor released");
        assert!(
            acquired >= previous_release,
            "W{w} acquired before its predecessor released"
        );
        assert!(
            hand_off < Duration::from_secs(1),
            "W{w} took {hand_off:?} after its predecessor released: not woken by the watch"
        );
        assert_eq!(
            fence.map(|f| f as i64),
            Some(arrived[i + 1].create_revision),
            "W{w}'s fence is the create revision of its queue key"
        );
        previous_release = done;
    }
    assert!(queue(etcd.cluster(), key).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Layout: fences, and leases on every exit path
// ---------------------------------------------------------------------------------------------

/// How a holder leaves in [`holder_key_is_its_fence_and_every_exit_deletes_it`].
#[derive(Debug, Clone, Copy)]
enum Exit {
    Release,
    Drop,
    Panic,
    Abort,
}

/// One key per holder, `dlock:<key>/<owner token>` (128 bits in hex, also its value), attached
/// to the runtime's shared lease; its create revision is the fence (the guard's, and
/// `current_fence()` inside `with_lock`). Every exit removes the key: `release()` before it
/// returns; a dropped guard, a panic in `with_lock` and an aborted task within 2 s. The shared
/// lease stays (the runtime keeps it for its other locks). (That every exit frees the key, and
/// that fences strictly increase, is the conformance suite's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_key_is_its_fence_and_every_exit_deletes_it() {
    let etcd = EtcdServer::start();
    let rt = runtime(etcd.cluster()).await;
    let bound = Duration::from_secs(2);
    for exit in [Exit::Release, Exit::Drop, Exit::Panic, Exit::Abort] {
        let key = format!("etcd:exit:{exit:?}");
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let (rt, key) = (rt.clone(), key.clone());
            async move {
                if let Exit::Panic = exit {
                    let _ = with_lock(rt.lock(key), async move {
                        held_tx.send(current_fence()).unwrap();
                        go_rx.await.ok();
                        panic!("boom inside the critical section");
                    })
                    .await;
                    return;
                }
                let guard = rt.lock(key).held("acquire").await;
                held_tx.send(guard.fence()).unwrap();
                if let Exit::Abort = exit {
                    std::future::pending::<()>().await;
                }
                go_rx.await.ok();
                match exit {
                    Exit::Release => guard.release().await.expect("release"),
                    _ => drop(guard),
                }
            }
        });
        let fence = held_rx.await.expect("the holder holds").expect("a fence");
        let held = only_holder(etcd.cluster(), &key);
        assert_eq!(held.value.len(), 32, "a 128-bit owner token in hex");
        let owner = String::from_utf8(held.value.clone()).expect("a hex owner token");
        assert_eq!(held.key, format!("{PREFIX}{key}/{owner}"));
        assert_eq!(
            fence as i64, held.create_revision,
            "{exit:?}: the fence is the holder key's create revision"
        );
        match exit {
            Exit::Abort => {
                task.abort();
                assert!(task.await.expect_err("aborted").is_cancelled());
            }
            Exit::Panic => {
                go_tx.send(()).unwrap();
                assert!(task.await.expect_err("the task panics").is_panic());
            }
            Exit::Release | Exit::Drop => {
                go_tx.send(()).unwrap();
                task.await.expect("the holder's task");
            }
        }
        if let Exit::Release = exit {
            // At once: `release()` has removed it when it returns.
            assert!(
                queue(etcd.cluster(), &key).is_empty(),
                "key left after release"
            );
        }
        let took =
            wait_until_key_gone(etcd.cluster(), &key, &held, bound, &format!("{exit:?}")).await;
        println!("{exit:?}: key gone in {took:?}");
        assert!(
            lease_alive(etcd.cluster(), held.lease),
            "{exit:?}: the runtime's shared lease stays"
        );
    }
    assert_eq!(rt.held_count(), 0);
}

/// Renewed locks of one runtime share one lease per TTL, kept alive by the runtime: two keys
/// with a 6 s lease are on one lease, a 3 s lease on another, another runtime on its own.
/// A hard-capped lock (`watchdog(false)`) has a lease of its own, which its release revokes
/// (within 2 s). Once the runtime is dropped, its shared leases expire within their TTL (no
/// keep-alive any more): a dead process holds nothing longer than its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_locks_share_the_runtimes_lease_and_hard_capped_ones_have_their_own() {
    let etcd = EtcdServer::start();
    let rt = runtime(etcd.cluster()).await;
    let other = runtime(etcd.cluster()).await;
    let six = Duration::from_secs(6);
    let a = rt.lock("etcd:share:a").lease(six).held("a").await;
    let b = rt.lock("etcd:share:b").lease(six).held("b").await;
    let c = rt.hold("etcd:share:c", Duration::from_secs(3)).await;
    let d = other.lock("etcd:share:d").lease(six).held("d").await;
    let capped = rt.hold_capped("etcd:share:capped", six).await;
    let lease_of = |key: &str| only_holder(etcd.cluster(), key).lease;
    let (la, lb, lc, ld, lcap) = (
        lease_of("etcd:share:a"),
        lease_of("etcd:share:b"),
        lease_of("etcd:share:c"),
        lease_of("etcd:share:d"),
        lease_of("etcd:share:capped"),
    );
    assert_eq!(
        la, lb,
        "two renewed locks of one TTL share the runtime's lease"
    );
    assert_ne!(la, lc, "another TTL, another lease");
    assert_ne!(la, ld, "another runtime, another lease");
    assert!(
        lcap != la && lcap != lc,
        "a hard-capped lock has a lease of its own"
    );
    assert_eq!(granted_ttl(etcd.cluster(), la), Some(6));
    capped.release().await.expect("release");
    let start = Instant::now();
    while lease_alive(etcd.cluster(), lcap) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the hard-capped lock's own lease must be revoked after its release"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for guard in [a, b, c, d] {
        guard.release().await.expect("release");
    }
    assert!(
        lease_alive(etcd.cluster(), la) && lease_alive(etcd.cluster(), lc),
        "the runtime keeps its shared leases for its next locks"
    );
    // Kept alive across more than a TTL with no lock held.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        lease_alive(etcd.cluster(), lc),
        "the 3 s lease is kept alive"
    );
    drop(rt);
    let dropped = Instant::now();
    while lease_alive(etcd.cluster(), la) || lease_alive(etcd.cluster(), lc) {
        assert!(
            dropped.elapsed() < Duration::from_secs(6 + 3),
            "a dropped runtime's shared leases must expire within their TTL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "shared leases gone {:?} after the runtime was dropped",
        dropped.elapsed()
    );
    assert!(
        lease_alive(etcd.cluster(), ld),
        "the other runtime's lease stays"
    );
}

/// A release the server does not answer (down for longer than the runtime's own retries last)
/// is sent again until it is answered: a key on the runtime's shared lease does not expire
/// while the runtime lives, so the key must go soon after the server's return, not after
/// retries that back off for seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_the_server_did_not_answer_lands_soon_after_its_return() {
    let mut etcd = EtcdServer::start();
    let rt = Runtime::builder()
        .etcd(etcd.endpoints())
        .timeout(Duration::from_millis(300))
        .built()
        .await;
    let key = "etcd:late-release";
    let guard = rt.hold(key, Duration::from_secs(30)).await;
    let held = only_holder(&etcd, key);
    blocking(|| etcd.stop());
    let err = guard
        .release()
        .await
        .expect_err("a stopped server does not answer");
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    tokio::time::sleep(Duration::from_secs(8)).await;
    blocking(|| etcd.restart());
    let took =
        wait_until_key_gone(&etcd, key, &held, Duration::from_secs(10), "late release").await;
    println!("the key went {took:?} after the server came back");
    assert!(
        took < Duration::from_millis(1000),
        "the key went {took:?} after the server came back"
    );
}

/// Waiters that give up leave the queue: one whose 500 ms wait runs out has removed its key by
/// the time `Timeout` returns; one whose acquire future is dropped and one whose task is
/// aborted have removed theirs within 2 s. The
/// holder and the waiter queued behind them remain, and that waiter's fence is its key's
/// create revision. (Timeout bounds and the hand-off latency: the conformance suite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_leave_the_queue() {
    let etcd = EtcdServer::start();
    let key = "etcd:give-up";
    let holder_rt = runtime(etcd.cluster()).await;
    let holder = holder_rt.lock(key).held("A acquires").await;
    let holder_kv = only_holder(etcd.cluster(), key);

    // T: its wait runs out.
    let t = runtime(etcd.cluster()).await;
    let timed_out = tokio::spawn(async move {
        t.lock(key)
            .wait(Duration::from_millis(500))
            .acquire()
            .await
            .map(drop)
    });
    let t_kv = wait_for_queue(etcd.cluster(), key, 2, Duration::from_millis(450)).await[1].clone();
    assert!(
        lease_alive(etcd.cluster(), t_kv.lease),
        "the waiter's lease is alive while it waits"
    );
    let err = timed_out.await.expect("T's task").expect_err("A holds");
    assert!(err.is_timeout(), "expected Timeout, got {err:?}");
    // At once (no polling): the waiter left the queue before returning.
    let after = queue(etcd.cluster(), key);
    assert_eq!(
        after.iter().map(|kv| &kv.key).collect::<Vec<_>>(),
        [&holder_kv.key],
        "only the holder's key may remain after the waiter timed out: {:?}",
        names(&after)
    );

    // B: its acquire future is dropped by the timeout around it, while it waits.
    let b = runtime(etcd.cluster()).await;
    let dropped = tokio::spawn(async move {
        tokio::time::timeout(
            Duration::from_millis(1500),
            b.lock(key).wait(Duration::from_secs(30)).acquire(),
        )
        .await
        .is_err()
    });
    wait_for_queue(etcd.cluster(), key, 2, Duration::from_secs(1)).await;
    // B2: its task is aborted while it waits.
    let b2 = runtime(etcd.cluster()).await;
    let aborted = tokio::spawn(async move {
        let _ = b2.lock(key).wait(Duration::from_secs(30)).acquire().await;
    });
    wait_for_queue(etcd.cluster(), key, 3, Duration::from_secs(1)).await;
    // C: queued behind both.
    let c = runtime(etcd.cluster()).await;
    let next = tokio::spawn(async move {
        c.lock(key)
            .wait(Duration::from_secs(30))
            .held("C acquires")
            .await
    });
    let queued = wait_for_queue(etcd.cluster(), key, 4, Duration::from_secs(1)).await;
    let (b_kv, b2_kv, c_kv) = (queued[1].clone(), queued[2].clone(), queued[3].clone());

    assert!(
        dropped.await.expect("B's task"),
        "B's acquire must still be waiting when the timeout around it drops it"
    );
    let bound = Duration::from_secs(2);
    let took = wait_until_key_gone(etcd.cluster(), key, &b_kv, bound, "waiter dropped").await;
    println!("dropped waiter B: key gone {took:?} after the drop");
    aborted.abort();
    assert!(aborted.await.expect_err("aborted").is_cancelled());
    let took = wait_until_key_gone(etcd.cluster(), key, &b2_kv, bound, "waiter aborted").await;
    println!("aborted waiter B2: key gone {took:?} after the abort");
    let left = queue(etcd.cluster(), key);
    assert_eq!(
        left.iter().map(|kv| &kv.key).collect::<Vec<_>>(),
        [&holder_kv.key, &c_kv.key],
        "A and C remain"
    );

    holder.release().await.expect("A releases");
    let guard = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("C gets the lock")
        .expect("C's task");
    assert_eq!(guard.fence().map(|f| f as i64), Some(c_kv.create_revision));
    guard.release().await.expect("C releases");
    assert!(queue(etcd.cluster(), key).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_lock_after_about_its_lease() {
    let etcd = EtcdServer::start();
    let key = "etcd:killed-holder";
    let url = etcd.url();
    let (mut holder, holder_fence) = hold_fenced_in_process(&url, key, 2000).await;
    let fence = holder_fence as i64;
    let held = only_holder(etcd.cluster(), key);
    assert_eq!(fence, held.create_revision, "the printed fence");
    let left = blocking(|| etcd.lease_ttl(held.lease)).expect("the holder's lease is alive");
    let granted = granted_ttl(etcd.cluster(), held.lease);
    println!("holder process: lease 2000 ms, granted TTL {granted:?} s, {left} s left now");
    assert_eq!(granted, Some(2), "a 2 s lease is granted as 2 s");
    // Past the lease: the process's watchdog keeps it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let still = only_holder(etcd.cluster(), key);
    assert_eq!(
        (still.key.as_str(), still.create_revision),
        (held.key.as_str(), held.create_revision),
        "the holder's key survives its 2 s lease while the process lives"
    );

    let rt = runtime(etcd.cluster()).await;
    holder.kill9().await;
    let bounds = Duration::from_secs(1)..=Duration::from_secs(6);
    let what = "acquire after kill -9 of an etcd holder (lease 2 s)";
    let guard = rt.lock(key).held_between(bounds, what).await;
    assert!(!lease_alive(etcd.cluster(), held.lease));
    assert!(guard.fence().expect("fence") as i64 > fence);
    guard.release().await.expect("release");
}

/// A holder killed just before etcd restarts keeps its lock past its lease: the new leader
/// extends every lease by its election timeout (1 s here), so the 2 s lease lives about 3 s
/// after the server is back. The torture program's bound on a dead holder after a restart
/// counts that extension.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holders_lock_outlives_its_lease_by_the_election_timeout_after_a_restart() {
    let mut etcd = EtcdServer::start();
    let key = "etcd:killed-then-restart";
    let (mut holder, fence) = hold_fenced_in_process(&etcd.url(), key, 2000).await;
    let held = only_holder(etcd.cluster(), key);
    holder.kill9().await;
    blocking(|| etcd.restart());
    let back = Instant::now();
    let rt = runtime(etcd.cluster()).await;
    // Past the lease alone, and within the lease, the extension and a margin.
    let bounds = Duration::from_millis(2500)..=Duration::from_secs(6);
    let what = "acquire after kill -9 of an etcd holder (lease 2 s) then a restart";
    let guard = rt.lock(key).held_between(bounds, what).await;
    println!("free {:?} after the restart", back.elapsed());
    assert!(!lease_alive(etcd.cluster(), held.lease));
    assert!(guard.fence().expect("fence") > fence);
    guard.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// Lease loss and the watchdog
// ---------------------------------------------------------------------------------------------

/// Lease of the loss tests: renewed every 2 s; the local validity alone would end a loss
/// only 4 s or more after the last renewal, so a loss seen within 2 s + margin of the fault
/// comes from renewal, not from the clock.
const LOSS_LEASE: Duration = Duration::from_secs(6);

/// A renewal interval (lease/3) plus margin.
const LOSS_SEEN_WITHIN: Duration = Duration::from_millis(3500);

/// What is done to a holder's etcd state behind its back.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Its lease revoked, which deletes its key too.
    LeaseRevoked,
    /// Only its key deleted; its lease stays.
    KeyDeleted,
}

/// The holder's lease revoked, or only its key deleted, from outside (6 s lease): `lost()`
/// resolves within 3.5 s (a renewal saw it, not the clock), the release says `Lost`, the lease
/// is gone afterwards, and another runtime takes the key (the first runtime's next lock of
/// that TTL, after the revocation, is granted a new shared lease). (A deleted lock record on every engine: conformance
/// `deleted_key_is_lost`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_or_key_deleted_from_outside_resolves_lost() {
    let etcd = EtcdServer::start();
    let (rt, other) = (runtime(etcd.cluster()).await, runtime(etcd.cluster()).await);
    for fault in [Fault::LeaseRevoked, Fault::KeyDeleted] {
        let key = format!("etcd:lost:{fault:?}");
        let guard = rt.lock(&key).lease(LOSS_LEASE).held("acquire").await;
        let held = only_holder(etcd.cluster(), &key);
        match fault {
            Fault::LeaseRevoked => {
                revoke_lease(etcd.cluster(), held.lease);
                assert!(
                    queue(etcd.cluster(), &key).is_empty(),
                    "revoking the lease deletes the key"
                );
            }
            Fault::KeyDeleted => {
                assert!(blocking(|| etcd.delete(&held.key)));
                assert!(
                    lease_alive(etcd.cluster(), held.lease),
                    "only the key was deleted"
                );
            }
        }
        let faulted = Instant::now();
        tokio::time::timeout(LOSS_SEEN_WITHIN, guard.lost())
            .await
            .unwrap_or_else(|_| {
                panic!("{fault:?}: lost() must resolve within {LOSS_SEEN_WITHIN:?}")
            });
        println!(
            "{fault:?}: lost() {:?} after (lease 6 s)",
            faulted.elapsed()
        );
        assert!(guard.is_lost());
        let err = guard.release().await.expect_err("release of a lost lock");
        assert!(err.is_lost(), "{fault:?}: {err:?}");
        assert!(
            queue(etcd.cluster(), &key).is_empty(),
            "{fault:?}: no key left after the release of the lost guard"
        );
        dlock_tests::assert_free(&other, &key, "after the loss").await;
    }
}

/// A release that finds the holder's key gone (deleted from outside before any renewal
/// noticed) must say the critical section was not protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_key_was_deleted_from_outside_is_lost() {
    let etcd = EtcdServer::start();
    let key = "etcd:lost:deleted-then-released";
    let rt = runtime(etcd.cluster()).await;
    let guard = rt.lock(key).lease(LOSS_LEASE).held("acquire").await;
    let held = only_holder(etcd.cluster(), key);
    assert!(blocking(|| etcd.delete(&held.key)));
    // Another contender takes the free key at once: the first holder is no longer the owner.
    let other = runtime(etcd.cluster()).await;
    let second = other.lock(key).held("the key is free").await;
    assert!(!guard.is_lost(), "no renewal has run yet (lease 6 s)");
    let result = guard.release().await;
    println!("release after the key was deleted from outside: {result:?}");
    assert!(
        matches!(&result, Err(e) if e.is_lost()),
        "expected Err(Lost): the key was gone and another holder had the lock, got {result:?}"
    );
    assert!(
        lease_alive(etcd.cluster(), held.lease),
        "the release leaves the runtime's shared lease alone"
    );
    assert_eq!(
        only_holder(etcd.cluster(), key).create_revision,
        second.fence().expect("fence") as i64,
        "the second holder's key is untouched"
    );
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_body_is_cancelled_with_lost_when_the_lease_is_revoked() {
    let etcd = EtcdServer::start();
    let key = "etcd:lost:with-lock";
    let rt = runtime(etcd.cluster()).await;
    let body = LongBody::default();
    let (task, held_rx) = body.spawn(rt.lock(key).lease(LOSS_LEASE));
    held_rx.await.expect("the body runs");
    let held = only_holder(etcd.cluster(), key);
    revoke_lease(etcd.cluster(), held.lease);
    let revoked = Instant::now();
    let result = tokio::time::timeout(LOSS_SEEN_WITHIN, task)
        .await
        .unwrap_or_else(|_| {
            panic!("with_lock must return within {LOSS_SEEN_WITHIN:?} of the lease being revoked")
        })
        .expect("with_lock task");
    println!(
        "with_lock returned {result:?} {:?} after the lease was revoked",
        revoked.elapsed()
    );
    body.assert_cancelled_with_lost("the lease revoked", key, result);
}

/// What etcd makes of the watchdog's leases: a 2 s lease is granted as 2 s, a 1 s lease as 1
/// or 2 s (whole seconds, raised to the server's minimum); over 6 s of renewals the holder keeps
/// the same key, create revision and lease, whose TTL never runs out, and the release removes
/// the key. (Exclusion throughout a short lease: conformance `watchdog_keeps_a_short_lease_alive`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renews_the_granted_lease_and_keeps_the_same_key() {
    let etcd = EtcdServer::start();
    let key = "etcd:watchdog";
    let rt = runtime(etcd.cluster()).await;
    let guard = rt.hold(key, Duration::from_secs(2)).await;
    let held = only_holder(etcd.cluster(), key);
    assert_eq!(granted_ttl(etcd.cluster(), held.lease), Some(2));
    // Whole seconds, and the server's minimum: a 1 s lease (renewed every 333 ms).
    let short_key = "etcd:watchdog:one-second";
    let short = rt.hold(short_key, Duration::from_secs(1)).await;
    let short_granted = granted_ttl(etcd.cluster(), only_holder(etcd.cluster(), short_key).lease);
    println!("lease 1 s: granted TTL {short_granted:?} s (etcd raises it to its minimum)");
    assert!(
        short_granted.is_some_and(|t| (1..=2).contains(&t)),
        "{short_granted:?}"
    );
    let mut ttls = Vec::new();
    while_held(
        &guard,
        Duration::from_secs(6),
        Duration::from_millis(200),
        |at| {
            let kvs = queue(etcd.cluster(), key);
            assert_eq!(
                kvs.first()
                    .map(|kv| (&kv.key, kv.create_revision, kv.lease)),
                Some((&held.key, held.create_revision, held.lease)),
                "the holder's key must stay ({at:?} in)"
            );
            let ttl = blocking(|| etcd.lease_ttl(held.lease));
            assert!(ttl.is_some_and(|t| t > 0), "lease TTL {ttl:?} {at:?} in");
            ttls.extend(ttl);
            std::future::ready(())
        },
    )
    .await;
    println!(
        "held 6 s on a 2 s lease; server TTLs seen {:?}..{:?}",
        ttls.iter().min(),
        ttls.iter().max()
    );
    guard
        .release()
        .await
        .expect("release after 6 s on a 2 s lease");
    assert!(
        queue(etcd.cluster(), key).is_empty(),
        "the release removes the key"
    );
    assert!(!short.is_lost(), "the 1 s lease was lost within 6 s");
    short.release().await.expect("release of the 1 s lease");
}

// ---------------------------------------------------------------------------------------------
// Cluster failover
// ---------------------------------------------------------------------------------------------

/// A 3-member cluster; the leader is killed with SIGKILL while one runtime holds a lock and a
/// second one keeps trying to take it. The hold either survives the election (its key is still
/// there under the new leader and it is not lost) or is reported lost; the second runtime gets
/// the lock only after the first released it or knew it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_leader_killed_during_a_hold_never_lets_two_holders_run() {
    let mut cluster = EtcdCluster::start(3);
    let key = "etcd:failover";
    let lease = Duration::from_secs(3);
    let build = || {
        Runtime::builder()
            .etcd(cluster.endpoints())
            .timeout(Duration::from_secs(1))
            .build()
    };
    let first_rt = build().await.expect("first runtime");
    let second_rt = build().await.expect("second runtime");
    let guard = first_rt.lock(key).lease(lease).held("acquire").await;
    let first_fence = guard.fence().expect("fence");
    let held = only_holder(&cluster, key);
    // `Some(guard)` while the first runtime holds; `None` once its release has begun.
    let first: Arc<Mutex<Option<LockGuard>>> = Arc::new(Mutex::new(Some(guard)));

    let contender = tokio::spawn({
        let first = first.clone();
        async move {
            let start = Instant::now();
            let mut errors = Vec::new();
            loop {
                match second_rt
                    .lock(key)
                    .lease(lease)
                    .wait(Duration::from_secs(2))
                    .acquire()
                    .await
                {
                    Ok(guard) => {
                        // None: released; Some(true): known lost; Some(false): still held.
                        let first_state = first.lock().unwrap().as_ref().map(LockGuard::is_lost);
                        return (guard, Instant::now(), first_state, errors);
                    }
                    Err(err) if err.is_timeout() => {}
                    Err(err) => {
                        errors.push(format!("{:?}: {err}", start.elapsed()));
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                assert!(
                    start.elapsed() < Duration::from_secs(40),
                    "the second runtime never got the lock; {}",
                    summary(&errors)
                );
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!contender.is_finished(), "the second runtime must wait");

    let leader = blocking(|| cluster.leader_index()).expect("a leader");
    blocking(|| cluster.kill9(leader));
    let killed = Instant::now();
    let new_leader = blocking(|| cluster.wait_for_leader(Duration::from_secs(10)));
    let elected = killed.elapsed();
    println!("killed leader {leader}; member {new_leader} leads after {elected:?}");

    // Watch the hold for two more leases: it survives or is reported lost, never both silently.
    let mut key_present_after_election = None;
    while killed.elapsed() < elected + lease * 2 {
        let lost = first
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(LockGuard::is_lost);
        if lost {
            break;
        }
        let kvs = queue(&cluster, key);
        let present = kvs
            .first()
            .is_some_and(|kv| kv.key == held.key && kv.create_revision == held.create_revision);
        key_present_after_election.get_or_insert(present);
        if !present {
            // The key is gone but the holder has not (yet) seen it: it must within a renewal.
            let guard_lost = tokio::time::timeout(lease / 3 + Duration::from_secs(2), async {
                loop {
                    if first
                        .lock()
                        .unwrap()
                        .as_ref()
                        .is_some_and(LockGuard::is_lost)
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(
                guard_lost.is_ok(),
                "the holder's key vanished ({:?}) but the holder did not report the loss",
                names(&kvs)
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let guard = first.lock().unwrap().take().expect("not yet released");
    let outcome = if guard.is_lost() {
        let err = guard.release().await.expect_err("release of a lost hold");
        assert!(err.is_lost(), "{err:?}");
        "reported lost"
    } else {
        assert_eq!(
            key_present_after_election,
            Some(true),
            "a hold not reported lost must keep its key through the election"
        );
        let still = queue(&cluster, key);
        assert_eq!(
            still.first().map(|kv| (&kv.key, kv.create_revision)),
            Some((&held.key, held.create_revision)),
            "the surviving holder's key, {:?} after the kill",
            killed.elapsed()
        );
        // The release may meet the dead member (see the next test); exclusion is what this
        // test is about, so an error here is reported, and the lease then ends the hold.
        if let Err(err) = guard.release().await {
            println!("release of the surviving hold failed: {err}");
            assert!(err.is_backend(), "{err:?}");
        }
        "survived"
    };
    let released = Instant::now();
    println!(
        "the hold {outcome} ({:?} after the leader was killed)",
        killed.elapsed()
    );

    let (second, acquired, first_state, errors) =
        tokio::time::timeout(Duration::from_secs(20), contender)
            .await
            .expect("the second runtime gets the lock after the first one's end")
            .expect("contender task");
    println!(
        "second runtime acquired {:?} after the first one's end; meanwhile {}",
        acquired.saturating_duration_since(released),
        summary(&errors)
    );
    assert_ne!(
        first_state,
        Some(false),
        "the second runtime got the lock while the first still held it (not lost, not released)"
    );
    assert!(second.fence().expect("fence") > first_fence);
    if let Err(err) = second.release().await {
        println!("release by the second runtime failed: {err}");
        assert!(err.is_backend(), "{err:?}");
    }
}

/// With one follower of three killed the cluster keeps its quorum and its leader: a runtime
/// configured with all three endpoints must go on acquiring, renewing and releasing without
/// errors (the client has two healthy members to talk to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_one_follower_killed_keeps_serving_every_lock_operation() {
    const CYCLES: usize = 40;
    /// Enough to show the problem; bounds the test's time when every cycle fails.
    const STOP_AFTER_ERRORS: usize = 5;
    let mut cluster = EtcdCluster::start(3);
    let rt = Runtime::builder()
        .etcd(cluster.endpoints())
        .timeout(Duration::from_secs(1))
        .built()
        .await;
    // Some traffic first, so that connections to every member are live when one dies.
    for _ in 0..6 {
        rt.lock("etcd:warm-up").cycled("warm-up acquire").await;
    }
    let held = rt.hold("etcd:held-across", Duration::from_secs(2)).await;
    let leader = blocking(|| cluster.leader_index()).expect("a leader");
    let follower = (leader + 1) % cluster.len();
    blocking(|| cluster.kill9(follower));
    let killed = Instant::now();

    let mut errors = Vec::new();
    // What blocked the first acquire that timed out on this otherwise free key.
    let mut blocked_by: Option<Vec<String>> = None;
    let mut cycles = 0;
    for i in 0..CYCLES {
        if errors.len() >= STOP_AFTER_ERRORS {
            break;
        }
        cycles += 1;
        match rt
            .lock("etcd:one-dead")
            .wait(Duration::from_millis(500))
            .acquire()
            .await
        {
            Ok(guard) => {
                if let Err(err) = guard.release().await {
                    errors.push(format!("release {i}: {err}"));
                }
            }
            Err(err) => {
                if err.is_timeout() && blocked_by.is_none() {
                    let kvs = queue(&cluster, "etcd:one-dead");
                    blocked_by = Some(
                        kvs.iter()
                            .map(|kv| {
                                let ttl = blocking(|| cluster.lease_ttl(kv.lease));
                                format!("{} (lease TTL left {ttl:?} s)", kv.key)
                            })
                            .collect(),
                    );
                }
                errors.push(format!("acquire {i}: {err}"));
            }
        }
    }
    let cycles_took = killed.elapsed();
    // The 2 s lease, renewed through the two live members, for two leases past the kill.
    tokio::time::sleep_until(tokio::time::Instant::from_std(
        killed + Duration::from_secs(4),
    ))
    .await;
    let lost = held.is_lost();
    println!(
        "follower {follower} killed (leader {leader}): {} of {cycles} lock cycles failed in \
         {cycles_took:?}; 2 s lease held across: lost = {lost}; {}; a timed-out acquire of \
         the free key was queued behind {blocked_by:?}",
        errors.len(),
        summary(&errors)
    );
    assert_eq!(
        blocking(|| cluster.leader_index()),
        Some(leader),
        "killing a follower must not change the leader"
    );
    assert!(
        errors.is_empty(),
        "{} of {cycles} acquire/release cycles failed with one follower of three killed \
         (quorum and leader intact): {}",
        errors.len(),
        summary(&errors)
    );
    assert!(
        !lost,
        "a 2 s lease renewable through two healthy members was reported lost"
    );
    held.release().await.expect("release");
}

// ---------------------------------------------------------------------------------------------
// The etcd 3.4 hazard: a queued waiter whose lease expired
// ---------------------------------------------------------------------------------------------

/// A waiter process frozen (SIGSTOP) in the queue until its lease expires loses its key; when
/// it resumes after the holder left and another waiter took the lock, it must not report the
/// lock acquired (etcd 3.4's own Lock RPC was seen doing exactly that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_frozen_until_its_lease_expired_never_gets_the_lock_beside_the_holder() {
    frozen_waiter(None).await;
}

/// The same, with the waiter frozen between its joining the queue and its first look at who
/// is ahead (its link to the server slowed by 150 ms each way, so that it is stopped while the
/// join's answer travels): when it resumes nobody older is left in line, and it must confirm
/// that its own key and lease are still there rather than take the lock. (A loaded machine
/// sometimes stopped it there without the slow link: the waiter then reported the lock
/// acquired beside its holder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_frozen_before_its_first_look_at_the_queue_never_gets_the_lock_beside_the_holder() {
    frozen_waiter(Some(Duration::from_millis(150))).await;
}

/// The frozen-waiter scenario; the waiter's link to the server delayed by `delay` each way if
/// given.
async fn frozen_waiter(delay: Option<Duration>) {
    let etcd = EtcdServer::start();
    let key = "etcd:frozen-waiter";
    let (a, b) = (runtime(etcd.cluster()).await, runtime(etcd.cluster()).await);
    let guard_a = a.lock(key).held("A acquires").await;
    let proxy = delay.map(|delay| {
        let proxy = dlock_testkit::FaultProxy::to_port(etcd.port());
        proxy.latency(delay, Duration::ZERO);
        proxy
    });
    let url = match &proxy {
        Some(proxy) => format!("etcd://{}", proxy.host()),
        None => etcd.url(),
    };
    let mut frozen = tokio::process::Command::new(dlock_tests::holder_bin())
        .args(["--url", &url, "--key", key, "--mode", "hold"])
        .args(["--lease-ms", "1000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn dlock-holder");
    let queued = wait_for_queue(etcd.cluster(), key, 2, Duration::from_secs(20)).await;
    let p_kv = queued[1].clone();
    let pid = frozen.id().expect("running").to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid}");
    };
    blocking(|| signal("-STOP"));
    let stopped = Instant::now();
    // Its lease (1 s, raised by the server to its minimum) runs out while it is frozen.
    let took = wait_until_key_gone(
        etcd.cluster(),
        key,
        &p_kv,
        Duration::from_secs(8),
        "lease of a frozen waiter",
    )
    .await;
    println!(
        "frozen waiter's key and lease gone {took:?} after SIGSTOP ({:?})",
        stopped.elapsed()
    );

    // B queues behind A and takes the lock when A releases.
    let waiter_b = tokio::spawn(async move {
        b.lock(key)
            .wait(Duration::from_secs(20))
            .held("B acquires")
            .await
    });
    wait_for_queue(etcd.cluster(), key, 2, Duration::from_secs(2)).await;
    guard_a.release().await.expect("A releases");
    let guard_b = tokio::time::timeout(Duration::from_secs(5), waiter_b)
        .await
        .expect("B gets the lock")
        .expect("B's task");
    let b_kv = only_holder(etcd.cluster(), key);
    assert_eq!(
        guard_b.fence().map(|f| f as i64),
        Some(b_kv.create_revision)
    );

    blocking(|| signal("-CONT"));
    // While B holds, the resumed process must not claim the lock: it either fails, or queues
    // again (a fresh key, behind B) and keeps waiting.
    let mut stdout = tokio::io::BufReader::new(frozen.stdout.take().expect("piped stdout")).lines();
    match tokio::time::timeout(Duration::from_secs(3), stdout.next_line()).await {
        Ok(line) => {
            let line = line.expect("read the waiter's stdout");
            assert!(
                !line.as_deref().is_some_and(|l| l.starts_with("acquired")),
                "the resumed waiter reported the lock acquired while B held it: {line:?}"
            );
            let status = tokio::time::timeout(Duration::from_secs(5), frozen.wait())
                .await
                .expect("the waiter exits after closing its stdout")
                .expect("wait for dlock-holder");
            let mut stderr = String::new();
            frozen
                .stderr
                .take()
                .expect("piped stderr")
                .read_to_string(&mut stderr)
                .await
                .expect("read stderr");
            println!("the resumed waiter gave up: {status}, stdout {line:?}, stderr {stderr:?}");
            assert!(!status.success(), "{status}");
            assert!(!guard_b.is_lost());
            assert_eq!(only_holder(etcd.cluster(), key).key, b_kv.key);
            guard_b.release().await.expect("B releases");
        }
        Err(_) => {
            let kvs = queue(etcd.cluster(), key);
            assert_eq!(
                kvs.len(),
                2,
                "B and the resumed waiter's new key: {:?}",
                names(&kvs)
            );
            assert_eq!(kvs[0].key, b_kv.key, "B stays first in line");
            assert_ne!(kvs[1].key, p_kv.key, "the expired key is not back");
            let requeued = kvs[1].clone();
            assert!(!guard_b.is_lost());
            let released = Instant::now();
            guard_b.release().await.expect("B releases");
            let line = tokio::time::timeout(Duration::from_secs(5), stdout.next_line())
                .await
                .expect("the re-queued waiter gets the lock after B released")
                .expect("read the waiter's stdout");
            println!(
                "the resumed waiter queued again behind B and printed {line:?} {:?} after B \
                 released",
                released.elapsed()
            );
            assert_eq!(
                line,
                Some(format!("acquired {}", requeued.create_revision)),
                "the re-queued waiter's fence is its new key's create revision"
            );
            frozen.start_kill().expect("kill dlock-holder");
            let _ = frozen.wait().await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bad endpoints and URLs
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoints_are_backend_errors_within_the_timeout() {
    let timeout = Duration::from_secs(1);
    let bound = Duration::from_secs(3);

    // Nothing listens on port 1.
    let start = Instant::now();
    let err = Runtime::builder()
        .etcd(["http://127.0.0.1:1"])
        .timeout(timeout)
        .build()
        .await
        .expect_err("nothing listens on 127.0.0.1:1");
    let took = start.elapsed();
    println!("builder on 127.0.0.1:1: {took:?}: {err}");
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    assert!(took < bound, "took {took:?}");

    let start = Instant::now();
    let err = Runtime::from_url("etcd://127.0.0.1:1?timeout=1s")
        .await
        .expect_err("nothing listens on 127.0.0.1:1");
    let took = start.elapsed();
    println!("etcd://127.0.0.1:1?timeout=1s: {took:?}: {err}");
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    assert!(took < bound, "took {took:?}");

    // A frozen server accepts connections but never answers.
    let mut etcd = EtcdServer::start();
    let rt = Runtime::builder()
        .etcd(etcd.endpoints())
        .timeout(timeout)
        .built()
        .await;
    blocking(|| etcd.pause());
    let start = Instant::now();
    let err = Runtime::builder()
        .etcd(etcd.endpoints())
        .timeout(timeout)
        .build()
        .await
        .expect_err("a frozen server");
    let took = start.elapsed();
    println!("builder on a frozen server: {took:?}: {err}");
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    assert!(took < bound, "took {took:?}");
    // A runtime built before the freeze: acquiring is a Backend error, not a hang, and the
    // body never runs.
    let lock = rt.lock("etcd:frozen").wait(Duration::from_millis(500));
    let (err, took) = lock
        .body_refused(Duration::from_secs(10), "with_lock on a frozen server")
        .await;
    assert!(err.is_backend(), "expected Backend, got {err:?}");
    assert!(took < bound, "took {took:?}");
    // Eight at once, with a lease whose shared lease is not granted yet: each fails within
    // its own bound, not one timeout after another behind the first grant.
    let start = Instant::now();
    let tries: Vec<_> = (0..8)
        .map(|i| {
            let rt = rt.clone();
            tokio::spawn(async move {
                rt.lock(format!("etcd:frozen:{i}"))
                    .lease(Duration::from_secs(7))
                    .acquire()
                    .await
                    .map(drop)
            })
        })
        .collect();
    for t in tries {
        let err = t.await.expect("task").expect_err("a frozen server");
        assert!(err.is_backend(), "expected Backend, got {err:?}");
    }
    let took = start.elapsed();
    println!("8 acquisitions at once on a frozen server: all failed in {took:?}");
    assert!(took < bound, "took {took:?}");
    blocking(|| etcd.resume());
}

/// Range requests the member at `endpoint` (`http://127.0.0.1:<port>`) has served so far,
/// from its `/metrics` (`grpc_server_handled_total` of `Range`).
async fn ranges_served(endpoint: &str) -> u64 {
    calls(endpoint, "grpc_server_handled_total", &["Range"]).await
}

/// The server's count `metric` (from `/metrics`) summed over the gRPC methods `methods`.
async fn calls(endpoint: &str, metric: &str, methods: &[&str]) -> u64 {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client");
    let body = client
        .get(format!("{endpoint}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("GET /metrics")
        .text()
        .await
        .expect("read /metrics");
    body.lines()
        .filter(|l| {
            l.starts_with(&format!("{metric}{{"))
                && methods
                    .iter()
                    .any(|m| l.contains(&format!("grpc_method=\"{m}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

/// An uncontended acquisition is one transaction (put the key, read the head of the queue)
/// and a release one delete: two requests per pair, no lease grant or revoke (the runtime's
/// shared lease is granted once), no separate lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_are_one_request_each() {
    const PAIRS: u64 = 20;
    let etcd = EtcdServer::start();
    let rt = runtime(&etcd).await;
    let key = "etcd:requests";
    // The first lock of a TTL grants the shared lease.
    rt.lock(key).cycled("warm-up").await;
    let endpoint = etcd.endpoint();
    let methods = [
        "Range",
        "Put",
        "DeleteRange",
        "Txn",
        "LeaseGrant",
        "LeaseRevoke",
        "LeaseTimeToLive",
    ];
    let before = calls(&endpoint, "grpc_server_started_total", &methods).await;
    for _ in 0..PAIRS {
        rt.lock(key).cycled("acquire and release").await;
    }
    let used = calls(&endpoint, "grpc_server_started_total", &methods).await - before;
    println!("{PAIRS} uncontended pairs: {used} requests");
    assert_eq!(
        used,
        2 * PAIRS,
        "an uncontended acquire + release must be two requests (a transaction and a delete)"
    );
}

/// The waiter right behind the holder takes the lock on the deletion event and one
/// confirmation (its key and its lease, read at once): it does not look up the queue again,
/// one read fewer per hand-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_behind_the_holder_acquires_on_the_deletion_event() {
    let etcd = EtcdServer::start();
    let rt = runtime(&etcd).await;
    let other = runtime(&etcd).await;
    let key = "etcd:handoff:event";
    let endpoint = etcd.endpoint();
    let mut counts = Vec::new();
    for round in 0..3 {
        let holder = rt.lock(key).held("holder").await;
        let waiter = other.lock(key).wait(Duration::from_secs(20)).spawn();
        wait_for_queue(&etcd, key, 2, Duration::from_secs(5)).await;
        // Past the waiter's lookup and its watch on the holder's key.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = ranges_served(&endpoint).await;
        holder.release().await.expect("release");
        let (guard, _) = waiter_got_it(waiter, Duration::from_secs(5), "released").await;
        let ranges = ranges_served(&endpoint).await - before;
        println!("round {round}: {ranges} range reads from the release to the next holder");
        counts.push(ranges);
        guard.release().await.expect("release by the waiter");
    }
    // The holder's release is a delete; the next holder's confirmation reads its own key.
    // Looking the queue up again would be a second read.
    assert!(
        counts.iter().all(|&n| n <= 1),
        "a hand-off looked the queue up again: {counts:?} range reads"
    );
}

// ---------------------------------------------------------------------------------------------
// Hand-over to the next waiter of the same runtime
// ---------------------------------------------------------------------------------------------

/// The waiter of the same runtime right behind the holder takes the lock when the holder
/// releases, without waiting for etcd: it holds while the server is frozen (SIGSTOP), before
/// the holder's delete could commit, with a fence above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_of_the_same_runtime_takes_the_lock_without_waiting_for_etcd() {
    let mut etcd = EtcdServer::start();
    let key = "etcd:handover:frozen";
    let rt = runtime(etcd.cluster()).await;
    let holder = rt.lock(key).held("holder").await;
    let waiter = rt.lock(key).wait(Duration::from_secs(30)).spawn();
    let queued = wait_for_queue(etcd.cluster(), key, 2, Duration::from_secs(5)).await;
    // Past the waiter's lookup and its watch on the holder's key.
    tokio::time::sleep(Duration::from_millis(300)).await;

    blocking(|| etcd.pause());
    let holder_fence = holder.fence();
    let release = tokio::spawn(holder.release());
    let (guard, _) = waiter_got_it(
        waiter,
        Duration::from_secs(1),
        "the waiter of the same runtime, etcd frozen",
    )
    .await;
    assert!(
        guard.fence() > holder_fence,
        "fences increase across the hand-over: {holder_fence:?} then {:?}",
        guard.fence()
    );
    assert_eq!(
        guard.fence().map(|f| f as i64),
        Some(queued[1].create_revision),
        "the fence is the waiter's own create revision"
    );
    assert!(!guard.is_lost() && guard.valid_for() > Duration::ZERO);
    blocking(|| etcd.resume());

    // The holder's delete lands (now or in the background after its timeout), the waiter's
    // hold goes on, and its release leaves nothing behind.
    let _ = release.await.expect("the holder's release task");
    wait_until_key_gone(
        etcd.cluster(),
        key,
        &queued[0],
        Duration::from_secs(5),
        "the holder's key after the server resumed",
    )
    .await;
    assert!(!guard.is_lost(), "the handed hold is kept");
    guard.release().await.expect("the new holder releases");
    assert!(queue(etcd.cluster(), key).is_empty());
}

/// The etcd server of a test, as the shared hand-over checks need it.
struct Etcd(EtcdServer);

impl QueueEngine for Etcd {
    async fn runtime(&self) -> Runtime {
        runtime(self.0.cluster()).await
    }

    async fn queue_len(&self, key: &str, len: usize) {
        wait_for_queue(self.0.cluster(), key, len, Duration::from_secs(5)).await;
    }
}

/// See [`handover::keep_the_queue_order_across_runtimes`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_overs_keep_the_queue_order_across_runtimes() {
    let etcd = Etcd(EtcdServer::start());
    handover::keep_the_queue_order_across_runtimes(&etcd, "etcd:handover:fifo").await;
}

/// See [`handover::a_cancelled_local_waiter_leaves_no_hold_behind`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiter_cancelled_as_the_holder_releases_leaves_no_hold_behind() {
    let etcd = Etcd(EtcdServer::start());
    handover::a_cancelled_local_waiter_leaves_no_hold_behind(&etcd, "etcd:handover:cancelled")
        .await;
}

/// See [`handover::a_hot_key_hand_over_is_far_below_a_write`]: an uncontended pair is a put in
/// a transaction and a delete, two consensus writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_hand_over_within_a_runtime_is_far_below_a_write() {
    let etcd = Etcd(EtcdServer::start());
    handover::a_hot_key_hand_over_is_far_below_a_write(
        &etcd,
        "etcd:handover:hot",
        "etcd:handover:raw",
    )
    .await;
}
