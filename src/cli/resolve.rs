//! Finding what the user named: a pod by name (with or without the `-<nodeName>` suffix of a
//! static pod's mirror name) in a namespace, and its container (kubectl's default container).

use k8s_openapi::api::core::v1::Pod;

use super::client::CliError;

/// The pod's namespace and name.
pub fn ns_name(p: &Pod) -> (&str, &str) {
    (
        p.metadata.namespace.as_deref().unwrap_or("default"),
        p.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The pod `name` among `pods` in namespace `scope` (`None`: any namespace, `-A`): by its
/// name, else by `name-<its node>` (a static pod named as in its manifest).
///
/// Errors: [`CliError::Usage`] naming the pods it might have meant (the same name in another
/// namespace, names that contain it or differ by a few letters), or saying there is none; with
/// `-A`, a name in several namespaces, naming them.
pub fn find_pod<'a>(pods: &'a [Pod], scope: Option<&str>, name: &str) -> Result<&'a Pod, CliError> {
    let suffixed = |p: &Pod| format!("{name}-{}", node_of(p));
    let in_scope = |p: &&Pod| scope.is_none_or(|ns| ns_name(p).0 == ns);
    let exact: Vec<&Pod> = pods
        .iter()
        .filter(in_scope)
        .filter(|p| ns_name(p).1 == name)
        .collect();
    let found = if exact.is_empty() {
        pods.iter()
            .filter(in_scope)
            .filter(|p| ns_name(p).1 == suffixed(p))
            .collect()
    } else {
        exact
    };
    match found.as_slice() {
        [one] => return Ok(one),
        [] => {}
        many => {
            let spaces: Vec<&str> = many.iter().map(|p| ns_name(p).0).collect();
            return Err(CliError::Usage(format!(
                "pod {name:?} is in several namespaces ({}); give one with -n",
                spaces.join(", ")
            )));
        }
    }
    // Names that contain it, and the nearest by edit distance (at most 3 edits).
    let distance = |p: &Pod| {
        let n = ns_name(p).1;
        edit_distance(n, name).min(edit_distance(n, &suffixed(p)))
    };
    let nearest = pods.iter().map(distance).min().unwrap_or(usize::MAX).min(3);
    let mut near: Vec<String> = pods
        .iter()
        .filter(|p| !name.is_empty() && (ns_name(p).1.contains(name) || distance(p) == nearest))
        .map(|p| {
            let (pns, n) = ns_name(p);
            if scope.is_none_or(|ns| ns == pns) {
                n.to_owned()
            } else {
                format!("{n} (-n {pns})")
            }
        })
        .collect();
    near.sort();
    let mut msg = match scope {
        Some(ns) => format!("pod {name:?} not found in namespace {ns:?}"),
        None => format!("pod {name:?} not found in any namespace"),
    };
    if near.is_empty() {
        msg.push_str(&format!(
            " ({} pods on this node; `nodelet get pods -A` lists them)",
            pods.len()
        ));
    } else {
        msg.push_str(&format!("; did you mean: {}?", near.join(", ")));
    }
    Err(CliError::Usage(msg))
}

