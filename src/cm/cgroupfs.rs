//! The cgroup manager (kubelet's `cgroup_manager_linux.go`): create, update and destroy a cgroup
//! in every mounted hierarchy, writing kubelet's values through cgroups-rs.
//!
//! nodelet keeps kubelet's tree, names and values (the `cm` module, [`super::resources`],
//! [`super::name`]); cgroups-rs does the file I/O below them, over the hierarchies of
//! [`super::hierarchy`]:
//!
//! - cgroup v1: each controller hierarchy and the named `name=systemd` one get the directory
//!   (`Controller::create`; cgroups-rs's cpuset controller copies `cpuset.cpus` and `cpuset.mems`
//!   down from the nearest parent that has them, so that tasks can join, and the cpuset cgroups
//!   nodelet makes have `cgroup.clone_children` set, so that the kernel gives the ones made below
//!   them their values at `mkdir`: see `clone_cpusets_to_children`). Values go through
//!   `CpuController::set_shares`, `set_cfs_period` and `set_cfs_quota` (`cpu.shares`,
//!   `cpu.cfs_period_us`, `cpu.cfs_quota_us`), `MemController::set_limit`
//!   (`memory.limit_in_bytes`), `PidController::set_pid_max` (`pids.max`) and
//!   `HugeTlbController::set_limit_in_bytes` (`hugetlb.<size>.limit_in_bytes`). The hybrid
//!   `unified` mount gets the directory only, because runc creates the pod path there too.
//! - cgroup v2 (the unified mount is the only one): the same calls write `cpu.weight` (from
//!   shares: `1 + (shares - 2) * 9999 / 262142`, the curve kubelet and runc ≤ 1.1 use; 1024 shares
//!   → 39), `cpu.max` (`set_cfs_quota_and_period`), `memory.max`, `pids.max` and
//!   `hugetlb.<size>.max`, once the controllers are enabled in each parent's
//!   `cgroup.subtree_control`. That file is the one written by hand (see
//!   `enable_v2_controllers` for why).
//!
//! A knob is written only when it exists: cgroups-rs opens knobs with `File::create`, which the
//! kernel's cgroupfs refuses for a missing knob but an ordinary directory would obey by creating
//! a file, so each write checks the knob first. Unit tests lay out a temporary directory like a
//! cgroupfs with every knob pre-created, so a misspelt knob fails them.
//!
//! Before a cgroup is removed, the page cache charged to its v1 memory cgroup is reclaimed
//! (`memory.force_empty`, see `Cgroupfs::release_page_cache`), so that the kernel frees it.
//!
//! Removing a cgroup (`rmdir` of it and its children, deepest first) and listing pod cgroups are
//! directory operations done with `std::fs` ([`super::remove_cgroup_everywhere`]): cgroups-rs's
//! `Cgroup::delete` sleeps and retries for up to 150 ms per hierarchy when a cgroup is busy, on
//! the caller's thread (a pod worker), and on v2 does not remove child cgroups.

use std::fmt::Display;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::hugetlb::HugeTlbController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{Cgroup, Controller, MaxValue};

pub use super::hierarchy::Hierarchies;
use super::hierarchy::{Unified, V1Mounts};
use super::resources::{ResourceConfig, DEFAULT_CFS_PERIOD_US};

