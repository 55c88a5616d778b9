//! Node registration and node status (kubelet's `registerWithAPIServer`, `syncNodeStatus` and
//! the setters of `pkg/kubelet/nodestatus`).
//!
//! At start the agent creates its Node object: name, kubelet's labels (`kubernetes.io/hostname`,
//! `kubernetes.io/os`, `kubernetes.io/arch`, their `beta.` spellings and `--node-labels`), and a
//! status with capacity and allocatable from the container manager (cpu, memory, pods), the
//! InternalIP and Hostname addresses, nodeInfo, and the conditions MemoryPressure, DiskPressure,
//! PIDPressure (from the eviction manager) and Ready (from the runtime's health). A Node that
//! exists already (the agent restarted) is taken over. Registration is retried with back-off
//! ([`REGISTER_RETRY_INITIAL`] doubling to [`REGISTER_RETRY_MAX`], kubelet's) while the apiserver
//! cannot be reached or refuses; the refusal is logged once.
//!
//! Then every [`NODE_STATUS_UPDATE_FREQUENCY`] the Node is read (one deleted by hand is
//! registered again, with a new UID for the Lease and mirror pods to be owned by), and the status
//! is computed again and posted (a merge patch of the status subresource) when it changed,
//! heartbeat times aside, when another writer changed the Node's status since this agent's last
//! post ([`drifted`]: kubelet works on the Node it reads, so a hand-edited condition or boot ID
//! is put right within a round), or when [`NODE_STATUS_REPORT_FREQUENCY`] has passed since the
//! last post. A condition keeps the `lastTransitionTime` of the Node read while its status stays
//! the same.
//!
//! Events on the Node, as kubelet's status setters record them: at registration one for each
//! pressure condition (`NodeHasSufficientMemory`, …), then one for each condition whose status
//! a post changed (`NodeReady`, `NodeNotReady`, `NodeHasDiskPressure`, …:
//! [`condition_events`]), and `Rebooted` when the Node taken over was posted from another boot
//! ([`rebooted`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::{info, warn};

use crate::cm::resources::NodeResources;
use crate::eviction::PressureView;

/// How often the status is computed and compared (kubelet's `nodeStatusUpdateFrequency`).
pub const NODE_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// Longest time between two posts of an unchanged status (kubelet's
/// `nodeStatusReportFrequency`).
pub const NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
/// First delay before registration is tried again (kubelet: 100 ms).
pub const REGISTER_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between registration attempts (kubelet: 7 s).
pub const REGISTER_RETRY_MAX: Duration = Duration::from_secs(7);

/// What the agent knows of its node, fixed at start.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    /// The node name.
    pub name: String,
    /// The InternalIP address.
    pub ip: String,
    /// The machine's hostname (the Hostname address).
    pub hostname: String,
    /// kubelet's labels and `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// The machine's capacity (cpu millicores, memory bytes).
    pub capacity: NodeResources,
    /// Capacity less systemReserved and kubeReserved.
    pub allocatable: NodeResources,
    /// `maxPods`.
    pub max_pods: usize,
    /// nodeInfo.
    pub info: NodeSystemInfo,
    /// The node API's port (`daemonEndpoints.kubeletEndpoint.Port`, where the API server
    /// proxies logs, exec and port-forward); 0 when it is off.
    pub api_port: u16,
}

/// nodeInfo of this machine (kubelet's `MachineInfo` and `VersionInfo` setters): machine ID,
/// boot ID, kernel, OS image, architecture, `runtime_version` (`containerd://<version>`, from
/// CRI Version) and nodelet's own version as the kubelet version.
pub fn system_info(runtime_version: &str) -> NodeSystemInfo {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let os_image = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".into());
    NodeSystemInfo {
        architecture: crate::admission::node_affinity::go_arch().into(),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        container_runtime_version: runtime_version.into(),
        kernel_version: read("/proc/sys/kernel/osrelease"),
        kube_proxy_version: String::new(),
        kubelet_version: format!("v{}-nodelet", env!("CARGO_PKG_VERSION")),
        machine_id: read("/etc/machine-id"),
        operating_system: "linux".into(),
        os_image,
        system_uuid: read("/sys/class/dmi/id/product_uuid"),
        ..Default::default()
    }
}

