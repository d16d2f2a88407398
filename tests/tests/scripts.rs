//! The Lua scripts themselves, run against a real redis-server: the lock string (acquire is
//! idempotent per owner: the runtime re-enters within a call chain locally), owner checks, the
//! busy answer and the waiter's flag, the fence floor, and the release notification (only when
//! flagged). Also what an uncontended acquire and release cost in Redis commands.

use dlock_tests::{
    AcquireExt, RedisServer, fence_key, lock_key, redis_with_runtime, released_channel, turns_key,
};
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use dlock_runtime::DEFAULT_PREFIX;
use dlock_runtime::testing::redis_fair_names;
use dlock_runtime::testing::scripts::{ACQUIRE, FENCE_FLOOR_MIN, RELEASE, RENEW};

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
// An owner token starts with its runtime's id (16 characters): C is of A's runtime, D of a
// third one.
const C: &str = "aaaaaaaaaaaaaaaacccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddd";

/// A waiter's place in a key's line of runtimes if it joins now, as the runtime gives it
/// (`acquire.lua`'s last argument): microseconds since the Unix epoch.
fn place() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    since_epoch.as_micros() as u64
}

async fn acquire(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    owner: &str,
    lease_ms: u64,
) -> i64 {
    Script::new(ACQUIRE)
        .key(lock_key(key))
        .key(fence_key(key))
        .key(turns_key(key))
        .arg(owner)
        .arg(lease_ms)
        .arg(600_000 + lease_ms)
        .arg(FENCE_FLOOR_MIN)
        .arg(1)
        .arg(owner)
        .arg(2_000)
        .arg(place())
        .invoke_async(conn)
        .await
        .unwrap()
}

async fn release(conn: &mut redis::aio::MultiplexedConnection, key: &str, owner: &str) -> i64 {
    release_reserving(conn, key, owner, 50).await
}

/// [`release`], a flagged lock reserved for `reserve_ms` instead of the runtime's 50 ms.
async fn release_reserving(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    owner: &str,
    reserve_ms: u64,
) -> i64 {
    Script::new(RELEASE)
        .key(lock_key(key))
        .key(turns_key(key))
        .arg(owner)
        .arg("PUBLISH")
        .arg(reserve_ms)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// Regression (issue "reliability", idempotent acquire): the runtime re-enters within a call
/// chain locally, so a second acquire with the same owner token is a retry of the first (a
/// reconnect resending the request). It answers "acquired" (with a fence above the first: a
/// retry draws a value too) and adds no hold: one release frees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_is_idempotent_per_owner() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let fence = acquire(&mut conn, "re", A, 30_000).await;
    assert!(
        fence > 0,
        "fresh acquire returns a positive fence, got {fence}"
    );
    let again = acquire(&mut conn, "re", A, 30_000).await;
    assert!(again > fence, "a retried acquire is acquired: {again}");
    assert_eq!(release(&mut conn, "re", A).await, 1, "one release frees");
    assert!(!server.exists(&lock_key("re")).await);
    let next = acquire(&mut conn, "re", B, 30_000).await;
    assert!(
        next > again,
        "next holder's fence {next} must exceed {again}"
    );
}

