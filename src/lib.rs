//! nodelet: a node agent modeled on the Kubernetes kubelet.
//!
//! The table of contents of the agent, in the order work flows through it:
//!
//! - [`config`]: the KubeletConfiguration file.
//! - [`source`]: pod sources (static manifest directory) → ADD/UPDATE/REMOVE; [`objects`]: the
//!   ConfigMaps and Secrets of that directory.
//! - [`syncloop`]: the sync loop that dispatches to pod workers; [`housekeeping`]: its clean-up
//!   passes; [`admission`]: pods refused before they run; [`active_deadline`]: pods stopped
//!   after `activeDeadlineSeconds`.
//! - [`podworkers`]: one task per pod; latest update wins, kills are never lost.
//! - [`kuberuntime`]: pod spec → CRI calls (sandbox, images, containers, labels, actions).
//! - [`cri`]: the CRI client; [`container`]: the runtime's view of pods and the pod cache.
//! - [`pleg`]: pod lifecycle events; [`prober`]: probe results; [`runtime_state`]: whether the
//!   runtime answers.
//! - [`status`]: pod phase, conditions and container states; [`gc`]: dead containers.
//! - [`volume`]: emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes and
//!   the containers' mounts.
//! - [`cm`] and [`qos`]: pod cgroups and QoS classes; [`resources`]: requests and limits of pods
//!   and containers.
//! - [`eviction`]: the eviction manager: signals, thresholds, kernel memory notifications,
//!   ranking, one pod per pass, node pressure conditions and admission.
//! - [`server`], [`metrics`], [`events`]: what operators see.
//! - [`plan`]: `nodelet plan`, what the agent would do with manifests.
//! - [`agent`]: wiring; [`node`]: node facts; [`clock`]: injected time; [`pod`]: pod identity;
//!   [`fieldpath`] (downward API values), [`hash`], [`quantity`], [`duration`] (Go-style
//!   durations of the configuration), [`yaml`] (bounded YAML decoding): shared helpers.
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// Test code may read the machine's clocks and sleep (clippy.toml refuses it elsewhere).
#![cfg_attr(
    test,
    allow(clippy::disallowed_methods, clippy::cast_possible_truncation)
)]

pub mod active_deadline;
pub mod admission;
pub mod agent;
pub mod clock;
pub mod cluster;
pub mod cm;
pub mod config;
pub mod container;
pub mod crash;
pub mod cri;
pub mod duration;
pub mod events;
pub mod eviction;
pub mod fieldpath;
pub mod gc;
pub mod hash;
pub mod housekeeping;
pub mod kuberuntime;
pub mod metrics;
pub mod node;
pub mod nodeshutdown;
pub mod objects;
pub mod plan;
pub mod pleg;
pub mod pod;
pub mod podworkers;
pub mod prober;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod runtime_state;
pub mod server;
pub mod source;
pub mod status;
pub mod syncloop;
#[cfg(test)]
pub mod testing;
pub mod volume;
pub mod yaml;