/// A failed cgroup operation, with the path and the value that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A cgroup directory could not be made.
    #[error("cannot create cgroup directory {path}: {source}")]
    Create {
        /// The directory, in its hierarchy.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A knob could not be written (`NotFound` when the knob does not exist).
    #[error("cannot write {value} to {knob} of {dir}: {source}")]
    Write {
        /// The knob, e.g. `memory.limit_in_bytes`.
        knob: String,
        /// The value as written.
        value: String,
        /// The cgroup's directory, in its hierarchy.
        dir: PathBuf,
        /// Why (the kernel's errno, e.g. EBUSY for a memory limit below usage).
        source: io::Error,
    },
    /// A cgroup v2 controller nodelet needs cannot be enabled for its cgroups: an ancestor of
    /// `cgroupRoot` does not delegate it (it holds processes, or is not the agent's to change).
    #[error("the cgroup v2 {controller} controller cannot be enabled in {}/cgroup.subtree_control ({source}): cgroupRoot must be below cgroups that delegate cpu, memory and pids to it (a cgroup that holds processes cannot; under systemd, use the root or a unit with Delegate=yes)", dir.display())]
    NotDelegated {
        /// `cpu`, `memory`, `pids` or `hugetlb`.
        controller: String,
        /// The cgroup whose `cgroup.subtree_control` refused it.
        dir: PathBuf,
        /// The kernel's answer (EBUSY for a cgroup with processes).
        source: io::Error,
    },
    /// A call of systemd's D-Bus API failed (the systemd cgroup driver).
    #[error("systemd {call}{}: {message}", of_unit(.unit))]
    Systemd {
        /// The slice, e.g. `kubepods-burstable.slice` (empty for the connection).
        unit: String,
        /// The D-Bus method, e.g. `StartTransientUnit`.
        call: &'static str,
        /// What systemd or the bus said.
        message: String,
    },
    /// A cgroup could not be removed from every hierarchy.
    #[error("cannot remove cgroup {cgroup}: {source}")]
    Remove {
        /// The cgroup (cgroupfs path).
        cgroup: String,
        /// The first failure.
        source: io::Error,
    },
}

/// What the container manager needs from cgroups; the real implementation is [`Cgroupfs`].
pub trait CgroupManager: Send + Sync {
    /// Creates `cgroup` (an absolute cgroupfs path such as `/kubepods/burstable/pod<uid>`) in
    /// every hierarchy and writes `cfg`. Existing cgroups are updated.
    ///
    /// Errors: the directory or knob that failed.
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError>;
    /// Writes `cfg` to an existing `cgroup`.
    ///
    /// Errors: the knob that failed, with its value.
    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError>;
    /// Removes `cgroup` and its children (deepest first) from every hierarchy.
    ///
    /// Errors: the first removal that failed (a cgroup that still has tasks).
    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError>;
    /// True when `cgroup` exists in the hierarchies that hold values (cpu and memory).
    fn exists(&self, cgroup: &str) -> bool;
    /// The pod UIDs of `pod<uid>` directories anywhere below `cgroup` (for orphan clean-up).
    fn pod_uids_under(&self, cgroup: &str) -> Vec<String>;
    /// The processes in `cgroup` and its children, ascending (what keeps it from being removed).
    fn pids(&self, cgroup: &str) -> Vec<u64>;
}

/// The cgroupfs cgroup manager over the given hierarchies.
#[derive(Debug, Clone)]
pub struct Cgroupfs {
    h: Hierarchies,
    v1: V1Mounts,
    unified: Option<Unified>,
}

/// ` of <unit>` for a systemd error about a unit; nothing for the bus connection's own.
fn of_unit(unit: &str) -> String {
    if unit.is_empty() {
        String::new()
    } else {
        format!(" of {unit}")
    }
}

fn rel(cgroup: &str) -> Option<&str> {
    let r = cgroup.trim_start_matches('/');
    (!r.split('/').any(|c| c == ".." || c == ".")).then_some(r)
}

/// The I/O error under a cgroups-rs error, errno kept (EBUSY stays EBUSY); otherwise the
/// cgroups-rs error's own message.
fn io_error(e: &cgroups_rs::fs::error::Error) -> io::Error {
    let cause = std::error::Error::source(e).and_then(|c| c.downcast_ref::<io::Error>());
    match cause {
        Some(c) => c.raw_os_error().map_or_else(
            || io::Error::new(c.kind(), c.to_string()),
            io::Error::from_raw_os_error,
        ),
        None => io::Error::other(e.to_string()),
    }
}