/// A retried acquisition whose earlier request landed late (the runtime gave up on it, then
/// asked again with the same owner) holds the key for the whole lease of the retry: the
/// runtime counts its validity from the retry, so the key must not expire sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_holds_for_its_own_lease() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // The earlier request, with a short lease, landed first.
    assert!(acquire(&mut conn, "late", A, 1_000).await > 0);
    assert!(acquire(&mut conn, "late", A, 30_000).await > 0);
    let ttl = server.pttl(&lock_key("late")).await;
    assert!(ttl > 25_000, "the retry's 30 s lease, got {ttl} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_owner_is_busy_with_remaining_ttl_and_cannot_release_or_renew() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    assert!(acquire(&mut conn, "busy", A, 30_000).await > 0);
    let busy = acquire(&mut conn, "busy", B, 30_000).await;
    let ttl_ms = -2 - busy;
    assert!(
        (25_000..=30_000).contains(&ttl_ms),
        "busy answer encodes the holder's pttl, got {busy}"
    );
    assert_eq!(release(&mut conn, "busy", B).await, 0, "not the owner");
    let renewed: Vec<i64> = Script::new(RENEW)
        .key(lock_key("busy"))
        .key(fence_key("busy"))
        .key(lock_key("busy"))
        .key(fence_key("busy"))
        .arg(600_000)
        .arg(B)
        .arg(30_000)
        .arg(A)
        .arg(60_000)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(renewed, vec![0, 1], "renew is owner-checked per item");
    assert!(server.pttl(&lock_key("busy")).await > 30_000);
    // A key someone persisted: busy with no TTL.
    let _: () = server
        .query(redis::cmd("PERSIST").arg(lock_key("busy")))
        .await;
    assert_eq!(acquire(&mut conn, "busy", B, 30_000).await, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counter_is_floored_at_server_time_when_missing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let time: Vec<u64> = server.query(&redis::cmd("TIME")).await;
    let now_us = time[0] * 1_000_000 + time[1];
    let first = acquire(&mut conn, "floor", A, 30_000).await as u64;
    assert!(
        first >= now_us,
        "fence {first} floored at server time {now_us}"
    );
    assert_eq!(release(&mut conn, "floor", A).await, 1);
    let second = acquire(&mut conn, "floor", B, 30_000).await as u64;
    assert_eq!(second, first + 1, "an existing counter grows by one");
    assert_eq!(release(&mut conn, "floor", B).await, 1);
    // The counter key lost (expired, or a restart with no data): floored again, still above.
    assert!(server.del(&fence_key("floor")).await);
    let third = acquire(&mut conn, "floor", A, 30_000).await as u64;
    assert!(
        third > second,
        "{third} must exceed {second} after the counter was lost"
    );
    let ttl = server.pttl(&fence_key("floor")).await;
    assert!(ttl > 600_000, "the counter carries a TTL ({ttl} ms)");
}

/// The counter only grows while it exists, whatever the clock says: one above the server clock
/// (tokens handed out before the clock was stepped back) is bumped, not lowered; and each
/// acquisition and renewal pushes its expiry beyond the lock's (lease plus the margin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_counter_above_the_clock_is_never_lowered_and_outlives_the_lock() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let time: Vec<u64> = server.query(&redis::cmd("TIME")).await;
    let ahead = time[0] * 1_000_000 + time[1] + 86_400_000_000;
    let () = server
        .query(
            redis::cmd("SET")
                .arg(fence_key("up"))
                .arg(ahead)
                .arg("PX")
                .arg(50),
        )
        .await;
    let fence = acquire(&mut conn, "up", A, 30_000).await as u64;
    assert_eq!(fence, ahead + 1, "bumped, not floored at the clock");
    assert!(server.pttl(&fence_key("up")).await > 600_000);
    let () = server
        .query(redis::cmd("PEXPIRE").arg(fence_key("up")).arg(50))
        .await;
    let renewed: Vec<i64> = Script::new(RENEW)
        .key(lock_key("up"))
        .key(fence_key("up"))
        .arg(600_000)
        .arg(A)
        .arg(30_000)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(renewed, vec![1]);
    let ttl = server.pttl(&fence_key("up")).await;
    assert!(
        ttl > 600_000,
        "the renewal pushed the counter's expiry: {ttl} ms"
    );
    assert_eq!(release(&mut conn, "up", A).await, 1);
    let next = acquire(&mut conn, "up", B, 30_000).await as u64;
    assert_eq!(next, ahead + 2, "still above the clock");
}

/// The messages published on the release channel of `key` from now on.
async fn releases_of(server: &RedisServer, key: &str) -> redis::aio::PubSubStream {
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub.subscribe(released_channel(key)).await.unwrap();
    pubsub.into_on_message()
}

