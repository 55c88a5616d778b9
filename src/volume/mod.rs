//! Volumes (kubelet's volume manager and its plugins): each pod's volumes are set up under its
//! directory before its containers start (again on every sync, which rewrites what changed) and
//! torn down after it is gone, laid out as kubelet lays them out
//! (`<root-dir>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`).
//!
//! - [`empty_dir`]: a directory, or with `medium: Memory` a tmpfs of `sizeLimit` bytes.
//! - [`host_path`]: a path of the host, checked by `type` as kubelet checks it.
//! - [`config_map`], [`secret`] (on tmpfs), [`downward_api`], [`projected`]: files written with
//!   [`atomic_writer`], from local ConfigMaps and Secrets ([`crate::objects`]) and the downward
//!   API.
//! - [`mounts`]: a container's `volumeMounts` as CRI mounts (`readOnly`, `subPath`,
//!   `subPathExpr`, `mountPropagation`), a subPath never leaving its volume.
//!
//! Every volume kind goes through [`VolumePlugin`] (set up, tear down), the seam a CSI
//! NodePublish/NodeUnpublish plugin would use. Other volume kinds are refused by manifest
//! validation, naming the field, until they are implemented.

pub mod atomic_writer;
pub mod config_map;
pub mod downward_api;
pub mod empty_dir;
pub mod host_path;
pub mod metrics;
pub mod mounts;
pub mod projected;
pub mod removal;
pub mod secret;
pub mod subpath;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume};

use crate::fieldpath::Allocatable;
use crate::objects::LocalObjects;

/// Why a volume could not be set up; the message is kubelet's `MountVolume.SetUp failed for
/// volume "<name>" : <cause>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume {volume:?} : {cause}")]
pub struct VolumeError {
    /// The volume's name.
    pub volume: String,
    /// What went wrong.
    pub cause: SetUpError,
}

/// Why a plugin could not set a volume up (the cause of a [`VolumeError`]); each carries the
/// message kubelet gives for it. Every kind holds the pod in ContainerCreating with a
/// `FailedMount` event, and the next sync tries again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetUpError {
    /// The volume's spec is not what the plugin takes, or a value in it is out of range
    /// (`fsGroup`, `sizeLimit`, a downward API item): the manifest must change.
    #[error("{0}")]
    Spec(String),
    /// A ConfigMap or Secret (or a key of one) the volume needs does not exist and is not
    /// optional: the pod waits for it to be created.
    #[error("{0}")]
    MissingObject(String),
    /// A hostPath is missing or not of the `type` the volume asks for.
    #[error("{0}")]
    HostPathType(String),
    /// A filesystem step (mkdir, chown, chmod, writing the payload) failed; the message names
    /// the path.
    #[error("{0}")]
    Filesystem(String),
    /// Mounting the volume's tmpfs failed.
    #[error("{0}")]
    Mount(String),
    /// A service account token could not be had from the API server (kubelet's
    /// `failed to fetch token: …`).
    #[error("{0}")]
    Token(String),
}

impl SetUpError {
    /// Whether the pod only waits for an object (ConfigMap, Secret, key) to exist.
    pub fn is_missing_object(&self) -> bool {
        matches!(self, Self::MissingObject(_))
    }
}

/// What a plugin sets a volume up with, beyond the volume itself.
pub struct SetUp<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Local ConfigMaps and Secrets.
    pub objects: &'a LocalObjects,
    /// The node's allocatable (downward API resource limits default to it).
    pub allocatable: &'a Allocatable,
    /// The pod's service account tokens, for projected `serviceAccountToken` sources
    /// ([`crate::token::TokenManager::pod_tokens`]).
    pub tokens: &'a crate::token::PodTokens,
}

impl SetUp<'_> {
    /// The pod's `fsGroup` as a gid.
    ///
    /// Errors: a negative or too large fsGroup ([`SetUpError::Spec`]).
    pub fn fs_group_id(&self) -> Result<Option<u32>, SetUpError> {
        let g = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group);
        g.map(|g| u32::try_from(g).map_err(|_| SetUpError::Spec(format!("invalid fsGroup {g}"))))
            .transpose()
    }
}

