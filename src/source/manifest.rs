//! Decoding one static pod manifest and applying kubelet's defaults for file pods.
//!
//! Follows kubelet's `pkg/kubelet/config/common.go` (`applyDefaults`, `tryDecodeSinglePod`): the
//! pod is named `<metadata.name>-<nodeName>`, its namespace defaults to `default`, `spec.nodeName`
//! is this node, and it carries the annotations `kubernetes.io/config.source=file` and
//! `kubernetes.io/config.hash`. A `kubernetes.io/config.seen` the manifest carries is dropped:
//! the config stamps it when it first sees the pod (see [`super::record_first_seen`]).
//!
//! One deliberate difference: kubelet derives a file pod's UID from a hash of the whole manifest,
//! so any edit gives the pod a new UID and restarts every container. nodelet derives the UID from
//! the file path, node name, namespace and name (a name-based UUID, v5), and keeps the content hash
//! in `config.hash`; an edit is then an UPDATE of the same pod, and only the containers whose spec
//! changed are restarted, unless a pod-level field changed (then the whole pod is made again in
//! a new sandbox: [`crate::kuberuntime::actions::pod_spec_hash`] and `sandbox_hash`). A
//! `metadata.uid` written in the manifest is kept, as kubelet does.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};

use super::validation::{validate_pod, FieldError};
use super::ManifestError;
use crate::objects::{
    config_map_data, is_valid_key, secret_data, Data, ObjectKind, ObjectRef, MAX_OBJECT_BYTES,
};
use crate::pod::{
    is_dns1123_subdomain, CONFIG_HASH_ANNOTATION, CONFIG_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION,
};

/// Namespace UUID under which file pod UIDs are derived (a fixed random v4 UUID of nodelet's).
const UID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6e0d_e1e7_5a1c_4f0e_9b52_7c1d_0f3a_9e41);

use crate::pod::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS;

/// What one manifest file defines: at most one pod, and any number of ConfigMaps and Secrets
/// (documents separated by `---`).
#[derive(Debug, Clone, Default)]
pub struct Manifest {
    /// The pod, with the file-pod defaults applied.
    pub pod: Option<Pod>,
    /// ConfigMaps and Secrets, with their data (see [`crate::objects`]).
    pub objects: Vec<(ObjectRef, Data)>,
    /// Paths of the pod's fields that the v1 Pod API does not have (`spec.containers[0].imagee`),
    /// which decoding drops, as kubelet's decoding of a static pod does; the file and URL
    /// sources warn of them (the API server's strict field validation warns `unknown field`
    /// likewise).
    pub unknown_fields: Vec<String>,
}

