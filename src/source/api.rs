//! The API pod source (kubelet's `pkg/kubelet/config/apiserver.go`): the pods bound to this node
//! (`spec.nodeName=<node>`), followed by a reflector (kube-rs `watcher`: list, then watch from
//! the resource version, re-list when the watch expires), merged with the file source through
//! the same [`PodConfig`](super::PodConfig) and admission.
//!
//! A pod is checked as a manifest is ([`super::validation::validate_pod`]); one nodelet refuses
//! is never run and gets status Failed, reason `UnsupportedPodSpec`, naming the field.
//!
//! Each pod gets annotation `kubernetes.io/config.source: api` and a `kubernetes.io/config.hash`
//! of its spec, labels and annotations, so that the merge sees an edit as an UPDATE. Mirror pods
//! (the API's view of static pods) are not pods to run and are left out.
//!
//! A pod marked for deletion (`deletionTimestamp`) is first sent again with its
//! `deletionGracePeriodSeconds` as its grace period, then left out of the set: the sync loop
//! stops it with that grace, and this source deletes the object (grace 0, on its UID) once
//! nothing of it runs (kubelet's final delete).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use tracing::{info, warn};

use super::mux::{SourceMsg, SourceSender};
use crate::pod::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION};

/// The source's name.
pub const SOURCE: &str = crate::pod::API_SOURCE;

/// The pod as the merge sees it: source and hash annotations added, a `kubernetes.io/config.seen`
/// it carries dropped (the merge stamps its own); for one being deleted, its deletion grace
/// period as its grace period.
pub fn prepare(mut pod: Pod) -> Pod {
    // nodelet's own record of when it first saw the pod; the API object's value is not taken.
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(crate::pod::CONFIG_SEEN_ANNOTATION);
    }
    if let Some(grace) = pod.metadata.deletion_grace_period_seconds {
        if let Some(spec) = pod.spec.as_mut() {
            spec.termination_grace_period_seconds = Some(grace);
        }
    }
    let hash = crate::hash::object_hash(&(
        &pod.spec,
        &pod.metadata.labels,
        &pod.metadata.annotations,
        &pod.metadata.deletion_timestamp,
    ));
    let a = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    a.insert(CONFIG_SOURCE_ANNOTATION.into(), SOURCE.into());
    a.insert(CONFIG_HASH_ANNOTATION.into(), hash);
    pod.status = None;
    pod
}

/// Whether `pod` is one for this agent to run from the API: not a mirror pod.
fn runnable(pod: &Pod) -> bool {
    !crate::pod::is_mirror_pod(pod)
}

/// First wait after a watch or list fails.
pub const WATCH_MIN_BACKOFF: Duration = Duration::from_millis(800);

/// Longest wait between attempts while the apiserver fails. client-go's reflector (and kube-rs'
/// default) go up to 30 s; nodelet stops at 8 s so that a pod created or deleted while the
/// apiserver was away is acted on within 8 s of its return, at the cost of one list request
/// per node every 8 s during an outage.
pub const WATCH_MAX_BACKOFF: Duration = Duration::from_secs(8);

/// The reflector's back-off: [`WATCH_MIN_BACKOFF`] doubling up to [`WATCH_MAX_BACKOFF`], each
/// wait shortened by up to a quarter at random so that nodes do not return in step; back to the
/// start once the watch delivers an event (kube-rs resets it then).
#[derive(Debug, Default)]
pub struct WatchBackoff {
    next: Option<Duration>,
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.next.unwrap_or(WATCH_MIN_BACKOFF);
        self.next = Some((wait * 2).min(WATCH_MAX_BACKOFF));
        let jitter = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(wait.as_nanos());
            h.finish() % 250
        };
        Some(wait.mul_f64(1.0 - jitter as f64 / 1000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = None;
    }
}

