use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

fn after(ms: u64, value: u32) -> NodeCall<u32> {
    Box::pin(async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(value)
    })
}

/// A fan-out over nodes answering `value` after `ms` each, awaited when `connecting`.
fn fan(nodes: &[(u64, u32, bool)]) -> FanOut<u32> {
    FanOut::new(
        nodes
            .iter()
            .map(|&(ms, value, connecting)| (after(ms, value), connecting))
            .collect(),
    )
}

#[tokio::test(start_paused = true)]
async fn settles_at_the_first_deciding_answer_and_finishes_the_rest_in_the_background() {
    let mut fan = fan(&[(10, 1, false), (20, 2, false), (1000, 3, false)]);
    let started = tokio::time::Instant::now();
    fan.until(|answers| answers.iter().flatten().count() >= 2)
        .await;
    assert_eq!(started.elapsed(), Duration::from_millis(20));
    assert!(
        fan.answers()[2].is_none(),
        "the slowest node has not answered"
    );
    let late = Arc::new(Mutex::new(Vec::new()));
    let seen = late.clone();
    let rest = fan.rest(move |i, answer| {
        seen.lock().unwrap().push((i, answer.unwrap()));
    });
    rest.spawn();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(*late.lock().unwrap(), vec![(2, 3)]);
}

#[tokio::test(start_paused = true)]
async fn waits_for_every_answer_when_nothing_settles_earlier() {
    let mut fan = fan(&[(10, 1, false), (30, 2, false), (20, 3, false)]);
    fan.until(|_| false).await;
    let answers: Vec<u32> = fan
        .answers()
        .iter()
        .map(|a| *a.as_ref().unwrap().as_ref().unwrap())
        .collect();
    assert_eq!(answers, vec![1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_node_that_may_be_connecting_is_awaited_even_when_the_others_settle() {
    let mut fan = fan(&[(10, 1, false), (20, 2, false), (500, 3, true)]);
    let started = tokio::time::Instant::now();
    fan.until(|answers| answers.iter().flatten().count() >= 2)
        .await;
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert!(fan.answers()[2].is_some(), "the awaited node answered");
}

#[tokio::test]
async fn a_started_chore_has_run_up_to_its_first_wait_before_start_returns() {
    let mut background = Background::default();
    let sent = Arc::new(Mutex::new(false));
    let flag = sent.clone();
    background.start(async move {
        *flag.lock().unwrap() = true;
        tokio::task::yield_now().await;
    });
    assert!(*sent.lock().unwrap(), "the chore's first step ran in start");
    background.spawn();
}
