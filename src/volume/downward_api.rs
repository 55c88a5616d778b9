//! downwardAPI volumes (kubelet's `pkg/volume/downwardapi`): the pod's metadata and its
//! containers' resources as files on a tmpfs, written atomically under
//! `pods/<uid>/volumes/kubernetes.io~downward-api/<name>`. Labels and annotations are written as
//! kubelet's `FormatMap` writes them ([`crate::fieldpath::format_map`]).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Volume};

use super::atomic_writer::{FileProjection, Payload};
use super::config_map::DEFAULT_MODE;
use super::{SetUp, SetUpError, VolumePlugin};

/// The downwardAPI plugin.
pub struct DownwardApiPlugin;

/// The files of downward API `items` (kubelet's `CollectData`): each a metadata field
/// (`fieldRef`) or a container's resource (`resourceFieldRef`), with its own mode or
/// `defaultMode`.
///
/// Errors: a field path or resource that cannot be read, naming the item.
pub fn downward_payload(
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    s: &SetUp<'_>,
) -> Result<Payload, String> {
    let mut out = Payload::new();
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            crate::fieldpath::metadata_value(s.pod, &f.field_path).ok_or_else(|| {
                format!(
                    "item {:?}: unsupported fieldRef {:?}",
                    it.path, f.field_path
                )
            })?
        } else if let Some(r) = &it.resource_field_ref {
            crate::fieldpath::resource_field_value(
                s.pod,
                r.container_name.as_deref().unwrap_or_default(),
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
                s.allocatable,
            )
            .map_err(|e| format!("item {:?}: {e}", it.path))?
        } else {
            return Err(format!(
                "item {:?}: one of fieldRef and resourceFieldRef is required",
                it.path
            ));
        };
        let mode = it.mode.or(default_mode).unwrap_or(DEFAULT_MODE);
        out.insert(
            super::atomic_writer::normalize(&it.path),
            FileProjection {
                data: value.into_bytes(),
                mode: (mode & 0o777) as u32,
            },
        );
    }
    Ok(out)
}

impl VolumePlugin for DownwardApiPlugin {
    fn set_up(&self, v: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let d = v
            .downward_api
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not a downwardAPI volume".into()))?;
        let payload = downward_payload(d.items.as_deref().unwrap_or(&[]), d.default_mode, s)
            .map_err(SetUpError::Spec)?;
        super::publish(dir, &payload, s, true)
    }

    fn tear_down(&self, dir: &Path) {
        super::empty_dir::remove_volume_dir(dir);
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~downward-api"
    }
}
