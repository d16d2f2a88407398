//! Hand-over within one runtime (`dlock-runtime/src/handoff.rs`) on a real redis-server: a
//! held lock passes to the next waiter of the same runtime without a round trip, each holder
//! with a higher fence; the one it passed to keeps renewal and loss detection; and a key
//! busy in two runtimes is shared between them (a flagged release reserves the key for the
//! other runtime's waiters).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_runtime::LockGuard;
use dlock_runtime::testing::scripts::FENCE_BLOCK;
use dlock_tests::{
    AcquireExt, HoldExt, RedisServer, Runtime, finish_within, lock_key, redis_with_runtime, turns,
    turns_key, waiter_got_it,
};
use tokio::task::JoinHandle;

const LEASE: Duration = Duration::from_secs(10);

/// How long the contending tasks hold the lock, unless a test says otherwise.
const HOLD: Duration = Duration::from_millis(1);

/// How many tasks of one runtime contend in the tests of [`one_runtime`].
const TASKS: usize = 16;

/// Waits up to 30 s for `key` on `rt` (lease [`LEASE`]) and releases it at once: with another
/// waiter of the runtime queued behind, the release parks the hold for the next head.
async fn hold_and_park(rt: &Runtime, key: &str) {
    let guard = rt.hold_within(key, LEASE, Duration::from_secs(30)).await;
    guard
        .release()
        .await
        .expect("release: parked for the next head");
}

/// After 100 ms (for the second waiter to queue), releases `holder`, which hands the key to the
/// first waiter, and joins that waiter's task.
async fn release_to_the_first(holder: LockGuard, first: JoinHandle<()>) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder
        .release()
        .await
        .expect("release: handed to the first");
    first.await.expect("the first waiter");
}

/// `tasks` tasks of `rt`, each acquiring `key` `each` times (holding it for an await of
/// `hold`, none if zero); the fences in the order the holders got them, tagged with `tag`.
async fn contend(
    rt: &Runtime,
    key: &'static str,
    (tasks, each, hold): (usize, usize, Duration),
    tag: usize,
    order: &Arc<Mutex<Vec<(usize, u64)>>>,
) -> Vec<JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (rt, order) = (rt.clone(), order.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    let guard = rt.hold_within(key, LEASE, Duration::from_secs(60)).await;
                    let fence = guard.fence().expect("a Redis lock has a fence");
                    order.lock().unwrap().push((tag, fence));
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    guard.release().await.expect("release");
                }
            })
        })
        .collect()
}

fn assert_increasing(order: &[(usize, u64)]) {
    for pair in order.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "fences must grow holder after holder: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
}

/// What one runtime's tasks cost in Redis, from [`one_runtime`].
struct Cost {
    acquisitions: u64,
    /// `SET` calls: first attempts and waiters' attempts (scripts included).
    attempts: u64,
    /// `DEL` calls: releases of an unflagged lock.
    releases: u64,
    published: u64,
}

/// [`TASKS`] tasks of one runtime on a fresh server, each acquiring `key` `each` times and
/// holding it for `hold`; checks that every acquisition happened with a fence above the
/// previous holder's, and returns what Redis saw (printed, with the blocks of fences used).
async fn one_runtime(key: &'static str, (each, hold): (usize, Duration)) -> Cost {
    let tasks = TASKS;
    let (server, rt) = redis_with_runtime().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let sets = server.set_calls().await;
    let dels = server.command_calls("del").await;
    let published = server.command_calls("publish").await;
    let running = contend(&rt, key, (tasks, each, hold), 0, &order).await;
    finish_within(running, Duration::from_secs(60)).await;
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), tasks * each);
    assert_increasing(&order);
    let cost = Cost {
        acquisitions: order.len() as u64,
        attempts: server.set_calls().await - sets,
        releases: server.command_calls("del").await - dels,
        published: server.command_calls("publish").await - published,
    };
    println!(
        "{} acquisitions by {tasks} tasks of one runtime ({} blocks of fences): {} attempts, {} \
         releases and {} publications in Redis",
        cost.acquisitions,
        cost.acquisitions.div_ceil(FENCE_BLOCK),
        cost.attempts,
        cost.releases,
        cost.published
    );
    cost
}

