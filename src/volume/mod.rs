//! Volumes (kubelet's volume manager with its `emptyDir` and `hostPath` plugins): each pod's
//! volumes are set up under its directory before its containers start and torn down after it is
//! gone, laid out as kubelet lays them out (`<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`).
//!
//! - [`empty_dir`]: a directory, or with `medium: Memory` a tmpfs of `sizeLimit` bytes.
//! - [`host_path`]: a path of the host, checked by `type` as kubelet checks it.
//! - [`mounts`]: a container's `volumeMounts` as CRI mounts (`readOnly`, `subPath`,
//!   `subPathExpr`, `mountPropagation`), a subPath never leaving its volume.
//!
//! Every volume kind goes through [`VolumePlugin`] (set up, tear down), the seam a CSI
//! NodePublish/NodeUnpublish plugin would use. Other volume kinds are refused by manifest
//! validation, naming the field, until they are implemented.

pub mod empty_dir;
pub mod host_path;
pub mod mounts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};

/// Why a volume could not be set up; the message is kubelet's `MountVolume.SetUp failed for
/// volume "<name>" : <cause>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume {volume:?} : {cause}")]
pub struct VolumeError {
    /// The volume's name.
    pub volume: String,
    /// What went wrong.
    pub cause: String,
}

/// A volume kind (kubelet's `VolumePlugin`): sets a volume up for a pod, returning the host
/// path containers mount, and tears it down.
pub trait VolumePlugin {
    /// Sets `volume` of the pod up; `dir` is its directory under the pod's directory (the
    /// plugin may ignore it, as hostPath does). Returns the host path to mount.
    ///
    /// Errors: the cause, for [`VolumeError`].
    fn set_up(&self, volume: &Volume, dir: &Path, fs_group: Option<i64>)
        -> Result<PathBuf, String>;
    /// Tears the volume down at `dir` (unmount, remove); never touches anything outside it.
    fn tear_down(&self, dir: &Path);
    /// The plugin's directory name under `volumes/` (`kubernetes.io~empty-dir`).
    fn dir_name(&self) -> &'static str;
}

/// The plugin of a volume, `None` for a kind nodelet does not implement (refused earlier).
fn plugin_of(v: &Volume) -> Option<&'static dyn VolumePlugin> {
    if v.empty_dir.is_some() {
        Some(&empty_dir::EmptyDir)
    } else if v.host_path.is_some() {
        Some(&host_path::HostPath)
    } else {
        None
    }
}

/// The plugins whose volumes live under a pod's directory (torn down with the pod).
const PLUGINS: [&dyn VolumePlugin; 1] = [&empty_dir::EmptyDir];

/// `<pod dir>/volumes`.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// Sets every volume of `pod` up under `pod_dir`; returns the host path of each by name.
///
/// Errors: the first volume that failed ([`VolumeError`]); volumes set up before it stay (the
/// next sync finds them ready).
pub fn set_up_pod(pod: &Pod, pod_dir: &Path) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let spec = pod.spec.as_ref();
    let fs_group = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.fs_group);
    let mut out = BTreeMap::new();
    for v in spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(p) = plugin_of(v) else {
            return Err(VolumeError {
                volume: v.name.clone(),
                cause: "volumes of this kind are not supported by nodelet".into(),
            });
        };
        let dir = volumes_dir(pod_dir).join(p.dir_name()).join(&v.name);
        let path = p.set_up(v, &dir, fs_group).map_err(|cause| VolumeError {
            volume: v.name.clone(),
            cause,
        })?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// Tears down every volume under `pod_dir` (after the pod's containers are gone), so that the
/// pod directory can be removed: tmpfs volumes are unmounted first.
pub fn tear_down_pod(pod_dir: &Path) {
    for p in PLUGINS {
        let base = volumes_dir(pod_dir).join(p.dir_name());
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            p.tear_down(&e.path());
        }
    }
}

