//! What is particular to the ZooKeeper backend, end to end on a real standalone server per test
//! (tickTime 200 ms, so session timeouts from 400 ms to 60 s are granted): exclusion across OS
//! processes, FIFO hand-off in the queue of ephemeral sequential nodes, a killed or stopped
//! holder freed after about its session timeout, session expiry, renewal without a new node,
//! keys that need escaping, and an unreachable or paused server. The behaviours every engine
//! shares are in the conformance suite (`tests/conformance/`).
//!
//! The queue is inspected with the server's `dump` four-letter word (ephemeral nodes per
//! session) rather than a raw client: `/dlock/<escaped key>/lock-<sequence>`.
//!
//! Timing bounds are generous: the box has two cores shared by the JVM, the tests and the
//! holder processes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::testing::zookeeper_segment;
use dlock_runtime::{LockError, with_lock};
use dlock_tests::handover::{self, QueueEngine};
use dlock_tests::zookeeper::ZooKeeperServer;
use dlock_tests::{
    AcquireExt, BuildExt, Counting, HoldExt, HolderProcess, LockGuard, RedisServer, Runtime,
    assert_between, assert_busy, count_in_processes, eventually, finish_within,
    hold_fenced_in_process, hold_in_process, waiter_got_it, while_held,
};

/// Bound on anything that should happen "at once" (a hand-off, a background release).
const PROMPTLY: Duration = Duration::from_millis(1500);

/// A runtime on `zk` with the given session timeout (everything else default).
async fn zk_runtime(zk: &ZooKeeperServer, session_timeout: Duration) -> Runtime {
    Runtime::builder()
        .zookeeper(zk.connect_string())
        .session_timeout(session_timeout)
        .built()
        .await
}

/// A runtime with the default 10 s session timeout.
async fn runtime(zk: &ZooKeeperServer) -> Runtime {
    zk_runtime(zk, Duration::from_secs(10)).await
}

