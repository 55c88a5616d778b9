//! Container garbage collection (kubelet's `kuberuntime_gc.go`, `containerGC`): which dead
//! containers and sandboxes of this node's pods go.
//!
//! kubelet's policy (`GCPolicy`, its flags' defaults): a dead container older than `min_age`
//! (0) may go; at most `max_per_pod_container` (1) dead instances are kept per (pod, container
//! name), the newest, which holds the container's last state for the pod's status and
//! `logs --previous`; at most `max_containers` dead containers on the node (-1: no cap).
//! Containers of a pod that no source wants any more all go, then its sandboxes; a pod that
//! still exists keeps its newest sandbox. Disk pressure removes every dead container
//! ([`ContainerGcPolicy::ALL_DEAD`], kubelet's `DeleteAllUnusedContainers`).
//!
//! Only this node's pods are touched (sandboxes labelled with its node name); a container is
//! never removed while it runs, and a sandbox never while it is ready or has containers left.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cri::api;
use crate::kuberuntime::labels;

/// kubelet's container GC policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// A dead container younger than this is kept (kubelet's `MinAge`,
    /// `--minimum-container-ttl-duration`, default 0).
    pub min_age: Duration,
    /// Dead instances kept per (pod, container name) (`MaxPerPodContainer`, default 1); a
    /// negative value keeps all.
    pub max_per_pod_container: i64,
    /// Dead containers kept on the node (`MaxContainers`, default -1: no cap).
    pub max_containers: i64,
}

impl ContainerGcPolicy {
    /// kubelet's defaults.
    pub const KUBELET: ContainerGcPolicy = ContainerGcPolicy {
        min_age: Duration::ZERO,
        max_per_pod_container: 1,
        max_containers: -1,
    };

    /// Every dead container goes (disk pressure's reclaim).
    pub const ALL_DEAD: ContainerGcPolicy = ContainerGcPolicy {
        min_age: Duration::ZERO,
        max_per_pod_container: 0,
        max_containers: 0,
    };
}

/// Why something is removed (the `reason` of `nodelet_containers_garbage_collected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Why {
    /// Beyond the policy's limits.
    Policy,
    /// Its pod is gone.
    DeletedPod,
}

impl Why {
    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Why::Policy => "policy",
            Why::DeletedPod => "deleted-pod",
        }
    }
}

/// A dead container to remove, with the log files that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadContainer {
    /// Its ID.
    pub id: String,
    /// Its pod's UID.
    pub pod_uid: String,
    /// Its log file (`<podLogsDir>/<ns>_<name>_<uid>/<container>/<restartCount>.log`), when its
    /// labels name it; rotated files beside it go too.
    pub log: Option<PathBuf>,
    /// Why it goes.
    pub why: Why,
}

/// What one pass removes, in order: the containers, then the sandboxes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Dead containers.
    pub containers: Vec<DeadContainer>,
    /// Sandboxes (ID, why): not ready, with no container left after the removals above.
    pub sandboxes: Vec<(String, Why)>,
}

/// One (pod, container name)'s dead instances, newest first (kubelet's `evictUnit`).
struct Unit<'a> {
    dead: Vec<&'a api::Container>,
}

/// The pods that exist, as housekeeping last saw them.
#[derive(Debug, Clone, Copy)]
pub struct Existing<'a> {
    /// The UIDs of the pods some source wants or a worker still handles.
    pub uids: &'a HashSet<String>,
    /// When that was seen (wall clock, nanoseconds since the epoch): a pod whose newest sandbox
    /// is younger may have come since (a pod is desired before its sandbox is made), and is not
    /// judged gone.
    pub as_of_ns: i64,
}

