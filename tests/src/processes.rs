//! `dlock-holder` processes (this package's binary): a holder to kill or pause, and processes
//! counting under a lock.

use std::path::PathBuf;
use std::time::Duration;

use dlock_testkit::{HolderProcess, RedisServer};

/// The `dlock-holder` binary Cargo built beside the running test (`target/<profile>/`, the
/// test itself being in `target/<profile>/deps/`).
pub fn holder_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary under target/<profile>/deps");
    let bin = dir.join(format!("dlock-holder{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build this package's binaries",
        bin.display()
    );
    bin
}

fn spawn(args: &[&str]) -> HolderProcess {
    let bin = holder_bin();
    HolderProcess::spawn(bin.to_str().expect("a UTF-8 path"), args)
}

/// Starts `dlock-holder --mode hold` taking `key` on `url` with a `lease_ms` lease (plus
/// `extra` arguments), without waiting for it to acquire.
pub fn spawn_hold_process(url: &str, key: &str, lease_ms: u64, extra: &[&str]) -> HolderProcess {
    let lease_ms = lease_ms.to_string();
    let mut args = vec![
        "--url",
        url,
        "--key",
        key,
        "--mode",
        "hold",
        "--lease-ms",
        &lease_ms,
    ];
    args.extend_from_slice(extra);
    spawn(&args)
}

/// [`spawn_hold_process`], then waits up to 20 s for its `acquired <fence>` line. Returns the
/// process and the fence it printed (`None` for `acquired none`: Redlock).
pub async fn hold_in_process(
    url: &str,
    key: &str,
    lease_ms: u64,
    extra: &[&str],
) -> (HolderProcess, Option<u64>) {
    let mut holder = spawn_hold_process(url, key, lease_ms, extra);
    let line = holder.next_line(Duration::from_secs(20)).await;
    let fence = match line.strip_prefix("acquired ") {
        Some("none") => None,
        Some(fence) => Some(
            fence
                .parse()
                .unwrap_or_else(|_| panic!("unexpected holder output {line:?}")),
        ),
        None => panic!("expected `acquired <fence>`, got {line:?}"),
    };
    (holder, fence)
}

/// [`hold_in_process`] on an engine that gives fences (plain arguments): the process and its
/// fence.
pub async fn hold_fenced_in_process(url: &str, key: &str, lease_ms: u64) -> (HolderProcess, u64) {
    let (holder, fence) = hold_in_process(url, key, lease_ms, &[]).await;
    (holder, fence.expect("the holder printed a fence"))
}

/// How a `dlock-holder` increments its counter.
#[derive(Debug, Clone, Copy)]
pub enum Counting {
    /// `--mode counter`: under a guard from `Runtime::lock`.
    Guard,
    /// `--mode attr-counter`: inside a `#[distributed_lock]` fn.
    Attribute,
}

/// Runs `processes` `dlock-holder`s on `url`: each increments the counter `counter:<key>` on
/// `store` `iterations` times (GET, sleep 1 ms, SET) holding `key`, the way `counting` says.
/// Asserts every process prints `done <iterations>` and exits successfully within 120 s;
/// returns the counter, which is exact only under mutual exclusion.
pub async fn count_in_processes(
    counting: Counting,
    url: &str,
    store: &RedisServer,
    key: &str,
    (processes, iterations): (u64, u64),
) -> u64 {
    let mode = match counting {
        Counting::Guard => "counter",
        Counting::Attribute => "attr-counter",
    };
    let (store_url, counter) = (store.url(), format!("counter:{key}"));
    let iterations_arg = iterations.to_string();
    let args = [
        "--url",
        url,
        "--counter-url",
        &store_url,
        "--key",
        key,
        "--mode",
        mode,
        "--iterations",
        &iterations_arg,
        "--counter",
        &counter,
    ];
    let mut holders: Vec<_> = (0..processes).map(|_| spawn(&args)).collect();
    for holder in &mut holders {
        let status = holder.wait(Duration::from_secs(120)).await;
        assert!(status.success(), "dlock-holder failed: {status}");
        assert_eq!(
            holder.next_line(Duration::from_secs(1)).await,
            format!("done {iterations}")
        );
    }
    store.query(redis::cmd("GET").arg(&counter)).await
}
