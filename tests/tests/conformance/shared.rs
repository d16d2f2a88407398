//! Read-write locks and semaphores: readers overlap, a writer excludes readers and writers and,
//! fair or not, is not starved by a stream of readers, a semaphore never has more holders than
//! permits (across runtimes), a killed permit holder frees its permit within its lease,
//! mismatched sizes and a write inside a read are errors; Redlock refuses both with
//! `InvalidConfig`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_runtime::{LockBuilder, LockError, Runtime, with_lock};
use dlock_tests::{AcquireExt, LONG_WAIT, finish_within, held_long, hold_in_process};
use tokio::time::Instant;

use crate::fixture::{Engine, Fixture};
use crate::support::{LONG_LEASE, assert_nothing_left};

const WAIT: Duration = Duration::from_secs(20);

/// A read lock of `key` on `rt` that waits up to [`WAIT`].
fn read_lock(rt: &Runtime, key: &str) -> LockBuilder {
    rt.lock(key).read().wait(WAIT)
}

/// Asserts that `lock` (with the runtime's default wait) times out, the key being taken; the
/// failure names `what` on `engine`.
async fn kept_out(lock: LockBuilder, engine: Engine, what: &str) {
    lock.times_out(&format!("{engine:?}: {what}")).await;
}

/// Asserts that acquiring `lock` is `InvalidConfig` and returns the error; the failure names
/// `what` on `engine`.
async fn invalid(lock: LockBuilder, engine: Engine, what: &str) -> LockError {
    lock.invalid_config(&format!("{engine:?}: {what}")).await
}

/// Three readers on three runtimes: each, once it holds, waits until all three hold. Without
/// overlapping readers the first would wait forever for the others.
pub(crate) async fn readers_truly_overlap(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:rw:overlap";
    let inside = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for rt in fixture.runtimes(3).await {
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let guard =
                held_long(rt.lock(key).read(), WAIT, &format!("{engine:?}: a reader")).await;
            inside.fetch_add(1, Ordering::SeqCst);
            let start = Instant::now();
            while inside.load(Ordering::SeqCst) < 3 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "{engine:?}: readers did not hold together ({} inside)",
                    inside.load(Ordering::SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            guard.release().await.expect("release");
        }));
    }
    finish_within(tasks, Duration::from_secs(60)).await;
    assert_nothing_left(&fixture.runtime().await, key, "after the readers").await;
}

/// A writer keeps readers and writers out; readers keep writers (and plain locks) out but let
/// readers in; every holder's fence is above the one before.
pub(crate) async fn a_writer_excludes_readers_and_writers(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:rw:exclusion";
    let rts = fixture.runtimes(2).await;
    let (a, b) = (&rts[0], &rts[1]);
    let writer = a.lock(key).held(&format!("{engine:?}: writer")).await;
    kept_out(b.lock(key).read(), engine, "read while written").await;
    kept_out(b.lock(key), engine, "write while written").await;
    let writer_fence = writer.fence();
    writer.release().await.expect("release the writer");

    let r1 = read_lock(a, key).held("reader 1").await;
    let r2 = read_lock(b, key).held("reader 2").await;
    if engine.params().fences {
        let (w, f1, f2) = (
            writer_fence.unwrap(),
            r1.fence().unwrap(),
            r2.fence().unwrap(),
        );
        assert!(w < f1 && f1 < f2, "{engine:?}: fences {w} {f1} {f2}");
    }
    kept_out(b.lock(key), engine, "write while read").await;
    r1.release().await.expect("release reader 1");
    kept_out(a.lock(key), engine, "write while one reader reads").await;
    r2.release().await.expect("release reader 2");
    let what = format!("{engine:?}: writer after readers");
    let writer = b.lock(key).wait(WAIT).held(&what).await;
    writer.release().await.expect("release");
    assert_nothing_left(a, key, "after the last release").await;
}

/// Readers on two runtimes come and go so that some reader always holds; a writer on a third
/// runtime asks meanwhile: it gets the key within a bounded wait (new readers queue behind
/// it), and no reader is inside while it holds.
pub(crate) async fn a_waiting_writer_is_not_starved_by_readers(engine: Engine) {
    writer_against_a_stream_of_readers(engine, false).await;
}

