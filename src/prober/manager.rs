//! The probe manager (kubelet's `prober.Manager`): one async worker per (container, probe kind)
//! of each pod, started by the runtime manager when it syncs the pod and stopped when the pod
//! goes. Each worker reads its container from the pod cache, decides with
//! [`super::worker::Worker`], runs the handler, records the result in [`ProbeResults`] and sends
//! every change to the sync loop on the probe channel. A failed probe is a `Warning Unhealthy`
//! event with the probe's output, and every probe is counted in `prober_probe_total`. A probe
//! that could not be run (kubelet's probe error: a named port the container does not declare,
//! an exec the runtime refuses) is tried up to three times, reported as `Warning Unhealthy`
//! "... probe errored and resulted in unknown state: ...", counted with result `unknown`, and
//! thrown away: it changes no result and counts towards no threshold (kubelet's `doProbe`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::Sender;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::task::JoinHandle;
use tracing::debug;

use super::handlers::{self, HandlerContext, Target};
use super::results::{ProbeResults, ProbeView};
use super::spec::{probe_of, ProbeSpec};
use super::worker::{ContainerView, Publish, Step, Worker};
use super::{ProbeKind, ProbeResult};
use crate::clock::SharedClock;
use crate::container::cache::PodCache;
use crate::container::ContainerState;
use crate::events::Recorder;
use crate::metrics::{Metrics, ProbeDurationLabel, ProbeLabel};
use crate::pod::{pod_ref, pod_uid};

/// Attempts at a probe that cannot be run, in one period (kubelet's `maxProbeRetries`).
const MAX_PROBE_ATTEMPTS: u32 = 3;

/// The probe workers of one pod.
struct PodProbes {
    /// The manifest version the workers were started for.
    version: String,
    /// The pod's IPs, updated on every sync.
    ips: Arc<RwLock<Vec<String>>>,
    tasks: Vec<JoinHandle<()>>,
    /// The metric series its workers write (kubelet deletes them when a worker stops).
    series: Vec<ProbeDurationLabel>,
}

impl PodProbes {
    /// Stops the workers and removes their series from `prober_probe_total` (every result)
    /// and `prober_probe_duration_seconds`: a gone pod leaves no label set behind.
    fn stop(self, metrics: &Metrics) {
        self.tasks.iter().for_each(JoinHandle::abort);
        for d in self.series {
            for result in ["successful", "failed", "unknown"] {
                metrics.probe_total.remove(&ProbeLabel {
                    probe_type: d.probe_type.clone(),
                    result: result.into(),
                    container: d.container.clone(),
                    pod: d.pod.clone(),
                    namespace: d.namespace.clone(),
                });
            }
            metrics.probe_duration.remove(&d);
        }
    }
}

struct Inner {
    ctx: HandlerContext,
    cache: PodCache,
    results: ProbeResults,
    updates: Sender<ProbeResult>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    pods: Mutex<HashMap<String, PodProbes>>,
}

/// The probe manager. Cheap to clone.
#[derive(Clone)]
pub struct ProbeManager(Arc<Inner>);

/// Bound of the probe results channel (probe workers → sync loop). A result that changed is kept
/// in the shared results before it is announced, so when the channel is full the announcement is
/// dropped and counted (`nodelet_channel_full_total{channel="probe_results"}`) and the pod's
/// next sync reads the result anyway (within `syncFrequency`, or sooner on any other event).
/// kubelet's results channels hold 20 per kind; a burst of 110 pods × 3 probes fits in this one.
pub const UPDATES_CAPACITY: usize = 1000;

/// What a probe manager works with.
pub struct ProbeDeps {
    /// Exec and HTTP for the handlers.
    pub ctx: HandlerContext,
    /// Where workers read their containers.
    pub cache: PodCache,
    /// Changed results go here (the sync loop's probe channel, bounded by [`UPDATES_CAPACITY`]);
    /// never waited on.
    pub updates: Sender<ProbeResult>,
    /// `Unhealthy` events.
    pub recorder: Recorder,
    /// `prober_probe_total`, `prober_probe_duration_seconds`.
    pub metrics: Arc<Metrics>,
    /// Time for initial delays.
    pub clock: SharedClock,
}

/// The app containers and sidecars of `pod` (the containers that may have probes).
fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec
        .iter()
        .flat_map(crate::pod::long_running_containers)
}

impl ProbeManager {
    /// A manager with no workers yet.
    pub fn new(deps: ProbeDeps) -> Self {
        Self(Arc::new(Inner {
            ctx: deps.ctx,
            cache: deps.cache,
            results: ProbeResults::default(),
            updates: deps.updates,
            recorder: deps.recorder,
            metrics: deps.metrics,
            clock: deps.clock,
            pods: Mutex::new(HashMap::new()),
        }))
    }

    /// Exec and HTTP, for the lifecycle hooks.
    pub fn handler_context(&self) -> &HandlerContext {
        &self.0.ctx
    }

    /// The results the workers write.
    pub fn results(&self) -> &ProbeResults {
        &self.0.results
    }

