//! The pod configuration's mux (kubelet's `config.Mux` feeding `PodConfig`): every source sends
//! what it wants on a channel into one merger, the `pod-config` thread, which alone owns the
//! [`PodConfig`] and turns snapshots into the sync loop's ADD / UPDATE / REMOVE / RECONCILE
//! batches.
//!
//! No lock is shared with the sources and no source waits on a thread it does not own: the tokio
//! tasks (URL, API server, API objects) `await` room in the channel, the file source's own thread
//! blocks on it, and only the merger thread blocks on the sync loop's channel. The channel holds
//! [`SOURCE_CAPACITY`] messages; a full one holds its senders back (nothing is dropped: each
//! message is a source's complete wish or a change to act on).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};

use super::{PodConfig, PodUpdate, SourcesReady};
use crate::objects::ObjectRef;

/// Messages waiting for the merger, all sources together. A source sends one snapshot per
/// listing or fetch, so a handful is enough; a sender waits for room beyond it.
pub const SOURCE_CAPACITY: usize = 8;

/// What a source tells the merger.
#[derive(Debug)]
pub enum SourceMsg {
    /// The complete set of pods the source wants now ([`PodConfig::set`]).
    Snapshot(Vec<Arc<Pod>>),
    /// ConfigMaps or Secrets changed: the source's pods that reference them are synced
    /// ([`PodConfig::reconcile`]).
    ObjectsChanged(BTreeSet<ObjectRef>),
}

/// One source's end of the mux. Cheap to clone.
#[derive(Clone)]
pub struct SourceSender {
    source: &'static str,
    tx: mpsc::Sender<(&'static str, SourceMsg)>,
}

impl SourceSender {
    /// Sends `msg`, waiting without blocking the thread while the channel is full (for tokio
    /// tasks). Returns false once the merger has stopped (the agent is stopping).
    pub async fn send(&self, msg: SourceMsg) -> bool {
        self.tx.send((self.source, msg)).await.is_ok()
    }

