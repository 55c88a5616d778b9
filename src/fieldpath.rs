//! The downward API's values (kubelet's `pkg/fieldpath` and `pkg/api/v1/resource` helpers):
//! a pod's metadata fields by path, and a container's requests and limits for
//! `resourceFieldRef`, shared by the env of containers and by downwardAPI volumes.

use k8s_openapi::api::core::v1::Pod;

/// The node's allocatable resources, as a container's `resourceFieldRef` limits default to them
/// (kubelet's `MergeContainerResourceLimits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allocatable {
    /// cpu, millicores.
    pub cpu_milli: i64,
    /// memory, bytes.
    pub memory: i64,
    /// ephemeral-storage (the size of the filesystem of `--root-dir`), bytes.
    pub ephemeral_storage: i64,
}

/// Checks a `resourceFieldRef` as the API server does: a resource nodelet can read
/// (`limits.`/`requests.` of `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`) and a
/// divisor the API allows for it (cpu: `1m`, `1`; the others: `1`, or 1 of a decimal or binary
/// unit, `1k`…`1E`, `1Ki`…`1Ei`).
///
/// Errors: `(field suffix, reason)` (`resource` or `divisor`).
pub fn validate_resource_field(
    resource: &str,
    divisor: Option<&str>,
) -> Result<(), (&'static str, String)> {
    let name = resource
        .strip_prefix("limits.")
        .or_else(|| resource.strip_prefix("requests."));
    let is_cpu = name == Some("cpu");
    let known = match name {
        Some("cpu" | "memory" | "ephemeral-storage") => true,
        Some(n) => matches!(crate::resources::hugepage_size(n), Some(Ok(_))),
        None => false,
    };
    if !known {
        return Err((
            "resource",
            format!("{resource:?} is not a resource a resourceFieldRef can name (limits. or requests. of cpu, memory, ephemeral-storage, hugepages-<size>)"),
        ));
    }
    let Some(d) = divisor.filter(|d| !d.is_empty()) else {
        return Ok(());
    };
    let allowed: &[&str] = if is_cpu {
        &["1m", "1"]
    } else {
        &[
            "1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei",
        ]
    };
    let ok = allowed.contains(&d);
    if ok {
        Ok(())
    } else {
        Err((
            "divisor",
            format!(
                "{d:?} is not a divisor for {resource} (one of {})",
                allowed.join(", ")
            ),
        ))
    }
}

/// kubelet's `FormatMap`: `key="value"` lines in key order, values quoted as Go's `%q` quotes
/// them, without a final newline.
pub fn format_map(m: &std::collections::BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `strconv.Quote` for the characters labels and annotations hold: `"`, `\\` and control
/// characters escaped, printable characters (ASCII or not) as they are.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The value of a metadata field path (kubelet's `ExtractFieldPathAsString`): `metadata.name`,
/// `namespace`, `uid`, `labels` and `annotations` (whole, as [`format_map`]), and
/// `metadata.labels['k']` / `metadata.annotations['k']` (empty when absent). `None` for other
/// paths.
pub fn metadata_value(pod: &Pod, path: &str) -> Option<String> {
    let m = &pod.metadata;
    let bracket = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_owned)
    };
    let empty = std::collections::BTreeMap::new();
    let labels = m.labels.as_ref().unwrap_or(&empty);
    let annotations = m.annotations.as_ref().unwrap_or(&empty);
    match path {
        "metadata.name" => Some(m.name.clone().unwrap_or_default()),
        "metadata.namespace" => Some(m.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Some(m.uid.clone().unwrap_or_default()),
        "metadata.labels" => Some(format_map(labels)),
        "metadata.annotations" => Some(format_map(annotations)),
        _ => {
            if let Some(k) = bracket("metadata.labels") {
                return Some(labels.get(&k).cloned().unwrap_or_default());
            }
            if let Some(k) = bracket("metadata.annotations") {
                return Some(annotations.get(&k).cloned().unwrap_or_default());
            }
            None
        }
    }
}

