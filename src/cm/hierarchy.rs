//! The cgroup hierarchies of this host, and how cgroups-rs reaches them.
//!
//! [`Hierarchies`] lists the mounted hierarchies, read from `/proc/self/mountinfo` through procfs
//! (or written out by a test). cgroups-rs does the file I/O below them through its
//! [`Hierarchy`] trait, implemented here twice because its built-in hierarchies cannot reach what
//! nodelet needs: its `V1` reads this process's mountinfo itself (so it cannot be pointed at a
//! fake cgroupfs), and its `V2` is fixed at `/sys/fs/cgroup`.
//!
//! - [`V1Mounts`]: cgroup v1 controllers and the named `name=systemd` hierarchy, each at its own
//!   mount point: this host's `/sys/fs/cgroup/<controller>`, or directories of a temporary fake
//!   cgroupfs.
//! - [`Unified`]: a cgroup v2 hierarchy rooted anywhere: `/sys/fs/cgroup` on a v2 host,
//!   `/sys/fs/cgroup/unified` in the hybrid layout of these machines, or a temporary directory.

use std::path::{Path, PathBuf};

use cgroups_rs::fs::blkio::BlkIoController;
use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::cpuset::CpuSetController;
use cgroups_rs::fs::devices::DevicesController;
use cgroups_rs::fs::freezer::FreezerController;
use cgroups_rs::fs::hugetlb::HugeTlbController;
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::net_cls::NetClsController;
use cgroups_rs::fs::net_prio::NetPrioController;
use cgroups_rs::fs::perf_event::PerfEventController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::rdma::RdmaController;
use cgroups_rs::fs::systemd::SystemdController;
use cgroups_rs::fs::{Cgroup, Hierarchy, Subsystem};
use procfs::process::MountInfo;

/// Mounted hierarchies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    /// cgroup v1 mounts: their controllers (`cpu`, `cpuacct`, `name=systemd`...) and mount point.
    pub v1: Vec<(Vec<String>, PathBuf)>,
    /// The cgroup2 mount, if any.
    pub unified: Option<PathBuf>,
}

/// Superblock options of a v1 cgroup mount that are not controllers.
fn is_mount_flag(option: &str) -> bool {
    matches!(
        option,
        "rw" | "ro" | "xattr" | "clone_children" | "cpuset_v2_mode" | "favordynmods"
    ) || option.contains("relatime")
        || option.starts_with("no")
}

impl Hierarchies {
    /// The hierarchies among `mounts` (procfs's parse of a `mountinfo` file): each `cgroup` mount
    /// with the controllers in its superblock options (a named hierarchy as `name=<name>`), and
    /// the `cgroup2` mount.
    pub fn from_mountinfo<'a>(mounts: impl IntoIterator<Item = &'a MountInfo>) -> Self {
        let mut h = Hierarchies::default();
        for m in mounts {
            match m.fs_type.as_str() {
                "cgroup" => {
                    let mut controllers: Vec<String> = m
                        .super_options
                        .iter()
                        .filter_map(|(option, value)| match (option.as_str(), value) {
                            ("name", Some(name)) => Some(format!("name={name}")),
                            (o, None) if !is_mount_flag(o) => Some(o.to_owned()),
                            _ => None,
                        })
                        .collect();
                    controllers.sort();
                    h.v1.push((controllers, m.mount_point.clone()));
                }
                "cgroup2" => h.unified = Some(m.mount_point.clone()),
                _ => {}
            }
        }
        h
    }

    /// The hierarchies of this process, from `/proc/self/mountinfo`; none when it cannot be read.
    pub fn current() -> Self {
        procfs::process::Process::myself()
            .and_then(|p| p.mountinfo())
            .map(|m| Self::from_mountinfo(&m))
            .unwrap_or_default()
    }

    /// True when cgroup v2 is the only hierarchy (values go to the unified mount).
    pub fn is_v2(&self) -> bool {
        self.v1.is_empty() && self.unified.is_some()
    }

    /// The mount point of the v1 hierarchy holding `controller`.
    pub fn v1_mount(&self, controller: &str) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(c, _)| c.iter().any(|x| x == controller))
            .map(|(_, p)| p.as_path())
    }

    /// Every mount point.
    pub fn all_mounts(&self) -> Vec<PathBuf> {
        self.v1
            .iter()
            .map(|(_, p)| p.clone())
            .chain(self.unified.clone())
            .collect()
    }
}

