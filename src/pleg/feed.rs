//! How pod workers hand the PLEG what they learned, so that the PLEG stays the pod cache's one
//! writer (kubelet's pod cache is written by its PLEG alone).
//!
//! A pod worker that had to read its pod's status from the runtime itself (the PLEG did not
//! bring a newer one within [`crate::podsync::status::STATUS_WAIT`]) hands the status over
//! with [`CacheFeed::status_read`]; a worker that killed and removed its pod asks the PLEG to
//! forget it with [`CacheFeed::forget`]. The PLEG's task applies both ([`FeedReceiver::serve`])
//! between and during its relists, under the cache's rule that an older read never replaces a
//! newer one. Each hand-off waits until it is applied (at most [`APPLY_WAIT`]), so a worker's
//! next read of the cache sees it, as it did when workers wrote the cache themselves.
//!
//! The channel is bounded ([`FEED_CAPACITY`]); a full channel makes the worker `await` room (a
//! tokio task, never a blocked thread).

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::container::cache::PodCacheWriter;
use crate::container::RuntimePodStatus;

/// Capacity of the hand-off channel, messages: one per pod worker in flight is the most there
/// can be (each waits for its message to be applied), so 256 holds a burst of 256 pods' reads.
pub const FEED_CAPACITY: usize = 256;

/// Longest a pod worker waits for the PLEG to apply what it handed over (the PLEG's task serves
/// its feed while a relist waits on the runtime, so this is reached only when the PLEG is not
/// running: a unit test, or an agent shutting down).
pub const APPLY_WAIT: Duration = Duration::from_secs(1);

/// What a pod worker hands the PLEG.
enum Handed {
    /// The worker read the pod's status from the runtime at `at`.
    Status {
        uid: String,
        status: RuntimePodStatus,
        at: Instant,
        done: oneshot::Sender<()>,
    },
    /// The pod was killed and removed: forget it (and what its worker made).
    Forget {
        uid: String,
        done: oneshot::Sender<()>,
    },
}

/// The pod workers' end of the hand-off (cheap to clone).
#[derive(Clone)]
pub struct CacheFeed(mpsc::Sender<Handed>);

/// The PLEG's end of the hand-off.
pub struct FeedReceiver(mpsc::Receiver<Handed>);

/// A hand-off channel of [`FEED_CAPACITY`].
pub fn channel() -> (CacheFeed, FeedReceiver) {
    let (tx, rx) = mpsc::channel(FEED_CAPACITY);
    (CacheFeed(tx), FeedReceiver(rx))
}

impl CacheFeed {
    /// Hands the PLEG pod `uid`'s status as the worker read it from the runtime at `at`, and
    /// waits until it is in the cache (or [`APPLY_WAIT`] passed, or the PLEG is gone).
    pub async fn status_read(&self, uid: &str, status: RuntimePodStatus, at: Instant) {
        let (done, applied) = oneshot::channel();
        self.hand(
            Handed::Status {
                uid: uid.to_owned(),
                status,
                at,
                done,
            },
            applied,
        )
        .await;
    }

    /// Asks the PLEG to forget pod `uid` (its status, OOM marks and what its worker made), and
    /// waits until it has (or [`APPLY_WAIT`] passed, or the PLEG is gone).
    pub async fn forget(&self, uid: &str) {
        let (done, applied) = oneshot::channel();
        self.hand(
            Handed::Forget {
                uid: uid.to_owned(),
                done,
            },
            applied,
        )
        .await;
    }

    async fn hand(&self, msg: Handed, applied: oneshot::Receiver<()>) {
        if self.0.send(msg).await.is_err() {
            return;
        }
        // Paused-time tests auto-advance to this deadline only when nothing else can run.
        let _ = tokio::time::timeout(APPLY_WAIT, applied).await;
    }
}

impl FeedReceiver {
    /// Applies every hand-off to `cache` as it comes; returns when every [`CacheFeed`] is gone.
    /// The PLEG runs this beside its relist loop, on the same task.
    pub async fn serve(mut self, cache: &PodCacheWriter) {
        while let Some(msg) = self.0.recv().await {
            apply(cache, msg);
        }
    }
}

fn apply(cache: &PodCacheWriter, msg: Handed) {
    match msg {
        Handed::Status {
            uid,
            status,
            at,
            done,
        } => {
            cache.set(&uid, status, at);
            let _ = done.send(());
        }
        Handed::Forget { uid, done } => {
            cache.delete(&uid);
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_handed_read_is_in_the_cache_when_the_worker_goes_on_and_an_older_one_never_wins() {
        let cache = std::sync::Arc::new(PodCacheWriter::default());
        let (feed, rx) = channel();
        let served = cache.clone();
        tokio::spawn(async move { rx.serve(&served).await });
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let newer = RuntimePodStatus {
            sandboxes: vec![crate::container::SandboxStatus {
                id: "s2".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        feed.status_read("u1", newer, t1).await;
        let sandbox = |c: &PodCacheWriter| c.latest("u1").map(|s| s.sandboxes.len());
        assert_eq!(sandbox(&cache), Some(1));
        feed.status_read("u1", RuntimePodStatus::default(), t0)
            .await;
        assert_eq!(
            sandbox(&cache),
            Some(1),
            "an older read does not replace a newer one"
        );
        feed.forget("u1").await;
        assert!(cache.latest("u1").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_never_waits_long_on_a_pleg_that_does_not_serve() {
        let (feed, rx) = channel();
        let t = tokio::time::Instant::now();
        feed.forget("u1").await;
        assert_eq!(t.elapsed(), APPLY_WAIT);
        drop(rx);
        let t = tokio::time::Instant::now();
        feed.forget("u1").await;
        assert_eq!(t.elapsed(), Duration::ZERO, "a PLEG that is gone: at once");
    }
}