/// What tells the source that a pod being deleted is gone from the node: true while the agent
/// still holds a status for the UID or the runtime still has a sandbox of it.
pub type StillHere = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// How often pods being deleted are checked for their final delete.
pub const FINAL_DELETE_PERIOD: Duration = Duration::from_secs(1);

/// Follows the pods bound to `node_name` until the task is dropped, sending the API source's
/// pods to `config` (the mux) after the first complete list and after every change, and deleting from the
/// API (grace 0, on the UID) each pod marked for deletion once `still_here` says it is gone.
pub async fn run(
    client: kube::Client,
    node_name: String,
    config: SourceSender,
    still_here: StillHere,
    recorder: crate::events::Recorder,
) {
    let api: kube::Api<Pod> = kube::Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    // Backed off between failures: an unreachable apiserver is not hammered, nor the log
    // flooded, and the watch is back within WATCH_MAX_BACKOFF of its return.
    let mut stream = watcher(api, wc).backoff(WatchBackoff::default()).boxed();
    let mut store: BTreeMap<String, Pod> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, Pod>> = None;
    let mut listed = false;
    let mut failing = false;
    // Pods refused by nodelet's validation, already reported (by UID).
    let mut refused: std::collections::HashSet<String> = std::collections::HashSet::new();
    // Pods marked for deletion already handed to the sync loop: namespace, name, and whether
    // the final delete was sent (kept until the watch says the object is gone, so that its
    // last update is not taken for a new deletion).
    let mut deleting: BTreeMap<String, (String, String, bool)> = BTreeMap::new();
    let mut tick = tokio::time::interval(FINAL_DELETE_PERIOD);
    loop {
        let event = tokio::select! {
            e = stream.next() => match e {
                Some(e) => e,
                None => return,
            },
            _ = tick.tick() => {
                final_deletes(&client, &mut deleting, &still_here).await;
                continue;
            }
        };
        let changed = match event {
            Ok(watcher::Event::Init) => {
                initial = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(i) = initial.as_mut() {
                    i.insert(crate::pod::pod_uid(&p).to_owned(), p);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                store = initial.take().unwrap_or_default();
                if listed {
                    // The reflector lists again only when its resource version expired (410).
                    info!(
                        pods = store.len(),
                        "API pod source: re-listed (the watch's resource version expired)"
                    );
                }
                listed = true;
                true
            }
            Ok(watcher::Event::Apply(p)) => {
                store.insert(crate::pod::pod_uid(&p).to_owned(), p);
                true
            }
            Ok(watcher::Event::Delete(p)) => {
                store.remove(crate::pod::pod_uid(&p));
                true
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "API pod source: watch failed; the reflector retries");
                    failing = true;
                }
                false
            }
        };
        if !changed || !listed {
            continue;
        }
        if failing {
            info!("API pod source: watching again");
            failing = false;
        }
        deleting.retain(|uid, _| store.contains_key(uid));
        refused.retain(|uid| store.contains_key(uid));
        let mut pods: Vec<&Pod> = Vec::new();
        for p in store.values().filter(|p| runnable(p)) {
            match super::validation::validate_api_pod(p) {
                Ok(()) => pods.push(p),
                Err(e) => {
                    let uid = crate::pod::pod_uid(p).to_owned();
                    if p.metadata.deletion_timestamp.is_some() {
                        // Never run: nothing to stop before the final delete.
                        deleting.entry(uid.clone()).or_insert((
                            p.metadata.namespace.clone().unwrap_or_default(),
                            p.metadata.name.clone().unwrap_or_default(),
                            false,
                        ));
                    }
                    if refused.insert(uid) {
                        refuse(&client, &recorder, p, &e).await;
                    }
                }
            }
        }
        let newly_deleting: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_some()
                    && !deleting.contains_key(crate::pod::pod_uid(p))
            })
            .collect();
        let running: Vec<Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| Arc::new(prepare((*p).clone())))
            .collect();
        if !newly_deleting.is_empty() {
            // Once with the deletion grace (an UPDATE), then out (a REMOVE that stops the pod
            // with that grace).
            let mut with = running.clone();
            with.extend(
                newly_deleting
                    .iter()
                    .map(|p| Arc::new(prepare((*p).clone()))),
            );
            if !config.send(SourceMsg::Snapshot(with)).await {
                return;
            }
            for p in newly_deleting {
                info!(
                    pod = p.metadata.name.as_deref().unwrap_or(""),
                    namespace = p.metadata.namespace.as_deref().unwrap_or(""),
                    grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0),
                    "pod marked for deletion in the API; stopping it"
                );
                deleting.insert(
                    crate::pod::pod_uid(p).to_owned(),
                    (
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                        false,
                    ),
                );
            }
        }
        if !config.send(SourceMsg::Snapshot(running)).await {
            return;
        }
    }
}

