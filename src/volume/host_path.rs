//! hostPath (kubelet's `pkg/volume/hostpath`): a path of the host, checked by `type` as kubelet's
//! `checkType` checks it: `""` nothing; `DirectoryOrCreate` creates a missing directory (0755);
//! `Directory` must be one; `FileOrCreate` creates a missing empty file (0644; its parent must
//! exist); `File`, `Socket`, `CharDevice`, `BlockDevice` must be one.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;

use super::{SetUp, SetUpError, VolumePlugin};

/// The hostPath plugin.
pub struct HostPath;

/// The types a hostPath may declare.
pub const TYPES: [&str; 8] = [
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
];

/// Checks (and for the `OrCreate` types, creates) `path` for `kind`.
///
/// Errors: kubelet's message (`hostPath type check failed: /x is not a directory`).
pub fn check_type(path: &Path, kind: &str) -> Result<(), String> {
    let failed = |what: &str| {
        format!(
            "hostPath type check failed: {} is not {what}",
            path.display()
        )
    };
    let meta = std::fs::metadata(path);
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(failed("a directory")),
            Err(_) => {
                std::fs::create_dir_all(path)
                    .map_err(|e| format!("mkdir {}: {e}", path.display()))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| e.to_string())
            }
        },
        "Directory" => meta
            .ok()
            .filter(|m| m.is_dir())
            .map(drop)
            .ok_or_else(|| failed("a directory")),
        "FileOrCreate" => match meta {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(failed("a file")),
            Err(_) => {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(path)
                    .map(drop)
                    .map_err(|e| format!("create {}: {e}", path.display()))
            }
        },
        "File" => meta
            .ok()
            .filter(|m| m.is_file())
            .map(drop)
            .ok_or_else(|| failed("a file")),
        "Socket" => meta
            .ok()
            .filter(|m| m.file_type().is_socket())
            .map(drop)
            .ok_or_else(|| failed("a socket file")),
        "CharDevice" => meta
            .ok()
            .filter(|m| m.file_type().is_char_device())
            .map(drop)
            .ok_or_else(|| failed("a character device")),
        "BlockDevice" => meta
            .ok()
            .filter(|m| m.file_type().is_block_device())
            .map(drop)
            .ok_or_else(|| failed("a block device")),
        other => Err(format!("hostPath type {other:?} is not supported")),
    }
}

impl VolumePlugin for HostPath {
    fn set_up(&self, v: &Volume, _dir: &Path, _s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let hp = v
            .host_path
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not a hostPath".into()))?;
        let path = PathBuf::from(&hp.path);
        check_type(&path, hp.type_.as_deref().unwrap_or("")).map_err(SetUpError::HostPathType)?;
        Ok(path)
    }

    /// Nothing: a hostPath belongs to the host.
    fn tear_down(&self, _dir: &Path) {}

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~host-path"
    }

    fn requires_remount(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_checked_and_created_as_kubelet_does() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("data");
        assert_eq!(
            check_type(&d, "Directory"),
            Err(format!(
                "hostPath type check failed: {} is not a directory",
                d.display()
            ))
        );
        check_type(&d, "DirectoryOrCreate").unwrap();
        assert!(d.is_dir());
        check_type(&d, "Directory").unwrap();
        let f = d.join("conf");
        assert_eq!(
            check_type(&f, "File"),
            Err(format!(
                "hostPath type check failed: {} is not a file",
                f.display()
            ))
        );
        check_type(&f, "FileOrCreate").unwrap();
        check_type(&f, "File").unwrap();
        assert!(check_type(&d, "File").is_err(), "a directory is not a file");
        assert!(check_type(&tmp.path().join("no/such/parent/f"), "FileOrCreate").is_err());
        assert!(check_type(Path::new("/dev/null"), "CharDevice").is_ok());
        assert!(check_type(Path::new("/dev/null"), "BlockDevice").is_err());
        check_type(Path::new("/nonexistent"), "").unwrap();
    }
}
