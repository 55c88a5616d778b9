//! Network counters of the node and of each pod's network namespace (what kubelet's summary
//! takes from cAdvisor: `/proc/<pid>/net/dev` of a process in the pod, the host's own for the
//! node), read through procfs on demand.
//!
//! A pod's process is found in its pod cgroup (`cgroup.procs` of the pod cgroup or of a
//! container cgroup below it, through cgroups-rs): every container of a pod shares the sandbox's
//! network namespace, so any one of them will do. Interfaces cAdvisor leaves out are left out
//! here too (`lo`, `veth*`, `docker*`, `nerdctl*`); the top-level figures of a `NetworkStats`
//! are those of `eth0` (kubelet's `DefaultInterfaceName`).

use std::collections::HashMap;
use std::path::Path;

use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::Controller;
use procfs::net::DeviceStatus;
use serde_json::{json, Value};

/// The interface whose figures stand at the top of a `NetworkStats` (kubelet's
/// `network.DefaultInterfaceName`).
pub const DEFAULT_INTERFACE: &str = "eth0";

/// Name prefixes of interfaces cAdvisor does not report (its `ignoredDevicePrefixes`).
const IGNORED_PREFIXES: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];

/// One interface's counters (`InterfaceStats`): bytes and errors each way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The interface's name in its namespace.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Transmit errors.
    pub tx_errors: u64,
}

/// The reported interfaces of a `/proc/net/dev` reading, by name.
fn interfaces(devs: HashMap<String, DeviceStatus>) -> Vec<Interface> {
    let mut out: Vec<Interface> = devs
        .into_values()
        .filter(|d| !IGNORED_PREFIXES.iter().any(|p| d.name.starts_with(p)))
        .map(|d| Interface {
            name: d.name,
            rx_bytes: d.recv_bytes,
            rx_errors: d.recv_errs,
            tx_bytes: d.sent_bytes,
            tx_errors: d.sent_errs,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The node's interfaces (the agent's network namespace, the host's); `None` when
/// `/proc/net/dev` cannot be read.
pub fn node() -> Option<Vec<Interface>> {
    procfs::net::dev_status().ok().map(interfaces)
}

/// The interfaces of the network namespace of process `pid`; `None` when it is gone.
pub fn of_process(pid: i32) -> Option<Vec<Interface>> {
    procfs::process::Process::new(pid)
        .ok()?
        .dev_status()
        .ok()
        .map(interfaces)
}

/// A process in the cgroup `dir` (of the v1 hierarchy or the v2 tree mounted at `root`) or in
/// one of its child cgroups (a pod's processes sit in its containers' cgroups).
pub fn process_in(dir: &Path, root: &Path, v2: bool) -> Option<i32> {
    let first = |d: &Path| {
        MemController::new(d.to_path_buf(), root.to_path_buf(), v2)
            .procs()
            .into_iter()
            .find_map(|p| i32::try_from(p.pid).ok().filter(|p| *p > 0))
    };
    first(dir).or_else(|| {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .find_map(|e| first(&e.path()))
    })
}

/// `NetworkStats` of the summary at `time` (RFC 3339): [`DEFAULT_INTERFACE`]'s figures at the
/// top, every interface under `interfaces`.
pub fn to_json(ifaces: &[Interface], time: &str) -> Value {
    let one = |i: &Interface| {
        json!({
            "name": i.name,
            "rxBytes": i.rx_bytes,
            "rxErrors": i.rx_errors,
            "txBytes": i.tx_bytes,
            "txErrors": i.tx_errors,
        })
    };
    let mut out = match ifaces.iter().find(|i| i.name == DEFAULT_INTERFACE) {
        Some(d) => one(d),
        None => json!({}),
    };
    out["time"] = json!(time);
    out["interfaces"] = Value::Array(ifaces.iter().map(one).collect());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_interface_is_on_top_and_ignored_ones_are_left_out() {
        let own = procfs::process::Process::myself().unwrap().pid;
        let mine = of_process(own).expect("this process's namespace");
        assert!(mine.iter().all(|i| i.name != "lo"), "{mine:?}");
        let ifaces = vec![
            Interface {
                name: "eth0".into(),
                rx_bytes: 10,
                rx_errors: 1,
                tx_bytes: 20,
                tx_errors: 2,
            },
            Interface {
                name: "net1".into(),
                rx_bytes: 5,
                rx_errors: 0,
                tx_bytes: 6,
                tx_errors: 0,
            },
        ];
        let v = to_json(&ifaces, "t");
        assert_eq!(v["name"], "eth0");
        assert_eq!(v["rxBytes"], 10);
        assert_eq!(v["txErrors"], 2);
        assert_eq!(v["interfaces"].as_array().unwrap().len(), 2);
        let no_eth0 = to_json(&ifaces[1..], "t");
        assert!(no_eth0.get("rxBytes").is_none());
        assert_eq!(no_eth0["interfaces"][0]["name"], "net1");
    }

    #[test]
    fn a_process_is_found_in_a_child_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let pod = d.path().join("podabc");
        std::fs::create_dir_all(pod.join("c1")).unwrap();
        std::fs::write(pod.join("cgroup.procs"), "").unwrap();
        std::fs::write(pod.join("c1/cgroup.procs"), "4242\n").unwrap();
        assert_eq!(process_in(&pod, d.path(), false), Some(4242));
        assert_eq!(process_in(&d.path().join("gone"), d.path(), false), None);
    }
}
