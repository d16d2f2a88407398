//! The `#[distributed_lock]` attribute of [dlock].
//!
//! Use it through the runtime crate, which re-exports it and does the actual locking:
//!
//! ```toml
//! [dependencies]
//! dlock-runtime = "0.1"
//! ```
//!
//! ```no_run
//! use dlock_runtime::distributed_lock;
//! ```
//!
//! This crate only rewrites syntax; see [`macro@distributed_lock`] for the attribute's arguments
//! and the code it expands to.
//!
//! [dlock]: https://docs.rs/dlock-runtime

mod args;
mod duration;
mod expand;
mod hint;
mod item;
mod key;

use proc_macro2::{Span, TokenStream};

use crate::args::RawArgs;
pub(crate) use crate::hint::{combine, similar_name};
pub(crate) use crate::item::LockedFn;
use crate::item::check_signature;
use crate::key::Bindings;

/// Turns an `async fn` into a critical section guarded by a distributed lock.
///
/// ```
/// use dlock_runtime::{distributed_lock, LockError};
///
/// #[derive(Debug)]
/// enum ShopError {
///     SoldOut,
///     Lock(LockError),
/// }
///
/// impl From<LockError> for ShopError {
///     fn from(err: LockError) -> Self {
///         ShopError::Lock(err)
///     }
/// }
///
/// #[distributed_lock(key = "stock:{id}", lease = "30s", wait = "1s")]
/// async fn buy(id: u64, qty: u32) -> Result<u64, ShopError> {
///     // Only one caller per `id`, across every process sharing the lock engine, runs this at a
///     // time.
///     Ok(u64::from(qty))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// // At startup: choose an engine and install it process-wide (here: in-process memory).
/// dlock_runtime::Runtime::builder().memory().build().await?.install()?;
/// assert!(matches!(buy(42, 2).await, Ok(2)));
/// # Ok(())
/// # }
/// ```
///
/// Each call formats the key, acquires the lock on the runtime installed with
/// `Runtime::install` (or the one set with `Runtime::scope`), runs the body, and releases the
/// lock on every exit path: normal return, `Err`, `?`, `return`, panic, and cancellation (the
/// future dropped mid-way). If the lock cannot be taken, the body does not run and the function
/// returns `Err(LockError::Timeout { .. })` (or another `LockError`) converted into its error
/// type with `From`.
///
/// The examples are doc tests of `dlock-macros`, compiled against `dlock-runtime`; the ones
/// marked `no_run` only declare functions.
///
/// # Requirements
///
/// * The function is an `async fn` with a body: a free function, an inherent method (`&self`,
///   `&mut self`, `self`, `self: Arc<Self>`, ...), or a native `async fn` of a trait
///   implementation. Generics, `where` clauses and pattern parameters such as
///   `Path(id): Path<u64>` are fine. `const fn` and `extern "C" fn` are rejected.
/// * It returns `Result<T, E>` with `E: From<LockError>`, so that a failure to lock can be
///   returned without running the body. Any other return type is a compile error that names the
///   type.
/// * Its future is `Send` whenever the original body's future is, so guarded functions work as
///   axum/actix handlers and with `tokio::spawn`.
///
/// # Arguments
///
/// | argument   | value                               | default                       |
/// |------------|-------------------------------------|-------------------------------|
/// | `key`      | key template, e.g. `"stock:{id}"`   | required (or `keys`)          |
/// | `keys`     | array of key templates, e.g. `["acct:{from}", "acct:{to}"]` | instead of `key` |
/// | `lease`    | duration, e.g. `"30s"`              | the runtime's `default_lease` (30 s) |
/// | `wait`     | duration, e.g. `"1s"`, `"0s"`       | the runtime's `default_wait` (no waiting) |
/// | `watchdog` | `true` or `false` (no quotes)       | `true`                        |
/// | `on_lost`  | `"cancel"` or `"ignore"`            | `"cancel"`                    |
/// | `hold_at_least` | duration, e.g. `"30s"`         | none: released at once        |
/// | `mode`     | `"read"` or `"write"`               | `"write"` (an exclusive lock) |
/// | `permits`  | whole number ≥ 1, e.g. `8`          | none: a lock, not a semaphore |
/// | `fair`     | `true` or `false` (no quotes)       | `false`                       |
/// | `crate`    | path of the runtime crate, e.g. `"dl"` | `"::dlock_runtime"`        |
///
/// Arguments may come in any order; each may appear once. Everything is checked at compile
/// time: an unknown or repeated argument, a malformed duration, a lease of zero or of more than
/// a year, a `hold_at_least` longer than the `lease`, or a placeholder that names no parameter
/// is a compile error pointing at the offending token.
///
/// ## `key`
///
/// The name of the lock. Calls with equal keys exclude each other; calls with different keys do
/// not. The runtime prepends its key prefix (default `"dlock:"`), so `"stock:42"` is stored as
/// `dlock:{stock:42}` on Redis.
///
/// The template is literal text with placeholders, each formatted with [`Display`]:
///
/// | placeholder                          | value                                   |
/// |--------------------------------------|-----------------------------------------|
/// | `{id}` or `<id>`                     | the parameter `id`                      |
/// | `{order.user.id}` or `<order.user.id>` | a field of a parameter, any depth     |
/// | `{pair.0}`                           | a tuple field                           |
/// | `{self.tenant}` or `<self.tenant>`   | a field of the receiver of a method     |
/// | `{self}`                             | the receiver itself                     |
/// | `{{` `}}` `<<` `>>`                  | a literal `{`, `}`, `<` or `>`          |
///
/// The first name of a placeholder is `self` or any binding the parameters introduce, including
/// bindings inside patterns: `Path(id): Path<u64>` binds `id`, `(a, b): (u8, u8)` binds `a` and
/// `b`, `Order { id, .. }: Order` binds `id`, and `mut n: u32` binds `n`. Format specs such as
/// `{id:?}` are not accepted: the key is always the `Display` form.
///
/// The key is built once per call, before the body runs, with a single `format!` (or a
/// `String::from` when the key has no placeholders). Placeholders borrow the parameters, so the
/// body still owns them.
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// # struct Order { user: User, sku: String } struct User { id: u64 }
/// #[distributed_lock(key = "cart:<order.user.id>:{order.sku}")]
/// async fn checkout(order: Order) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # struct Order { user: User, sku: String } struct User { id: u64 }
/// async fn checkout(order: Order) -> Result<(), LockError> {
///     let key = format!("cart:{}:{}", order.user.id, order.sku);
///     dlock_runtime::with_lock(dlock_runtime::lock(key), async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `lease`
///
/// How long the engine keeps the lock if the holder stops renewing it (its process died, or the
/// network is gone). With the watchdog on, the lease is renewed every `lease / 3` while the body
/// runs, so the body may take longer than the lease; another process gets the lock at most
/// `lease` after the holder dies. Must be greater than zero and at most a year (`"8760h"`).
/// Omitted: the runtime's `default_lease` (30 s unless configured).
///
/// Durations are a non-negative integer followed by a unit: `ms`, `s`, `m` or `h`, as in
/// `"250ms"`, `"30s"`, `"2m"` or `"1h"`. No fractions, spaces or compound forms (`"1m30s"` is
/// `"90s"`).
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "report", lease = "2m")]
/// async fn build_report() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # use std::time::Duration;
/// async fn build_report() -> Result<(), LockError> {
///     let lock = dlock_runtime::lock("report").lease(Duration::from_secs(120));
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `wait`
///
/// How long to wait for a busy lock before giving up with `LockError::Timeout`. Waiting is by
/// notification from the engine, not polling. `"0s"` makes one attempt. Omitted: the runtime's
/// `default_wait` (one attempt unless configured).
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "stock:{id}", wait = "1s")]
/// async fn reserve(id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # use std::time::Duration;
/// async fn reserve(id: u64) -> Result<(), LockError> {
///     let lock = dlock_runtime::lock(format!("stock:{id}")).wait(Duration::from_secs(1));
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `watchdog`
///
/// `true` (the default) renews the lease while the body runs. `false` makes `lease` a hard cap,
/// like Redisson's `tryLock(wait, lease)`: `lease` after it was taken, the lock expires and
/// counts as lost even if the body is still running, so with `on_lost = "cancel"` (the
/// default) a body that overruns is cancelled and the call returns `LockError::Lost`. The value
/// is a bare `bool` literal: `watchdog = false`.
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "tick", lease = "10s", watchdog = false)]
/// async fn tick() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # use std::time::Duration;
/// async fn tick() -> Result<(), LockError> {
///     let lock = dlock_runtime::lock("tick")
///         .lease(Duration::from_secs(10))
///         .watchdog(false);
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `on_lost`
///
/// What happens when the lease is lost while the body runs (renewal found another owner, or the
/// engine stayed unreachable past the last confirmed expiry):
///
/// * `"cancel"` (default): the body's future is dropped where it is suspended, and the call
///   returns `Err(LockError::Lost { .. })` converted with `From`.
/// * `"ignore"`: the loss is logged, the body runs to completion and its result is returned as
///   is. Use it only when the body is safe to finish without exclusion (for example, it checks
///   a fencing token from `dlock_runtime::current_fence()` on every write).
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "ledger", on_lost = "ignore")]
/// async fn append() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::{LockError, OnLost};
/// async fn append() -> Result<(), LockError> {
///     let lock = dlock_runtime::lock("ledger").on_lost(OnLost::Ignore);
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `hold_at_least`
///
/// For scheduled jobs (ShedLock's `lockAtLeastFor`): the key stays taken until at least this
/// long after the acquisition, even when the body finishes sooner, so the same job started on
/// other nodes in the same period finds it taken and skips (`LockError::Timeout`). A body that
/// runs longer releases as usual. `lease` with `watchdog = false` is the "at most";
/// `hold_at_least` must not be longer than `lease` (a compile error when both are written, a
/// `LockError::InvalidConfig` at run time against the runtime's default lease otherwise).
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "job:report", lease = "10m", watchdog = false, hold_at_least = "30s")]
/// async fn report() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # use std::time::Duration;
/// async fn report() -> Result<(), LockError> {
///     let lock = dlock_runtime::lock("job:report")
///         .lease(Duration::from_secs(600))
///         .watchdog(false)
///         .hold_at_least(Duration::from_secs(30));
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `mode` and `permits`
///
/// `mode = "read"` takes a read lock: any number of readers at once, across processes, while
/// no writer holds the key; `mode = "write"` (the default) is the plain exclusive lock, which
/// excludes readers and writers. Once a writer waits, new readers queue behind it. Within a
/// call chain a read inside a write or a read re-enters; a write inside a read is
/// `LockError::InvalidConfig`. `permits = N` takes one permit of a semaphore of N: at most N
/// calls run at once across processes. `permits = 0` and `permits` with `mode = "read"` are
/// compile errors.
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(key = "doc:{id}", mode = "read")]
/// async fn show(id: u64) -> Result<u64, LockError> {
///     Ok(id)
/// }
///
/// #[distributed_lock(key = "api:quota", permits = 8)]
/// async fn call_api() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// async fn show(id: u64) -> Result<u64, LockError> {
///     let lock = dlock_runtime::lock(format!("doc:{id}")).read();
///     dlock_runtime::with_lock(lock, async move { Ok(id) }).await?
/// }
///
/// async fn call_api() -> Result<(), LockError> {
///     let permit = dlock_runtime::semaphore("api:quota", 8);
///     dlock_runtime::with_lock(permit, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `keys`
///
/// Several keys at once, all or nothing: each template is formatted like `key`, and the set is
/// taken in a canonical order (sorted, duplicates merged), so calls naming the same keys in
/// opposite orders never deadlock; one `wait` covers the whole set, and when a key is still
/// busy at its end the keys already taken are released. The body runs holding every key; the
/// loss of any key's lease cancels it. `key` and `keys` cannot both be written; `keys` must
/// hold at least one string literal.
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// #[distributed_lock(keys = ["acct:{from}", "acct:{to}"], wait = "1s")]
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// Without the macro:
///
/// ```no_run
/// # use dlock_runtime::LockError;
/// # use std::time::Duration;
/// async fn transfer(from: u64, to: u64, amount: u64) -> Result<(), LockError> {
///     let keys = vec![format!("acct:{}", from), format!("acct:{}", to)];
///     let lock = dlock_runtime::lock_all(keys).wait(Duration::from_secs(1));
///     dlock_runtime::with_lock(lock, async move { Ok(()) }).await?
/// }
/// ```
///
/// ## `fair`
///
/// `fair = true` serves the waiters of the key in the order they started waiting, across
/// processes (see `LockBuilder::fair` for each engine: a line of waiters on Redis, FIFO
/// already on memory, etcd and ZooKeeper, refused on Redlock). Without the macro:
/// `lock(key).fair(true)`.
///
/// ## `crate`
///
/// The path of the runtime crate, for when it is renamed in `Cargo.toml`
/// (`dl = { package = "dlock-runtime", .. }`) or re-exported by another crate. The generated
/// code calls only `<crate>::__private`.
///
/// ```no_run
/// # extern crate dlock_runtime as dl;
/// # use dl::LockError;
/// #[dl::distributed_lock(key = "k", crate = "dl")]
/// async fn renamed() -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # What it expands to
///
/// The attributes, visibility and signature are kept as written; only the body changes. For
/// `key = "stock:{id}", lease = "30s", wait = "1s"` (an illustration, not compiled: the
/// original body stands where the comment is):
///
/// ```text
/// async fn buy(id: u64, qty: u32) -> Result<u64, ShopError> {
///     let __dlock_key = ::std::format!("stock:{}", id);
///     // The future of `with_lock`, awaited here: a lock failure becomes the return type.
///     match ::dlock_runtime::__private::run(
///         ::dlock_runtime::__private::lock(__dlock_key)
///             .lease(::dlock_runtime::__private::Duration::from_millis(30000))
///             .wait(::dlock_runtime::__private::Duration::from_millis(1000)),
///         ::dlock_runtime::__private::OnLost::Cancel,
///         async move {
///             // An unreachable `return` of the declared type pins the block's output, so `?`
///             // and `return` in the body infer as before.
///             if false {
///                 let __dlock_fake_return: Result<u64, ShopError> = loop {};
///                 return __dlock_fake_return;
///             }
///             { /* the original body, untouched */ }
///         },
///     )
///     .await
///     {
///         Ok(__dlock_out) => __dlock_out,
///         Err(__dlock_err) => ::dlock_runtime::__private::LockResult::from_lock_error(__dlock_err),
///     }
/// }
/// ```
///
/// `return` and `?` inside the body leave the body (and so release the lock); the macro never
/// rewrites them. `__private` is not a public API: use `lock`, `with_lock` or `LockGuard` when
/// you need the lock without the attribute.
///
/// # With `#[tracing::instrument]`
///
/// Both orders work, because each attribute treats the other's body as opaque. Attributes
/// expand from the top down, so the order decides what the span covers:
///
/// ```no_run
/// # use dlock_runtime::{distributed_lock, LockError};
/// // The span covers waiting for the lock, the body, and the release.
/// #[distributed_lock(key = "stock:{id}")]
/// #[tracing::instrument]
/// async fn covers_locking(id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// // The span covers only the body, which runs with the lock held.
/// #[tracing::instrument]
/// #[distributed_lock(key = "stock:{id}")]
/// async fn covers_body(id: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
///
/// # Reentrancy
///
/// A guarded function that calls another guarded function with the same key (directly or
/// further down the call chain, in the same task) re-enters the lock instead of deadlocking;
/// the inner exit does not release the outer hold. Another task, even one spawned inside the
/// body, is another owner.
///
/// # Errors at compile time
///
/// ```text
/// error: unknown argument `ttl`; expected one of `key`, `keys`, `lease`, `wait`, `watchdog`, `on_lost`, `hold_at_least`, `mode`, `permits`, `fair`, `crate`
/// error: invalid duration "30x": expected a number followed by ms, s, m or h, e.g. "30s"
/// error: key placeholder `{idd}` names no parameter of `buy`; did you mean `{id}`?
/// error: `#[distributed_lock]` can only be used on an `async fn`; add `async` before `fn`
/// ```
///
/// When the attribute reports an error, the function is still emitted unchanged, so the rest of
/// the crate (and the IDE) sees it and no follow-on errors appear.
///
/// [`Display`]: std::fmt::Display
#[proc_macro_attribute]
pub fn distributed_lock(
    args: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    let item = TokenStream::from(item);
    match guard(args.into(), item.clone()) {
        Ok(expanded) => expanded.into(),
        Err(error) => {
            // As tokio-macros does: keep the function as written next to the errors, so the
            // crate still sees it and no follow-on errors appear.
            let mut tokens = item;
            tokens.extend(error.into_compile_error());
            tokens.into()
        }
    }
}