/// Sixteen tasks of one runtime on one key: most acquisitions are hand-overs, which send
/// nothing to Redis (without them every acquisition is at least one attempt: a `SET`), every
/// holder's fence is above the previous holder's, and no release publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_in_one_runtime_is_handed_over_without_a_round_trip() {
    let cost = one_runtime("handoff:hot", (10, HOLD)).await;
    let (acquisitions, attempts, published) = (cost.acquisitions, cost.attempts, cost.published);
    // Waiters of the holder's own runtime are woken by its release: they never flag the
    // lock, so no release publishes (nor reserves the key for other runtimes).
    assert_eq!(
        published, 0,
        "releases published although every waiter was of the holder's runtime"
    );
    assert!(
        attempts * 3 < acquisitions,
        "{attempts} attempts in Redis for {acquisitions} acquisitions: the lock was not handed \
         over within the runtime"
    );
}

/// Sixteen tasks of one runtime on one key for twenty blocks of fences: while only waiters
/// of this runtime want the key, it is never released in Redis between blocks; a used-up
/// block is followed by a new one in the same round trip (`extend.lua`), and every holder's
/// fence is still above the previous holder's. Without it, each block ended with a release
/// and an attempt by the next holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_key_wanted_only_by_its_runtime_is_kept_across_blocks() {
    let cost = one_runtime("handoff:kept", (20, HOLD)).await;
    let (attempts, releases) = (cost.attempts, cost.releases);
    let blocks = cost.acquisitions.div_ceil(FENCE_BLOCK);
    // The first attempts of tasks that started before anybody queued; the release at the end
    // (and one or two while the queue formed or emptied).
    assert!(
        attempts <= TASKS as u64 + 4,
        "{attempts} attempts for {blocks} blocks: the key was taken again after used-up blocks"
    );
    assert!(
        releases <= 3,
        "{releases} releases in Redis for {blocks} blocks: the key was released between blocks \
         although only waiters of its runtime wanted it"
    );
}

/// Holders that release at once (nothing awaited between acquire and release): the waiter
/// next in line has often not taken its place at the head of the queue yet (its turn was
/// granted, its task not polled). The hold is parked for it, so the lock still passes without
/// a round trip until its block of fences is used up: about one attempt in Redis per block.
/// Without the parking each such release went to Redis and the next holder took the key
/// with an attempt of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_releasing_at_once_still_hand_over_until_the_block_is_used_up() {
    let cost = one_runtime("handoff:at-once", (40, Duration::ZERO)).await;
    let (acquisitions, attempts) = (cost.acquisitions, cost.attempts);
    let blocks = acquisitions.div_ceil(FENCE_BLOCK);
    // About one attempt per block at most, plus the first attempts of tasks that started
    // before anybody queued and a few while the queue formed (68 seen before blocks were
    // extended; 656 without the parking).
    assert!(
        attempts <= 2 * blocks + TASKS as u64,
        "{attempts} attempts in Redis for {acquisitions} acquisitions ({blocks} blocks): \
         releases went to Redis although a waiter of the runtime was next in line"
    );
}

