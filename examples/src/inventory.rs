//! The inventory service of the `inventory` binary: an axum 0.8 router whose reserve handler is
//! a `#[distributed_lock]` critical section.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /items/{id}` | | `200 {"id":7,"stock":50}`, `404` for an unknown item |
//! | `PUT /items/{id}` | `{"stock":50}` | `200 {"id":7,"stock":50}` (sets the stock, under the lock) |
//! | `POST /items/{id}/reserve` | `{"qty":1}` | `200 {"id":7,"reserved":1,"remaining":49,"fence":12}` |
//!
//! Errors are JSON (see [`AppError`]): the service's own `{"error": "...", "message": "..."}`
//! for `409 out_of_stock`, `404 not_found`, `503 unavailable` (store down); lock errors answer
//! as dlock-runtime's feature `axum` makes them, `{"error": "<message>", "key": "item:7"}`:
//! `409` when the item's lock stayed taken for the whole 200 ms wait (with a `Retry-After` of
//! the holder's remaining lease), `503` when the lock engine is down or the lease was lost,
//! `500` for a misconfiguration. A body that is not `{"qty": n}` with `n >= 1` is rejected by axum's `Json`
//! extractor (`422`/`400`) before any lock is taken.

use std::num::NonZeroU32;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dlock_runtime::{LockError, Runtime, current_fence, distributed_lock};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreError};

/// Builds the service's router.
///
/// Every request runs inside [`Runtime::scope`] of `runtime`, so the handlers' locks use it
/// whether or not a runtime is installed process-wide. That lets a test run several apps with
/// different engines in one process; a service with a single runtime may as well
/// [`install`](Runtime::install) it too (the `inventory` binary does both).
pub fn app(store: Store, runtime: Runtime) -> Router {
    Router::new()
        .route("/items/{id}", get(get_item).put(put_item))
        .route("/items/{id}/reserve", post(reserve))
        .with_state(AppState { store })
        .layer(middleware::from_fn_with_state(runtime, in_lock_scope))
}

/// Runs the rest of the request with `runtime` as the current lock runtime.
async fn in_lock_scope(State(runtime): State<Runtime>, request: Request, next: Next) -> Response {
    runtime.scope(next.run(request)).await
}

/// The handlers' shared state.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Where the stock lives.
    pub store: Store,
}

/// The store key holding the stock of item `id`.
pub fn stock_key(id: u64) -> String {
    format!("inventory:item:{id}")
}

/// Body of `POST /items/{id}/reserve`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// How many units to take; at least 1.
    pub qty: NonZeroU32,
}

/// Body of `PUT /items/{id}`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct SetStock {
    /// The new stock.
    pub stock: u32,
}

/// An item and its stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Item id.
    pub id: u64,
    /// Units in stock.
    pub stock: i64,
}

/// A successful reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// Item id.
    pub id: u64,
    /// Units taken.
    pub reserved: u32,
    /// Units left after this reservation.
    pub remaining: i64,
    /// The fencing token of the lock this reservation ran under (increases with every holder).
    pub fence: Option<u64>,
}

/// `GET /items/{id}`: the stock now. Reads without the lock: a snapshot.
pub async fn get_item(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> Result<Json<Item>, AppError> {
    let stock = state
        .store
        .get(&stock_key(id))
        .await?
        .ok_or(AppError::NotFound { id })?;
    Ok(Json(Item { id, stock }))
}

/// `PUT /items/{id}`: sets the stock (restocking), under the item's lock so it never lands in
/// the middle of a reservation.
#[distributed_lock(key = "item:{id}", wait = "1s")]
pub async fn put_item(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    Json(body): Json<SetStock>,
) -> Result<Json<Item>, AppError> {
    let stock = i64::from(body.stock);
    state.store.set(&stock_key(id), stock).await?;
    Ok(Json(Item { id, stock }))
}

/// `POST /items/{id}/reserve`: takes `qty` units if there are enough.
///
/// The read and the write below are separate store operations; only the lock on `item:{id}`
/// keeps two concurrent reservations from both seeing the last unit. Requests that cannot get
/// the lock within 200 ms get `409 busy` instead of piling up.
#[distributed_lock(key = "item:{id}", wait = "200ms")]
pub async fn reserve(
    State(state): State<AppState>,
    Path(id): Path<u64>,
    Json(request): Json<ReserveRequest>,
) -> Result<Json<Reservation>, AppError> {
    let key = stock_key(id);
    let stock = state
        .store
        .get(&key)
        .await?
        .ok_or(AppError::NotFound { id })?;
    let qty = request.qty.get();
    if stock < i64::from(qty) {
        return Err(AppError::OutOfStock {
            id,
            available: stock,
            requested: qty,
        });
    }
    // Let other requests run between the read and the write, as real work (a payment call, a
    // database round trip) would: without the lock this is where overselling happens.
    tokio::task::yield_now().await;
    let remaining = stock - i64::from(qty);
    state.store.set(&key, remaining).await?;
    Ok(Json(Reservation {
        id,
        reserved: qty,
        remaining,
        fence: current_fence(),
    }))
}

/// The JSON body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable kind: `out_of_stock`, `busy`, `not_found`, `unavailable`, `internal`.
    pub error: String,
    /// Human-readable explanation.
    pub message: String,
}

/// What a handler can fail with; [`IntoResponse`] maps it to a status and an [`ErrorBody`].
#[derive(Debug)]
pub enum AppError {
    /// Fewer units than requested: `409 out_of_stock`.
    OutOfStock {
        /// Item id.
        id: u64,
        /// Units in stock.
        available: i64,
        /// Units requested.
        requested: u32,
    },
    /// The item was never stocked: `404 not_found`.
    NotFound {
        /// Item id.
        id: u64,
    },
    /// The item's lock could not be taken or kept: answered by `LockError`'s own
    /// `IntoResponse` (feature `axum`): `Timeout` is `409` with `Retry-After`, `Backend` and
    /// `Lost` are `503`, anything else (a misconfiguration) is `500`.
    Lock(LockError),
    /// The stock store failed: `503 unavailable`.
    Store(StoreError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl From<StoreError> for AppError {
    fn from(err: StoreError) -> Self {
        AppError::Store(err)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::OutOfStock {
                id,
                available,
                requested,
            } => write!(
                f,
                "item {id} is out of stock: {available} left, {requested} requested"
            ),
            AppError::NotFound { id } => write!(f, "item {id} does not exist"),
            AppError::Lock(err) => err.fmt(f),
            AppError::Store(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for AppError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AppError::Lock(err) => Some(err),
            AppError::Store(err) => Some(err),
            AppError::OutOfStock { .. } | AppError::NotFound { .. } => None,
        }
    }
}

/// `err: cause: cause ...`, for the log.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let cause_text = cause.to_string();
        // `AppError::Lock` displays as its `LockError`: do not repeat it.
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        next = cause.source();
    }
    text
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, error) = match &self {
            AppError::OutOfStock { .. } => (StatusCode::CONFLICT, "out_of_stock"),
            AppError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            AppError::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            AppError::Lock(err) => {
                let response = err.clone().into_response();
                if response.status().is_server_error() {
                    tracing::error!(error = %error_chain(&self), "request failed");
                }
                return response;
            }
        };
        if status.is_server_error() {
            tracing::error!(error = %error_chain(&self), "request failed");
        }
        let body = ErrorBody {
            error: error.to_owned(),
            message: self.to_string(),
        };
        (status, Json(body)).into_response()
    }
}
