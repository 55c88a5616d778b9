//! secret volumes (kubelet's `pkg/volume/secret`): a local Secret's keys as files on a tmpfs
//! (never on disk), written atomically under `pods/<uid>/volumes/kubernetes.io~secret/<name>`
//! and rewritten when the Secret changes.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;

use super::config_map::object_payload;
use super::{SetUp, SetUpError, VolumePlugin};
use crate::objects::ObjectKind;

/// The secret plugin.
pub struct SecretPlugin;

impl VolumePlugin for SecretPlugin {
    fn set_up(&self, v: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let sv = v
            .secret
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not a secret volume".into()))?;
        let payload = object_payload(
            ObjectKind::Secret,
            sv.secret_name.as_deref().unwrap_or_default(),
            sv.items.as_deref(),
            sv.optional.unwrap_or(false),
            sv.default_mode,
            s,
        )?;
        super::publish(dir, &payload, s, true)
    }

    fn tear_down(&self, dir: &Path) {
        super::empty_dir::remove_volume_dir(dir);
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~secret"
    }
}
