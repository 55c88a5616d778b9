//! configMap volumes (kubelet's `pkg/volume/configmap`): a local ConfigMap's keys as files,
//! written atomically ([`super::atomic_writer`]) under
//! `pods/<uid>/volumes/kubernetes.io~configmap/<name>` and rewritten when the ConfigMap changes.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{KeyToPath, Volume};

use super::atomic_writer::{FileProjection, Payload};
use super::{SetUp, SetUpError, VolumePlugin};
use crate::objects::{not_found, ObjectKind};

/// Mode of projected files when the volume sets no `defaultMode` (the API default, 0644).
pub const DEFAULT_MODE: i32 = 0o644;

/// The configMap plugin.
pub struct ConfigMapPlugin;

/// The files of a ConfigMap or Secret (kubelet's `MakePayload`): every key as a file named by
/// it, or only `items` (key → path, with their own modes); `defaultMode` otherwise. A missing
/// object gives no files when `optional`, else kubelet's `configmap "x" not found`; a missing
/// item key is skipped when `optional`, else an error naming it.
///
/// Errors: the message of the missing object or key.
pub fn object_payload(
    kind: ObjectKind,
    name: &str,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: Option<i32>,
    s: &SetUp<'_>,
) -> Result<Payload, SetUpError> {
    let namespace = s.pod.metadata.namespace.as_deref().unwrap_or_default();
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    let Some(data) = s.objects.get(kind, namespace, name) else {
        return if optional {
            Ok(Payload::new())
        } else {
            Err(SetUpError::MissingObject(not_found(kind, name)))
        };
    };
    let file = |bytes: &Vec<u8>, mode: i32| FileProjection {
        data: bytes.clone(),
        mode: (mode & 0o777) as u32,
    };
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data.iter() {
                out.insert(k.clone(), file(v, default_mode));
            }
        }
        Some(items) => {
            for it in items {
                match data.get(&it.key) {
                    Some(v) => {
                        out.insert(
                            super::atomic_writer::normalize(&it.path),
                            file(v, it.mode.unwrap_or(default_mode)),
                        );
                    }
                    None if optional => {}
                    None => {
                        let what = match kind {
                            ObjectKind::ConfigMap => "configmap references non-existent config key",
                            ObjectKind::Secret => "references non-existent secret key",
                        };
                        return Err(SetUpError::MissingObject(format!("{what}: {}", it.key)));
                    }
                }
            }
        }
    }
    Ok(out)
}

impl VolumePlugin for ConfigMapPlugin {
    fn set_up(&self, v: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let cm = v
            .config_map
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not a configMap volume".into()))?;
        let payload = object_payload(
            ObjectKind::ConfigMap,
            &cm.name,
            cm.items.as_deref(),
            cm.optional.unwrap_or(false),
            cm.default_mode,
            s,
        )?;
        super::publish(dir, &payload, s, false)
    }

    fn tear_down(&self, dir: &Path) {
        super::empty_dir::remove_volume_dir(dir);
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~configmap"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{LocalObjects, ObjectRef};
    use k8s_openapi::api::core::v1::Pod;

    static EMPTY: crate::token::PodTokens = crate::token::PodTokens::new();

    fn set_up<'a>(pod: &'a Pod, objects: &'a LocalObjects) -> SetUp<'a> {
        const A: crate::fieldpath::Allocatable = crate::fieldpath::Allocatable {
            cpu_milli: 1000,
            memory: 1 << 30,
            ephemeral_storage: 1 << 30,
        };
        SetUp {
            pod,
            objects,
            allocatable: &A,
            tokens: &EMPTY,
        }
    }

    #[test]
    fn payloads_follow_items_modes_and_optional() {
        let objects = LocalObjects::default();
        objects.replace(
            [(
                ObjectRef {
                    kind: ObjectKind::ConfigMap,
                    namespace: "ns".into(),
                    name: "cm".into(),
                },
                [
                    ("a".to_string(), b"1".to_vec()),
                    ("b".to_string(), b"2".to_vec()),
                ]
                .into(),
            )]
            .into(),
        );
        let pod: Pod = serde_yaml::from_str("metadata: {name: p, namespace: ns}").unwrap();
        let s = set_up(&pod, &objects);
        let all = object_payload(ObjectKind::ConfigMap, "cm", None, false, None, &s).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all["a"].mode, 0o644);
        let items: Vec<KeyToPath> =
            serde_yaml::from_str("[{key: b, path: x/y, mode: 256}, {key: a, path: z}]").unwrap();
        let some = object_payload(
            ObjectKind::ConfigMap,
            "cm",
            Some(&items),
            false,
            Some(0o600),
            &s,
        )
        .unwrap();
        assert_eq!(
            (some["x/y"].data.as_slice(), some["x/y"].mode),
            (&b"2"[..], 0o400)
        );
        assert_eq!(some["z"].mode, 0o600);
        let missing_key: Vec<KeyToPath> = serde_yaml::from_str("[{key: c, path: c}]").unwrap();
        assert_eq!(
            object_payload(
                ObjectKind::ConfigMap,
                "cm",
                Some(&missing_key),
                false,
                None,
                &s
            )
            .unwrap_err(),
            SetUpError::MissingObject("configmap references non-existent config key: c".into())
        );
        assert!(object_payload(
            ObjectKind::ConfigMap,
            "cm",
            Some(&missing_key),
            true,
            None,
            &s
        )
        .unwrap()
        .is_empty());
        assert_eq!(
            object_payload(ObjectKind::Secret, "gone", None, false, None, &s).unwrap_err(),
            SetUpError::MissingObject("secret \"gone\" not found".into())
        );
        assert!(
            object_payload(ObjectKind::Secret, "gone", None, true, None, &s)
                .unwrap()
                .is_empty()
        );
    }
}
