//! The cgroup hierarchies of this host: [`Hierarchies`] lists the mounted hierarchies, read from
//! `/proc/self/mountinfo` through procfs (or written out by a test).

use std::path::{Path, PathBuf};

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
}
