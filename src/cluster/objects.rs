//! ConfigMaps and Secrets of API pods, read from the apiserver and watched (kubelet's
//! `configmap.Manager` and `secret.Manager` with `configMapAndSecretChangeDetectionStrategy:
//! Watch`, `pkg/kubelet/util/manager/watch_based_manager.go`).
//!
//! Every object an API pod references ([`crate::objects::pod_references`]) gets its own watch:
//! a list and watch of its namespace with field selector `metadata.name=<name>`, the one form
//! the apiserver's Node authorizer lets a node read (only objects its pods reference). A change
//! rewrites the object in [`ApiObjects`] and re-syncs the API pods that reference it (volumes
//! rewritten, containers held for a missing object started); an object no API pod references
//! any more has its watch stopped and its data dropped.
//!
//! Static pods keep reading the local documents of `staticPodPath` ([`crate::objects`]); an API
//! pod sees only the apiserver's objects, kept in [`ApiObjects`]. The first sync of a pod waits
//! up to [`crate::objects::SYNC_WAIT`] for its objects' watches to have listed (as kubelet's
//! `objectCache.Get`), so a pod whose ConfigMap exists does not fail its first start for want of
//! it.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::{watcher, WatchStreamExt};
use tracing::{debug, warn};

use crate::objects::{config_map_data, secret_data, ApiObjects, Data, ObjectKind, ObjectRef};
use crate::source::mux::{SourceMsg, SourceSender};

/// How often the referenced objects are compared with the watches, besides when a sync asks.
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(1);

/// A watch event with the object reduced to its data.
enum Seen {
    Init,
    InitApply(Data),
    InitDone,
    Apply(Data),
    Delete,
}

fn seen<K>(e: watcher::Event<K>, data: fn(&K) -> Data) -> Seen {
    match e {
        watcher::Event::Init => Seen::Init,
        watcher::Event::InitApply(k) => Seen::InitApply(data(&k)),
        watcher::Event::InitDone => Seen::InitDone,
        watcher::Event::Apply(k) => Seen::Apply(data(&k)),
        watcher::Event::Delete(_) => Seen::Delete,
    }
}

/// The watch of kind `K` in `namespace` as [`Seen`] events, backed off as the pod watch is.
fn data_stream<K>(
    client: kube::Client,
    namespace: &str,
    wc: watcher::Config,
    data: fn(&K) -> Data,
) -> futures::stream::BoxStream<'static, Result<Seen, watcher::Error>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let api: kube::Api<K> = kube::Api::namespaced(client, namespace);
    watcher(api, wc)
        .backoff(crate::source::api::WatchBackoff::default())
        .map(move |e| e.map(|e| seen(e, data)))
        .boxed()
}

/// Follows one object until aborted, sending what its watch says on `tx`.
async fn watch_one(
    client: kube::Client,
    r: ObjectRef,
    tx: tokio::sync::mpsc::Sender<(ObjectRef, Option<Data>)>,
) {
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", r.name));
    let mut stream = match r.kind {
        ObjectKind::ConfigMap => data_stream(client, &r.namespace, wc, config_map_data),
        ObjectKind::Secret => data_stream(client, &r.namespace, wc, secret_data),
    };
    let mut listed_one = false;
    let mut failing = false;
    while let Some(event) = stream.next().await {
        let data = match event {
            Ok(Seen::Init) => {
                listed_one = false;
                continue;
            }
            Ok(Seen::InitApply(d)) => {
                listed_one = true;
                Some(d)
            }
            Ok(Seen::InitDone) if !listed_one => None,
            Ok(Seen::InitDone) => continue,
            Ok(Seen::Apply(d)) => Some(d),
            Ok(Seen::Delete) => None,
            Err(e) => {
                if !failing {
                    warn!(kind = r.kind.as_str(), namespace = %r.namespace, name = %r.name, error = %e, "cannot watch object; retrying");
                    failing = true;
                }
                continue;
            }
        };
        failing = false;
        if tx.send((r.clone(), data)).await.is_err() {
            return;
        }
    }
}

/// Bound of the channel from the object watches to this task. A watch that finds it full waits
/// (an `await`, never a blocked thread); nothing is dropped.
pub const CHANGES_CAPACITY: usize = 256;

/// Keeps one watch per object the API source's pods reference (`references`, published by the
/// pod configuration's merger after each snapshot of the API source), writing to `objects` and
/// having the pods that reference an object that changed synced (through `config`, the API
/// source's end of the mux), until the task is dropped.
pub async fn run(
    client: kube::Client,
    config: SourceSender,
    mut references: tokio::sync::watch::Receiver<BTreeSet<ObjectRef>>,
    objects: ApiObjects,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(CHANGES_CAPACITY);
    let mut watches: HashMap<ObjectRef, tokio::task::AbortHandle> = HashMap::new();
    let mut tick = tokio::time::interval(RECONCILE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = objects.wanted() => {}
            r = references.changed() => if r.is_err() { return },
            Some((r, data)) = rx.recv() => {
                if watches.contains_key(&r) && objects.observe(&r, data) {
                    debug!(kind = r.kind.as_str(), namespace = %r.namespace, name = %r.name, "object changed; re-syncing the pods that use it");
                    if !config.send(SourceMsg::ObjectsChanged(BTreeSet::from([r]))).await {
                        return;
                    }
                }
                continue;
            }
        }
        let wanted = references.borrow_and_update().clone();
        watches.retain(|r, handle| {
            let keep = wanted.contains(r);
            if !keep {
                handle.abort();
                objects.forget(r);
            }
            keep
        });
        for r in wanted {
            if let std::collections::hash_map::Entry::Vacant(slot) = watches.entry(r) {
                let task = tokio::spawn(watch_one(client.clone(), slot.key().clone(), tx.clone()));
                slot.insert(task.abort_handle());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::SYNC_WAIT;

    use crate::testing::pods::config_map_ref as cm;

    #[test]
    fn an_observed_object_is_stored_and_a_change_is_reported_once() {
        let o = ApiObjects::default();
        let data = Data::from([("k".to_string(), b"v".to_vec())]);
        assert!(!o.is_synced(&cm("a")));
        assert!(o.observe(&cm("a"), Some(data.clone())), "new");
        assert!(!o.observe(&cm("a"), Some(data.clone())), "the same data");
        assert!(o.is_synced(&cm("a")));
        assert_eq!(
            o.store()
                .get(ObjectKind::ConfigMap, "default", "a")
                .as_deref(),
            Some(&data)
        );
        assert!(!o.observe(&cm("missing"), None), "absent, and was");
        assert!(o.is_synced(&cm("missing")), "its absence is known");
        assert!(o.observe(&cm("a"), None), "deleted");
        o.forget(&cm("missing"));
        assert!(!o.is_synced(&cm("missing")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_waits_for_its_objects_at_most_the_sync_wait() {
        let o = ApiObjects::default();
        let refs = BTreeSet::from([cm("a")]);
        let t0 = tokio::time::Instant::now();
        assert!(!o.wait_synced(&refs).await, "never listed");
        let waited = t0.elapsed();
        assert!(
            waited >= SYNC_WAIT && waited < SYNC_WAIT + Duration::from_millis(50),
            "{waited:?}"
        );
        let lister = o.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            lister.observe(&cm("a"), None);
        });
        let t0 = tokio::time::Instant::now();
        assert!(o.wait_synced(&refs).await);
        assert!(
            t0.elapsed() < Duration::from_millis(400),
            "{:?}",
            t0.elapsed()
        );
    }
}
