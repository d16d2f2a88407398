//! Hand-overs within one runtime on the engines that queue waiters themselves (etcd,
//! ZooKeeper): the same checks for both, each engine's test file supplying its server through
//! [`QueueEngine`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_runtime::Runtime;

use crate::{AcquireExt, finish_within, waiter_got_it};

/// An engine with a queue of contenders per key, as the hand-over checks need it.
#[allow(async_fn_in_trait)]
pub trait QueueEngine {
    /// A new runtime on the engine.
    async fn runtime(&self) -> Runtime;

    /// Waits (up to a few seconds) until `key`'s queue in the engine has `len` contenders.
    async fn queue_len(&self, key: &str, len: usize);
}

/// A waiter spawned on `rt` for `key` that, once it holds, notes `name` in `order`, holds a
/// moment and releases; returns its fence.
fn queued_waiter(
    rt: &Runtime,
    key: &'static str,
    name: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> tokio::task::JoinHandle<Option<u64>> {
    let (rt, order) = (rt.clone(), order.clone());
    tokio::spawn(async move {
        let guard = rt.lock(key).wait(Duration::from_secs(20)).held(name).await;
        order.lock().unwrap().push(name);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let fence = guard.fence();
        guard.release().await.expect("the waiter releases");
        fence
    })
}

/// Hand-overs within a runtime never let it overtake another: with waiters of runtime A
/// queued around one of runtime B (A holds; A1, B1, A2, A3 queued in that order), the lock
/// goes in arrival order, and every holder's fence is above the previous one's.
pub async fn keep_the_queue_order_across_runtimes(engine: &impl QueueEngine, key: &'static str) {
    let (a, b) = (engine.runtime().await, engine.runtime().await);
    let holder = a.lock(key).held("A holds").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, (rt, name)) in [(&a, "A1"), (&b, "B1"), (&a, "A2"), (&a, "A3")]
        .into_iter()
        .enumerate()
    {
        waiters.push(queued_waiter(rt, key, name, &order));
        engine.queue_len(key, i + 2).await;
    }
    // Past every waiter's lookup and its watch on its predecessor.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fences = vec![holder.fence()];
    holder.release().await.expect("A releases");
    for waiter in waiters {
        let fence = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("every waiter gets the lock")
            .expect("waiter task");
        fences.push(fence);
    }
    assert_eq!(*order.lock().unwrap(), ["A1", "B1", "A2", "A3"], "FIFO");
    assert!(
        fences.windows(2).all(|w| w[0].is_some() && w[0] < w[1]),
        "fences strictly increase in holding order: {fences:?}"
    );
    engine.queue_len(key, 0).await;
}

/// A waiter of the holder's runtime that gives up right as the holder releases (its task is
/// aborted) is not left holding a key nobody owns: its entry goes, and the next waiter of the
/// same runtime gets the lock; in the end the queue is empty and the key free.
pub async fn a_cancelled_local_waiter_leaves_no_hold_behind(
    engine: &impl QueueEngine,
    key: &'static str,
) {
    let rt = engine.runtime().await;
    for round in 0..3 {
        let holder = rt.lock(key).held("holder").await;
        let cancelled = rt.lock(key).wait(Duration::from_secs(30)).spawn();
        engine.queue_len(key, 2).await;
        let next = rt.lock(key).wait(Duration::from_secs(30)).spawn();
        engine.queue_len(key, 3).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Round 0: aborted before the release; 1: at the same time; 2: just after it.
        if round == 0 {
            cancelled.abort();
        }
        let release = holder.release();
        if round == 1 {
            cancelled.abort();
        }
        release.await.expect("the holder releases");
        if round == 2 {
            cancelled.abort();
        }
        if let Ok((Ok(guard), _)) = cancelled.await {
            // It took the lock before the abort reached it: an ordinary holder.
            guard.release().await.expect("release");
        }
        let (guard, _) = waiter_got_it(next, Duration::from_secs(5), "the next waiter").await;
        guard.release().await.expect("the next waiter releases");
        engine.queue_len(key, 0).await;
        rt.lock(key)
            .wait(Duration::ZERO)
            .cycled("free at the end")
            .await;
    }
}

/// A hand-over within the runtime costs no round trip: on a hot key (8 tasks of one runtime),
/// fences strictly increasing, the median from a release to the next holder is far below an
/// uncontended acquire + release on the same runtime (`raw_key`), which costs about what a
/// hand-over through the engine does (its delete, then the event and a read).
pub async fn a_hot_key_hand_over_is_far_below_a_write(
    engine: &impl QueueEngine,
    key: &'static str,
    raw_key: &'static str,
) {
    let rt = engine.runtime().await;
    let mut pair = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        rt.lock(raw_key)
            .wait(Duration::ZERO)
            .cycled("uncontended")
            .await;
        pair.push(t.elapsed());
    }
    pair.sort();
    let pair = pair[pair.len() / 2];
    let released_at = Arc::new(Mutex::new(None::<Instant>));
    let handoffs = Arc::new(Mutex::new(Vec::new()));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (rt, released_at) = (rt.clone(), released_at.clone());
        let (handoffs, fences) = (handoffs.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = rt.lock(key).wait(Duration::from_secs(30)).held("hot").await;
                if let Some(at) = released_at.lock().unwrap().take() {
                    handoffs.lock().unwrap().push(at.elapsed());
                }
                fences.lock().unwrap().push(guard.fence());
                tokio::time::sleep(Duration::from_millis(2)).await;
                *released_at.lock().unwrap() = Some(Instant::now());
                guard.release().await.expect("release");
            }
        }));
    }
    finish_within(tasks, Duration::from_secs(60)).await;
    let fences = fences.lock().unwrap().clone();
    assert!(
        fences.windows(2).all(|w| w[0].is_some() && w[0] < w[1]),
        "fences strictly increase in holding order: {fences:?}"
    );
    let mut handoffs = handoffs.lock().unwrap().clone();
    handoffs.sort();
    let median = handoffs[handoffs.len() / 2];
    println!("acquire + release {pair:?}, hand-over median {median:?}");
    assert!(
        median < pair / 4,
        "a hand-over within the runtime took {median:?}; an acquire + release {pair:?}"
    );
}
