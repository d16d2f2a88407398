//! A body run under its lock: `with_lock` and the attribute's body. One layer around the body
//! ([`InChain`]) runs it in its level of the call chain and its span, and takes no step once
//! its lease is known lost; the lock is released on every exit path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::futures::OwnedNotified;

use crate::chain::{Frame, Scope, current_frame, in_level};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::held::Held;
use crate::lease::{LostSignal, Validity};
use crate::lock::{LockBuilder, OnLost};

/// Runs `fut` while holding `lock`, releasing it on every exit path.
///
/// Equivalent to the attribute without the macro. The lock is acquired first (waiting up to
/// its `wait`); under [`OnLost::Cancel`] (default) `fut` is dropped as soon as the lease is
/// known lost and the call returns [`LockError::Lost`]. After `fut` completes the lock is
/// released and awaited; a release that finds the lease gone returns `Lost` under `Cancel`,
/// a release the engine fails to answer is logged (the lock then expires with its lease).
/// On panic or cancellation the release is scheduled from `Drop`.
///
/// Nested calls on the same key in the same chain re-enter. Concurrent branches of one body
/// (`join!`, `join_all`, `select!`) are not nested in each other: each takes the key in turn
/// (a branch that finds its caller holding the key waits until its sibling's call on that key
/// returns, within its `wait`), so two bodies under one key never run at once. Guards from
/// plain [`acquire`](LockBuilder::acquire) have no extent of their own: two branches of one
/// body that both `acquire()` a key their caller holds share that hold, so give each branch
/// its own `with_lock` (or annotated call) when they must exclude each other.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dlock_runtime::LockError> {
/// # let rt = dlock_runtime::Runtime::from_url("memory://").await?;
/// # rt.scope(async {
/// use dlock_runtime::{lock, with_lock};
/// let total = with_lock(lock("cart:7"), async {
///     // re-enters: same chain, same key
///     with_lock(lock("cart:7"), async { 40 }).await.map(|n| n + 2)
/// })
/// .await??;
/// assert_eq!(total, 42);
/// # Ok::<(), dlock_runtime::LockError>(()) }).await?;
/// # Ok(()) }
/// ```
pub async fn with_lock<T>(lock: LockBuilder, fut: impl Future<Output = T>) -> Result<T, LockError> {
    protected(lock, fut).await
}

/// [`with_lock`]: acquires from the current frame, then runs `fut` in a frame of its own.
pub(crate) async fn protected<T>(
    lock: LockBuilder,
    fut: impl Future<Output = T>,
) -> Result<T, LockError> {
    let on_lost = lock.on_lost;
    let parent = current_frame();
    let scope = Frame::next_id();
    let multi = lock.multi().is_some();
    let lock = LockBuilder {
        // The body's first wait has the hold tracked (`LossCheck::lost_while_waiting`).
        track_on_wait: !multi && on_lost == OnLost::Cancel,
        ..lock
    };
    let guard = lock.acquire_in(parent.as_ref(), Some(scope)).await?;
    if multi {
        // Boxed: the body is stored once in this future (a nested body inside it, again),
        // not once per way of running it.
        return protected_all(guard, on_lost, parent, scope, Box::pin(fut)).await;
    }
    let first = guard.is_first();
    // The body runs in the span `dlock.held` (a sibling of `dlock.acquire`, which has ended).
    let held_span = tracing::info_span!(
        "dlock.held",
        key = %guard.key(),
        engine = guard.held().core.engine,
        fence = guard.fence(),
    );
    // A fresh hold's validity was checked on the clock when it was registered, in this same
    // poll: the body's first step needs no second reading. The body's first wait has the hold
    // tracked by the watchdog (`LossCheck::lost_while_waiting`).
    let check = (on_lost == OnLost::Cancel).then(|| LossCheck::new(first));
    let Ended { out, guard } =
        InChain::new(Scope::new(scope, parent, guard), held_span, check, fut).await;
    let Some(out) = out else {
        return Err(LockError::Lost {
            key: guard.key().to_owned(),
        });
    };
    finish(guard, on_lost, out).await
}

