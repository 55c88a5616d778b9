//! How much of a filesystem a directory uses (kubelet's `pkg/volume/metrics_du.go` and
//! `pkg/volume/util/fs`): `du` and an inode count of a volume or log directory, with `statvfs`
//! of the filesystem holding it. The eviction manager (local storage limits) and the node API's
//! `/stats/summary` (volumes, logs, ephemeral storage) read the same figures.

use std::path::Path;

/// Space and inodes a directory tree uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of the blocks in use.
    pub bytes: i64,
    /// Files and directories, the top one included.
    pub inodes: i64,
}

/// A volume's figures in kubelet's `VolumeStats` terms (`FsStats`): what it uses ([`du`]) and
/// what its filesystem has (`statvfs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Metrics {
    /// `usedBytes`: [`Usage::bytes`].
    pub used_bytes: i64,
    /// `inodesUsed`: [`Usage::inodes`].
    pub inodes_used: i64,
    /// `capacityBytes`: the filesystem's size.
    pub capacity_bytes: i64,
    /// `availableBytes`: what unprivileged users may still write.
    pub available_bytes: i64,
    /// `inodes`: the filesystem's inodes.
    pub inodes: i64,
    /// `inodesFree`.
    pub inodes_free: i64,
}

/// [`du`] of `dir` with `statvfs` of its filesystem (kubelet's `MetricsDu.GetMetrics`);
/// `None` when `dir` cannot be read (the volume is gone).
pub fn metrics_du(dir: &Path) -> Option<Metrics> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let u = du(dir);
    let frsize = i64::try_from(st.fragment_size()).unwrap_or(0);
    let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    Some(Metrics {
        used_bytes: u.bytes,
        inodes_used: u.inodes,
        capacity_bytes: n(st.blocks()).saturating_mul(frsize),
        available_bytes: n(st.blocks_available()).saturating_mul(frsize),
        inodes: n(st.files()),
        inodes_free: n(st.files_free()),
    })
}

/// What `du` counts below `dir`: the blocks in use (512 bytes each) of every file and
/// directory, and how many there are (the top one too), a file with several hard links once, other filesystems (a mount below it) left
/// out (kubelet's `MetricsDu`, `fs.DiskUsage`). The walk goes from directory descriptor to
/// directory descriptor (`openat`, `fstatat`), never through a full path, so a tree nested past
/// `PATH_MAX` is counted whole (a container cannot hide data below a 4 KiB path); a directory
/// stays open only while entries of it wait to be walked.
pub fn du(dir: &Path) -> Usage {
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
    use std::os::fd::OwnedFd;
    use std::rc::Rc;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(top) = nix::fcntl::open(dir, flags, Mode::empty()) else {
        return Usage::default();
    };
    let Ok(st) = fstat(&top) else {
        return Usage::default();
    };
    let dev = st.st_dev;
    let blocks = |st: &nix::sys::stat::FileStat| st.st_blocks.max(0).saturating_mul(512);
    let mut bytes = blocks(&st);
    let mut inodes = 1i64;
    let mut seen = std::collections::HashSet::new();
    // Directories still to walk: (their parent, their name).
    let mut pending: Vec<(Rc<OwnedFd>, std::ffi::CString)> = Vec::new();
    let mut next = Some(Rc::new(top));
    while let Some(fd) = next.take().or_else(|| {
        while let Some((parent, name)) = pending.pop() {
            if let Ok(child) = nix::fcntl::openat(&*parent, name.as_c_str(), flags, Mode::empty()) {
                return Some(Rc::new(child));
            }
        }
        None
    }) {
        let Some(mut entries) = fd
            .try_clone()
            .ok()
            .and_then(|d| nix::dir::Dir::from_fd(d).ok())
        else {
            continue;
        };
        for e in entries.iter().flatten() {
            let name = e.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let Ok(st) = fstatat(&*fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if st.st_dev != dev || (st.st_nlink > 1 && !seen.insert(st.st_ino)) {
                continue;
            }
            bytes = bytes.saturating_add(blocks(&st));
            inodes += 1;
            if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR {
                pending.push((fd.clone(), name.to_owned()));
            }
        }
    }
    Usage { bytes, inodes }
}

/// Bytes (file lengths) and inodes (entries, the top directory left out) below `dir` (a pod's
/// log directory): what ephemeral-storage eviction counts for logs.
pub fn disk_usage(dir: &Path) -> (i64, i64) {
    let mut bytes = 0i64;
    let mut inodes = 0i64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            inodes += 1;
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                bytes += m.len() as i64;
            }
        }
    }
    (bytes, inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn du_counts_blocks_and_inodes_and_a_hard_link_once() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("v");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::hard_link(d.join("a"), d.join("sub/b")).unwrap();
        let u = du(&d);
        assert_eq!(u.inodes, 3, "v, sub and a (b is a again)");
        assert!(u.bytes >= 10_000 && u.bytes < 64 << 10, "{u:?}");
        let m = metrics_du(&d).unwrap();
        assert_eq!((m.used_bytes, m.inodes_used), (u.bytes, u.inodes));
        assert!(
            m.capacity_bytes >= m.available_bytes && m.available_bytes > 0,
            "{m:?}"
        );
        assert!(m.inodes >= m.inodes_free, "{m:?}");
        assert_eq!(metrics_du(&tmp.path().join("gone")), None);
    }

    /// A tree nested past PATH_MAX (4096 bytes) is counted whole: a container cannot hide data
    /// from its emptyDir's sizeLimit below a long path.
    #[test]
    fn du_counts_a_tree_nested_past_path_max() {
        use nix::fcntl::{openat, OFlag};
        use nix::sys::stat::{mkdirat, Mode};
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let mut fd = nix::fcntl::open(tmp.path(), flags, Mode::empty()).unwrap();
        // 1,000 levels of "dddd/": 5,000 bytes of path.
        for _ in 0..1000 {
            mkdirat(&fd, "dddd", Mode::from_bits_truncate(0o755)).unwrap();
            fd = openat(&fd, "dddd", flags, Mode::empty()).unwrap();
        }
        let file = openat(
            &fd,
            "big",
            OFlag::O_WRONLY | OFlag::O_CREAT,
            Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let mut f = std::fs::File::from(file);
        f.write_all(&vec![1u8; 4 << 20]).unwrap();
        f.sync_all().unwrap();
        let counted = du(tmp.path()).bytes;
        assert!(counted >= 4 << 20, "counted {counted}");
    }
}
