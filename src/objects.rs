//! Local ConfigMaps and Secrets: what kubelet's `configmap.Manager` and `secret.Manager` serve
//! from the API server, served here from `kind: ConfigMap` and `kind: Secret` documents in
//! `staticPodPath` (beyond kubelet, which refuses static pods that reference them; kubernetes
//! issues #27312, #103587, #100105). Objects are namespaced as pods are (`default` when unset)
//! and a pod sees only those of its own namespace.
//!
//! The file source replaces the whole set on every listing ([`LocalObjects::replace`]) and learns
//! which objects changed; the pods that reference them ([`pod_references`]) are synced again, so
//! that their volumes are rewritten (atomically, see [`crate::volume::atomic_writer`]) and
//! containers held for a missing object start. Secret values never leave this store but into
//! containers: no log line, event, status or `plan` output carries them.
//!
//! In cluster mode, API pods read the apiserver's objects instead, held in an [`ApiObjects`]
//! that [`crate::cluster::objects`] keeps from one watch per referenced object.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

/// The kind of a local object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    /// `kind: ConfigMap`.
    ConfigMap,
    /// `kind: Secret`.
    Secret,
}

impl ObjectKind {
    /// The API kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }
}

/// A reference to one object: kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// ConfigMap or Secret.
    pub kind: ObjectKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One object's data as containers see it: key → bytes (a ConfigMap's `data` and `binaryData`;
/// a Secret's `data` with `stringData` merged in, as the API server merges it).
pub type Data = BTreeMap<String, Vec<u8>>;

/// The objects of every namespace, shared between the file source (the writer) and the runtime
/// manager and volume plugins (readers). Cheap to clone.
#[derive(Clone, Default)]
pub struct LocalObjects(Arc<RwLock<HashMap<ObjectRef, Arc<Data>>>>);

