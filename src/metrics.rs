//! Prometheus metrics served at `GET /metrics` (OpenMetrics text, via `prometheus-client`).
//!
//! Names follow kubelet's where kubelet has the metric (`kubelet_running_pods`,
//! `kubelet_runtime_operations_total`, ...); nodelet's own metrics are prefixed `nodelet_`.

use std::sync::Arc;

use prometheus_client::registry::Metric;

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

/// Label set with one `container_state` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabel {
    /// `running`, `exited`, `created` or `unknown`.
    pub container_state: String,
}

/// Label set with one `eviction_signal` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    /// e.g. `memory.available`.
    pub eviction_signal: String,
}

/// Label set with one `channel` label: a bounded channel between threads (see the crate's
/// channel table).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChannelLabel {
    /// `probe_results`, `eviction_wake` or `manifest_dir_events`.
    pub channel: String,
}

/// The bounded channels whose producers count finding them full
/// (`nodelet_channel_full_total{channel}`).
pub const FULL_CHANNELS: [&str; 3] = ["probe_results", "eviction_wake", "manifest_dir_events"];

/// Label set with one `condition` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabel {
    /// `MemoryPressure`, `DiskPressure` or `PIDPressure`.
    pub condition: String,
}

/// Labels of `prober_probe_total` (kubelet's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabel {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: String,
    /// `successful` or `failed`.
    pub result: String,
    /// Container name.
    pub container: String,
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
}

/// Labels of `prober_probe_duration_seconds` (kubelet's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeDurationLabel {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: String,
    /// Container name.
    pub container: String,
    /// Pod name.
    pub pod: String,
    /// Pod namespace.
    pub namespace: String,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 16)
}

