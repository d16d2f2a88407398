//! Subscriptions to the release channels: `SUBSCRIBE` on one server, `SSUBSCRIBE` (sharded,
//! follows the slot) on Cluster, and the check at connect that the user may subscribe.

use super::acl;
use super::client::Client;
use super::errors::redis_error;
use super::link::Link;
use crate::error::LockError;

/// The key whose release channel [`check`] subscribes to and leaves
/// when connecting (nobody locks it; a stray wake-up would be harmless).
const PROBE_KEY: &str = "dlock-permission-check";

/// Subscribes to (or unsubscribes from) the release channel of `key`: `SUBSCRIBE` on one
/// server, `SSUBSCRIBE` (sharded, follows the slot) on Cluster, where the maintenance task
/// restores the subscribed channels after a disconnect or a rebuild.
pub(super) async fn set(client: &Client, key: &str, subscribed: bool) -> Result<(), LockError> {
    let channel = client.names.channel(key);
    let what = if subscribed {
        "subscribe failed"
    } else {
        "unsubscribe failed"
    };
    if let Link::Cluster(link) = &client.link
        && !subscribed
    {
        link.channels().remove(&channel);
    }
    let answer = tokio::time::timeout(client.timeout, subscribe_call(client, &channel, subscribed))
        .await
        .ok();
    client.settle(Some(key), what, answer)?;
    if let Link::Cluster(link) = &client.link
        && subscribed
    {
        link.channels().insert(channel);
    }
    Ok(())
}

/// One `(S)SUBSCRIBE` or `(S)UNSUBSCRIBE` of `channel`, unbounded.
async fn subscribe_call(
    client: &Client,
    channel: &str,
    subscribed: bool,
) -> redis::RedisResult<()> {
    match &client.link {
        Link::Single(c, _) => {
            let mut c = c.clone();
            if subscribed {
                c.subscribe(channel).await
            } else {
                c.unsubscribe(channel).await
            }
        }
        Link::Cluster(link) => {
            let mut c = link.conn();
            if subscribed {
                c.ssubscribe(channel).await
            } else {
                c.sunsubscribe(channel).await
            }
        }
    }
}

/// Subscribes to one release channel of this runtime's prefix and leaves it again, when
/// connecting: a user the server's ACL does not let subscribe (the command, or the channel
/// pattern) is a `Backend` error naming the missing permission now, rather than waiters
/// that quietly poll. Other failures only cost notifications (waiters then poll within
/// the holder's TTL): logged, not fatal.
pub(super) async fn check(client: &Client) -> Result<(), LockError> {
    let channel = client.names.channel(PROBE_KEY);
    let answer = tokio::time::timeout(client.timeout, subscribe_call(client, &channel, true)).await;
    let err = match answer {
        Ok(Ok(())) => {
            let leave = subscribe_call(client, &channel, false);
            if let Ok(Err(err)) = tokio::time::timeout(client.timeout, leave).await {
                tracing::debug!(error = %err, "leaving the permission check's channel failed");
            }
            return Ok(());
        }
        Ok(Err(err)) => err,
        Err(_) => {
            tracing::warn!(
                "no answer to a subscription while connecting; waiters will poll until notifications work"
            );
            return Ok(());
        }
    };
    let publish = client.publish_command();
    match acl::denial(&err.to_string(), None, &client.names, publish) {
        Some(denial) => Err(redis_error(
            None,
            &format!("cannot subscribe to release notifications: {denial}"),
            err,
        )),
        None => {
            tracing::warn!(error = %err, "cannot subscribe to release notifications; waiters will poll");
            Ok(())
        }
    }
}