/// A volume kind (kubelet's `VolumePlugin`): sets a volume up for a pod, returning the host
/// path containers mount, and tears it down.
pub trait VolumePlugin {
    /// Sets `volume` of the pod up; `dir` is its directory under the pod's directory (the
    /// plugin may ignore it, as hostPath does). Called on every sync: a plugin rewrites what
    /// changed and leaves the rest. Returns the host path to mount.
    ///
    /// Errors: the cause, for [`VolumeError`].
    fn set_up(&self, volume: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError>;
    /// Tears the volume down at `dir` (unmount, remove); never touches anything outside it.
    fn tear_down(&self, dir: &Path);
    /// The plugin's directory name under `volumes/` (`kubernetes.io~empty-dir`).
    fn dir_name(&self) -> &'static str;
    /// Whether a volume's content follows what it was made from after its set-up (the objects,
    /// the pod's fields, a token), so that every sync sets it up again (kubelet's
    /// `RequiresRemount`): true but for emptyDir and hostPath, which stay as their first
    /// set-up made them.
    fn requires_remount(&self) -> bool {
        true
    }
}

/// Writes `payload` into the volume directory `dir` with [`atomic_writer`], on a tmpfs when
/// `on_tmpfs` (secret, downwardAPI, projected), files owned by the pod's `fsGroup`; returns `dir`
/// (what containers mount).
///
/// Errors: the tmpfs mount ([`SetUpError::Mount`]) or a write step
/// ([`SetUpError::Filesystem`]), naming the path; an invalid `fsGroup`.
fn publish(
    dir: &Path,
    payload: &atomic_writer::Payload,
    s: &SetUp<'_>,
    on_tmpfs: bool,
) -> Result<PathBuf, SetUpError> {
    if on_tmpfs {
        empty_dir::ensure_tmpfs(dir, None).map_err(SetUpError::Mount)?;
    }
    atomic_writer::write(dir, payload, s.fs_group_id()?).map_err(SetUpError::Filesystem)?;
    Ok(dir.to_path_buf())
}

/// The plugin of a volume, `None` for a kind nodelet does not implement (refused earlier).
fn plugin_of(v: &Volume) -> Option<&'static dyn VolumePlugin> {
    if v.empty_dir.is_some() {
        Some(&empty_dir::EmptyDir)
    } else if v.host_path.is_some() {
        Some(&host_path::HostPath)
    } else if v.config_map.is_some() {
        Some(&config_map::ConfigMapPlugin)
    } else if v.secret.is_some() {
        Some(&secret::SecretPlugin)
    } else if v.downward_api.is_some() {
        Some(&downward_api::DownwardApiPlugin)
    } else if v.projected.is_some() {
        Some(&projected::ProjectedPlugin)
    } else {
        None
    }
}

/// Whether `pod` has a volume whose plugin [`VolumePlugin::requires_remount`] (configMap,
/// secret, downwardAPI, projected; a kind nodelet does not know counts too): a sync that
/// starts no container sets such a pod's volumes up again, and need not look at the others.
pub fn follows_updates(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| plugin_of(v).is_none_or(|p| p.requires_remount()))
}

/// The plugins whose volumes live under a pod's directory (torn down with the pod).
const PLUGINS: [&dyn VolumePlugin; 5] = [
    &empty_dir::EmptyDir,
    &config_map::ConfigMapPlugin,
    &secret::SecretPlugin,
    &downward_api::DownwardApiPlugin,
    &projected::ProjectedPlugin,
];

/// The names of the pod's volumes that containers may only read: configMap, secret,
/// downwardAPI and projected (their files are written by nodelet; kubelet mounts them
/// read-only whatever the mount says).
pub fn read_only_volumes(pod: &Pod) -> std::collections::BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.config_map.is_some()
                || v.secret.is_some()
                || v.downward_api.is_some()
                || v.projected.is_some()
        })
        .map(|v| v.name.clone())
        .collect()
}

/// The volume kinds nodelet implements (the field names of a `Volume`).
pub const KINDS: [&str; 6] = [
    "emptyDir",
    "hostPath",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
];

/// `<pod dir>/volumes`.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