/// A cpu amount as the API spells it: whole cpus (`"2"`) or millicores (`"1500m"`).
pub fn cpu_quantity(milli: i64) -> Quantity {
    Quantity(if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    })
}

/// A byte amount as kubelet reports memory: in `Ki` when whole kibibytes.
pub fn bytes_quantity(bytes: i64) -> Quantity {
    Quantity(if bytes % 1024 == 0 {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    })
}

fn resources(r: NodeResources, max_pods: usize) -> BTreeMap<String, Quantity> {
    [
        ("cpu".to_string(), cpu_quantity(r.cpu_milli)),
        ("memory".to_string(), bytes_quantity(r.memory)),
        ("pods".to_string(), Quantity(max_pods.to_string())),
    ]
    .into()
}

/// The pressure conditions (from the eviction manager's `view`) and Ready (from the runtime's
/// `health`), with kubelet's reasons and messages. A condition whose status is the same as in
/// `previous` keeps its `lastTransitionTime`; every one gets `now` as its heartbeat.
pub fn conditions(
    view: &PressureView,
    health: Result<(), String>,
    now: &Time,
    previous: &[NodeCondition],
) -> Vec<NodeCondition> {
    let pressure = |kind: &str, on_reason: &str, off_reason: &str, on_msg: &str, off_msg: &str| {
        let on = view.conditions.get(kind).copied().unwrap_or(false);
        (
            kind.to_owned(),
            on,
            if on { on_reason } else { off_reason }.to_owned(),
            if on { on_msg } else { off_msg }.to_owned(),
        )
    };
    let mut all = vec![
        pressure(
            "MemoryPressure",
            "KubeletHasInsufficientMemory",
            "KubeletHasSufficientMemory",
            "kubelet has insufficient memory available",
            "kubelet has sufficient memory available",
        ),
        pressure(
            "DiskPressure",
            "KubeletHasDiskPressure",
            "KubeletHasNoDiskPressure",
            "kubelet has disk pressure",
            "kubelet has no disk pressure",
        ),
        pressure(
            "PIDPressure",
            "KubeletHasInsufficientPID",
            "KubeletHasSufficientPID",
            "kubelet has insufficient PID available",
            "kubelet has sufficient PID available",
        ),
    ];
    // Pressure conditions are "True" when bad; Ready is "True" when good.
    all.push(match health {
        Ok(()) => (
            "Ready".into(),
            true,
            "KubeletReady".into(),
            "kubelet is posting ready status".into(),
        ),
        Err(e) => ("Ready".into(), false, "KubeletNotReady".into(), e),
    });
    all.into_iter()
        .map(|(kind, on, reason, message)| {
            let status = if on { "True" } else { "False" }.to_owned();
            let transition = previous
                .iter()
                .find(|c| c.type_ == kind && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            NodeCondition {
                type_: kind,
                status,
                reason: Some(reason),
                message: Some(message),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// kubelet's node events for the conditions `new` against `previous` (the condition setters of
/// `pkg/kubelet/nodestatus`), by reason, in `new`'s order: a pressure condition that `previous`
/// lacks or held with another status is `NodeHasSufficientMemory` / `NodeHasInsufficientMemory`,
/// `NodeHasNoDiskPressure` / `NodeHasDiskPressure`, `NodeHasSufficientPID` /
/// `NodeHasInsufficientPID`; Ready only when `previous` held it with another status
/// (`NodeReady` / `NodeNotReady`: a new Ready condition is set without an event). Each is
/// recorded as `Node <name> status is now: <reason>`.
pub fn condition_events(previous: &[NodeCondition], new: &[NodeCondition]) -> Vec<&'static str> {
    new.iter()
        .filter_map(|c| {
            let before = previous.iter().find(|p| p.type_ == c.type_);
            if before.is_some_and(|p| p.status == c.status) {
                return None;
            }
            let on = c.status == "True";
            match c.type_.as_str() {
                "MemoryPressure" => Some(if on {
                    "NodeHasInsufficientMemory"
                } else {
                    "NodeHasSufficientMemory"
                }),
                "DiskPressure" => Some(if on {
                    "NodeHasDiskPressure"
                } else {
                    "NodeHasNoDiskPressure"
                }),
                "PIDPressure" => Some(if on {
                    "NodeHasInsufficientPID"
                } else {
                    "NodeHasSufficientPID"
                }),
                "Ready" if before.is_some() => Some(if on { "NodeReady" } else { "NodeNotReady" }),
                _ => None,
            }
        })
        .collect()
}

/// kubelet's Warning event `Rebooted` when the Node taken over was posted from another boot
/// (its `nodeInfo.bootID` set and not `boot_id`; the nodeInfo setter): the message
/// `Node <name> has been rebooted, boot id: <boot_id>`.
pub fn rebooted(old: Option<&Node>, name: &str, boot_id: &str) -> Option<String> {
    let before = old?.status.as_ref()?.node_info.as_ref()?.boot_id.as_str();
    (!before.is_empty() && before != boot_id)
        .then(|| format!("Node {name} has been rebooted, boot id: {boot_id}"))
}

/// The node's status from `facts` and `conditions`.
pub fn node_status(facts: &NodeFacts, conditions: Vec<NodeCondition>) -> NodeStatus {
    NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: facts.ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: facts.hostname.clone(),
            },
        ]),
        capacity: Some(resources(facts.capacity, facts.max_pods)),
        allocatable: Some(resources(facts.allocatable, facts.max_pods)),
        conditions: Some(conditions),
        node_info: Some(facts.info.clone()),
        daemon_endpoints: Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
            kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                port: i32::from(facts.api_port),
            }),
        }),
        ..Default::default()
    }
}