/// A pod that nodelet's validation refuses (a field it does not implement and must not ignore:
/// a volume kind, a security setting): never run, reported once, and given status Failed with
/// reason `UnsupportedPodSpec` and the field in the message, with a Warning event of that
/// reason, as kubelet's `rejectPod` reports a pod it cannot admit.
async fn refuse(
    client: &kube::Client,
    recorder: &crate::events::Recorder,
    pod: &Pod,
    e: &super::validation::FieldError,
) {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let message = format!("{}: {}", e.field, e.describe());
    warn!(pod = %name, namespace = %ns, error = %message, "refusing a pod from the API");
    recorder.warning(
        crate::events::Involved::pod(pod),
        "UnsupportedPodSpec",
        message.clone(),
    );
    let status = serde_json::json!({ "status": {
        "phase": "Failed",
        "reason": "UnsupportedPodSpec",
        "message": format!("Pod was rejected: {message}"),
    }});
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    if let Err(err) = api
        .patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
    {
        warn!(pod = %name, namespace = %ns, error = %err, "cannot post the refused pod's status");
    }
}

/// Deletes (grace 0, on the UID) each pod of `deleting` that `still_here` says is gone.
async fn final_deletes(
    client: &kube::Client,
    deleting: &mut BTreeMap<String, (String, String, bool)>,
    still_here: &StillHere,
) {
    let done: Vec<String> = deleting
        .iter()
        .filter(|(uid, (_, _, sent))| !sent && !still_here(uid))
        .map(|(uid, _)| uid.clone())
        .collect();
    for uid in done {
        let Some((ns, name, _)) = deleting.get(&uid).cloned() else {
            continue;
        };
        let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &ns);
        let dp = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {
                info!(pod = %name, namespace = %ns, "pod deleted from the API");
                deleting.insert(uid, (ns, name, true));
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                deleting.insert(uid, (ns, name, true));
            }
            Err(e) => {
                warn!(pod = %name, error = %e, "cannot delete the pod from the API; will retry")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn an_api_pods_config_seen_is_not_taken() {
        let mut p = Pod::default();
        p.metadata.annotations = Some(
            [
                (
                    crate::pod::CONFIG_SEEN_ANNOTATION.to_string(),
                    "2000-01-01T00:00:00Z".to_string(),
                ),
                ("keep".to_string(), "yes".to_string()),
            ]
            .into(),
        );
        let ann = prepare(p).metadata.annotations.unwrap();
        assert!(!ann.contains_key(crate::pod::CONFIG_SEEN_ANNOTATION));
        assert_eq!(ann["keep"], "yes");
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], SOURCE);
    }

    #[test]
    fn the_watch_backs_off_doubling_to_its_cap_with_jitter_and_resets() {
        let mut b = WatchBackoff::default();
        let nominal = [0.8, 1.6, 3.2, 6.4, 8.0, 8.0];
        for want in nominal {
            let got = b.next().unwrap().as_secs_f64();
            assert!(
                got <= want && got >= want * 0.75,
                "{got} s for a nominal {want} s"
            );
        }
        b.reset();
        assert!(b.next().unwrap() <= WATCH_MIN_BACKOFF);
    }
}