/// The holder a lock was handed to has the next fence, keeps the lease renewed, and learns
/// of its loss (another owner wrote the key) like any holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_over_holder_is_renewed_and_detects_its_loss() {
    let (server, rt) = redis_with_runtime().await;
    let key = "handoff:loss";
    let lease = Duration::from_secs(1);
    let first = rt.lock(key).lease(lease).held("first holder").await;
    let waiter = rt
        .lock(key)
        .lease(lease)
        .wait(Duration::from_secs(10))
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = server.set_calls().await;
    let first_fence = first.fence().expect("fence");
    first.release().await.expect("release");
    let (second, _) = waiter_got_it(waiter, Duration::from_secs(2), "handed over").await;
    assert_eq!(
        second.fence(),
        Some(first_fence + 1),
        "the next token of the first holder's block"
    );
    assert_eq!(
        server.set_calls().await,
        attempts,
        "the hand-over sent no attempt to Redis"
    );
    // Three leases: renewed all along.
    tokio::time::sleep(lease * 3).await;
    assert!(!second.is_lost(), "the handed-over hold was not renewed");
    assert!(server.exists(&lock_key(key)).await, "expired in Redis");
    let () = server
        .query(
            redis::cmd("SET")
                .arg(lock_key(key))
                .arg("intruder")
                .arg("PX")
                .arg(60_000),
        )
        .await;
    tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .expect("lost() must resolve when another owner took the key");
    assert!(second.release().await.is_err(), "not ours any more");
}

