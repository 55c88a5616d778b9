//! API pods' status (kubelet's `status_manager.go` `syncPod`): the status the agent holds for
//! each pod from the API source is patched to the pod's status subresource when it changed
//! since the last patch that succeeded, every [`STATUS_SYNC_PERIOD`], a few at a time
//! ([`STATUS_PATCH_CONCURRENCY`]). A failed patch is retried at the next round; while the
//! apiserver cannot be reached, rounds back off up to [`MAX_STATUS_BACKOFF`] (nothing is lost:
//! each pod's latest status is sent when it returns). Static pods' status goes to their mirror
//! pods instead ([`super::mirror_pods`]).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};
use tracing::{info, warn};

use crate::pod::is_api_pod;

/// How often statuses are compared and posted.
pub const STATUS_SYNC_PERIOD: Duration = Duration::from_secs(1);

/// The pods whose status must be posted: from the API, with a status other than the one
/// `posted` last. Forgets, in `posted`, the pods no longer held.
pub fn due(pods: &[Pod], posted: &mut HashMap<String, PodStatus>) -> Vec<Pod> {
    posted.retain(|uid, _| pods.iter().any(|p| crate::pod::pod_uid(p) == uid));
    pods.iter()
        .filter(|p| is_api_pod(p))
        .filter(|p| posted.get(crate::pod::pod_uid(p)) != p.status.as_ref())
        .cloned()
        .collect()
}

/// Longest wait between rounds while the apiserver fails, so that statuses catch up within
/// this long of its return (kubelet's status manager retries on its 10 s sync period).
pub const MAX_STATUS_BACKOFF: Duration = Duration::from_secs(4);

/// Patches in flight at once in a round.
pub const STATUS_PATCH_CONCURRENCY: usize = 4;

/// The wait before the next round: [`STATUS_SYNC_PERIOD`] after a round that reached the
/// apiserver, else twice the last wait up to [`MAX_STATUS_BACKOFF`].
pub fn next_delay(last: Duration, unreachable: bool) -> Duration {
    if unreachable {
        (last * 2).min(MAX_STATUS_BACKOFF)
    } else {
        STATUS_SYNC_PERIOD
    }
}

/// What one patch came to.
enum Outcome {
    /// The apiserver took it, or the pod is gone from the API (404, or 409: the name now holds
    /// another pod): either way it is settled.
    Settled,
    /// The apiserver refused it (an API error other than 404): tried again next round.
    Refused(Box<kube::core::Status>),
    /// The apiserver could not be reached: the round stops and backs off.
    Unreachable(kube::Error),
}

async fn patch(client: kube::Client, pod: &Pod) -> Outcome {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, ns);
    // On the pod's UID, as kubelet's status manager patches: a pod deleted and created again
    // under the same name is not given the old one's status (the apiserver answers 409). A
    // strategic merge, as kubelet's: conditions merge by type, so those others set stay.
    let body = serde_json::json!({
        "metadata": { "uid": pod.metadata.uid },
        "status": pod.status,
    });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&body))
        .await
    {
        Ok(_) => Outcome::Settled,
        // Gone, or another pod of that name: nothing more to post for this one.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Outcome::Settled,
        Err(kube::Error::Api(e)) => Outcome::Refused(e),
        Err(e) => Outcome::Unreachable(e),
    }
}

/// Posts the API pods' statuses from `status` until the task is dropped. Only each pod's latest
/// status is held (the queue is bounded by the pods on the node); while the apiserver cannot be
/// reached, rounds back off ([`next_delay`]) and each stops at its first failure.
pub async fn run(client: kube::Client, status: crate::status::StatusManager) {
    use futures::StreamExt;
    let mut posted: HashMap<String, PodStatus> = HashMap::new();
    // Pods whose status the apiserver refused, by UID: reported once each.
    let mut refused: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut failing = false;
    let mut delay = STATUS_SYNC_PERIOD;
    loop {
        crate::clock::sleep(delay).await;
        let held = status.pods_where(is_api_pod);
        refused.retain(|uid| held.iter().any(|p| crate::pod::pod_uid(p) == uid));
        let pods = due(&held, &mut posted);
        let mut results = futures::stream::iter(pods)
            .map(|pod| {
                let client = client.clone();
                async move {
                    let outcome = patch(client, &pod).await;
                    (pod, outcome)
                }
            })
            .buffer_unordered(STATUS_PATCH_CONCURRENCY);
        let mut unreachable = None;
        while let Some((pod, outcome)) = results.next().await {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            match outcome {
                Outcome::Settled => {
                    refused.remove(crate::pod::pod_uid(&pod));
                    posted.insert(
                        crate::pod::pod_uid(&pod).to_owned(),
                        pod.status.clone().unwrap_or_default(),
                    );
                }
                Outcome::Refused(e) => {
                    if refused.insert(crate::pod::pod_uid(&pod).to_owned()) {
                        warn!(pod = %name, namespace = %ns, code = e.code, error = %e.message, "pod status refused by the apiserver; will retry");
                    }
                }
                Outcome::Unreachable(e) => {
                    unreachable = Some((name.to_owned(), ns.to_owned(), e));
                    break;
                }
            }
        }
        drop(results);
        match unreachable {
            Some((name, ns, e)) => {
                if !failing {
                    warn!(pod = %name, namespace = %ns, error = %e, "cannot post pod status; will retry with back-off");
                    failing = true;
                }
                delay = next_delay(delay, true);
            }
            None => {
                if failing {
                    info!("pod statuses posted again");
                    failing = false;
                }
                delay = next_delay(delay, false);
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
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_SOURCE_ANNOTATION.to_string(),
                source.to_string(),
            )]
            .into(),
        );
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

    #[test]
    fn rounds_back_off_while_the_apiserver_is_unreachable_and_not_beyond_the_cap() {
        let mut d = STATUS_SYNC_PERIOD;
        let mut waits = vec![];
        for _ in 0..5 {
            d = next_delay(d, true);
            waits.push(d.as_secs());
        }
        assert_eq!(waits, [2, 4, 4, 4, 4]);
        assert_eq!(
            next_delay(d, false),
            STATUS_SYNC_PERIOD,
            "back once it answers"
        );
    }
}