/// A release publishes only when a waiter flagged the lock (a busy answer appends `+` to the
/// owner token): one message for the flagged release, none for the unflagged one nor for a
/// release that found nothing of ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_publishes_only_when_a_waiter_flagged_the_lock() {
    use futures_util::StreamExt;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut messages = releases_of(&server, "pub").await;
    let quiet = std::time::Duration::from_millis(300);

    assert!(acquire(&mut conn, "pub", A, 30_000).await > 0);
    assert_eq!(release(&mut conn, "pub", A).await, 1);
    let none = tokio::time::timeout(quiet, messages.next()).await;
    assert!(
        none.is_err(),
        "nobody waited: the release published nothing"
    );

    assert!(acquire(&mut conn, "pub", A, 30_000).await > 0);
    assert!(acquire(&mut conn, "pub", B, 30_000).await < 0, "busy");
    assert_eq!(
        server
            .query::<String>(redis::cmd("GET").arg(lock_key("pub")))
            .await,
        format!("{A}+"),
        "the busy answer flagged the holder's lock"
    );
    assert_eq!(
        release(&mut conn, "pub", A).await,
        1,
        "the owner releases a flagged lock"
    );
    assert_eq!(
        release(&mut conn, "pub", A).await,
        0,
        "a second release is not the owner's"
    );
    let msg = tokio::time::timeout(std::time::Duration::from_secs(2), messages.next())
        .await
        .expect("a message within 2 s")
        .expect("stream open");
    assert_eq!(msg.get_channel_name(), released_channel("pub"));
    let payload: String = msg.get_payload().unwrap();
    assert_eq!(
        payload,
        &A[..16],
        "the message is the releasing runtime's id"
    );
    let more = tokio::time::timeout(quiet, messages.next()).await;
    assert!(more.is_err(), "only the flagged release publishes");
}

/// What an uncontended acquire and release cost the server, counted as Redis counts them
/// (`INFO commandstats`: the commands a script runs count too): at most six (five once the
/// fence counter's expiry was pushed lately), with the fence,
/// its counter's expiry and the owner check, and no `PUBLISH` when nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_cost_at_most_five_commands() {
    let server = RedisServer::start();
    let rt = dlock_runtime::Runtime::builder()
        .redis(server.url())
        .build()
        .await
        .expect("runtime");
    // Warm: the release script is loaded on first use.
    rt.lock("cost")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = server.command_stats().await;
    const PAIRS: u64 = 100;
    for _ in 0..PAIRS {
        let guard = rt.lock("cost").acquire().await.unwrap();
        assert!(guard.fence().is_some());
        guard.release().await.unwrap();
    }
    let after = server.command_stats().await;
    let mut per_command: Vec<(String, u64)> = after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(name, n)| *n > 0 && name != "info")
        .collect();
    per_command.sort();
    let total: u64 = per_command.iter().map(|(_, n)| n).sum();
    println!("{PAIRS} acquire+release pairs: {per_command:?}");
    assert!(
        total <= 5 * PAIRS,
        "{} commands per uncontended acquire+release (at most 5 once the counter's expiry was \
         pushed lately, 6 otherwise): {per_command:?}",
        total as f64 / PAIRS as f64
    );
    assert!(
        per_command
            .iter()
            .all(|(name, _)| !name.contains("publish")),
        "nobody waited, yet a release published: {per_command:?}"
    );
}

/// The first acquisition of a key pushes its fence counter's expiry (lease + 10 min); the
/// next ones within a minute of that push leave the `PEXPIRE` out (five commands per pair),
/// and the counter still outlives the lock by more than nine minutes. A runtime that has not
/// pushed the counter itself pushes it on its first acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_soon_after_a_push_leave_the_counters_expiry_alone() {
    let (server, rt) = redis_with_runtime().await;
    let lease = Duration::from_secs(10);
    rt.lock("spared").lease(lease).cycled("first").await;
    let pexpires = || async { server.command_calls("pexpire").await };
    let first = pexpires().await;
    assert_eq!(
        first, 1,
        "the first acquisition pushes the counter's expiry"
    );
    for _ in 0..20 {
        rt.lock("spared").lease(lease).cycled("again").await;
    }
    assert_eq!(
        pexpires().await,
        first,
        "acquisitions within a minute of the push leave the counter's expiry alone"
    );
    let ttl = server.pttl(&fence_key("spared")).await;
    assert!(
        ttl > (lease + Duration::from_secs(540)).as_millis() as i64,
        "the counter outlives the lock by more than nine minutes: PTTL {ttl} ms"
    );
    let other = dlock_runtime::Runtime::from_url(&server.url())
        .await
        .expect("runtime");
    other
        .lock("spared")
        .lease(lease)
        .cycled("other runtime")
        .await;
    assert_eq!(
        pexpires().await,
        first + 1,
        "a runtime that has not pushed the counter pushes it"
    );
}

