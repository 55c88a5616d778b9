//! The cgroup manager (kubelet's `cgroup_manager_linux.go`): create, update and destroy a cgroup
//! in every mounted hierarchy, writing kubelet's values.
//!
//! - cgroup v1: each controller hierarchy gets the directory, the `cpu`, `memory`, `pids` and
//!   `hugetlb` ones get values (`cpu.shares`, `cpu.cfs_period_us`, `cpu.cfs_quota_us`,
//!   `memory.limit_in_bytes`, `pids.max`, `hugetlb.<size>.limit_in_bytes`); `cpuset` gets its
//!   parent's cpus and mems so that tasks can join; named hierarchies (`name=systemd`) and the
//!   hybrid `unified` mount get the directory only, because runc creates the pod path there too.
//! - cgroup v2 (the unified mount is the only one): `cpu.weight` (from shares:
//!   `1 + (shares - 2) * 9999 / 262142`, the curve kubelet and runc ≤ 1.1 use; 1024 shares → 39),
//!   `cpu.max`, `memory.max`, `pids.max`, `hugetlb.<size>.max`, with the controllers enabled in
//!   each parent's `cgroup.subtree_control`.
//!
//! The hierarchies ([`Hierarchies`]) are read from `/proc/self/mountinfo`, or given, which is how
//! unit tests run v2 and v1 against a temporary directory laid out like a cgroupfs.
//!
//! cgroups-rs was considered and not used: its v1 hierarchy ignores named hierarchies and its v2
//! root is fixed at `/sys/fs/cgroup` (here the unified mount is `/sys/fs/cgroup/unified`), and it
//! cannot be pointed at a fake cgroupfs for tests.

use std::path::{Path, PathBuf};

pub use super::hierarchy::Hierarchies;
use super::resources::ResourceConfig;

/// A failed cgroup operation.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {op} {path}: {source}")]
pub struct CgroupError {
    /// `create`, `write`, `remove`.
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The I/O error.
    pub source: std::io::Error,
}

/// What the container manager needs from cgroups; the real implementation is [`Cgroupfs`].
pub trait CgroupManager: Send + Sync {
    /// Creates `cgroup` (an absolute cgroupfs path such as `/kubepods/burstable/pod<uid>`) in
    /// every hierarchy and writes `cfg`. Existing cgroups are updated.
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError>;
    /// Writes `cfg` to an existing `cgroup`.
    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError>;
    /// Removes `cgroup` and its children (deepest first) from every hierarchy.
    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError>;
    /// True when `cgroup` exists in the hierarchies that hold values (cpu and memory).
    fn exists(&self, cgroup: &str) -> bool;
    /// The pod UIDs of `pod<uid>` directories anywhere below `cgroup` (for orphan clean-up).
    fn pod_uids_under(&self, cgroup: &str) -> Vec<String>;
}

/// The cgroupfs cgroup manager over the given hierarchies.
#[derive(Debug, Clone)]
pub struct Cgroupfs {
    h: Hierarchies,
}

fn rel(cgroup: &str) -> Option<&str> {
    let r = cgroup.trim_start_matches('/');
    (!r.split('/').any(|c| c == ".." || c == ".")).then_some(r)
}

fn write(path: PathBuf, value: impl ToString) -> Result<(), CgroupError> {
    std::fs::write(&path, value.to_string()).map_err(|source| CgroupError {
        op: "write",
        path,
        source,
    })
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(path).map_err(|source| CgroupError {
        op: "create",
        path: path.to_owned(),
        source,
    })
}

/// Kernel spelling of a hugepage size (`2Mi` → `2MB`, `1Gi` → `1GB`).
fn hugetlb_size(size: &str) -> String {
    size.replace("Ki", "KB")
        .replace("Mi", "MB")
        .replace("Gi", "GB")
}

