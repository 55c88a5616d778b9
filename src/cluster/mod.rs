//! Cluster mode (kubelet run with `--kubeconfig`): nodelet as a node of a Kubernetes control
//! plane. Without a kubeconfig nodelet runs standalone, static pods only.
//!
//! What it does: the API client ([`client`]), node registration and status ([`node_status`],
//! kubelet's `kubelet_node_status.go` and `nodestatus` setters), the node Lease ([`node_lease`],
//! kubelet's `nodelease` controller), mirror pods for static pods with their status
//! ([`mirror_pods`]), the API pod source ([`crate::source::api`]) with its pods' status
//! ([`pod_status`]; a pod refused at admission is posted Failed with kubelet's reason) and final
//! delete, events posted with kubelet's correlation and rate limits ([`events`]), and the API
//! pods' ConfigMaps and Secrets read from the apiserver and watched ([`objects`]). Each runs as
//! its own task on the agent's runtime; an unreachable apiserver delays them and nothing else:
//! static pods run whether or not the node has registered. With the apiserver away, pods run
//! on, each pod's latest status waits and is posted within [`pod_status::MAX_STATUS_BACKOFF`] of
//! its return, and the pod watch resumes or lists again within
//! [`crate::source::api::WATCH_MAX_BACKOFF`].
//!
//! The control plane the tests use is kube-apiserver v1.20 (scripts/env/cluster.sh). Fields a
//! newer one adds that nodelet writes (`status.hostIPs`, 1.28) are dropped by 1.20; the README's
//! cluster section lists them.

pub mod events;
pub mod mirror_pods;
pub mod node_lease;
pub mod node_status;
pub mod objects;
pub mod pod_status;

use std::path::Path;

/// A client that cannot be built from the kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file cannot be read or is not a kubeconfig.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// A client for the apiserver named by the kubeconfig at `path` (its current context; client
/// certificate or bearer token), as kubelet's `--kubeconfig`.
///
/// Errors: [`ClusterError::Kubeconfig`] when the file cannot be read or parsed, names no
/// current context, or its credentials cannot be loaded.
pub async fn client(path: &Path) -> Result<kube::Client, ClusterError> {
    let err = |message: String| ClusterError::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// Starts the node's tasks on `rt`: registration and node status, the Lease, mirror pods for the
/// static pods and the API pods' status (both read from `status`), and the events of
/// `recorder`. The API pod source is started with the other pod sources
/// ([`crate::source::api::run`]).
pub fn spawn(
    rt: &tokio::runtime::Handle,
    client: kube::Client,
    facts: node_status::NodeFacts,
    inputs: node_status::StatusInputs,
    status: crate::status::StatusManager,
    recorder: crate::events::Recorder,
) {
    let name = facts.name.clone();
    let (registered_tx, registered_rx) = tokio::sync::watch::channel(None);
    rt.spawn(node_status::run(
        client.clone(),
        facts,
        inputs,
        registered_tx,
    ));
    rt.spawn(node_lease::run(
        client.clone(),
        name.clone(),
        registered_rx.clone(),
    ));
    rt.spawn(events::run(client.clone(), name.clone(), recorder));
    rt.spawn(mirror_pods::run(
        client.clone(),
        name,
        status.clone(),
        registered_rx,
    ));
    rt.spawn(pod_status::run(client, status));
}
