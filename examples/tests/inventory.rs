//! End-to-end test of the inventory service: the real axum app on a loopback port, hit by 200
//! concurrent HTTP reservations for 50 units, on the memory engine and on a real redis-server.

// In a test a panic is how a check fails.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use dlock_examples::inventory::{self, Item, Reservation, ReserveRequest, SetStock};
use dlock_examples::store::Store;
use dlock_runtime::Runtime;
use dlock_testkit::RedisServer;
use reqwest::StatusCode;

const ITEM: u64 = 7;
const STOCK: u32 = 50;
const REQUESTS: usize = 200;

/// Serves `inventory::app(store, runtime)` on 127.0.0.1:0; the server task ends with the test's
/// tokio runtime.
async fn serve(store: Store, runtime: Runtime) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(listener, inventory::app(store, runtime))
            .await
            .expect("serve the inventory app");
    });
    addr
}

/// The answer to one reservation request.
#[derive(Debug)]
enum Outcome {
    Reserved(Reservation),
    OutOfStock,
    Busy,
}

/// POSTs a reservation of one unit of [`ITEM`].
async fn post_reserve(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Response {
    client
        .post(format!("http://{addr}/items/{ITEM}/reserve"))
        .json(&ReserveRequest {
            qty: NonZeroU32::MIN,
        })
        .send()
        .await
        .expect("send a reserve request")
}

async fn reserve(client: &reqwest::Client, addr: SocketAddr) -> Outcome {
    let response = post_reserve(client, addr).await;
    match response.status() {
        StatusCode::OK => Outcome::Reserved(response.json().await.expect("a reservation body")),
        StatusCode::CONFLICT => {
            let retry_after = response.headers().get("retry-after").cloned();
            let body: serde_json::Value = response.json().await.expect("an error body");
            if body["error"] == "out_of_stock" {
                return Outcome::OutOfStock;
            }
            // The lock's own answer (feature `axum`): the key, and when to retry.
            assert_eq!(
                body["key"],
                format!("item:{ITEM}"),
                "unexpected 409: {body}"
            );
            assert!(retry_after.is_some(), "busy answers carry Retry-After");
            Outcome::Busy
        }
        status => {
            let text = response.text().await.unwrap_or_default();
            panic!("unexpected answer {status}: {text}")
        }
    }
}

/// `GET /items/{ITEM}`.
async fn get_item(client: &reqwest::Client, addr: SocketAddr) -> reqwest::Response {
    client
        .get(format!("http://{addr}/items/{ITEM}"))
        .send()
        .await
        .expect("send a GET")
}

async fn stock(client: &reqwest::Client, addr: SocketAddr) -> i64 {
    let response = get_item(client, addr).await;
    assert_eq!(response.status(), StatusCode::OK);
    let item: Item = response.json().await.expect("an item body");
    assert_eq!(item.id, ITEM);
    item.stock
}

/// A buyer: reserves one unit, retrying (as a client told "busy, retry later" would) until the
/// answer is final. Returns the final answer and how many busy answers came before it.
///
/// Without the retries the number of sales would depend on timing: on a loaded machine 50
/// lock hand-offs may take longer than the handler's 200 ms wait, and some buyers would give
/// up while stock is left.
async fn buyer(client: reqwest::Client, addr: SocketAddr) -> (Outcome, u32) {
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let mut busy = 0;
    loop {
        match reserve(&client, addr).await {
            Outcome::Busy if std::time::Instant::now() < give_up => {
                busy += 1;
                // Shorter than the advertised Retry-After, to keep the test quick.
                tokio::time::sleep(Duration::from_millis(10 * u64::from(busy.min(5)))).await;
            }
            outcome => return (outcome, busy),
        }
    }
}

/// Stocks the item through the API, fires `REQUESTS` concurrent buyers, and checks that
/// exactly `STOCK` succeeded, each from a different stock level, and the item ends at 0.
async fn sale(store: Store, runtime: Runtime) {
    let addr = serve(store, runtime.clone()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an http client");

    let missing = get_item(&client, addr).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let put = client
        .put(format!("http://{addr}/items/{ITEM}"))
        .json(&SetStock { stock: STOCK })
        .send()
        .await
        .expect("send a PUT");
    assert_eq!(put.status(), StatusCode::OK);
    assert_eq!(stock(&client, addr).await, i64::from(STOCK));

    // A zero quantity never reaches the handler: axum's `Json` rejects it.
    let zero = client
        .post(format!("http://{addr}/items/{ITEM}/reserve"))
        .header("content-type", "application/json")
        .body(r#"{"qty":0}"#)
        .send()
        .await
        .expect("send a reserve request");
    assert_eq!(zero.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // While somebody else holds the item's lock, a reservation waits 200 ms, then is told busy.
    let holder = runtime
        .lock(format!("item:{ITEM}"))
        .acquire()
        .await
        .expect("hold the item's lock");
    let started = std::time::Instant::now();
    assert!(matches!(reserve(&client, addr).await, Outcome::Busy));
    assert!(started.elapsed() >= Duration::from_millis(200));
    holder.release().await.expect("release the item's lock");
    assert_eq!(stock(&client, addr).await, i64::from(STOCK));

    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS {
        let client = client.clone();
        requests.spawn(buyer(client, addr));
    }
    let (mut reserved, mut out_of_stock, mut busy) = (Vec::new(), 0, 0);
    while let Some(result) = requests.join_next().await {
        let (outcome, busy_answers) = result.expect("a buyer task");
        busy += busy_answers;
        match outcome {
            Outcome::Reserved(r) => reserved.push(r),
            Outcome::OutOfStock => out_of_stock += 1,
            Outcome::Busy => panic!("a buyer was still told busy after a minute of retrying"),
        }
    }
    eprintln!(
        "{} reserved, {out_of_stock} out of stock; {busy} busy answers retried",
        reserved.len()
    );

    assert_eq!(
        reserved.len(),
        STOCK as usize,
        "exactly the stock is sold ({out_of_stock} out of stock)"
    );
    assert_eq!(reserved.len() + out_of_stock, REQUESTS);
    // Never below zero, and every reservation left a different stock level: 49, 48, ..., 0.
    let levels: BTreeSet<i64> = reserved.iter().map(|r| r.remaining).collect();
    assert_eq!(levels, (0..i64::from(STOCK)).collect::<BTreeSet<_>>());
    // Each reservation ran under its own acquisition: distinct fencing tokens that grow as the
    // stock goes down.
    let mut by_level: Vec<&Reservation> = reserved.iter().collect();
    by_level.sort_by_key(|r| std::cmp::Reverse(r.remaining));
    let fences: Vec<u64> = by_level
        .iter()
        .map(|r| r.fence.expect("a fencing token"))
        .collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences increase as the stock goes down: {fences:?}"
    );
    assert_eq!(stock(&client, addr).await, 0);
    // Sold out stays sold out.
    assert!(matches!(reserve(&client, addr).await, Outcome::OutOfStock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_buyers_fifty_units_on_memory() {
    // The handlers' attribute sets their wait (200 ms), so the runtime's defaults do not matter.
    let runtime = Runtime::builder()
        .memory()
        .build()
        .await
        .expect("a memory runtime");
    sale(Store::memory(), runtime).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_buyers_fifty_units_on_redis() {
    let server = RedisServer::start();
    let runtime = Runtime::builder()
        .redis(server.url())
        .build()
        .await
        .expect("a redis runtime");
    let store = Store::redis(&server.url())
        .await
        .expect("a redis stock store");
    sale(store.clone(), runtime.clone()).await;
    // The stock really lives in Redis.
    let raw: i64 = server
        .query(redis::cmd("GET").arg(inventory::stock_key(ITEM)))
        .await;
    assert_eq!(raw, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_engine_down_is_503() {
    let mut server = RedisServer::start();
    let runtime = Runtime::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a redis runtime");
    let addr = serve(Store::memory(), runtime).await;
    server.kill9();
    let response = post_reserve(&reqwest::Client::new(), addr).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = response.json().await.expect("an error body");
    assert_eq!(body["key"], format!("item:{ITEM}"), "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("lock backend error")),
        "{body}"
    );
}