/// Sets every volume of `pod` up under `pod_dir`; returns the host path of each by name.
///
/// Errors: the first volume that failed ([`VolumeError`]); volumes set up before it stay (the
/// next sync finds them ready).
pub fn set_up_pod(
    pod: &Pod,
    pod_dir: &Path,
    objects: &LocalObjects,
    allocatable: &Allocatable,
    tokens: &crate::token::PodTokens,
) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let spec = pod.spec.as_ref();
    let s = SetUp {
        pod,
        objects,
        allocatable,
        tokens,
    };
    let mut out = BTreeMap::new();
    for v in spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(p) = plugin_of(v) else {
            return Err(VolumeError {
                volume: v.name.clone(),
                cause: SetUpError::Spec("volumes of this kind are not supported by nodelet".into()),
            });
        };
        let dir = volumes_dir(pod_dir).join(p.dir_name()).join(&v.name);
        let path = p.set_up(v, &dir, &s).map_err(|cause| VolumeError {
            volume: v.name.clone(),
            cause,
        })?;
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// The pod's volumes that live under its directory (every kind but hostPath), each with its
/// directory `<pod dir>/volumes/<plugin>/<name>` and whether it counts as the pod's local
/// ephemeral storage: an emptyDir on disk (not `medium: Memory`) or a configMap (kubelet's
/// `IsLocalEphemeralVolume`, which its eviction manager and its summary both use; secrets,
/// downwardAPI and projected volumes are on tmpfs). What kubelet's volume stats calculator
/// measures; hostPath volumes are the host's, not the pod's.
pub fn pod_volume_dirs(pod: &Pod, pod_dir: &Path) -> Vec<(String, PathBuf, bool)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| v.host_path.is_none())
        .filter_map(|v| {
            let p = plugin_of(v)?;
            let ephemeral = v.config_map.is_some()
                || v.empty_dir
                    .as_ref()
                    .is_some_and(|e| e.medium.as_deref() != Some("Memory"));
            let dir = volumes_dir(pod_dir).join(p.dir_name()).join(&v.name);
            Some((v.name.clone(), dir, ephemeral))
        })
        .collect()
}

/// Tears down every volume under `pod_dir` (after the pod's containers are gone), so that the
/// pod directory can be removed: tmpfs volumes are unmounted first. Only real directories are
/// walked: a symlink at the pod directory, its `volumes`, a plugin's directory or a volume is
/// removed (a volume's) or left (above), never followed, so nothing outside `pod_dir` is touched.
pub fn tear_down_pod(pod_dir: &Path) {
    let real_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    let volumes = volumes_dir(pod_dir);
    if !real_dir(pod_dir) {
        return;
    }
    // The subPath bind mounts first: they hold the volumes' directories.
    subpath::unmount_all(pod_dir);
    if !real_dir(&volumes) {
        return;
    }
    for p in PLUGINS {
        let base = volumes.join(p.dir_name());
        if !real_dir(&base) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                let _ = std::fs::remove_file(e.path());
            } else {
                p.tear_down(&e.path());
            }
        }
    }
}

