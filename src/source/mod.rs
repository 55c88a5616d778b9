//! Pod sources (kubelet's `pkg/kubelet/config`): where desired pods come from, and how their
//! changes become ADD / UPDATE / REMOVE operations for the sync loop.
//!
//! Each source reports the complete set of pods it wants (a snapshot); [`PodConfig`] diffs each
//! snapshot against the previous one of the same source and emits [`PodUpdate`]s. Added and
//! updated pods carry `kubernetes.io/config.seen`, the time the config first saw them
//! ([`record_first_seen`]): the file source stamps its pods when it first lists them (it keeps
//! them between snapshots, which then share them), [`PodConfig`] stamps the others. kubelet keeps
//! the first time across an update of the same UID; nodelet stamps the update's time.

pub mod api;
pub mod checkpoint;
pub mod file;
pub mod manifest;
pub mod mux;
pub mod url;
pub mod validation;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::{config_hash, now_rfc3339, pod_uid, CONFIG_SEEN_ANNOTATION};

/// Errors about one manifest file. Each names the file; none stops the agent or other pods.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("manifest {file}: cannot read: {message}")]
    Read {
        /// Path of the manifest.
        file: String,
        /// The I/O error.
        message: String,
    },
    /// The file is empty.
    #[error("manifest {file}: file is empty")]
    Empty {
        /// Path of the manifest.
        file: String,
    },
    /// The file is not valid YAML/JSON, or a field has the wrong type.
    #[error("manifest {file}: cannot decode: {message}")]
    Parse {
        /// Path of the manifest.
        file: String,
        /// The decoder's message, with field path or line and column.
        message: String,
    },
    /// A field fails validation.
    #[error("manifest {file}: invalid field {}: {}", error.field, error.describe())]
    Invalid {
        /// Path of the manifest.
        file: String,
        /// The failing field.
        error: validation::FieldError,
    },
    /// `<metadata.name>-<nodeName>` is not a DNS-1123 subdomain.
    #[error("manifest {file}: field metadata.name: static pod name {name:?} (name + \"-\" + node name) is not a DNS-1123 subdomain of at most 253 characters")]
    InvalidName {
        /// Path of the manifest.
        file: String,
        /// The full pod name.
        name: String,
    },
    /// Another file already defines a ConfigMap or Secret of this namespace and name; the first
    /// one (in file name order) wins.
    #[error("manifest {file}: field metadata.name: {kind} {namespace}/{name} is already defined by {first}; this definition is ignored")]
    DuplicateObject {
        /// Path of the ignored definition.
        file: String,
        /// ConfigMap or Secret.
        kind: &'static str,
        /// Namespace of the object.
        namespace: String,
        /// Its name.
        name: String,
        /// The manifest that defines it first.
        first: String,
    },
    /// Another file already defines a pod with this namespace and name, or this UID; the first
    /// one wins.
    #[error("manifest {file}: field metadata.name: pod {namespace}/{name} (uid {uid} in this file) is already defined by {first}; this file is ignored")]
    Duplicate {
        /// Path of the ignored manifest.
        file: String,
        /// Namespace of the pod.
        namespace: String,
        /// Full pod name.
        name: String,
        /// The UID of the pod this file defines (the same as the first file's when the duplicate
        /// is an explicit `metadata.uid`).
        uid: String,
        /// The manifest that defines it first.
        first: String,
    },
}

impl ManifestError {
    /// A short CamelCase reason, used as the event reason and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } => "ReadError",
            Self::Empty { .. } => "EmptyManifest",
            Self::Parse { .. } => "DecodeError",
            Self::Invalid { .. } | Self::InvalidName { .. } => "InvalidManifest",
            Self::Duplicate { .. } => "DuplicatePod",
            Self::DuplicateObject { .. } => "DuplicateObject",
        }
    }
}

/// What happened to a set of pods (kubelet's `PodOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOp {
    /// Pods new to the agent.
    Add,
    /// Pods whose manifest changed.
    Update,
    /// Pods no source wants any more: kill them and forget them.
    Remove,
    /// Pods whose spec is unchanged but whose ConfigMaps or Secrets changed: sync them (their
    /// volumes are rewritten, containers held for a missing object start). kubelet's
    /// `RECONCILE` carries status-only changes the same way, to a sync.
    Reconcile,
}

