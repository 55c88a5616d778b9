//! Node identity at admission, as kubelet's predicate admit handler checks it:
//!
//! - the pod's `kubernetes.io/os` label must match the node's (`PodOSSelectorNodeLabelDoesNotMatch`);
//! - `spec.os.name` must be the node's OS (`PodOSNotSupported`);
//! - `spec.nodeSelector` and the required node affinity must match the node's labels
//!   (`NodeAffinity`, the scheduler's `NodeAffinity` filter);
//! - `spec.nodeName`, when set, must be this node (`NodeName`).
//!
//! The node's labels are kubelet's own (`kubernetes.io/hostname`, `kubernetes.io/os`,
//! `kubernetes.io/arch` and their `beta.` spellings) plus those of `--node-labels`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

use super::Rejection;

/// The label of a node's operating system.
pub const OS_LABEL: &str = "kubernetes.io/os";
/// The label of a node's architecture.
pub const ARCH_LABEL: &str = "kubernetes.io/arch";
/// The label of a node's hostname.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The node's name and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The node name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The architecture in Go's spelling, as kubelet labels it (`amd64`, `arm64`, ...).
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

impl NodeIdentity {
    /// kubelet's labels for node `name` on this machine, then `extra` (`--node-labels`) over
    /// them.
    pub fn new(name: &str, extra: &BTreeMap<String, String>) -> Self {
        let mut labels: BTreeMap<String, String> = [
            (HOSTNAME_LABEL, name),
            (OS_LABEL, "linux"),
            (ARCH_LABEL, go_arch()),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", go_arch()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        labels.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self {
            name: name.to_owned(),
            labels,
        }
    }
}

/// A label name part or value: at most 63 of `[A-Za-z0-9-_.]`, starting and ending with a
/// letter or digit (apimachinery's `IsQualifiedName` name part and `IsValidLabelValue`).
fn is_label_token(s: &str) -> bool {
    s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label key: `[prefix/]name`, the prefix a DNS-1123 subdomain.
fn is_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            crate::pod::is_dns1123_subdomain(prefix) && !name.contains('/') && is_label_token(name)
        }
        None => is_label_token(k),
    }
}

/// Parses `--node-labels`: `key=value` pairs separated by commas, keys and values as the API
/// server allows them in labels (an empty value is allowed).
///
/// Errors: a message naming the entry that is not `key=value` or whose key or value is not a
/// valid label key or value.
pub fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split_once('=') {
            Some((k, v)) if is_label_key(k) && (v.is_empty() || is_label_token(v)) => {
                Ok((k.to_owned(), v.to_owned()))
            }
            Some(_) => Err(format!(
                "{e:?}: a label key is [prefix/]name and a value at most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
            )),
            None => Err(format!("{e:?} is not key=value")),
        })
        .collect()
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        // Invalid requirements (values where none belong, Gt/Lt without exactly one) match
        // nothing, as the scheduler's selector parsing makes them.
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        "Gt" | "Lt" if values.len() != 1 => false,
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(t: &NodeSelectorTerm, node: &NodeIdentity) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
    let fields = t.match_fields.as_deref().unwrap_or(&[]);
    // An empty term matches nothing.
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let v = (r.key == "metadata.name").then_some(node.name.as_str());
            requirement_matches(r, v)
        })
}

/// True when the pod's node selector and required node affinity match the node (the terms of
/// the affinity are ORed, the requirements of a term ANDed).
pub fn matches_node(pod: &Pod, node: &NodeIdentity) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

/// The first refusal of `pod` by node identity, in kubelet's order.
pub fn admit(pod: &Pod, node: &NodeIdentity) -> Option<Rejection> {
    let reject = |reason: &str, message: &str| {
        Some(Rejection {
            reason: reason.into(),
            message: message.into(),
        })
    };
    let node_os = node.labels.get(OS_LABEL).map_or("linux", String::as_str);
    if pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OS_LABEL))
        .is_some_and(|os| os != node_os)
    {
        return reject(
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        );
    }
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.os.as_ref())
        .is_some_and(|os| os.name != "linux")
    {
        return reject(
            "PodOSNotSupported",
            "Failed to admit pod as the OS field doesn't match node OS",
        );
    }
    None
}

/// The predicates that come after resource fit: node selector and affinity, then node name.
pub fn admit_placement(pod: &Pod, node: &NodeIdentity) -> Option<Rejection> {
    if !matches_node(pod, node) {
        return Some(Rejection {
            reason: "NodeAffinity".into(),
            message:
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
                    .into(),
        });
    }
    let name = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if name.is_some_and(|n| !n.is_empty() && n != node.name) {
        return Some(Rejection {
            reason: "NodeName".into(),
            message: "Predicate NodeName failed: node(s) didn't match the requested node name"
                .into(),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pods::with_spec as pod;

    fn node() -> NodeIdentity {
        NodeIdentity::new("n1", &parse_node_labels("disktype=hdd, zone=a").unwrap())
    }

    #[test]
    fn selectors_and_required_affinity_match_the_nodes_labels() {
        let n = node();
        assert_eq!(n.labels["kubernetes.io/hostname"], "n1");
        assert_eq!(n.labels["kubernetes.io/arch"], go_arch());
        for (spec, ok) in [
            ("{nodeSelector: {disktype: hdd}, containers: []}", true),
            ("{nodeSelector: {disktype: ssd}, containers: []}", false),
            ("{nodeSelector: {kubernetes.io/os: linux}, containers: []}", true),
            ("{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [b]}]}, {matchExpressions: [{key: disktype, operator: Exists}]}]}}}, containers: []}", true),
            ("{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: NotIn, values: [a]}]}]}}}, containers: []}", false),
            ("{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [n1]}]}]}}}, containers: []}", true),
            ("{affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: gpu, operator: DoesNotExist}, {key: zone, operator: In, values: [a]}]}]}}}, containers: []}", true),
        ] {
            assert_eq!(matches_node(&pod(spec), &n), ok, "{spec}");
        }
        let r =
            admit_placement(&pod("{nodeSelector: {disktype: ssd}, containers: []}"), &n).unwrap();
        assert_eq!(r.reason, "NodeAffinity");
        let r = admit_placement(&pod("{nodeName: other, containers: []}"), &n).unwrap();
        assert_eq!(r.reason, "NodeName");
    }

    #[test]
    fn the_pods_os_must_be_the_nodes() {
        let n = node();
        let r = admit(&pod("{os: {name: windows}, containers: []}"), &n).unwrap();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS"
            )
        );
        let mut labelled = pod("{containers: []}");
        labelled.metadata.labels = Some([(OS_LABEL.to_string(), "windows".to_string())].into());
        assert_eq!(
            admit(&labelled, &n).unwrap().reason,
            "PodOSSelectorNodeLabelDoesNotMatch"
        );
        assert_eq!(admit(&pod("{os: {name: linux}, containers: []}"), &n), None);
        assert!(parse_node_labels("a=b,c").is_err());
        for bad in [
            "a b=c",
            "a=b=c",
            "x/y/z=1",
            "-a=1",
            &format!("{}=1", "k".repeat(64)),
        ] {
            assert!(parse_node_labels(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_node_labels("node-role.kubernetes.io/master=,tier=edge")
                .unwrap()
                .len(),
            2
        );
    }
}