/// The same for a fair writer (`fair(true)`, with plain readers: a fair lock is a writer):
/// first in its line, it keeps new readers out as a plain writer does. On Redis it only
/// flagged the readers' mark and waited until the readers stopped (the whole 15 s).
pub(crate) async fn a_waiting_fair_writer_is_not_starved_by_readers(engine: Engine) {
    writer_against_a_stream_of_readers(engine, true).await;
}

/// A writer (fair or not) asks while readers on two other runtimes keep the key read.
async fn writer_against_a_stream_of_readers(engine: Engine, fair: bool) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:rw:starve";
    let rts = fixture.runtimes(3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let readers_inside = Arc::new(AtomicU64::new(0));
    let writer_inside = Arc::new(AtomicBool::new(false));
    let mut streams = Vec::new();
    for (i, rt) in rts[..2].iter().enumerate() {
        let (rt, stop) = (rt.clone(), stop.clone());
        let (readers_inside, writer_inside) = (readers_inside.clone(), writer_inside.clone());
        streams.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            let mut readers = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (rt, readers_inside) = (rt.clone(), readers_inside.clone());
                let writer_inside = writer_inside.clone();
                readers.push(tokio::spawn(async move {
                    let guard = held_long(rt.lock(key).read(), WAIT, "a reader").await;
                    assert!(
                        !writer_inside.load(Ordering::SeqCst),
                        "a reader inside with the writer"
                    );
                    readers_inside.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    readers_inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release a reader");
                }));
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
            finish_within(readers, Duration::from_secs(60)).await;
        }));
    }
    // The stream is flowing: readers hold.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        readers_inside.load(Ordering::SeqCst) > 0,
        "{engine:?}: no reader holds"
    );
    let started = Instant::now();
    let writer = rts[2]
        .lock(key)
        .fair(fair)
        .lease(LONG_LEASE)
        .wait(Duration::from_secs(15))
        .acquire()
        .await;
    let waited = started.elapsed();
    let writer =
        writer.unwrap_or_else(|e| panic!("{engine:?}: the writer (fair: {fair}) starved: {e}"));
    writer_inside.store(true, Ordering::SeqCst);
    assert_eq!(
        readers_inside.load(Ordering::SeqCst),
        0,
        "{engine:?}: readers inside with the writer"
    );
    // Starved, it would wait for the whole 15 s; readers hold 200 ms each, so the writer gets
    // the key about 200 ms after it asked (about 180 ms on every engine here). On Redis a
    // reader of another runtime could take the key between the last reader's release and the
    // writer's attempt, and the writer waited out reader after reader (1.6-4.4 s seen); the
    // writers' turn (`read_release.lua`) ended that. 3 s leaves room for a loaded machine.
    assert!(
        waited < Duration::from_secs(3),
        "{engine:?}: the writer (fair: {fair}) waited {waited:?} for readers holding 200 ms each"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer_inside.store(false, Ordering::SeqCst);
    writer.release().await.expect("release the writer");
    stop.store(true, Ordering::SeqCst);
    finish_within(streams, Duration::from_secs(90)).await;
}

/// Three runtimes with five tasks each take one of three permits four times each: never more
/// than three inside, and three reached.
pub(crate) async fn a_semaphore_never_exceeds_its_permits(engine: Engine) {
    const PERMITS: u32 = 3;
    let fixture = Fixture::start(engine).await;
    let key = "conformance:semaphore:bound";
    let inside = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    fixture
        .tasks_on_each((3, 5), Duration::from_secs(120), |rt| {
            let (inside, most) = (inside.clone(), most.clone());
            async move {
                for _ in 0..4 {
                    let what = format!("{engine:?}: a permit");
                    let permit = held_long(rt.semaphore(key, PERMITS), LONG_WAIT, &what).await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release a permit");
                }
            }
        })
        .await;
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= u64::from(PERMITS),
        "{engine:?}: {most} holders of {PERMITS} permits"
    );
    assert_eq!(
        most,
        u64::from(PERMITS),
        "{engine:?}: the permits were never all used"
    );
    assert_nothing_left(&fixture.runtime().await, key, "after the last permit").await;
}