/// A batch of pod changes from one source (kubelet's `kubetypes.PodUpdate`).
#[derive(Debug, Clone)]
pub struct PodUpdate {
    /// The operation.
    pub op: PodOp,
    /// The source name (`file`).
    pub source: &'static str,
    /// The pods concerned.
    pub pods: Vec<Arc<Pod>>,
}

/// Merges snapshots from the sources into operations (kubelet's `PodConfig` / `podStorage` in
/// `PodConfigNotificationIncremental` mode) and tracks which sources have reported at least once.
pub struct PodConfig {
    pods: HashMap<&'static str, HashMap<String, Arc<Pod>>>,
    ready: HashMap<&'static str, Arc<AtomicBool>>,
    tx: crossbeam_channel::Sender<PodUpdate>,
}

impl PodConfig {
    /// A merger sending its operations on `tx` (the sync loop's config channel).
    pub fn new(tx: crossbeam_channel::Sender<PodUpdate>) -> Self {
        Self {
            pods: HashMap::new(),
            ready: HashMap::new(),
            tx,
        }
    }

    /// Registers a source; the returned flag turns true after its first snapshot.
    pub fn register(&mut self, source: &'static str) -> Arc<AtomicBool> {
        self.ready.entry(source).or_default().clone()
    }

    /// Flags of all registered sources (kubelet's `SourcesReady`).
    pub fn readiness(&self) -> SourcesReady {
        SourcesReady(self.ready.values().cloned().collect())
    }

    /// Takes the complete set of pods `source` wants now and sends ADD, UPDATE and REMOVE batches
    /// for the differences from its previous snapshot. Returns the operations sent.
    ///
    /// A pod new to the snapshot, or changed, is stamped with the time it was first seen
    /// ([`record_first_seen`]) unless its source stamped it already: a source that keeps its
    /// pods between snapshots (the file source) stamps them when it first lists them, so that
    /// the snapshot shares the source's pod instead of copying it. The sources drop a stamp a
    /// manifest or API object carries. An unchanged pod keeps the object of the previous
    /// snapshot.
    pub fn set(&mut self, source: &'static str, snapshot: Vec<Arc<Pod>>) -> Vec<PodUpdate> {
        let old = self.pods.remove(source).unwrap_or_default();
        let mut new = HashMap::with_capacity(snapshot.len());
        let (mut adds, mut updates) = (Vec::new(), Vec::new());
        let mut seen = None;
        for mut pod in snapshot {
            let uid = pod_uid(&pod).to_owned();
            match old.get(&uid) {
                Some(prev)
                    if config_hash(prev) == config_hash(&pod)
                        && prev.metadata.name == pod.metadata.name =>
                {
                    new.insert(uid, prev.clone());
                }
                prev => {
                    if first_seen(&pod).is_none() {
                        let at = seen.get_or_insert_with(now_rfc3339);
                        record_first_seen(Arc::make_mut(&mut pod), at);
                    }
                    if prev.is_some() {
                        updates.push(pod.clone())
                    } else {
                        adds.push(pod.clone())
                    }
                    new.insert(uid, pod);
                }
            }
        }
        let removes: Vec<Arc<Pod>> = old
            .iter()
            .filter(|(uid, _)| !new.contains_key(*uid))
            .map(|(_, p)| p.clone())
            .collect();
        self.pods.insert(source, new);
        let mut ops = Vec::new();
        for (op, pods) in [
            (PodOp::Remove, removes),
            (PodOp::Add, adds),
            (PodOp::Update, updates),
        ] {
            if !pods.is_empty() {
                let update = PodUpdate { op, source, pods };
                // A closed channel means the agent is shutting down; nothing to do then.
                let _ = self.tx.send(update.clone());
                ops.push(update);
            }
        }
        if let Some(flag) = self.ready.get(source) {
            flag.store(true, Ordering::Release);
        }
        ops
    }
}

impl PodConfig {
    /// Every ConfigMap and Secret the pods of `source` reference.
    pub fn references(
        &self,
        source: &str,
    ) -> std::collections::BTreeSet<crate::objects::ObjectRef> {
        self.pods
            .get(source)
            .into_iter()
            .flat_map(|m| m.values())
            .flat_map(|p| crate::objects::pod_references(p))
            .collect()
    }

