//! An axum inventory service whose reserve endpoint is a `#[distributed_lock]` handler.
//!
//! ```text
//! #[distributed_lock(key = "item:{id}", wait = "200ms")]
//! async fn reserve(State(state): State<AppState>, Path(id): Path<u64>, Json(req): Json<ReserveRequest>)
//!     -> Result<Json<Reservation>, AppError>
//! ```
//!
//! The key comes from the `Path(id)` pattern; a reservation that cannot get the item's lock
//! within 200 ms answers `409` with a `Retry-After` of the holder's remaining lease (`AppError`
//! hands lock errors to `LockError`'s `IntoResponse`, dlock-runtime's feature `axum`:
//! `Timeout` 409, `Backend`/`Lost` 503). Routes and bodies: see `dlock_examples::inventory`.
//!
//! Run it on the embedded memory engine (one process):
//!
//! ```text
//! cargo run -p dlock-examples --bin inventory
//! curl localhost:3000/items/1
//! curl -X POST localhost:3000/items/1/reserve -H 'content-type: application/json' -d '{"qty":2}'
//! curl -X PUT localhost:3000/items/1 -H 'content-type: application/json' -d '{"stock":10}'
//! ```
//!
//! Or several instances on Redis, sharing locks and stock:
//!
//! ```text
//! DLOCK_URL=redis://127.0.0.1:6379 PORT=3000 cargo run -p dlock-examples --bin inventory
//! DLOCK_URL=redis://127.0.0.1:6379 PORT=3001 cargo run -p dlock-examples --bin inventory
//! ```
//!
//! Environment: `PORT` (default 3000; binds 127.0.0.1 only), `DLOCK_URL` (lock engine, and the
//! stock store when it is `redis://`), `INITIAL_STOCK` (default 100: items 1 to 3 get it at
//! startup unless they already have a stock), `RUST_LOG` (e.g. `dlock_runtime=debug`).

use std::error::Error;

use dlock_examples::inventory::{self, stock_key};
use dlock_examples::store::Store;
use dlock_runtime::Runtime;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    dlock_examples::init_logging();

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|e| format!("PORT={port:?} is not a port number: {e}"))?,
        Err(_) => 3000,
    };
    let initial: i64 = match std::env::var("INITIAL_STOCK") {
        Ok(n) => n
            .parse()
            .map_err(|e| format!("INITIAL_STOCK={n:?} is not a number: {e}"))?,
        Err(_) => 100,
    };

    // DLOCK_URL, or the in-process memory:// engine (with a warning) when unset.
    let runtime = Runtime::from_env().await?;
    runtime.clone().install()?;
    let store = Store::from_env().await?;

    for id in 1..=3 {
        if store.get(&stock_key(id)).await?.is_none() {
            store.set(&stock_key(id), initial).await?;
        }
    }

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!(
        "inventory on http://{addr} (locks: {}, stock: {}); items 1, 2, 3",
        runtime.engine(),
        store.kind()
    );
    println!("  curl {addr}/items/1");
    println!(
        "  curl -X POST {addr}/items/1/reserve -H 'content-type: application/json' -d '{{\"qty\":1}}'"
    );

    axum::serve(listener, inventory::app(store, runtime))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