/// The acquisitions of `order` (tagged 0 to `runtimes - 1`) up to the moment the first
/// runtime made its `each`: from then on the others contend without it.
async fn while_all_contended(
    order: &Arc<Mutex<Vec<(usize, u64)>>>,
    runtimes: usize,
    each: usize,
) -> Vec<(usize, u64)> {
    let first_done = {
        let order = order.clone();
        tokio::spawn(async move {
            loop {
                {
                    let order = order.lock().unwrap();
                    if (0..runtimes).any(|r| order.iter().filter(|(t, _)| *t == r).count() == each)
                    {
                        return order.clone();
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    tokio::time::timeout(Duration::from_secs(60), first_done)
        .await
        .expect("one runtime finished within 60 s")
        .expect("counter task")
}

/// Two runtimes (as two processes would be) with eight tasks each on one key: each gets a
/// fair part of the acquisitions, and neither keeps the key for more than two blocks of
/// hand-overs in a row. Without the reservation a flagged release makes, the releasing
/// runtime's own waiter, woken without a round trip, often wins the race and hands the key on
/// within its runtime again (runs of 51 to 80 seen, against 16 with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_in_two_runtimes_is_shared_between_them() {
    let server = RedisServer::start();
    let a = Runtime::from_url(&server.url()).await.expect("runtime a");
    let b = Runtime::from_url(&server.url()).await.expect("runtime b");
    const TASKS: usize = 8;
    const EACH: usize = 25;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = contend(&a, "handoff:shared", (TASKS, EACH, HOLD), 0, &order).await;
    tasks.extend(contend(&b, "handoff:shared", (TASKS, EACH, HOLD), 1, &order).await);
    let mid = while_all_contended(&order, 2, TASKS * EACH).await;
    finish_within(tasks, Duration::from_secs(60)).await;
    assert_increasing(&order.lock().unwrap());
    let from_a = mid.iter().filter(|(t, _)| *t == 0).count();
    let from_b = mid.len() - from_a;
    let mut longest = 0;
    let mut run = 0;
    for (i, (tag, _)) in mid.iter().enumerate() {
        run = if i > 0 && mid[i - 1].0 == *tag {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    println!(
        "while both contended: runtime a {from_a}, runtime b {from_b} acquisitions; longest run \
         of one runtime {longest}"
    );
    assert!(
        longest as u64 <= 2 * FENCE_BLOCK,
        "{longest} acquisitions in a row by one runtime while the other waited: more than two \
         blocks of {FENCE_BLOCK} hand-overs (its own waiters won the race after its releases)"
    );
    let smaller = from_a.min(from_b) as f64 / mid.len() as f64;
    assert!(
        smaller >= 0.3,
        "one runtime got {:.0} % of the acquisitions while both contended ({from_a} / {from_b})",
        smaller * 100.0
    );
}

/// Three runtimes (as three processes would be) with three tasks each on one key take turns
/// in the order they came: while all three contend, no runtime holds the key twice before
/// each of the others held it once. Without the line of runtimes in Redis, the runtimes told
/// of a flagged release race for it, and the one the server tells first, or the one just
/// woken, wins turns out of order ([0, 2, 0, 2, 0, 2, 1, 2, ...]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_in_three_runtimes_takes_turns_in_the_order_they_came() {
    let server = RedisServer::start();
    let mut runtimes = Vec::new();
    for _ in 0..3 {
        runtimes.push(Runtime::from_url(&server.url()).await.expect("runtime"));
    }
    let turns = turns::turns(&runtimes, "handoff:turns").await;
    assert_eq!(
        turns::out_of_order(&turns, 3),
        0,
        "turns out of order: {turns:?}"
    );
}

/// A waiter handed the lock but cancelled before it took it (its future dropped between the
/// hand-over and its next poll) does not keep the key: the hold it never took is released at
/// once, and its renewals stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_handed_to_a_waiter_cancelled_before_it_took_it_is_released() {
    let (server, rt) = redis_with_runtime().await;
    let other = Runtime::from_url(&server.url()).await.expect("runtime");
    let key = "handoff:cancelled";
    let holder = rt.lock(key).lease(LEASE).held("holder").await;
    let mut waiting = Box::pin(
        rt.lock(key)
            .lease(LEASE)
            .wait(Duration::from_secs(30))
            .acquire(),
    );
    // Polled until it heads the queue (subscribed, waiting for the holder's release).
    let polled = tokio::time::timeout(Duration::from_millis(300), waiting.as_mut()).await;
    assert!(polled.is_err(), "the waiter cannot have the lock yet");
    holder
        .release()
        .await
        .expect("release: handed to the waiter");
    assert!(
        server.exists(&lock_key(key)).await,
        "handed over, not released in Redis"
    );
    // Cancelled before it took the hold handed to it.
    drop(waiting);
    let start = std::time::Instant::now();
    let guard = other
        .lock(key)
        .lease(LEASE)
        .wait(Duration::from_secs(20))
        .held("another runtime")
        .await;
    let took = start.elapsed();
    println!("the stranded hold was released; another runtime acquired after {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "the key stayed locked {took:?} after the waiter it was handed to was cancelled"
    );
    guard.release().await.expect("release");
}

/// Two waiters behind a holder, in one runtime: the first, handed the lock, releases it at once
/// and, in the same step, cancels the second, whose turn its leaving had just granted but
/// which never ran again. The hold parked for the second (it had not taken its place at the
/// head yet) is released when it leaves the queue: the key is free in Redis and nothing is
/// renewed any more. (A current-thread runtime: the test decides what runs when.)
#[tokio::test]
async fn hold_parked_for_a_waiter_that_leaves_before_heading_the_queue_is_released() {
    let (server, rt) = redis_with_runtime().await;
    let key = "handoff:parked-abandoned";
    let holder = rt.lock(key).lease(LEASE).held("holder").await;
    let second_slot = Arc::new(Mutex::new(None::<tokio::task::AbortHandle>));
    let first = tokio::spawn({
        let (rt, second_slot) = (rt.clone(), second_slot.clone());
        async move {
            hold_and_park(&rt, key).await;
            let second = second_slot
                .lock()
                .unwrap()
                .take()
                .expect("the second waiter");
            second.abort();
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn({
        let rt = rt.clone();
        async move {
            let _guard = rt.hold_within(key, LEASE, Duration::from_secs(30)).await;
            panic!("the second waiter was cancelled before it could run again");
        }
    });
    *second_slot.lock().unwrap() = Some(second.abort_handle());
    release_to_the_first(holder, first).await;
    assert!(second.await.expect_err("aborted").is_cancelled());
    let freed = dlock_tests::eventually(
        Duration::from_secs(2),
        "the parked hold released",
        || async { !server.exists(&lock_key(key)).await },
    )
    .await;
    println!("the parked hold was released {freed:?} after its last waiter left");
    assert_eq!(rt.held_count(), 0, "the parked hold is still renewed");
}

/// A hold parked for the next head (the holder released before it took its place) is not
/// given to a head that asks for another lease: it is released, and that head acquires with
/// its own lease. (A current-thread runtime: the test decides what runs when.)
#[tokio::test]
async fn hold_parked_for_a_head_asking_another_lease_is_released_not_handed() {
    let (server, rt) = redis_with_runtime().await;
    let key = "handoff:parked-other-terms";
    let short = Duration::from_secs(2);
    let holder = rt.lock(key).lease(LEASE).held("holder").await;
    let first = tokio::spawn({
        let rt = rt.clone();
        async move {
            hold_and_park(&rt, key).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn({
        let rt = rt.clone();
        async move { rt.hold_within(key, short, Duration::from_secs(30)).await }
    });
    release_to_the_first(holder, first).await;
    let guard = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter acquires")
        .expect("the second waiter");
    let pttl = server.pttl(&lock_key(key)).await;
    assert!(
        0 < pttl && pttl <= short.as_millis() as i64,
        "the key's TTL is {pttl} ms: the second holder got a hold with the {LEASE:?} lease \
         instead of its own {short:?}"
    );
    assert_eq!(
        rt.held_count(),
        1,
        "a hold besides the second holder's is tracked"
    );
    guard.release().await.expect("release");
}

/// A waiter of another runtime that contended (took its process's place in the key's line)
/// and was then cancelled, its future dropped as a dropped request would drop it, leaves the
/// line: the holder's flagged release then reserves the key for nobody in particular, and a
/// try from a third runtime takes it at once. Left in line, the release was reserved for the
/// cancelled waiter's runtime and the try failed for the whole reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_of_another_runtime_leaves_the_line_of_processes() {
    let server = RedisServer::start();
    let holder = Runtime::from_url(&server.url()).await.expect("holder");
    let waiter = Runtime::from_url(&server.url()).await.expect("waiter");
    let other = Runtime::from_url(&server.url())
        .await
        .expect("third runtime");
    let key = "handoff:cancelled-in-line";
    let guard = holder.lock(key).held("holder").await;
    let waiting = waiter.lock(key).wait(Duration::from_secs(30)).acquire();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "the key is held: the wait is cancelled"
    );
    dlock_tests::eventually(Duration::from_secs(5), "the line is empty", || async {
        let line: Vec<String> = server
            .query(redis::cmd("ZRANGE").arg(turns_key(key)).arg(0).arg(-1))
            .await;
        line.is_empty()
    })
    .await;
    guard.release().await.expect("release");
    let got = other
        .lock(key)
        .wait(Duration::ZERO)
        .held("a try right after the release, from a runtime nobody reserved it against")
        .await;
    got.release().await.expect("release");
}

/// A try without wait from another runtime, right after a release that reserved the key for
/// other runtimes (a waiter of a second runtime flagged it and then gave up): the key is free
/// to it at once. Without taking the reservation over in the first attempt, such a try failed
/// for the whole reservation although nobody held the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_from_another_runtime_takes_a_key_reserved_after_a_flagged_release() {
    let server = RedisServer::start();
    let holder = Runtime::from_url(&server.url())
        .await
        .expect("holder runtime");
    let waiter = Runtime::from_url(&server.url())
        .await
        .expect("waiter runtime");
    let other = Runtime::from_url(&server.url())
        .await
        .expect("third runtime");
    let key = "handoff:reserved";
    let guard = holder.lock(key).held("holder").await;
    // Flags the lock (another runtime waits), then gives up.
    waiter
        .lock(key)
        .wait(Duration::from_millis(100))
        .times_out("the key is held")
        .await;
    guard.release().await.expect("release");
    let reserved = server.lock_owner(&lock_key(key)).await;
    assert!(
        reserved.as_deref().is_some_and(|v| v.starts_with('~')),
        "the flagged release reserves the key for other runtimes: {reserved:?}"
    );
    let got = other
        .lock(key)
        .wait(Duration::ZERO)
        .held("a try right after the release, from a runtime the key is reserved for")
        .await;
    assert!(got.fence().is_some());
    got.release().await.expect("release");
    // Its plain release frees the key for everybody, the first releaser included.
    holder
        .lock(key)
        .cycled("a try after the third runtime released")
        .await;
}