/// Decodes one manifest file (YAML or JSON; several YAML documents separated by `---`): at most
/// one `v1` `Pod`, validated and given the file-pod defaults, and any number of `v1` `ConfigMap`
/// and `Secret` documents (nodelet's local objects, [`crate::objects`]). `file` names the file
/// in errors and seeds the pod's UID.
///
/// Errors: [`ManifestError::Empty`], [`ManifestError::Parse`] (with the parser's line/column, or
/// the field path), [`ManifestError::Invalid`] naming the field and value (never a Secret's
/// value), [`ManifestError::InvalidName`] when `<name>-<nodeName>` is not a DNS-1123 subdomain.
pub fn decode_manifest(
    file: &Path,
    bytes: &[u8],
    node_name: &str,
) -> Result<Manifest, ManifestError> {
    let file_s = file.display().to_string();
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ManifestError::Empty { file: file_s });
    }
    // Decided in one linear pass before the parser, whose cost grows with the square of the
    // nesting depth.
    crate::yaml::check_nesting(bytes).map_err(|message| ManifestError::Parse {
        file: file_s.clone(),
        message,
    })?;
    // A file that holds a Secret: a parser message never quotes a value (it could be the
    // Secret's, e.g. a tagged `!!int` value in stringData).
    let holds_secret = holds_secret(bytes);
    let parse = |message: String| ManifestError::Parse {
        file: file_s.clone(),
        message: if holds_secret {
            unquote(&message)
        } else {
            message
        },
    };
    let invalid = |field: &str, value: &str, reason: &str| ManifestError::Invalid {
        file: file_s.clone(),
        error: FieldError {
            field: field.into(),
            value: value.into(),
            reason: reason.into(),
        },
    };
    // A UTF-8 byte order mark before the YAML (as some Windows editors write it) is not part of
    // the document, as kubelet's decoder reads it.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut out = Manifest::default();
    for (i, doc) in serde_yaml::Deserializer::from_slice(bytes).enumerate() {
        use serde::Deserialize;
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| parse(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let at = |field: &str| {
            if i == 0 {
                field.to_owned()
            } else {
                format!("document {}: {field}", i + 1)
            }
        };
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or("")
            .to_owned();
        let kind = kind.as_str();
        let api_version = value
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or("");
        if !matches!(kind, "Pod" | "ConfigMap" | "Secret") {
            return Err(invalid(
                &at("kind"),
                kind,
                "a static pod manifest holds a v1 Pod, ConfigMaps and Secrets",
            ));
        }
        if api_version != "v1" {
            return Err(invalid(&at("apiVersion"), api_version, "must be v1"));
        }
        match kind {
            "Pod" => {
                if out.pod.is_some() {
                    return Err(invalid(
                        &at("kind"),
                        kind,
                        "a manifest file holds at most one Pod",
                    ));
                }
                let mut value = value;
                octal_modes(&mut value);
                let mut unknown = Vec::new();
                let mut pod: Pod =
                    serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
                        value,
                        &mut |path: serde_ignored::Path<'_>| unknown.push(at(&field_path(&path))),
                    ))
                    .map_err(|e| parse(crate::config::field_error_message(&e)))?;
                out.unknown_fields = unknown;
                validate_pod(&pod).map_err(|error| ManifestError::Invalid {
                    file: file_s.clone(),
                    error,
                })?;
                let content_hash = crate::hash::object_hash(&pod);
                apply_file_pod_defaults(&mut pod, file, node_name, &content_hash)?;
                out.pod = Some(pod);
            }
            _ => {
                let object = decode_object(kind, value)
                    .map_err(|(field, value, reason)| invalid(&at(&field), &value, &reason))?;
                if out.objects.iter().any(|(r, _)| *r == object.0) {
                    return Err(invalid(
                        &at("metadata.name"),
                        &object.0.name,
                        &format!("another {kind} of this file has this name"),
                    ));
                }
                out.objects.push(object);
            }
        }
    }
    if out.pod.is_none() && out.objects.is_empty() {
        return Err(ManifestError::Empty { file: file_s });
    }
    Ok(out)
}

