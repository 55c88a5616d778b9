//! `nodelet describe pod NAME`: kubectl's `describePod` layout (status, each container's
//! state, last state, restarts, probes, resources, mounts, conditions, volumes, QoS class, the
//! pod's events with age and count) and, nodelet's own, the pod's cgroup.

use k8s_openapi::api::core::v1::{Container, ContainerState, ContainerStatus, Pod, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::events::{aggregate, last_seen, Event};
use super::resolve::{find_pod, ns_name};
use super::table::DESCRIBE;
use super::top::LocalNode;
use super::{CliError, Client, DescribeArgs};

/// Lines of `key:\tvalue` at an indent, laid out by [`DESCRIBE`] at the end.
#[derive(Default)]
struct Out(String);

impl Out {
    fn kv(&mut self, level: usize, key: &str, value: impl AsRef<str>) {
        let v = value.as_ref();
        self.0
            .push_str(&format!("{}{key}:\t{v}\n", "  ".repeat(level)));
    }

    fn line(&mut self, level: usize, text: impl AsRef<str>) {
        self.0
            .push_str(&format!("{}{}\n", "  ".repeat(level), text.as_ref()));
    }

    /// A map as kubectl prints labels: the first on the key's line, the others below it.
    fn map(
        &mut self,
        level: usize,
        key: &str,
        m: Option<&std::collections::BTreeMap<String, String>>,
    ) {
        let mut items = m.into_iter().flatten();
        match items.next() {
            None => self.kv(level, key, "<none>"),
            Some((k, v)) => {
                self.kv(level, key, format!("{k}={v}"));
                for (k, v) in items {
                    self.line(level, format!("\t{k}={v}"));
                }
            }
        }
    }
}

fn rfc1123(t: &Time) -> String {
    t.0.strftime("%a, %d %b %Y %H:%M:%S %z").to_string()
}

fn port(p: &IntOrString) -> String {
    match p {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// kubectl's probe line (`DescribeProbe`): `exec [cmd] delay=0s timeout=1s period=10s
/// #success=1 #failure=3`, `http-get http://:8080/healthz …`, `tcp-socket :80 …`,
/// `grpc <pod>:9000  …`.
pub fn probe(p: &Probe) -> String {
    let attrs = format!(
        "delay={}s timeout={}s period={}s #success={} #failure={}",
        p.initial_delay_seconds.unwrap_or(0),
        p.timeout_seconds.unwrap_or(1),
        p.period_seconds.unwrap_or(10),
        p.success_threshold.unwrap_or(1),
        p.failure_threshold.unwrap_or(3)
    );
    if let Some(e) = &p.exec {
        return format!(
            "exec [{}] {attrs}",
            e.command.clone().unwrap_or_default().join(" ")
        );
    }
    if let Some(h) = &p.http_get {
        let scheme = h.scheme.as_deref().unwrap_or("HTTP").to_lowercase();
        let host = h.host.clone().unwrap_or_default();
        let path = h.path.clone().unwrap_or_default();
        return format!("http-get {scheme}://{host}:{}{path} {attrs}", port(&h.port));
    }
    if let Some(t) = &p.tcp_socket {
        return format!(
            "tcp-socket {}:{} {attrs}",
            t.host.clone().unwrap_or_default(),
            port(&t.port)
        );
    }
    if let Some(g) = &p.grpc {
        return format!(
            "grpc <pod>:{} {} {attrs}",
            g.port,
            g.service.clone().unwrap_or_default()
        );
    }
    format!("unknown {attrs}")
}

fn state(o: &mut Out, level: usize, key: &str, s: Option<&ContainerState>) {
    let Some(s) = s else {
        return o.kv(level, key, "Waiting");
    };
    if let Some(r) = &s.running {
        o.kv(level, key, "Running");
        if let Some(t) = &r.started_at {
            o.kv(level + 1, "Started", rfc1123(t));
        }
    } else if let Some(t) = &s.terminated {
        o.kv(level, key, "Terminated");
        if let Some(r) = &t.reason {
            o.kv(level + 1, "Reason", r);
        }
        if let Some(m) = t.message.as_deref().filter(|m| !m.is_empty()) {
            o.kv(level + 1, "Message", m.replace('\n', " "));
        }
        o.kv(level + 1, "Exit Code", t.exit_code.to_string());
        if let Some(sig) = t.signal.filter(|s| *s != 0) {
            o.kv(level + 1, "Signal", sig.to_string());
        }
        if let Some(st) = &t.started_at {
            o.kv(level + 1, "Started", rfc1123(st));
        }
        if let Some(f) = &t.finished_at {
            o.kv(level + 1, "Finished", rfc1123(f));
        }
    } else if let Some(w) = &s.waiting {
        o.kv(level, key, "Waiting");
        if let Some(r) = &w.reason {
            o.kv(level + 1, "Reason", r);
        }
    } else {
        o.kv(level, key, "Waiting");
    }
}

/// An environment variable's value as kubectl describes it (`describeContainerEnvVars`): the
/// value; a fieldRef's value (metadata paths; empty for others, which the node resolves) and
/// `(<apiVersion>:<path>)`; a resourceFieldRef's value from the container's own resources
/// (`node allocatable` for a limit it does not set) and `(<resource>)`; for a Secret or
/// ConfigMap key, which key of which object and whether it is optional.
fn env_value(pod: &Pod, c: &Container, e: &k8s_openapi::api::core::v1::EnvVar) -> String {
    let Some(src) = &e.value_from else {
        return e.value.clone().unwrap_or_default();
    };
    if let Some(f) = &src.field_ref {
        let api = f.api_version.as_deref().unwrap_or("v1");
        let value = crate::fieldpath::metadata_value(pod, &f.field_path).unwrap_or_default();
        return format!("{value} ({api}:{})", f.field_path);
    }
    if let Some(r) = &src.resource_field_ref {
        let container = r.container_name.as_deref().filter(|n| !n.is_empty());
        let value = crate::fieldpath::resource_field_value(
            pod,
            container.unwrap_or(&c.name),
            &r.resource,
            r.divisor.as_ref().map(|d| d.0.as_str()),
            &crate::fieldpath::Allocatable::default(),
        )
        .unwrap_or_default();
        let value = if value == "0" && r.resource.starts_with("limits.") {
            "node allocatable".to_owned()
        } else {
            value
        };
        return format!("{value} ({})", r.resource);
    }
    let key = match (&src.secret_key_ref, &src.config_map_key_ref) {
        (Some(r), _) => Some(("in secret", &r.key, &r.name, r.optional)),
        (None, Some(r)) => Some(("of config map", &r.key, &r.name, r.optional)),
        (None, None) => None,
    };
    match key {
        Some((of, key, name, optional)) => format!(
            "<set to the key '{key}' {of} '{name}'>\tOptional: {}",
            optional.unwrap_or(false)
        ),
        None => "<set from a source>".to_owned(),
    }
}

fn container(o: &mut Out, pod: &Pod, c: &Container, cs: Option<&ContainerStatus>) {
    o.line(1, format!("{}:", c.name));
    let id = cs.and_then(|s| s.container_id.clone()).unwrap_or_default();
    o.kv(2, "Container ID", id);
    o.kv(2, "Image", c.image.clone().unwrap_or_default());
    o.kv(
        2,
        "Image ID",
        cs.map(|s| s.image_id.clone()).unwrap_or_default(),
    );
    let ports: Vec<String> = c
        .ports
        .iter()
        .flatten()
        .map(|p| {
            format!(
                "{}/{}",
                p.container_port,
                p.protocol.as_deref().unwrap_or("TCP")
            )
        })
        .collect();
    o.kv(
        2,
        "Port",
        if ports.is_empty() {
            "<none>".into()
        } else {
            ports.join(", ")
        },
    );
    for (key, words) in [("Command", &c.command), ("Args", &c.args)] {
        if let Some(w) = words.as_ref().filter(|w| !w.is_empty()) {
            o.line(2, format!("{key}:"));
            for a in w {
                o.line(3, a);
            }
        }
    }
    state(o, 2, "State", cs.and_then(|s| s.state.as_ref()));
    if let Some(last) = cs
        .and_then(|s| s.last_state.as_ref())
        .filter(|l| l.terminated.is_some())
    {
        state(o, 2, "Last State", Some(last));
    }
    o.kv(
        2,
        "Ready",
        if cs.is_some_and(|s| s.ready) {
            "True"
        } else {
            "False"
        },
    );
    o.kv(
        2,
        "Restart Count",
        cs.map_or(0, |s| s.restart_count).to_string(),
    );
    let r = c.resources.clone().unwrap_or_default();
    for (key, m) in [("Limits", r.limits), ("Requests", r.requests)] {
        if let Some(m) = m.filter(|m| !m.is_empty()) {
            o.line(2, format!("{key}:"));
            for (k, q) in m {
                o.kv(3, &k, &q.0);
            }
        }
    }
    for (key, p) in [
        ("Liveness", &c.liveness_probe),
        ("Readiness", &c.readiness_probe),
        ("Startup", &c.startup_probe),
    ] {
        if let Some(p) = p {
            o.kv(2, key, probe(p));
        }
    }
    let env: Vec<_> = c.env.iter().flatten().collect();
    if env.is_empty() {
        o.kv(2, "Environment", "<none>");
    } else {
        o.line(2, "Environment:");
        for e in env {
            o.kv(3, &e.name, env_value(pod, c, e));
        }
    }
    let mounts: Vec<_> = c.volume_mounts.iter().flatten().collect();
    if mounts.is_empty() {
        o.kv(2, "Mounts", "<none>");
    } else {
        o.line(2, "Mounts:");
        for m in mounts {
            let rw = if m.read_only == Some(true) {
                "ro"
            } else {
                "rw"
            };
            o.line(3, format!("{} from {} ({rw})", m.mount_path, m.name));
        }
    }
}

/// The text `describe` prints for `pod`, its `events` and its cgroup (`cgroup`, when known).
pub fn describe(pod: &Pod, events: &[Event], cgroup: Option<&str>, now: jiff::Timestamp) -> String {
    let mut o = Out::default();
    let (ns, name) = ns_name(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let st = pod.status.clone().unwrap_or_default();
    o.kv(0, "Name", name);
    o.kv(0, "Namespace", ns);
    o.kv(0, "Priority", spec.priority.unwrap_or(0).to_string());
    o.kv(
        0,
        "Node",
        format!(
            "{}/{}",
            spec.node_name.clone().unwrap_or_default(),
            st.host_ip.clone().unwrap_or_default()
        ),
    );
    if let Some(t) = &st.start_time {
        o.kv(0, "Start Time", rfc1123(t));
    }
    o.map(0, "Labels", pod.metadata.labels.as_ref());
    o.map(0, "Annotations", pod.metadata.annotations.as_ref());
    let status = match &pod.metadata.deletion_timestamp {
        Some(_) => "Terminating".to_owned(),
        None => st.phase.clone().unwrap_or_default(),
    };
    o.kv(0, "Status", status);
    if let Some(r) = &st.reason {
        o.kv(0, "Reason", r);
    }
    if let Some(m) = &st.message {
        o.kv(0, "Message", m);
    }
    o.kv(0, "IP", st.pod_ip.clone().unwrap_or_default());
    for (title, list, statuses) in [
        (
            "Init Containers",
            spec.init_containers.clone().unwrap_or_default(),
            st.init_container_statuses.clone().unwrap_or_default(),
        ),
        (
            "Containers",
            spec.containers.clone(),
            st.container_statuses.clone().unwrap_or_default(),
        ),
    ] {
        if list.is_empty() {
            continue;
        }
        o.line(0, format!("{title}:"));
        for c in &list {
            container(&mut o, pod, c, statuses.iter().find(|s| s.name == c.name));
        }
    }
    let conditions = st.conditions.clone().unwrap_or_default();
    if !conditions.is_empty() {
        o.line(0, "Conditions:");
        o.line(1, "Type\tStatus");
        for c in conditions {
            o.line(1, format!("{}\t{}", c.type_, c.status));
        }
    }
    let volumes = spec.volumes.clone().unwrap_or_default();
    if volumes.is_empty() {
        o.kv(0, "Volumes", "<none>");
    } else {
        o.line(0, "Volumes:");
        for v in volumes {
            o.line(1, format!("{}:", v.name));
            o.kv(2, "Type", volume_type(&v));
        }
    }
    o.kv(0, "QoS Class", st.qos_class.clone().unwrap_or_default());
    o.kv(0, "Cgroup", cgroup.unwrap_or("<unknown>"));
    o.map(0, "Node-Selectors", spec.node_selector.as_ref());
    let tolerations: Vec<String> = spec
        .tolerations
        .iter()
        .flatten()
        .map(|t| {
            format!(
                "{}:{}",
                t.key.clone().unwrap_or_default(),
                t.effect.clone().unwrap_or_default()
            )
        })
        .collect();
    o.kv(
        0,
        "Tolerations",
        if tolerations.is_empty() {
            "<none>".into()
        } else {
            tolerations.join(", ")
        },
    );
    let mine: Vec<Event> = events
        .iter()
        .filter(|e| e.involved_object == format!("pod/{ns}/{name}"))
        .cloned()
        .collect();
    if mine.is_empty() {
        o.kv(0, "Events", "<none>");
    } else {
        o.line(0, "Events:");
        o.line(1, "Type\tReason\tAge\tFrom\tMessage");
        o.line(1, "----\t------\t----\t----\t-------");
        for (e, n, first) in aggregate(&mine) {
            o.line(
                1,
                format!(
                    "{}\t{}\t{}\tnodelet\t{}",
                    e.type_,
                    e.reason,
                    last_seen(&e, n, &first, now),
                    e.message.replace('\n', " ")
                ),
            );
        }
    }
    DESCRIBE.format(&o.0)
}

fn volume_type(v: &k8s_openapi::api::core::v1::Volume) -> String {
    if let Some(e) = &v.empty_dir {
        let medium = e.medium.clone().unwrap_or_default();
        return format!(
            "EmptyDir (a temporary directory that shares a pod's lifetime), medium {medium:?}"
        );
    }
    if let Some(h) = &v.host_path {
        return format!("HostPath (bare host directory volume) {}", h.path);
    }
    if let Some(c) = &v.config_map {
        return format!("ConfigMap (a volume populated by a ConfigMap) {}", c.name);
    }
    if let Some(s) = &v.secret {
        return format!(
            "Secret (a volume populated by a Secret) {}",
            s.secret_name.clone().unwrap_or_default()
        );
    }
    if v.projected.is_some() {
        return "Projected (a volume that contains injected data from multiple sources)".into();
    }
    if v.downward_api.is_some() {
        return "DownwardAPI (a volume populated by information about the pod)".into();
    }
    "other".into()
}

/// Prints the description of the pod `args` names.
///
/// Errors: the pod unknown ([`find_pod`]), the agent not answering.
pub async fn run(client: &Client, args: &DescribeArgs) -> Result<(), CliError> {
    let pods = super::pods(client).await?;
    let pod = find_pod(&pods, args.ns.scope(), &args.name)?;
    let events = super::events::list(client).await?;
    let node: Option<LocalNode> = client.get_json("/local/node").await.ok();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let cgroup = node
        .as_ref()
        .and_then(|n| n.pod_cgroups.get(&uid))
        .map(String::as_str);
    super::print(&describe(pod, &events, cgroup, super::now()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_values_as_kubectl_describes_them() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: web, namespace: default}\nspec:\n  containers:\n  - name: c\n    resources: {requests: {cpu: 250m}, limits: {memory: 64Mi}}\n    env:\n    - {name: PLAIN, value: x}\n    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}\n    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n    - {name: CPU_REQ, valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}}\n    - {name: CPU_LIM, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}\n    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}\n    - {name: PW, valueFrom: {secretKeyRef: {name: db, key: password}}}\n    - {name: MODE, valueFrom: {configMapKeyRef: {name: cfg, key: mode, optional: true}}}\n",
        )
        .unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let got: Vec<String> = c
            .env
            .iter()
            .flatten()
            .map(|e| env_value(&pod, c, e))
            .collect();
        assert_eq!(
            got,
            [
                "x",
                "web (v1:metadata.name)",
                " (v1:spec.nodeName)",
                "250 (requests.cpu)",
                "node allocatable (limits.cpu)",
                "64 (limits.memory)",
                "<set to the key 'password' in secret 'db'>\tOptional: false",
                "<set to the key 'mode' of config map 'cfg'>\tOptional: true",
            ]
        );
    }

    #[test]
    fn probes_as_kubectl_describes_them() {
        let p = |y: &str| probe(&serde_yaml::from_str(y).unwrap());
        assert_eq!(
            p("exec: {command: [cat, /tmp/x]}"),
            "exec [cat /tmp/x] delay=0s timeout=1s period=10s #success=1 #failure=3"
        );
        assert_eq!(
            p("httpGet: {path: /healthz, port: 8080}\ninitialDelaySeconds: 5\nfailureThreshold: 6"),
            "http-get http://:8080/healthz delay=5s timeout=1s period=10s #success=1 #failure=6"
        );
        assert_eq!(
            p("tcpSocket: {port: http}"),
            "tcp-socket :http delay=0s timeout=1s period=10s #success=1 #failure=3"
        );
    }

    #[test]
    fn events_of_the_pod_with_their_counts() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: w, namespace: default}\nspec: {containers: [{name: c}]}",
        )
        .unwrap();
        let ev = |reason: &str, obj: &str, time: &str| Event {
            type_: "Warning".into(),
            reason: reason.into(),
            involved_object: obj.into(),
            field_path: Some("spec.containers{c}".into()),
            message: "m".into(),
            time: time.into(),
            seq: 0,
        };
        let mut other_container = ev("BackOff", "pod/default/w", "2026-12-04T11:58:00Z");
        other_container.field_path = Some("spec.containers{d}".into());
        let events = [
            ev("BackOff", "pod/default/w", "2026-12-04T11:50:00Z"),
            ev("BackOff", "pod/default/other", "2026-12-04T11:55:00Z"),
            other_container,
            ev("BackOff", "pod/default/w", "2026-12-04T11:59:00Z"),
        ];
        let now: jiff::Timestamp = "2026-12-04T12:00:00Z".parse().unwrap();
        let text = describe(&pod, &events, Some("/kubepods/podx"), now);
        // One container's repeats counted; the other container's same message a row of its own.
        assert!(
            text.contains("Warning  BackOff  60s (x2 over 10m)  nodelet  m"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["Warning", "BackOff", "2m", "nodelet", "m"]),
            "{text}"
        );
        let cgroup = text.lines().find(|l| l.starts_with("Cgroup:")).unwrap();
        assert_eq!(
            cgroup.split_whitespace().nth(1),
            Some("/kubepods/podx"),
            "{text}"
        );
    }
}
