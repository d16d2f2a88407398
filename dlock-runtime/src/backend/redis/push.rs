//! Pushes from the connection: release messages and (re)subscription confirmations wake local
//! waiters; a disconnect wakes every waiter (a message published meanwhile reached nobody) and,
//! on Cluster, asks for the subscriptions to be restored.

use std::sync::Arc;

use redis::{PushInfo, PushKind, Value};

use super::names::Names;
use crate::backend::Wakeups;

/// The push sender of a connection: hands every push to [`on_push`]; on Cluster a disconnect
/// also asks for `repair` (subscriptions restored by the maintenance task).
pub(super) fn push_handler(
    wakeups: Arc<dyn Wakeups>,
    names: Names,
    origin: String,
    repair: Option<Arc<tokio::sync::Notify>>,
) -> impl Fn(PushInfo) -> Result<(), std::convert::Infallible> + Send + Sync + 'static {
    move |push: PushInfo| {
        if push.kind == PushKind::Disconnection
            && let Some(repair) = &repair
        {
            repair.notify_one();
        }
        on_push(wakeups.as_ref(), &names, &origin, push);
        Ok(())
    }
}

/// Handles one push from the connection: a release message wakes that key's local waiters
/// (unless it came from this runtime, which woke them already); a (re)subscription confirmation
/// makes the key's waiter retry; a disconnect makes every waiter retry.
fn on_push(wakeups: &dyn Wakeups, names: &Names, origin: &str, push: PushInfo) {
    let channel_key = |v: Option<&Value>| -> Option<String> {
        let channel: String = redis::from_redis_value_ref(v?).ok()?;
        names.key_of_channel(&channel)
    };
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            let from: Option<String> = push
                .data
                .get(1)
                .and_then(|v| redis::from_redis_value_ref(v).ok());
            if from.as_deref() == Some(origin) {
                return;
            }
            if let Some(key) = channel_key(push.data.first()) {
                wakeups.wake(&key);
            }
        }
        PushKind::Subscribe | PushKind::SSubscribe => {
            if let Some(key) = channel_key(push.data.first()) {
                wakeups.wake(&key);
            }
        }
        PushKind::Disconnection => wakeups.wake_all(),
        _ => {}
    }
}