/// A waiter's attempt (`acquire.lua`) at `key` by `owner` (of the runtime its first 16
/// characters name; a lease of 30 s, a block of one, 2 s of writer preference), taking its
/// runtime's place in the key's line at `place` if given, else at the server's clock.
fn waiting_attempt<'a>(
    script: &'a Script,
    key: &str,
    owner: &str,
    place: Option<u64>,
) -> ScriptInvocation<'a> {
    let mut invocation = script.key(lock_key(key));
    invocation.key(fence_key(key)).key(turns_key(key));
    block_args(&mut invocation, owner).arg(2_000);
    if let Some(place) = place {
        invocation.arg(place);
    }
    invocation
}

/// A flagged release reserves the key for a moment for the runtime first in line: the other
/// runtimes' waiters, the releaser's own included, are busy (for at most the reservation) and
/// keep their places; the runtime whose turn it is takes it, flagged for those still in line,
/// and its release reserves the key for the next of them, in the order they came. With
/// nobody in line (the line expired), it is reserved for every runtime but the releaser's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flagged_release_reserves_the_key_for_the_runtime_first_in_line() {
    // A reservation far above a loaded machine's round trips (the runtime's is 50 ms), so
    // that none lapses between the release and the attempts that must find it.
    const RESERVE: u64 = 5_000;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // A holds for runtime `&A[..16]`, B and D wait for two other runtimes, C is A's
    // runtime's own waiter.
    let script = Script::new(ACQUIRE);
    let acquire_in = |owner: &'static str| waiting_attempt(&script, "res", owner, Some(place()));
    let lock = || redis::cmd("GET").arg(lock_key("res")).clone();
    let first: i64 = acquire_in(A).invoke_async(&mut conn).await.unwrap();
    assert!(first > 0);
    // B (another runtime) waits: flags A's lock and takes its place in line.
    let busy: i64 = acquire_in(B).invoke_async(&mut conn).await.unwrap();
    assert!(busy < 0, "busy while A holds");
    assert_eq!(release_reserving(&mut conn, "res", A, RESERVE).await, 1);
    let reserved: String = server.query(&lock()).await;
    assert_eq!(
        reserved,
        format!(">{}", &B[..16]),
        "reserved for B's runtime"
    );
    let ttl = server.pttl(&lock_key("res")).await;
    assert!(
        (1..=RESERVE as i64).contains(&ttl),
        "a short reservation: {ttl} ms"
    );
    // The releaser's own waiter, then D's, are busy for at most the reservation, in line.
    for waiter in [C, D] {
        let busy: i64 = acquire_in(waiter).invoke_async(&mut conn).await.unwrap();
        assert!(
            (-2 - RESERVE as i64..=-2).contains(&busy),
            "{waiter} waits out the reservation: {busy}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // B takes its turn, flagged for the runtimes still in line.
    let taken: i64 = acquire_in(B).invoke_async(&mut conn).await.unwrap();
    assert!(taken > first, "acquired with a higher fence: {taken}");
    let value: String = server.query(&lock()).await;
    assert_eq!(value, format!("{B}+"), "B holds, flagged for C and D");
    assert!(
        server.pttl(&lock_key("res")).await > 25_000,
        "B's own lease"
    );
    // Next in line: A's runtime (C came before D), then D.
    assert_eq!(release_reserving(&mut conn, "res", B, RESERVE).await, 1);
    let reserved: String = server.query(&lock()).await;
    assert_eq!(reserved, format!(">{}", &A[..16]), "C's runtime came first");
    let busy: i64 = acquire_in(D).invoke_async(&mut conn).await.unwrap();
    assert!(busy < 0, "not D's turn yet");
    let taken: i64 = acquire_in(C).invoke_async(&mut conn).await.unwrap();
    assert!(taken > first);
    assert_eq!(release_reserving(&mut conn, "res", C, RESERVE).await, 1);
    let reserved: String = server.query(&lock()).await;
    assert_eq!(reserved, format!(">{}", &D[..16]), "then D's");
    let taken: i64 = acquire_in(D).invoke_async(&mut conn).await.unwrap();
    assert!(taken > first);
    let value: String = server.query(&lock()).await;
    assert_eq!(value, D, "nobody left in line: not flagged");
    // Nobody in line (B flags, then its place expires): every runtime but the releaser's.
    let busy: i64 = acquire_in(B).invoke_async(&mut conn).await.unwrap();
    assert!(busy < 0);
    let () = server.query(redis::cmd("DEL").arg(turns_key("res"))).await;
    assert_eq!(release_reserving(&mut conn, "res", D, RESERVE).await, 1);
    let reserved: String = server.query(&lock()).await;
    assert_eq!(
        reserved,
        format!("~{}", &D[..16]),
        "for every other runtime"
    );
    let taken: i64 = acquire_in(C).invoke_async(&mut conn).await.unwrap();
    assert!(taken > first, "another runtime takes it");
}

/// The line of runtimes is ordered by the place a waiter gives (Redlock: the client's clock,
/// the same on every node), else by the server's clock when the waiter asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_is_ordered_by_the_given_place_else_by_the_servers_clock() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = Script::new(ACQUIRE);
    let attempt = |key, owner, place| waiting_attempt(&script, key, owner, place);
    const D: &str = "dddddddddddddddddddddddddddddddd";
    for (key, places) in [
        ("line-given", [Some(2_000), Some(1_000)]),
        ("line-server", [None, None]),
    ] {
        let held: i64 = attempt(key, A, None).invoke_async(&mut conn).await.unwrap();
        assert!(held > 0);
        // B asks first, D second.
        for (owner, place) in [(B, places[0]), (D, places[1])] {
            let busy: i64 = attempt(key, owner, place)
                .invoke_async(&mut conn)
                .await
                .unwrap();
            assert!(busy < 0, "{owner} waits");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let line: Vec<String> = server
            .query(redis::cmd("ZRANGE").arg(turns_key(key)).arg(0).arg(-1))
            .await;
        let expected = match places[0] {
            // D gave the earlier place.
            Some(_) => [&D[..16], &B[..16]],
            // The server saw B first.
            None => [&B[..16], &D[..16]],
        };
        assert_eq!(line, expected, "{key}");
    }
}

/// A reader's attempt (`read_acquire.lua`) on `key` by `owner` (its runtime: the first 16
/// characters); `waiting`: a waiter's attempt.
async fn read_attempt(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    owner: &str,
    waiting: bool,
) -> i64 {
    Script::new(dlock_runtime::testing::scripts::READ_ACQUIRE)
        .key(lock_key(key))
        .key(fence_key(key))
        .key(format!("{}:readers", lock_key(key)))
        .arg(owner)
        .arg(30_000)
        .arg(630_000)
        .arg(FENCE_FLOOR_MIN)
        .arg(&owner[..16])
        .arg(if waiting { 1 } else { 0 })
        .invoke_async(conn)
        .await
        .unwrap()
}

/// A reader's release (`read_release.lua`) on `key` by `owner`: 1 released, 0 not a reader.
async fn read_release(conn: &mut redis::aio::MultiplexedConnection, key: &str, owner: &str) -> i64 {
    Script::new(dlock_runtime::testing::scripts::READ_RELEASE)
        .key(lock_key(key))
        .key(format!("{}:readers", lock_key(key)))
        .arg(owner)
        .arg(released_channel(key))
        .arg(&owner[..16])
        .arg("PUBLISH")
        .arg(50)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// A writer's waiting attempt (`acquire.lua`, 2 s of writer preference) on `key` by `owner`.
async fn write_attempt(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    owner: &str,
) -> i64 {
    let script = Script::new(ACQUIRE);
    let mut call = script.key(lock_key(key));
    call.key(fence_key(key)).key(turns_key(key));
    block_args(&mut call, owner)
        .arg(2_000)
        .arg(place())
        .invoke_async(conn)
        .await
        .unwrap()
}

/// The arguments after the keys that `acquire.lua` and `fair_acquire.lua` start with, for
/// `owner`: a lease of 30 s, the counter's TTL, the floor, a block of one, its runtime (the
/// first 16 characters).
fn block_args<'a, 'b>(
    call: &'a mut ScriptInvocation<'b>,
    owner: &str,
) -> &'a mut ScriptInvocation<'b> {
    call.arg(owner)
        .arg(30_000)
        .arg(630_000)
        .arg(FENCE_FLOOR_MIN)
        .arg(1)
        .arg(&owner[..16])
}

// Owner tokens start with their runtime's id: readers R1 of runtime a and R2 of b, a writer
// W of c.
const R1: &str = "aaaaaaaaaaaaaaaa1111111111111111-r";
const R2: &str = "bbbbbbbbbbbbbbbb2222222222222222-r";
const W: &str = "cccccccccccccccc3333333333333333";

/// R1 reads `key`, W waits for it (and marks itself waiting for 2 s), R2 waits behind W's
/// mark. Returns R1's fence.
async fn a_writer_waits_for_a_reader(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> i64 {
    let first = read_attempt(conn, key, R1, false).await;
    assert!(first > 0, "R1 reads");
    assert!(
        write_attempt(conn, key, W).await < 0,
        "the writer waits for R1 (and marks itself waiting)"
    );
    assert!(
        read_attempt(conn, key, R2, true).await < 0,
        "R2 waits behind the writer"
    );
    first
}

/// Writer preference across runtimes: when the last reader leaves while a writer waits, the
/// key is the writers' turn; a reader of a third runtime that queued behind the writer cannot
/// take it first (a plain reservation for "every runtime but the releaser's" let it, and a
/// writer could then wait out reader after reader), and the writer takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_readers_release_leaves_the_key_to_the_waiting_writer() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let first = a_writer_waits_for_a_reader(&mut conn, "rw").await;
    // The last reader leaves.
    assert_eq!(read_release(&mut conn, "rw", R1).await, 1);
    // R2 (of another runtime than the releaser's) tries first: still the writer's turn.
    let r2 = read_attempt(&mut conn, "rw", R2, true).await;
    assert!(
        r2 < 0,
        "a reader took the key the last reader left to the waiting writer (fence {r2})"
    );
    let taken = write_attempt(&mut conn, "rw", W).await;
    assert!(
        taken > first,
        "the writer takes it with a higher fence: {taken}"
    );
    let value: String = server.query(redis::cmd("GET").arg(lock_key("rw"))).await;
    assert_eq!(value.strip_suffix('+').unwrap_or(&value), W, "W holds");
}

/// A fair writer's attempt (`fair_acquire.lua`, a place of 5 s in line, 2 s of writer
/// preference) on `key` by `owner`.
async fn fair_attempt(conn: &mut redis::aio::MultiplexedConnection, key: &str, owner: &str) -> i64 {
    let [queue, places] = redis_fair_names(DEFAULT_PREFIX, key);
    let script = Script::new(dlock_runtime::testing::scripts::FAIR_ACQUIRE);
    let mut call = script.key(lock_key(key));
    call.key(fence_key(key)).key(queue).key(places);
    block_args(&mut call, owner)
        .arg(5_000)
        .arg(2_000)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// The writers' turn (`^`) is a fair writer's too, in the order of the fair line: after the
/// last reader leaves while a writer's mark is ahead (that writer gave up meanwhile), a fair
/// writer second in line waits for the first; when the first leaves the line, the others are
/// told to look again, and the next one takes the key at once (not when the turn lapses),
/// flagged by the reader that still waits when it looks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_writer_takes_the_writers_turn_in_line() {
    use futures_util::StreamExt;
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut messages = releases_of(&server, "fair-rw").await;
    // Fair writers of runtimes d and e (W, the plain writer, gives up after its first attempt).
    const F1: &str = "dddddddddddddddd4444444444444444";
    const F2: &str = "eeeeeeeeeeeeeeee5555555555555555";
    let first = a_writer_waits_for_a_reader(&mut conn, "fair-rw").await;
    assert!(
        fair_attempt(&mut conn, "fair-rw", F1).await < 0,
        "F1 in line"
    );
    assert!(
        fair_attempt(&mut conn, "fair-rw", F2).await < 0,
        "F2 behind F1"
    );
    assert_eq!(read_release(&mut conn, "fair-rw", R1).await, 1);
    let turn: String = server
        .query(redis::cmd("GET").arg(lock_key("fair-rw")))
        .await;
    // Unflagged: the message below answers the mark's flag; R2, told by it, flags whatever
    // holds the key when it looks again.
    assert_eq!(turn, "^", "the writers' turn");
    let released = tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await
        .expect("the last reader's release publishes")
        .expect("stream open");
    assert_eq!(released.get_payload::<String>().unwrap(), &R1[..16]);

    let second = fair_attempt(&mut conn, "fair-rw", F2).await;
    assert!(
        second < 0,
        "F2 took the writers' turn ahead of F1, first in line (fence {second})"
    );
    // F1 gives up: those behind it look again, and F2 takes the turn at once.
    let left: i64 = Script::new(dlock_runtime::testing::scripts::FAIR_LEAVE)
        .key(lock_key("fair-rw"))
        .key(redis_fair_names(DEFAULT_PREFIX, "fair-rw")[0].clone())
        .key(redis_fair_names(DEFAULT_PREFIX, "fair-rw")[1].clone())
        .arg(F1)
        .arg(released_channel("fair-rw"))
        .arg("left")
        .arg("PUBLISH")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 1, "F1 was in line");
    let told = tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await
        .expect("F1 leaving the head of the line during the writers' turn publishes")
        .expect("stream open");
    assert_eq!(told.get_payload::<String>().unwrap(), "left");
    let taken = fair_attempt(&mut conn, "fair-rw", F2).await;
    assert!(
        taken > first,
        "F2 waits out the writers' turn instead of taking it ({taken})"
    );
    let value: String = server
        .query(redis::cmd("GET").arg(lock_key("fair-rw")))
        .await;
    assert_eq!(value, F2, "F2 holds");
    assert!(
        read_attempt(&mut conn, "fair-rw", R2, true).await < 0,
        "R2 still waits"
    );
    let value: String = server
        .query(redis::cmd("GET").arg(lock_key("fair-rw")))
        .await;
    assert_eq!(value, format!("{F2}+"), "flagged for the waiting R2");
}

/// Leaves `key` reserved after A's flagged release, and flagged by a waiter for whom the
/// reservation is not: for every runtime but A's (`~<a>+`, flagged by C of A's runtime) when
/// `for_all`, else for B's runtime, first in line (`><b>+`, flagged by D). Returns the
/// reservation; A's release reserves it for 10 s (the runtime's own reserve 50 ms, which a
/// loaded machine can let lapse before the next request), for the steps that follow.
async fn a_flagged_reservation(
    server: &RedisServer,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    for_all: bool,
) -> String {
    assert!(write_attempt(conn, key, A).await > 0, "A holds");
    assert!(write_attempt(conn, key, B).await < 0, "B waits");
    if for_all {
        // Nobody in line: the release reserves the key for every runtime but A's.
        let () = server.query(redis::cmd("DEL").arg(turns_key(key))).await;
    }
    assert_eq!(release_reserving(conn, key, A, 10_000).await, 1);
    let waiter = if for_all { C } else { D };
    assert!(
        write_attempt(conn, key, waiter).await < 0,
        "{waiter} waits out a reservation that is not its runtime's"
    );
    let value: String = server.query(redis::cmd("GET").arg(lock_key(key))).await;
    let expected = if for_all {
        format!("~{}+", &A[..16])
    } else {
        format!(">{}+", &B[..16])
    };
    assert_eq!(value, expected, "{waiter} flagged the reservation");
    value
}

/// A fair waiter that takes a reservation somebody flagged keeps the flag, as acquire.lua
/// does: its release must notify the waiter of another runtime that asked for it. Both
/// reservations: `~<releaser>+` (flagged by a waiter of the releaser's runtime, for which the
/// reservation is not) and `><runtime>+` (the turn of one runtime, flagged by another's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_taking_a_flagged_reservation_keeps_the_flag() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // F is a fair waiter of a fourth runtime.
    const F: &str = "ffffffffffffffff6666666666666666";
    for (key, for_all) in [("fair-res-any", true), ("fair-res-turn", false)] {
        let reservation = a_flagged_reservation(&server, &mut conn, key, for_all).await;
        let taken = fair_attempt(&mut conn, key, F).await;
        assert!(taken > 0, "F takes the reservation ({taken})");
        let value: String = server.query(redis::cmd("GET").arg(lock_key(key))).await;
        assert_eq!(
            value,
            format!("{F}+"),
            "F holds, flagged (taken from {reservation})"
        );
    }
}

