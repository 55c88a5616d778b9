//! An in-memory cgroup manager for unit tests of logic above the cgroup tree: it records which
//! cgroups exist and each create, update and destroy, in order.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::cm::cgroupfs::{CgroupError, CgroupManager};
use crate::cm::resources::{CgroupPolicy, NodeResources, ResourceConfig};
use crate::cm::{CgroupLayout, NodeConfig};

/// A node of `capacity` with kubelet's default cgroup layout under `/` (QoS cgroups, cgroupfs
/// names), nothing reserved, pods' cgroups enforced.
pub fn node_config(capacity: NodeResources) -> NodeConfig {
    NodeConfig {
        layout: CgroupLayout {
            root: "/".into(),
            per_qos: true,
            systemd: false,
        },
        policy: CgroupPolicy::default(),
        capacity,
        system_reserved: NodeResources::default(),
        kube_reserved: NodeResources::default(),
        enforce_pods: true,
        qos_reserved_memory: None,
    }
}

/// The fake: cgroup name → the last values written.
#[derive(Default)]
pub struct MemCgroups {
    cgroups: Mutex<BTreeMap<String, ResourceConfig>>,
    log: Mutex<Vec<String>>,
    /// Cgroups that hold processes: removing them fails with EBUSY.
    busy: Mutex<BTreeMap<String, Vec<u64>>>,
}

impl MemCgroups {
    /// `create <cgroup>` / `update <cgroup>` / `destroy <cgroup>`, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// True when `cgroup` exists.
    pub fn has(&self, cgroup: &str) -> bool {
        self.cgroups.lock().unwrap().contains_key(cgroup)
    }

    fn write(&self, verb: &str, cgroup: &str, cfg: &ResourceConfig) {
        self.cgroups
            .lock()
            .unwrap()
            .insert(cgroup.into(), cfg.clone());
        self.log.lock().unwrap().push(format!("{verb} {cgroup}"));
    }

    /// The values last written to `cgroup`, if it exists.
    pub fn value(&self, cgroup: &str) -> Option<ResourceConfig> {
        self.cgroups.lock().unwrap().get(cgroup).cloned()
    }

    /// `cgroup` holds the processes `pids` (none: it is free again).
    pub fn set_busy(&self, cgroup: &str, pids: Vec<u64>) {
        let mut b = self.busy.lock().unwrap();
        if pids.is_empty() {
            b.remove(cgroup);
        } else {
            b.insert(cgroup.into(), pids);
        }
    }
}

impl CgroupManager for MemCgroups {
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        self.write("create", cgroup, cfg);
        Ok(())
    }

    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        if !self.has(cgroup) {
            return Err(CgroupError::Write {
                knob: "cpu.shares".into(),
                value: format!("{:?}", cfg.cpu_shares),
                dir: cgroup.into(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such knob"),
            });
        }
        self.write("update", cgroup, cfg);
        Ok(())
    }

    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError> {
        if self.busy.lock().unwrap().contains_key(cgroup) {
            self.log.lock().unwrap().push(format!("busy {cgroup}"));
            return Err(CgroupError::Remove {
                cgroup: cgroup.into(),
                source: std::io::Error::from_raw_os_error(16),
            });
        }
        let mut m = self.cgroups.lock().unwrap();
        let gone: Vec<String> = m
            .keys()
            .filter(|k| *k == cgroup || k.starts_with(&format!("{cgroup}/")))
            .cloned()
            .collect();
        for k in gone {
            m.remove(&k);
            self.log.lock().unwrap().push(format!("destroy {k}"));
        }
        Ok(())
    }

    fn exists(&self, cgroup: &str) -> bool {
        self.has(cgroup)
    }

    fn pids(&self, cgroup: &str) -> Vec<u64> {
        self.busy
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c.as_str() == cgroup)
            .flat_map(|(_, p)| p.iter().copied())
            .collect()
    }

    fn pod_uids_under(&self, cgroup: &str) -> Vec<String> {
        self.cgroups
            .lock()
            .unwrap()
            .keys()
            .filter(|k| k.starts_with(cgroup))
            .filter_map(|k| k.rsplit('/').next()?.strip_prefix("pod").map(str::to_owned))
            .collect()
    }
}
