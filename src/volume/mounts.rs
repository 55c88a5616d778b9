//! A container's `volumeMounts` as CRI mounts (kubelet's `makeMounts`): the volume's host path,
//! or a `subPath` (or `subPathExpr`, expanded with the container's env) inside it, created when
//! missing (never in a volume nodelet writes itself); `readOnly` (always, for those volumes); `mountPropagation` (None → private, HostToContainer → rslave,
//! Bidirectional → rshared). A subPath must stay inside its volume: no absolute path, no `..`,
//! and no symlink that resolves outside it.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

use crate::cri::api;

/// True when `sub` is a relative path without `..` (the API server's subPath rule).
pub fn is_safe_sub_path(sub: &str) -> bool {
    let p = Path::new(sub);
    !p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// A volumeMount's subPath as written: `subPath`, else `subPathExpr` (to expand), when not
/// empty.
enum SubPath<'a> {
    Path(&'a str),
    Expr(&'a str),
}

fn sub_path_of(m: &k8s_openapi::api::core::v1::VolumeMount) -> Option<SubPath<'_>> {
    match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
        (Some(s), _) if !s.is_empty() => Some(SubPath::Path(s)),
        (_, Some(e)) if !e.is_empty() => Some(SubPath::Expr(e)),
        _ => None,
    }
}

/// Whether a mount of container `c` has a subPath (or subPathExpr): the mounts that touch a
/// file system in [`container_mounts`].
pub fn has_sub_path(c: &Container) -> bool {
    c.volume_mounts
        .iter()
        .flatten()
        .any(|m| sub_path_of(m).is_some())
}

/// How a checked subPath reaches the runtime: given the volume's real root, the subPath's real
/// path relative to it (no link, no `..`), the volume's name and the mount's index in the
/// container's `volumeMounts`, the host path to give the runtime ([`super::subpath::bind`] in
/// the agent: a bind mount no container can change).
pub type SubPathBinder<'a> = &'a dyn Fn(&Path, &Path, &str, usize) -> Result<PathBuf, String>;

/// The CRI mounts of container `c`, given the host path of each of the pod's volumes, an
/// expansion of `$(VAR)` references for `subPathExpr`, and how a checked subPath is bound.
///
/// Errors: a message naming the mount: an unknown volume, a subPath that is unsafe or leaves
/// its volume, or one that cannot be created or bound.
pub fn container_mounts(
    c: &Container,
    volumes: &BTreeMap<String, PathBuf>,
    read_only: &std::collections::BTreeSet<String>,
    expand: &dyn Fn(&str) -> String,
    bind: SubPathBinder<'_>,
) -> Result<Vec<api::Mount>, String> {
    let mut out = Vec::new();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(base) = volumes.get(&m.name) else {
            return Err(format!("volumeMount {:?}: no volume of that name", m.name));
        };
        let sub = match sub_path_of(m) {
            Some(SubPath::Path(s)) => s.to_owned(),
            Some(SubPath::Expr(e)) => expand(e),
            None => String::new(),
        };
        let host = if sub.is_empty() {
            base.clone()
        } else {
            if !is_safe_sub_path(&sub) {
                return Err(format!(
                    "volumeMount {:?}: subPath {sub:?} must be a relative path without '..'",
                    m.name
                ));
            }
            let target = base.join(&sub);
            let forced = read_only.contains(&m.name);
            if forced && std::fs::symlink_metadata(&target).is_err() {
                // Nothing is written into a volume nodelet writes itself.
                return Err(format!(
                    "volumeMount {:?}: subPath does not exist in the volume",
                    m.name
                ));
            }
            if std::fs::symlink_metadata(&target).is_err() {
                // Made without following a link the pod may have put in the path.
                super::subpath::make_dir_beneath(base, Path::new(&sub)).map_err(|e| {
                    format!(
                        "volumeMount {:?}: cannot create subPath {sub:?}: {e}",
                        m.name
                    )
                })?;
            }
            let (root, real) = (base.canonicalize(), target.canonicalize());
            match (root, real) {
                (Ok(root), Ok(real)) if real.starts_with(&root) => {
                    let rel = real.strip_prefix(&root).unwrap_or(Path::new(""));
                    bind(&root, rel, &m.name, index)?
                }
                _ => {
                    return Err(format!(
                        "volumeMount {:?}: subPath {sub:?} is not within the volume",
                        m.name
                    ))
                }
            }
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => api::MountPropagation::PropagationBidirectional,
            _ => api::MountPropagation::PropagationPrivate,
        };
        out.push(api::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            // configMap, secret, downwardAPI and projected volumes are always read-only, as
            // kubelet mounts them (CVE-2017-1002102): their files are nodelet's to write.
            readonly: m.read_only.unwrap_or(false) || read_only.contains(&m.name),
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside_their_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        std::os::unix::fs::symlink("/etc", vol.join("escape")).unwrap();
        let vols = BTreeMap::from([("v".to_owned(), vol.clone())]);
        let c = |sub: &str| -> Container {
            serde_yaml::from_str(&format!(
                "{{name: c, volumeMounts: [{{name: v, mountPath: /m, subPath: '{sub}', readOnly: true}}]}}"
            ))
            .unwrap()
        };
        let id = |s: &str| s.to_owned();
        // The checked path itself (the agent binds it: `subpath::bind`, tests/volumes.rs).
        let direct = |root: &Path, rel: &Path, _: &str, _: usize| Ok(root.join(rel));
        let m = container_mounts(&c("a/b"), &vols, &Default::default(), &id, &direct).unwrap();
        assert_eq!(
            m[0].host_path,
            vol.canonicalize()
                .unwrap()
                .join("a/b")
                .display()
                .to_string()
        );
        assert!(m[0].readonly);
        assert!(vol.join("a/b").is_dir(), "created");
        // A link the pod put in the volume, to a directory outside it: the missing part of the
        // path is not made there (kubelet's SafeMakeDir), and the mount is refused.
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("out")).unwrap();
        let err = container_mounts(
            &c("out/made/deeper"),
            &vols,
            &Default::default(),
            &id,
            &direct,
        )
        .unwrap_err();
        assert!(err.contains("not within the volume"), "{err}");
        assert!(!outside.join("made").exists(), "made outside the volume");
        // A link inside the volume is followed to where it stays inside.
        std::os::unix::fs::symlink("a", vol.join("in")).unwrap();
        container_mounts(&c("in/c"), &vols, &Default::default(), &id, &direct).unwrap();
        assert!(vol.join("a/c").is_dir());
        for bad in ["../x", "/etc", "a/../../x", "escape"] {
            assert!(
                container_mounts(&c(bad), &vols, &Default::default(), &id, &direct).is_err(),
                "{bad}"
            );
        }
        let unknown: Container =
            serde_yaml::from_str("{name: c, volumeMounts: [{name: w, mountPath: /m}]}").unwrap();
        assert!(
            container_mounts(&unknown, &vols, &Default::default(), &id, &direct)
                .unwrap_err()
                .contains("\"w\"")
        );
        let expr: Container = serde_yaml::from_str(
            "{name: c, volumeMounts: [{name: v, mountPath: /m, subPathExpr: '$(POD)'}]}",
        )
        .unwrap();
        let m = container_mounts(
            &expr,
            &vols,
            &Default::default(),
            &|s| s.replace("$(POD)", "web-1"),
            &direct,
        )
        .unwrap();
        assert!(m[0].host_path.ends_with("/vol/web-1"));
    }
}