/// All metrics of the agent.
pub struct Metrics {
    registry: Registry,
    /// Probe metrics, served apart on `/metrics/probes` as kubelet serves them.
    probe_registry: Registry,
    /// Probes run, by kind, result, container and pod (`prober_probe_total`).
    pub probe_total: Family<ProbeLabel, Counter>,
    /// Probe durations, seconds (`prober_probe_duration_seconds`).
    pub probe_duration: Family<ProbeDurationLabel, Histogram>,
    /// How late each probe tick ran after it was due (or after the previous probe ended, when
    /// that probe overran its period), seconds (`nodelet_prober_schedule_delay_seconds`): the
    /// probe workers' scheduling jitter.
    pub probe_schedule_delay: Histogram,
    /// Manifests refused, by reason (`nodelet_static_pod_manifest_errors_total`).
    pub manifest_errors: Family<ReasonLabel, Counter>,
    /// Pods refused at admission, by reason (`kubelet_admission_rejections_total`).
    pub admission_rejections: Family<ReasonLabel, Counter>,
    /// Images removed by image garbage collection, by reason: `space` (above
    /// `imageGCHighThresholdPercent`, or disk pressure) or `age` (`imageMaximumGCAge`)
    /// (`kubelet_image_garbage_collected_total`, kubelet ≥ 1.30).
    pub images_garbage_collected: Family<ReasonLabel, Counter>,
    /// Dead containers and sandboxes removed by container garbage collection, by reason:
    /// `policy` (beyond one dead instance per container), `deleted-pod`, `disk-pressure`
    /// (`nodelet_containers_garbage_collected_total`).
    pub containers_garbage_collected: Family<ReasonLabel, Counter>,
    /// Pods with a running sandbox (`kubelet_running_pods`).
    pub running_pods: Gauge,
    /// 1 while the container runtime answers, 0 while it is down
    /// (`nodelet_container_runtime_up`).
    pub runtime_up: Gauge,
    /// Containers by state (`kubelet_running_containers{container_state}`).
    pub running_containers: Family<ContainerStateLabel, Gauge>,
    /// CRI calls, by operation (`kubelet_runtime_operations_total`).
    pub runtime_operations: Family<OperationLabel, Counter>,
    /// Failed CRI calls, by operation (`kubelet_runtime_operations_errors_total`).
    pub runtime_errors: Family<OperationLabel, Counter>,
    /// CRI call durations, seconds (`kubelet_runtime_operations_duration_seconds`).
    pub runtime_duration: Family<OperationLabel, Histogram>,
    /// Pods started (`kubelet_started_pods_total`).
    pub started_pods: Counter,
    /// Containers started (`kubelet_started_containers_total`).
    pub started_containers: Counter,
    /// HTTPS lifecycle hooks sent again over HTTP with success
    /// (`kubelet_lifecycle_handler_http_fallbacks_total`).
    pub lifecycle_http_fallbacks: Counter,
    /// Pod first seen → all containers running, seconds (`kubelet_pod_start_duration_seconds`).
    pub pod_start_duration: Histogram,
    /// Pod worker sync/kill durations, seconds (`kubelet_pod_worker_duration_seconds`).
    pub pod_worker_duration: Family<OperationLabel, Histogram>,
    /// Housekeeping pass durations, seconds (`kubelet_housekeeping_duration_seconds`).
    pub housekeeping_duration: Histogram,
    /// Orphaned pod cgroups that could not be removed yet (`nodelet_orphaned_pod_cgroups`).
    pub orphaned_pod_cgroups: Gauge,
    /// Cgroup manager operation durations, seconds (`kubelet_cgroup_manager_duration_seconds`).
    pub cgroup_manager_duration: Family<OperationLabel, Histogram>,
    /// Pods evicted, by signal (`kubelet_evictions`).
    pub evictions: Family<SignalLabel, Counter>,
    /// Node pressure conditions, 1 when true (`nodelet_node_condition`).
    pub node_condition: Family<ConditionLabel, Gauge>,
    /// From a kernel memory threshold notification to the eviction kill issued, seconds
    /// (`nodelet_eviction_reaction_seconds`).
    pub eviction_reaction: Histogram,
    /// PLEG events dropped because the channel was full (`kubelet_pleg_discard_events`).
    pub pleg_discard_events: Counter,
    /// Times a bounded channel between threads was found full, by channel
    /// (`nodelet_channel_full_total`); each producer's documentation says what it does then and
    /// why nothing is lost.
    pub channel_full: Family<ChannelLabel, Counter>,
    /// Panics caught in pod workers' syncs and kills (`nodelet_pod_worker_panics_total`); see
    /// [`crate::podworkers`].
    pub pod_worker_panics: Counter,
    /// Duration of a PLEG relist, seconds (`kubelet_pleg_relist_duration_seconds`).
    pub pleg_relist_duration: Histogram,
    /// Interval between relists, seconds (`kubelet_pleg_relist_interval_seconds`).
    pub pleg_relist_interval: Histogram,
    /// The agent's oom_score_adj in force (`nodelet_process_oom_score_adj`).
    pub own_oom_score_adj: Gauge,
    /// The agent's configured oomScoreAdj (`nodelet_process_oom_score_adj_wanted`); differs from
    /// the one in force where the kernel refused it.
    pub own_oom_score_adj_wanted: Gauge,
    /// Resident memory of the agent, bytes (`process_resident_memory_bytes`).
    pub process_rss: Gauge,
    /// CPU time of the agent, seconds (`process_cpu_seconds_total`).
    pub process_cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Open file descriptors of the agent (`process_open_fds`).
    pub process_open_fds: Gauge,
}