    /// Sends a RECONCILE batch of the pods of `source` that reference any of `changed` (see
    /// [`crate::objects::pod_references`]); returns it, if any pod does.
    pub fn reconcile(
        &mut self,
        source: &'static str,
        changed: &std::collections::BTreeSet<crate::objects::ObjectRef>,
    ) -> Option<PodUpdate> {
        let pods: Vec<Arc<Pod>> = self
            .pods
            .get(source)?
            .values()
            .filter(|p| {
                crate::objects::pod_references(p)
                    .iter()
                    .any(|r| changed.contains(r))
            })
            .cloned()
            .collect();
        if pods.is_empty() {
            return None;
        }
        let update = PodUpdate {
            op: PodOp::Reconcile,
            source,
            pods,
        };
        let _ = self.tx.send(update.clone());
        Some(update)
    }
}

/// The time the config first saw `pod` (its `kubernetes.io/config.seen` annotation, RFC 3339),
/// if it was stamped.
pub fn first_seen(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(CONFIG_SEEN_ANNOTATION)
        .map(String::as_str)
}

/// Stamps `pod` with `at` (RFC 3339) as the time the config first saw it
/// (`kubernetes.io/config.seen`, kubelet's `recordFirstSeenTime`).
pub fn record_first_seen(pod: &mut Pod, at: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_SEEN_ANNOTATION.into(), at.to_owned());
}

/// Whether every registered source has delivered its first snapshot; housekeeping only kills
/// unwanted pods after that (kubelet's `sourcesReady.AllReady`).
#[derive(Clone, Default)]
pub struct SourcesReady(Vec<Arc<AtomicBool>>);

impl SourcesReady {
    /// True once all sources have reported.
    pub fn all_ready(&self) -> bool {
        self.0.iter().all(|f| f.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, hash: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("p-{uid}"));
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_HASH_ANNOTATION.to_string(),
                hash.to_string(),
            )]
            .into(),
        );
        Arc::new(p)
    }

    #[test]
    fn snapshots_become_add_update_remove() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut cfg = PodConfig::new(tx);
        let ready = cfg.register("file");
        assert!(!cfg.readiness().all_ready());
        let ops = cfg.set("file", vec![pod("a", "1"), pod("b", "1")]);
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].op, PodOp::Add);
        assert!(ready.load(Ordering::Acquire) && cfg.readiness().all_ready());
        let ops = cfg.set("file", vec![pod("a", "1"), pod("b", "2"), pod("c", "1")]);
        let kinds: Vec<_> = ops.iter().map(|u| (u.op, u.pods.len())).collect();
        assert_eq!(kinds, vec![(PodOp::Add, 1), (PodOp::Update, 1)]);
        let ops = cfg.set("file", vec![pod("b", "2")]);
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].op, PodOp::Remove);
        assert_eq!(ops[0].pods.len(), 2);
        assert!(cfg.set("file", vec![pod("b", "2")]).is_empty());
        assert_eq!(rx.try_iter().count(), 4);
    }

    #[test]
    fn a_pod_its_source_stamped_is_shared_not_copied() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let mut cfg = PodConfig::new(tx);
        let mut stamped = pod("a", "1");
        record_first_seen(Arc::make_mut(&mut stamped), "2026-12-02T00:00:00Z");
        let ops = cfg.set("file", vec![stamped.clone(), pod("b", "1")]);
        let added = &ops[0].pods;
        let a = added.iter().find(|p| pod_uid(p) == "a").unwrap();
        assert!(Arc::ptr_eq(a, &stamped), "the source's own pod, not a copy");
        assert_eq!(first_seen(a), Some("2026-12-02T00:00:00Z"));
        let b = added.iter().find(|p| pod_uid(p) == "b").unwrap();
        assert!(first_seen(b).is_some_and(|t| t.ends_with('Z') && t != "2026-12-02T00:00:00Z"));
    }

    #[test]
    fn added_pods_carry_config_seen() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let mut cfg = PodConfig::new(tx);
        let ops = cfg.set("file", vec![pod("a", "1")]);
        let ann = ops[0].pods[0].metadata.annotations.as_ref().unwrap();
        assert!(ann[CONFIG_SEEN_ANNOTATION].ends_with('Z'));
    }
}