/// `path` as the API server names a field: `spec.containers[0].imagee`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            p if p.is_empty() => key.clone(),
            p => format!("{p}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// File modes written as YAML 1.1 octal (`defaultMode: 0400`, as the Kubernetes docs write
/// them and Kubernetes' YAML decoder reads them, 256) become numbers; the YAML 1.2 parser here
/// reads them as strings. Only `mode` and `defaultMode` keys under `spec.volumes` are touched
/// (a label or annotation named `mode` keeps its string). One leniency: a quoted `'0400'` there
/// is read as octal too.
fn octal_modes(pod: &mut serde_yaml::Value) {
    fn walk(v: &mut serde_yaml::Value) {
        match v {
            serde_yaml::Value::Mapping(m) => {
                for (k, val) in m.iter_mut() {
                    let is_mode = matches!(k.as_str(), Some("mode" | "defaultMode"));
                    if let (true, serde_yaml::Value::String(s)) = (is_mode, &*val) {
                        let octal = s.len() > 1
                            && s.starts_with('0')
                            && s.bytes().all(|b| (b'0'..=b'7').contains(&b));
                        if let Some(n) = octal.then(|| i64::from_str_radix(s, 8).ok()).flatten() {
                            *val = serde_yaml::Value::Number(n.into());
                        }
                    } else {
                        walk(val);
                    }
                }
            }
            serde_yaml::Value::Sequence(seq) => seq.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(volumes) = pod.get_mut("spec").and_then(|s| s.get_mut("volumes")) {
        walk(volumes);
    }
}

/// True when `bytes` may hold a `kind: Secret` document (YAML or JSON spelling).
fn holds_secret(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.lines().any(|l| {
        let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        l.contains("kind:Secret")
            || l.contains("\"kind\":\"Secret\"")
            || l.contains("kind:\"Secret\"")
            || l.contains("kind:'Secret'")
    })
}

/// `message` with every quoted part (`"..."`, `` `...` ``) replaced by `"<value not shown>"`.
fn unquote(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        if c == '"' || c == '`' {
            out.push_str("\"<value not shown>\"");
            for d in chars.by_ref() {
                if d == c {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Decodes one manifest that must define a pod (see [`decode_manifest`]); used where only pods
/// matter.
///
/// Errors: as [`decode_manifest`], and [`ManifestError::Invalid`] on `kind` when the file holds
/// no pod.
pub fn decode_static_pod(file: &Path, bytes: &[u8], node_name: &str) -> Result<Pod, ManifestError> {
    decode_manifest(file, bytes, node_name)?
        .pod
        .ok_or_else(|| ManifestError::Invalid {
            file: file.display().to_string(),
            error: FieldError {
                field: "kind".into(),
                value: String::new(),
                reason: "the file defines no Pod".into(),
            },
        })
}

/// Decodes and validates a ConfigMap or Secret document as the API server would: a DNS-1123
/// subdomain name, a DNS-1123 label namespace (default `default`), valid unique keys, at most
/// [`MAX_OBJECT_BYTES`] of data. A Secret's values appear in no error: a value that is not
/// base64 is named by its key only.
///
/// Errors: `(field, value, reason)`.
fn decode_object(
    kind: &str,
    value: serde_yaml::Value,
) -> Result<(ObjectRef, Data), (String, String, String)> {
    let fail = |f: &str, v: &str, r: &str| (f.to_owned(), v.to_owned(), r.to_owned());
    let (meta, data, object_kind) = if kind == "ConfigMap" {
        let cm: ConfigMap = serde_path_to_error::deserialize(value).map_err(|e| {
            let msg = crate::config::field_error_message(&e);
            (e.path().to_string(), String::new(), msg)
        })?;
        if let Some(k) = cm
            .data
            .iter()
            .flat_map(|d| d.keys())
            .find(|k| cm.binary_data.as_ref().is_some_and(|b| b.contains_key(*k)))
        {
            return Err(fail(
                &format!("binaryData[{k}]"),
                k,
                "duplicates a key of data",
            ));
        }
        (
            cm.metadata.clone(),
            config_map_data(&cm),
            ObjectKind::ConfigMap,
        )
    } else {
        let s: Secret = serde_path_to_error::deserialize(value).map_err(|e| {
            // The parser's message may quote the value: only the field is named.
            let path = e.path().to_string();
            let reason = if path.starts_with("data") {
                "is not valid base64 (the value is not shown)".to_owned()
            } else if path.starts_with("stringData") {
                "must be a string (the value is not shown)".to_owned()
            } else {
                crate::config::field_error_message(&e)
            };
            (path, String::new(), reason)
        })?;
        (s.metadata.clone(), secret_data(&s), ObjectKind::Secret)
    };
    let name = meta.name.clone().unwrap_or_default();
    if !is_dns1123_subdomain(&name) {
        return Err(fail(
            "metadata.name",
            &name,
            "must be a DNS-1123 subdomain of at most 253 characters",
        ));
    }
    let namespace = meta
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    if !crate::pod::is_dns1123_label(&namespace) {
        return Err(fail(
            "metadata.namespace",
            &namespace,
            "must be a DNS-1123 label",
        ));
    }
    let field = "data";
    if let Some(k) = data.keys().find(|k| !is_valid_key(k)) {
        return Err(fail(
            &format!("{field}[{k}]"),
            k,
            "must be a key of 1-253 characters of [-._a-zA-Z0-9], not '.', not starting with '..'",
        ));
    }
    let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_OBJECT_BYTES {
        return Err(fail(
            field,
            "",
            &format!("holds {size} bytes, more than the {MAX_OBJECT_BYTES} allowed"),
        ));
    }
    Ok((
        ObjectRef {
            kind: object_kind,
            namespace,
            name,
        },
        data,
    ))
}

fn apply_file_pod_defaults(
    pod: &mut Pod,
    file: &Path,
    node_name: &str,
    content_hash: &str,
) -> Result<(), ManifestError> {
    let meta = &mut pod.metadata;
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".into());
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let base_name = meta.name.clone().unwrap_or_default();
    let name = format!("{base_name}-{node_name}");
    if !is_dns1123_subdomain(&name) {
        return Err(ManifestError::InvalidName {
            file: file.display().to_string(),
            name,
        });
    }
    if meta.uid.as_deref().is_none_or(str::is_empty) {
        meta.uid = Some(static_pod_uid(file, node_name, &namespace, &base_name));
    }
    meta.name = Some(name);
    crate::source::validation::validate_log_dir_name(pod).map_err(|error| {
        ManifestError::Invalid {
            file: file.display().to_string(),
            error,
        }
    })?;
    let meta = &mut pod.metadata;
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), "file".into());
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), content_hash.into());
    // nodelet's own record of when it first saw the pod; a manifest's value is not taken.
    annotations.remove(CONFIG_SEEN_ANNOTATION);

    let Some(spec) = pod.spec.as_mut() else {
        return Ok(());
    };
    spec.node_name = Some(node_name.into());
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    let grace = spec
        .termination_grace_period_seconds
        .get_or_insert(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    // A negative grace period means 1 s (the API server's defaulting).
    if *grace < 0 {
        *grace = 1;
    }
    let host_network = spec.host_network.unwrap_or(false);
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for c in containers {
        let image = c.image.clone().unwrap_or_default();
        c.image_pull_policy
            .get_or_insert_with(|| default_pull_policy(&image).into());
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
        for p in c.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
            // The API default: on the host network, a container port is a port on the host.
            if host_network && p.host_port.unwrap_or(0) == 0 {
                p.host_port = Some(p.container_port);
            }
        }
    }
    Ok(())
}

/// The UID nodelet gives a file pod that does not set `metadata.uid`: a name-based UUID (v5) of
/// the manifest path, node name, namespace and `metadata.name` (before the node suffix).
pub fn static_pod_uid(file: &Path, node_name: &str, namespace: &str, name: &str) -> String {
    let seed = format!(
        "file:{}\nnode:{node_name}\n{namespace}/{name}",
        file.display()
    );
    uuid::Uuid::new_v5(&UID_NAMESPACE, seed.as_bytes()).to_string()
}

/// The API default for `imagePullPolicy`: `Always` when the image has no tag or the tag is
/// `latest` (and no digest), otherwise `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) if tag != "latest" => "IfNotPresent",
        _ => "Always",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n";

    #[test]
    fn fields_the_pod_api_does_not_have_are_named() {
        let good = decode_manifest(Path::new("/m/web.yaml"), GOOD.as_bytes(), "n").unwrap();
        assert!(good.unknown_fields.is_empty(), "{:?}", good.unknown_fields);
        let typos = GOOD
            .replace("  name: web\n", "  name: web\n  lables: {a: b}\n")
            .replace(
                "    image: busybox:1.36\n",
                "    image: busybox:1.36\n    imagePullPolicyy: Always\n    ports: [{containerPort: 80, protocoll: TCP}]\n",
            );
        let m = decode_manifest(Path::new("/m/web.yaml"), typos.as_bytes(), "n").unwrap();
        assert_eq!(
            m.unknown_fields,
            [
                "metadata.lables",
                "spec.containers[0].imagePullPolicyy",
                "spec.containers[0].ports[0].protocoll"
            ]
        );
        let pod = m.pod.unwrap();
        assert!(
            pod.metadata.labels.is_none(),
            "the misspelled field is not taken"
        );
    }

    #[test]
    fn a_config_seen_the_manifest_carries_is_not_taken() {
        let text = GOOD.replace(
            "  name: web\n",
            "  name: web\n  annotations: {kubernetes.io/config.seen: '2000-01-01T00:00:00Z', keep: 'yes'}\n",
        );
        let pod = decode_static_pod(Path::new("/etc/m/web.yaml"), text.as_bytes(), "n").unwrap();
        let ann = pod.metadata.annotations.unwrap();
        assert!(!ann.contains_key(CONFIG_SEEN_ANNOTATION), "{ann:?}");
        assert_eq!(ann["keep"], "yes");
    }

    #[test]
    fn file_pods_get_kubelets_name_namespace_and_annotations() {
        let pod =
            decode_static_pod(Path::new("/etc/m/web.yaml"), GOOD.as_bytes(), "node1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        assert_eq!(ann[CONFIG_HASH_ANNOTATION].len(), 16);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
    }

    #[test]
    fn uid_is_stable_across_edits_and_distinct_across_files() {
        let a = decode_static_pod(Path::new("/m/a.yaml"), GOOD.as_bytes(), "n").unwrap();
        let edited = GOOD.replace("1.36", "1.35");
        let b = decode_static_pod(Path::new("/m/a.yaml"), edited.as_bytes(), "n").unwrap();
        let c = decode_static_pod(Path::new("/m/c.yaml"), GOOD.as_bytes(), "n").unwrap();
        assert_eq!(a.metadata.uid, b.metadata.uid);
        assert_ne!(a.metadata.uid, c.metadata.uid);
        let hash =
            |p: &Pod| p.metadata.annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION].clone();
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn host_network_container_ports_default_to_host_ports() {
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: hostnet}\nspec:\n  hostNetwork: true\n  containers:\n  - {name: c, image: busybox:1.36, ports: [{name: tcp, containerPort: 4534}]}\n";
        let pod = decode_static_pod(Path::new("/m/h.yaml"), yaml.as_bytes(), "n").unwrap();
        let port = &pod.spec.unwrap().containers[0].ports.clone().unwrap()[0];
        assert_eq!(
            (port.host_port, port.protocol.as_deref()),
            (Some(4534), Some("TCP"))
        );
        let pod = decode_static_pod(Path::new("/m/g.yaml"), GOOD.as_bytes(), "n").unwrap();
        assert!(pod.spec.unwrap().containers[0].ports.is_none());
    }

    #[test]
    fn json_manifests_decode() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","uid":"fixed"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}"#;
        let pod = decode_static_pod(Path::new("/m/j.json"), json.as_bytes(), "n").unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("fixed"));
        assert_eq!(
            pod.spec.unwrap().containers[0].image_pull_policy.as_deref(),
            Some("Always")
        );
    }

    #[test]
    fn bad_manifests_name_file_and_field() {
        let cases: [(&str, &str); 5] = [
            ("", "empty"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: b}]\n", "/m/f.yaml"),
            ("apiVersion: v1\nkind: Deployment\nmetadata: {name: x}\n", "kind"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: x/../y}\nspec: {containers: [{name: c, image: b}]}\n", "metadata.name"),
            ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: 3}\n", "spec.containers"),
        ];
        for (text, needle) in cases {
            let e = decode_static_pod(Path::new("/m/f.yaml"), text.as_bytes(), "n").unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("/m/f.yaml") && msg.contains(needle),
                "{text:?}: {msg}"
            );
        }
    }

    #[test]
    fn name_too_long_with_node_suffix_is_refused() {
        let long = GOOD.replace("name: web", &format!("name: {}", "a".repeat(250)));
        let e = decode_static_pod(Path::new("/m/f.yaml"), long.as_bytes(), "node1").unwrap_err();
        assert!(matches!(e, ManifestError::InvalidName { .. }), "{e}");
    }

    #[test]
    fn a_name_whose_log_directory_would_not_fit_a_file_name_is_refused() {
        // 200 + "-node1" fits a DNS subdomain (253), but "default_<name>-node1_<uid>" is
        // 8 + 206 + 1 + 36 = 251 bytes: fits; 210 would make 261.
        let named = |n: usize| GOOD.replace("name: web", &format!("name: {}", "a".repeat(n)));
        assert!(decode_static_pod(Path::new("/m/f.yaml"), named(200).as_bytes(), "node1").is_ok());
        let e = decode_static_pod(Path::new("/m/f.yaml"), named(210).as_bytes(), "node1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("invalid field metadata.name")
                && e.contains("261-byte file name, more than 255; shorten metadata.name by 6"),
            "{e}"
        );
    }

    #[test]
    fn a_byte_order_mark_before_the_yaml_is_read_past() {
        let with_bom = format!("\u{feff}{GOOD}");
        let pod = decode_static_pod(Path::new("/m/f.yaml"), with_bom.as_bytes(), "n").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-n"));
    }

    #[test]
    fn yaml_1_1_octal_modes_are_read_as_kubernetes_reads_them() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m, annotations: {mode: '0644'}}\nspec:\n  volumes:\n  - {name: s, secret: {secretName: x, defaultMode: 0400, items: [{key: a, path: a, mode: 0755}]}}\n  - {name: c, configMap: {name: y, defaultMode: 420}}\n  containers: [{name: c, image: b}]\n";
        let pod = decode_static_pod(Path::new("/m/m.yaml"), text.as_bytes(), "n").unwrap();
        let v = &pod.spec.unwrap().volumes.unwrap();
        let s = v[0].secret.as_ref().unwrap();
        assert_eq!(s.default_mode, Some(0o400));
        assert_eq!(s.items.as_ref().unwrap()[0].mode, Some(0o755));
        assert_eq!(v[1].config_map.as_ref().unwrap().default_mode, Some(420));
        let pod = decode_static_pod(Path::new("/m/m.yaml"), text.as_bytes(), "n").unwrap();
        assert_eq!(
            pod.metadata.annotations.unwrap()["mode"],
            "0644",
            "not a file mode"
        );
    }

    #[test]
    fn parse_errors_in_a_file_with_a_secret_quote_no_value() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {password: !!int TOPSECRET}\n";
        let e = decode_manifest(Path::new("/m/s.yaml"), text.as_bytes(), "n").unwrap_err();
        assert!(!e.to_string().contains("TOPSECRET"), "{e}");
        assert!(e.to_string().contains("/m/s.yaml"), "{e}");
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_pull_policy("127.0.0.1:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }
}
