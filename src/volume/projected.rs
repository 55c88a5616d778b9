//! projected volumes (kubelet's `pkg/volume/projected`): ConfigMap, Secret and downward API
//! sources merged into one directory on a tmpfs, written atomically under
//! `pods/<uid>/volumes/kubernetes.io~projected/<name>`. `serviceAccountToken`,
//! `clusterTrustBundle` and `podCertificate` sources need an API server and are refused by
//! validation.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;

use super::atomic_writer::Payload;
use super::config_map::object_payload;
use super::downward_api::downward_payload;
use super::{SetUp, SetUpError, VolumePlugin};
use crate::objects::ObjectKind;

/// The projected plugin.
pub struct ProjectedPlugin;

impl VolumePlugin for ProjectedPlugin {
    fn set_up(&self, v: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let p = v
            .projected
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not a projected volume".into()))?;
        let mut payload = Payload::new();
        for src in p.sources.iter().flatten() {
            let part = if let Some(cm) = &src.config_map {
                object_payload(
                    ObjectKind::ConfigMap,
                    &cm.name,
                    cm.items.as_deref(),
                    cm.optional.unwrap_or(false),
                    p.default_mode,
                    s,
                )?
            } else if let Some(sec) = &src.secret {
                object_payload(
                    ObjectKind::Secret,
                    &sec.name,
                    sec.items.as_deref(),
                    sec.optional.unwrap_or(false),
                    p.default_mode,
                    s,
                )?
            } else if let Some(d) = &src.downward_api {
                downward_payload(d.items.as_deref().unwrap_or(&[]), p.default_mode, s)
                    .map_err(SetUpError::Spec)?
            } else {
                return Err(SetUpError::Spec(
                    "projected source of a kind nodelet does not implement".into(),
                ));
            };
            payload.extend(part);
        }
        super::publish(dir, &payload, s, true)
    }

    fn tear_down(&self, dir: &Path) {
        super::empty_dir::remove_volume_dir(dir);
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~projected"
    }
}