/// The parent of a cgroup path below a hierarchy's root (`a/b` → `a`, `a` → the root).
fn parent_path(path: &str) -> &Path {
    Path::new(path).parent().unwrap_or(Path::new(""))
}

/// cgroup v1 hierarchies at the given mount points, as a cgroups-rs [`Hierarchy`].
///
/// Every controller cgroups-rs knows gets a subsystem at its mount point (a mount holding
/// several, `cpu,cpuacct`, gives each the same directory), and so does the named `name=systemd`
/// hierarchy, where a cgroup is a directory only. A controller cgroups-rs does not know (`misc`)
/// and other named hierarchies get none, so cgroups are not created there (runc creates none in
/// other named hierarchies either); removal still goes through every mount.
#[derive(Debug, Clone, Default)]
pub struct V1Mounts {
    mounts: Vec<(Vec<String>, PathBuf)>,
}

impl V1Mounts {
    /// The v1 mounts of `h`.
    pub fn new(h: &Hierarchies) -> Self {
        Self {
            mounts: h.v1.clone(),
        }
    }

    /// True when there is no v1 mount.
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }
}

/// The cgroups-rs subsystem of v1 `controller` mounted at `point`, if cgroups-rs has one.
fn v1_subsystem(controller: &str, point: &Path) -> Option<Subsystem> {
    let (p, base) = (point.to_path_buf(), point.to_path_buf());
    Some(match controller {
        "cpu" => Subsystem::Cpu(CpuController::new(p, base, false)),
        "cpuacct" => Subsystem::CpuAcct(CpuAcctController::new(p, base)),
        "cpuset" => Subsystem::CpuSet(CpuSetController::new(p, base, false)),
        "memory" => Subsystem::Mem(MemController::new(p, base, false)),
        "pids" => Subsystem::Pid(PidController::new(p, base, false)),
        "hugetlb" => Subsystem::HugeTlb(HugeTlbController::new(p, base, false)),
        "blkio" => Subsystem::BlkIo(BlkIoController::new(p, base, false)),
        "devices" => Subsystem::Devices(DevicesController::new(p, base)),
        "freezer" => Subsystem::Freezer(FreezerController::new(p, base, false)),
        "net_cls" => Subsystem::NetCls(NetClsController::new(p, base)),
        "net_prio" => Subsystem::NetPrio(NetPrioController::new(p, base)),
        "perf_event" => Subsystem::PerfEvent(PerfEventController::new(p, base)),
        "rdma" => Subsystem::Rdma(RdmaController::new(p, base)),
        "name=systemd" => Subsystem::Systemd(SystemdController::new(p, base, false)),
        _ => return None,
    })
}

impl Hierarchy for V1Mounts {
    fn subsystems(&self) -> Vec<Subsystem> {
        self.mounts
            .iter()
            .flat_map(|(controllers, point)| {
                controllers
                    .iter()
                    .filter_map(move |c| v1_subsystem(c, point))
            })
            .collect()
    }

    /// The directory holding the mount points (`/sys/fs/cgroup`), as cgroups-rs's own `V1` has it.
    fn root(&self) -> PathBuf {
        self.mounts
            .first()
            .and_then(|(_, p)| p.parent())
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), parent_path(path))
    }

    fn v2(&self) -> bool {
        false
    }
}

/// A cgroup v2 hierarchy rooted at any directory, as a cgroups-rs [`Hierarchy`].
///
/// It offers the v2 controllers cgroups-rs has (cpu, memory, pids, hugetlb, cpuset, io) without
/// reading `cgroup.controllers`: a value written for a controller that is not enabled finds no
/// knob and fails, as it would on the kernel's cgroupfs.
#[derive(Debug, Clone)]
pub struct Unified {
    root: PathBuf,
}

