//! The node Lease (kubelet's `pkg/kubelet/nodelease` controller): `kube-node-lease/<node>`,
//! holder the node, `leaseDurationSeconds` [`LEASE_DURATION_SECONDS`], renewed every
//! [`RENEW_INTERVAL`] (a quarter of the duration, as kubelet's `renewIntervalFraction`), owned by
//! the Node once it is registered (so that deleting the Node deletes its Lease). The control
//! plane takes a Lease not renewed for its duration as a node gone silent.
//!
//! A renewal updates the Lease read or written last (optimistic concurrency on its
//! resourceVersion); a conflict or a missing Lease makes the next one read or create it.
//! Failures are retried at the next interval and logged once until one succeeds.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, PostParams};
use tracing::{info, warn};

/// kubelet's `nodeLeaseDurationSeconds` default.
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the Lease is renewed: a quarter of its duration.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// The namespace of node Leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// The Lease of node `name` renewed at `now`, owned by the Node `node_uid` when known.
pub fn lease(name: &str, node_uid: Option<&str>, now: SystemTime) -> Lease {
    let mut l = Lease::default();
    l.metadata.name = Some(name.into());
    l.metadata.namespace = Some(NAMESPACE.into());
    l.metadata.owner_references = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }]
    });
    l.spec = Some(LeaseSpec {
        holder_identity: Some(name.into()),
        lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
        renew_time: Some(micro_time(now)),
        ..Default::default()
    });
    l
}

/// A MicroTime for `now`.
pub fn micro_time(now: SystemTime) -> MicroTime {
    let d = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    MicroTime(
        k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, (d.subsec_micros() * 1000) as i32)
            .unwrap_or_default(),
    )
}

/// Renews the Lease of node `name` every [`RENEW_INTERVAL`] until the task is dropped, owned by
/// the Node whose UID `registered` carries once it is known.
pub async fn run(
    client: kube::Client,
    name: String,
    registered: tokio::sync::watch::Receiver<Option<String>>,
) {
    let leases: Api<Lease> = Api::namespaced(client, NAMESPACE);
    let mut current: Option<Lease> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(RENEW_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let uid = registered.borrow().clone();
        let outcome = renew(&leases, &name, uid.as_deref(), current.take()).await;
        match outcome {
            Ok(l) => {
                if failing {
                    info!(node = %name, "node lease renewed again");
                    failing = false;
                }
                current = Some(l);
            }
            Err(e) => {
                if !failing {
                    warn!(node = %name, error = %e, "failed to renew node lease; will retry");
                    failing = true;
                }
            }
        }
    }
}

async fn renew(
    leases: &Api<Lease>,
    name: &str,
    node_uid: Option<&str>,
    current: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let fresh = lease(name, node_uid, crate::clock::wall_now());
    let base = match current {
        Some(l) => Some(l),
        None => match leases.get_opt(name).await? {
            Some(l) => Some(l),
            None => return leases.create(&PostParams::default(), &fresh).await,
        },
    };
    let mut l = base.unwrap_or_default();
    l.spec = fresh.spec;
    if node_uid.is_some() {
        l.metadata.owner_references = fresh.metadata.owner_references;
    }
    leases.replace(name, &PostParams::default(), &l).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_is_kubelets() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        let l = lease("n1", Some("uid-1"), at);
        assert_eq!(l.metadata.namespace.as_deref(), Some("kube-node-lease"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        let json = serde_json::to_value(spec.renew_time.unwrap()).unwrap();
        assert_eq!(json, "2023-11-14T22:13:20.123456Z");
        let owner = &l.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
        assert!(lease("n1", None, at).metadata.owner_references.is_none());
        assert_eq!(RENEW_INTERVAL.as_secs() * 4, LEASE_DURATION_SECONDS as u64);
    }
}