/// [`protected`] for a multi-key lock: the body runs in a frame holding every key taken fresh,
/// and under [`OnLost::Cancel`] ends when any key's lease is lost.
async fn protected_all<T>(
    guard: LockGuard,
    on_lost: OnLost,
    parent: Option<Arc<Frame>>,
    scope: u64,
    fut: impl Future<Output = T>,
) -> Result<T, LockError> {
    let held_span = tracing::info_span!(
        "dlock.held",
        key = %guard.key(),
        engine = guard.held().core.engine,
        fence = guard.fence(),
    );
    // Every key's lease is checked by `run_unless_any_lost`, none by the body's layer; on a
    // loss the body is dropped with the guard its level kept.
    let holds: Vec<Arc<Held>> = guard.helds().cloned().collect();
    let body = InChain::new(Scope::new(scope, parent, guard), held_span, None, fut);
    let ended = match on_lost {
        OnLost::Cancel => run_unless_any_lost(&holds, body).await,
        OnLost::Ignore => Some(body.await),
    };
    let Some(Ended {
        out: Some(out),
        guard,
    }) = ended
    else {
        let lost = holds.iter().find(|h| h.is_lost()).or(holds.first());
        return Err(LockError::Lost {
            key: lost.map(|h| h.key.clone()).unwrap_or_default(),
        });
    };
    finish(guard, on_lost, out).await
}

/// A body that ended with `out`: its lock released and awaited. A release that finds the
/// lease gone is `Lost` under [`OnLost::Cancel`]; one the engine fails to answer is logged
/// (the lock expires with its lease).
async fn finish<T>(guard: LockGuard, on_lost: OnLost, out: T) -> Result<T, LockError> {
    match guard.release().await {
        Ok(()) => Ok(out),
        Err(LockError::Lost { key }) if on_lost == OnLost::Cancel => Err(LockError::Lost { key }),
        Err(err) => {
            tracing::warn!(error = %err, "release after the protected code failed");
            Ok(out)
        }
    }
}

pin_project_lite::pin_project! {
    /// A body running in its level of the call chain, in the span `span`, and (with a loss
    /// check) only while the lease of the level's one key is not known lost: one layer around
    /// the body, which runs on every annotated call.
    pub(crate) struct InChain<F> {
        // `None` once ended (dropped in its level, as it ran).
        #[pin]
        fut: Option<F>,
        scope: Scope,
        span: tracing::Span,
        check: Option<LossCheck>,
    }

    impl<F> PinnedDrop for InChain<F> {
        fn drop(this: Pin<&mut Self>) {
            // A body cancelled mid-way is dropped in its level and span, as it ran.
            let this = this.project();
            drop_in_level(this.fut, this.scope, this.span);
        }
    }
}

/// How a body run by [`InChain`] ended: its output (`None`: the lease was lost and the body
/// dropped), and the guard of its level, handed back.
pub(crate) struct Ended<T> {
    pub(crate) out: Option<T>,
    pub(crate) guard: LockGuard,
}

impl<F: Future> InChain<F> {
    /// `fut` run in `scope` and `span`; with `check`, stopped once the lease of the scope's
    /// (one-key) guard is lost.
    pub(crate) fn new(scope: Scope, span: tracing::Span, check: Option<LossCheck>, fut: F) -> Self {
        Self {
            fut: Some(fut),
            scope,
            span,
            check,
        }
    }
}

/// Drops a body not yet ended in its level and span, as it ran.
fn drop_in_level<F>(mut fut: Pin<&mut Option<F>>, scope: &Scope, span: &tracing::Span) {
    if fut.is_some() {
        let _entered = span.enter();
        in_level(scope, || fut.set(None));
    }
}