/// The pod's `spec.nodeName` (empty: none).
pub fn node_of(p: &Pod) -> &str {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The container to use in `pod`, with the line kubectl prints on stderr when it chose one for
/// the user. `asked` when it names one (app or init); else kubectl's default
/// (`podcmd.FindOrDefaultContainerByName`, kubectl ≥ 1.21): the container that the annotation
/// `kubectl.kubernetes.io/default-container` names, else the first app container, with the
/// notice `Defaulted container "<name>" out of: <all, inits marked (init)>` when the pod has
/// more than one (an annotation that names no container of the pod says so in the notice too).
///
/// Errors: [`CliError::Usage`] when `asked` is not in the pod, or the pod has no container,
/// naming the containers to choose from.
pub fn container(pod: &Pod, asked: Option<&str>) -> Result<(String, Option<String>), CliError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let apps: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let inits: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    let name = ns_name(pod).1;
    let choose = || {
        let mut m = format!("choose one of: [{}]", apps.join(" "));
        if !inits.is_empty() {
            m.push_str(&format!(
                " or one of the init containers: [{}]",
                inits.join(" ")
            ));
        }
        m
    };
    if let Some(c) = asked {
        if apps.contains(&c) || inits.contains(&c) {
            return Ok((c.to_owned(), None));
        }
        return Err(CliError::Usage(format!(
            "container {c:?} is not in pod {name:?}; {}",
            choose()
        )));
    }
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/default-container"));
    let mut notice = Vec::new();
    if let Some(c) = annotated {
        if apps.contains(&c.as_str()) || inits.contains(&c.as_str()) {
            return Ok((c.clone(), None));
        }
        notice.push(format!(
            "Default container name {c:?} not found in pod {name}"
        ));
    }
    let Some(first) = apps.first() else {
        return Err(CliError::Usage(format!(
            "pod {name:?} has no container; {}",
            choose()
        )));
    };
    if apps.len() > 1 || !inits.is_empty() {
        let all: Vec<String> = apps
            .iter()
            .map(|c| (*c).to_owned())
            .chain(inits.iter().map(|c| format!("{c} (init)")))
            .collect();
        notice.push(format!(
            "Defaulted container {first:?} out of: {}",
            all.join(", ")
        ));
    }
    Ok((
        (*first).to_owned(),
        (!notice.is_empty()).then(|| notice.join("\n")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        let mut p: Pod = serde_yaml::from_str("spec: {nodeName: node1, containers: [{name: a}, {name: b}], initContainers: [{name: i}]}").unwrap();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p
    }

    #[test]
    fn static_pods_are_found_without_their_node_suffix() {
        let pods = [
            pod("default", "web-node1"),
            pod("kube-system", "etcd-node1"),
        ];
        assert_eq!(
            ns_name(find_pod(&pods, Some("default"), "web").unwrap()).1,
            "web-node1"
        );
        assert_eq!(
            ns_name(find_pod(&pods, Some("default"), "web-node1").unwrap()).1,
            "web-node1"
        );
        let e = find_pod(&pods, Some("default"), "etcd")
            .unwrap_err()
            .to_string();
        assert!(e.contains("etcd-node1 (-n kube-system)"), "{e}");
        let e = find_pod(&pods, Some("default"), "wbe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("did you mean: web-node1"), "{e}");
        let e = find_pod(&pods, Some("default"), "zzzzzzzz")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 pods on this node"), "{e}");
    }

    #[test]
    fn the_default_container_as_kubectl_picks_it() {
        let mut p = pod("default", "x");
        // No -c, no annotation: the first app container, and kubectl's notice naming them all.
        assert_eq!(
            container(&p, None).unwrap(),
            (
                "a".to_owned(),
                Some("Defaulted container \"a\" out of: a, b, i (init)".to_owned())
            )
        );
        assert_eq!(container(&p, Some("i")).unwrap(), ("i".to_owned(), None));
        let e = container(&p, Some("z")).unwrap_err().to_string();
        assert!(e.contains("\"z\" is not in pod"), "{e}");
        assert!(
            e.contains("choose one of: [a b] or one of the init containers: [i]"),
            "{e}"
        );
        let annotate = |p: &mut Pod, c: &str| {
            p.metadata.annotations = Some(
                [(
                    "kubectl.kubernetes.io/default-container".to_owned(),
                    c.to_owned(),
                )]
                .into(),
            )
        };
        annotate(&mut p, "b");
        assert_eq!(container(&p, None).unwrap(), ("b".to_owned(), None));
        annotate(&mut p, "gone");
        let (c, notice) = container(&p, None).unwrap();
        assert_eq!(c, "a");
        let notice = notice.unwrap();
        assert!(
            notice.starts_with("Default container name \"gone\" not found in pod x\n"),
            "{notice}"
        );
        // One container and no init container: no notice.
        let spec = p.spec.as_mut().unwrap();
        spec.containers.truncate(1);
        spec.init_containers = None;
        p.metadata.annotations = None;
        assert_eq!(container(&p, None).unwrap(), ("a".to_owned(), None));
        p.spec.as_mut().unwrap().containers.clear();
        let e = container(&p, None).unwrap_err().to_string();
        assert!(e.contains("has no container"), "{e}");
    }
}