/// A fair waiter that takes a release reserved for one runtime in line (`><id>`, not flagged:
/// nobody else flagged it) leaves its hold flagged: the runtime whose turn it took still
/// waits, and is told of this release instead of waiting out the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_taking_a_runtimes_turn_flags_the_hold_for_that_runtime() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    const F: &str = "ffffffffffffffff6666666666666666";
    let key = "fair-turn-of-b";
    let () = server
        .query(
            redis::cmd("SET")
                .arg(lock_key(key))
                .arg(format!(">{}", &B[..16]))
                .arg("PX")
                .arg(10_000),
        )
        .await;
    let taken = fair_attempt(&mut conn, key, F).await;
    assert!(taken > 0, "F takes the reservation ({taken})");
    let value: String = server.query(redis::cmd("GET").arg(lock_key(key))).await;
    assert_eq!(value, format!("{F}+"), "F holds, flagged for B's runtime");
}

/// A multi-key attempt (`acquire_all.lua`) by `owner` on `keys`: `[1, fences..]` when all were
/// taken, else `[0, index of the busy key, its pttl]`.
async fn acquire_all(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &[&str],
    owner: &str,
) -> Vec<i64> {
    let script = Script::new(dlock_runtime::testing::scripts::ACQUIRE_ALL);
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(lock_key(key)).key(fence_key(key));
    }
    block_args(&mut call, owner)
        .invoke_async(conn)
        .await
        .unwrap()
}