impl<F: Future> Future for InChain<F> {
    type Output = Ended<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let held = this.scope.guard().map(|g| g.held());
        if let (Some(check), Some(held)) = (this.check.as_mut(), held)
            && !check.may_step(&**held)
        {
            drop_in_level(this.fut.as_mut(), this.scope, this.span);
            return end(this.scope, None);
        }
        // A step the body may take without the watchdog tracking its hold (it has not
        // waited yet): published for the length of the step, in case it blocks the thread
        // past its first renewal.
        let _published = match (this.check.as_ref(), held) {
            (Some(check), Some(held)) if !check.watching() && held.is_untracked() => {
                held.publish_first_step()
            }
            _ => None,
        };
        let polled = {
            let _entered = this.span.enter();
            let fut = &mut this.fut;
            in_level(this.scope, || {
                let polled = fut.as_mut().as_pin_mut().map(|f| f.poll(cx));
                if let Some(Poll::Ready(_)) = polled {
                    fut.set(None);
                }
                polled
            })
        };
        match polled {
            Some(Poll::Ready(out)) => end(this.scope, Some(out)),
            // Polled after it ended: nothing left to run.
            None => Poll::Pending,
            Some(Poll::Pending) => {
                if let (Some(check), Some(held)) = (this.check.as_mut(), held)
                    && check.lost_while_waiting(held, cx)
                {
                    drop_in_level(this.fut, this.scope, this.span);
                    return end(this.scope, None);
                }
                Poll::Pending
            }
        }
    }
}

/// The body ended with `out`: hands back the level's guard.
fn end<T>(scope: &mut Scope, out: Option<T>) -> Poll<Ended<T>> {
    match scope.take_guard() {
        Some(guard) => Poll::Ready(Ended { out, guard }),
        // Only once the future was polled after it ended (the guard is taken only here).
        None => Poll::Pending,
    }
}

/// Stops a body once its lease is known lost: before each step of the body the confirmed
/// validity is checked on the local clock, so a body never takes another step once it ran out,
/// even if the watchdog has not run yet (a process resumed after a pause); once the body has
/// had to wait, the watchdog tracks its hold (see [`Held::watch`]) and the lost signal is
/// watched too, so that a loss wakes it. A body that completes at once costs a few loads.
pub(crate) struct LossCheck {
    // The first step is checked against the clock reading of the signal's making.
    first: bool,
    // The lost notification, watched once the body has had to wait.
    watching: Option<Pin<Box<OwnedNotified>>>,
}

impl LossCheck {
    /// A check of a body not started yet. `fresh`: its lease's signal was made (its validity
    /// set against the clock read then) in the same poll as the body's first step, so that
    /// step is checked against that reading instead of a new one.
    pub(crate) fn new(fresh: bool) -> Self {
        Self {
            first: fresh,
            watching: None,
        }
    }

    /// Whether the body may take its next step (the `lease` is not known lost).
    pub(crate) fn may_step(&mut self, lease: &impl Validity) -> bool {
        let expired = if std::mem::take(&mut self.first) {
            lease.expired_when_made()
        } else {
            lease.expired()
        };
        !(lease.is_lost() || expired)
    }

    /// Whether the body has had to wait (its hold is tracked, and its lost signal watched).
    pub(crate) fn watching(&self) -> bool {
        self.watching.is_some()
    }

    /// After a step that left the body waiting: whether the lease of `held` is known lost by
    /// now (the task is woken when it is). The first time, has the watchdog track the hold.
    pub(crate) fn lost_while_waiting(&mut self, held: &Held, cx: &mut Context<'_>) -> bool {
        let lost = self.watching.get_or_insert_with(|| {
            held.watch();
            held.lost().watch()
        });
        lost.as_mut().poll(cx).is_ready() || held.is_lost()
    }
}

/// Runs `fut` until it completes (`Some`) or the lease of any of `holds` is known lost
/// (`None`, `fut` dropped): the [`LossCheck`] of one key over several,
/// each checked on the local clock before every step of `fut`.
async fn run_unless_any_lost<F: Future>(holds: &[Arc<Held>], fut: F) -> Option<F::Output> {
    let signals: Vec<&LostSignal> = holds.iter().map(|h| &**h.lost()).collect();
    tokio::pin!(fut);
    let mut watching: Option<Vec<_>> = None;
    std::future::poll_fn(|cx| {
        if signals.iter().any(|s| s.is_lost() || s.expired()) {
            return Poll::Ready(None);
        }
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        let watches = watching.get_or_insert_with(|| signals.iter().map(|s| s.watch()).collect());
        if watches.iter_mut().any(|w| w.as_mut().poll(cx).is_ready())
            || signals.iter().any(|s| s.is_lost())
        {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests;
