//! Eviction signals observed on this node (kubelet's `makeSignalObservations`), read from cgroup
//! files (tested against a temporary directory laid out the same way) and, through procfs, from
//! `/proc`.
//!
//! - `memory.available` = node capacity − working set of the root memory cgroup, where working
//!   set = `memory.usage_in_bytes` − `total_inactive_file` (never below 0).
//! - `allocatableMemory.available` = the `kubepods` limit − the working set of `kubepods`.
//! - `pid.available` = `kernel.pid_max` − the tasks that exist (the total of `/proc/loadavg`).
//!
//! - `nodefs.available` / `nodefs.inodesFree`: `statvfs` of the filesystem holding the agent's
//!   root directory and pod logs; `imagefs.*` the same for the runtime's image filesystem (the
//!   one CRI `ImageFsInfo` names, or nodefs when it is the same or unknown).
//!
//! The memory files are read here rather than through cgroups-rs: its only reader of usage and
//! `memory.stat` is `MemController::memory_stat`, which reads eleven files per call on v1 (and a
//! pass runs every 10 ms for 2 s after a notification) and turns a file it cannot read into 0,
//! so a missing cgroup would look like a node with all its memory available. A pod's
//! `pids.current` goes through cgroups-rs (`PidController::get_pid_current`, in the provider).

use std::path::Path;

/// One signal's observation: what is available and out of what capacity (bytes or counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Available now.
    pub available: i64,
    /// Capacity the percentages refer to.
    pub capacity: i64,
}

fn read_i64(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `total_inactive_file` (or `inactive_file` when the total is absent) of a v1 memory cgroup.
pub fn inactive_file(cgroup: &Path) -> Option<i64> {
    let stat = std::fs::read_to_string(cgroup.join("memory.stat")).ok()?;
    let get = |key: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    };
    get("total_inactive_file").or_else(|| get("inactive_file"))
}

/// Working set of a v1 memory cgroup, bytes: usage − inactive_file, never below 0.
pub fn working_set(cgroup: &Path) -> Option<i64> {
    let usage = read_i64(&cgroup.join("memory.usage_in_bytes"))?;
    Some((usage - inactive_file(cgroup).unwrap_or(0)).max(0))
}

/// Working set of a cgroup v2 directory, bytes: `memory.current` − `inactive_file`.
pub fn working_set_v2(cgroup: &Path) -> Option<i64> {
    let usage = read_i64(&cgroup.join("memory.current"))?;
    Some((usage - inactive_file(cgroup).unwrap_or(0)).max(0))
}

/// Working set of a memory cgroup of either version, bytes.
pub fn working_set_any(cgroup: &Path) -> Option<i64> {
    working_set(cgroup).or_else(|| working_set_v2(cgroup))
}

/// `memory.available` for a node of `capacity` bytes, from the root memory cgroup.
pub fn memory_available(root_memcg: &Path, capacity: i64) -> Option<Observation> {
    Some(Observation {
        available: capacity - working_set(root_memcg)?,
        capacity,
    })
}

/// `memory.available` on cgroup v2, whose root cgroup has no `memory.current`: capacity minus
/// the node's working set, `MemTotal − MemFree` (from `/proc/meminfo`) less the root's
/// `inactive_file` (from `<unified>/memory.stat`), as cAdvisor computes the root's usage on v2
/// for kubelet (libcontainer's `rootStatsFromMeminfo`).
pub fn memory_available_v2(unified: &Path, capacity: i64) -> Option<Observation> {
    use procfs::Current;
    let m = procfs::Meminfo::current().ok()?;
    let usage = i64::try_from(m.mem_total.saturating_sub(m.mem_free)).ok()?;
    let working_set = (usage - inactive_file(unified).unwrap_or(0)).max(0);
    Some(Observation {
        available: capacity - working_set,
        capacity,
    })
}