/// A semaphore asked with another size while it has holders is `InvalidConfig` naming both;
/// zero permits too; `permits = 1` excludes like a lock.
pub(crate) async fn a_semaphore_of_another_size_is_invalid_config(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:semaphore:size";
    let rts = fixture.runtimes(2).await;
    let held = rts[0]
        .semaphore(key, 2)
        .held(&format!("{engine:?}: a permit of 2"))
        .await;
    let err = invalid(rts[1].semaphore(key, 3), engine, "another size").await;
    let text = err.to_string();
    assert!(
        text.contains('3') && text.contains('2'),
        "{engine:?}: {text}"
    );
    held.release().await.expect("release");
    invalid(rts[1].semaphore(key, 0), engine, "zero permits").await;

    let one = rts[0]
        .semaphore("conformance:semaphore:one", 1)
        .held("permit of 1")
        .await;
    let busy = rts[1].semaphore("conformance:semaphore:one", 1);
    kept_out(busy, engine, "a permit of 1 held").await;
    one.release().await.expect("release");
    assert_nothing_left(&rts[1], key, "after the release").await;
}

/// In a call chain: a read inside a write re-enters the write (same fence), a read inside a
/// read re-enters, a permit inside a permit re-enters, a write inside a read is
/// `InvalidConfig`, never a deadlock.
pub(crate) async fn read_and_write_reentrancy_rules(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rt = fixture.runtime().await;
    let key = "conformance:rw:reentry";
    let quick = |b: dlock_runtime::LockBuilder| b.wait(Duration::from_secs(2));
    rt.scope(async {
        with_lock(quick(dlock_runtime::lock(key)), async {
            let outer = dlock_runtime::current_fence();
            with_lock(quick(dlock_runtime::lock(key).read()), async {
                assert_eq!(
                    dlock_runtime::current_fence(),
                    outer,
                    "{engine:?}: read in write"
                );
            })
            .await
            .unwrap_or_else(|e| panic!("{engine:?}: read inside write: {e}"));
        })
        .await
        .expect("write");

        let upgrade = with_lock(quick(dlock_runtime::lock(key).read()), async {
            with_lock(quick(dlock_runtime::lock(key).read()), async {})
                .await
                .unwrap_or_else(|e| panic!("{engine:?}: read inside read: {e}"));
            with_lock(quick(dlock_runtime::lock(key)), async {}).await
        })
        .await
        .expect("read");
        let err: LockError = upgrade.expect_err("write inside read");
        assert!(err.is_invalid_config(), "{engine:?}: {err}");
        assert!(
            err.to_string()
                .contains("cannot upgrade a read lock to a write lock"),
            "{err}"
        );

        with_lock(quick(dlock_runtime::semaphore(key, 1)), async {
            with_lock(quick(dlock_runtime::semaphore(key, 1)), async {})
                .await
                .unwrap_or_else(|e| panic!("{engine:?}: permit inside permit: {e}"));
        })
        .await
        .expect("permit");
    })
    .await;
    assert_nothing_left(&rt, key, "after the chains").await;
}

/// A process holding one of two permits is killed (-9): its permit frees within its lease (on
/// ZooKeeper, its session), while the other holder keeps the second.
pub(crate) async fn a_killed_permit_holder_frees_its_permit(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:semaphore:killed";
    let url = fixture.url().expect("an engine with servers");
    let lease = engine.params().short_lease;
    let lease_ms = u64::try_from(lease.as_millis()).expect("ms");
    let (mut holder, _) = hold_in_process(&url, key, lease_ms, &["--permits", "2"]).await;
    let rt = fixture.runtime().await;
    let mine = rt
        .semaphore(key, 2)
        .held(&format!("{engine:?}: the second permit"))
        .await;
    let err = rt
        .semaphore(key, 2)
        .acquire()
        .await
        .expect_err("both permits held");
    assert!(err.is_timeout(), "{engine:?}: {err}");
    holder.kill9().await;
    let killed = Instant::now();
    let bound = match engine {
        // Ephemeral nodes live as long as the session (10 s by default).
        Engine::ZooKeeper => Duration::from_secs(14),
        _ => lease + Duration::from_millis(2500),
    };
    let freed = rt
        .semaphore(key, 2)
        .wait(bound)
        .held(&format!("{engine:?}: the killed holder's permit"))
        .await;
    let took = killed.elapsed();
    assert!(took <= bound, "{engine:?}: freed after {took:?}");
    freed.release().await.expect("release");
    mine.release().await.expect("release");
}