/// The Node object registered for `facts`.
pub fn node_object(facts: &NodeFacts, status: NodeStatus) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(facts.name.clone());
    node.metadata.labels = Some(facts.labels.clone());
    node.status = Some(status);
    node
}

/// `status` with every condition's heartbeat removed: what "changed" compares.
fn without_heartbeats(status: &NodeStatus) -> NodeStatus {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    s
}

/// Whether `new` must be posted at `now`, the last post being `last` (status and when):
/// nothing posted yet, a change besides heartbeat times, or [`NODE_STATUS_REPORT_FREQUENCY`]
/// passed (kubelet's `tryUpdateNodeStatus` decision).
pub fn post_due(last: Option<&(NodeStatus, Instant)>, new: &NodeStatus, now: Instant) -> bool {
    match last {
        None => true,
        Some((old, at)) => {
            now.saturating_duration_since(*at) >= NODE_STATUS_REPORT_FREQUENCY
                || without_heartbeats(old) != without_heartbeats(new)
        }
    }
}

/// Whether another writer changed the Node's status: the status `held` (as just read) differs,
/// heartbeat times aside, from `stored` (as the API server answered this agent's last write).
/// Unknown (either missing): no.
pub fn drifted(held: Option<&NodeStatus>, stored: Option<&NodeStatus>) -> bool {
    match (held, stored) {
        (Some(h), Some(s)) => without_heartbeats(h) != without_heartbeats(s),
        _ => false,
    }
}

/// What the status loop reads each round.
pub struct StatusInputs {
    /// The eviction manager's pressure.
    pub pressure: crate::eviction::NodePressure,
    /// The runtime's health.
    pub runtime: crate::runtime_state::RuntimeState,
}