/// Has the kernel give the v1 cpuset cgroups made below `dir` their parent's `cpuset.cpus` and
/// `cpuset.mems` as they are made (`cgroup.clone_children` = 1). The kernel passes the flag on
/// to every cgroup made below, so it is written on `kubepods` and the QoS cgroups and found set
/// on pod cgroups.
///
/// Without it a new cpuset cgroup is empty, and whoever makes one must copy the values down
/// before a task can join: cgroups-rs's cpuset `create` for a pod cgroup, runc for a container's.
/// That is two writes per cgroup, and on cgroup v1 the kernel rebuilds its scheduling domains
/// whenever the cpus of a cpuset that balances load change (its `update_cpumasks_hier`): the
/// copies were 8 % of the agent's CPU samples in a burst of 110 pod starts (perf, this machine),
/// and in the standalone harness the agent's CPU per pod start fell by 8 % with the flag (4.72
/// against 5.13 ms, medians of three interleaved runs). With the flag those copies find the
/// values there and write nothing. The values are the same either way (the parent's
/// `cpuset.cpus` and `cpuset.mems`, what both copies read). kubelet leaves the flag as it finds
/// it and has runc copy (libcontainer's `cpusetEnsureParent`, `cpusetCopyIfNeeded`); the flag is
/// documented in the kernel's cgroup-v1 `cgroups.rst` ("clone_children").
///
/// cgroups-rs has no call for the flag, so it is read and written with `std::fs`. A missing or
/// refused knob is logged and left: the copies then do the work as before.
fn clone_cpusets_to_children(dir: &Path) {
    let knob = dir.join("cgroup.clone_children");
    match std::fs::read_to_string(&knob) {
        Ok(v) if v.trim() == "0" => {
            if let Err(e) = std::fs::OpenOptions::new()
                .write(true)
                .open(&knob)
                .and_then(|mut f| f.write_all(b"1"))
            {
                tracing::info!(knob = %knob.display(), error = %e, "cannot have the kernel copy cpusets to new cgroups; cgroups-rs and runc copy them");
            }
        }
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(knob = %knob.display(), error = %e, "no cgroup.clone_children")
        }
    }
}

/// Writes `value` to `knob` of the cgroup directory `dir` with `write` (a cgroups-rs setter),
/// if the knob exists.
fn set(
    dir: &Path,
    knob: &str,
    value: impl Display,
    write: impl FnOnce() -> cgroups_rs::fs::error::Result<()>,
) -> Result<(), CgroupError> {
    let fail = |source| CgroupError::Write {
        knob: knob.to_owned(),
        value: value.to_string(),
        dir: dir.to_owned(),
        source,
    };
    if !dir.join(knob).is_file() {
        return Err(fail(io::Error::new(
            io::ErrorKind::NotFound,
            "no such knob",
        )));
    }
    write().map_err(|e| fail(io_error(&e)))
}