/// cgroup v2 `cpu.weight` from v1 shares (kubelet's `CpuSharesToCpuWeight`).
pub fn shares_to_weight(shares: u64) -> u64 {
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

impl Cgroupfs {
    /// A manager over `h` (use [`Hierarchies::current`] for this host).
    pub fn new(h: Hierarchies) -> Self {
        Self { h }
    }

    /// The hierarchies used.
    pub fn hierarchies(&self) -> &Hierarchies {
        &self.h
    }

    fn write_v1(&self, r: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        if let Some(m) = self.h.v1_mount("cpu") {
            let d = m.join(r);
            if let Some(s) = cfg.cpu_shares {
                write(d.join("cpu.shares"), s)?;
            }
            if let Some(p) = cfg.cpu_period {
                write(d.join("cpu.cfs_period_us"), p)?;
            }
            if let Some(q) = cfg.cpu_quota {
                write(d.join("cpu.cfs_quota_us"), if q <= 0 { -1 } else { q })?;
            }
        }
        if let (Some(m), Some(l)) = (
            self.h.v1_mount("memory"),
            cfg.memory_limit.filter(|l| *l > 0),
        ) {
            write(m.join(r).join("memory.limit_in_bytes"), l)?;
        }
        if let (Some(m), Some(p)) = (self.h.v1_mount("pids"), cfg.pids_limit) {
            write(
                m.join(r).join("pids.max"),
                if p > 0 { p.to_string() } else { "max".into() },
            )?;
        }
        if let Some(m) = self.h.v1_mount("hugetlb") {
            for (size, l) in &cfg.hugepage_limits {
                write(
                    m.join(r)
                        .join(format!("hugetlb.{}.limit_in_bytes", hugetlb_size(size))),
                    l,
                )?;
            }
        }
        Ok(())
    }

    fn write_v2(&self, root: &Path, r: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let d = root.join(r);
        if let Some(s) = cfg.cpu_shares {
            write(d.join("cpu.weight"), shares_to_weight(s))?;
        }
        if cfg.cpu_quota.is_some() || cfg.cpu_period.is_some() {
            let period = cfg
                .cpu_period
                .unwrap_or(super::resources::DEFAULT_CFS_PERIOD_US);
            let quota = cfg
                .cpu_quota
                .filter(|q| *q > 0)
                .map_or("max".to_string(), |q| q.to_string());
            write(d.join("cpu.max"), format!("{quota} {period}"))?;
        }
        if let Some(l) = cfg.memory_limit.filter(|l| *l > 0) {
            write(d.join("memory.max"), l)?;
        }
        if let Some(p) = cfg.pids_limit {
            write(
                d.join("pids.max"),
                if p > 0 { p.to_string() } else { "max".into() },
            )?;
        }
        for (size, l) in &cfg.hugepage_limits {
            write(d.join(format!("hugetlb.{}.max", hugetlb_size(size))), l)?;
        }
        Ok(())
    }

    /// Enables the available controllers for the children of every directory from the unified
    /// root down to `r`'s parent (v2 needs this before values can be written).
    fn enable_v2_controllers(root: &Path, r: &str) -> Result<(), CgroupError> {
        let available =
            std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let wanted: Vec<String> = ["cpu", "memory", "pids", "hugetlb"]
            .iter()
            .filter(|c| available.split_whitespace().any(|a| a == **c))
            .map(|c| format!("+{c}"))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let mut dir = root.to_path_buf();
        for comp in r.split('/').filter(|c| !c.is_empty()) {
            write(dir.join("cgroup.subtree_control"), wanted.join(" "))?;
            dir.push(comp);
        }
        Ok(())
    }

    fn copy_cpuset_from_parent(&self, r: &str) {
        let Some(m) = self.h.v1_mount("cpuset") else {
            return;
        };
        let mut dir = m.to_path_buf();
        for comp in r.split('/').filter(|c| !c.is_empty()) {
            let parent = dir.clone();
            dir.push(comp);
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let mine = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                if mine.trim().is_empty() {
                    if let Ok(v) = std::fs::read_to_string(parent.join(f)) {
                        let _ = std::fs::write(dir.join(f), v.trim());
                    }
                }
            }
        }
    }
}

impl CgroupManager for Cgroupfs {
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let Some(r) = rel(cgroup) else { return Ok(()) };
        for m in self.h.all_mounts() {
            mkdir(&m.join(r))?;
        }
        self.copy_cpuset_from_parent(r);
        self.update(cgroup, cfg)
    }

    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let Some(r) = rel(cgroup) else { return Ok(()) };
        match (&self.h.unified, self.h.is_v2()) {
            (Some(root), true) => {
                Self::enable_v2_controllers(root, r)?;
                self.write_v2(root, r, cfg)
            }
            _ => self.write_v1(r, cfg),
        }
    }

    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError> {
        super::remove_cgroup_everywhere(&self.h.all_mounts(), cgroup).map_err(|source| {
            CgroupError {
                op: "remove",
                path: PathBuf::from(cgroup),
                source,
            }
        })
    }

    fn exists(&self, cgroup: &str) -> bool {
        let Some(r) = rel(cgroup) else { return false };
        if self.h.is_v2() {
            return self.h.unified.as_ref().is_some_and(|u| u.join(r).is_dir());
        }
        ["cpu", "memory"]
            .iter()
            .all(|c| self.h.v1_mount(c).is_none_or(|m| m.join(r).is_dir()))
    }

    fn pod_uids_under(&self, cgroup: &str) -> Vec<String> {
        let Some(r) = rel(cgroup) else {
            return Vec::new();
        };
        let mut uids = Vec::new();
        for m in self.h.all_mounts() {
            collect_pod_dirs(&m.join(r), 3, &mut uids);
        }
        uids.sort();
        uids.dedup();
        uids
    }
}