/// Parse, validate, expand; every error found along the way is reported together.
fn guard(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func = syn::parse2::<LockedFn>(item);
    // In an attribute macro the call site is the whole `#[distributed_lock(..)]`.
    let args = syn::parse2::<RawArgs>(args).and_then(|raw| raw.validate(Span::call_site()));
    let (func, args) = match (func, args) {
        (Ok(func), Ok(args)) => (func, args),
        (Ok(func), Err(args_error)) => {
            let errors = std::iter::once(args_error).chain(check_signature(&func));
            return Err(combine(errors).unwrap_or_else(invalid_attribute));
        }
        (Err(func_error), Ok(_)) => return Err(func_error),
        (Err(func_error), Err(args_error)) => {
            return Err(combine([args_error, func_error]).unwrap_or_else(invalid_attribute));
        }
    };

    let mut errors = Vec::new();
    let bindings = Bindings::of(&func.sig);
    let keys: Result<Vec<_>, ()> = args
        .keys
        .iter()
        .map(|key| key::resolve(key, &bindings).map_err(|error| errors.push(error)))
        .collect::<Vec<_>>()
        .into_iter()
        .collect();
    errors.extend(check_signature(&func));
    match (combine(errors), keys) {
        (None, Ok(keys)) => Ok(expand::expand(&func, &args, &keys)),
        (Some(error), _) => Err(error),
        // Unreachable: a failed `resolve` pushed its error, so `combine` returned `Some`.
        (None, Err(())) => Err(invalid_attribute()),
    }
}

fn invalid_attribute() -> syn::Error {
    syn::Error::new(Span::call_site(), "invalid `#[distributed_lock]` attribute")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking
mod tests;
