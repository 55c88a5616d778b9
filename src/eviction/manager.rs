//! The eviction manager loop (kubelet's `managerImpl.synchronize`): on every kernel notification
//! and every `evictionMonitoringPeriod`, observe the signals, decide which thresholds act and
//! which node conditions hold, and, when a threshold acts, fail the first pod in rank order —
//! at most one pod per pass — then wait for it to be cleaned up before the next pass.
//!
//! What the manager reads and does on the node is behind [`EvictionNode`], so that the decisions
//! are tested with a fake node and an injected clock; the agent's implementation reads cgroup
//! files and kills through the pod workers.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{select, Receiver};
use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::local_storage::{self, ContainerUsage};
use super::rank::{rank, PodUsage};
use super::signals::Observation;
use super::state::PressureState;
use super::threshold::{Threshold, ThresholdValue};
use super::{is_critical, EvictionRecord, NodePressure, SignalView, CONDITIONS};
use crate::clock::SharedClock;
use crate::metrics::{ConditionLabel, Metrics, SignalLabel};
use crate::status::failed::Failure;

/// Grace period of a hard eviction, seconds (kubelet ≥ v1.31; older releases passed 0).
pub const HARD_EVICTION_GRACE_SECONDS: i64 = 1;

/// How long passes follow a notification that found no threshold met yet.
pub const FOLLOW_UP: Duration = Duration::from_secs(2);
/// The period of those passes.
pub const FOLLOW_UP_INTERVAL: Duration = Duration::from_millis(10);
/// How often a pod being evicted is checked for its clean-up.
pub const CLEANUP_POLL: Duration = Duration::from_millis(50);

/// The resource a signal reclaims, as named in messages and used for ranking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Bytes of memory (working set against memory requests).
    Memory,
    /// Bytes of ephemeral storage (logs and writable layers against ephemeral-storage requests).
    EphemeralStorage,
    /// Inodes (ranked by ephemeral storage, as kubelet does for inode signals).
    Inodes,
    /// Process IDs (ranked by the pod's process count).
    Pids,
}

impl Resource {
    /// The resource of a signal.
    pub fn of(signal: &str) -> Self {
        match signal {
            "memory.available" | "allocatableMemory.available" => Self::Memory,
            "nodefs.inodesFree" | "imagefs.inodesFree" => Self::Inodes,
            "pid.available" => Self::Pids,
            _ => Self::EphemeralStorage,
        }
    }