fn collect_pod_dirs(dir: &Path, depth: u32, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(uid) = name.strip_prefix("pod") {
            out.push(uid.to_owned());
        } else if depth > 0 {
            collect_pod_dirs(&e.path(), depth - 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_v1(tmp: &Path) -> Hierarchies {
        let mut h = Hierarchies::default();
        for c in ["cpu", "memory", "pids", "cpuset"] {
            std::fs::create_dir_all(tmp.join(c)).unwrap();
            h.v1.push((vec![c.to_string()], tmp.join(c)));
        }
        std::fs::write(tmp.join("cpuset/cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(tmp.join("cpuset/cpuset.mems"), "0\n").unwrap();
        std::fs::create_dir_all(tmp.join("systemd")).unwrap();
        h.v1.push((vec!["name=systemd".to_string()], tmp.join("systemd")));
        std::fs::create_dir_all(tmp.join("unified")).unwrap();
        h.unified = Some(tmp.join("unified"));
        h
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    #[test]
    fn v1_create_writes_values_in_every_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let cg = Cgroupfs::new(fake_v1(tmp.path()));
        let cfg = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 27),
            pids_limit: Some(100),
            ..Default::default()
        };
        cg.create("/kubepods/burstable/podu1", &cfg).unwrap();
        let t = tmp.path();
        assert_eq!(
            read(t.join("cpu/kubepods/burstable/podu1/cpu.shares")),
            "512"
        );
        assert_eq!(
            read(t.join("cpu/kubepods/burstable/podu1/cpu.cfs_quota_us")),
            "50000"
        );
        assert_eq!(
            read(t.join("cpu/kubepods/burstable/podu1/cpu.cfs_period_us")),
            "100000"
        );
        assert_eq!(
            read(t.join("memory/kubepods/burstable/podu1/memory.limit_in_bytes")),
            "134217728"
        );
        assert_eq!(
            read(t.join("pids/kubepods/burstable/podu1/pids.max")),
            "100"
        );
        assert_eq!(
            read(t.join("cpuset/kubepods/burstable/podu1/cpuset.cpus")),
            "0-1"
        );
        assert!(
            t.join("systemd/kubepods/burstable/podu1").is_dir(),
            "named hierarchy too"
        );
        assert!(
            t.join("unified/kubepods/burstable/podu1").is_dir(),
            "hybrid unified mount too"
        );
        assert!(
            !t.join("unified/kubepods/burstable/podu1/cpu.weight")
                .exists(),
            "no values in hybrid unified"
        );
        assert!(cg.exists("/kubepods/burstable/podu1"));
        assert_eq!(cg.pod_uids_under("/kubepods"), vec!["u1".to_string()]);
        cg.destroy("/kubepods/burstable/podu1").unwrap();
        assert!(!cg.exists("/kubepods/burstable/podu1"));
        for h in ["cpu", "memory", "pids", "cpuset", "systemd", "unified"] {
            assert!(!t.join(h).join("kubepods/burstable/podu1").exists(), "{h}");
        }
        assert!(cg.create("/../escape", &cfg).is_ok() && !t.join("escape").exists());
    }

    #[test]
    fn v2_create_writes_weight_max_and_enables_controllers() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .unwrap();
        let cg = Cgroupfs::new(Hierarchies {
            v1: vec![],
            unified: Some(tmp.path().to_owned()),
        });
        let cfg = ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 27),
            ..Default::default()
        };
        cg.create("/kubepods/podu2", &cfg).unwrap();
        let d = tmp.path().join("kubepods/podu2");
        assert_eq!(read(d.join("cpu.weight")), "39");
        assert_eq!(read(d.join("cpu.max")), "50000 100000");
        assert_eq!(read(d.join("memory.max")), "134217728");
        assert_eq!(
            read(tmp.path().join("cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        assert_eq!(
            read(tmp.path().join("kubepods/cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        cg.update(
            "/kubepods/podu2",
            &ResourceConfig {
                cpu_quota: Some(-1),
                cpu_period: Some(100_000),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(read(d.join("cpu.max")), "max 100000");
        assert!(cg.exists("/kubepods/podu2"));
    }

    #[test]
    fn weight_curve_matches_kubelet() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }
}