/// The data of a ConfigMap: `data` as UTF-8 bytes and `binaryData`.
pub fn config_map_data(cm: &ConfigMap) -> Data {
    let mut out: Data = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// The data of a Secret: `data`, overridden by `stringData` (the API server's merge).
pub fn secret_data(s: &Secret) -> Data {
    let mut out: Data = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    for (k, v) in s.string_data.iter().flatten() {
        out.insert(k.clone(), v.as_bytes().to_vec());
    }
    out
}

impl LocalObjects {
    /// The data of `kind` `namespace`/`name`, if such an object exists.
    pub fn get(&self, kind: ObjectKind, namespace: &str, name: &str) -> Option<Arc<Data>> {
        let key = ObjectRef {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()
    }

    /// Replaces every object with `objects`; returns the references whose data changed (added,
    /// removed or edited).
    pub fn replace(&self, objects: HashMap<ObjectRef, Data>) -> BTreeSet<ObjectRef> {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        let mut changed: BTreeSet<ObjectRef> = map
            .keys()
            .filter(|k| !objects.contains_key(*k))
            .cloned()
            .collect();
        let mut next = HashMap::with_capacity(objects.len());
        for (k, data) in objects {
            match map.get(&k) {
                Some(old) if **old == data => {
                    next.insert(k, old.clone());
                }
                _ => {
                    changed.insert(k.clone());
                    next.insert(k, Arc::new(data));
                }
            }
        }
        *map = next;
        changed
    }

    /// Sets one object's data (`None`: it does not exist); returns whether that changed it.
    pub fn set(&self, r: ObjectRef, data: Option<Data>) -> bool {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        match data {
            Some(d) => {
                if map.get(&r).is_some_and(|old| **old == d) {
                    return false;
                }
                map.insert(r, Arc::new(d));
                true
            }
            None => map.remove(&r).is_some(),
        }
    }

    /// Number of objects (for tests).
    pub fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Longest wait, in a pod's sync, for the watches of its objects to have listed.
pub const SYNC_WAIT: Duration = Duration::from_secs(1);

/// The API pods' ConfigMaps and Secrets (kept by [`crate::cluster::objects`]): their data (read
/// as [`LocalObjects`]) and which have been listed by their watch; and the cluster's Services
/// (kept by [`crate::cluster::services`]), which every pod's environment reads. Cheap to clone.
#[derive(Clone, Default)]
pub struct ApiObjects {
    store: LocalObjects,
    services: crate::envvars::Services,
    tokens: crate::token::TokenManager,
    synced: Arc<RwLock<HashSet<ObjectRef>>>,
    wanted: Arc<tokio::sync::Notify>,
}

impl ApiObjects {
    /// The objects' data, for volumes and env.
    pub fn store(&self) -> &LocalObjects {
        &self.store
    }

    /// The cluster's Services, for the pods' service environment variables (kept by
    /// [`crate::cluster::services`]).
    pub fn services(&self) -> &crate::envvars::Services {
        &self.services
    }

    /// The service account tokens of API pods' projected volumes ([`crate::token`]).
    pub fn tokens(&self) -> &crate::token::TokenManager {
        &self.tokens
    }

    /// Whether `r`'s watch has listed it (present or absent).
    pub fn is_synced(&self, r: &ObjectRef) -> bool {
        self.synced
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(r)
    }

    /// Waits until every one of `refs` is synced, at most [`SYNC_WAIT`], checking every 10 ms
    /// (kubelet polls the same way); wakes the watch manager first so that new references are
    /// watched at once. Returns whether all are synced.
    pub async fn wait_synced(&self, refs: &BTreeSet<ObjectRef>) -> bool {
        if refs.iter().all(|r| self.is_synced(r)) {
            return true;
        }
        self.wanted.notify_one();
        let deadline = tokio::time::Instant::now() + SYNC_WAIT;
        loop {
            if refs.iter().all(|r| self.is_synced(r)) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            crate::clock::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until a sync asks for objects not yet watched ([`ApiObjects::wait_synced`]).
    pub async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// Records what `r`'s watch says: its data, or `None` when it does not exist; returns
    /// whether the data changed.
    pub fn observe(&self, r: &ObjectRef, data: Option<Data>) -> bool {
        self.synced
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(r.clone());
        self.store.set(r.clone(), data)
    }

    /// Forgets `r` (no API pod references it).
    pub fn forget(&self, r: &ObjectRef) {
        self.synced
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(r);
        self.store.set(r.clone(), None);
    }
}

/// Every ConfigMap and Secret `pod` references: `imagePullSecrets`, configMap, secret and
/// projected volumes, and each container's (ephemeral ones' too) `envFrom` and
/// `configMapKeyRef`/`secretKeyRef` env (kubelet's `podutil.VisitPodConfigmapNames` / `VisitPodSecretNames`), in the pod's
/// namespace.
pub fn pod_references(pod: &Pod) -> BTreeSet<ObjectRef> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut add = |kind, name: &str| {
        if !name.is_empty() {
            out.insert(ObjectRef {
                kind,
                namespace: namespace.clone(),
                name: name.to_owned(),
            });
        }
    };
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeSet::new();
    };
    for r in spec.image_pull_secrets.iter().flatten() {
        add(ObjectKind::Secret, &r.name);
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            add(ObjectKind::ConfigMap, &cm.name);
        }
        if let Some(s) = &v.secret {
            add(
                ObjectKind::Secret,
                s.secret_name.as_deref().unwrap_or_default(),
            );
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &src.config_map {
                add(ObjectKind::ConfigMap, &cm.name);
            }
            if let Some(s) = &src.secret {
                add(ObjectKind::Secret, &s.name);
            }
        }
    }
    // Each container's env sources, ephemeral containers' too.
    let envs = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| (&c.env_from, &c.env))
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (&c.env_from, &c.env)),
        );
    for (env_from, env) in envs {
        for e in env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &e.secret_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
        for e in env.iter().flatten() {
            let Some(src) = &e.value_from else { continue };
            if let Some(r) = &src.config_map_key_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &src.secret_key_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
    }
    out
}

/// The values of every Secret `pod` references (see [`pod_references`]), as the pieces an error
/// message could quote: each value split at control characters (a runtime quotes those
/// escaped), pieces of 3 bytes or more.
pub fn secret_values(pod: &Pod, objects: &LocalObjects) -> Vec<String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut out: Vec<String> = pod_references(pod)
        .into_iter()
        .filter(|r| r.kind == ObjectKind::Secret)
        .filter_map(|r| objects.get(ObjectKind::Secret, namespace, &r.name))
        .flat_map(|d| {
            d.values()
                .flat_map(|v| {
                    String::from_utf8_lossy(v)
                        .split(|c: char| c.is_control())
                        .filter(|p| p.len() >= 3)
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    // Longest first, so that a value containing another is taken out whole.
    out.sort_by_key(|v| std::cmp::Reverse(v.len()));
    out.dedup();
    out
}

/// `message` with every one of `secrets` replaced by `[redacted]`.
pub fn redact(message: &str, secrets: &[String]) -> String {
    let mut out = message.to_owned();
    for s in secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "[redacted]");
        }
    }
    out
}