/// The pass over the runtime's full `sandboxes` and `containers` listings (label filters none)
/// at `now_ns` (wall clock, the runtime's `created_at` scale): this node's pods only (sandbox
/// label `nodelet.io/node-name` = `node_name`). A pod is gone when it is not in `existing` and
/// its sandboxes are older than that list; `existing` is `None` before every source has
/// reported, when no pod is gone (kubelet's `allSourcesReady`). `logs_dir`: `podLogsDir`.
pub fn plan(
    sandboxes: &[api::PodSandbox],
    containers: &[api::Container],
    node_name: &str,
    existing: Option<Existing>,
    policy: ContainerGcPolicy,
    now_ns: i64,
    logs_dir: &Path,
) -> Plan {
    let ours: HashMap<&str, &api::PodSandbox> = sandboxes
        .iter()
        .filter(|s| s.labels.get(labels::NODE_NAME).map(String::as_str) == Some(node_name))
        .map(|s| (s.id.as_str(), s))
        .collect();
    let mut newest: HashMap<&str, i64> = HashMap::new();
    for s in ours.values() {
        let uid = s.labels.get(labels::POD_UID).map_or("", String::as_str);
        let t = newest.entry(uid).or_insert(s.created_at);
        *t = (*t).max(s.created_at);
    }
    let gone = |uid: &str| {
        existing.is_some_and(|e| {
            !e.uids.contains(uid) && newest.get(uid).is_some_and(|t| *t < e.as_of_ns)
        })
    };
    let min_age_ns = crate::clock::duration_ns(policy.min_age);
    // Dead containers of our pods, grouped by (pod UID, container name).
    let mut units: HashMap<(&str, &str), Unit> = HashMap::new();
    for c in containers {
        let Some(sb) = ours.get(c.pod_sandbox_id.as_str()) else {
            continue;
        };
        if c.state == api::ContainerState::ContainerRunning as i32
            || now_ns.saturating_sub(c.created_at) < min_age_ns
        {
            continue;
        }
        let uid = sb.labels.get(labels::POD_UID).map_or("", String::as_str);
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        units
            .entry((uid, name))
            .or_insert_with(|| Unit { dead: Vec::new() })
            .dead
            .push(c);
    }
    for u in units.values_mut() {
        u.dead
            .sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    }
    let mut out = Plan::default();
    let mut removed: HashSet<&str> = HashSet::new();
    let remove = |c: &api::Container, why: Why, out: &mut Plan| {
        let sb = ours[c.pod_sandbox_id.as_str()];
        out.containers.push(DeadContainer {
            id: c.id.clone(),
            pod_uid: sb.labels.get(labels::POD_UID).cloned().unwrap_or_default(),
            log: log_path(logs_dir, sb, c),
            why,
        });
    };
    let mut keys: Vec<_> = units.keys().copied().collect();
    keys.sort();
    // Gone pods: every dead container.
    for key in &keys {
        if gone(key.0) {
            for c in units[key].dead.iter().copied() {
                removed.insert(&c.id);
                remove(c, Why::DeletedPod, &mut out);
            }
        }
    }
    // At most max_per_pod_container dead instances per unit.
    if policy.max_per_pod_container >= 0 {
        let keep = usize::try_from(policy.max_per_pod_container).unwrap_or(usize::MAX);
        for key in &keys {
            for c in units[key].dead.iter().skip(keep).copied() {
                if removed.insert(&c.id) {
                    remove(c, Why::Policy, &mut out);
                }
            }
        }
    }
    // At most max_containers on the node, oldest first.
    if policy.max_containers >= 0 {
        let mut left: Vec<&api::Container> = keys
            .iter()
            .flat_map(|k| units[k].dead.iter().copied())
            .filter(|c| !removed.contains(c.id.as_str()))
            .collect();
        let cap = usize::try_from(policy.max_containers).unwrap_or(usize::MAX);
        if left.len() > cap {
            left.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
            let excess = left.len() - cap;
            for c in left.into_iter().take(excess) {
                removed.insert(&c.id);
                remove(c, Why::Policy, &mut out);
            }
        }
    }
    out.sandboxes = sandboxes_to_remove(&ours, containers, &removed, &gone);
    out
}