    /// Makes sure `pod` has its workers (restarted when its manifest version changed) and tells
    /// them its IPs (`ips`: the pod's, the node's for a host-network pod). Called by the runtime
    /// manager on every sync, from within the agent's tokio runtime.
    pub fn update_pod(&self, pod: &Arc<Pod>, ips: &[String]) {
        let uid = pod_uid(pod).to_owned();
        let version = crate::pod::config_hash(pod).to_owned();
        let mut pods = self.0.pods.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pods.get(&uid) {
            if p.version == version {
                *p.ips.write().unwrap_or_else(|e| e.into_inner()) = ips.to_vec();
                return;
            }
        }
        if let Some(old) = pods.remove(&uid) {
            old.stop(&self.0.metrics);
            self.0.results.remove_pod(&uid);
        }
        let ips = Arc::new(RwLock::new(ips.to_vec()));
        let mut tasks = Vec::new();
        let mut series = Vec::new();
        for c in probed_containers(pod) {
            for kind in [
                ProbeKind::Startup,
                ProbeKind::Liveness,
                ProbeKind::Readiness,
            ] {
                let Some(spec) = probe_of(c, kind) else {
                    continue;
                };
                debug!(pod = %pod_ref(pod), uid, container = %c.name, kind = kind.as_str(), "starting probe worker");
                series.push(ProbeDurationLabel {
                    probe_type: kind.as_str().into(),
                    container: c.name.clone(),
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                });
                tasks.push(tokio::spawn(run_worker(
                    self.0.clone(),
                    pod.clone(),
                    c.clone(),
                    kind,
                    spec,
                    ips.clone(),
                )));
            }
        }
        if !tasks.is_empty() {
            pods.insert(
                uid,
                PodProbes {
                    version,
                    ips,
                    tasks,
                    series,
                },
            );
        }
    }

    /// Stops the pod's workers and forgets their results and metric series (the pod is gone or
    /// failed).
    pub fn remove_pod(&self, uid: &str) {
        let removed = self
            .0
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        if let Some(p) = removed {
            p.stop(&self.0.metrics);
        }
        self.0.results.remove_pod(uid);
    }

    /// Number of running workers (for tests and metrics).
    pub fn workers(&self) -> usize {
        self.0
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| p.tasks.len())
            .sum()
    }
}

impl Inner {
    fn publish(&self, pod: &Pod, container: &str, id: &str, kind: ProbeKind, p: Publish) {
        let uid = pod_uid(pod);
        let success = match p {
            Publish::Set(v) => v,
            Publish::Clear => {
                self.results.clear(uid, container, kind);
                return;
            }
        };
        if self.results.set(uid, container, id, kind, success) {
            debug!(pod = %pod_ref(pod), uid, container, kind = kind.as_str(), success, "probe result changed");
            let sent = self.updates.try_send(ProbeResult {
                uid: uid.to_owned(),
                container: container.to_owned(),
                kind,
                success,
            });
            if let Err(crossbeam_channel::TrySendError::Full(_)) = sent {
                self.metrics.channel_full("probe_results");
            }
        }
    }

    /// Counts one probe in `prober_probe_total` with `result` (`successful`, `failed`, or
    /// `unknown` for a probe that could not be run) and its duration.
    fn count(&self, pod: &Pod, container: &str, kind: ProbeKind, result: &str, seconds: f64) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        self.metrics
            .probe_total
            .get_or_create(&ProbeLabel {
                probe_type: kind.as_str().into(),
                result: result.into(),
                container: container.into(),
                pod: name.clone(),
                namespace: namespace.clone(),
            })
            .inc();
        self.metrics
            .probe_duration
            .get_or_create(&ProbeDurationLabel {
                probe_type: kind.as_str().into(),
                container: container.into(),
                pod: name,
                namespace,
            })
            .observe(seconds);
    }
}

