//! The FIFO queue of one key in etcd: join (lease + key), wait for the predecessor's key to go,
//! confirm that the key and lease are still there, leave (revoke).

use std::time::Duration;

use etcd_client::{EventType, GetOptions, PutOptions, SortOrder, SortTarget, WatchOptions};
use tokio::time::Instant;

use super::{CONNECT_RETRIES, Contender, EtcdBackend, is_connect_error, ttl_seconds};
use crate::LockError;
use crate::backend::Attempt;

impl EtcdBackend {
    /// Keeps `lease` alive every third of its TTL until the returned guard is dropped.
    pub(super) fn keep_alive_while_queued(
        &self,
        lease: i64,
        ttl: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let mut client = self.client.clone();
        tokio::spawn(async move {
            let Ok((mut keeper, mut stream)) = client.lease_keep_alive(lease).await else {
                return;
            };
            loop {
                tokio::time::sleep(ttl / 3).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match stream.message().await {
                    Ok(Some(resp)) if resp.ttl() > 0 => {}
                    _ => return,
                }
            }
        })
    }

    /// Waits in the queue of `key` until first in line (`Acquired`) or `deadline` (`Busy`).
    pub(super) async fn queue(
        &self,
        key: &str,
        owner: &str,
        lease: Duration,
        deadline: Instant,
    ) -> Result<Attempt, LockError> {
        let granted = self
            .bounded(Some(key), "lease grant failed", |mut c| async move {
                c.lease_grant(ttl_seconds(lease), None).await
            })
            .await?;
        let lease_id = granted.id();
        let contender_key = format!("{}{lease_id:016x}", self.queue_prefix(key));
        // Known before the key is written: a cancelled attempt's compensating release finds it.
        self.contenders().insert(
            owner.to_owned(),
            Contender {
                lease: lease_id,
                key: contender_key.clone(),
            },
        );
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        // Started when the contender first has to wait (an uncontended acquire needs none).
        let mut keeper: Option<AbortOnDrop> = None;

        let contender = contender_key.as_str();
        let put = self
            .bounded(Some(key), "queueing failed", |mut c| async move {
                c.put(
                    contender,
                    owner,
                    Some(PutOptions::new().with_lease(lease_id)),
                )
                .await
            })
            .await?;
        let my_revision = put.header().map_or(0, |h| h.revision());
        loop {
            // The predecessor: the newest key created before ours (and whether another is
            // ahead of it).
            let options = GetOptions::new()
                .with_prefix()
                .with_max_create_revision(my_revision - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(2);
            let before = self.read_queue(key, "queue lookup failed", options).await?;
            // The predecessor heads the queue: once it is deleted nobody is ahead (keys created
            // later have higher revisions).
            let behind_the_head = before.kvs().len() == 1;
            let Some(predecessor) = before.kvs().first() else {
                if keeper.is_none() {
                    // First in line at once: the lease was just granted and the key just
                    // written, nothing to confirm.
                    return Ok(Attempt::Acquired {
                        fence: u64::try_from(my_revision).ok(),
                    });
                }
                return self
                    .confirm_first(key, &contender_key, lease_id, my_revision)
                    .await;
            };
            let predecessor_key = predecessor.key().to_vec();
            let from = before.header().map_or(0, |h| h.revision()) + 1;
            if Instant::now() >= deadline {
                self.leave(owner).await;
                return Ok(Attempt::Busy { ttl: None });
            }
            if keeper.is_none() {
                keeper = Some(AbortOnDrop(self.keep_alive_while_queued(lease_id, ttl)));
            }
            let predecessor_key = &predecessor_key;
            let mut watch = self
                .bounded(Some(key), "watch failed", |mut c| async move {
                    c.watch(
                        predecessor_key.clone(),
                        Some(WatchOptions::new().with_start_revision(from)),
                    )
                    .await
                })
                .await?;
            // `true` when the predecessor was deleted; `false` when the watch ended otherwise.
            let deleted = async {
                loop {
                    match watch.message().await {
                        Ok(Some(resp)) => {
                            if resp
                                .events()
                                .iter()
                                .any(|e| e.event_type() == EventType::Delete)
                            {
                                return true;
                            }
                            if resp.canceled() {
                                return false;
                            }
                        }
                        // The stream ended or failed: look again (bounded by the loop).
                        _ => return false,
                    }
                }
            };
            let Ok(deleted) = tokio::time::timeout_at(deadline, deleted).await else {
                self.leave(owner).await;
                return Ok(Attempt::Busy { ttl: None });
            };
            if deleted && behind_the_head {
                // The holder released (or its lease ended): first in line, without looking up
                // the queue again.
                return self
                    .confirm_first(key, &contender_key, lease_id, my_revision)
                    .await;
            }
        }
    }

    /// First in line: the key must still exist and the lease still be alive.
    pub(super) async fn confirm_first(
        &self,
        key: &str,
        contender_key: &str,
        lease: i64,
        revision: i64,
    ) -> Result<Attempt, LockError> {
        // Both at once: one round trip.
        let (mine, alive) = tokio::join!(
            self.bounded(Some(key), "confirmation failed", |mut c| async move {
                c.get(contender_key, None).await
            }),
            self.bounded(Some(key), "lease check failed", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
        );
        let (mine, alive) = (mine?, alive?);
        if mine.kvs().is_empty() || alive.ttl() <= 0 {
            return Err(LockError::backend(
                Some(key),
                "the lease expired while queued",
                None,
            ));
        }
        Ok(Attempt::Acquired {
            fence: u64::try_from(revision).ok(),
        })
    }

    /// Revokes `lease`, sending again what was refused at connect (see [`Self::bounded`]).
    pub(super) async fn revoke(
        &self,
        lease: i64,
    ) -> Result<
        Result<etcd_client::LeaseRevokeResponse, etcd_client::Error>,
        tokio::time::error::Elapsed,
    > {
        let deadline = Instant::now() + self.timeout;
        let mut retries = 0;
        loop {
            let mut client = self.client.clone();
            match tokio::time::timeout_at(deadline, client.lease_revoke(lease)).await {
                Ok(Err(e)) if retries < CONNECT_RETRIES && is_connect_error(&e) => {
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    /// Removes `owner`'s place: deletes its key and revokes its lease.
    pub(super) async fn leave(&self, owner: &str) -> bool {
        let Some(contender) = self.contenders().remove(owner) else {
            return false;
        };
        // Revoking the lease deletes the key with it.
        let _ = self.revoke(contender.lease).await;
        true
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
