//! Checkpoints of the last good static pod manifests (after kubelet's `checkpointmanager`).
//!
//! When a manifest that ran a pod is broken by an edit, nodelet keeps the pod from its last good
//! version. The checkpoint makes that survive an agent restart: each good manifest is copied to
//! `<root-dir>/static-pods/<hash of its path>.json` as `{"path", "manifest"}`, and removed when
//! the manifest file is removed. Checkpoints are readable by their owner only (mode 0600): a
//! manifest may hold Secrets.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    path: PathBuf,
    manifest: String,
}

/// A directory of manifest checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    dir: PathBuf,
}

impl CheckpointStore {
    /// A store in `dir` (created on first write).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn file_for(&self, manifest: &Path) -> PathBuf {
        let h = crate::hash::fnv1a64(manifest.as_os_str().as_encoded_bytes());
        self.dir.join(format!("{h:016x}.json"))
    }

    /// Records `bytes` as the last good content of `manifest`. Manifests that are not UTF-8
    /// are not recorded (they never decode anyway).
    ///
    /// Errors: the I/O error of creating the directory or writing the file.
    pub fn save(&self, manifest: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return Ok(());
        };
        std::fs::create_dir_all(&self.dir)?;
        let cp = Checkpoint {
            path: manifest.to_owned(),
            manifest: text.to_owned(),
        };
        let json = serde_json::to_vec(&cp).map_err(std::io::Error::other)?;
        let target = self.file_for(manifest);
        let tmp = target.with_extension("tmp");
        // Owner-only: a manifest may hold Secrets.
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?
            .write_all(&json)?;
        std::fs::rename(tmp, target)
    }

    /// Forgets `manifest` (its file was removed).
    pub fn remove(&self, manifest: &Path) {
        let _ = std::fs::remove_file(self.file_for(manifest));
    }

    /// Every checkpoint: (manifest path, last good content). Unreadable entries are skipped.
    pub fn load(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<Checkpoint>(&b).ok())
            .map(|c| (c.path, c.manifest.into_bytes()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_remove_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let s = CheckpointStore::new(dir.path().join("cp"));
        assert!(s.load().is_empty());
        s.save(Path::new("/m/a.yaml"), b"one").unwrap();
        s.save(Path::new("/m/a.yaml"), b"two").unwrap();
        s.save(Path::new("/m/b.yaml"), b"b").unwrap();
        let mut l = s.load();
        l.sort();
        assert_eq!(
            l,
            vec![
                (PathBuf::from("/m/a.yaml"), b"two".to_vec()),
                (PathBuf::from("/m/b.yaml"), b"b".to_vec())
            ]
        );
        s.remove(Path::new("/m/a.yaml"));
        assert_eq!(s.load().len(), 1);
    }
}