    /// kubelet's name in eviction messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

/// What the manager reads and does on the node.
pub trait EvictionNode: Send {
    /// Observes every signal it can, by signal name.
    fn observe(&mut self) -> HashMap<String, Observation>;
    /// Pods that are running or starting (not terminal, not already evicted).
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// The pod's usage and request of `resource` (bytes, or a count for pids), `None` when it
    /// cannot be measured (the pod is then ranked as using nothing).
    fn pod_usage(&self, pod: &Pod, resource: Resource) -> Option<(i64, i64)>;
    /// Fails the pod with `failure` (reason `Evicted`, the message, a `DisruptionTarget`
    /// condition for a node-pressure eviction) and kills it through its pod worker with
    /// `grace` seconds.
    fn kill(&mut self, pod: Arc<Pod>, grace: i64, failure: Failure);
    /// True once the pod's worker has finished with it.
    fn is_cleaned_up(&self, uid: &str) -> bool;
    /// True while the pod is being killed for another reason (its manifest was removed).
    fn is_terminating(&self, _uid: &str) -> bool {
        false
    }
    /// Re-arms kernel notifications for the thresholds (inactive_file moves); default none.
    fn rearm(&mut self, _thresholds: &[Threshold]) {}
    /// Frees what the node holds for no pod before any pod is evicted for the disk signal
    /// `signal` (kubelet's `reclaimNodeLevelResources`): dead containers, and unused images
    /// when the signal's filesystem holds them. Returns a description of what was freed
    /// (for the event), `None` when nothing was. Default: nothing to reclaim.
    fn reclaim_node_level_resources(&mut self, _signal: &str) -> Option<String> {
        None
    }
    /// The ephemeral storage each of the pod's current containers uses (writable layer plus
    /// logs, bytes), `None` when it cannot be measured; default none.
    fn container_storage(&self, _pod: &Pod) -> Option<Vec<ContainerUsage>> {
        None
    }
    /// What each of the pod's disk-backed emptyDirs holds (volume name, bytes as `du` counts
    /// them); default none.
    fn empty_dir_usage(&self, _pod: &Pod) -> Vec<(String, i64)> {
        Vec::new()
    }
    /// What each of the pod's current containers uses of `resource`, by container name
    /// (memory: its working set, bytes; ephemeral storage: writable layer plus logs, bytes;
    /// nothing for inodes and pids, which kubelet does not break down by container); the
    /// containers that cannot be measured are left out. Default none.
    fn container_usage(&self, _pod: &Pod, _resource: Resource) -> Vec<(String, i64)> {
        Vec::new()
    }
}

/// kubelet's eviction message (`evictionMessage`, eviction/helpers.go, 1.26 and later):
/// "The node was low on resource: %v. ", "Threshold quantity: %v, available: %v. ", then, for
/// each container (init containers first) whose usage of the resource exceeds its request,
/// "Container %s was using %s, request is %s, has larger consumption of %v. ". Only memory and
/// ephemeral storage are broken down by container. `usage` is [`EvictionNode::container_usage`];
/// a request is written as the manifest spells it, `0` when absent. (Releases before 1.26 wrote
/// "Container %s was using %s, which exceeds its request of %s. ".) A pod with a pod-level
/// memory request is named as a whole instead, for memory, when `pod_usage` (its working set,
/// bytes) exceeds that request: "Pod %s was using %s, request is %s, has larger consumption of
/// %v. " (kubelet 1.34 with PodLevelResources).
pub fn eviction_message(
    resource: Resource,
    threshold: i64,
    available: i64,
    pod: &Pod,
    usage: &[(String, i64)],
    pod_usage: Option<i64>,
) -> String {
    let mut m = format!(
        "The node was low on resource: {r}. Threshold quantity: {t}, available: {a}. ",
        r = resource.name(),
        t = format_amount(resource, threshold),
        a = format_amount(resource, available),
    );
    let key = match resource {
        Resource::Memory => "memory",
        Resource::EphemeralStorage => "ephemeral-storage",
        Resource::Inodes | Resource::Pids => return m,
    };
    let pod_request = crate::resources::pod_level_resources(pod).and_then(|p| p.memory_request);
    if let (Resource::Memory, Some(request)) = (resource, pod_request) {
        if let Some(used) = pod_usage.filter(|u| *u > request) {
            m.push_str(&format!(
                "Pod {} was using {}, request is {}, has larger consumption of memory. ",
                pod.metadata.name.as_deref().unwrap_or(""),
                format_binary_si(used),
                format_binary_si(request),
            ));
        }
        return m;
    }
    let containers = pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    });
    for c in containers {
        let Some(used) = usage.iter().find(|(n, _)| *n == c.name).map(|u| u.1) else {
            continue;
        };
        let request = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(key));
        let request_bytes = request
            .and_then(|q| crate::quantity::parse_amount(&q.0, crate::quantity::Scale::Whole).ok())
            .unwrap_or(0);
        if used > request_bytes {
            m.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {key}. ",
                c.name,
                format_binary_si(used),
                request.map_or("0", |q| q.0.as_str()),
            ));
        }
    }
    m
}

/// The manager's settings, from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Hard and soft thresholds.
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`.
    pub transition: Duration,
    /// `evictionMonitoringPeriod`.
    pub monitoring_period: Duration,
    /// `evictionMaxPodGracePeriod`, seconds: a soft eviction kills with
    /// `min(this, the pod's terminationGracePeriodSeconds)` (kubelet ≥ 1.32; 1.31 used this
    /// value alone), raised to 1 s by the pod kill ([`crate::kuberuntime::kill::grace_seconds`])
    /// and to 2 s per container ([`crate::kuberuntime::MIN_GRACE_PERIOD_SECONDS`]). kubelet
    /// accepts any value and gives a negative one no meaning of its own: `min` keeps it
    /// negative, and the pod is killed as with 0, i.e. like a hard eviction. (Upstream
    /// proposals to read a negative value as "the pod's own grace period" are not merged.)
    pub max_pod_grace_seconds: i64,
    /// `staticPodsAreCritical`.
    pub static_pods_are_critical: bool,
}

/// A pod picked in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// The pod.
    pub uid: String,
    /// The threshold's signal.
    pub signal: String,
    /// Kill grace period, seconds.
    pub grace: i64,
    /// The status message.
    pub message: String,
}

/// How a wait for an evicted pod ended.
enum Waited {
    CleanedUp,
    Woken(SystemTime),
    Stopped,
}

/// The manager: pressure state plus settings; see the module docs.
pub struct Manager<N: EvictionNode> {
    settings: Settings,
    state: PressureState,
    node: N,
    pressure: NodePressure,
    metrics: Arc<Metrics>,
    /// The "nothing may be evicted" warning was logged in this episode of pressure.
    warned_nothing_to_evict: bool,
    clock: SharedClock,
}