/// A release reserved for one runtime's turn (`><id>`) is free to a multi-key writer of that
/// runtime only, and taken flagged (other runtimes may still be in the key's line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_writer_takes_a_turn_reserved_for_its_runtime_only() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // M: a multi-key writer of runtime d.
    const M: &str = "dddddddddddddddd7777777777777777";
    for (key, runtime) in [("all-mine", &M[..16]), ("all-theirs", &B[..16])] {
        let () = server
            .query(
                redis::cmd("SET")
                    .arg(lock_key(key))
                    .arg(format!(">{runtime}"))
                    .arg("PX")
                    .arg(10_000),
            )
            .await;
    }
    let busy = acquire_all(&mut conn, &["all-mine", "all-theirs"], M).await;
    assert_eq!(
        busy.get(..2),
        Some(&[0, 2][..]),
        "another runtime's turn: {busy:?}"
    );
    let taken = acquire_all(&mut conn, &["all-mine"], M).await;
    assert_eq!(taken.first(), Some(&1), "its own runtime's turn: {taken:?}");
    let value: String = server
        .query(redis::cmd("GET").arg(lock_key("all-mine")))
        .await;
    assert_eq!(value, format!("{M}+"), "taken flagged");
}

/// A multi-key writer takes what a single-key writer takes, keeping the flags as acquire.lua
/// does: the writers' turn (`^`, the last reader left while a writer waited; flagged again by
/// the reader that waits when it looks again) and a flagged reservation for its runtime
/// (`~<a>+`) are free for it, and their waiters are still told of its release; a free key is
/// taken unflagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_writer_takes_the_writers_turn_and_reservations_with_their_flags() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    a_writer_waits_for_a_reader(&mut conn, "all-turn").await;
    assert_eq!(read_release(&mut conn, "all-turn", R1).await, 1);
    let () = server
        .query(redis::cmd("PEXPIRE").arg(lock_key("all-turn")).arg(10_000))
        .await;
    let turn: String = server
        .query(redis::cmd("GET").arg(lock_key("all-turn")))
        .await;
    // Unflagged: the message below answers the mark's flag; R2, told by it, flags whatever
    // holds the key when it looks again.
    assert_eq!(turn, "^", "the writers' turn");
    a_flagged_reservation(&server, &mut conn, "all-res", true).await;
    // M: a multi-key writer of runtime d (not A's, for which the reservation is not).
    const M: &str = "dddddddddddddddd7777777777777777";
    let keys = ["all-turn", "all-res", "all-free"];
    let answer = acquire_all(&mut conn, &keys, M).await;
    assert_eq!(
        (answer.len(), answer.first()),
        (4, Some(&1)),
        "all three taken: {answer:?}"
    );
    for (key, expected) in keys
        .iter()
        .zip([M.to_owned(), format!("{M}+"), M.to_owned()])
    {
        let value: String = server.query(redis::cmd("GET").arg(lock_key(key))).await;
        assert_eq!(value, expected, "{key}");
    }
    assert!(
        read_attempt(&mut conn, "all-turn", R2, true).await < 0,
        "R2 still waits"
    );
    let value: String = server
        .query(redis::cmd("GET").arg(lock_key("all-turn")))
        .await;
    assert_eq!(value, format!("{M}+"), "flagged by the waiting R2");
}
