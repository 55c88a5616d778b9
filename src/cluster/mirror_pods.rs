//! Mirror pods (kubelet's `pkg/kubelet/pod/mirror_client.go` and the mirror-pod part of
//! `syncPod`): the API's view of this node's static pods.
//!
//! Every [`MIRROR_SYNC_PERIOD`] the agent lists the pods bound to its node and compares them with
//! its static pods (those the file source gave, as the status manager holds them):
//! - a static pod without a mirror gets one: the pod as decoded, without UID, with annotation
//!   `kubernetes.io/config.mirror` set to its `kubernetes.io/config.hash`, owned by the Node;
//! - a mirror whose `config.mirror` is not the static pod's hash (the manifest was edited), or
//!   that is being deleted (by hand: the API only marks a bound pod for deletion), is deleted at
//!   once (on its UID) and created again: it comes back;
//! - a mirror whose static pod is gone is deleted;
//! - the static pod's status is posted to its mirror's status subresource when it changed.
//!
//! The API refuses a mirror pod that references Secrets, ConfigMaps, ServiceAccounts or
//! PersistentVolumeClaims (the NodeRestriction admission plugin); that is reported once per pod
//! and the static pod runs regardless.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use tracing::{info, warn};

use crate::pod::{is_mirror_pod, is_static_pod, CONFIG_MIRROR_ANNOTATION};

/// How often mirror pods are compared with the static pods.
pub const MIRROR_SYNC_PERIOD: Duration = Duration::from_secs(2);

fn mirror_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(CONFIG_MIRROR_ANNOTATION)
        .map(String::as_str)
}

/// The mirror pod of static pod `pod`, owned by the Node `node_uid` when known.
pub fn mirror_of(pod: &Pod, node_name: &str, node_uid: Option<&str>) -> Pod {
    let mut m = pod.clone();
    m.status = None;
    m.metadata.uid = None;
    m.metadata.resource_version = None;
    m.metadata.creation_timestamp = None;
    let hash = crate::pod::config_hash(pod).to_owned();
    m.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(CONFIG_MIRROR_ANNOTATION.into(), hash);
    m.metadata.owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node_name.into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }]
    });
    m
}

/// What one comparison decided, by `namespace/name`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MirrorPlan {
    /// Static pods whose mirror is to be created.
    pub create: Vec<String>,
    /// Mirrors to delete (their UIDs), as stale or orphaned.
    pub delete: Vec<(String, String)>,
    /// Mirrors whose status is to be posted.
    pub post_status: Vec<String>,
}

fn key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Compares the static pods (with their statuses) with the mirror pods the API has.
pub fn plan(statics: &[Pod], mirrors: &[Pod]) -> MirrorPlan {
    let mut out = MirrorPlan::default();
    let by_key: HashMap<String, &Pod> = mirrors.iter().map(|m| (key(m), m)).collect();
    let wanted: HashSet<String> = statics.iter().map(key).collect();
    for s in statics {
        let k = key(s);
        match by_key.get(&k) {
            None => out.create.push(k),
            Some(m) => {
                // Stale (the manifest changed) or being deleted (by hand): replaced.
                if mirror_hash(m) != Some(crate::pod::config_hash(s))
                    || m.metadata.deletion_timestamp.is_some()
                {
                    out.delete
                        .push((k.clone(), m.metadata.uid.clone().unwrap_or_default()));
                    out.create.push(k);
                } else if !same_status(m.status.as_ref(), s.status.as_ref()) {
                    out.post_status.push(k);
                }
            }
        }
    }
    for m in mirrors {
        if !wanted.contains(&key(m)) {
            out.delete
                .push((key(m), m.metadata.uid.clone().unwrap_or_default()));
        }
    }
    out
}

/// Statuses equal as the API returns them (what it stores of ours).
fn same_status(api: Option<&PodStatus>, ours: Option<&PodStatus>) -> bool {
    let norm = |s: Option<&PodStatus>| serde_json::to_value(s.cloned().unwrap_or_default()).ok();
    norm(api) == norm(ours)
}