/// `allocatableMemory.available` from the `kubepods` memory cgroup (its limit is allocatable).
pub fn allocatable_memory_available(kubepods_memcg: &Path) -> Option<Observation> {
    let capacity = read_i64(&kubepods_memcg.join("memory.limit_in_bytes"))?;
    Some(Observation {
        available: capacity - working_set(kubepods_memcg)?,
        capacity,
    })
}

/// `pid.available` from `kernel.pid_max` and `/proc/loadavg`, whose `max` (the number after the
/// `/`) counts the tasks that exist.
pub fn pid_available(pid_max: i64, loadavg: &procfs::LoadAverage) -> Observation {
    Observation {
        available: pid_max - i64::from(loadavg.max),
        capacity: pid_max,
    }
}

/// `pid.available` of this node, from procfs; `None` when `/proc` cannot be read.
pub fn pid_available_now() -> Option<Observation> {
    use procfs::Current;
    let pid_max = procfs::sys::kernel::pid_max().ok()?;
    let loadavg = procfs::LoadAverage::current().ok()?;
    Some(pid_available(pid_max.into(), &loadavg))
}

/// `<prefix>.available` (bytes available to unprivileged users) and `<prefix>.inodesFree` of the
/// filesystem holding `path`, via `statvfs`.
pub fn filesystem(path: &Path) -> Option<(Observation, Observation)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = st.fragment_size() as i64;
    Some((
        Observation {
            available: st.blocks_available() as i64 * frsize,
            capacity: st.blocks() as i64 * frsize,
        },
        Observation {
            available: st.files_free() as i64,
            capacity: st.files() as i64,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_from_a_fake_cgroupfs() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("memory");
        let kubepods = root.join("kubepods");
        std::fs::create_dir_all(&kubepods).unwrap();
        std::fs::write(root.join("memory.usage_in_bytes"), "3000\n").unwrap();
        std::fs::write(
            root.join("memory.stat"),
            "cache 9\ninactive_file 5\ntotal_inactive_file 1000\n",
        )
        .unwrap();
        std::fs::write(kubepods.join("memory.usage_in_bytes"), "700\n").unwrap();
        std::fs::write(kubepods.join("memory.limit_in_bytes"), "2000\n").unwrap();
        std::fs::write(kubepods.join("memory.stat"), "inactive_file 900\n").unwrap();
        assert_eq!(working_set(&root), Some(2000));
        let v2 = tmp.path().join("v2");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.current"), "5000\n").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 10\ninactive_file 1500\n").unwrap();
        assert_eq!(working_set_any(&v2), Some(3500));
        assert_eq!(
            memory_available(&root, 10_000),
            Some(Observation {
                available: 8000,
                capacity: 10_000
            })
        );
        // Inactive file above usage: working set 0, not negative.
        assert_eq!(
            allocatable_memory_available(&kubepods),
            Some(Observation {
                available: 2000,
                capacity: 2000
            })
        );
        let loadavg: procfs::LoadAverage =
            procfs::FromRead::from_read("0.10 0.20 0.30 2/345 6789\n".as_bytes()).unwrap();
        assert_eq!(
            pid_available(32768, &loadavg),
            Observation {
                available: 32768 - 345,
                capacity: 32768
            }
        );
    }

    #[test]
    fn this_node_has_memory_pid_and_filesystem_signals() {
        assert!(pid_available_now().is_some_and(|o| o.available > 0));
        let (bytes, inodes) = filesystem(Path::new("/")).unwrap();
        assert!(bytes.capacity > 0 && (0..=bytes.capacity).contains(&bytes.available));
        assert!(inodes.available <= inodes.capacity);
        assert!(filesystem(Path::new("/no/such/dir")).is_none());
        let root = Path::new("/sys/fs/cgroup/memory");
        if root.join("memory.usage_in_bytes").exists() {
            assert!(working_set(root).is_some_and(|w| w > 0));
        }
    }
}