/// The value of a `resourceFieldRef` (kubelet's `ExtractContainerResourceValue`): the named
/// request or limit of `container` (limits default to the node's allocatable, as kubelet's
/// `MergeContainerResourceLimits` does), divided by `divisor` (default 1) and rounded up: cpu in
/// millicores over the divisor's millicores, the others in bytes over its bytes.
///
/// Errors: a message for an unknown resource, container or divisor.
pub fn resource_field_value(
    pod: &Pod,
    container: &str,
    resource: &str,
    divisor: Option<&str>,
    allocatable: &Allocatable,
) -> Result<String, String> {
    let c = crate::pod::container_spec(pod, container)
        .ok_or_else(|| format!("resourceFieldRef: no container {container:?} in the pod"))?;
    let a = crate::resources::container_amounts(c).map_err(|e| e.to_string())?;
    let limit_or_alloc = |v: i64, alloc: i64| if v > 0 { v } else { alloc };
    let (value, is_cpu) = match resource {
        "limits.cpu" => (limit_or_alloc(a.cpu_limit, allocatable.cpu_milli), true),
        "requests.cpu" => (a.cpu_request, true),
        "limits.memory" => (limit_or_alloc(a.memory_limit, allocatable.memory), false),
        "requests.memory" => (a.memory_request, false),
        "limits.ephemeral-storage" => (
            limit_or_alloc(a.ephemeral_storage_limit, allocatable.ephemeral_storage),
            false,
        ),
        "requests.ephemeral-storage" => (a.ephemeral_storage_request, false),
        _ => {
            let name = resource
                .strip_prefix("limits.")
                .or_else(|| resource.strip_prefix("requests."))
                .unwrap_or("");
            match crate::resources::hugepage_size(name) {
                Some(Ok(size)) => (a.hugepages.get(&size).copied().unwrap_or(0), false),
                _ => {
                    return Err(format!(
                        "resourceFieldRef: unsupported resource {resource:?}"
                    ))
                }
            }
        }
    };
    let divisor = divisor.filter(|d| !d.is_empty()).unwrap_or("1");
    let d = if is_cpu {
        crate::quantity::parse_milli(divisor)
    } else {
        crate::quantity::parse_value(divisor)
    }
    .map_err(|e| format!("resourceFieldRef divisor {divisor:?}: {e}"))?;
    if d <= 0 {
        return Err(format!(
            "resourceFieldRef divisor {divisor:?}: must be positive"
        ));
    }
    let v = i128::from(value);
    Ok(((v + d - 1).div_euclid(d)).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_fields_and_divisors_are_checked_as_the_api_server_does() {
        assert!(validate_resource_field("limits.memory", Some("1Mi")).is_ok());
        assert!(validate_resource_field("requests.cpu", Some("1m")).is_ok());
        assert!(validate_resource_field("limits.hugepages-2Mi", None).is_ok());
        assert_eq!(
            validate_resource_field("limits.gpu", None).unwrap_err().0,
            "resource"
        );
        for bad in ["0", "abc", "1n", "2Mi", "99999999999999999999Ei"] {
            assert_eq!(
                validate_resource_field("limits.memory", Some(bad))
                    .unwrap_err()
                    .0,
                "divisor",
                "{bad}"
            );
        }
        assert!(validate_resource_field("requests.cpu", Some("1n")).is_err());
        assert!(validate_resource_field("limits.memory", Some("1m")).is_err());
    }

    #[test]
    fn maps_format_as_kubelet_formats_them() {
        let m = [
            ("b".to_string(), "two \"quoted\"\nlines".to_string()),
            ("a".to_string(), "1".to_string()),
        ]
        .into();
        assert_eq!(format_map(&m), "a=\"1\"\nb=\"two \\\"quoted\\\"\\nlines\"");
    }

    #[test]
    fn resource_fields_round_up_by_divisor_and_fall_back_to_allocatable() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {containers: [{name: c, image: b, resources: {requests: {cpu: 1500m, memory: 100Mi, ephemeral-storage: 1Gi}, limits: {hugepages-2Mi: 4Mi, memory: 1Gi}}}]}",
        )
        .unwrap();
        let a = Allocatable {
            cpu_milli: 4000,
            memory: 8 << 30,
            ephemeral_storage: 50 << 30,
        };
        let v = |r: &str, d: Option<&str>| resource_field_value(&p, "c", r, d, &a);
        assert_eq!(v("requests.cpu", None).unwrap(), "2");
        assert_eq!(v("requests.cpu", Some("1m")).unwrap(), "1500");
        assert_eq!(v("requests.cpu", Some("100m")).unwrap(), "15");
        assert_eq!(v("limits.cpu", Some("1m")).unwrap(), "4000", "allocatable");
        assert_eq!(v("requests.memory", Some("1Mi")).unwrap(), "100");
        assert_eq!(v("limits.memory", Some("1Gi")).unwrap(), "1");
        assert_eq!(v("limits.ephemeral-storage", Some("1Gi")).unwrap(), "50");
        assert_eq!(
            v("requests.ephemeral-storage", None).unwrap(),
            (1u64 << 30).to_string()
        );
        assert_eq!(v("limits.hugepages-2Mi", Some("1Mi")).unwrap(), "4");
        assert!(v("limits.gpu", None).is_err());
        assert!(v("requests.cpu", Some("0")).is_err());
        assert!(resource_field_value(&p, "x", "requests.cpu", None, &a).is_err());
    }
}