/// Keeps the mirror pods of the static pods in `status` until the task is dropped.
pub async fn run(
    client: kube::Client,
    node_name: String,
    status: crate::status::StatusManager,
    registered: tokio::sync::watch::Receiver<Option<String>>,
) {
    let pods_api: Api<Pod> = Api::all(client.clone());
    let mut refused: HashSet<String> = HashSet::new();
    // Mirrors deleted already (by UID): one held by a finalizer is not deleted again each round.
    let mut deleted: HashSet<String> = HashSet::new();
    let mut failing = false;
    let mut tick = tokio::time::interval(MIRROR_SYNC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // The Node owns its mirror pods: wait until it is registered.
        let Some(node_uid) = registered.borrow().clone() else {
            continue;
        };
        let listed = pods_api
            .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
            .await;
        let mirrors: Vec<Pod> = match listed {
            Ok(l) => {
                failing = false;
                l.items.into_iter().filter(is_mirror_pod).collect()
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "mirror pods: cannot list this node's pods; will retry");
                    failing = true;
                }
                continue;
            }
        };
        // A static pod being removed (Terminating) has no mirror pod any more, as kubelet
        // deletes the mirror of a pod its config removed.
        let statics: Vec<Pod> =
            status.pods_where(|p| is_static_pod(p) && p.metadata.deletion_timestamp.is_none());
        let p = plan(&statics, &mirrors);
        let by_key: HashMap<String, &Pod> = statics.iter().map(|s| (key(s), s)).collect();
        deleted.retain(|uid| {
            mirrors
                .iter()
                .any(|m| m.metadata.uid.as_deref() == Some(uid))
        });
        for (k, uid) in &p.delete {
            if !deleted.insert(uid.clone()) {
                continue;
            }
            let (ns, name) = k.split_once('/').unwrap_or(("default", k));
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(name, &dp).await {
                Ok(_) => info!(pod = %k, "deleted mirror pod"),
                Err(e) => {
                    warn!(pod = %k, error = %e, "cannot delete mirror pod; will retry");
                    deleted.remove(uid);
                }
            }
        }
        for k in &p.create {
            let Some(s) = by_key.get(k) else { continue };
            let (ns, _) = k.split_once('/').unwrap_or(("default", k));
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let mirror = mirror_of(s, &node_name, Some(&node_uid));
            match api.create(&PostParams::default(), &mirror).await {
                Ok(created) => {
                    refused.remove(k);
                    info!(pod = %k, "created mirror pod");
                    post_status(&api, &created, s).await;
                }
                Err(e) => {
                    if refused.insert(k.clone()) {
                        warn!(pod = %k, error = %e, "cannot create mirror pod; the static pod runs regardless");
                    }
                }
            }
        }
        for k in &p.post_status {
            let (Some(s), Some(m)) = (by_key.get(k), mirrors.iter().find(|m| key(m) == *k)) else {
                continue;
            };
            let ns = m.metadata.namespace.as_deref().unwrap_or("default");
            post_status(&Api::namespaced(client.clone(), ns), m, s).await;
        }
    }
}

/// Posts the static pod's status to its mirror.
async fn post_status(api: &Api<Pod>, mirror: &Pod, static_pod: &Pod) {
    let name = mirror.metadata.name.as_deref().unwrap_or_default();
    // On the mirror's UID (a mirror replaced meanwhile is not written), merged as kubelet's
    // status manager merges (conditions by type: others' conditions stay).
    let patch = serde_json::json!({
        "metadata": { "uid": mirror.metadata.uid },
        "status": static_pod.status,
    });
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        warn!(pod = %name, error = %e, "cannot post the status of a mirror pod");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION};

    fn static_pod(name: &str, hash: &str, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.annotations = Some(
            [
                (CONFIG_SOURCE_ANNOTATION.to_string(), "file".to_string()),
                (CONFIG_HASH_ANNOTATION.to_string(), hash.to_string()),
            ]
            .into(),
        );
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn a_mirror_carries_the_hash_and_the_node_but_no_uid() {
        let s = static_pod("a-n1", "h1", "Running");
        let m = mirror_of(&s, "n1", Some("node-uid"));
        assert!(m.metadata.uid.is_none() && m.status.is_none());
        assert_eq!(mirror_hash(&m), Some("h1"));
        assert!(is_mirror_pod(&m) && !is_mirror_pod(&s) && is_static_pod(&s));
        let o = &m.metadata.owner_references.unwrap()[0];
        assert_eq!((o.kind.as_str(), o.uid.as_str()), ("Node", "node-uid"));
    }

    #[test]
    fn mirrors_are_created_replaced_deleted_and_given_status() {
        let statics = vec![
            static_pod("new-n1", "h1", "Running"),
            static_pod("edited-n1", "h2", "Running"),
            static_pod("same-n1", "h3", "Running"),
            static_pod("moved-n1", "h4", "Failed"),
            static_pod("deleted-n1", "h5", "Running"),
        ];
        let mirror = |s: &Pod, hash: &str, uid: &str, phase: &str| {
            let mut m = mirror_of(s, "n1", None);
            m.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(CONFIG_MIRROR_ANNOTATION.into(), hash.into());
            m.metadata.uid = Some(uid.into());
            m.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            m
        };
        let mirrors = vec![
            mirror(&statics[1], "old", "m-edited", "Running"),
            mirror(&statics[2], "h3", "m-same", "Running"),
            mirror(&statics[3], "h4", "m-moved", "Running"),
            {
                let mut m = mirror(&statics[4], "h5", "m-deleted", "Running");
                m.metadata.deletion_timestamp = Some(crate::pod::api_time(std::time::UNIX_EPOCH));
                m
            },
            mirror(
                &static_pod("gone-n1", "h9", "Running"),
                "h9",
                "m-gone",
                "Running",
            ),
        ];
        let p = plan(&statics, &mirrors);
        assert_eq!(
            p.create,
            vec!["default/new-n1", "default/edited-n1", "default/deleted-n1"]
        );
        assert_eq!(
            p.delete,
            vec![
                ("default/edited-n1".to_string(), "m-edited".to_string()),
                ("default/deleted-n1".to_string(), "m-deleted".to_string()),
                ("default/gone-n1".to_string(), "m-gone".to_string())
            ]
        );
        assert_eq!(
            p.post_status,
            vec!["default/moved-n1"],
            "only a changed status"
        );
    }
}
