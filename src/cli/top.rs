//! `nodelet top pods|node`: cpu (millicores) and memory working set (MiB) from the agent's
//! `/stats/summary`, as `kubectl top` prints metrics-server's (which reads the same fields);
//! the node's percentages are of its allocatable (kubectl's).

use std::time::Duration;

use serde::Deserialize;

use super::table::TABLE;
use super::{CliError, Client, TopArgs, TopResource};

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Cpu {
    usage_nano_cores: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Memory {
    working_set_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodRef {
    name: String,
    namespace: String,
}

#[derive(Deserialize)]
struct PodStats {
    #[serde(rename = "podRef")]
    pod_ref: PodRef,
    #[serde(default)]
    cpu: Option<Cpu>,
    #[serde(default)]
    memory: Option<Memory>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStats {
    node_name: String,
    #[serde(default)]
    cpu: Option<Cpu>,
    #[serde(default)]
    memory: Option<Memory>,
}

#[derive(Deserialize)]
struct Summary {
    node: NodeStats,
    #[serde(default)]
    pods: Vec<PodStats>,
}

/// `/local/node`'s allocatable.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocatable {
    /// cpu, millicores.
    pub cpu_millis: i64,
    /// memory, bytes.
    pub memory_bytes: i64,
}

/// What `/local/node` answers ([`crate::nodeapi::local`]).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalNode {
    /// The node's name.
    pub name: String,
    /// Its allocatable.
    pub allocatable: Allocatable,
    /// `cgroupfs` or `systemd`.
    pub cgroup_driver: String,
    /// Each pod's cgroup parent by UID.
    #[serde(default)]
    pub pod_cgroups: std::collections::BTreeMap<String, String>,
}

fn millis(c: Option<&Cpu>) -> Option<u64> {
    c.and_then(|c| c.usage_nano_cores).map(|n| n / 1_000_000)
}

fn mebibytes(m: Option<&Memory>) -> Option<u64> {
    m.and_then(|m| m.working_set_bytes)
        .map(|b| b / (1024 * 1024))
}

/// The summary, asked again after a second when a cpu rate is still missing (the agent
/// computes rates between two readings: the first scrape after a pod starts has none).
async fn summary(client: &Client) -> Result<Summary, CliError> {
    let path = "/stats/summary?only_cpu_and_memory=true";
    let s: Summary = client.get_json(path).await?;
    let missing = s
        .node
        .cpu
        .as_ref()
        .and_then(|c| c.usage_nano_cores)
        .is_none()
        || s.pods.iter().any(|p| millis(p.cpu.as_ref()).is_none());
    if !missing {
        return Ok(s);
    }
    crate::clock::sleep(Duration::from_secs(1)).await;
    client.get_json(path).await
}

/// Prints the table.
///
/// Errors: as [`Client::get_json`].
pub async fn run(client: &Client, args: &TopArgs) -> Result<(), CliError> {
    let s = summary(client).await?;
    let dash =
        |v: Option<u64>, unit: &str| v.map_or("<unknown>".to_owned(), |v| format!("{v}{unit}"));
    let mut text = String::new();
    if args.resource == TopResource::Node {
        let node: LocalNode = client.get_json("/local/node").await?;
        let pct = |v: Option<u64>, of: i64| match (v, of) {
            (Some(v), of) if of > 0 => format!("{}%", v as i64 * 100 / of),
            _ => "<unknown>".to_owned(),
        };
        let (c, m) = (
            millis(s.node.cpu.as_ref()),
            s.node.memory.as_ref().and_then(|m| m.working_set_bytes),
        );
        text.push_str("NAME\tCPU(cores)\tCPU%\tMEMORY(bytes)\tMEMORY%\n");
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            s.node.node_name,
            dash(c, "m"),
            pct(c, node.allocatable.cpu_millis),
            dash(m.map(|b| b / (1024 * 1024)), "Mi"),
            pct(m, node.allocatable.memory_bytes),
        ));
        super::print(&TABLE.format(&text));
        return Ok(());
    }
    let all = args.ns.all_namespaces;
    let mut pods: Vec<&PodStats> = s
        .pods
        .iter()
        .filter(|p| all || p.pod_ref.namespace == args.ns.namespace)
        .collect();
    pods.sort_by(|a, b| {
        (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
    });
    if pods.is_empty() {
        eprintln!("No resources found in {} namespace.", args.ns.namespace);
        return Ok(());
    }
    if all {
        text.push_str("NAMESPACE\t");
    }
    text.push_str("NAME\tCPU(cores)\tMEMORY(bytes)\n");
    for p in pods {
        if all {
            text.push_str(&p.pod_ref.namespace);
            text.push('\t');
        }
        text.push_str(&format!(
            "{}\t{}\t{}\n",
            p.pod_ref.name,
            dash(millis(p.cpu.as_ref()), "m"),
            dash(mebibytes(p.memory.as_ref()), "Mi")
        ));
    }
    super::print(&TABLE.format(&text));
    Ok(())
}
