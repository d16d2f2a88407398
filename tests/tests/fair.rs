//! Fair locks on Redis: a waiter whose process is killed (kill -9) in line blocks the line no
//! longer than its place lasts, and the line is clean afterwards; a cancelled waiter leaves the
//! line at once; a fair writer takes the writers' turn a read-write lock's last reader leaves.
//!
//! FIFO order across runtimes, a cancelled waiter and a waiter that gives up are in the
//! conformance suite (`tests/conformance/fair.rs`) on every engine.

use std::time::{Duration, Instant};

use dlock_runtime::DEFAULT_PREFIX;
use dlock_runtime::testing::redis_fair_names;
use dlock_tests::{
    AcquireExt, LockError, LockGuard, RedisServer, Runtime, eventually, lock_key, script_calls_in,
    spawn_hold_process, waiter_got_it,
};
use tokio::task::JoinHandle;

/// The dead waiter's lease, hence its place in line (1 s past its last heartbeat).
const PLACE: Duration = Duration::from_secs(1);

/// How long the waiters of the writers' turn test wait (they should get the key at once).
const GIVE_UP: Duration = Duration::from_secs(10);

/// `N` runtimes on `server`, each standing for another process.
async fn runtimes<const N: usize>(server: &RedisServer) -> [Runtime; N] {
    let mut rts = Vec::with_capacity(N);
    for _ in 0..N {
        rts.push(Runtime::from_url(&server.url()).await.expect("runtime"));
    }
    rts.try_into()
        .unwrap_or_else(|_: Vec<Runtime>| unreachable!("N runtimes"))
}

/// A fresh server, `N` runtimes on it, and the first of them holding `key` as a fair lock.
async fn held_on_a_fresh_server<const N: usize>(
    key: &str,
) -> (RedisServer, [Runtime; N], LockGuard) {
    let server = RedisServer::start();
    let rts: [Runtime; N] = runtimes(&server).await;
    let holder = rts[0].lock(key).fair(true).held("the holder").await;
    (server, rts, holder)
}

/// The length of the line of `key` on `server`.
async fn line_len(server: &RedisServer, key: &str) -> usize {
    let [line, _] = redis_fair_names(DEFAULT_PREFIX, key);
    server.query(redis::cmd("LLEN").arg(&line)).await
}

/// A holder in this process; a waiter in a `dlock-holder` process (fair, lease 1 s, wait 60 s)
/// takes its place in line; a waiter of a second runtime here queues behind it; the process is
/// killed with SIGKILL (nothing leaves the line for it). When the holder releases, the second
/// waiter acquires within the dead one's place plus a margin (not after its 60 s), and the
/// line and the places are empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_process_does_not_block_the_line() {
    let key = "fair:killed";
    let (server, [_holder_rt, live_rt], holder) = held_on_a_fresh_server(key).await;

    let lease_ms = u64::try_from(PLACE.as_millis()).expect("a lease in ms");
    let in_line = ["--fair", "true", "--wait-ms", "60000"];
    let mut dead = spawn_hold_process(&server.url(), key, lease_ms, &in_line);
    eventually(
        Duration::from_secs(20),
        "the process waits in line",
        || async { line_len(&server, key).await == 1 },
    )
    .await;
    let live = live_rt
        .lock(key)
        .fair(true)
        .lease(PLACE)
        .wait(Duration::from_secs(60))
        .spawn();
    eventually(Duration::from_secs(10), "two waiters in line", || async {
        line_len(&server, key).await == 2
    })
    .await;
    dead.kill9().await;

    let released = Instant::now();
    holder.release().await.expect("release");
    let what = "the live waiter, behind the killed one";
    let (guard, acquired) = waiter_got_it(live, Duration::from_secs(30), what).await;
    let took = acquired.saturating_duration_since(released);
    guard.release().await.expect("release");
    println!("the live waiter acquired {took:?} after the release");
    assert!(
        took <= PLACE + Duration::from_millis(1500),
        "the live waiter acquired {took:?} after the release; the dead place lasts {PLACE:?}"
    );
    let [line, places] = redis_fair_names(DEFAULT_PREFIX, key);
    assert_eq!(line_len(&server, key).await, 0, "the line is empty");
    let left: usize = server.query(redis::cmd("ZCARD").arg(&places)).await;
    assert_eq!(left, 0, "no place is left in {places}");
    assert!(!server.exists(&line).await);
    assert!(server.lock_is_free(key).await, "{} is free", lock_key(key));
}