/// cgroup v2 `cpu.weight` from v1 shares (kubelet's `CpuSharesToCpuWeight`): 2 → 1, 1024 → 39,
/// 262144 → 10000.
pub fn shares_to_weight(shares: u64) -> u64 {
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// Writes `cfg` to `cg` through its cgroups-rs controllers, with the knob names of its version.
fn write_values(cg: &Cgroup, cfg: &ResourceConfig) -> Result<(), CgroupError> {
    let v2 = cg.v2();
    if let Some(cpu) = cg.controller_of::<CpuController>() {
        let dir = cpu.path();
        if let Some(shares) = cfg.cpu_shares {
            // cgroups-rs writes the number it is given, to cpu.weight on v2: convert it first.
            let (knob, value) = if v2 {
                ("cpu.weight", shares_to_weight(shares))
            } else {
                ("cpu.shares", shares)
            };
            set(dir, knob, value, || cpu.set_shares(value))?;
        }
        let quota = cfg.cpu_quota.map(|q| if q <= 0 { -1 } else { q });
        if v2 {
            if quota.is_some() || cfg.cpu_period.is_some() {
                let (quota, period) = (
                    quota.unwrap_or(-1),
                    cfg.cpu_period.unwrap_or(DEFAULT_CFS_PERIOD_US),
                );
                let line = match quota {
                    q if q > 0 => format!("{q} {period}"),
                    _ => format!("max {period}"),
                };
                set(dir, "cpu.max", line, || {
                    cpu.set_cfs_quota_and_period(Some(quota), Some(period))
                })?;
            }
        } else {
            if let Some(period) = cfg.cpu_period {
                set(dir, "cpu.cfs_period_us", period, || {
                    cpu.set_cfs_period(period)
                })?;
            }
            if let Some(quota) = quota {
                set(dir, "cpu.cfs_quota_us", quota, || cpu.set_cfs_quota(quota))?;
            }
        }
    }
    if let (Some(mem), Some(limit)) = (
        cg.controller_of::<MemController>(),
        cfg.memory_limit.filter(|l| *l > 0),
    ) {
        let knob = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        set(mem.path(), knob, limit, || mem.set_limit(limit))?;
    }
    if let (Some(mem), Some(min), true) = (cg.controller_of::<MemController>(), cfg.memory_min, v2)
    {
        let min = MaxValue::Value(min.max(0));
        set(mem.path(), "memory.min", min, || {
            mem.set_mem(cgroups_rs::fs::memory::SetMemory {
                min: Some(min),
                ..Default::default()
            })
        })?;
    }
    if let (Some(mem), Some(high), true) =
        (cg.controller_of::<MemController>(), cfg.memory_high, v2)
    {
        let high = if high > 0 {
            MaxValue::Value(high)
        } else {
            MaxValue::Max
        };
        set(mem.path(), "memory.high", high, || {
            mem.set_mem(cgroups_rs::fs::memory::SetMemory {
                high: Some(high),
                ..Default::default()
            })
        })?;
    }
    if let (Some(pids), Some(limit)) = (cg.controller_of::<PidController>(), cfg.pids_limit) {
        let max = if limit > 0 {
            MaxValue::Value(limit)
        } else {
            MaxValue::Max
        };
        set(pids.path(), "pids.max", max, || pids.set_pid_max(max))?;
    }
    if let Some(hugetlb) = cg.controller_of::<HugeTlbController>() {
        for (size, limit) in &cfg.hugepage_limits {
            let knob = if v2 {
                format!("hugetlb.{size}.max")
            } else {
                format!("hugetlb.{size}.limit_in_bytes")
            };
            let bytes = u64::try_from(*limit).map_err(|_| CgroupError::Write {
                knob: knob.clone(),
                value: limit.to_string(),
                dir: hugetlb.path().to_owned(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "a limit cannot be negative"),
            })?;
            set(hugetlb.path(), &knob, bytes, || {
                hugetlb.set_limit_in_bytes(size, bytes)
            })?;
        }
    }
    Ok(())
}

/// Enables the controllers kubelet uses (cpu, memory, pids, hugetlb; those the root's
/// `cgroup.controllers` lists) in `cgroup.subtree_control` of the unified root and of every
/// directory down to `r`'s parent, so that `r` gets their knobs.
///
/// The one knob not written through cgroups-rs (nor is `cgroup.controllers`, read here for the
/// list): cgroups-rs enables controllers only inside `Cgroup::create`, from the list of the fixed
/// `/sys/fs/cgroup` mount (not the hybrid `unified` mount, nor a fake cgroupfs), one controller
/// per write with failures ignored, and has no public reader or writer for either file. The knob
/// is opened like every other: it must exist.
fn enable_v2_controllers(root: &Path, r: &str) -> Result<(), CgroupError> {
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<String> = ["cpu", "memory", "pids", "hugetlb"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let value = wanted.join(" ");
    let write = |dir: &Path, value: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(dir.join("cgroup.subtree_control"))
            .and_then(|mut f| f.write_all(value.as_bytes()))
    };
    let mut dir = root.to_path_buf();
    for comp in r.split('/').filter(|c| !c.is_empty()) {
        if let Err(source) = write(&dir, &value) {
            // Name the controller that cannot be delegated: one at a time.
            let failing = wanted
                .iter()
                .find_map(|c| write(&dir, c).err().map(|e| (c.trim_start_matches('+'), e)));
            return Err(match failing {
                Some((controller, source)) => CgroupError::NotDelegated {
                    controller: controller.to_owned(),
                    dir: dir.clone(),
                    source,
                },
                None => CgroupError::Write {
                    knob: "cgroup.subtree_control".into(),
                    value: value.clone(),
                    dir: dir.clone(),
                    source,
                },
            });
        }
        dir.push(comp);
    }
    Ok(())
}

impl Cgroupfs {
    /// A manager over `h` (use [`Hierarchies::current`] for this host).
    pub fn new(h: Hierarchies) -> Self {
        Self {
            v1: V1Mounts::new(&h),
            unified: h.unified.clone().map(Unified::new),
            h,
        }
    }

    /// The hierarchies used.
    pub fn hierarchies(&self) -> &Hierarchies {
        &self.h
    }

    /// `r` in the hierarchy that holds values: the unified one on a v2 host, else the v1 ones.
    fn valued(&self, r: &str) -> Option<Cgroup> {
        match &self.unified {
            Some(u) if self.h.is_v2() => Some(Cgroup::load(Box::new(u.clone()), r)),
            _ if !self.v1.is_empty() => Some(Cgroup::load(Box::new(self.v1.clone()), r)),
            _ => None,
        }
    }

    /// Before `r` is removed: has the kernel reclaim the page cache still charged to its v1
    /// memory cgroup and to the dead container cgroups below it (`memory.force_empty`), when no
    /// process is left in any of them. Without it, every file page a container read or wrote
    /// (a hostPath file, the image's files it was first to read) keeps the container's and the
    /// pod's memory cgroups alive in the kernel after `rmdir` ("dying" cgroups, counted in
    /// `/proc/cgroups` but in no directory), each holding kernel memory, until memory pressure
    /// reclaims the pages. They pile up with every pod that comes and goes: here 300 more after
    /// each burst of 110 pods without it, 6 to 12 with it.
    ///
    /// kubelet removes pod cgroups without it (`podContainerManagerImpl.Destroy`); its design
    /// of pod cgroup removal (kubernetes#29927) called for reclaiming the pages first, as the
    /// kernel's cgroup-v1 memory documentation advises before `rmdir`. cgroups-rs has no call
    /// for the knob, so it is written with `std::fs`. v2 has no `memory.force_empty`
    /// (`memory.reclaim` is not used) and is left as it is.
    ///
    /// The kernel reclaims for as long as it makes progress, waiting for dirty pages to be
    /// written back: this blocks the caller's thread for as long as that takes (callers run it
    /// on a blocking thread). It reclaims whatever the cgroup holds, a process's pages too,
    /// which is why a cgroup with a process is skipped; pages it cannot reclaim (tmpfs without
    /// swap) stay charged, and the write still succeeds. A refused write is logged and the
    /// removal goes on: the pages then stay charged, as they would under kubelet.
    fn release_page_cache(&self, r: &str) {
        let Some(mount) = self.h.v1_mount("memory") else {
            return;
        };
        let dir = mount.join(r);
        if !dir.is_dir() {
            return;
        }
        let mut tree = Vec::new();
        cgroup_tree(mount, r, &mut tree);
        // Reclaim would also take pages from live processes: only a cgroup with none is emptied.
        let occupied = tree.iter().any(|c| {
            std::fs::read_to_string(mount.join(c).join("cgroup.procs"))
                .map_or(true, |procs| !procs.trim().is_empty())
        });
        if occupied {
            return;
        }
        // Written only if the knob exists, as every knob here (see the module's doc).
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("memory.force_empty"))
            .and_then(|mut f| f.write_all(b"0"));
        match written {
            Ok(()) => tracing::debug!(
                cgroup = r,
                "memory cgroup's page cache reclaimed before removal"
            ),
            Err(e) => {
                tracing::info!(cgroup = r, error = %e, "cannot reclaim the page cache of the memory cgroup before removing it")
            }
        }
    }

    /// `r` in every hierarchy: the v1 ones and the unified one.
    fn everywhere(&self, r: &str) -> Vec<Cgroup> {
        let v1 = (!self.v1.is_empty()).then(|| Cgroup::load(Box::new(self.v1.clone()), r));
        let unified = self
            .unified
            .as_ref()
            .map(|u| Cgroup::load(Box::new(u.clone()), r));
        v1.into_iter().chain(unified).collect()
    }
}

