//! A container's or a pod's cpu and memory read straight from its cgroup, as cAdvisor reads
//! them for kubelet's summary and resource metrics: cpu time from `cpuacct.usage` (v1) or the
//! `usage_usec` of `cpu.stat` (v2); memory usage from `memory.usage_in_bytes` (v1) or
//! `memory.current` (v2), and from one read of `memory.stat` the inactive file pages (working
//! set = usage − inactive_file), rss (`total_rss` / `anon`) and page faults.
//!
//! Not through cgroups-rs: its `MemController::memory_stat` reads eleven files per cgroup
//! (`memory.numa_stat` among them) where these figures need two, and a scrape at 110 pods reads
//! 220 cgroups; the runtime's `ListContainerStats` (what kubelet v1.20 asks) costs the runtime a
//! call to every container's shim, 90 ms at 110 pods on the test machines, so the scrape path
//! does not use it for cpu and memory.

use std::path::Path;

/// What a cgroup has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Cumulative cpu time, nanoseconds.
    pub cpu_ns: Option<u64>,
    /// Memory in use, bytes (page cache included).
    pub usage: Option<u64>,
    /// Usage less inactive file pages, bytes.
    pub working_set: Option<u64>,
    /// Anonymous memory, bytes.
    pub rss: Option<u64>,
    /// Page faults, cumulative.
    pub page_faults: Option<u64>,
    /// Major page faults, cumulative.
    pub major_page_faults: Option<u64>,
}

/// A cgroup file's text, in one `read` (open, read, close: `std::fs::read_to_string` also
/// stats the file for a size hint and reads again for the end; a scrape at 110 pods reads 660
/// of these files). Files longer than the buffer (none of those read here) are cut.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; 4096];
    let n = f.read(&mut buf).ok()?;
    String::from_utf8(buf[..n].to_vec()).ok()
}

fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

/// The value of `key` in a `key value` per line file (`memory.stat`, `cpu.stat`).
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Cumulative cpu time of a cgroup, nanoseconds: v1 `cpuacct.usage` of `v1` (its directory in
/// the `cpuacct` hierarchy), else v2 `usage_usec` of `cpu.stat` of `v2`.
pub fn cpu_ns(v1: Option<&Path>, v2: Option<&Path>) -> Option<u64> {
    v1.and_then(|d| read_u64(&d.join("cpuacct.usage")))
        .or_else(|| {
            let stat = read_small(&v2?.join("cpu.stat"))?;
            stat_value(&stat, "usage_usec").map(|us| us.saturating_mul(1000))
        })
}

/// The cgroup's usage: cpu from `cpu_dir` (the `cpuacct` directory on v1, the cgroup on v2),
/// memory from `mem_dir`; `v2` picks the file names. A figure whose file cannot be read is
/// `None` (the cgroup is gone: the container just stopped).
pub fn read(cpu_dir: Option<&Path>, mem_dir: Option<&Path>, v2: bool) -> Usage {
    let cpu_ns = if v2 {
        cpu_ns(None, cpu_dir)
    } else {
        cpu_ns(cpu_dir, None)
    };
    let Some(mem) = mem_dir else {
        return Usage {
            cpu_ns,
            ..Usage::default()
        };
    };
    let (usage_file, prefix) = if v2 {
        ("memory.current", "")
    } else {
        ("memory.usage_in_bytes", "total_")
    };
    let usage = read_u64(&mem.join(usage_file));
    let stat = read_small(&mem.join("memory.stat")).unwrap_or_default();
    let key = |k: &str| stat_value(&stat, &format!("{prefix}{k}"));
    let rss = if v2 { key("anon") } else { key("rss") };
    Usage {
        cpu_ns,
        usage,
        working_set: usage.map(|u| u.saturating_sub(key("inactive_file").unwrap_or(0))),
        rss,
        page_faults: key("pgfault"),
        major_page_faults: key("pgmajfault"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_cgroups_read_alike() {
        let v1 = tempfile::tempdir().unwrap();
        std::fs::write(v1.path().join("cpuacct.usage"), "5000\n").unwrap();
        std::fs::write(v1.path().join("memory.usage_in_bytes"), "1000000\n").unwrap();
        std::fs::write(
            v1.path().join("memory.stat"),
            "cache 9\nrss 1\ninactive_file 7\ntotal_cache 500\ntotal_rss 300000\ntotal_inactive_file 200000\ntotal_pgfault 42\ntotal_pgmajfault 2\n",
        )
        .unwrap();
        let u = read(Some(v1.path()), Some(v1.path()), false);
        assert_eq!(
            u,
            Usage {
                cpu_ns: Some(5000),
                usage: Some(1_000_000),
                working_set: Some(800_000),
                rss: Some(300_000),
                page_faults: Some(42),
                major_page_faults: Some(2),
            },
            "the hierarchy's totals, not the cgroup's own line"
        );
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cpu.stat"), "usage_usec 7\nuser_usec 5\n").unwrap();
        std::fs::write(v2.path().join("memory.current"), "1000\n").unwrap();
        std::fs::write(
            v2.path().join("memory.stat"),
            "anon 600\nfile 400\ninactive_file 100\npgfault 9\npgmajfault 1\n",
        )
        .unwrap();
        let u = read(Some(v2.path()), Some(v2.path()), true);
        assert_eq!(u.cpu_ns, Some(7000));
        assert_eq!(
            (u.usage, u.working_set, u.rss),
            (Some(1000), Some(900), Some(600))
        );
        assert_eq!((u.page_faults, u.major_page_faults), (Some(9), Some(1)));
        let gone = read(Some(&v2.path().join("x")), Some(&v2.path().join("x")), true);
        assert_eq!(
            (gone.cpu_ns, gone.usage, gone.working_set),
            (None, None, None)
        );
    }
}