/// Redlock has no read locks and no semaphores: `InvalidConfig` at acquire, naming redlock.
pub(crate) async fn redlock_refuses_read_locks_and_semaphores(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rt = fixture.runtime().await;
    for err in [
        rt.lock("conformance:rw")
            .read()
            .acquire()
            .await
            .expect_err("read on redlock"),
        rt.semaphore("conformance:sem", 2)
            .acquire()
            .await
            .expect_err("semaphore on redlock"),
    ] {
        assert!(err.is_invalid_config(), "{err}");
        assert!(err.to_string().contains("redlock"), "{err}");
    }
    rt.lock("conformance:rw")
        .held("a write lock on redlock")
        .await
        .release()
        .await
        .expect("release");
}

/// A reader's release never hands its hold to a writer waiting in the same runtime (a hand-over
/// is for exclusive holds): while a reader of another runtime still reads, the writer waits.
pub(crate) async fn a_readers_release_hands_nothing_to_a_waiting_writer(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let key = "conformance:rw:handoff";
    let rts = fixture.runtimes(2).await;
    let (a, b) = (&rts[0], &rts[1]);
    let r1 = a
        .lock(key)
        .read()
        .held(&format!("{engine:?}: reader on a"))
        .await;
    let r2 = b
        .lock(key)
        .read()
        .held(&format!("{engine:?}: reader on b"))
        .await;
    let writer = {
        let lock = a.lock(key).lease(LONG_LEASE).wait(WAIT);
        tokio::spawn(async move { lock.acquire().await })
    };
    // The writer heads a's queue when the reader on a releases.
    tokio::time::sleep(Duration::from_millis(300)).await;
    r1.release().await.expect("release the reader on a");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !writer.is_finished(),
        "{engine:?}: the writer got the key while a reader on b reads"
    );
    r2.release().await.expect("release the reader on b");
    let guard = tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer within its wait")
        .expect("writer task")
        .unwrap_or_else(|e| panic!("{engine:?}: writer: {e}"));
    guard.release().await.expect("release the writer");
}

/// `inspect` and `list` show a read lock as mode `"read"` and a semaphore as `"semaphore"`,
/// with `holds` counting every live holder, one of them as the redacted owner, a TTL within
/// the lease, and (where the engine shows one) the fence of one of the holders; the listing
/// has each key once, beside an exclusive lock; released, they are gone.
pub(crate) async fn shared_holds_are_inspected_with_their_mode_and_holders(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rts = fixture.runtimes(3).await;
    let (read_key, sem_key, plain_key) = (
        "conformance:shared:inspect:doc",
        "conformance:shared:inspect:quota",
        "conformance:shared:inspect:plain",
    );
    let mut readers = Vec::new();
    let mut permits = Vec::new();
    for rt in &rts[..2] {
        readers.push(
            rt.lock(read_key)
                .read()
                .lease(LONG_LEASE)
                .held(&format!("{engine:?}: a reader"))
                .await,
        );
        permits.push(
            rt.semaphore(sem_key, 3)
                .lease(LONG_LEASE)
                .held(&format!("{engine:?}: a permit"))
                .await,
        );
    }
    let plain = rts[0].lock(plain_key).lease(LONG_LEASE).held("plain").await;
    let observer = &rts[2];
    for (key, mode, guards) in [
        (read_key, "read", &readers),
        (sem_key, "semaphore", &permits),
    ] {
        let info = observer
            .inspect(key)
            .await
            .expect("inspect")
            .unwrap_or_else(|| panic!("{engine:?}: {key} is held by two"));
        assert_eq!(info.key, key);
        assert_eq!(info.mode, mode, "{engine:?}: {info:?}");
        assert_eq!(info.holds, 2, "{engine:?}: two holders of {key}: {info:?}");
        assert!(
            info.owner.ends_with('…') && info.owner.chars().count() == 9,
            "{engine:?}: a redacted owner: {info:?}"
        );
        assert!(
            info.ttl > Duration::ZERO && info.ttl <= LONG_LEASE,
            "{engine:?}: {info:?}"
        );
        if let Some(fence) = info.fence {
            let fences: Vec<Option<u64>> = guards.iter().map(|g| g.fence()).collect();
            assert!(
                fences.contains(&Some(fence)),
                "{engine:?}: the fence of a holder ({fences:?}): {info:?}"
            );
        }
    }
    let listing = observer
        .list("conformance:shared:inspect:")
        .await
        .expect("list");
    let shown: Vec<(&str, &str, u32)> = listing
        .iter()
        .map(|i| (i.key.as_str(), i.mode.as_str(), i.holds))
        .collect();
    assert_eq!(
        shown,
        [
            (read_key, "read", 2),
            (plain_key, "exclusive", 1),
            (sem_key, "semaphore", 2)
        ],
        "{engine:?}: each key once, sorted"
    );
    for guard in readers.into_iter().chain(permits).chain([plain]) {
        guard.release().await.expect("release");
    }
    for key in [read_key, sem_key, plain_key] {
        assert_eq!(
            observer.inspect(key).await.expect("inspect"),
            None,
            "{engine:?}: {key} released"
        );
    }
    assert!(
        observer
            .list("conformance:shared:inspect:")
            .await
            .expect("list")
            .is_empty(),
        "{engine:?}: nothing held"
    );
}