impl CgroupManager for Cgroupfs {
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let Some(r) = rel(cgroup) else { return Ok(()) };
        // Controllers that share a directory (every one of the unified hierarchy, co-mounted v1
        // ones such as cpu,cpuacct) make it once; a v1 cpuset always runs its create, which
        // also copies the parent's cpus and mems where they are empty, and has the kernel copy
        // them into the cgroups made below it.
        let mut made = std::collections::HashSet::new();
        for cg in self.everywhere(r) {
            for s in cg.subsystems() {
                let c = s.to_controller();
                let cpuset = matches!(s, cgroups_rs::fs::Subsystem::CpuSet(_)) && !c.v2();
                if !made.insert(c.path().to_owned()) && !cpuset {
                    continue;
                }
                c.create().map_err(|e| CgroupError::Create {
                    path: c.path().to_owned(),
                    source: io_error(&e),
                })?;
                if cpuset {
                    clone_cpusets_to_children(c.path());
                }
            }
        }
        self.update(cgroup, cfg)
    }

    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let Some(r) = rel(cgroup) else { return Ok(()) };
        if let (true, Some(root)) = (self.h.is_v2(), &self.h.unified) {
            enable_v2_controllers(root, r)?;
        }
        match self.valued(r) {
            Some(cg) => write_values(&cg, cfg),
            None => Ok(()),
        }
    }

    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError> {
        if let Some(r) = rel(cgroup).filter(|r| !r.is_empty()) {
            self.release_page_cache(r);
        }
        super::remove_cgroup_everywhere(&self.h.all_mounts(), cgroup).map_err(|source| {
            CgroupError::Remove {
                cgroup: cgroup.to_owned(),
                source,
            }
        })
    }

    fn exists(&self, cgroup: &str) -> bool {
        let Some(r) = rel(cgroup) else { return false };
        let Some(cg) = self.valued(r) else {
            return true;
        };
        cg.controller_of::<CpuController>()
            .is_none_or(|c| c.exists())
            && cg
                .controller_of::<MemController>()
                .is_none_or(|c| c.exists())
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

    fn pids(&self, cgroup: &str) -> Vec<u64> {
        let Some(r) = rel(cgroup) else {
            return Vec::new();
        };
        // The directories are listed from the mounts; their processes read through cgroups-rs.
        let mut pids = Vec::new();
        for m in self.h.all_mounts() {
            let mut tree = Vec::new();
            cgroup_tree(&m, r, &mut tree);
            for dir in tree {
                for cg in self.everywhere(&dir) {
                    pids.extend(cg.procs().into_iter().map(|p| p.pid));
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

/// `rel` and every cgroup below it, as paths relative to the hierarchy at `mount`.
fn cgroup_tree(mount: &Path, rel: &str, out: &mut Vec<String>) {
    out.push(rel.to_owned());
    let Ok(rd) = std::fs::read_dir(mount.join(rel)) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let child = format!("{rel}/{}", e.file_name().to_string_lossy());
            cgroup_tree(mount, &child, out);
        }
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
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_systemd_error_names_its_unit_only_when_it_has_one() {
        let e = |unit: &str| {
            CgroupError::Systemd {
                unit: unit.into(),
                call: "StartTransientUnit",
                message: "denied".into(),
            }
            .to_string()
        };
        assert_eq!(e(""), "systemd StartTransientUnit: denied");
        assert_eq!(
            e("kubepods.slice"),
            "systemd StartTransientUnit of kubepods.slice: denied"
        );
    }

    /// v1 knobs with the kernel's defaults, by controller.
    pub(crate) const CPU_V1: &[(&str, &str)] = &[
        ("cpu.shares", "1024"),
        ("cpu.cfs_period_us", "100000"),
        ("cpu.cfs_quota_us", "-1"),
    ];
    pub(crate) const MEMORY_V1: &[(&str, &str)] =
        &[("memory.limit_in_bytes", "9223372036854771712")];
    const PIDS: &[(&str, &str)] = &[("pids.max", "max"), ("pids.current", "0")];
    const CPUSET: &[(&str, &str)] = &[
        ("cpuset.cpus", ""),
        ("cpuset.mems", ""),
        ("cgroup.clone_children", "0"),
    ];
    /// v2 knobs of a cgroup below the root, with the kernel's defaults.
    const V2: &[(&str, &str)] = &[
        ("cgroup.subtree_control", ""),
        ("cpu.weight", "100"),
        ("cpu.max", "max 100000"),
        ("memory.max", "max"),
        ("pids.max", "max"),
    ];

    /// Lays out `dir` like a cgroup directory: each knob a file holding its value (youki's
    /// `set_fixture`). The code under test writes only to files that exist.
    pub(crate) fn fixture(dir: &Path, knobs: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (knob, value) in knobs {
            std::fs::write(dir.join(knob), value).unwrap();
        }
    }

    /// Every file below `dir`: a write to a knob that was not pre-created would add one.
    pub(crate) fn files(dir: &Path) -> BTreeSet<PathBuf> {
        let mut out = BTreeSet::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.insert(e.path());
                }
            }
        }
        out
    }

    /// v1 hierarchies cpu, memory, pids and cpuset with knobs in `cgroups` (and the root), the
    /// named systemd hierarchy, and a hybrid unified mount.
    fn fake_v1(tmp: &Path, cgroups: &[&str]) -> Hierarchies {
        let mut h = Hierarchies::default();
        for (c, knobs) in [
            ("cpu", CPU_V1),
            ("memory", MEMORY_V1),
            ("pids", PIDS),
            ("cpuset", CPUSET),
        ] {
            for cg in cgroups {
                fixture(&tmp.join(c).join(cg), knobs);
            }
            h.v1.push((vec![c.to_string()], tmp.join(c)));
        }
        fixture(
            &tmp.join("cpuset"),
            &[
                ("cpuset.cpus", "0-1\n"),
                ("cpuset.mems", "0\n"),
                ("cgroup.clone_children", "0\n"),
            ],
        );
        std::fs::create_dir_all(tmp.join("systemd")).unwrap();
        h.v1.push((vec!["name=systemd".to_string()], tmp.join("systemd")));
        fixture(&tmp.join("unified"), &[("cgroup.controllers", "hugetlb")]);
        h.unified = Some(tmp.join("unified"));
        h
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// Before removal the pod's v1 memory cgroup is emptied of page cache
    /// (`memory.force_empty`), but only when no process is left in it or below it.
    #[test]
    fn destroy_reclaims_the_page_cache_of_a_memory_cgroup_without_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let h = fake_v1(t, &["kubepods", "kubepods/besteffort"]);
        let pod = t.join("memory/kubepods/besteffort/podu1");
        let knobs = [("memory.force_empty", ""), ("cgroup.procs", "")];
        fixture(&pod, &knobs);
        fixture(&pod.join("ctr1"), &knobs);
        let cg = Cgroupfs::new(h);
        // A process left below it: not emptied (reclaim would take that process's pages).
        std::fs::write(pod.join("ctr1/cgroup.procs"), "4242\n").unwrap();
        cg.release_page_cache("kubepods/besteffort/podu1");
        assert_eq!(read(pod.join("memory.force_empty")), "");
        std::fs::write(pod.join("ctr1/cgroup.procs"), "").unwrap();
        cg.release_page_cache("kubepods/besteffort/podu1");
        assert_eq!(read(pod.join("memory.force_empty")), "0");
        // A cgroup without the knob (cgroup v2 has none) gets no file.
        cg.destroy("/kubepods/besteffort/podu1").unwrap();
        fixture(&pod, &[("cgroup.procs", "")]);
        cg.release_page_cache("kubepods/besteffort/podu1");
        assert!(!pod.join("memory.force_empty").exists());
    }

    #[test]
    fn v1_create_writes_values_in_every_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let cg = Cgroupfs::new(fake_v1(
            t,
            &["kubepods", "kubepods/burstable", "kubepods/burstable/podu1"],
        ));
        let knobs = files(t);
        let cfg = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 27),
            pids_limit: Some(100),
            ..Default::default()
        };
        cg.create("/kubepods/burstable/podu1", &cfg).unwrap();
        assert_eq!(files(t), knobs, "only pre-created knobs are written");
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
        for level in ["kubepods", "kubepods/burstable", "kubepods/burstable/podu1"] {
            let d = t.join("cpuset").join(level);
            assert_eq!(read(d.join("cpuset.cpus")), "0-1", "{level}");
            assert_eq!(read(d.join("cpuset.mems")), "0", "{level}");
        }
        // The kernel is to copy the pod's cpus and mems into the container cgroups runc makes
        // below it; the flag is set on the cgroup created, not above it.
        let clone = |level: &str| read(t.join("cpuset").join(level).join("cgroup.clone_children"));
        assert_eq!(clone("kubepods/burstable/podu1"), "1");
        assert_eq!(clone("kubepods/burstable"), "0");
        assert_eq!(clone(""), "0");
        assert!(
            t.join("systemd/kubepods/burstable/podu1").is_dir(),
            "named hierarchy too"
        );
        assert!(
            t.join("unified/kubepods/burstable/podu1").is_dir(),
            "hybrid unified mount too"
        );
        assert!(
            std::fs::read_dir(t.join("unified/kubepods/burstable/podu1"))
                .unwrap()
                .next()
                .is_none(),
            "no values in hybrid unified"
        );
        // No limit: quota -1, pids max; a zero memory limit leaves the knob alone.
        cg.update(
            "/kubepods/burstable/podu1",
            &ResourceConfig {
                cpu_quota: Some(0),
                memory_limit: Some(0),
                pids_limit: Some(-1),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            read(t.join("cpu/kubepods/burstable/podu1/cpu.cfs_quota_us")),
            "-1"
        );
        assert_eq!(
            read(t.join("pids/kubepods/burstable/podu1/pids.max")),
            "max"
        );
        assert_eq!(
            read(t.join("memory/kubepods/burstable/podu1/memory.limit_in_bytes")),
            "134217728"
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
    fn a_missing_knob_is_an_error_naming_knob_value_and_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let cg = Cgroupfs::new(fake_v1(t, &["kubepods"]));
        std::fs::remove_file(t.join("pids/kubepods/pids.max")).unwrap();
        let knobs = files(t);
        let err = cg
            .update(
                "/kubepods",
                &ResourceConfig {
                    pids_limit: Some(100),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            matches!(&err, CgroupError::Write { knob, value, source, .. }
                if knob == "pids.max" && value == "100" && source.kind() == io::ErrorKind::NotFound),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "cannot write 100 to pids.max of {}: no such knob",
                t.join("pids/kubepods").display()
            )
        );
        assert_eq!(files(t), knobs, "the missing knob is not created");
    }

    #[test]
    fn v2_create_writes_weight_max_and_enables_controllers() {
        let tmp = tempfile::tempdir().unwrap();
        fixture(
            tmp.path(),
            &[
                ("cgroup.controllers", "cpuset cpu io memory pids"),
                ("cgroup.subtree_control", ""),
            ],
        );
        fixture(&tmp.path().join("kubepods"), V2);
        fixture(&tmp.path().join("kubepods/podu2"), V2);
        let knobs = files(tmp.path());
        let cg = Cgroupfs::new(Hierarchies {
            v1: vec![],
            unified: Some(tmp.path().to_owned()),
        });
        let cfg = ResourceConfig {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(1 << 27),
            pids_limit: Some(100),
            ..Default::default()
        };
        cg.create("/kubepods/podu2", &cfg).unwrap();
        assert_eq!(
            files(tmp.path()),
            knobs,
            "only pre-created knobs are written"
        );
        let d = tmp.path().join("kubepods/podu2");
        assert_eq!(read(d.join("cpu.weight")), "39");
        assert_eq!(read(d.join("cpu.max")), "50000 100000");
        assert_eq!(read(d.join("memory.max")), "134217728");
        assert_eq!(read(d.join("pids.max")), "100");
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
        assert!(!cg.exists("/kubepods/podu3"));
    }

    #[test]
    fn weight_curve_matches_kubelet() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
    }
}
