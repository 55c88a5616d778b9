//! projected volumes (kubelet's `pkg/volume/projected`): ConfigMap, Secret and downward API
//! sources merged into one directory on a tmpfs, written atomically under
//! `pods/<uid>/volumes/kubernetes.io~projected/<name>`; and, for a pod from the API server,
//! `serviceAccountToken` sources (the token [`crate::token`] had for the pod). `clusterTrustBundle`
//! and `podCertificate` sources are refused by validation, as `serviceAccountToken` in a static
//! pod (no API server has bound it to the node).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;

use super::atomic_writer::Payload;
use super::config_map::object_payload;
use super::downward_api::downward_payload;
use super::{SetUp, SetUpError, VolumePlugin};
use crate::objects::ObjectKind;

/// The projected plugin.
pub struct ProjectedPlugin;

/// A `serviceAccountToken` source's file: the token had for its audience and lifetime, at its
/// `path`, with the volume's `defaultMode`, or 0600 when the pod has an `fsGroup` (made
/// group-readable with the group then), as kubelet's projected volume writes it.
///
/// Errors: no token had for the source (the pod sync asks for them before set-up).
fn token_payload(
    t: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    default_mode: Option<i32>,
    s: &SetUp<'_>,
) -> Result<Payload, SetUpError> {
    let spec = (
        t.audience.clone().unwrap_or_default(),
        t.expiration_seconds
            .unwrap_or(crate::token::DEFAULT_EXPIRATION_SECONDS),
    );
    let token = s.tokens.get(&spec).ok_or_else(|| {
        SetUpError::Token(format!(
            "failed to fetch token: none had for audience {:?}",
            spec.0
        ))
    })?;
    let mode = if s.fs_group_id()?.is_some() {
        0o600
    } else {
        default_mode.unwrap_or(super::config_map::DEFAULT_MODE)
    };
    let mut out = Payload::new();
    out.insert(
        t.path.clone(),
        super::atomic_writer::FileProjection {
            data: token.clone().into_bytes(),
            mode: (mode & 0o777) as u32,
        },
    );
    Ok(out)
}

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
            } else if let Some(t) = &src.service_account_token {
                token_payload(t, p.default_mode, s)?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_written_at_its_path_with_kubelets_mode() {
        const A: crate::fieldpath::Allocatable = crate::fieldpath::Allocatable {
            cpu_milli: 1000,
            memory: 1 << 30,
            ephemeral_storage: 1 << 30,
        };
        let objects = crate::objects::LocalObjects::default();
        let tokens: crate::token::PodTokens = [(("vault".to_string(), 600), "jwt".to_string())]
            .into_iter()
            .collect();
        let t: k8s_openapi::api::core::v1::ServiceAccountTokenProjection =
            serde_yaml::from_str("{path: t/token, audience: vault, expirationSeconds: 600}")
                .unwrap();
        let payload_of = |pod: &k8s_openapi::api::core::v1::Pod, mode: Option<i32>| {
            let s = SetUp {
                pod,
                objects: &objects,
                allocatable: &A,
                tokens: &tokens,
            };
            token_payload(&t, mode, &s)
        };
        let plain: k8s_openapi::api::core::v1::Pod =
            serde_yaml::from_str("metadata: {name: p}\nspec: {containers: []}").unwrap();
        let p = payload_of(&plain, None).unwrap();
        assert_eq!(p["t/token"].data, b"jwt");
        assert_eq!(p["t/token"].mode, 0o644);
        assert_eq!(
            payload_of(&plain, Some(0o400)).unwrap()["t/token"].mode,
            0o400
        );
        // With an fsGroup: 0600, made group-readable by the writer.
        let grouped: k8s_openapi::api::core::v1::Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {securityContext: {fsGroup: 2000}, containers: []}",
        )
        .unwrap();
        assert_eq!(payload_of(&grouped, None).unwrap()["t/token"].mode, 0o600);
        // A source no token was had for.
        let other: k8s_openapi::api::core::v1::ServiceAccountTokenProjection =
            serde_yaml::from_str("{path: x}").unwrap();
        let s = SetUp {
            pod: &plain,
            objects: &objects,
            allocatable: &A,
            tokens: &tokens,
        };
        assert!(matches!(
            token_payload(&other, None, &s),
            Err(SetUpError::Token(_))
        ));
    }
}