/// A waiter (default lease: its place lasts 5 s) is cancelled while in line: it leaves the line
/// within 500 ms, not when its place runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_line_at_once() {
    let key = "fair:cancelled";
    let (server, [_holder_rt, waiter_rt], holder) = held_on_a_fresh_server(key).await;
    let waiter = tokio::spawn(async move {
        waiter_rt
            .lock(key)
            .fair(true)
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    eventually(Duration::from_secs(10), "the waiter in line", || async {
        line_len(&server, key).await == 1
    })
    .await;
    waiter.abort();
    let _ = waiter.await;
    let cancelled = Instant::now();
    eventually(
        Duration::from_millis(500),
        "the cancelled waiter out of the line",
        || async { line_len(&server, key).await == 0 },
    )
    .await;
    println!(
        "left the line {:?} after the cancellation",
        cancelled.elapsed()
    );
    holder.release().await.expect("release");
}

/// A fair try without waiting (`wait` zero) on a busy key answers `Timeout` after one script
/// call (it never joined the line, so it has nothing to leave) and leaves no trace there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_try_without_waiting_does_not_join_the_line() {
    let key = "fair:try";
    let (server, [_holder_rt, other], holder) = held_on_a_fresh_server(key).await;
    let scripts = || async {
        let info: String = server.query(redis::cmd("INFO").arg("commandstats")).await;
        script_calls_in(&info)
    };
    let before = scripts().await;
    let err = other.lock(key).fair(true).refused("a try").await;
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(
        scripts().await - before,
        1,
        "one script call, no leaving the line"
    );
    let [line, places] = redis_fair_names(DEFAULT_PREFIX, key);
    assert!(!server.exists(&line).await, "{line} was written");
    assert!(!server.exists(&places).await, "{places} was written");
    holder.release().await.expect("release");
}

/// Readers of one runtime hold a read-write lock; a plain writer of a second runtime waits
/// 300 ms (marking itself waiting for 2 s) and gives up; a fair writer of a third waits in
/// line, and a reader of a fourth waits behind the writer's mark. When the last reader
/// leaves, the key is the writers' turn until that mark ends: the fair writer takes it within
/// 500 ms (not when the turn lapses, about 1.6 s later), and when it releases, the waiting
/// reader is told and gets in within 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_writer_takes_the_writers_turn_the_last_reader_leaves() {
    let server = RedisServer::start();
    let key = "fair:writers-turn";
    let rts: [Runtime; 4] = runtimes(&server).await;
    let reader = rts[0].lock(key).read().held("the reader").await;
    rts[1]
        .lock(key)
        .wait(Duration::from_millis(300))
        .times_out("the plain writer while a reader holds")
        .await;
    let fair = rts[2].lock(key).fair(true).wait(GIVE_UP).spawn();
    eventually(
        Duration::from_secs(10),
        "the fair writer in line",
        || async { line_len(&server, key).await == 1 },
    )
    .await;
    let waiting_reader = rts[3].lock(key).read().wait(GIVE_UP).spawn();
    // The reader of the fourth runtime has asked, and waits behind the writer's mark.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting_reader.is_finished(), "a reader got in first");

    let writer = hand_over(reader, fair, "the fair writer, after the last reader left").await;
    assert!(!waiting_reader.is_finished(), "a reader in with the writer");
    let read = hand_over(
        writer,
        waiting_reader,
        "the waiting reader, after the writer",
    )
    .await;
    read.release().await.expect("release the second reader");
}

/// Releases `guard`, then joins `waiter` (from [`AcquireExt::spawn`]) and asserts that it got
/// the key within 500 ms of the release (`what`: who, after what).
async fn hand_over(
    guard: LockGuard,
    waiter: JoinHandle<(Result<LockGuard, LockError>, Instant)>,
    what: &str,
) -> LockGuard {
    let released = Instant::now();
    guard.release().await.expect("release");
    let (next, came) = waiter_got_it(waiter, GIVE_UP, what).await;
    let took = came.saturating_duration_since(released);
    println!("{what}: acquired in {took:?}");
    assert!(took < Duration::from_millis(500), "{what}: waited {took:?}");
    next
}
