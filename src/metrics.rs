//! Prometheus metrics served at `GET /metrics` (text format, via `prometheus-client`).
//!
//! Names follow kubelet's where kubelet has the metric (`kubelet_running_pods`,
//! `kubelet_runtime_operations_total`, ...); nodelet's own metrics are prefixed `nodelet_`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label set with one `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason (e.g. `DecodeError`).
    pub reason: String,
}

/// Label set with one `operation_type` label (a CRI method name, kubelet's spelling).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    /// The operation, e.g. `run_podsandbox`, `create_container`.
    pub operation_type: String,
}

/// All metrics of the agent.
pub struct Metrics {
    registry: Registry,
    /// Manifests refused, by reason (`nodelet_static_pod_manifest_errors_total`).
    pub manifest_errors: Family<ReasonLabel, Counter>,
    /// Pods with a running sandbox (`kubelet_running_pods`).
    pub running_pods: Gauge,
    /// CRI calls, by operation (`kubelet_runtime_operations_total`).
    pub runtime_operations: Family<OperationLabel, Counter>,
    /// Failed CRI calls, by operation (`kubelet_runtime_operations_errors_total`).
    pub runtime_errors: Family<OperationLabel, Counter>,
    /// Pods started (`kubelet_started_pods_total`).
    pub started_pods: Counter,
    /// Containers started (`kubelet_started_containers_total`).
    pub started_containers: Counter,
    /// PLEG events dropped because the channel was full (`kubelet_pleg_discard_events`).
    pub pleg_discard_events: Counter,
    /// Duration of a PLEG relist, seconds (`kubelet_pleg_relist_duration_seconds`).
    pub pleg_relist_duration: Histogram,
    /// Interval between relists, seconds (`kubelet_pleg_relist_interval_seconds`).
    pub pleg_relist_interval: Histogram,
    /// The agent's oom_score_adj in force (`nodelet_process_oom_score_adj`).
    pub own_oom_score_adj: Gauge,
    /// The agent's configured oomScoreAdj (`nodelet_process_oom_score_adj_wanted`); differs from
    /// the one in force where the kernel refused it.
    pub own_oom_score_adj_wanted: Gauge,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let manifest_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "nodelet_static_pod_manifest_errors",
            "Static pod manifests refused, by reason",
            manifest_errors.clone(),
        );
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let runtime_operations = Family::<OperationLabel, Counter>::default();
        registry.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type",
            runtime_operations.clone(),
        );
        let runtime_errors = Family::<OperationLabel, Counter>::default();
        registry.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            runtime_errors.clone(),
        );
        let started_pods = Counter::default();
        registry.register(
            "kubelet_started_pods",
            "Cumulative number of pods started",
            started_pods.clone(),
        );
        let started_containers = Counter::default();
        registry.register(
            "kubelet_started_containers",
            "Cumulative number of containers started",
            started_containers.clone(),
        );
        let own_oom_score_adj = Gauge::default();
        registry.register(
            "nodelet_process_oom_score_adj",
            "oom_score_adj of the agent process in force",
            own_oom_score_adj.clone(),
        );
        let own_oom_score_adj_wanted = Gauge::default();
        registry.register(
            "nodelet_process_oom_score_adj_wanted",
            "oom_score_adj configured for the agent process (oomScoreAdj)",
            own_oom_score_adj_wanted.clone(),
        );
        let pleg_discard_events = Counter::default();
        registry.register(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG",
            pleg_discard_events.clone(),
        );
        let pleg_relist_duration = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            pleg_relist_duration.clone(),
        );
        let pleg_relist_interval = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            pleg_relist_interval.clone(),
        );
        Arc::new(Self {
            registry,
            pleg_discard_events,
            pleg_relist_duration,
            pleg_relist_interval,
            manifest_errors,
            running_pods,
            runtime_operations,
            runtime_errors,
            started_pods,
            started_containers,
            own_oom_score_adj,
            own_oom_score_adj_wanted,
        })
    }

    /// Counts one refused manifest.
    pub fn manifest_error(&self, reason: &str) {
        self.manifest_errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one CRI call, and its failure when `ok` is false.
    pub fn runtime_operation(&self, operation: &str, ok: bool) {
        let label = OperationLabel {
            operation_type: operation.to_owned(),
        };
        self.runtime_operations.get_or_create(&label).inc();
        if !ok {
            self.runtime_errors.get_or_create(&label).inc();
        }
    }

    /// The metrics in Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_errors_are_exposed_by_reason() {
        let m = Metrics::new();
        m.manifest_error("DecodeError");
        m.manifest_error("DecodeError");
        m.runtime_operation("run_podsandbox", false);
        let text = m.encode();
        assert!(
            text.contains("nodelet_static_pod_manifest_errors_total{reason=\"DecodeError\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1"
            ),
            "{text}"
        );
    }
}