/// kubelet's message for a missing object: `configmap "x" not found` / `secret "x" not found`.
pub fn not_found(kind: ObjectKind, name: &str) -> String {
    match kind {
        ObjectKind::ConfigMap => format!("configmap {name:?} not found"),
        ObjectKind::Secret => format!("secret {name:?} not found"),
    }
}

/// A valid key of a ConfigMap or Secret (the API server's `IsConfigMapKey`): 1–253 characters of
/// `[-._a-zA-Z0-9]`, not `.`, not starting with `..`.
pub fn is_valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && !k.starts_with("..")
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Largest total size of one object's data, bytes (the API server's `MaxSecretSize` and
/// ConfigMap limit, 1 MiB).
pub const MAX_OBJECT_BYTES: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    fn r(kind: ObjectKind, name: &str) -> ObjectRef {
        ObjectRef {
            kind,
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn replace_reports_added_edited_and_removed_objects() {
        let objs = LocalObjects::default();
        let d = |v: &str| Data::from([("k".to_string(), v.as_bytes().to_vec())]);
        let first = HashMap::from([
            (r(ObjectKind::ConfigMap, "a"), d("1")),
            (r(ObjectKind::Secret, "a"), d("1")),
        ]);
        assert_eq!(objs.replace(first.clone()).len(), 2);
        assert!(objs.replace(first).is_empty(), "nothing changed");
        let next = HashMap::from([(r(ObjectKind::ConfigMap, "a"), d("2"))]);
        let changed = objs.replace(next);
        assert_eq!(
            changed,
            BTreeSet::from([r(ObjectKind::ConfigMap, "a"), r(ObjectKind::Secret, "a")])
        );
        assert_eq!(
            objs.get(ObjectKind::ConfigMap, "default", "a").unwrap()["k"],
            b"2"
        );
        assert!(objs.get(ObjectKind::Secret, "default", "a").is_none());
    }

    #[test]
    fn references_cover_volumes_projections_env_and_pull_secrets() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, namespace: ns}
spec:
  volumes:
  - {name: a, configMap: {name: cm1}}
  - {name: b, secret: {secretName: s1}}
  - name: c
    projected: {sources: [{configMap: {name: cm2}}, {secret: {name: s2}}]}
  initContainers:
  - {name: i, image: x, envFrom: [{secretRef: {name: s3}}]}
  containers:
  - name: c
    image: x
    envFrom: [{configMapRef: {name: cm3}}]
    env: [{name: A, valueFrom: {secretKeyRef: {name: s4, key: k}}}, {name: B, valueFrom: {configMapKeyRef: {name: cm4, key: k}}}]
  ephemeralContainers:
  - {name: e, image: x, envFrom: [{configMapRef: {name: cm5}}], env: [{name: C, valueFrom: {secretKeyRef: {name: s5, key: k}}}]}
  imagePullSecrets: [{name: s6}]
",
        )
        .unwrap();
        let names: Vec<String> = pod_references(&pod)
            .into_iter()
            .map(|r| {
                assert_eq!(r.namespace, "ns");
                format!("{}/{}", r.kind.as_str(), r.name)
            })
            .collect();
        assert_eq!(
            names,
            [
                "ConfigMap/cm1",
                "ConfigMap/cm2",
                "ConfigMap/cm3",
                "ConfigMap/cm4",
                "ConfigMap/cm5",
                "Secret/s1",
                "Secret/s2",
                "Secret/s3",
                "Secret/s4",
                "Secret/s5",
                "Secret/s6"
            ]
        );
    }

    #[test]
    fn secret_values_are_taken_out_of_messages() {
        let objs = LocalObjects::default();
        objs.replace(HashMap::from([(
            r(ObjectKind::Secret, "db"),
            Data::from([("pw".to_string(), b"TOP\0SECRET-after".to_vec())]),
        )]));
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, namespace: default}\nspec: {containers: [{name: c, image: b, env: [{name: A, valueFrom: {secretKeyRef: {name: db, key: pw}}}]}]}",
        )
        .unwrap();
        let secrets = secret_values(&pod, &objs);
        let msg = redact("exec: \"A=TOP\\x00SECRET-after\": failed", &secrets);
        assert_eq!(msg, "exec: \"A=[redacted]\\x00[redacted]\": failed");
    }

    #[test]
    fn keys_follow_the_api_servers_rule() {
        for ok in ["a", "config.yaml", "A_b-c.d", ".hidden"] {
            assert!(is_valid_key(ok), "{ok}");
        }
        for bad in ["", ".", "..", "..data", "a/b", "a b", &"x".repeat(254)] {
            assert!(!is_valid_key(bad), "{bad}");
        }
    }
}