/// A quantity as apimachinery writes it: the largest binary suffix that divides it exactly
/// (`104857600` → `100Mi`, `38092800` → `37200Ki`), else plain.
pub(super) fn format_binary_si(v: i64) -> String {
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if v != 0 && v % (1i64 << shift) == 0 {
            return format!("{}{suffix}", v >> shift);
        }
    }
    v.to_string()
}

/// A fraction as a percentage with at most six decimals (`0.577` → `57.7%`).
fn format_percent(p: f64) -> String {
    let s = format!("{:.6}", p * 100.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

fn format_amount(resource: Resource, v: i64) -> String {
    match resource {
        Resource::Memory | Resource::EphemeralStorage => format_binary_si(v),
        Resource::Inodes | Resource::Pids => v.to_string(),
    }
}

fn describe(t: &Threshold) -> String {
    let v = match t.value {
        ThresholdValue::Quantity(q) => format_amount(Resource::of(&t.signal), q),
        ThresholdValue::Percentage(p) => format_percent(p),
    };
    if t.grace_period.is_zero() {
        format!("{}<{v}", t.signal)
    } else {
        format!(
            "{}<{v} for {}",
            t.signal,
            crate::duration::format_go_duration(t.grace_period)
        )
    }
}

/// Memory signals first, then the rest in configuration order (kubelet's `byEvictionPriority`).
fn signal_order(signal: &str) -> u8 {
    match Resource::of(signal) {
        Resource::Memory => 0,
        _ => 1,
    }
}

impl<N: EvictionNode> Manager<N> {
    /// A manager over `node`, publishing to `pressure` and `metrics`.
    pub fn new(settings: Settings, node: N, pressure: NodePressure, metrics: Arc<Metrics>) -> Self {
        pressure.set_thresholds(settings.thresholds.iter().map(describe).collect());
        metrics.init_eviction_series(super::threshold::SIGNALS, &super::CONDITIONS);
        Self {
            state: PressureState::new(settings.thresholds.clone(), settings.transition),
            settings,
            node,
            pressure,
            metrics,
            warned_nothing_to_evict: false,
            clock: crate::clock::system(),
        }
    }

    /// Reads time (passes, waits, periods, kill times) from `clock`.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The node (for tests).
    pub fn node(&self) -> &N {
        &self.node
    }

    /// One pass at `now`: observe, publish the conditions, and pick and kill at most one pod.
    /// `notified_at` is the wall time of the kernel notification that started the pass.
    /// Returns the eviction made, if any.
    pub fn synchronize(
        &mut self,
        now: Instant,
        notified_at: Option<SystemTime>,
    ) -> Option<Eviction> {
        let observations = self.node.observe();
        let decision = self.state.observe(now, &observations);
        let conditions: BTreeMap<String, bool> = CONDITIONS
            .iter()
            .map(|c| (c.to_string(), decision.conditions.contains(c)))
            .collect();
        for (c, on) in &conditions {
            self.metrics
                .node_condition
                .get_or_create(&ConditionLabel {
                    condition: c.clone(),
                })
                .set(i64::from(*on));
        }
        let signals = observations
            .iter()
            .map(|(k, o)| {
                (
                    k.clone(),
                    SignalView {
                        available: o.available,
                        capacity: o.capacity,
                    },
                )
            })
            .collect();
        self.pressure.update(conditions, signals);
        // Local storage limits first, whether or not the node is under pressure (kubelet's
        // `localStorageEviction`): every pod over its limits goes in this pass.
        let pods = self.node.active_pods();
        if let Some(first) = self
            .local_storage_evictions(&pods, notified_at)
            .into_iter()
            .next()
        {
            return Some(first);
        }

        let mut act_on = decision.act_on;
        act_on.sort_by_key(|t| signal_order(&t.signal));
        let Some(threshold) = act_on.first() else {
            self.warned_nothing_to_evict = false;
            return None;
        };
        if self.reclaimed_enough(threshold) {
            return None;
        }
        let obs = observations.get(&threshold.signal)?;
        let resource = Resource::of(&threshold.signal);
        let by_uid: HashMap<&str, &Arc<Pod>> =
            pods.iter().map(|p| (crate::pod::pod_uid(p), p)).collect();
        let usages: Vec<PodUsage> = pods
            .iter()
            .map(|p| {
                let (usage, request) = self.node.pod_usage(p, resource).unwrap_or((0, 0));
                PodUsage {
                    uid: crate::pod::pod_uid(p).to_owned(),
                    priority: crate::qos::pod_priority(p),
                    usage,
                    request,
                    critical: is_critical(p, self.settings.static_pods_are_critical),
                }
            })
            .collect();
        let Some(victim) = rank(&usages).into_iter().next() else {
            // Once per episode of pressure, then at debug: it holds on every pass meanwhile.
            if std::mem::replace(&mut self.warned_nothing_to_evict, true) {
                tracing::debug!(signal = %threshold.signal, available = obs.available, "eviction threshold met, but no pod may be evicted");
            } else {
                warn!(
                    signal = %threshold.signal,
                    available = obs.available,
                    "eviction threshold met, but no pod may be evicted (none running, or all critical)"
                );
            }
            return None;
        };
        if self.node.is_terminating(&victim.uid) {
            // The pod that would go is already going: its memory is about to be freed, and
            // evicting the next pod in rank would fail an innocent one. (kubelet would shorten the
            // running kill's grace period; nodelet's pod workers do not.)
            tracing::debug!(uid = %victim.uid, "the top-ranked pod is already terminating; waiting for it");
            return None;
        }
        let pod = by_uid.get(victim.uid.as_str()).copied()?.clone();
        let hard = threshold.grace_period.is_zero();
        let grace = if hard {
            HARD_EVICTION_GRACE_SECONDS
        } else {
            let own = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(crate::pod::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
            self.settings.max_pod_grace_seconds.min(own)
        };
        let message = eviction_message(
            resource,
            threshold.value.amount(obs.capacity),
            obs.available,
            &pod,
            &self.node.container_usage(&pod, resource),
            Some(victim.usage),
        );
        info!(
            pod = pod.metadata.name.as_deref().unwrap_or(""),
            namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
            uid = %victim.uid,
            signal = %threshold.signal,
            available = obs.available,
            usage = victim.usage,
            grace,
            hard,
            "evicting pod"
        );
        let failure = Failure::new(super::REASON, message)
            .of_running_pod()
            .with_disruption_target();
        Some(self.evict(&pod, &threshold.signal, grace, failure, notified_at))
    }

    /// For a disk signal: reclaims node-level resources first, observes again, and says
    /// whether `threshold` is resolved (available at or above the threshold plus its minimum
    /// reclaim, kubelet's `thresholdsMet` with `enforceMinReclaim`); the pass then evicts no
    /// pod. Memory, pid and inode-less signals have nothing to reclaim.
    fn reclaimed_enough(&mut self, threshold: &Threshold) -> bool {
        if !(threshold.signal.starts_with("nodefs.") || threshold.signal.starts_with("imagefs.")) {
            return false;
        }
        let Some(what) = self.node.reclaim_node_level_resources(&threshold.signal) else {
            return false;
        };
        let after = self.node.observe();
        let Some(obs) = after.get(&threshold.signal) else {
            return false;
        };
        let resolved = obs.available >= super::state::reclaim_target(threshold, obs.capacity);
        self.pressure.record_reclaim(super::ReclaimRecord {
            signal: threshold.signal.clone(),
            reclaimed: what.clone(),
            resolved,
            available_after: obs.available,
            at_unix_nanos: self.clock.epoch_ns(),
        });
        info!(
            signal = %threshold.signal,
            available = obs.available,
            resolved,
            reclaimed = %what,
            "reclaimed node-level resources before evicting"
        );
        resolved
    }

    /// Evicts every pod over its local storage limits (kubelet's `localStorageEviction`):
    /// critical pods and pods already terminating are left alone; the grace period is a hard
    /// eviction's. Returns the evictions made.
    fn local_storage_evictions(
        &mut self,
        pods: &[Arc<Pod>],
        notified_at: Option<SystemTime>,
    ) -> Vec<Eviction> {
        let mut out = Vec::new();
        for pod in pods {
            let uid = crate::pod::pod_uid(pod);
            if !local_storage::has_limits(pod)
                || is_critical(pod, self.settings.static_pods_are_critical)
                || self.node.is_terminating(uid)
            {
                continue;
            }
            let Some(usage) = self.node.container_storage(pod) else {
                continue;
            };
            let volumes = if local_storage::has_disk_empty_dirs(pod) {
                self.node.empty_dir_usage(pod)
            } else {
                Vec::new()
            };
            let Some(v) = local_storage::violation(pod, &usage, &volumes) else {
                continue;
            };
            info!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
                uid,
                signal = v.signal,
                usage = ?usage,
                "evicting pod over its local storage limits"
            );
            // No DisruptionTarget for local storage limits (kubelet passes no condition).
            out.push(self.evict(
                pod,
                v.signal,
                HARD_EVICTION_GRACE_SECONDS,
                Failure::new(super::REASON, v.message).of_running_pod(),
                notified_at,
            ));
        }
        out
    }

    /// Kills `pod` for `signal` with `grace` seconds and `failure`, counts it in
    /// `kubelet_evictions` and the reaction-time histogram, and records it for `/node`.
    fn evict(
        &mut self,
        pod: &Arc<Pod>,
        signal: &str,
        grace: i64,
        failure: Failure,
        notified_at: Option<SystemTime>,
    ) -> Eviction {
        let uid = crate::pod::pod_uid(pod).to_owned();
        let message = failure.message.clone();
        self.node.kill(pod.clone(), grace, failure);
        let issued = SystemTime::UNIX_EPOCH + Duration::from_nanos(self.clock.epoch_ns() as u64);
        let nanos = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, crate::clock::duration_ns)
        };
        self.metrics
            .evictions
            .get_or_create(&SignalLabel {
                eviction_signal: signal.to_owned(),
            })
            .inc();
        if let Some(n) = notified_at {
            if let Ok(d) = issued.duration_since(n) {
                self.metrics.eviction_reaction.observe(d.as_secs_f64());
            }
        }
        self.pressure.record(EvictionRecord {
            pod: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            ),
            uid: uid.clone(),
            signal: signal.to_owned(),
            message: message.clone(),
            grace_seconds: grace,
            notified_at_unix_nanos: notified_at.map(nanos),
            kill_issued_at_unix_nanos: nanos(issued),
        });
        Eviction {
            uid,
            signal: signal.to_owned(),
            grace,
            message,
        }
    }

    /// Waits until the evicted pod is cleaned up, at most max(10 s, grace × 1.5), polling every
    /// [`CLEANUP_POLL`]. A soft eviction's wait (its grace may be long) ends early on a notification, so a
    /// hard threshold crossed meanwhile is acted on at once.
    fn wait_for_cleanup(
        &self,
        e: &Eviction,
        wake: &Receiver<(SystemTime, String)>,
        stop: &Receiver<()>,
    ) -> Waited {
        // A negative grace (a negative evictionMaxPodGracePeriod) waits as 0 does.
        let limit = Duration::from_secs(10).max(Duration::from_millis(
            u64::try_from(e.grace.max(0))
                .unwrap_or(0)
                .saturating_mul(1500),
        ));
        let start = self.clock.now();
        let soft = e.grace > HARD_EVICTION_GRACE_SECONDS;
        let never = crossbeam_channel::never();
        while self.clock.now().duration_since(start) < limit {
            if self.node.is_cleaned_up(&e.uid) {
                return Waited::CleanedUp;
            }
            select! {
                recv(stop) -> _ => return Waited::Stopped,
                recv(if soft { wake } else { &never }) -> t => {
                    if let Ok((at, _)) = t {
                        return Waited::Woken(at);
                    }
                },
                recv(self.clock.after(CLEANUP_POLL)) -> _ => {},
            }
        }
        warn!(uid = %e.uid, "evicted pod not cleaned up in time; continuing");
        Waited::CleanedUp
    }

    /// The first pass, before anything else runs: arms the notifications and publishes the
    /// node conditions, so that admission sees them before the first pods arrive.
    pub fn prime(&mut self) {
        self.node.rearm(&self.settings.thresholds);
        self.synchronize(self.clock.now(), None);
    }

    /// Runs until `stop` fires or closes: a pass on every notification (`wake` carries its wall
    /// time and key) and every monitoring period, and re-arms the notifications every period.
    ///
    /// The kernel wakes us when usage crosses the armed bytes, which is the threshold only as of
    /// the last re-arm (inactive_file moves) and exactly at it, while a threshold is met only
    /// strictly below it. So a notified pass that finds nothing met is followed by passes every
    /// [`FOLLOW_UP_INTERVAL`] for [`FOLLOW_UP`], each timed from the notification.
    pub fn run(mut self, mut wake: Receiver<(SystemTime, String)>, stop: Receiver<()>) {
        let period = self.settings.monitoring_period;
        let mut next_period = self.clock.now() + period;
        self.node.rearm(&self.settings.thresholds);
        // The first pass at once, so admission sees the conditions before the first pods come.
        let mut notified = None;
        let mut follow_up: Option<(Instant, SystemTime)> = None;
        loop {
            match self.synchronize(self.clock.now(), notified) {
                Some(e) => {
                    follow_up = None;
                    match self.wait_for_cleanup(&e, &wake, &stop) {
                        Waited::Stopped => return,
                        Waited::Woken(at) => {
                            notified = Some(at);
                            continue;
                        }
                        Waited::CleanedUp => {}
                    }
                    // Wake-ups that arrived while the pod was going are answered by the next pass.
                    if let Some((at, _)) = wake.try_iter().last() {
                        notified = Some(at);
                        continue;
                    }
                }
                None => {
                    if let (Some(at), None) = (notified, follow_up) {
                        follow_up = Some((self.clock.now() + FOLLOW_UP, at));
                    }
                }
            }
            let follow = match follow_up {
                Some((until, _)) if self.clock.now() < until => {
                    self.clock.after(FOLLOW_UP_INTERVAL)
                }
                _ => {
                    follow_up = None;
                    crossbeam_channel::never()
                }
            };
            notified = select! {
                recv(wake) -> t => match t {
                    Ok((at, _)) => {
                        follow_up = None;
                        Some(at)
                    }
                    Err(_) => {
                        // No notifier (any more): only the period wakes us.
                        wake = crossbeam_channel::never();
                        None
                    }
                },
                recv(follow) -> _ => follow_up.map(|(_, at)| at),
                recv(self.clock.after(next_period.saturating_duration_since(self.clock.now()))) -> _ => {
                    next_period = self.clock.now() + period;
                    self.node.rearm(&self.settings.thresholds);
                    None
                },
                recv(stop) -> _ => return,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use std::collections::HashSet;

    #[derive(Default)]
    struct FakeNode {
        passes: Arc<std::sync::atomic::AtomicUsize>,
        available: i64,
        /// From this pass on (1-based), `available` becomes the second value.
        drops_at: Option<(usize, i64)>,
        terminating: Vec<String>,
        pods: Vec<(Arc<Pod>, i64, i64)>,
        killed: Vec<(String, i64, String)>,
        /// Observe `imagefs.available` instead of memory; a reclaim frees this much.
        disk_reclaim: Option<i64>,
    }

    impl EvictionNode for FakeNode {
        fn observe(&mut self) -> HashMap<String, Observation> {
            let n = self
                .passes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if let Some((at, v)) = self.drops_at {
                if n >= at {
                    self.available = v;
                }
            }
            let signal = if self.disk_reclaim.is_some() {
                "imagefs.available"
            } else {
                "memory.available"
            };
            [(
                signal.to_string(),
                Observation {
                    available: self.available,
                    capacity: 1 << 30,
                },
            )]
            .into()
        }
        fn reclaim_node_level_resources(&mut self, _signal: &str) -> Option<String> {
            let frees = self.disk_reclaim.filter(|f| *f > 0)?;
            self.available += frees;
            Some(format!("{frees} bytes"))
        }
        fn active_pods(&self) -> Vec<Arc<Pod>> {
            let killed: HashSet<&str> = self.killed.iter().map(|k| k.0.as_str()).collect();
            self.pods
                .iter()
                .filter(|p| !killed.contains(crate::pod::pod_uid(&p.0)))
                .map(|p| p.0.clone())
                .collect()
        }
        fn pod_usage(&self, pod: &Pod, _: Resource) -> Option<(i64, i64)> {
            self.pods
                .iter()
                .find(|p| p.0.metadata.uid == pod.metadata.uid)
                .map(|p| (p.1, p.2))
        }
        fn container_usage(&self, pod: &Pod, _: Resource) -> Vec<(String, i64)> {
            self.pods
                .iter()
                .find(|p| p.0.metadata.uid == pod.metadata.uid)
                .map(|p| vec![("app".to_owned(), p.1)])
                .unwrap_or_default()
        }
        fn kill(&mut self, pod: Arc<Pod>, grace: i64, failure: Failure) {
            self.killed
                .push((crate::pod::pod_uid(&pod).to_owned(), grace, failure.message));
        }
        fn is_cleaned_up(&self, _: &str) -> bool {
            true
        }
        fn is_terminating(&self, uid: &str) -> bool {
            self.terminating.iter().any(|u| u == uid)
        }
    }

    fn pod(uid: &str, grace: i64, class: Option<&str>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(uid.into());
        p.metadata.namespace = Some("default".into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(grace),
            priority_class_name: class.map(Into::into),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        Arc::new(p)
    }

    fn manager(thresholds: Vec<Threshold>, node: FakeNode) -> Manager<FakeNode> {
        Manager::new(
            Settings {
                thresholds,
                transition: Duration::from_secs(300),
                monitoring_period: Duration::from_secs(10),
                max_pod_grace_seconds: 20,
                static_pods_are_critical: false,
            },
            node,
            NodePressure::default(),
            Metrics::new(),
        )
    }

    fn threshold(mib: i64, grace_s: u64) -> Threshold {
        Threshold {
            signal: "memory.available".into(),
            value: ThresholdValue::Quantity(mib << 20),
            grace_period: Duration::from_secs(grace_s),
            min_reclaim: None,
        }
    }

    #[test]
    fn disk_pressure_reclaims_first_and_evicts_only_when_that_was_not_enough() {
        let disk = |mib| Threshold {
            signal: "imagefs.available".into(),
            ..threshold(mib, 0)
        };
        for (frees, evicts) in [(60 << 20, false), (10 << 20, true), (0, true)] {
            let node = FakeNode {
                available: 50 << 20,
                disk_reclaim: Some(frees),
                pods: vec![(pod("p", 30, None), 1 << 20, 0)],
                ..Default::default()
            };
            let mut m = manager(vec![disk(100)], node);
            let e = m.synchronize(Instant::now(), None);
            assert_eq!(e.is_some(), evicts, "a reclaim of {frees} bytes");
            let reclaims = m.pressure.view().reclaims;
            assert_eq!(reclaims.len(), usize::from(frees > 0));
            if let Some(r) = reclaims.front() {
                assert_eq!(
                    (r.signal.as_str(), r.resolved),
                    ("imagefs.available", !evicts)
                );
                assert_eq!(r.available_after, (50 << 20) + frees);
            }
        }
    }

    #[test]
    fn hard_threshold_evicts_one_pod_per_pass_in_rank_order_never_the_critical_one() {
        let node = FakeNode {
            available: 50 << 20,
            pods: vec![
                (pod("guaranteed", 30, None), 60 << 20, 64 << 20),
                (pod("besteffort", 30, None), 300 << 20, 0),
                (
                    pod("critical", 30, Some("system-node-critical")),
                    900 << 20,
                    0,
                ),
            ],
            ..Default::default()
        };
        let mut m = manager(vec![threshold(100, 0)], node);
        let t0 = Instant::now();
        let e = m.synchronize(t0, None).unwrap();
        assert_eq!((e.uid.as_str(), e.grace), ("besteffort", 1));
        assert_eq!(
            e.message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container app was using 300Mi, request is 0, has larger consumption of memory. "
        );
        assert!(m.pressure.has("MemoryPressure"));
        assert_eq!(m.node().killed.len(), 1, "one pod per pass");
        let e = m.synchronize(t0, None).unwrap();
        assert_eq!(e.uid, "guaranteed");
        assert!(m.synchronize(t0, None).is_none(), "the critical pod stays");
        assert_eq!(m.pressure.view().evictions.len(), 2);
    }

    #[test]
    fn no_innocent_pod_goes_while_the_top_ranked_one_is_already_terminating() {
        let node = FakeNode {
            available: 10 << 20,
            pods: vec![
                (pod("steady", 30, None), 1 << 20, 32 << 20),
                (pod("hog", 30, None), 900 << 20, 0),
            ],
            terminating: vec!["hog".into()],
            ..Default::default()
        };
        let mut m = manager(vec![threshold(100, 0)], node);
        assert!(m.synchronize(Instant::now(), None).is_none());
        assert!(m.node().killed.is_empty());
        m.node.terminating.clear();
        assert_eq!(m.synchronize(Instant::now(), None).unwrap().uid, "hog");
    }

    #[test]
    fn the_message_names_each_container_over_its_request_as_kubelet_does() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {initContainers: [{name: side, image: x, restartPolicy: Always}], containers: [{name: app, image: x, resources: {requests: {memory: 100Mi}}}, {name: small, image: x, resources: {requests: {memory: 1Gi}}}, {name: gone, image: x}]}",
        )
        .unwrap();
        let usage = [
            ("app".to_owned(), 150 << 20),
            ("small".to_owned(), 10 << 20),
            ("side".to_owned(), 3 << 20),
        ];
        assert_eq!(
            eviction_message(Resource::Memory, 100 << 20, 50 << 20, &p, &usage, None),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container side was using 3Mi, request is 0, has larger consumption of memory. \
             Container app was using 150Mi, request is 100Mi, has larger consumption of memory. "
        );
        // Inodes and pids are not broken down by container.
        assert_eq!(
            eviction_message(Resource::Inodes, 5, 1, &p, &usage, None),
            "The node was low on resource: inodes. Threshold quantity: 5, available: 1. "
        );
        // A pod with a pod-level memory request is named as a whole.
        let pl: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {resources: {requests: {memory: 100Mi}}, containers: [{name: app, image: x}]}",
        )
        .unwrap();
        assert_eq!(
            eviction_message(
                Resource::Memory,
                100 << 20,
                50 << 20,
                &pl,
                &usage,
                Some(150 << 20)
            ),
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Pod p was using 150Mi, request is 100Mi, has larger consumption of memory. "
        );
    }

    #[test]
    fn quantities_and_percentages_are_written_as_kubernetes_does() {
        assert_eq!(format_binary_si(100 << 20), "100Mi");
        assert_eq!(format_binary_si(38_092_800), "37200Ki");
        assert_eq!(format_binary_si(1000), "1000");
        assert_eq!(format_binary_si(0), "0");
        assert_eq!(format_percent(0.577), "57.7%");
        assert_eq!(format_percent(0.000_001), "0.0001%");
        assert_eq!(format_percent(0.1), "10%");
    }

    #[test]
    fn soft_threshold_waits_for_its_grace_and_uses_the_capped_pod_grace() {
        let node = FakeNode {
            available: 150 << 20,
            pods: vec![(pod("a", 60, None), 10 << 20, 0)],
            ..Default::default()
        };
        let mut m = manager(vec![threshold(100, 0), threshold(200, 30)], node);
        let t0 = Instant::now();
        assert!(m.synchronize(t0, None).is_none());
        assert!(m.synchronize(t0 + Duration::from_secs(29), None).is_none());
        let e = m.synchronize(t0 + Duration::from_secs(30), None).unwrap();
        assert_eq!(e.grace, 20, "min(evictionMaxPodGracePeriod 20, pod's 60)");
    }

    #[test]
    fn no_pressure_no_eviction_and_conditions_clear_after_the_transition_period() {
        let node = FakeNode {
            available: 50 << 20,
            ..Default::default()
        };
        let mut m = manager(vec![threshold(100, 0)], node);
        let t0 = Instant::now();
        assert!(m.synchronize(t0, None).is_none(), "nothing to evict");
        assert!(m.pressure.has("MemoryPressure"));
        m.node.available = 500 << 20;
        m.synchronize(t0 + Duration::from_secs(299), None);
        assert!(m.pressure.has("MemoryPressure"));
        m.synchronize(t0 + Duration::from_secs(300), None);
        assert!(!m.pressure.has("MemoryPressure"));
        assert!(!m.pressure.has("DiskPressure"));
    }

    /// Polls `f` until it holds or `within` (real time) has passed; a wait for another thread,
    /// not a fixed sleep.
    fn poll(within: Duration, f: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            std::thread::yield_now();
        }
        f()
    }

    /// Without a notifier (kernelMemcgNotification: false) the wake channel is closed: the loop
    /// must fall back to the period, not spin. On fake time: one pass at start, one per period.
    #[test]
    fn a_closed_wake_channel_leaves_the_periodic_check_only() {
        let passes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || passes.load(std::sync::atomic::Ordering::Relaxed);
        let node = FakeNode {
            passes: passes.clone(),
            available: 1 << 40,
            ..Default::default()
        };
        let clock = crate::clock::FakeClock::new(0);
        let m = manager(vec![threshold(100, 0)], node).with_clock(clock.shared());
        let (wake_tx, wake_rx) = crossbeam_channel::unbounded();
        drop(wake_tx);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let t = std::thread::spawn(move || m.run(wake_rx, stop_rx));
        // The first pass, and one more when the closed channel is found closed; then it waits.
        // Each wait sets a period timer, and the first wait's stays pending (until due) after
        // the loop left it: only a second timer shows that the loop waits again. Advancing
        // before that let the loop reckon its wait from the time before the advance, a period
        // too late (the test failed once so, with "2 passes").
        assert!(poll(Duration::from_secs(5), || count() == 2
            && clock.pending_timers() >= 2));
        clock.advance(Duration::from_secs(9));
        clock.advance(Duration::from_secs(1));
        assert!(
            poll(Duration::from_secs(5), || count() == 3),
            "{} passes",
            count()
        );
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(count(), 3, "then one pass per 10 s period, no spinning");
    }

    /// A notification whose pass finds the threshold not yet met (the kernel fires exactly at
    /// the armed bytes) is followed up until it is, and the eviction is timed from it.
    #[test]
    fn a_notification_just_before_the_threshold_is_followed_up() {
        let passes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || passes.load(std::sync::atomic::Ordering::Relaxed);
        let node = FakeNode {
            passes: passes.clone(),
            available: 200 << 20,
            drops_at: Some((5, 50 << 20)),
            pods: vec![(pod("hog", 30, None), 300 << 20, 0)],
            ..Default::default()
        };
        let clock = crate::clock::FakeClock::new(1_800_000_000_000_000_000);
        let m = manager(vec![threshold(100, 0)], node).with_clock(clock.shared());
        let pressure = m.pressure.clone();
        let (wake_tx, wake_rx) = crossbeam_channel::unbounded();
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let t = std::thread::spawn(move || m.run(wake_rx, stop_rx));
        assert!(poll(Duration::from_secs(5), || count() == 1));
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(clock.epoch_ns() as u64);
        wake_tx.send((at, "memory.available#0".into())).unwrap();
        // Follow-up passes every 10 ms of (fake) time, until the fifth pass finds it met.
        let mut steps = 0;
        while pressure.view().evictions.is_empty() {
            assert!(
                steps < 150,
                "no eviction after {steps} steps, {} passes",
                count()
            );
            let before = count();
            clock.advance(FOLLOW_UP_INTERVAL);
            poll(Duration::from_millis(200), || count() > before);
            steps += 1;
        }
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(count() >= 5);
        let v = pressure.view();
        assert_eq!(v.evictions.len(), 1);
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        assert_eq!(v.evictions[0].notified_at_unix_nanos, Some(nanos));
    }
}