/// One worker: a tick every `periodSeconds` until aborted.
async fn run_worker(
    inner: Arc<Inner>,
    pod: Arc<Pod>,
    container: Container,
    kind: ProbeKind,
    spec: ProbeSpec,
    ips: Arc<RwLock<Vec<String>>>,
) {
    let uid = pod_uid(&pod).to_owned();
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let mut w = Worker::new(kind, spec.clone());
    let mut ticker = tokio::time::interval(spec.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the last probe ended: a tick it overran is due only from then (the probe's own
    // duration is not scheduling delay).
    let mut last_end = tokio::time::Instant::now();
    loop {
        let due = ticker.tick().await;
        inner
            .metrics
            .probe_schedule_delay
            .observe(due.max(last_end).elapsed().as_secs_f64());
        let view = inner.cache.latest(&uid).and_then(|rt| {
            rt.latest(&container.name).map(|c| ContainerView {
                id: c.id.clone(),
                running: c.state() == ContainerState::Running,
                started_at: c.started_at,
            })
        });
        let started = container.startup_probe.is_none()
            || view.as_ref().is_some_and(|v| {
                inner
                    .results
                    .result(&uid, &container.name, &v.id, ProbeKind::Startup)
                    == Some(true)
            });
        let (step, publish) = w.before(view.as_ref(), started, inner.clock.epoch_ns());
        let Some(view) = view else { continue };
        if let Some(p) = publish {
            inner.publish(&pod, &container.name, &view.id, kind, p);
        }
        if step == Step::Wait {
            continue;
        }
        let pod_ips = ips.read().unwrap_or_else(|e| e.into_inner()).clone();
        let target = Target {
            container: &container,
            container_id: &view.id,
            pod_ips: &pod_ips,
            host_network,
        };
        let t0 = crate::clock::monotonic_now();
        let mut outcome = handlers::run(&inner.ctx, &spec.handler, &target, spec.timeout).await;
        // A probe that could not be run is tried again at once, up to kubelet's
        // `maxProbeRetries` attempts in all; one that runs ends the tries.
        for _ in 1..MAX_PROBE_ATTEMPTS {
            if !outcome.errored {
                break;
            }
            outcome = handlers::run(&inner.ctx, &spec.handler, &target, spec.timeout).await;
        }
        let result = if outcome.errored {
            "unknown"
        } else if outcome.success {
            "successful"
        } else {
            "failed"
        };
        inner.count(
            &pod,
            &container.name,
            kind,
            result,
            t0.elapsed().as_secs_f64(),
        );
        if outcome.errored {
            // kubelet's prober: the error is reported and the result thrown away. It counts
            // towards neither threshold and the published result stands (readiness stays
            // false, liveness true, startup unknown), so a probe that cannot run never kills.
            debug!(pod = %pod_ref(&pod), uid, container = %container.name, kind = kind.as_str(), error = %outcome.output, "probe errored");
            inner.recorder.warning(
                crate::events::Involved::container(&pod, &container.name),
                "Unhealthy",
                format!(
                    "{} probe errored and resulted in unknown state: {}",
                    kind.as_str(),
                    outcome.output
                ),
            );
            last_end = tokio::time::Instant::now();
            continue;
        }
        if !outcome.success {
            inner.recorder.warning(
                crate::events::Involved::container(&pod, &container.name),
                "Unhealthy",
                format!("{} probe failed: {}", kind.as_str(), outcome.output),
            );
        } else if outcome.warning {
            // kubelet's `ContainerProbeWarning`: a success, reported.
            inner.recorder.warning(
                crate::events::Involved::container(&pod, &container.name),
                "ProbeWarning",
                format!("{} probe warning: {}", kind.as_str(), outcome.output),
            );
        }
        if let Some(v) = w.after(outcome.success) {
            inner.publish(&pod, &container.name, &view.id, kind, Publish::Set(v));
        }
        last_end = tokio::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manager on a fake runtime whose results channel holds `bound`.
    fn manager(
        bound: usize,
    ) -> (
        ProbeManager,
        Arc<Metrics>,
        crossbeam_channel::Receiver<ProbeResult>,
    ) {
        let clock = crate::clock::FakeClock::new(0);
        let runtime = crate::testing::runtime::FakeRuntime::new(clock.clone());
        let metrics = Metrics::new();
        let (tx, rx) = crossbeam_channel::bounded(bound);
        let m = ProbeManager::new(ProbeDeps {
            ctx: HandlerContext::new(crate::prober::handlers::exec_fn(runtime)).unwrap(),
            cache: PodCache::default(),
            updates: tx,
            recorder: Recorder::default(),
            metrics: metrics.clone(),
            clock: clock.shared(),
        });
        (m, metrics, rx)
    }

    #[test]
    fn a_full_results_channel_drops_the_notification_counts_it_and_keeps_the_result() {
        let (m, metrics, rx) = manager(1);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u".into());
        m.0.publish(&pod, "c", "id1", ProbeKind::Readiness, Publish::Set(false));
        m.0.publish(&pod, "c", "id1", ProbeKind::Readiness, Publish::Set(true));
        assert_eq!(rx.len(), 1, "the channel holds its bound");
        assert!(
            !rx.recv().unwrap().success,
            "the first notification went through"
        );
        assert_eq!(
            m.0.results.result("u", "c", "id1", ProbeKind::Readiness),
            Some(true),
            "the dropped notification's result is kept for the next sync"
        );
        assert!(metrics
            .encode()
            .contains("nodelet_channel_full_total{channel=\"probe_results\"} 1"));
    }

    #[tokio::test]
    async fn a_removed_pod_leaves_no_probe_series() {
        let (m, metrics, _rx) = manager(8);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "x",
                "readinessProbe": {"exec": {"command": ["true"]}}}]}
        }))
        .unwrap();
        m.update_pod(&Arc::new(pod.clone()), &[]);
        m.0.count(&pod, "c", ProbeKind::Readiness, "successful", 0.01);
        m.0.count(&pod, "c", ProbeKind::Readiness, "failed", 0.01);
        assert!(metrics.encode_probes().contains("pod=\"web\""));
        m.remove_pod("u");
        assert!(
            !metrics.encode_probes().contains("pod=\"web\""),
            "{}",
            metrics.encode_probes()
        );
    }
}