/// Validates the pod's volumes and every container's `volumeMounts` as the API server does for
/// the kinds nodelet implements, and refuses the kinds it does not (the field named, so that no
/// volume is ignored and its data silently written into a container's layer instead):
/// unique DNS-1123 names, exactly one source, emptyDir `medium` "" or `Memory`, hostPath an
/// absolute path with a known `type`; mounts naming a volume, absolute unique mount paths, safe
/// subPaths, `subPath` and `subPathExpr` not both, a known `mountPropagation` (Bidirectional only
/// in a privileged container); `volumeDevices` refused.
///
/// Errors: `(field, reason)`.
pub fn validate(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), (String, String)> {
    let mut names = std::collections::BTreeSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let at = format!("spec.volumes[{i}]");
        if !crate::pod::is_dns1123_label(&v.name) {
            return Err((format!("{at}.name"), "must be a DNS-1123 label".into()));
        }
        if !names.insert(v.name.as_str()) {
            return Err((format!("{at}.name"), format!("{:?} is duplicated", v.name)));
        }
        let json = serde_json::to_value(v).unwrap_or_default();
        let sources: Vec<String> = json
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .filter(|k| k != "name")
            .collect();
        match sources.as_slice() {
            [] => return Err((at, "must specify a volume type".into())),
            [one] if one == "emptyDir" || one == "hostPath" => {}
            [one] => {
                return Err((
                    format!("{at}.{one}"),
                    "volumes of this kind are not supported by nodelet yet (emptyDir and hostPath are); the pod is refused rather than run without its data".into(),
                ))
            }
            _ => return Err((at, "may not specify more than 1 volume type".into())),
        }
        if let Some(ed) = &v.empty_dir {
            if !matches!(ed.medium.as_deref(), None | Some("") | Some("Memory")) {
                return Err((
                    format!("{at}.emptyDir.medium"),
                    "must be \"\" or Memory (HugePages media are not supported by nodelet yet)"
                        .into(),
                ));
            }
            if let Some(q) = &ed.size_limit {
                if crate::quantity::parse_value(&q.0).map_or(true, |v| v <= 0) {
                    return Err((
                        format!("{at}.emptyDir.sizeLimit"),
                        "must be a positive quantity".into(),
                    ));
                }
            }
        }
        if let Some(hp) = &v.host_path {
            if !Path::new(&hp.path).is_absolute() {
                return Err((
                    format!("{at}.hostPath.path"),
                    "must be an absolute path".into(),
                ));
            }
            if Path::new(&hp.path)
                .components()
                .any(|c| c == std::path::Component::ParentDir)
            {
                return Err((
                    format!("{at}.hostPath.path"),
                    "must not contain '..'".into(),
                ));
            }
            if !host_path::TYPES.contains(&hp.type_.as_deref().unwrap_or("")) {
                return Err((
                    format!("{at}.hostPath.type"),
                    format!("must be one of {:?}", host_path::TYPES),
                ));
            }
        }
    }
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            let at = format!("{list}[{i}]");
            if c.volume_devices.as_ref().is_some_and(|d| !d.is_empty()) {
                return Err((
                    format!("{at}.volumeDevices"),
                    "block volumes are not supported by nodelet yet".into(),
                ));
            }
            let mut paths = std::collections::BTreeSet::new();
            for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
                let at = format!("{at}.volumeMounts[{j}]");
                if !names.contains(m.name.as_str()) {
                    return Err((
                        format!("{at}.name"),
                        format!("{:?} is not a volume of the pod", m.name),
                    ));
                }
                if !Path::new(&m.mount_path).is_absolute() {
                    return Err((format!("{at}.mountPath"), "must be an absolute path".into()));
                }
                if !paths.insert(m.mount_path.as_str()) {
                    return Err((format!("{at}.mountPath"), "must be unique".into()));
                }
                let sub = m.sub_path.as_deref().unwrap_or("");
                if !sub.is_empty() && !mounts::is_safe_sub_path(sub) {
                    return Err((
                        format!("{at}.subPath"),
                        "must be a relative path without '..'".into(),
                    ));
                }
                if !sub.is_empty() && m.sub_path_expr.as_deref().is_some_and(|e| !e.is_empty()) {
                    return Err((
                        format!("{at}.subPathExpr"),
                        "subPathExpr and subPath are mutually exclusive".into(),
                    ));
                }
                match m.mount_propagation.as_deref() {
                    None | Some("None") | Some("HostToContainer") => {}
                    Some("Bidirectional") => {
                        let privileged = c
                            .security_context
                            .as_ref()
                            .and_then(|s| s.privileged)
                            .unwrap_or(false);
                        if !privileged {
                            return Err((format!("{at}.mountPropagation"), "Bidirectional mount propagation is available only to privileged containers".into()));
                        }
                    }
                    Some(_) => {
                        return Err((
                            format!("{at}.mountPropagation"),
                            "must be None, HostToContainer or Bidirectional".into(),
                        ))
                    }
                }
            }
        }
    }
    Ok(())
}
