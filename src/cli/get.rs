//! `nodelet get pods`: kubectl's table (NAME, READY, STATUS, RESTARTS, AGE; `-o wide` adds IP,
//! NODE, QOS; `-A` a NAMESPACE column first), or the pods as YAML or JSON; `-w` prints a pod's
//! row again each time it changes (the agent asked once a second).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::printers::pod_row;
use super::resolve::{find_pod, ns_name};
use super::table::{age, TABLE};
use super::{CliError, Client, GetArgs};

/// How often `-w` asks the agent.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The pods `args` names (all of the namespace when none).
///
/// Errors: a name that matches no pod ([`find_pod`]'s message).
fn selected(pods: Vec<Pod>, args: &GetArgs) -> Result<Vec<Pod>, CliError> {
    if args.names.is_empty() {
        return Ok(pods.into_iter().filter(|p| args.ns.includes(p)).collect());
    }
    let mut out = Vec::with_capacity(args.names.len());
    for n in &args.names {
        out.push(find_pod(&pods, args.ns.scope(), n)?.clone());
    }
    Ok(out)
}

/// The header and one line per pod (tab-separated cells, not yet laid out).
pub fn rows(pods: &[Pod], wide: bool, all_ns: bool, now: jiff::Timestamp) -> (String, Vec<String>) {
    let mut header = String::new();
    if all_ns {
        header.push_str("NAMESPACE\t");
    }
    header.push_str("NAME\tREADY\tSTATUS\tRESTARTS\tAGE");
    if wide {
        header.push_str("\tIP\tNODE\tQOS");
    }
    let lines = pods
        .iter()
        .map(|p| {
            let (ns, name) = ns_name(p);
            let r = pod_row(p, now);
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .or(p.status.as_ref().and_then(|s| s.start_time.as_ref()));
            let mut l = String::new();
            if all_ns {
                l.push_str(ns);
                l.push('\t');
            }
            l.push_str(&format!(
                "{name}\t{}\t{}\t{}\t{}",
                r.ready,
                r.status,
                r.restarts,
                age(created, now)
            ));
            if wide {
                let st = p.status.clone().unwrap_or_default();
                let none = || "<none>".to_owned();
                let node = super::resolve::node_of(p);
                l.push_str(&format!(
                    "\t{}\t{}\t{}",
                    st.pod_ip.filter(|s| !s.is_empty()).unwrap_or_else(none),
                    if node.is_empty() { "<none>" } else { node },
                    st.qos_class.unwrap_or_else(none)
                ));
            }
            l
        })
        .collect();
    (header, lines)
}

/// Prints what `args` asks for; with `-w`, does not return until interrupted (or the agent
/// stops answering).
///
/// Errors: [`CliError`] from the agent or the names.
pub async fn run(client: &Client, args: &GetArgs) -> Result<(), CliError> {
    if args.watch && matches!(args.output.as_deref(), Some("json" | "yaml")) {
        return Err(CliError::Usage(
            "-w prints the table (or -o wide); it cannot follow -o json or yaml".into(),
        ));
    }
    let pods = selected(super::pods(client).await?, args)?;
    let wide = args.output.as_deref() == Some("wide");
    match args.output.as_deref() {
        Some("json") | Some("yaml") => {
            let value = if args.names.len() == 1 {
                serde_json::to_value(&pods[0])
            } else {
                serde_json::to_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "List", "metadata": {}, "items": pods,
                }))
            }
            .map_err(|e| CliError::Io(e.to_string()))?;
            let text = if args.output.as_deref() == Some("json") {
                serde_json::to_string_pretty(&value)
                    .map(|s| s + "\n")
                    .map_err(|e| CliError::Io(e.to_string()))?
            } else {
                serde_yaml::to_string(&value).map_err(|e| CliError::Io(e.to_string()))?
            };
            super::print(&text);
            return Ok(());
        }
        _ => {}
    }
    let now = super::now();
    let (header, lines) = rows(&pods, wide, args.ns.all_namespaces, now);
    if lines.is_empty() && !args.watch {
        let ns = if args.ns.all_namespaces {
            String::new()
        } else {
            format!(" in {} namespace", args.ns.namespace)
        };
        eprintln!("No resources found{ns}.");
        return Ok(());
    }
    let mut text = header.clone();
    text.push('\n');
    for l in &lines {
        text.push_str(l);
        text.push('\n');
    }
    let laid = TABLE.format(&text);
    super::print(&laid);
    if !args.watch {
        return Ok(());
    }
    watch(client, args, &pods, wide).await
}

/// The row of each pod (by UID) without its age: what `-w` compares.
fn states(
    pods: &[Pod],
    wide: bool,
    all: bool,
    now: jiff::Timestamp,
) -> BTreeMap<String, (String, String)> {
    let (_, lines) = rows(pods, wide, all, now);
    pods.iter()
        .zip(lines)
        .map(|(p, l)| {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            // AGE left out, and the age of the last restart: only what changed is printed.
            let (age, restarts) = (4 + usize::from(all), 3 + usize::from(all));
            let key = l
                .split('\t')
                .enumerate()
                .filter(|(i, _)| *i != age)
                .map(|(i, c)| {
                    if i == restarts {
                        c.split(" (").next().unwrap_or(c)
                    } else {
                        c
                    }
                })
                .collect::<Vec<_>>()
                .join("\t");
            (uid, (key, l))
        })
        .collect()
}

async fn watch(client: &Client, args: &GetArgs, first: &[Pod], wide: bool) -> Result<(), CliError> {
    let all = args.ns.all_namespaces;
    let mut last = states(first, wide, all, super::now());
    loop {
        crate::clock::sleep(WATCH_INTERVAL).await;
        let pods: Vec<Pod> = super::pods(client)
            .await?
            .into_iter()
            .filter(|p| args.ns.includes(p))
            .filter(|p| {
                args.names.is_empty()
                    || args
                        .names
                        .iter()
                        .any(|n| find_pod(std::slice::from_ref(p), args.ns.scope(), n).is_ok())
            })
            .collect();
        let now = states(&pods, wide, all, super::now());
        let mut text = String::new();
        for (uid, (key, line)) in &now {
            if last.get(uid).is_none_or(|(k, _)| k != key) {
                text.push_str(line);
                text.push('\n');
            }
        }
        if !text.is_empty() && !super::print(&TABLE.format(&text)) {
            return Ok(());
        }
        last = now;
    }
}