/// Sandboxes that are not ready and hold no container once `removed` are gone: all of a gone
/// pod's, and of a pod that exists all but its newest (kubelet's `evictSandboxes`).
fn sandboxes_to_remove(
    ours: &HashMap<&str, &api::PodSandbox>,
    containers: &[api::Container],
    removed: &HashSet<&str>,
    gone: &impl Fn(&str) -> bool,
) -> Vec<(String, Why)> {
    let occupied: HashSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(c.id.as_str()))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let mut by_pod: HashMap<&str, Vec<&api::PodSandbox>> = HashMap::new();
    for s in ours.values() {
        let uid = s.labels.get(labels::POD_UID).map_or("", String::as_str);
        by_pod.entry(uid).or_default().push(s);
    }
    let mut out = Vec::new();
    let mut uids: Vec<&str> = by_pod.keys().copied().collect();
    uids.sort();
    for uid in uids {
        let mut list = by_pod[uid].clone();
        list.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        let (skip, why) = if gone(uid) {
            (0, Why::DeletedPod)
        } else {
            (1, Why::Policy)
        };
        for s in list.into_iter().skip(skip) {
            let ready = s.state == api::PodSandboxState::SandboxReady as i32;
            if !ready && !occupied.contains(s.id.as_str()) {
                out.push((s.id.clone(), why));
            }
        }
    }
    out
}

