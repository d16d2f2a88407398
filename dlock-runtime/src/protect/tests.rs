use std::time::Duration;

use tokio::time::Instant;

use super::LossCheck;
use crate::lease::LostSignal;

/// A body resumed after its validity ran out (the process was stopped; the watchdog has not
/// run since) takes no further step.
#[tokio::test(start_paused = true)]
async fn no_step_after_the_validity_ran_out_even_before_the_watchdog_runs() {
    let signal = LostSignal::default();
    signal.set_valid_until(Instant::now() + Duration::from_secs(1));
    let mut check = LossCheck::new(false);
    let mut steps = 0;
    while check.may_step(&signal) && steps < 10 {
        steps += 1;
        tokio::time::advance(Duration::from_millis(400)).await;
    }
    assert!(!signal.is_lost(), "nobody fired the signal");
    // Steps at 0, 400 and 800 ms; none at 1200 ms.
    assert_eq!(steps, 3);
}

/// A hold whose validity had run out before it was registered (the acquire's answer came
/// back later than the lease) takes no step, although its first step is checked against
/// the registration's clock reading rather than a new one.
#[tokio::test(start_paused = true)]
async fn fresh_hold_whose_validity_ran_out_before_it_was_registered_takes_no_step() {
    let sent = Instant::now();
    tokio::time::advance(Duration::from_secs(2)).await;
    let signal = LostSignal::default();
    signal.set_valid_until(sent + Duration::from_secs(1));
    assert!(!LossCheck::new(true).may_step(&signal));
    // Still valid when registered: the first step runs.
    let signal = LostSignal::default();
    signal.set_valid_until(Instant::now() + Duration::from_secs(1));
    assert!(LossCheck::new(true).may_step(&signal));
}

/// A body whose first step makes a nested locked call that ends without waiting, then blocks
/// its thread past its lease: the outer hold stays in the watchdog's sight (the nested call's
/// publication ends with its step) and is renewed, so nobody else gets the key meanwhile.
/// (The nested call used to leave its own hold in the thread's slot in place of the outer one,
/// which then expired under the still-running body.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_ending_in_the_first_step_leaves_the_outer_hold_renewed() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::protect::with_lock;
    use crate::runtime::Runtime;

    let rt = Runtime::from_url("memory://").await.expect("memory");
    // Long enough for renewals on a loaded machine; the body blocks for three of them.
    let lease = Duration::from_millis(800);
    let (stolen, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let checker = {
        let (rt, stolen, done) = (rt.clone(), stolen.clone(), done.clone());
        std::thread::spawn(move || {
            let local = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("checker runtime");
            local.block_on(async {
                while !done.load(Ordering::SeqCst) {
                    if let Ok(guard) = rt.lock("outer").acquire().await {
                        stolen.store(true, Ordering::SeqCst);
                        drop(guard);
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            });
        })
    };
    // Let the checker try once while the key is free.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        stolen.swap(false, Ordering::SeqCst),
        "the checker cannot take a free key"
    );
    let out = with_lock(rt.lock("outer").lease(lease), async {
        with_lock(rt.lock("inner").lease(lease), async {})
            .await
            .expect("inner call");
        // A synchronous call in async code, three leases long.
        std::thread::sleep(lease * 3);
    })
    .await;
    done.store(true, Ordering::SeqCst);
    checker.join().expect("checker thread");
    assert!(
        !stolen.load(Ordering::SeqCst),
        "another owner acquired the key while the body ran"
    );
    out.expect("the outer hold was kept");
}
