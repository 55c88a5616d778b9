//! Removing a pod's directory tree without leaving it (kubelet's
//! `removeall.RemoveAllOneFilesystem`, which it uses for pod directories): a symlink is removed,
//! never followed; a tree that holds a mount point (a bind mount, a tmpfs another process made)
//! is not touched at all, so the mount's source keeps its files; and the walk refuses any
//! directory on another device in case the mount table missed one.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Mount points at or under `dir` (from `/proc/self/mountinfo`, read with procfs). Empty when
/// the table cannot be read (the walk's device check still stops at a mount).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(me) = procfs::process::Process::myself() else {
        return Vec::new();
    };
    let Ok(mounts) = me.mountinfo() else {
        return Vec::new();
    };
    mounts
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Removes `path` and everything under it, on its own filesystem only: a symlink (or a file) at
/// `path` is unlinked; a tree holding a mount point is refused before anything in it is
/// removed.
///
/// Errors: `ResourceBusy` naming the mount point (nothing removed) or a directory on another
/// device met during the walk (what was walked before it is gone); the filesystem's otherwise.
/// A path that is already gone is no error.
pub fn remove_all_one_filesystem(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    if let Some(m) = mounts_under(path).first() {
        return Err(busy(&format!(
            "{} holds a mount at {}",
            path.display(),
            m.display()
        )));
    }
    let dev = meta.dev();
    // Post-order, with an explicit stack: a deep tree cannot exhaust the thread's stack.
    let mut stack = vec![(path.to_path_buf(), false)];
    while let Some((p, emptied)) = stack.pop() {
        if emptied {
            ignore_gone(std::fs::remove_dir(&p))?;
            continue;
        }
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if !m.is_dir() {
            ignore_gone(std::fs::remove_file(&p))?;
            continue;
        }
        if m.dev() != dev {
            return Err(busy(&format!(
                "{} is on another filesystem (a mount)",
                p.display()
            )));
        }
        stack.push((p.clone(), true));
        for e in std::fs::read_dir(&p)? {
            stack.push((e?.path(), false));
        }
    }
    Ok(())
}

fn busy(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, message.to_owned())
}

fn ignore_gone(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("sub/f"), "keep").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::fs::write(tree.join("a/b/file"), "x").unwrap();
        remove_all_one_filesystem(&tree).unwrap();
        assert!(!tree.exists());
        // A symlink as the path itself.
        let top = tmp.path().join("top");
        std::os::unix::fs::symlink(&outside, &top).unwrap();
        remove_all_one_filesystem(&top).unwrap();
        assert!(std::fs::symlink_metadata(&top).is_err());
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/f")).unwrap(),
            "keep"
        );
        // Gone already: no error.
        remove_all_one_filesystem(&tree).unwrap();
    }
}