/// Registers the node (retrying until it succeeds), sends its UID on `registered`, then keeps
/// its status posted. Runs until the task is dropped.
pub async fn run(
    client: kube::Client,
    facts: NodeFacts,
    inputs: StatusInputs,
    registered: tokio::sync::watch::Sender<Option<String>>,
    recorder: crate::events::Recorder,
) {
    let nodes: Api<Node> = Api::all(client);
    let record = |previous: &[NodeCondition], status: &NodeStatus| {
        for reason in condition_events(previous, status.conditions.as_deref().unwrap_or_default()) {
            recorder.normal(
                "node",
                reason,
                format!("Node {} status is now: {reason}", facts.name),
            );
        }
    };
    // At registration, as kubelet's `initialNode`: the pressure conditions are new, Ready is
    // compared with the Node taken over (if any), and a Node from another boot is reported.
    let registered_with = |status: &NodeStatus, old: Option<&Node>| {
        let ready: Vec<NodeCondition> = old
            .and_then(|n| n.status.as_ref()?.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ == "Ready")
            .collect();
        record(&ready, status);
        if let Some(message) = rebooted(old, &facts.name, &facts.info.boot_id) {
            recorder.warning("node", "Rebooted", message);
        }
    };
    let status_now = |previous: &[NodeCondition]| {
        let now = crate::pod::api_time(crate::clock::wall_now());
        let conds = conditions(
            &inputs.pressure.view(),
            inputs.runtime.ready(),
            &now,
            previous,
        );
        node_status(&facts, conds)
    };
    let mut delay = REGISTER_RETRY_INITIAL;
    let mut reported: Option<String> = None;
    // `stored`: the status as the API server holds it after this agent's last write; another
    // writer's change shows as a difference from it.
    let (uid, mut last, mut stored) = loop {
        let status = status_now(&[]);
        match register(&nodes, &facts, status.clone()).await {
            Ok(r) => {
                info!(node = %facts.name, uid = %r.uid, "node registered with the API server");
                registered_with(&status, r.before.as_ref());
                break (
                    r.uid,
                    Some((status, crate::clock::monotonic_now())),
                    r.stored,
                );
            }
            Err(e) => {
                let msg = e.to_string();
                if reported.as_deref() != Some(msg.as_str()) {
                    warn!(node = %facts.name, error = %msg, "unable to register node with the API server; retrying");
                    reported = Some(msg);
                }
                crate::clock::sleep(delay).await;
                delay = (delay * 2).min(REGISTER_RETRY_MAX);
            }
        }
    };
    let _ = registered.send(Some(uid));
    // The conditions last told in events, when the Node cannot be read: a post's events are
    // its changes against them.
    let mut told: Vec<NodeCondition> = last
        .as_ref()
        .and_then(|(s, _)| s.conditions.clone())
        .unwrap_or_default();
    let mut tick = tokio::time::interval(NODE_STATUS_UPDATE_FREQUENCY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut failing = false;
    loop {
        tick.tick().await;
        let read = match nodes.get_opt(&facts.name).await {
            Ok(Some(node)) => Some(node),
            // The Node deleted by hand: registered again (kubelet 1.20 only logs the error at
            // every round; the Lease and mirror pods need their owner back).
            Ok(None) => {
                warn!(node = %facts.name, "the Node object is gone; registering again");
                let status = status_now(&[]);
                match register(&nodes, &facts, status.clone()).await {
                    Ok(r) => {
                        info!(node = %facts.name, uid = %r.uid, "node registered with the API server");
                        registered_with(&status, r.before.as_ref());
                        told = status.conditions.clone().unwrap_or_default();
                        let _ = registered.send(Some(r.uid));
                        last = None;
                        stored = r.stored;
                    }
                    Err(e) => {
                        warn!(node = %facts.name, error = %e, "unable to register node with the API server; retrying")
                    }
                }
                continue;
            }
            Err(_) => None,
        };
        // As kubelet's `tryUpdateNodeStatus`, the round works on the Node it read: conditions
        // keep its transition times and are told against its statuses, and what another
        // writer changed (a condition, the boot ID) is put right in this round.
        let held = read.as_ref().and_then(|n| n.status.as_ref());
        let previous = held
            .and_then(|s| s.conditions.clone())
            .or_else(|| last.as_ref().and_then(|(s, _)| s.conditions.clone()))
            .unwrap_or_default();
        let status = status_now(&previous);
        let changed_by_others = drifted(held, stored.as_ref());
        if !changed_by_others && !post_due(last.as_ref(), &status, crate::clock::monotonic_now()) {
            continue;
        }
        if let Some(message) = rebooted(read.as_ref(), &facts.name, &facts.info.boot_id) {
            recorder.warning("node", "Rebooted", message);
        }
        let patch = serde_json::json!({ "status": status });
        match nodes
            .patch_status(&facts.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(n) => {
                if failing {
                    info!(node = %facts.name, "node status posted again");
                    failing = false;
                }
                if held.is_some() {
                    told = previous;
                }
                record(&told, &status);
                told = status.conditions.clone().unwrap_or_default();
                last = Some((status, crate::clock::monotonic_now()));
                stored = n.status;
            }
            Err(e) => {
                if !failing {
                    warn!(node = %facts.name, error = %e, "error updating node status; will retry");
                    failing = true;
                }
            }
        }
    }
}

/// A Node registered by [`register`].
struct Registered {
    /// Its UID.
    uid: String,
    /// The Node as it was before its status was replaced, when it existed.
    before: Option<Node>,
    /// Its status as the API server answered.
    stored: Option<NodeStatus>,
}

/// Creates the Node, or takes over the one that exists (its labels and status replaced).
async fn register(
    nodes: &Api<Node>,
    facts: &NodeFacts,
    status: NodeStatus,
) -> Result<Registered, kube::Error> {
    let node = node_object(facts, status.clone());
    match nodes.create(&PostParams::default(), &node).await {
        Ok(n) => Ok(Registered {
            uid: n.metadata.uid.unwrap_or_default(),
            before: None,
            stored: n.status,
        }),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let patch = serde_json::json!({ "metadata": { "labels": facts.labels } });
            // The labels' patch answers with the status still the old one.
            let old = nodes
                .patch(&facts.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let n = nodes
                .patch_status(
                    &facts.name,
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({ "status": status })),
                )
                .await?;
            Ok(Registered {
                uid: n.metadata.uid.unwrap_or_default(),
                before: Some(old),
                stored: n.status,
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: kind.into(),
            status: status.into(),
            ..Default::default()
        }
    }

    #[test]
    fn node_events_are_recorded_for_new_pressure_conditions_and_for_changes() {
        let healthy = [
            condition("MemoryPressure", "False"),
            condition("DiskPressure", "False"),
            condition("PIDPressure", "False"),
            condition("Ready", "True"),
        ];
        // Registration: the pressure conditions are new; a new Ready has no event.
        assert_eq!(
            condition_events(&[], &healthy),
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID"
            ]
        );
        // Nothing changed: nothing recorded.
        assert!(condition_events(&healthy, &healthy).is_empty());
        // Each change, both ways.
        let mut bad = healthy.clone();
        for c in &mut bad {
            c.status = if c.status == "True" { "False" } else { "True" }.into();
        }
        assert_eq!(
            condition_events(&healthy, &bad),
            [
                "NodeHasInsufficientMemory",
                "NodeHasDiskPressure",
                "NodeHasInsufficientPID",
                "NodeNotReady"
            ]
        );
        assert_eq!(
            condition_events(&bad, &healthy),
            [
                "NodeHasSufficientMemory",
                "NodeHasNoDiskPressure",
                "NodeHasSufficientPID",
                "NodeReady"
            ]
        );
        // A Node taken over that was not ready: only Ready compared at registration.
        assert_eq!(
            condition_events(&[condition("Ready", "False")], &healthy[3..]),
            ["NodeReady"]
        );
    }

    #[test]
    fn a_status_changed_by_another_writer_is_told_from_our_own_heartbeats() {
        let ours = NodeStatus {
            conditions: Some(vec![NodeCondition {
                last_heartbeat_time: Some(t(10)),
                ..condition("Ready", "True")
            }]),
            ..Default::default()
        };
        let mut later = ours.clone();
        later.conditions.as_mut().unwrap()[0].last_heartbeat_time = Some(t(20));
        assert!(!drifted(Some(&later), Some(&ours)), "a heartbeat only");
        let mut edited = ours.clone();
        edited.conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(drifted(Some(&edited), Some(&ours)), "a condition edited");
        let mut rebooted = ours.clone();
        rebooted.node_info = Some(NodeSystemInfo {
            boot_id: "x".into(),
            ..Default::default()
        });
        assert!(drifted(Some(&rebooted), Some(&ours)), "the boot ID edited");
        assert!(!drifted(None, Some(&ours)), "the Node could not be read");
        assert!(!drifted(Some(&ours), None), "nothing stored yet");
    }

    #[test]
    fn a_node_posted_from_another_boot_is_reported_rebooted() {
        let node = |boot: &str| Node {
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    boot_id: boot.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            rebooted(Some(&node("b1")), "n1", "b2").as_deref(),
            Some("Node n1 has been rebooted, boot id: b2")
        );
        assert_eq!(rebooted(Some(&node("b2")), "n1", "b2"), None, "same boot");
        assert_eq!(rebooted(Some(&node("")), "n1", "b2"), None, "never posted");
        assert_eq!(rebooted(None, "n1", "b2"), None, "a new Node");
    }

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn facts() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            ip: "10.0.0.5".into(),
            hostname: "h1".into(),
            labels: [("kubernetes.io/hostname".to_string(), "n1".to_string())].into(),
            capacity: NodeResources {
                cpu_milli: 2000,
                memory: 8 << 30,
                pids: 0,
            },
            allocatable: NodeResources {
                cpu_milli: 1900,
                memory: (8 << 30) - 100 * 1_000_000,
                pids: 0,
            },
            max_pods: 110,
            info: NodeSystemInfo::default(),
            api_port: 10250,
        }
    }

    #[test]
    fn capacity_and_allocatable_are_spelled_as_kubelet_spells_them() {
        let s = node_status(&facts(), vec![]);
        let cap = s.capacity.unwrap();
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "8388608Ki");
        assert_eq!(cap["pods"].0, "110");
        let alloc = s.allocatable.unwrap();
        assert_eq!(alloc["cpu"].0, "1900m");
        assert_eq!(alloc["memory"].0, "8489934592");
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays() {
        let mut view = PressureView::default();
        let first = conditions(&view, Ok(()), &t(100), &[]);
        let ready = |cs: &[NodeCondition]| cs.iter().find(|c| c.type_ == "Ready").cloned().unwrap();
        assert_eq!(ready(&first).status, "True");
        let second = conditions(&view, Ok(()), &t(110), &first);
        assert_eq!(ready(&second).last_transition_time, Some(t(100)));
        assert_eq!(ready(&second).last_heartbeat_time, Some(t(110)));
        let down = conditions(&view, Err("runtime down".into()), &t(120), &second);
        assert_eq!(ready(&down).status, "False");
        assert_eq!(ready(&down).reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(ready(&down).last_transition_time, Some(t(120)));
        view.conditions.insert("MemoryPressure".into(), true);
        let mem = conditions(&view, Ok(()), &t(130), &down);
        let m = mem.iter().find(|c| c.type_ == "MemoryPressure").unwrap();
        assert_eq!(m.status, "True");
        assert_eq!(m.reason.as_deref(), Some("KubeletHasInsufficientMemory"));
    }

    #[test]
    fn status_is_posted_on_change_or_every_report_period() {
        let f = facts();
        let view = PressureView::default();
        let t0 = Instant::now();
        let a = node_status(&f, conditions(&view, Ok(()), &t(100), &[]));
        assert!(post_due(None, &a, t0), "nothing posted yet");
        let last = (a.clone(), t0);
        let b = node_status(
            &f,
            conditions(&view, Ok(()), &t(110), a.conditions.as_ref().unwrap()),
        );
        assert!(
            !post_due(Some(&last), &b, t0 + Duration::from_secs(10)),
            "only heartbeats differ"
        );
        assert!(post_due(Some(&last), &b, t0 + NODE_STATUS_REPORT_FREQUENCY));
        let c = node_status(&f, conditions(&view, Err("down".into()), &t(120), &[]));
        assert!(
            post_due(Some(&last), &c, t0 + Duration::from_secs(20)),
            "Ready changed"
        );
    }
}
