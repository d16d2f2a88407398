//! `#[distributed_lock]` end to end: the formatted key (`{id}` and `<id>` naming one key) is held
//! while the body runs and released on every exit path the body can take (`Ok`, `?`, early
//! `return`, panic, cancellation of the caller); a busy lock returns the converted `LockError`
//! (into the caller's own error type) without running the body; nested annotated calls
//! re-enter; a non-atomic read-modify-write is mutually excluded across tasks and across OS
//! processes; `current_fence()` is the fence stored in Redis; a lost lease cancels the body,
//! and `on_lost = "ignore"` lets it finish instead.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_runtime::{LockError, Runtime, current_fence, distributed_lock, lock, with_lock};
use dlock_tests::{
    AcquireExt, Backend, Counting, Engine, HoldExt, RedisServer, assert_between,
    count_in_processes, lock_key, on_both_backends, redis_with_runtime,
};
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Debug)]
enum AppError {
    Business(&'static str),
    Lock(LockError),
    Redis(#[allow(dead_code, reason = "read through Debug in failure messages")] redis::RedisError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl From<redis::RedisError> for AppError {
    fn from(err: redis::RedisError) -> Self {
        AppError::Redis(err)
    }
}

const ASYNC_RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// A release scheduled from `Drop` (cancellation) reaches the engine within this.
const CANCEL_RELEASE_WITHIN: Duration = Duration::from_secs(1);

on_both_backends!(
    attribute_holds_formatted_key_while_body_runs,
    attribute_releases_on_ok_err_question_mark_and_return,
    attribute_releases_on_panic,
    attribute_busy_lock_returns_timeout_without_running_body,
    attribute_nested_calls_on_same_key_reenter,
    attribute_method_key_uses_self_field,
    attribute_lost_lease_cancels_body,
    attribute_future_is_send_and_spawnable,
    attribute_excludes_50_tasks_in_a_non_atomic_redis_increment,
    attribute_aborted_task_releases_key_within_1_s,
    attribute_dropped_call_releases_key_within_1_s,
    attribute_angle_and_brace_placeholders_lock_one_key,
    attribute_timeout_converts_into_callers_error_variant,
    attribute_on_lost_ignore_body_completes_after_key_deleted,
    attribute_on_lost_cancel_drops_body_after_key_deleted,
);

#[distributed_lock(key = "order:{id}", lease = "30s")]
async fn held_inside(id: u64, b: &Backend) -> Result<bool, AppError> {
    Ok(b.is_held(&format!("order:{id}")).await)
}

#[distributed_lock(key = "order:<id>:<line>", lease = "30s")]
async fn held_inside_angle(id: u64, line: &str, b: &Backend) -> Result<bool, AppError> {
    Ok(b.is_held(&format!("order:{id}:{line}")).await)
}

async fn attribute_holds_formatted_key_while_body_runs(b: Backend) {
    b.rt.scope(async {
        assert!(
            held_inside(7, &b).await.expect("runs"),
            "order:7 held inside"
        );
        assert!(!b.is_held("order:7").await, "released after");
        assert!(held_inside_angle(7, "a", &b).await.expect("runs"));
        assert!(!b.is_held("order:7:a").await);
    })
    .await;
}

/// Exits by `Ok`, by `?` on an `Err`, by an early `return`, or by returning `Err`.
#[distributed_lock(key = "exit:{how}", lease = "30s")]
async fn exit_by(how: &str) -> Result<u32, AppError> {
    if how == "return" {
        return Ok(1);
    }
    if how == "question" {
        Err(AppError::Business("via ?"))?;
    }
    if how == "err" {
        return Err(AppError::Business("returned"));
    }
    Ok(2)
}

async fn attribute_releases_on_ok_err_question_mark_and_return(b: Backend) {
    b.rt.scope(async {
        assert_eq!(exit_by("ok").await.expect("ok"), 2);
        assert_eq!(exit_by("return").await.expect("return"), 1);
        assert!(matches!(
            exit_by("question").await,
            Err(AppError::Business("via ?"))
        ));
        assert!(matches!(
            exit_by("err").await,
            Err(AppError::Business("returned"))
        ));
        for how in ["ok", "return", "question", "err"] {
            // Awaited release: free right away.
            assert!(!b.is_held(&format!("exit:{how}")).await, "exit:{how} held");
        }
    })
    .await;
}

#[distributed_lock(key = "panics", lease = "30s")]
async fn panics() -> Result<(), AppError> {
    panic!("deliberate panic in an annotated fn");
}

async fn attribute_releases_on_panic(b: Backend) {
    let rt = b.rt.clone();
    let err = tokio::spawn(async move { rt.scope(panics()).await })
        .await
        .expect_err("panics");
    assert!(err.is_panic());
    b.wait_until_free("panics", ASYNC_RELEASE_WITHIN).await;
}

#[distributed_lock(key = "busy:{id}", lease = "30s", wait = "200ms")]
async fn busy(id: u64, ran: &AtomicBool) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

async fn attribute_busy_lock_returns_timeout_without_running_body(b: Backend) {
    let _holder = b.rt.lock("busy:3").held("holder").await;
    let ran = AtomicBool::new(false);
    let out = b.rt.scope(busy(3, &ran)).await;
    match out {
        Err(AppError::Lock(err)) => {
            assert!(err.is_timeout(), "expected Timeout, got {err:?}");
            assert_eq!(err.key(), Some("busy:3"));
        }
        other => panic!("expected Err(Lock(Timeout)), got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
}

#[distributed_lock(key = "nested:{id}", lease = "30s")]
async fn outer(id: u64, b: &Backend) -> Result<u64, AppError> {
    let fence = dlock_runtime::current_fence();
    let inner = inner(id, fence).await?;
    // The inner exit kept the hold.
    assert!(b.is_held(&format!("nested:{id}")).await);
    Ok(inner)
}

#[distributed_lock(key = "nested:{id}", lease = "30s", wait = "0s")]
async fn inner(id: u64, outer_fence: Option<u64>) -> Result<u64, AppError> {
    assert_eq!(
        dlock_runtime::current_fence(),
        outer_fence,
        "reentrant fence"
    );
    Ok(id * 2)
}

async fn attribute_nested_calls_on_same_key_reenter(b: Backend) {
    let out = tokio::time::timeout(Duration::from_secs(10), b.rt.scope(outer(21, &b)))
        .await
        .expect("nested annotated calls deadlocked");
    assert_eq!(out.expect("re-enters"), 42);
    assert!(!b.is_held("nested:21").await);
}

struct Shop {
    tenant: String,
}

impl Shop {
    #[distributed_lock(key = "shop:{self.tenant}:{item}", lease = "30s")]
    async fn buy(&self, item: u32, b: &Backend) -> Result<bool, AppError> {
        Ok(b.is_held(&format!("shop:{}:{item}", self.tenant)).await)
    }
}

async fn attribute_method_key_uses_self_field(b: Backend) {
    let shop = Shop {
        tenant: "acme".to_string(),
    };
    let held = b.rt.scope(shop.buy(5, &b)).await.expect("runs");
    assert!(held, "shop:acme:5 held inside the method");
    assert!(!b.is_held("shop:acme:5").await);
}

#[distributed_lock(key = "lost", lease = "1s", watchdog = false)]
async fn outlives_lease(completed: &AtomicBool) -> Result<(), AppError> {
    tokio::time::sleep(Duration::from_secs(60)).await;
    completed.store(true, Ordering::SeqCst);
    Ok(())
}

async fn attribute_lost_lease_cancels_body(b: Backend) {
    let completed = AtomicBool::new(false);
    let start = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        b.rt.scope(outlives_lease(&completed)),
    )
    .await
    .expect("a lost lease must end the call");
    match out {
        Err(AppError::Lock(LockError::Lost { key, .. })) => assert_eq!(key, "lost"),
        other => panic!("expected Err(Lock(Lost)), got {other:?}"),
    }
    assert!(!completed.load(Ordering::SeqCst));
    dlock_tests::assert_between(
        "attribute Err(Lost), lease 1 s, no watchdog",
        start.elapsed(),
        Duration::from_millis(500),
        Duration::from_secs(3),
    );
}

#[distributed_lock(key = "spawned:{id}", lease = "30s", wait = "10s")]
async fn spawnable(id: u64) -> Result<u64, AppError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(id)
}

async fn attribute_future_is_send_and_spawnable(b: Backend) {
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let rt = b.rt.clone();
            tokio::spawn(async move { rt.scope(spawnable(9)).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("task").expect("acquired"), 9);
    }
    assert!(!b.is_held("spawned:9").await);
}

// ---- mutual exclusion across tasks ----------------------------------------------------------

/// [`dlock_tests::racy_increment`] as the attribute's error type.
async fn racy_increment(counter: &str, conn: &mut MultiplexedConnection) -> Result<(), AppError> {
    Ok(dlock_tests::racy_increment(counter, conn).await?)
}

/// [`racy_increment`] under the attribute, counting how many callers are inside at once.
#[distributed_lock(key = "attr-counter:{name}", lease = "30s", wait = "60s")]
async fn locked_increment(
    name: &str,
    conn: &mut MultiplexedConnection,
    inside: &AtomicUsize,
    max_inside: &AtomicUsize,
) -> Result<(), AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    max_inside.fetch_max(now, Ordering::SeqCst);
    let out = racy_increment(&format!("counter:{name}"), conn).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    out
}

async fn attribute_excludes_50_tasks_in_a_non_atomic_redis_increment(b: Backend) {
    const TASKS: u64 = 50;
    const EACH: u64 = 4;
    // The counter lives in Redis on both engines: the engine's own server on Redis, a server
    // used only as storage on memory (whose locks exclude within this process).
    let own_storage;
    let storage = match &b.server {
        Some(server) => server,
        None => {
            own_storage = RedisServer::start();
            &own_storage
        }
    };
    let conn = storage.conn().await;

    // Control: the same increments without the attribute lose updates, so the exact count
    // below is evidence of exclusion and not of a critical section too short to race.
    let unlocked: Vec<_> = (0..TASKS)
        .map(|_| {
            let mut conn = conn.clone();
            tokio::spawn(async move { racy_increment("counter:unlocked", &mut conn).await })
        })
        .collect();
    for task in unlocked {
        task.await.expect("task").expect("unlocked increment");
    }
    let unlocked_total: u64 = storage
        .query(redis::cmd("GET").arg("counter:unlocked"))
        .await;
    println!(
        "{:?}: {TASKS} unlocked increments gave {unlocked_total}",
        b.engine
    );
    assert!(
        unlocked_total < TASKS,
        "the control lost no update ({unlocked_total} of {TASKS}): the race is not real"
    );

    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (rt, mut conn) = (b.rt.clone(), conn.clone());
            let (inside, max_inside) = (inside.clone(), max_inside.clone());
            tokio::spawn(async move {
                for _ in 0..EACH {
                    rt.scope(locked_increment("tasks", &mut conn, &inside, &max_inside))
                        .await?;
                }
                Ok::<_, AppError>(())
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("tasks finish")
            .expect("task")
            .expect("locked increments succeed");
    }
    let total: u64 = storage.query(redis::cmd("GET").arg("counter:tasks")).await;
    assert_eq!(total, TASKS * EACH, "lost updates under the attribute");
    assert_eq!(
        max_inside.load(Ordering::SeqCst),
        1,
        "two callers were inside the body at once"
    );
    assert!(!b.is_held("attr-counter:tasks").await);
}

// ---- mutual exclusion across OS processes ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_excludes_four_processes_in_a_non_atomic_redis_increment() {
    const RUNS: (u64, u64) = (4, 50);
    let server = RedisServer::start();
    let key = "attr:processes";
    // Each process runs the increment inside an annotated fn on its installed runtime.
    let url = server.url();
    let total = count_in_processes(Counting::Attribute, &url, &server, key, RUNS).await;
    assert_eq!(total, RUNS.0 * RUNS.1, "lost updates across processes");
    assert!(!server.exists(&lock_key(key)).await);
}

// ---- cancellation of the caller -------------------------------------------------------------

/// Signals that the body runs (so the lock is held), then sleeps far past any test bound.
#[distributed_lock(key = "cancel:{id}", lease = "30s")]
async fn sleeps_in_lock(id: u64, entered: oneshot::Sender<()>) -> Result<(), AppError> {
    let _ = entered.send(());
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

/// After a cancelled call: the key is free within [`CANCEL_RELEASE_WITHIN`] (not after the
/// 30 s lease), and another owner takes it with no wait.
async fn assert_released_promptly(b: &Backend, key: &str) {
    let took = b.wait_until_free(key, CANCEL_RELEASE_WITHIN).await;
    println!("{:?}: {key} free {took:?} after the cancellation", b.engine);
    let other = b.other_runtime().await;
    other
        .lock(key)
        .wait(Duration::ZERO)
        .cycled("another owner takes the key at once")
        .await;
}

async fn attribute_aborted_task_releases_key_within_1_s(b: Backend) {
    let (entered, is_in) = oneshot::channel();
    let rt = b.rt.clone();
    let task = tokio::spawn(async move { rt.scope(sleeps_in_lock(1, entered)).await });
    tokio::time::timeout(Duration::from_secs(10), is_in)
        .await
        .expect("the body starts")
        .expect("entered");
    assert!(b.is_held("cancel:1").await, "held while the body runs");
    task.abort();
    let err = task.await.expect_err("aborted");
    assert!(err.is_cancelled(), "expected a cancelled task, got {err:?}");
    assert_released_promptly(&b, "cancel:1").await;
}

async fn attribute_dropped_call_releases_key_within_1_s(b: Backend) {
    let (entered, is_in) = oneshot::channel();
    let mut call = Box::pin(b.rt.scope(sleeps_in_lock(2, entered)));
    tokio::select! {
        out = &mut call => panic!("the 60 s body returned early: {out:?}"),
        entered = tokio::time::timeout(Duration::from_secs(10), is_in) => {
            entered.expect("the body starts").expect("entered");
        }
    }
    assert!(b.is_held("cancel:2").await, "held while the body runs");
    drop(call);
    assert_released_promptly(&b, "cancel:2").await;
}

// ---- current_fence() ------------------------------------------------------------------------

/// `current_fence()` first thing in the body, the fence the key's counter in Redis says the
/// latest acquisition got (the holder's: nobody else tries the key), `current_fence()` again.
type FenceReadings = (Option<u64>, Option<u64>, Option<u64>);

/// Returns `current_fence()` before and after an await inside the body, and the latest
/// acquisition's fence by the key's counter in Redis, read in between.
#[distributed_lock(key = "fence:{id}", lease = "30s")]
async fn fence_seen_inside(id: u64, server: &RedisServer) -> Result<FenceReadings, AppError> {
    let first = current_fence();
    let stored = server
        .latest_acquired_fence(&lock_key(&format!("fence:{id}")))
        .await;
    let after_await = current_fence();
    Ok((first, stored, after_await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attribute_current_fence_equals_fence_in_redis_and_is_none_after() {
    let (server, rt) = redis_with_runtime().await;
    rt.scope(async {
        assert_eq!(current_fence(), None, "no lock held yet");
        let mut previous = 0;
        for round in 0..3 {
            let (first, stored, after_await) = fence_seen_inside(1, &server).await.expect("runs");
            let fence = first.expect("current_fence() inside the body is Some");
            assert_eq!(
                stored,
                Some(fence),
                "round {round}: the fence of the block dlock:{{fence:1}}:fence ends"
            );
            assert_eq!(
                after_await,
                Some(fence),
                "round {round}: same fence after an await"
            );
            assert!(
                fence > previous,
                "round {round}: fence {fence} after {previous}"
            );
            previous = fence;
            assert_eq!(current_fence(), None, "round {round}: None after the call");
        }

        // Inside another lock, the inner call's fence is its own, and the outer one is current
        // again after it returns.
        let outer_fence = with_lock(lock("fence:outer").lease(Duration::from_secs(30)), async {
            let outer = current_fence().expect("outer fence");
            let (inner, stored, _) = fence_seen_inside(2, &server).await.expect("runs");
            assert_eq!(inner, stored, "inner fence is the one in Redis");
            assert_ne!(inner, Some(outer), "the inner call has its own fence");
            assert_eq!(
                current_fence(),
                Some(outer),
                "the outer fence after the inner call"
            );
            outer
        })
        .await
        .expect("outer lock");
        let held_outer = server.lock_owner(&lock_key("fence:outer")).await;
        assert_eq!(held_outer, None, "outer lock released");
        assert!(outer_fence > 0);
        assert_eq!(current_fence(), None, "None after every call");
    })
    .await;
}

// ---- "<id>" and "{id}" ----------------------------------------------------------------------

/// The names of the lock hashes that exist now: raw `KEYS dlock:*` on Redis (without the fence
/// counters), the held ones among a few candidate spellings on memory.
async fn lock_hashes(b: &Backend, id: u64) -> Vec<String> {
    match &b.server {
        Some(server) => {
            let mut keys: Vec<String> = server.query(redis::cmd("KEYS").arg("dlock:*")).await;
            keys.retain(|k| !k.ends_with(":fence"));
            keys.sort();
            keys
        }
        None => {
            let mut held = Vec::new();
            for key in [
                format!("form:{id}"),
                format!("form:<{id}>"),
                format!("form:{{{id}}}"),
                "form:<id>".to_string(),
                "form:{id}".to_string(),
            ] {
                if b.is_held(&key).await {
                    held.push(lock_key(&key));
                }
            }
            held
        }
    }
}

/// What the two key forms below return: the lock hashes seen inside, and `during`'s output.
type HeldBy<F> = Result<(Vec<String>, <F as Future>::Output), AppError>;

#[distributed_lock(key = "form:<id>", lease = "30s")]
async fn held_by_angle_form<F: Future>(id: u64, b: &Backend, during: F) -> HeldBy<F> {
    Ok((lock_hashes(b, id).await, during.await))
}

#[distributed_lock(key = "form:{id}", lease = "30s")]
async fn held_by_brace_form<F: Future>(id: u64, b: &Backend, during: F) -> HeldBy<F> {
    Ok((lock_hashes(b, id).await, during.await))
}

#[distributed_lock(key = "form:<id>", lease = "30s", wait = "0s")]
async fn try_angle_form(id: u64, ran: Arc<AtomicBool>) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "form:{id}", lease = "30s", wait = "0s")]
async fn try_brace_form(id: u64, ran: Arc<AtomicBool>) -> Result<(), AppError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[track_caller]
fn assert_excluded(what: &str, out: Result<(), AppError>, ran: &AtomicBool) {
    match out {
        Err(AppError::Lock(err)) => {
            assert!(err.is_timeout(), "{what}: expected Timeout, got {err:?}");
            assert_eq!(err.key(), Some("form:5"), "{what}");
        }
        other => panic!("{what}: expected Err(Lock(Timeout)), got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "{what}: the body ran");
}

async fn attribute_angle_and_brace_placeholders_lock_one_key(b: Backend) {
    // The contender runs in a spawned task: another call chain, so another owner (inside the
    // holder's own chain it would re-enter).
    let spawn_contender = |by_angle: bool| {
        let rt = b.rt.clone();
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        async move {
            let out = tokio::spawn(async move {
                if by_angle {
                    rt.scope(try_angle_form(5, flag)).await
                } else {
                    rt.scope(try_brace_form(5, flag)).await
                }
            })
            .await
            .expect("contender task");
            (out, ran)
        }
    };

    let (angle_names, (out, ran)) =
        b.rt.scope(held_by_angle_form(5, &b, spawn_contender(false)))
            .await
            .expect("angle form acquires");
    assert_excluded("{id} while <id> holds", out, &ran);
    let (brace_names, (out, ran)) =
        b.rt.scope(held_by_brace_form(5, &b, spawn_contender(true)))
            .await
            .expect("brace form acquires");
    assert_excluded("<id> while {id} holds", out, &ran);

    assert_eq!(
        angle_names,
        vec![lock_key("form:5")],
        "<id> form's lock hash"
    );
    assert_eq!(brace_names, angle_names, "both forms use one lock hash");

    // Free again: each form gets the key with no wait.
    let ran = Arc::new(AtomicBool::new(false));
    b.rt.scope(try_angle_form(5, ran.clone()))
        .await
        .expect("free");
    b.rt.scope(try_brace_form(5, ran.clone()))
        .await
        .expect("free");
    assert!(ran.load(Ordering::SeqCst));
}

// ---- Timeout into the caller's error type ---------------------------------------------------

/// The caller's own error type: a lock timeout becomes `Busy`, any other lock error `Engine`.
#[derive(Debug, PartialEq)]
enum ShopError {
    SoldOut,
    Busy { key: String },
    Engine(String),
}

impl From<LockError> for ShopError {
    fn from(err: LockError) -> Self {
        match err {
            LockError::Timeout { key, .. } => ShopError::Busy { key },
            other => ShopError::Engine(other.to_string()),
        }
    }
}

#[distributed_lock(key = "stock:{item}", lease = "30s", wait = "300ms")]
async fn reserve(item: u64, stock: u64, ran: &AtomicBool) -> Result<u64, ShopError> {
    ran.store(true, Ordering::SeqCst);
    if stock == 0 {
        return Err(ShopError::SoldOut);
    }
    Ok(stock - 1)
}

async fn attribute_timeout_converts_into_callers_error_variant(b: Backend) {
    let ran = AtomicBool::new(false);
    // Free: the body's own values and errors pass through untouched.
    assert_eq!(b.rt.scope(reserve(9, 3, &ran)).await, Ok(2));
    assert_eq!(
        b.rt.scope(reserve(9, 0, &ran)).await,
        Err(ShopError::SoldOut)
    );

    let other = b.other_runtime().await;
    let holder = other.hold("stock:9", Duration::from_secs(30)).await;
    let ran = AtomicBool::new(false);
    let start = Instant::now();
    let out = b.rt.scope(reserve(9, 3, &ran)).await;
    let elapsed = start.elapsed();
    match out {
        Err(ShopError::Busy { key }) => assert_eq!(key, "stock:9"),
        other => panic!("expected Err(ShopError::Busy {{ key: \"stock:9\" }}), got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst), "the body ran without the lock");
    assert_between(
        "busy call with wait 300 ms",
        elapsed,
        Duration::from_millis(250),
        Duration::from_secs(5),
    );
    holder.release().await.expect("release");
    assert_eq!(b.rt.scope(reserve(9, 3, &ran)).await, Ok(2));
}

// ---- on_lost --------------------------------------------------------------------------------

/// How long the bodies below run: well past the detection of a deleted key (one renewal, a
/// third of the 1 s lease).
const LOST_BODY: Duration = Duration::from_secs(3);

/// The body of both functions below: tells `entered` it runs, runs for [`LOST_BODY`], then sets
/// `completed` and returns 7.
struct LostBody {
    entered: oneshot::Sender<()>,
    completed: Arc<AtomicBool>,
}

impl LostBody {
    async fn run(self) -> Result<u64, AppError> {
        let _ = self.entered.send(());
        tokio::time::sleep(LOST_BODY).await;
        self.completed.store(true, Ordering::SeqCst);
        Ok(7)
    }
}

#[distributed_lock(key = "on-lost:ignore", lease = "1s", on_lost = "ignore")]
async fn ignores_loss(body: LostBody) -> Result<u64, AppError> {
    body.run().await
}

#[distributed_lock(key = "on-lost:cancel", lease = "1s", on_lost = "cancel")]
async fn cancelled_on_loss(body: LostBody) -> Result<u64, AppError> {
    body.run().await
}

/// Calls `call` (one of the two functions above, on `rt`, with a [`LostBody`]) in a task of
/// its own and waits until its body runs. Returns the task and the body's `completed` flag.
async fn call_until_entered<F>(
    rt: &Runtime,
    call: impl FnOnce(LostBody) -> F,
) -> (JoinHandle<Result<u64, AppError>>, Arc<AtomicBool>)
where
    F: Future<Output = Result<u64, AppError>> + Send + 'static,
{
    let completed = Arc::new(AtomicBool::new(false));
    let (entered, is_in) = oneshot::channel();
    let body = LostBody {
        entered,
        completed: completed.clone(),
    };
    let (rt, call) = (rt.clone(), call(body));
    let task = tokio::spawn(async move { rt.scope(call).await });
    tokio::time::timeout(Duration::from_secs(10), is_in)
        .await
        .expect("the body starts")
        .expect("entered");
    (task, completed)
}

/// Joins a call from [`call_until_entered`], which must return within 20 s.
async fn returned(call: JoinHandle<Result<u64, AppError>>) -> Result<u64, AppError> {
    tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call returns")
        .expect("task")
}

/// Deletes the lock behind its holder's back: raw `DEL` on Redis, `force_unlock` on memory.
async fn delete_behind_back(b: &Backend, key: &str) {
    let existed = match b.engine {
        Engine::Redis => b.redis_server().del(&lock_key(key)).await,
        Engine::Memory => b.rt.force_unlock(key).await.expect("force_unlock"),
    };
    assert!(existed, "{key} was not held when deleted");
}

async fn attribute_on_lost_ignore_body_completes_after_key_deleted(b: Backend) {
    let key = "on-lost:ignore";
    let start = Instant::now();
    let (call, completed) = call_until_entered(&b.rt, ignores_loss).await;
    delete_behind_back(&b, key).await;
    // The lease is really gone while the body still runs: another owner takes the key (and the
    // watchdog's next renewal then fails for certain).
    let other = b.other_runtime().await;
    let thief = other
        .hold_within(key, Duration::from_secs(30), Duration::ZERO)
        .await;
    assert!(!call.is_finished(), "the body ended early");
    let out = returned(call).await;
    let elapsed = start.elapsed();
    assert_eq!(
        out.expect("on_lost = ignore: Ok from the body"),
        7,
        "the body's value"
    );
    assert!(
        completed.load(Ordering::SeqCst),
        "the body did not complete"
    );
    assert!(
        elapsed >= LOST_BODY,
        "returned after {elapsed:?}, before the {LOST_BODY:?} body could finish"
    );
    // The ignoring call's release did not free the new owner's lock.
    assert!(b.is_held(key).await, "the new owner's lock is gone");
    assert!(!thief.is_lost(), "the new owner lost its lock");
    thief.release().await.expect("the new owner releases");
}

async fn attribute_on_lost_cancel_drops_body_after_key_deleted(b: Backend) {
    // The contrast: the same body and the same deletion, under on_lost = "cancel".
    let key = "on-lost:cancel";
    let (call, completed) = call_until_entered(&b.rt, cancelled_on_loss).await;
    let deleted = Instant::now();
    delete_behind_back(&b, key).await;
    let out = returned(call).await;
    let after = deleted.elapsed();
    match out {
        Err(AppError::Lock(LockError::Lost { key: lost })) => assert_eq!(lost, key),
        other => panic!("expected Err(Lock(Lost)), got {other:?}"),
    }
    assert!(!completed.load(Ordering::SeqCst), "the body ran to the end");
    // Detected well within the body's run time, so the ignore test's body does outlive the
    // detection of the same deletion.
    assert!(
        after < Duration::from_millis(2500),
        "Lost came {after:?} after the deletion; the body runs {LOST_BODY:?}"
    );
}
