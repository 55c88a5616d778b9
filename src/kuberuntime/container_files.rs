//! The files a container start makes before CreateContainer (kubelet's `makeMounts` and
//! `generateContainerConfig`): the termination-message file, the pod's hosts file and the
//! container's log directory. Planned from the pod on the runtime's thread, made in one call on
//! tokio's blocking pool ([`crate::blocking`]): a slow file system holds this container's start
//! only.

use std::path::PathBuf;

use super::hosts_file::HostsFile;
use crate::cri::api;

/// A container's termination-message file ([`super::termination_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminationMessage {
    /// `<root-dir>/pods/<uid>`.
    pub pod_dir: PathBuf,
    /// The container's name.
    pub container: String,
    /// Its restart count (a new file for each instance).
    pub attempt: u32,
    /// Its `terminationMessagePath` in the container.
    pub container_path: String,
}

/// What one container start makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFiles {
    /// The termination-message file, when the container has a `terminationMessagePath`.
    pub termination_message: Option<TerminationMessage>,
    /// The pod's hosts file, once the pod has an IP ([`super::hosts_file::plan`]).
    pub hosts: Option<HostsFile>,
    /// `<pod log directory>/<container>` (kubelet's `BuildContainerLogsDirectory`).
    pub log_dir: PathBuf,
}

/// A file that could not be made, with kubelet's waiting reason for it.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The termination-message file (`CreateContainerConfigError`).
    #[error("cannot create the termination message file: {0}")]
    TerminationMessage(std::io::Error),
    /// The pod's hosts file (`CreateContainerConfigError`).
    #[error("cannot write the pod's hosts file: {0}")]
    Hosts(std::io::Error),
    /// The container's log directory (`CreateContainerError`).
    #[error("cannot create log directory {}: {source}", dir.display())]
    LogDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl FilesError {
    /// The container's waiting reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TerminationMessage(_) | Self::Hosts(_) => "CreateContainerConfigError",
            Self::LogDir { .. } => "CreateContainerError",
        }
    }
}

impl ContainerFiles {
    /// Makes the files, in kubelet's order (the message file, the hosts file, the log
    /// directory), and returns the mounts the container gets: the message file on its
    /// `terminationMessagePath`, the hosts file on `/etc/hosts`.
    ///
    /// Errors: the first file that could not be made ([`FilesError`]).
    pub fn make(self) -> Result<Vec<api::Mount>, FilesError> {
        let mut mounts = Vec::with_capacity(2);
        if let Some(t) = &self.termination_message {
            let host = super::termination_message::prepare(&t.pod_dir, &t.container, t.attempt)
                .map_err(FilesError::TerminationMessage)?;
            mounts.push(super::termination_message::mount(&host, &t.container_path));
        }
        if let Some(hosts) = &self.hosts {
            mounts.push(hosts.write().map_err(FilesError::Hosts)?);
        }
        std::fs::create_dir_all(&self.log_dir).map_err(|source| FilesError::LogDir {
            dir: self.log_dir.clone(),
            source,
        })?;
        Ok(mounts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kuberuntime::Settings;
    use k8s_openapi::api::core::v1::Pod;

    fn pod() -> Pod {
        serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: ns, uid: u1}\nspec: {containers: [{name: c, image: b}]}",
        )
        .unwrap()
    }

    #[test]
    fn the_files_are_made_and_mounted() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Settings::example();
        s.root_dir = tmp.path().join("root");
        let pod_dir = s.root_dir.join("pods/u1");
        let files = ContainerFiles {
            termination_message: Some(TerminationMessage {
                pod_dir: pod_dir.clone(),
                container: "c".into(),
                attempt: 0,
                container_path: "/dev/termination-log".into(),
            }),
            hosts: super::super::hosts_file::plan(&s, &pod(), &["10.88.0.9".into()]),
            log_dir: tmp.path().join("logs/ns_web_u1/c"),
        };
        let mounts = files.make().unwrap();
        let paths: Vec<_> = mounts.iter().map(|m| m.container_path.as_str()).collect();
        assert_eq!(paths, ["/dev/termination-log", "/etc/hosts"]);
        let message = std::path::Path::new(&mounts[0].host_path);
        assert!(message.starts_with(pod_dir.join("containers/c")));
        assert_eq!(std::fs::read(message).unwrap(), b"");
        assert!(std::fs::read_to_string(pod_dir.join("etc-hosts"))
            .unwrap()
            .contains("10.88.0.9\tweb\n"));
        assert!(tmp.path().join("logs/ns_web_u1/c").is_dir());
    }

    #[test]
    fn a_log_directory_that_cannot_be_made_is_a_create_container_error() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        let files = ContainerFiles {
            termination_message: None,
            hosts: None,
            log_dir: blocker.join("c"),
        };
        let e = files.make().unwrap_err();
        assert_eq!(e.reason(), "CreateContainerError");
        assert!(e.to_string().starts_with(&format!(
            "cannot create log directory {}: ",
            blocker.join("c").display()
        )));
    }

    #[test]
    fn a_message_file_that_cannot_be_made_is_a_config_error() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        std::fs::write(&blocker, b"").unwrap();
        let files = ContainerFiles {
            termination_message: Some(TerminationMessage {
                pod_dir: blocker,
                container: "c".into(),
                attempt: 0,
                container_path: "/dev/termination-log".into(),
            }),
            hosts: None,
            log_dir: tmp.path().join("logs"),
        };
        let e = files.make().unwrap_err();
        assert_eq!(e.reason(), "CreateContainerConfigError");
        assert!(e
            .to_string()
            .starts_with("cannot create the termination message file: "));
        assert!(!tmp.path().join("logs").exists(), "stopped at the first");
    }
}
