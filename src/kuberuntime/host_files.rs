//! The files on the host that a container's start makes before CreateContainer (kubelet's
//! `generateContainerConfig` and `makeMounts` in `kuberuntime_container.go` and
//! `kubelet_pods.go`): the container's termination message file, the pod's managed hosts file
//! and the container's log directory. [`HostFiles`] is computed from the pod without I/O;
//! [`HostFiles::make`] makes them and returns the mounts they add. They are made on the
//! calling thread, the runtime's worker: a few `mkdir` and small writes under `--root-dir` and
//! `podLogsDir` (see [`crate::blocking`] for why and what goes elsewhere).

use std::path::PathBuf;

use super::hosts_file::HostsFile;
use crate::cri::api;

/// A container's termination message file to make: an empty file under the pod's directory,
/// mounted at `terminationMessagePath` (see [`super::termination_message`]).
#[derive(Debug, Clone)]
pub struct TerminationFile {
    /// `<root-dir>/pods/<uid>`.
    pub pod_dir: PathBuf,
    /// The container's name.
    pub name: String,
    /// The container's restart count (part of the file's name).
    pub attempt: u32,
    /// `terminationMessagePath`, in the container.
    pub container_path: String,
}

/// What one container's start makes on the host.
#[derive(Debug, Clone)]
pub struct HostFiles {
    /// The termination message file; `None` when the container has no
    /// `terminationMessagePath`.
    pub termination: Option<TerminationFile>,
    /// The pod's hosts file; `None` while the pod has no IP.
    pub hosts: Option<HostsFile>,
    /// The container's log directory, `<podLogsDir>/<namespace>_<name>_<uid>/<container>`.
    pub log_dir: PathBuf,
}

/// A file that could not be made: kubelet's reason for the container's waiting state and the
/// message (the path and the I/O error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFileError {
    /// `CreateContainerConfigError` (termination message or hosts file) or
    /// `CreateContainerError` (log directory), as kubelet reports them.
    pub reason: &'static str,
    /// What failed.
    pub message: String,
}

impl HostFiles {
    /// Makes the termination message file, then writes the hosts file, then makes the log
    /// directory; returns the mounts to add to the container's config, in that order (the
    /// termination message file's, then `/etc/hosts`).
    ///
    /// Errors: the first that failed ([`HostFileError`]); what was made before it stays (the
    /// next attempt makes a new termination message file and rewrites the hosts file).
    pub fn make(self) -> Result<Vec<api::Mount>, HostFileError> {
        let config_error = |message: String| HostFileError {
            reason: "CreateContainerConfigError",
            message,
        };
        let mut mounts = Vec::new();
        if let Some(t) = self.termination {
            let host = super::termination_message::prepare(&t.pod_dir, &t.name, t.attempt)
                .map_err(|e| {
                    config_error(format!("cannot create the termination message file: {e}"))
                })?;
            mounts.push(super::termination_message::mount(&host, &t.container_path));
        }
        if let Some(h) = self.hosts {
            let mount = h
                .write()
                .map_err(|e| config_error(format!("cannot write the pod's hosts file: {e}")))?;
            mounts.push(mount);
        }
        std::fs::create_dir_all(&self.log_dir).map_err(|e| HostFileError {
            reason: "CreateContainerError",
            message: format!(
                "cannot create log directory {}: {e}",
                self.log_dir.display()
            ),
        })?;
        Ok(mounts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> k8s_openapi::api::core::v1::Pod {
        serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: ns, uid: u1}\nspec: {containers: [{name: c, image: b}]}",
        )
        .unwrap()
    }

    #[test]
    fn the_files_are_made_and_their_mounts_returned_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = super::super::Settings::example();
        s.root_dir = tmp.path().join("root");
        let pod_dir = s.root_dir.join("pods/u1");
        let files = HostFiles {
            termination: Some(TerminationFile {
                pod_dir: pod_dir.clone(),
                name: "c".into(),
                attempt: 0,
                container_path: "/dev/termination-log".into(),
            }),
            hosts: super::super::hosts_file::hosts_file(&s, &pod(), &["10.88.0.9".into()]),
            log_dir: tmp.path().join("logs/ns_web_u1/c"),
        };
        let mounts = files.make().unwrap();
        let paths: Vec<&str> = mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/termination-log", "/etc/hosts"]);
        assert!(mounts[0]
            .host_path
            .starts_with(&pod_dir.join("containers/c").display().to_string()));
        assert_eq!(std::fs::read(&mounts[0].host_path).unwrap(), b"");
        assert!(std::fs::read_to_string(pod_dir.join("etc-hosts"))
            .unwrap()
            .contains("10.88.0.9\tweb\n"));
        assert!(tmp.path().join("logs/ns_web_u1/c").is_dir());
    }

    #[test]
    fn a_log_directory_that_cannot_be_made_is_a_create_container_error() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("logs"), "a file, not a directory").unwrap();
        let files = HostFiles {
            termination: None,
            hosts: None,
            log_dir: tmp.path().join("logs/c"),
        };
        let e = files.make().unwrap_err();
        assert_eq!(e.reason, "CreateContainerError");
        assert!(
            e.message.contains("cannot create log directory"),
            "{}",
            e.message
        );
        let files = HostFiles {
            termination: Some(TerminationFile {
                pod_dir: tmp.path().join("logs"),
                name: "c".into(),
                attempt: 0,
                container_path: "/dev/termination-log".into(),
            }),
            hosts: None,
            log_dir: tmp.path().join("ok"),
        };
        let e = files.make().unwrap_err();
        assert_eq!(e.reason, "CreateContainerConfigError");
        assert!(e.message.contains("termination message"), "{}", e.message);
    }
}