/// Validates the pod's volumes and every container's `volumeMounts` as the API server does for
/// the kinds nodelet implements, and refuses the kinds it does not (the field named, so that no
/// volume is ignored and its data silently written into a container's layer instead):
/// unique DNS-1123 names, exactly one source, emptyDir `medium` "" or `Memory`, hostPath an
/// absolute path with a known `type`; mounts naming a volume, absolute unique mount paths, safe
/// subPaths, `subPath` and `subPathExpr` not both, a known `mountPropagation` (Bidirectional only
/// in a privileged container); `volumeDevices` refused. Projected `serviceAccountToken` sources
/// are taken only `from_api` (a pod the API server bound to the node, which a token can be
/// asked for).
///
/// Errors: `(field, reason)`.
pub fn validate(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    from_api: bool,
) -> Result<(), (String, String)> {
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
            [one] if KINDS.contains(&one.as_str()) => {}
            [one] => {
                return Err((
                    format!("{at}.{one}"),
                    format!("volumes of this kind are not supported by nodelet yet (it supports {}); the pod is refused rather than run without its data", KINDS.join(", ")),
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
            // As the API server: a negative size is refused; 0 means no limit (kubelet skips it).
            if let Some(q) = &ed.size_limit {
                if let Err(e) = crate::quantity::parse_amount(&q.0, crate::quantity::Scale::Whole) {
                    return Err((
                        format!("{at}.emptyDir.sizeLimit"),
                        format!("{:?}: {e}", q.0),
                    ));
                }
            }
        }
        validate_projections(spec, v, &at, from_api)?;
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
                recursive_read_only_ok(&at, m)?;
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

/// `recursiveReadOnly` as the API server checks it (`Disabled`, `IfPossible` or `Enabled`, the
/// last two only on a `readOnly` mount), and `Enabled` refused: nodelet does not ask the runtime
/// for recursive read-only mounts yet, so the submounts of such a volume would stay writable.
/// `IfPossible` is taken as its documented fallback, a read-only mount whose submounts keep
/// their own flags (what kubelet does on a runtime without the feature).
///
/// Errors: `(field, reason)`, the field under `at` (`spec.containers[0].volumeMounts[1]`).
fn recursive_read_only_ok(
    at: &str,
    m: &k8s_openapi::api::core::v1::VolumeMount,
) -> Result<(), (String, String)> {
    let field = || format!("{at}.recursiveReadOnly");
    match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => Ok(()),
        Some(v @ ("IfPossible" | "Enabled")) if m.read_only != Some(true) => Err((
            field(),
            format!("{v} may only be set on a readOnly mount"),
        )),
        Some("IfPossible") => Ok(()),
        Some("Enabled") => Err((
            field(),
            "recursive read-only mounts are not supported by nodelet yet; the pod is refused rather than run with writable submounts".into(),
        )),
        Some(v) => Err((
            field(),
            format!("{v:?}: must be Disabled, IfPossible or Enabled"),
        )),
    }
}

/// Paths a volume's items write, as they land on disk.
type Paths = std::collections::BTreeSet<String>;

/// A file mode the API server accepts: 0 to 0777.
fn mode_ok(m: Option<i32>) -> bool {
    m.is_none_or(|m| (0..=0o777).contains(&m))
}
/// A projected file's path: inside the volume, and clashing with no other (a file cannot also
/// be a directory).
fn check_path(paths: &mut Paths, field: String, p: &str) -> Result<(), (String, String)> {
    atomic_writer::validate_path(p).map_err(|e| (field.clone(), e))?;
    // As it lands on disk: `./x` is `x`; a file cannot also be a directory (`x`, `x/y`).
    let n = atomic_writer::normalize(p);
    let clash = paths
        .iter()
        .find(|e| **e == n || n.starts_with(&format!("{e}/")) || e.starts_with(&format!("{n}/")));
    if let Some(e) = clash {
        return Err((field, format!("path {p:?} conflicts with path {e:?}")));
    }
    paths.insert(n);
    Ok(())
}
/// The `items` of a configMap or secret source: valid keys, modes and paths.
fn keys(
    paths: &mut Paths,
    field: &str,
    items: &Option<Vec<KeyToPath>>,
) -> Result<(), (String, String)> {
    for (i, it) in items.iter().flatten().enumerate() {
        let f = format!("{field}.items[{i}]");
        if !crate::objects::is_valid_key(&it.key) {
            return Err((
                format!("{f}.key"),
                format!("{:?} is not a valid key", it.key),
            ));
        }
        if !mode_ok(it.mode) {
            return Err((format!("{f}.mode"), "must be between 0 and 0777".into()));
        }
        check_path(paths, format!("{f}.path"), &it.path)?;
    }
    Ok(())
}
/// The `items` of a downwardAPI source: paths, modes, and a field or resource that exists.
fn downward(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    paths: &mut Paths,
    field: &str,
    items: &Option<Vec<DownwardAPIVolumeFile>>,
) -> Result<(), (String, String)> {
    for (i, it) in items.iter().flatten().enumerate() {
        let f = format!("{field}.items[{i}]");
        check_path(paths, format!("{f}.path"), &it.path)?;
        if !mode_ok(it.mode) {
            return Err((format!("{f}.mode"), "must be between 0 and 0777".into()));
        }
        match (&it.field_ref, &it.resource_field_ref) {
            (Some(r), None) => {
                let p = r.field_path.as_str();
                let whole = matches!(
                    p,
                    "metadata.name"
                        | "metadata.namespace"
                        | "metadata.uid"
                        | "metadata.labels"
                        | "metadata.annotations"
                );
                let one = ["metadata.labels['", "metadata.annotations['"]
                    .iter()
                    .any(|pre| p.starts_with(pre) && p.ends_with("']"));
                if !whole && !one {
                    return Err((
                        format!("{f}.fieldRef.fieldPath"),
                        format!("{p:?} is not a field a downwardAPI volume can project (metadata.name, namespace, uid, labels, annotations)"),
                    ));
                }
            }
            (None, Some(r)) => {
                crate::fieldpath::validate_resource_field(
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                )
                .map_err(|(what, reason)| (format!("{f}.resourceFieldRef.{what}"), reason))?;
                let name = r.container_name.as_deref().unwrap_or_default();
                let known = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(|c| c.name == name);
                if !known {
                    return Err((
                        format!("{f}.resourceFieldRef.containerName"),
                        format!("{name:?} is not a container of the pod"),
                    ));
                }
            }
            _ => {
                return Err((
                    f,
                    "exactly one of fieldRef and resourceFieldRef is required".into(),
                ))
            }
        }
    }
    Ok(())
}

/// The sources of a projected volume: each exactly one of configMap, secret, downwardAPI and,
/// `from_api`, serviceAccountToken (the other kinds need an API server nodelet does not ask),
/// with its items; a token's `path` and `expirationSeconds` (at least 10 minutes, at most 2^32
/// seconds) as the API server checks them.
fn projected_sources(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    paths: &mut Paths,
    at: &str,
    p: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    from_api: bool,
) -> Result<(), (String, String)> {
    for (i, src) in p.sources.iter().flatten().enumerate() {
        let f = format!("{at}.projected.sources[{i}]");
        let json = serde_json::to_value(src).unwrap_or_default();
        let kinds: Vec<String> = json
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect();
        match kinds.as_slice() {
            [k] if k == "configMap" || k == "secret" || k == "downwardAPI" => {}
            [k] if k == "serviceAccountToken" && from_api => {}
            [k] if k == "serviceAccountToken" => {
                return Err((
                    format!("{f}.{k}"),
                    "a service account token is had only for a pod the API server bound to this node; a static pod cannot have one".into(),
                ))
            }
            [k] => {
                return Err((
                    format!("{f}.{k}"),
                    "projected sources of this kind are not implemented; nodelet supports configMap, secret, downwardAPI and, for pods from the API server, serviceAccountToken".into(),
                ))
            }
            _ => return Err((f, "must have exactly one source".into())),
        }
        if let Some(cm) = &src.config_map {
            if cm.name.is_empty() {
                return Err((format!("{f}.configMap.name"), "is required".into()));
            }
            keys(paths, &format!("{f}.configMap"), &cm.items)?;
        }
        if let Some(s) = &src.secret {
            if s.name.is_empty() {
                return Err((format!("{f}.secret.name"), "is required".into()));
            }
            keys(paths, &format!("{f}.secret"), &s.items)?;
        }
        if let Some(d) = &src.downward_api {
            downward(spec, paths, &format!("{f}.downwardAPI"), &d.items)?;
        }
        if let Some(t) = &src.service_account_token {
            let tf = format!("{f}.serviceAccountToken");
            check_path(paths, format!("{tf}.path"), &t.path)?;
            if t.expiration_seconds
                .is_some_and(|e| !(600..=1 << 32).contains(&e))
            {
                return Err((
                    format!("{tf}.expirationSeconds"),
                    "must be at least 10 minutes (600) and at most 2^32 seconds".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Validates the files a configMap, secret, downwardAPI or projected volume writes, as the API
/// server does: a name for the object, modes within 0–0777, item paths that stay inside the
/// volume (see [`atomic_writer::validate_path`]) and are unique, keys valid, downward API field
/// paths and resources that exist; projected sources other than configMap, secret, downwardAPI
/// and (from the API server) serviceAccountToken are refused.
///
/// Errors: `(field, reason)`.
fn validate_projections(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    v: &Volume,
    at: &str,
    from_api: bool,
) -> Result<(), (String, String)> {
    let paths = &mut Paths::new();
    if let Some(cm) = &v.config_map {
        if cm.name.is_empty() {
            return Err((format!("{at}.configMap.name"), "is required".into()));
        }
        if !mode_ok(cm.default_mode) {
            return Err((
                format!("{at}.configMap.defaultMode"),
                "must be between 0 and 0777".into(),
            ));
        }
        keys(paths, &format!("{at}.configMap"), &cm.items)?;
    }
    if let Some(s) = &v.secret {
        if s.secret_name.as_deref().is_none_or(str::is_empty) {
            return Err((format!("{at}.secret.secretName"), "is required".into()));
        }
        if !mode_ok(s.default_mode) {
            return Err((
                format!("{at}.secret.defaultMode"),
                "must be between 0 and 0777".into(),
            ));
        }
        keys(paths, &format!("{at}.secret"), &s.items)?;
    }
    if let Some(d) = &v.downward_api {
        if !mode_ok(d.default_mode) {
            return Err((
                format!("{at}.downwardAPI.defaultMode"),
                "must be between 0 and 0777".into(),
            ));
        }
        downward(spec, paths, &format!("{at}.downwardAPI"), &d.items)?;
    }
    if let Some(p) = &v.projected {
        if !mode_ok(p.default_mode) {
            return Err((
                format!("{at}.projected.defaultMode"),
                "must be between 0 and 0777".into(),
            ));
        }
        projected_sources(spec, paths, at, p, from_api)?;
    }
    Ok(())
}
