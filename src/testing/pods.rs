//! Pod fixtures for unit tests.

use k8s_openapi::api::core::v1::Pod;

/// A pod named `p` with the spec written in YAML flow style, e.g.
/// `{containers: [{name: c, image: b}]}`.
pub fn with_spec(spec: &str) -> Pod {
    serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {spec}"
    ))
    .unwrap()
}

/// A pod with UID `uid` and manifest version (`kubernetes.io/config.hash`) `hash`, and no spec.
pub fn versioned(uid: &str, hash: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.metadata.annotations = Some(
        [(
            crate::pod::CONFIG_HASH_ANNOTATION.to_string(),
            hash.to_string(),
        )]
        .into(),
    );
    p
}

/// The ConfigMap `name` in namespace `default`, as pods reference it.
pub fn config_map_ref(name: &str) -> crate::objects::ObjectRef {
    crate::objects::ObjectRef {
        kind: crate::objects::ObjectKind::ConfigMap,
        namespace: "default".into(),
        name: name.into(),
    }
}
