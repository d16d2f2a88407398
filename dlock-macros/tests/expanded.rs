//! The expanded code at run time, on the in-process memory engine: the key it builds, and that
//! the lock is held while the body runs and released on every exit path the body can take.
//! How engines lock, wait, renew and fail is tested in `dlock-runtime` and the `tests` package.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_runtime::{LockError, Runtime, distributed_lock};

async fn memory() -> Runtime {
    Runtime::builder()
        .memory()
        .build()
        .await
        .expect("memory runtime")
}

/// Whether `key` is held in the current runtime.
async fn held(key: &str) -> bool {
    Runtime::current()
        .expect("a runtime in scope")
        .is_locked(key)
        .await
        .expect("memory engine answers")
}

#[derive(Debug)]
enum ShopError {
    SoldOut,
    Parse,
    Lock(LockError),
}

impl From<LockError> for ShopError {
    fn from(err: LockError) -> Self {
        ShopError::Lock(err)
    }
}

struct User {
    id: u64,
}

struct Order {
    user: User,
    sku: &'static str,
}

struct Path<T>(T);

#[distributed_lock(key = "stock:{id}")]
async fn curly(id: u64) -> Result<bool, LockError> {
    Ok(held("stock:42").await)
}

#[distributed_lock(key = "stock:<id>")]
async fn angle(id: u64) -> Result<bool, LockError> {
    Ok(held("stock:42").await)
}

#[distributed_lock(key = "order:{order.user.id}:<order.sku>:{{x}}:<<y>>")]
async fn nested(order: Order) -> Result<bool, LockError> {
    Ok(held("order:7:sku-1:{x}:<y>").await && order.user.id == 7)
}

#[distributed_lock(key = "path:<id>")]
async fn pattern(Path(id): Path<u64>) -> Result<bool, LockError> {
    Ok(held(&format!("path:{id}")).await)
}

struct Shop {
    tenant: String,
    sold: u64,
}

impl Shop {
    #[distributed_lock(key = "{self.tenant}:stock:{id}")]
    async fn shared(&self, id: u64) -> Result<bool, LockError> {
        Ok(held(&format!("{}:stock:{id}", self.tenant)).await)
    }

    #[distributed_lock(key = "<self.tenant>:sold")]
    async fn exclusive(&mut self, qty: u64) -> Result<u64, LockError> {
        assert!(held("acme:sold").await);
        self.sold += qty;
        Ok(self.sold)
    }

    #[distributed_lock(key = "{self.tenant}:arc")]
    async fn arc(self: Arc<Self>) -> Result<bool, LockError> {
        Ok(held("acme:arc").await)
    }
}

#[tokio::test]
async fn builds_the_key_from_placeholders() {
    let rt = memory().await;
    rt.scope(async {
        assert!(curly(42).await.unwrap());
        assert!(angle(42).await.unwrap());
        let order = Order {
            user: User { id: 7 },
            sku: "sku-1",
        };
        assert!(nested(order).await.unwrap());
        assert!(pattern(Path(9)).await.unwrap());

        let mut shop = Shop {
            tenant: "acme".to_owned(),
            sold: 0,
        };
        assert!(shop.shared(3).await.unwrap());
        assert_eq!(shop.exclusive(2).await.unwrap(), 2);
        assert!(Arc::new(shop).arc().await.unwrap());
    })
    .await;
}

#[distributed_lock(key = "exit:{id}", wait = "0s")]
async fn exits(id: u64, how: &str) -> Result<u64, ShopError> {
    assert!(held(&format!("exit:{id}")).await);
    let qty: u64 = how.parse().map_err(|_| ShopError::Parse)?;
    if qty == 0 {
        return Err(ShopError::SoldOut);
    }
    if qty == 1 {
        return Ok(1);
    }
    Ok(qty * 10)
}

#[tokio::test]
async fn releases_on_every_exit_path() {
    let rt = memory().await;
    rt.scope(async {
        assert_eq!(exits(1, "3").await.unwrap(), 30);
        assert!(!held("exit:1").await);
        assert!(matches!(exits(1, "x").await, Err(ShopError::Parse)));
        assert!(!held("exit:1").await);
        assert!(matches!(exits(1, "0").await, Err(ShopError::SoldOut)));
        assert!(!held("exit:1").await);
        assert_eq!(exits(1, "1").await.unwrap(), 1);
        assert!(!held("exit:1").await);
    })
    .await;
}

#[tokio::test]
async fn busy_lock_returns_the_lock_error_without_running_the_body() {
    let rt = memory().await;
    rt.scope(async {
        let guard = dlock_runtime::lock("exit:5").acquire().await.unwrap();
        match exits(5, "not run").await {
            Err(ShopError::Lock(err)) => assert!(err.is_timeout(), "{err}"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        guard.release().await.unwrap();
        assert_eq!(exits(5, "2").await.unwrap(), 20);
    })
    .await;
}

#[distributed_lock(key = "counter", wait = "5s", lease = "2s")]
async fn one_at_a_time(inside: &AtomicUsize, most: &AtomicUsize) -> Result<(), LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn concurrent_calls_exclude_each_other() {
    let rt = memory().await;
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    rt.scope(async {
        let (a, b, c, d) = tokio::join!(
            one_at_a_time(&inside, &most),
            one_at_a_time(&inside, &most),
            one_at_a_time(&inside, &most),
            one_at_a_time(&inside, &most),
        );
        a.and(b).and(c).and(d).unwrap();
    })
    .await;
    assert_eq!(most.load(Ordering::SeqCst), 1);
}

#[distributed_lock(key = "reentrant:{id}", wait = "0s")]
async fn outer(id: u64) -> Result<u64, LockError> {
    inner(id).await
}

#[distributed_lock(key = "reentrant:{id}", wait = "0s")]
async fn inner(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::test]
async fn nested_guarded_calls_with_the_same_key_reenter() {
    let rt = memory().await;
    rt.scope(async {
        assert_eq!(outer(3).await.unwrap(), 3);
        assert!(!held("reentrant:3").await);
    })
    .await;
}

#[distributed_lock(
    key = "options",
    lease = "1s",
    wait = "0s",
    watchdog = false,
    on_lost = "ignore"
)]
async fn with_every_option() -> Result<bool, LockError> {
    Ok(held("options").await)
}

#[tokio::test]
async fn options_reach_the_runtime() {
    let rt = memory().await;
    rt.scope(async {
        assert!(with_every_option().await.unwrap());
        assert!(!held("options").await);
    })
    .await;
}

#[tokio::test]
async fn without_a_runtime_the_body_does_not_run() {
    // No `scope` and nothing installed in this test binary.
    match curly(1).await {
        Err(err) => assert!(matches!(err, LockError::NotInstalled), "{err}"),
        Ok(_) => panic!("the body ran without a lock"),
    }
}