impl Unified {
    /// The hierarchy mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Hierarchy for Unified {
    fn subsystems(&self) -> Vec<Subsystem> {
        let (p, base) = (self.root.clone(), self.root.clone());
        vec![
            Subsystem::Cpu(CpuController::new(p.clone(), base.clone(), true)),
            Subsystem::Mem(MemController::new(p.clone(), base.clone(), true)),
            Subsystem::Pid(PidController::new(p.clone(), base.clone(), true)),
            Subsystem::HugeTlb(HugeTlbController::new(p.clone(), base.clone(), true)),
            Subsystem::CpuSet(CpuSetController::new(p.clone(), base.clone(), true)),
            Subsystem::BlkIo(BlkIoController::new(p, base, true)),
        ]
    }

    fn root(&self) -> PathBuf {
        self.root.clone()
    }

    fn root_control_group(&self) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), "")
    }

    fn parent_control_group(&self, path: &str) -> Cgroup {
        Cgroup::load(Box::new(self.clone()), parent_path(path))
    }

    fn v2(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use procfs::process::MountInfos;
    use procfs::FromBufRead;

    const MOUNTINFO: &str = "\
25 24 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
28 25 0:25 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/net_cls,net_prio rw,relatime - cgroup cgroup rw,net_cls,net_prio
29 25 0:26 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    fn parse(text: &str) -> Hierarchies {
        let infos = MountInfos::from_buf_read(text.as_bytes()).unwrap();
        Hierarchies::from_mountinfo(&infos)
    }

    #[test]
    fn mountinfo_is_parsed_into_hierarchies() {
        let h = parse(MOUNTINFO);
        assert_eq!(h.v1.len(), 4);
        assert_eq!(h.v1_mount("cpu"), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(
            h.v1_mount("name=systemd"),
            Some(Path::new("/sys/fs/cgroup/systemd"))
        );
        assert_eq!(
            h.v1[2].0,
            vec!["name=systemd".to_string()],
            "no mount flags"
        );
        assert_eq!(
            h.v1_mount("net_prio"),
            Some(Path::new("/sys/fs/cgroup/net_cls,net_prio"))
        );
        assert_eq!(
            h.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert!(!h.is_v2());
        let v2 = parse("29 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
        assert!(v2.is_v2());
    }

    #[test]
    fn this_host_has_cgroup_mounts() {
        assert!(!Hierarchies::current().all_mounts().is_empty());
    }

    #[test]
    fn v1_mounts_give_cgroups_rs_a_subsystem_per_known_controller() {
        let h = parse(MOUNTINFO);
        let cg = Cgroup::load(Box::new(V1Mounts::new(&h)), "kubepods/podx");
        let mut dirs: Vec<(String, PathBuf)> = cg
            .subsystems()
            .iter()
            .map(|s| (s.controller_name(), s.to_controller().path().to_owned()))
            .collect();
        dirs.sort();
        let want = |c: &str, m: &str| (c.to_string(), PathBuf::from(m).join("kubepods/podx"));
        assert_eq!(
            dirs,
            vec![
                want("cpu", "/sys/fs/cgroup/cpu"),
                want("memory", "/sys/fs/cgroup/memory"),
                want("name=systemd", "/sys/fs/cgroup/systemd"),
                want("net_cls", "/sys/fs/cgroup/net_cls,net_prio"),
                want("net_prio", "/sys/fs/cgroup/net_cls,net_prio"),
            ]
        );
        assert!(!cg.v2());
        assert_eq!(
            cg.parent_control_group().path(),
            "kubepods",
            "parent below the same mounts"
        );
    }

    #[test]
    fn unified_is_rooted_where_it_is_mounted() {
        let cg = Cgroup::load(
            Box::new(Unified::new("/sys/fs/cgroup/unified")),
            "kubepods/podx",
        );
        assert!(cg.v2());
        assert!(cg.subsystems().iter().all(|s| {
            s.to_controller().v2()
                && s.to_controller().path() == Path::new("/sys/fs/cgroup/unified/kubepods/podx")
        }));
        assert_eq!(cg.parent_control_group().path(), "kubepods");
    }
}