/// A container's log file from its sandbox's labels and its own name label and restart count
/// annotation (else its attempt), kubelet's layout
/// (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restartCount>.log`); `None` when a
/// label is missing or a name could leave the directory.
fn log_path(logs_dir: &Path, sb: &api::PodSandbox, c: &api::Container) -> Option<PathBuf> {
    let get = |l: &std::collections::HashMap<String, String>, k: &str| l.get(k).cloned();
    let pod = format!(
        "{}_{}_{}",
        get(&sb.labels, labels::POD_NAMESPACE)?,
        get(&sb.labels, labels::POD_NAME)?,
        get(&sb.labels, labels::POD_UID)?
    );
    let name = get(&c.labels, labels::CONTAINER_NAME)?;
    // kubelet keeps the restart count in an annotation; the attempt carries it too.
    let restarts: u32 = match get(&c.annotations, labels::CONTAINER_RESTART_COUNT) {
        Some(v) => v.parse().ok()?,
        None => c.metadata.as_ref()?.attempt,
    };
    let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
    (safe(&pod) && safe(&name)).then(|| {
        logs_dir
            .join(pod)
            .join(name)
            .join(format!("{restarts}.log"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, uid: &str, node: &str, ready: bool, created: i64) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            state: if ready {
                api::PodSandboxState::SandboxReady as i32
            } else {
                api::PodSandboxState::SandboxNotready as i32
            },
            created_at: created,
            labels: [
                (labels::POD_UID, uid),
                (labels::POD_NAME, "web"),
                (labels::POD_NAMESPACE, "default"),
                (labels::NODE_NAME, node),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        }
    }

    fn container(id: &str, sb: &str, name: &str, running: bool, created: i64) -> api::Container {
        api::Container {
            id: id.into(),
            pod_sandbox_id: sb.into(),
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: if running {
                api::ContainerState::ContainerRunning as i32
            } else {
                api::ContainerState::ContainerExited as i32
            },
            created_at: created,
            labels: [(labels::CONTAINER_NAME.to_string(), name.to_string())].into(),
            annotations: [(
                labels::CONTAINER_RESTART_COUNT.to_string(),
                created.to_string(),
            )]
            .into(),
            ..Default::default()
        }
    }

    /// The plan at time 10 for node `n`, with `existing` as seen at `as_of_ns`.
    fn at(
        sbs: &[api::PodSandbox],
        cs: &[api::Container],
        existing: &HashSet<String>,
        as_of_ns: i64,
        policy: ContainerGcPolicy,
        logs: &Path,
    ) -> Plan {
        let seen = Existing {
            uids: existing,
            as_of_ns,
        };
        plan(sbs, cs, "n", Some(seen), policy, 10, logs)
    }

    fn ids(p: &Plan) -> (Vec<&str>, Vec<&str>) {
        (
            p.containers.iter().map(|c| c.id.as_str()).collect(),
            p.sandboxes.iter().map(|s| s.0.as_str()).collect(),
        )
    }

    #[test]
    fn one_dead_instance_is_kept_per_container_and_a_running_one_never_goes() {
        let sbs = [sandbox("s1", "u1", "n", true, 1)];
        let cs = [
            container("a1", "s1", "a", false, 1),
            container("a2", "s1", "a", false, 2),
            container("a3", "s1", "a", false, 3),
            container("a4", "s1", "a", true, 4),
            container("b1", "s1", "b", false, 1),
        ];
        let existing: HashSet<String> = ["u1".into()].into();
        let logs = Path::new("/logs");
        let p = at(&sbs, &cs, &existing, 10, ContainerGcPolicy::KUBELET, logs);
        assert_eq!(ids(&p), (vec!["a2", "a1"], vec![]));
        assert_eq!(
            p.containers[0].log.as_deref(),
            Some(Path::new("/logs/default_web_u1/a/2.log"))
        );
        // Disk pressure: every dead one.
        let p = at(&sbs, &cs, &existing, 10, ContainerGcPolicy::ALL_DEAD, logs);
        assert_eq!(ids(&p).0.len(), 4);
        // Too young for min_age.
        let young = ContainerGcPolicy {
            min_age: Duration::from_secs(1),
            ..ContainerGcPolicy::KUBELET
        };
        assert!(at(&sbs, &cs, &existing, 10, young, logs)
            .containers
            .is_empty());
    }

    #[test]
    fn a_gone_pod_loses_all_its_dead_containers_and_sandboxes_others_are_untouched() {
        let sbs = [
            sandbox("s1", "gone", "n", false, 1),
            sandbox("s2", "gone", "n", false, 2),
            sandbox("s3", "kept", "n", false, 1),
            sandbox("s4", "kept", "n", true, 2),
            sandbox("s5", "other", "elsewhere", false, 1),
        ];
        let cs = [
            container("g1", "s2", "a", false, 1),
            container("k1", "s3", "a", false, 1),
            container("o1", "s5", "a", false, 1),
        ];
        let existing: HashSet<String> = ["kept".into()].into();
        let logs = Path::new("/logs");
        let p = at(&sbs, &cs, &existing, 10, ContainerGcPolicy::KUBELET, logs);
        // kept: its old sandbox s3 still holds k1 (the dead instance kept).
        assert_eq!(ids(&p), (vec!["g1"], vec!["s2", "s1"]));
        assert_eq!(p.sandboxes[0].1, Why::DeletedPod);
        // A pod newer than the list of existing pods is not judged by it.
        let p = at(&sbs, &cs, &existing, 2, ContainerGcPolicy::KUBELET, logs);
        assert_eq!(ids(&p), (vec![], vec!["s1"]));
        // Before every source reported, no pod is gone.
        let p = plan(&sbs, &cs, "n", None, ContainerGcPolicy::KUBELET, 10, logs);
        assert_eq!(ids(&p), (vec![], vec!["s1"]));
    }

    #[test]
    fn the_node_cap_takes_the_oldest() {
        let sbs = [sandbox("s1", "u1", "n", true, 1)];
        let cs = [
            container("a1", "s1", "a", false, 1),
            container("b1", "s1", "b", false, 2),
            container("c1", "s1", "c", false, 3),
        ];
        let cap = ContainerGcPolicy {
            max_containers: 1,
            ..ContainerGcPolicy::KUBELET
        };
        let existing: HashSet<String> = ["u1".into()].into();
        let p = at(&sbs, &cs, &existing, 10, cap, Path::new("/l"));
        assert_eq!(ids(&p).0, ["a1", "b1"]);
    }
}
