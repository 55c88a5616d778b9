//! API pods' status (kubelet's `status_manager.go` `syncPod`): the status the agent holds for
//! each pod from the API source is patched to the pod's status subresource when it changed
//! since the last patch that succeeded, every [`STATUS_SYNC_PERIOD`]. A failed patch is retried
//! at the next round (the apiserver down: nothing is lost, the latest status is sent when it
//! returns). Static pods' status goes to their mirror pods instead
//! ([`super::mirror_pods`]).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};
use tracing::{info, warn};

use crate::pod::CONFIG_SOURCE_ANNOTATION;

/// How often statuses are compared and posted.
pub const STATUS_SYNC_PERIOD: Duration = Duration::from_secs(1);

/// Whether `pod` came from the API source.
pub fn from_api(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == crate::source::api::SOURCE)
}

/// The pods whose status must be posted: from the API, with a status other than the one
/// `posted` last. Forgets, in `posted`, the pods no longer held.
pub fn due(pods: &[Pod], posted: &mut HashMap<String, PodStatus>) -> Vec<Pod> {
    posted.retain(|uid, _| pods.iter().any(|p| crate::pod::pod_uid(p) == uid));
    pods.iter()
        .filter(|p| from_api(p))
        .filter(|p| posted.get(crate::pod::pod_uid(p)) != p.status.as_ref())
        .cloned()
        .collect()
}

/// Posts the API pods' statuses from `status` until the task is dropped.
pub async fn run(client: kube::Client, status: crate::status::StatusManager) {
    let mut posted: HashMap<String, PodStatus> = HashMap::new();
    let mut failing = false;
    let mut tick = tokio::time::interval(STATUS_SYNC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for pod in due(&status.pods_where(from_api), &mut posted) {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let patch = serde_json::json!({ "status": pod.status });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if failing {
                        info!("pod statuses posted again");
                        failing = false;
                    }
                    posted.insert(
                        crate::pod::pod_uid(&pod).to_owned(),
                        pod.status.clone().unwrap_or_default(),
                    );
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    if !failing {
                        warn!(pod = %name, namespace = %ns, error = %e, "cannot post pod status; will retry");
                        failing = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, source: &str, phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.annotations =
            Some([(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string())].into());
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn only_changed_statuses_of_api_pods_are_posted() {
        let mut posted = HashMap::new();
        let pods = vec![pod("a", "api", "Pending"), pod("s", "file", "Running")];
        let d = due(&pods, &mut posted);
        assert_eq!(d.len(), 1, "the static pod's goes to its mirror");
        posted.insert("a".to_string(), d[0].status.clone().unwrap());
        assert!(due(&pods, &mut posted).is_empty(), "unchanged");
        let pods = vec![pod("a", "api", "Running")];
        assert_eq!(due(&pods, &mut posted).len(), 1, "changed");
        assert!(due(&[], &mut posted).is_empty());
        assert!(posted.is_empty(), "a pod gone is forgotten");
    }
}