/// The queue of `key` (its `lock-<owner>-<sequence>` nodes), lowest sequence first.
fn queue_of(zk: &ZooKeeperServer, key: &str) -> Vec<String> {
    let parent = format!("/dlock/{}/", zookeeper_segment(key));
    let mut nodes: Vec<String> = zk
        .ephemeral_nodes()
        .into_iter()
        .filter(|n| n.starts_with(&parent))
        .collect();
    nodes.sort_by_key(|n| {
        n.rsplit('-')
            .next()
            .and_then(|seq| seq.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    nodes
}

/// Waits until the queue of `key` has `len` nodes; returns it.
async fn queue_len(zk: &ZooKeeperServer, key: &str, len: usize, within: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        let queue = queue_of(zk, key);
        if queue.len() == len {
            return queue;
        }
        assert!(
            start.elapsed() < within,
            "queue of {key:?} has {} nodes, not {len}, after {within:?}: {queue:?}",
            queue.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A runtime on `zk`, and a `dlock-holder` process holding `key` on its own session of
/// `session_timeout` (with its fence).
async fn holder_process_on_session(
    zk: &ZooKeeperServer,
    key: &str,
    session_timeout: &str,
) -> (Runtime, HolderProcess, u64) {
    let rt = runtime(zk).await;
    let url = format!("{}?session_timeout={session_timeout}", zk.url());
    let (holder, fence) = hold_fenced_in_process(&url, key, 2000).await;
    (rt, holder, fence)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_across_three_processes_exact_counter() {
    const RUNS: (u64, u64) = (3, 20);
    let (zk, store) = (ZooKeeperServer::start(), RedisServer::start());
    let start = Instant::now();
    let (url, key) = (zk.url(), "zk:exclusion:processes");
    let total = count_in_processes(Counting::Guard, &url, &store, key, RUNS).await;
    println!("{RUNS:?} processes x increments in {:?}", start.elapsed());
    assert_eq!(total, RUNS.0 * RUNS.1, "lost increments: no exclusion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_acquire_in_arrival_order() {
    let zk = ZooKeeperServer::start();
    let holder_rt = runtime(&zk).await;
    let key = "zk:fifo";
    let holder = holder_rt.lock(key).held("holder").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3usize {
        let rt = runtime(&zk).await;
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = rt
                .lock(key)
                .wait(Duration::from_secs(20))
                .held("waiter acquires")
                .await;
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.expect("waiter release");
        }));
        // Arrival: the waiter's node is in the queue before the next one starts.
        queue_len(&zk, key, i + 2, Duration::from_secs(5)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    holder.release().await.expect("holder release");
    finish_within(waiters, Duration::from_secs(10)).await;
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2], "FIFO order");
    assert!(queue_of(&zk, key).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_frees_the_key_after_the_session_timeout() {
    let zk = ZooKeeperServer::start();
    let key = "zk:kill9";
    let (rt, mut holder, holder_fence) = holder_process_on_session(&zk, key, "2s").await;
    assert_busy(&rt, key, "while the holder process lives").await;
    holder.kill9().await;
    let bounds = Duration::from_secs(1)..=Duration::from_secs(8);
    let what = "free after kill -9 with a 2 s session";
    let guard = rt.lock(key).held_between(bounds, what).await;
    assert!(guard.fence().expect("fence") > holder_fence);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_holder_process_loses_its_session_and_another_acquires() {
    let zk = ZooKeeperServer::start();
    let key = "zk:sigstop";
    let (rt, mut holder, holder_fence) = holder_process_on_session(&zk, key, "1s").await;
    let rt2 = rt.clone();
    let waiter = tokio::spawn(async move {
        let guard = rt2
            .lock(key)
            .wait(Duration::from_secs(20))
            .held("acquire once the stopped holder's session expired")
            .await;
        (Instant::now(), guard)
    });
    queue_len(&zk, key, 2, Duration::from_secs(5)).await;
    holder.pause();
    let stopped = Instant::now();
    let (acquired_at, guard) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the session of a stopped holder expires")
        .expect("waiter task");
    let after = acquired_at.duration_since(stopped);
    println!("SIGSTOP holder (session timeout 1 s): another runtime acquired after {after:?}");
    assert_between(
        "acquired after SIGSTOP",
        after,
        Duration::from_millis(500),
        Duration::from_secs(5),
    );
    assert!(guard.fence().expect("fence") > holder_fence);
    // Keep it stopped past the expiry, then let it run: it must learn it lost the lock.
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(stopped.elapsed())).await;
    holder.resume();
    let resumed = Instant::now();
    let line = holder.next_line(Duration::from_secs(10)).await;
    println!(
        "holder after SIGCONT: {line:?} after {:?}",
        resumed.elapsed()
    );
    assert_eq!(line, "lost");
    let status = holder.wait(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(3), "{status}");
    assert_busy(&runtime(&zk).await, key, "the new holder keeps it").await;
    guard.release().await.expect("release by the new holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_expires_the_session_lost_fires_and_a_new_session_acquires() {
    // The client gives the session up after 7/5 of its timeout without an answer; the server,
    // once resumed, expires it too (nobody pinged). Everything observed is checked at the end so
    // that one failure does not hide the next step.
    let mut zk = ZooKeeperServer::start();
    let session = Duration::from_secs(1);
    let rt = zk_runtime(&zk, session).await;
    // A runtime that holds nothing while its session expires.
    let idle = zk_runtime(&zk, session).await;
    let key = "zk:session-expiry";
    let guard = rt.hold(key, Duration::from_secs(2)).await;
    let mut problems = Vec::new();
    zk.pause();
    let paused = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    let lost_after = paused.elapsed();
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(paused.elapsed())).await;
    zk.resume();
    let resumed = Instant::now();
    println!(
        "server paused 3 s: lost() after {lost_after:?} (resolved: {})",
        lost.is_ok()
    );
    if lost.is_err() || lost_after > Duration::from_millis(2500) {
        problems.push(format!(
            "lost() not resolved within 2.5 s of the pause ({lost_after:?})"
        ));
    }
    // The old session's node goes away once the server runs again.
    let other = runtime(&zk).await;
    let took = eventually(Duration::from_secs(5), "old session's node removed", || {
        let queue = queue_of(&zk, key);
        async move { queue.is_empty() }
    })
    .await;
    println!("old node gone {took:?} after resume");
    let released = guard.release().await;
    println!("release after the loss: {released:?}");
    if !matches!(released, Err(LockError::Lost { .. })) {
        problems.push(format!(
            "release of a guard whose lost() resolved: expected Err(Lost), got {released:?}"
        ));
    }
    // The same runtime works again on a new session: the next acquire (with a wait budget)
    // succeeds.
    let first = first_acquire_after_expiry(&rt, key, "", &mut problems).await;
    println!("({:?} after resume)", resumed.elapsed());
    if let Some(guard) = first {
        assert_busy(&other, key, "held on the new session").await;
        guard.release().await.expect("release on the new session");
    }
    // The idle runtime's first acquire after its session expired (nothing triggered a
    // reconnect before it): a wait budget must cover the switch to a new session.
    let idle_key = "zk:session-expiry:idle";
    let who = "idle runtime, ";
    if let Some(guard) = first_acquire_after_expiry(&idle, idle_key, who, &mut problems).await {
        guard.release().await.expect("release");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The first acquire of `key` on `rt` (`who`: which runtime, as a prefix of the messages) after
/// its session expired, waiting up to 5 s: returns the guard if it got it; else records the
/// failure in `problems`, tries once more (releasing at once, or recording that failure too)
/// and returns `None`.
async fn first_acquire_after_expiry(
    rt: &Runtime,
    key: &str,
    who: &str,
    problems: &mut Vec<String>,
) -> Option<LockGuard> {
    let start = Instant::now();
    let first = rt.lock(key).wait(Duration::from_secs(5)).acquire().await;
    println!(
        "{who}first acquire after the expiry: {:?} after {:?}",
        first.as_ref().map(|g| g.fence()),
        start.elapsed()
    );
    let e = match first {
        Ok(guard) => return Some(guard),
        Err(e) => e,
    };
    problems.push(format!(
        "{who}first acquire (wait 5 s) after its session expired: {e:?}"
    ));
    let retry = rt.lock(key).wait(Duration::from_secs(5)).acquire().await;
    println!(
        "{who}second acquire: {:?}",
        retry.as_ref().map(|g| g.fence())
    );
    match retry {
        Ok(guard) => guard.release().await.expect("release"),
        Err(e) => problems.push(format!("{who}second acquire: {e:?}")),
    }
    None
}

/// The watchdog renews a 2 s lease (session 5 s) for 6 s without touching the node: the same
/// queue node holds throughout. (Exclusion throughout a short lease: conformance
/// `watchdog_keeps_a_short_lease_alive`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_the_same_node_through_renewals() {
    let zk = ZooKeeperServer::start();
    let rt = zk_runtime(&zk, Duration::from_secs(5)).await;
    let key = "zk:watchdog";
    let guard = rt.hold(key, Duration::from_secs(2)).await;
    let node = queue_len(&zk, key, 1, PROMPTLY).await;
    while_held(
        &guard,
        Duration::from_secs(6),
        Duration::from_millis(250),
        |_| {
            assert_eq!(queue_of(&zk, key), node, "same node throughout");
            std::future::ready(())
        },
    )
    .await;
    assert!(guard.valid_for() > Duration::ZERO);
    guard
        .release()
        .await
        .expect("release after 6 s on a 2 s lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_longer_than_the_session_timeout_is_kept_while_healthy() {
    // The runtime counts on at most the session timeout whatever the lease; with the default
    // 30 s lease and a 2 s session the holder must still be renewed in time, not declared lost.
    let zk = ZooKeeperServer::start();
    let rt = zk_runtime(&zk, Duration::from_secs(2)).await;
    let other = runtime(&zk).await;
    let key = "zk:long-lease";
    let guard = rt.lock(key).held("acquire").await;
    let start = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    assert!(
        lost.is_err(),
        "a healthy holder (lease 30 s, session 2 s) was declared lost after {:?}",
        start.elapsed()
    );
    assert_busy(&other, key, "still held").await;
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_needing_escapes_are_one_segment_and_exclude_only_when_equal() {
    let zk = ZooKeeperServer::start();
    let (rt1, rt2) = (runtime(&zk).await, runtime(&zk).await);
    let keys = [
        "a/b",
        "a%2Fb",
        "a%b",
        "100%",
        "/",
        "//",
        ".",
        "..",
        "with space",
        "a b/c%d",
        "ключ",
        "鍵",
        "🔒 lock",
        "tab\there",
    ];
    let mut failures = Vec::new();
    let mut guards = Vec::new();
    // All held at once by rt1: distinct keys never exclude each other.
    for key in keys {
        match rt1.lock(key).acquire().await {
            Ok(guard) => guards.push(guard),
            Err(e) => failures.push(format!("{key:?}: acquire failed: {e:?}")),
        }
    }
    let nodes = zk.ephemeral_nodes();
    for guard in &guards {
        let key = guard.key();
        let parent = format!("/dlock/{}/", zookeeper_segment(key));
        let mine: Vec<_> = nodes.iter().filter(|n| n.starts_with(&parent)).collect();
        if mine.len() != 1 {
            failures.push(format!("{key:?}: nodes {mine:?}"));
        }
        for node in mine {
            let segments: Vec<_> = node.trim_start_matches('/').split('/').collect();
            if segments.len() != 3 || !segments[2].starts_with("lock-") {
                failures.push(format!(
                    "{key:?}: node {node:?} is not /dlock/<one segment>/lock-N"
                ));
            }
        }
        // Equal keys exclude.
        match rt2.lock(key).acquire().await {
            Err(e) if e.is_timeout() => {}
            other => failures.push(format!(
                "{key:?}: second owner got {:?}",
                other.map(|g| g.key().to_owned())
            )),
        }
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
    for key in keys {
        if let Err(e) = rt2.lock(key).acquire().await.map(drop) {
            failures.push(format!("{key:?}: not free after release: {e:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_key_leaves_no_node_and_can_be_taken_again() {
    let zk = ZooKeeperServer::start();
    let (rt1, rt2) = (runtime(&zk).await, runtime(&zk).await);
    let node_count = || -> u64 {
        let srvr = zk.srvr();
        srvr.lines()
            .find_map(|l| l.strip_prefix("Node count: "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no node count in {srvr}"))
    };
    let before = node_count();
    for i in 0..10 {
        let key = format!("zk:cleanup:{i}");
        rt1.lock(key.as_str()).cycled("acquire").await;
        assert!(queue_of(&zk, &key).is_empty());
        assert!(!rt2.is_locked(&key).await.expect("is_locked"));
        rt2.lock(key.as_str()).cycled("re-acquire").await;
    }
    // The container parents stay until the server's container manager runs (every minute by
    // default): observed, not asserted.
    println!(
        "node count before {before}, after 10 keys released {}",
        node_count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquires_leave_no_node_behind() {
    // Acquisitions aborted at random points (while the container, the node or the queue
    // lookup is in flight) must leave nothing in the queue: the owner token is chosen before
    // the request, so the compensating release can always find what was created.
    let zk = ZooKeeperServer::start();
    let (rt1, rt2) = (runtime(&zk).await, runtime(&zk).await);
    let key = "zk:cancel-race";
    let mut rng = dlock_tests::Rng::from_clock();
    let (attempts, mut completed) = (200, 0);
    for _ in 0..attempts {
        let rt = rt1.clone();
        let task = tokio::spawn(async move { rt.lock(key).acquire().await.map(drop) });
        tokio::time::sleep(Duration::from_micros(rng.below(4000))).await;
        task.abort();
        if let Ok(Ok(())) = task.await {
            completed += 1;
        }
    }
    // Background releases settle within milliseconds; give them a generous while.
    let settle = Instant::now();
    while !queue_of(&zk, key).is_empty() && settle.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let queue = queue_of(&zk, key);
    println!(
        "{attempts} aborted acquisitions ({completed} completed first): {} nodes left {queue:?}",
        queue.len()
    );
    let free = rt2.lock(key).acquire().await.map(drop);
    assert!(
        queue.is_empty() && free.is_ok(),
        "{} phantom nodes of a live session block the key ({free:?}): {queue:?}",
        queue.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_is_a_backend_error() {
    let start = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(5),
        Runtime::builder()
            .zookeeper("127.0.0.1:1")
            .timeout(Duration::from_secs(1))
            .build(),
    )
    .await
    .expect("must not hang")
    .expect_err("nothing listening");
    println!("127.0.0.1:1: {err} after {:?}", start.elapsed());
    assert!(
        err.is_backend(),
        "nothing listening: expected Backend, got {err:?}"
    );
    let err = Runtime::from_url("zk://127.0.0.1:1?timeout=1s")
        .await
        .expect_err("nothing listening");
    assert!(
        err.is_backend(),
        "zk://127.0.0.1:1: expected Backend, got {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_is_a_backend_error_within_the_timeout() {
    // Accepts connections (the kernel does) but never answers.
    let mut zk = ZooKeeperServer::start();
    let rt = Runtime::builder()
        .zookeeper(zk.connect_string())
        .timeout(Duration::from_secs(1))
        .built()
        .await;
    zk.pause();
    let start = Instant::now();
    let built = tokio::time::timeout(
        Duration::from_secs(10),
        Runtime::builder()
            .zookeeper(zk.connect_string())
            .timeout(Duration::from_secs(1))
            .build(),
    )
    .await;
    let connect_took = start.elapsed();
    let start = Instant::now();
    let body_ran = AtomicBool::new(false);
    let acquired = tokio::time::timeout(
        Duration::from_secs(10),
        with_lock(rt.lock("zk:paused"), async {
            body_ran.store(true, Ordering::SeqCst);
        }),
    )
    .await;
    let acquire_took = start.elapsed();
    zk.resume();
    let mut problems = Vec::new();
    refused_while_paused("connect", built, connect_took, &mut problems);
    refused_while_paused("acquire", acquired, acquire_took, &mut problems);
    assert!(
        !body_ran.load(Ordering::SeqCst),
        "the body ran without the lock"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Records in `problems` what is wrong with `what` (a connect, an acquire) against a paused
/// server, from its `outcome` (`Err` if it hung for 10 s) and how long it `took`: it must fail,
/// with `Backend`, within 3 s.
fn refused_while_paused<T>(
    what: &str,
    outcome: Result<Result<T, LockError>, tokio::time::error::Elapsed>,
    took: Duration,
    problems: &mut Vec<String>,
) {
    match outcome {
        Err(_) => problems.push(format!("{what} on a paused server hung for 10 s")),
        Ok(Ok(_)) => problems.push(format!("{what} on a paused server succeeded")),
        Ok(Err(err)) => {
            println!("paused server: {what} {err:?} after {took:?}");
            if !err.is_backend() {
                problems.push(format!("{what}: expected Backend, got {err:?}"));
            }
            if took > Duration::from_secs(3) {
                problems.push(format!("{what} took {took:?}"));
            }
        }
    }
}

/// What the test servers with a clamped session grant (their `maxSessionTimeout`), while the
/// runtimes ask for [`REQUESTED_SESSION`].
const NEGOTIATED_SESSION: Duration = Duration::from_secs(2);

/// The session timeout the clamped tests ask for (the default).
const REQUESTED_SESSION: Duration = Duration::from_secs(10);

/// Slack on "no later than the negotiated session" bounds: scheduling on a loaded box.
const SCHEDULING_SLACK: Duration = Duration::from_millis(700);

/// A server that grants sessions of at most [`NEGOTIATED_SESSION`].
fn clamping_server() -> ZooKeeperServer {
    ZooKeeperServer::start_with_max_session_timeout(NEGOTIATED_SESSION)
}

/// Regression (reliability issue, item 3): the runtime counted on the *requested* session
/// timeout although the server had granted less, so a holder cut off from the server believed
/// in its lock for up to the requested timeout after the server had expired its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_never_exceeds_the_negotiated_session_and_a_paused_server_loses_it_in_time() {
    let mut zk = clamping_server();
    let rt = zk_runtime(&zk, REQUESTED_SESSION).await;
    let key = "zk:negotiated:paused-server";
    let guard = rt.hold(key, Duration::from_secs(30)).await;
    let mut highest = Duration::ZERO;
    while_held(
        &guard,
        Duration::from_secs(3),
        Duration::from_millis(50),
        |_| {
            highest = highest.max(guard.valid_for());
            std::future::ready(())
        },
    )
    .await;
    println!(
        "requested {REQUESTED_SESSION:?}, server max {NEGOTIATED_SESSION:?}: highest valid_for {highest:?}"
    );
    assert!(
        highest <= NEGOTIATED_SESSION,
        "valid_for() reached {highest:?}: more than the negotiated session timeout \
         ({NEGOTIATED_SESSION:?}; {REQUESTED_SESSION:?} requested)"
    );
    zk.pause();
    let paused = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(15), guard.lost()).await;
    let lost_after = paused.elapsed();
    zk.resume();
    assert!(
        lost.is_ok(),
        "lost() did not resolve within 15 s of the pause"
    );
    println!("server paused: lost() after {lost_after:?}");
    assert!(
        lost_after <= NEGOTIATED_SESSION + SCHEDULING_SLACK,
        "lost() {lost_after:?} after the pause: later than the negotiated session timeout \
         ({NEGOTIATED_SESSION:?})"
    );
}

/// A holder process frozen past its negotiated session (SIGSTOP): the server expires the
/// session and another runtime takes the key; once resumed, the holder must not count on its
/// lock for a moment (its `valid_for()` is zero from the first instant it runs again), and
/// it reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_holder_counts_on_no_more_than_the_negotiated_session() {
    let zk = clamping_server();
    let key = "zk:negotiated:sigstop";
    let url = format!(
        "{}?session_timeout={}s",
        zk.url(),
        REQUESTED_SESSION.as_secs()
    );
    let (mut holder, fence) = hold_in_process(&url, key, 30_000, &["--report-ms", "50"]).await;
    let holder_fence = fence.expect("a fence");
    // valid <ms> <unix ms>
    let parse = |line: &str| -> Option<(u64, u128)> {
        let mut words = line.strip_prefix("valid ")?.split(' ');
        Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
    };
    let mut highest = 0;
    for _ in 0..40 {
        let line = holder.next_line(Duration::from_secs(5)).await;
        let (ms, _) = parse(&line).unwrap_or_else(|| panic!("unexpected line {line:?}"));
        highest = highest.max(ms);
    }
    println!("holder's highest valid_for while healthy: {highest} ms");
    let rt = runtime(&zk).await;
    let waiter = rt.lock(key).wait(Duration::from_secs(20)).spawn();
    queue_len(&zk, key, 2, Duration::from_secs(5)).await;
    holder.pause();
    let stopped = Instant::now();
    let (guard, came) = waiter_got_it(
        waiter,
        Duration::from_secs(15),
        "the stopped holder's session expires",
    )
    .await;
    println!(
        "holder stopped: the server expired its session and another runtime acquired after {:?}",
        came.duration_since(stopped)
    );
    assert!(guard.fence().expect("fence") > holder_fence);
    // Resume it well within what it asked for (10 s) but after what it was granted (2 s).
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(stopped.elapsed())).await;
    let resumed_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis();
    holder.resume();
    let mut after_resume = Vec::new();
    loop {
        let line = holder.next_line(Duration::from_secs(10)).await;
        if line == "lost" {
            break;
        }
        let (ms, at) = parse(&line).unwrap_or_else(|| panic!("unexpected line {line:?}"));
        if at >= resumed_unix {
            after_resume.push(ms);
        } else {
            highest = highest.max(ms);
        }
    }
    let status = holder.wait(Duration::from_secs(10)).await;
    println!("holder's valid_for reports after SIGCONT (ms): {after_resume:?}; then lost");
    assert_eq!(status.code(), Some(3), "{status}");
    assert!(
        highest <= NEGOTIATED_SESSION.as_millis() as u64,
        "the holder counted on {highest} ms: more than the negotiated session ({NEGOTIATED_SESSION:?})"
    );
    assert!(
        after_resume.iter().all(|&ms| ms == 0),
        "after its session expired the resumed holder still counted on its lock: {after_resume:?} ms"
    );
    assert_busy(&runtime(&zk).await, key, "the new holder keeps it").await;
    guard.release().await.expect("release by the new holder");
}

/// A waiter queued for longer than the session timeout keeps the lock it gets: its session is
/// alive (it was just used), whatever the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_queued_longer_than_the_session_keeps_the_lock() {
    let zk = clamping_server();
    let rt = zk_runtime(&zk, REQUESTED_SESSION).await;
    let other = zk_runtime(&zk, REQUESTED_SESSION).await;
    let key = "zk:negotiated:long-queue";
    let holder = rt.hold(key, Duration::from_secs(30)).await;
    let waiter = other.lock(key).wait(Duration::from_secs(20)).spawn();
    queue_len(&zk, key, 2, Duration::from_secs(5)).await;
    tokio::time::sleep(NEGOTIATED_SESSION * 2).await;
    holder.release().await.expect("release");
    let (guard, _) = waiter_got_it(waiter, PROMPTLY, "released").await;
    let lost = tokio::time::timeout(NEGOTIATED_SESSION * 2, guard.lost()).await;
    assert!(
        lost.is_err(),
        "a waiter that queued {:?} lost the lock it just got",
        NEGOTIATED_SESSION * 2
    );
    assert_busy(&rt, key, "the waiter holds it").await;
    guard.release().await.expect("release");
}

/// Regression (found by the torture program): a server down for longer than the client waits
/// for it (1.4 × the session timeout) restores the session from its log when it starts again.
/// The client had given up on that session and opened a new one, so the old session's node
/// kept the key locked, although its holder released, until the server expired the session: a
/// whole session timeout after the restart. The client now resumes the session the server
/// kept, and the release deletes the node at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_cut_off_longer_than_the_client_waits_frees_the_key_at_once_after_a_restart() {
    const SESSION: Duration = Duration::from_secs(6);
    let mut zk = ZooKeeperServer::start();
    let rt = zk_runtime(&zk, SESSION).await;
    let key = "zk:restart:resume";
    let guard = rt.hold(key, Duration::from_secs(30)).await;
    zk.kill9();
    let killed = Instant::now();
    let lost = tokio::time::timeout(SESSION + Duration::from_secs(5), guard.lost()).await;
    assert!(
        lost.is_ok(),
        "lost() did not resolve while the server was down"
    );
    // Past the client's own limit (1.4 × 6 s): it has given up on the session by now.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(killed.elapsed())).await;
    tokio::task::block_in_place(|| zk.restart());
    let back = Instant::now();
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "a hold lost while the server was down: {released:?}"
    );
    let other = zk_runtime(&zk, SESSION).await;
    let got = other
        .lock(key)
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the key comes free");
    let after = back.elapsed();
    println!("server back: the released key was taken by another runtime after {after:?}");
    assert!(
        after < Duration::from_secs(3),
        "the key stayed locked {after:?} after the restart although its holder released: \
         the old session's node waited for the server to expire the session ({SESSION:?})"
    );
    got.release().await.expect("release");
}

/// Requests the server has received so far (`mntr`: `zk_packets_received`).
fn packets_received(zk: &ZooKeeperServer) -> u64 {
    let mntr = zk.four_letter("mntr").expect("mntr");
    mntr.lines()
        .find_map(|line| line.strip_prefix("zk_packets_received"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_packets_received in mntr: {mntr}"))
}

/// The waiter right behind the holder takes the lock on the deletion event alone: nobody can
/// be ahead of it once the head of the queue is gone, so it does not list the queue again. A
/// hand-off is then the holder's delete and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_behind_the_holder_acquires_on_the_deletion_event_alone() {
    let zk = ZooKeeperServer::start();
    let rt = runtime(&zk).await;
    let other = runtime(&zk).await;
    let key = "zk:handoff:event";
    let mut counts = Vec::new();
    for round in 0..3 {
        let holder = rt.hold(key, Duration::from_secs(30)).await;
        let waiter = other.lock(key).wait(Duration::from_secs(20)).spawn();
        queue_len(&zk, key, 2, Duration::from_secs(5)).await;
        // Past the waiter's listing and its watch on the holder's node.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // What reading the count itself adds (`mntr` is a request too).
        let idle = packets_received(&zk);
        let before = packets_received(&zk);
        let reading = before - idle;
        holder.release().await.expect("release");
        let (guard, _) = waiter_got_it(waiter, PROMPTLY, "released").await;
        let requests = (packets_received(&zk) - before).saturating_sub(reading);
        println!("round {round}: {requests} requests from the release to the next holder");
        counts.push(requests);
        guard.release().await.expect("release by the waiter");
    }
    // The holder's delete; a session ping may fall in the window too.
    assert!(
        counts.iter().any(|&n| n <= 1),
        "every hand-off cost more than the holder's delete: {counts:?} requests"
    );
}

/// Regression (found by the torture program): a waiter whose wait ended just as the server
/// went down gave up its place in the queue with a delete that was sent but never answered (the
/// connection broke first), and forgot the node. The waiter's session lived on (its client
/// reconnected to the restarted server), so the node stayed in line ahead of everyone and the
/// key stayed locked for as long as the waiter's process lived. A place given up without the
/// server's answer is now removed once the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_giving_up_as_the_server_goes_down_leaves_no_place_in_the_queue() {
    const WAIT: Duration = Duration::from_secs(2);
    // The waiter's client drops a connection that has not answered for its `timeout` (2 s);
    // its pings keep the last answer less than 1 s old, so the connection breaks 1 s or more
    // after the server froze. The delete at the deadline, 0.4 s after the freeze, is written to
    // the connection and never answered.
    const TIMEOUT: Duration = Duration::from_secs(2);
    const FROZEN_BEFORE_DEADLINE: Duration = Duration::from_millis(400);
    let mut zk = ZooKeeperServer::start();
    let key = "zk:restart:leave";
    let holder_rt = runtime(&zk).await;
    let holder = holder_rt.hold(key, Duration::from_secs(30)).await;
    let waiter_rt = Runtime::builder()
        .zookeeper(zk.connect_string())
        .session_timeout(Duration::from_secs(10))
        .timeout(TIMEOUT)
        .built()
        .await;
    let started = Instant::now();
    let waiter = waiter_rt.lock(key).wait(WAIT).spawn();
    let queued = queue_len(&zk, key, 2, Duration::from_secs(1)).await;
    tokio::time::sleep((WAIT - FROZEN_BEFORE_DEADLINE).saturating_sub(started.elapsed())).await;
    zk.pause();
    let (gave_up, _) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gives up within its wait and the runtime's timeout")
        .expect("waiter task");
    assert!(
        gave_up.is_err(),
        "the waiter acquired a key held by a live holder"
    );
    // The server dies with the delete unread and starts again with its data: both sessions are
    // restored, and their clients reconnect to them.
    zk.kill9();
    tokio::task::block_in_place(|| zk.restart());
    let back = Instant::now();
    let released = holder.release().await;
    println!("holder's release after the restart: {released:?}");
    let other = runtime(&zk).await;
    let got = other
        .lock(key)
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    let after = back.elapsed();
    let queue = queue_of(&zk, key);
    println!(
        "queue before the fault {queued:?}; after it {queue:?}; acquired: {got:?} after {after:?}"
    );
    let waiters_place = &queued[1];
    assert!(
        got.is_ok() && !queue.contains(waiters_place),
        "the key stayed locked {after:?} after the restart although its holder released and its \
         waiter gave up ({got:?}): the waiter's place {waiters_place} is still in the queue \
         {queue:?}"
    );
    if let Ok(guard) = got {
        guard.release().await.expect("release");
    }
    // Alive until here: the waiter's session lived throughout.
    drop(waiter_rt);
}

/// Regression (found by the torture program): a session the client had given up on was
/// resumed with the client library's default timeout (6 s), not the one asked for, and the
/// server applied it to the session from then on: its nodes outlived a dead process by 6 s
/// instead of 2, and the runtime counted on 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_resumed_after_the_client_gave_up_keeps_the_timeout_asked_for() {
    const SESSION: Duration = Duration::from_secs(2);
    let mut zk = ZooKeeperServer::start();
    let rt = zk_runtime(&zk, SESSION).await;
    let key = "zk:restart:resumed-timeout";
    rt.lock(key).cycled("acquire before the outage").await;
    let before = session_timeouts(&zk);
    let [(session, granted)] = before.as_slice() else {
        panic!("one client connection expected: {before:?}");
    };
    assert_eq!(*granted, SESSION, "granted before the outage");
    zk.kill9();
    // Past the client's own limit (1.4 × 2 s): it gives the session up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| zk.restart());
    // The restarted server restored the session from its log; the next call resumes it.
    let guard = rt
        .lock(key)
        .wait(Duration::from_secs(10))
        .held("acquire after the restart")
        .await;
    let valid = guard.valid_for();
    let after = session_timeouts(&zk);
    guard.release().await.expect("release");
    println!(
        "session {session} before the outage: {granted:?}; after the restart: {after:?}; valid_for {valid:?}"
    );
    let resumed = after
        .iter()
        .find(|(id, _)| id == session)
        .unwrap_or_else(|| panic!("session {session} was not resumed: {after:?}"));
    assert_eq!(
        resumed.1, SESSION,
        "the resumed session {session} has another timeout than the {SESSION:?} asked for"
    );
    assert!(
        valid <= SESSION,
        "after the resume the runtime counts on {valid:?}: more than the {SESSION:?} asked for"
    );
}

/// The sessions of the server's client connections (`cons`) with their timeouts.
fn session_timeouts(zk: &ZooKeeperServer) -> Vec<(String, Duration)> {
    let cons = zk.four_letter("cons").expect("cons");
    cons.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split([',', '(', ')'])
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::to_owned)
            };
            let ms: u64 = field("to=")?.parse().ok()?;
            Some((field("sid=")?, Duration::from_millis(ms)))
        })
        .collect()
}

/// A holder counts on its node only while it is an ephemeral node of the session in place:
/// here the node is replaced from outside by a persistent node at the same path (as a node
/// of an old session the client replaced would be, still kept by the server), and the next
/// renewal reports the lock lost instead of counting on a node nobody keeps alive for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_not_owned_by_the_session_in_place_is_a_lost_lock() {
    let zk = ZooKeeperServer::start();
    let rt = zk_runtime(&zk, Duration::from_secs(3)).await;
    let key = "zk:foreign-owner";
    let guard = rt.hold(key, Duration::from_secs(30)).await;
    let node = queue_len(&zk, key, 1, Duration::from_secs(5))
        .await
        .remove(0);
    let raw = zookeeper_client::Client::connector()
        .connect(&zk.connect_string())
        .await
        .expect("raw client");
    raw.delete(&node, None)
        .await
        .expect("delete the holder's node");
    raw.create(
        &node,
        b"someone else",
        &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all()),
    )
    .await
    .expect("create a persistent node at the same path");
    let replaced = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    assert!(
        lost.is_ok(),
        "the holder still counts on a node its session does not own"
    );
    println!("lost {:?} after its node was replaced", replaced.elapsed());
    raw.delete(&node, None).await.expect("clean up");
}

// ---------------------------------------------------------------------------------------------
// Hand-over to the next waiter of the same runtime
// ---------------------------------------------------------------------------------------------

/// The waiter of the same runtime right behind the holder takes the lock when the holder
/// releases, without waiting for ZooKeeper: it holds while the server is frozen (SIGSTOP),
/// before the holder's delete could be applied, with a fence above the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_of_the_same_runtime_takes_the_lock_without_waiting_for_zookeeper() {
    let mut zk = ZooKeeperServer::start();
    let key = "zk:handover:frozen";
    let rt = runtime(&zk).await;
    let holder = rt.lock(key).held("holder").await;
    let waiter = rt.lock(key).wait(Duration::from_secs(30)).spawn();
    let queued = queue_len(&zk, key, 2, Duration::from_secs(5)).await;
    // Past the waiter's listing and its watch on the holder's node.
    tokio::time::sleep(Duration::from_millis(300)).await;

    zk.pause();
    let holder_fence = holder.fence();
    let release = tokio::spawn(holder.release());
    let outcome = tokio::time::timeout(Duration::from_secs(1), waiter).await;
    zk.resume();
    let (guard, _) = outcome
        .expect("the waiter of the same runtime holds within 1 s, ZooKeeper frozen")
        .expect("the waiter's task");
    let guard = guard.expect("the waiter acquires");
    assert!(
        guard.fence() > holder_fence,
        "fences increase across the hand-over: {holder_fence:?} then {:?}",
        guard.fence()
    );
    assert!(!guard.is_lost() && guard.valid_for() > Duration::ZERO);

    // The holder's delete lands (now or in the background), the waiter's hold goes on, and
    // its release leaves nothing behind.
    let _ = release.await.expect("the holder's release task");
    eventually(
        Duration::from_secs(10),
        "the holder's node is gone",
        || async { !queue_of(&zk, key).contains(&queued[0]) },
    )
    .await;
    assert!(!guard.is_lost(), "the handed hold is kept");
    guard.release().await.expect("the new holder releases");
    queue_len(&zk, key, 0, Duration::from_secs(5)).await;
}

/// The ZooKeeper server of a test, as the shared hand-over checks need it.
struct Zk(ZooKeeperServer);

impl QueueEngine for Zk {
    async fn runtime(&self) -> Runtime {
        runtime(&self.0).await
    }

    async fn queue_len(&self, key: &str, len: usize) {
        queue_len(&self.0, key, len, Duration::from_secs(5)).await;
    }
}

/// See [`handover::keep_the_queue_order_across_runtimes`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_overs_keep_the_queue_order_across_runtimes() {
    let zk = Zk(ZooKeeperServer::start());
    handover::keep_the_queue_order_across_runtimes(&zk, "zk:handover:fifo").await;
}

/// See [`handover::a_cancelled_local_waiter_leaves_no_hold_behind`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiter_cancelled_as_the_holder_releases_leaves_no_hold_behind() {
    let zk = Zk(ZooKeeperServer::start());
    handover::a_cancelled_local_waiter_leaves_no_hold_behind(&zk, "zk:handover:cancelled").await;
}

/// See [`handover::a_hot_key_hand_over_is_far_below_a_write`]: an uncontended pair is a
/// create, a listing and a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_hand_over_within_a_runtime_is_far_below_a_write() {
    let zk = Zk(ZooKeeperServer::start());
    handover::a_hot_key_hand_over_is_far_below_a_write(&zk, "zk:handover:hot", "zk:handover:raw")
        .await;
}
