//! The process-wide runtime: `NotInstalled` before `install`, `AlreadyInstalled` on a second
//! install, and `scope` overriding the global for a task. Its own test binary: `install` is
//! process-global, and only `install_lifecycle` may install.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_runtime::{LockError, current_fence, with_lock};
use dlock_tests::{AcquireExt, BuildExt, Runtime};

async fn memory_runtime(prefix: &str) -> Runtime {
    Runtime::builder().memory().key_prefix(prefix).built().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_lifecycle_not_installed_then_installed_then_already_installed() {
    // Before install.
    let err = Runtime::current()
        .map(|_rt| ())
        .expect_err("nothing installed yet");
    assert!(matches!(err, LockError::NotInstalled), "got {err:?}");
    let err = dlock_runtime::lock("install:k")
        .refused("lock() before install")
        .await;
    assert!(matches!(err, LockError::NotInstalled), "got {err:?}");
    let body_ran = AtomicBool::new(false);
    let err = with_lock(dlock_runtime::lock("install:k"), async {
        body_ran.store(true, Ordering::SeqCst);
    })
    .await
    .expect_err("with_lock before install");
    assert!(matches!(err, LockError::NotInstalled), "got {err:?}");
    assert!(
        !body_ran.load(Ordering::SeqCst),
        "the body ran without a lock"
    );

    // Install once.
    let global = memory_runtime("installed:").await;
    global.clone().install().expect("first install");
    assert_eq!(
        Runtime::current().expect("installed").key_prefix(),
        "installed:"
    );
    let guard = dlock_runtime::lock("install:k")
        .wait(Duration::ZERO)
        .held("lock() after install")
        .await;
    assert!(guard.fence().is_some());
    assert!(global.is_locked("install:k").await.expect("is_locked"));
    guard.release().await.expect("release");
    let fence = with_lock(dlock_runtime::lock("install:k"), async { current_fence() })
        .await
        .expect("with_lock after install");
    assert!(fence.is_some());

    // Install twice.
    let err = memory_runtime("second:")
        .await
        .install()
        .expect_err("second install");
    assert!(matches!(err, LockError::AlreadyInstalled), "got {err:?}");
    let err = global.clone().install().expect_err("same runtime again");
    assert!(matches!(err, LockError::AlreadyInstalled), "got {err:?}");
    assert_eq!(
        Runtime::current().expect("still installed").key_prefix(),
        "installed:",
        "a failed install must not replace the global"
    );

    // A scope overrides the global inside, and only inside.
    let scoped = memory_runtime("scoped:").await;
    let inside = scoped
        .scope(async { Runtime::current().expect("scoped").key_prefix().to_string() })
        .await;
    assert_eq!(inside, "scoped:");
    assert_eq!(
        Runtime::current().expect("global").key_prefix(),
        "installed:"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_inside_scope_is_the_scoped_runtime() {
    let outer = memory_runtime("outer:").await;
    let inner = memory_runtime("inner:").await;
    outer
        .scope(async {
            assert_eq!(Runtime::current().expect("outer").key_prefix(), "outer:");
            inner
                .scope(async {
                    assert_eq!(Runtime::current().expect("inner").key_prefix(), "inner:");
                    // lock() resolves the runtime at acquire time: the scoped one.
                    let guard = dlock_runtime::lock("scope:k")
                        .held("lock() inside a scope")
                        .await;
                    assert!(inner.is_locked("scope:k").await.expect("is_locked"));
                    guard.release().await.expect("release");
                })
                .await;
            assert_eq!(
                Runtime::current().expect("outer again").key_prefix(),
                "outer:"
            );
        })
        .await;
}
