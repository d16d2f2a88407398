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