fn reg<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, m: M) -> M {
    registry.register(name, help, m.clone());
    m
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut r = Registry::default();
        let hist = || Histogram::new(latency_buckets());
        let mut probes = Registry::default();
        let probe_total = reg(
            &mut probes,
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            Family::default(),
        );
        let probe_duration = reg(
            &mut probes,
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response",
            Family::<ProbeDurationLabel, Histogram>::new_with_constructor(|| {
                Histogram::new(latency_buckets())
            }),
        );
        let probe_schedule_delay = reg(
            &mut probes,
            "nodelet_prober_schedule_delay_seconds",
            "How late a probe started after it was due",
            // Fine around the 20 ms target of issue 11, so p99 can be read against it.
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175,
                0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        );
        let m = Self {
            probe_registry: probes,
            probe_schedule_delay,
            probe_total,
            probe_duration,
            manifest_errors: reg(&mut r, "nodelet_static_pod_manifest_errors", "Static pod manifests refused, by reason", Family::default()),
            admission_rejections: reg(&mut r, "kubelet_admission_rejections", "Pods refused at admission, by reason", Family::default()),
            images_garbage_collected: reg(&mut r, "kubelet_image_garbage_collected", "Images garbage collected by the image garbage collection manager, by reason", Family::default()),
            containers_garbage_collected: reg(&mut r, "nodelet_containers_garbage_collected", "Dead containers and sandboxes removed by container garbage collection, by reason", Family::default()),
            running_pods: reg(&mut r, "kubelet_running_pods", "Number of pods that have a running pod sandbox", Gauge::default()),
            runtime_up: reg(&mut r, "nodelet_container_runtime_up", "1 while the container runtime answers, 0 while it is down", Gauge::default()),
            running_containers: reg(&mut r, "kubelet_running_containers", "Number of containers currently running", Family::default()),
            runtime_operations: reg(&mut r, "kubelet_runtime_operations", "Cumulative number of runtime operations by operation type", Family::default()),
            runtime_errors: reg(&mut r, "kubelet_runtime_operations_errors", "Cumulative number of runtime operation errors by operation type", Family::default()),
            runtime_duration: reg(
                &mut r,
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations by operation type",
                Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            ),
            started_pods: reg(&mut r, "kubelet_started_pods", "Cumulative number of pods started", Counter::default()),
            started_containers: reg(&mut r, "kubelet_started_containers", "Cumulative number of containers started", Counter::default()),
            lifecycle_http_fallbacks: reg(&mut r, "kubelet_lifecycle_handler_http_fallbacks", "The number of times lifecycle handlers successfully fell back to http from https.", Counter::default()),
            pod_start_duration: reg(
                &mut r,
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from the agent first seeing a pod to all its containers running",
                Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            ),
            pod_worker_duration: reg(
                &mut r,
                "kubelet_pod_worker_duration_seconds",
                "Duration in seconds to sync a single pod, by operation type",
                Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            ),
            orphaned_pod_cgroups: reg(
                &mut r,
                "nodelet_orphaned_pod_cgroups",
                "Orphaned pod cgroups that still hold processes and could not be removed yet",
                Gauge::default(),
            ),
            housekeeping_duration: reg(
                &mut r,
                "kubelet_housekeeping_duration_seconds",
                "Duration in seconds of housekeeping passes",
                Histogram::new(latency_buckets()),
            ),
            cgroup_manager_duration: reg(
                &mut r,
                "kubelet_cgroup_manager_duration_seconds",
                "Duration in seconds for cgroup manager operations, by operation type",
                Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            ),
            evictions: reg(&mut r, "kubelet_evictions", "Cumulative number of pod evictions by eviction signal", Family::default()),
            node_condition: reg(&mut r, "nodelet_node_condition", "Node pressure conditions, 1 when the condition is true", Family::default()),
            eviction_reaction: reg(&mut r, "nodelet_eviction_reaction_seconds", "Seconds from a kernel memory threshold notification to the eviction kill issued", hist()),
            pleg_discard_events: reg(&mut r, "kubelet_pleg_discard_events", "The number of discard events in PLEG", Counter::default()),
            channel_full: reg(&mut r, "nodelet_channel_full", "Times a bounded channel between threads was found full (a message dropped or coalesced, or its sender made to wait), by channel", Family::default()),
            pod_worker_panics: reg(&mut r, "nodelet_pod_worker_panics", "Panics caught in pod workers (the pod is synced again after the back-off)", Counter::default()),
            pleg_relist_duration: reg(&mut r, "kubelet_pleg_relist_duration_seconds", "Duration in seconds for relisting pods in PLEG", hist()),
            pleg_relist_interval: reg(&mut r, "kubelet_pleg_relist_interval_seconds", "Interval in seconds between relisting in PLEG", hist()),
            own_oom_score_adj: reg(&mut r, "nodelet_process_oom_score_adj", "oom_score_adj of the agent process in force", Gauge::default()),
            own_oom_score_adj_wanted: reg(
                &mut r,
                "nodelet_process_oom_score_adj_wanted",
                "oom_score_adj configured for the agent process (oomScoreAdj)",
                Gauge::default(),
            ),
            process_rss: reg(&mut r, "process_resident_memory_bytes", "Resident memory size in bytes", Gauge::default()),
            process_cpu_seconds: reg(&mut r, "process_cpu_seconds", "Total user and system CPU time spent in seconds", Counter::default()),
            process_open_fds: reg(&mut r, "process_open_fds", "Number of open file descriptors", Gauge::default()),
            registry: r,
        };
        for channel in FULL_CHANNELS {
            let _ = m.channel_full.get_or_create(&ChannelLabel {
                channel: channel.to_owned(),
            });
        }
        Arc::new(m)
    }

    /// Zero samples of `kubelet_evictions{eviction_signal}` for each of `signals` and of
    /// `nodelet_node_condition{condition}` for each of `conditions`, so that rate() and alerts
    /// work before the first eviction (the eviction manager calls this as it starts).
    pub fn init_eviction_series(&self, signals: &[&str], conditions: &[&str]) {
        for s in signals {
            self.evictions
                .get_or_create(&SignalLabel {
                    eviction_signal: (*s).into(),
                })
                .inc_by(0);
        }
        for c in conditions {
            self.node_condition
                .get_or_create(&ConditionLabel {
                    condition: (*c).into(),
                })
                .set(0);
        }
    }

    /// Counts one time the bounded `channel` (one of [`FULL_CHANNELS`]) was found full.
    pub fn channel_full(&self, channel: &str) {
        self.channel_full
            .get_or_create(&ChannelLabel {
                channel: channel.to_owned(),
            })
            .inc();
    }

    /// Counts one refused manifest.
    pub fn manifest_error(&self, reason: &str) {
        self.manifest_errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one CRI call of `seconds`, and its failure when `ok` is false.
    pub fn runtime_operation(&self, operation: &str, ok: bool, seconds: f64) {
        let label = OperationLabel {
            operation_type: operation.to_owned(),
        };
        self.runtime_operations.get_or_create(&label).inc();
        self.runtime_duration.get_or_create(&label).observe(seconds);
        if !ok {
            self.runtime_errors.get_or_create(&label).inc();
        }
    }

    /// Observes one labelled duration in `family`.
    pub fn observe(family: &Family<OperationLabel, Histogram>, operation: &str, seconds: f64) {
        family
            .get_or_create(&OperationLabel {
                operation_type: operation.to_owned(),
            })
            .observe(seconds);
    }

    fn refresh_process(&self) {
        if let Ok(me) = procfs::process::Process::myself() {
            if let Ok(stat) = me.stat() {
                let tps = procfs::ticks_per_second() as f64;
                self.process_rss
                    .set(stat.rss as i64 * procfs::page_size() as i64);
                // A counter: add what the kernel counted since the last scrape.
                let total = (stat.utime + stat.stime) as f64 / tps;
                let delta = total - self.process_cpu_seconds.get();
                if delta > 0.0 {
                    self.process_cpu_seconds.inc_by(delta);
                }
            }
            if let Ok(n) = me.fd_count() {
                self.process_open_fds.set(n as i64);
            }
        }
    }

    /// The probe metrics (`/metrics/probes`) in OpenMetrics text format.
    pub fn encode_probes(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.probe_registry);
        out
    }

    /// The metrics in OpenMetrics text format, process metrics refreshed.
    pub fn encode(&self) -> String {
        self.refresh_process();
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
        m.runtime_operation("run_podsandbox", false, 0.07);
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