/// `force_unlock` removes every reader and every permit holder of a key (not only one), so a
/// writer and a permit waiter of another runtime get the key long before the holders' leases
/// end; it answers `false` for a free key.
pub(crate) async fn force_unlock_removes_readers_and_permits_and_wakes_waiters(engine: Engine) {
    let fixture = Fixture::start(engine).await;
    let rts = fixture.runtimes(3).await;
    let (read_key, sem_key) = (
        "conformance:shared:force:doc",
        "conformance:shared:force:quota",
    );
    // Within this bound a waiter holds only because the forced unlock freed the key: the
    // holders' leases (30 s) are far longer.
    let bound = Duration::from_secs(10);
    for (key, semaphore) in [(read_key, false), (sem_key, true)] {
        let take = |rt: &dlock_runtime::Runtime| {
            let lock = if semaphore {
                rt.semaphore(key, 2)
            } else {
                rt.lock(key).read()
            };
            lock.lease(LONG_LEASE)
        };
        let mut holders = Vec::new();
        for rt in &rts[..2] {
            holders.push(
                take(rt)
                    .held(&format!("{engine:?}: a holder of {key}"))
                    .await,
            );
        }
        let waiter_rt = rts[2].clone();
        let waiter = tokio::spawn(async move {
            let lock = if semaphore {
                waiter_rt.semaphore(key, 2)
            } else {
                waiter_rt.lock(key)
            };
            let guard = lock.lease(LONG_LEASE).wait(WAIT).acquire().await;
            (guard, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiter.is_finished(),
            "{engine:?}: {key} is full, the waiter waits"
        );
        let forced = Instant::now();
        assert!(
            rts[2].force_unlock(key).await.expect("force unlock"),
            "{engine:?}: {key} had holders"
        );
        let (guard, at) = waiter.await.expect("waiter");
        let guard = guard.unwrap_or_else(|e| panic!("{engine:?}: the waiter of {key}: {e}"));
        let took = at.duration_since(forced);
        assert!(
            took < bound,
            "{engine:?}: {key}'s waiter held {took:?} after the forced unlock"
        );
        if !semaphore {
            // A writer holds: not one of the readers was left behind.
            let info = rts[2].inspect(key).await.expect("inspect").expect("held");
            assert_eq!(
                (info.mode.as_str(), info.holds),
                ("exclusive", 1),
                "{engine:?}"
            );
        }
        guard.release().await.expect("release");
        for holder in holders {
            // Their holds are gone: a release finds nothing of theirs (or reports the loss).
            let _ = holder.release().await;
        }
        assert!(
            !rts[2].force_unlock(key).await.expect("force unlock"),
            "{engine:?}: {key} is free"
        );
    }
}