    /// Sends `msg`, blocking the calling thread while the channel is full: only for a thread the
    /// source owns (the file source), never a tokio thread. Returns false once the merger has
    /// stopped.
    pub fn blocking_send(&self, msg: SourceMsg) -> bool {
        self.tx.blocking_send((self.source, msg)).is_ok()
    }
}

/// The mux before it runs: sources register, then [`Mux::spawn`] starts the merger.
pub struct Mux {
    config: PodConfig,
    tx: mpsc::Sender<(&'static str, SourceMsg)>,
    rx: mpsc::Receiver<(&'static str, SourceMsg)>,
    references: Vec<(&'static str, watch::Sender<BTreeSet<ObjectRef>>)>,
}

impl Mux {
    /// A mux whose merger sends its batches on `updates` (the sync loop's config channel).
    pub fn new(updates: crossbeam_channel::Sender<PodUpdate>) -> Self {
        let (tx, rx) = mpsc::channel(SOURCE_CAPACITY);
        Self {
            config: PodConfig::new(updates),
            tx,
            rx,
            references: Vec::new(),
        }
    }

    /// Registers `source` and returns its sender; the source counts as ready after its first
    /// snapshot ([`Mux::readiness`]).
    pub fn register(&mut self, source: &'static str) -> SourceSender {
        self.config.register(source);
        SourceSender {
            source,
            tx: self.tx.clone(),
        }
    }

    /// The ConfigMaps and Secrets the pods of `source` reference, as of its last snapshot
    /// ([`PodConfig::references`]), republished by the merger after each of its snapshots.
    pub fn references(&mut self, source: &'static str) -> watch::Receiver<BTreeSet<ObjectRef>> {
        let (tx, rx) = watch::channel(BTreeSet::new());
        self.references.push((source, tx));
        rx
    }

    /// Whether every registered source has sent its first snapshot.
    pub fn readiness(&self) -> SourcesReady {
        self.config.readiness()
    }

    /// Starts the merger on the thread `pod-config`; it ends when every [`SourceSender`] is
    /// dropped.
    pub fn spawn(self) -> std::thread::JoinHandle<()> {
        let Self {
            mut config,
            tx,
            mut rx,
            references,
        } = self;
        drop(tx);
        std::thread::Builder::new()
            .name("pod-config".into())
            .spawn(move || {
                while let Some((source, msg)) = rx.blocking_recv() {
                    merge(&mut config, &references, source, msg);
                }
            })
            .expect("spawning the pod-config thread at start-up")
    }
}

/// Applies one source message to `config`, republishing that source's references after a
/// snapshot.
fn merge(
    config: &mut PodConfig,
    references: &[(&'static str, watch::Sender<BTreeSet<ObjectRef>>)],
    source: &'static str,
    msg: SourceMsg,
) {
    match msg {
        SourceMsg::Snapshot(pods) => {
            config.set(source, pods);
            for (_, tx) in references.iter().filter(|(s, _)| *s == source) {
                let now = config.references(source);
                tx.send_if_modified(|held| {
                    let changed = *held != now;
                    *held = now;
                    changed
                });
            }
        }
        SourceMsg::ObjectsChanged(changed) => {
            config.reconcile(source, &changed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::PodOp;

    fn pod(uid: &str, config_map: Option<&str>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(uid.into());
        p.metadata.namespace = Some("default".into());
        let mut spec = k8s_openapi::api::core::v1::PodSpec::default();
        if let Some(cm) = config_map {
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: "v".into(),
                config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                    name: cm.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
        p.spec = Some(spec);
        Arc::new(p)
    }

    use crate::testing::pods::config_map_ref as cm;

    #[test]
    fn sources_reach_the_sync_loop_through_one_merger_and_references_follow_snapshots() {
        let (updates, batches) = crossbeam_channel::bounded(50);
        let mut mux = Mux::new(updates);
        let file = mux.register("file");
        let api = mux.register("api");
        let mut refs = mux.references("api");
        let ready = mux.readiness();
        let merger = mux.spawn();
        assert!(file.blocking_send(SourceMsg::Snapshot(vec![pod("a", None)])));
        let b = batches.recv().unwrap();
        assert_eq!((b.op, b.source, b.pods.len()), (PodOp::Add, "file", 1));
        assert!(!ready.all_ready(), "the API source has not reported yet");
        assert!(api.blocking_send(SourceMsg::Snapshot(vec![pod("b", Some("cfg"))])));
        let b = batches.recv().unwrap();
        assert_eq!((b.op, b.source), (PodOp::Add, "api"));
        assert!(ready.all_ready());
        // The merger publishes the references right after it has sent the batch: on a busy
        // machine they may come a moment after the batch is received (polled to a deadline).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !refs.has_changed().unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "references not published"
            );
            std::thread::yield_now();
        }
        assert_eq!(*refs.borrow_and_update(), BTreeSet::from([cm("cfg")]));
        assert!(api.blocking_send(SourceMsg::ObjectsChanged(BTreeSet::from([cm("cfg")]))));
        let b = batches.recv().unwrap();
        assert_eq!(
            (b.op, b.pods[0].metadata.uid.as_deref()),
            (PodOp::Reconcile, Some("b"))
        );
        // Every sender gone: the merger ends.
        drop((file, api));
        merger.join().unwrap();
    }

    #[test]
    fn the_channel_holds_its_bound_and_a_full_one_holds_the_sender_back() {
        let (updates, _batches) = crossbeam_channel::bounded(50);
        let mut mux = Mux::new(updates);
        let file = mux.register("file");
        // The merger is not running: the channel fills up to its bound, then a send waits.
        for _ in 0..SOURCE_CAPACITY {
            let sent = file.tx.try_send(("file", SourceMsg::Snapshot(Vec::new())));
            assert!(sent.is_ok());
        }
        assert!(matches!(
            file.tx.try_send(("file", SourceMsg::Snapshot(Vec::new()))),
            Err(mpsc::error::TrySendError::Full(_))
        ));
        let waiting =
            std::thread::spawn(move || file.blocking_send(SourceMsg::Snapshot(Vec::new())));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiting.is_finished(), "the sender waits for room");
        let merger = mux.spawn();
        assert!(
            waiting.join().unwrap(),
            "and sends once the merger takes messages"
        );
        merger.join().unwrap();
    }
}
