//! `nodelet logs`: a container's log from the agent's `/containerLogs` (kubelet's
//! `containerLogs` handler: `follow`, `previous`, `tailLines`, `sinceSeconds`, `timestamps`),
//! copied to stdout as it arrives.

use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;

use super::resolve::{container, find_pod, ns_name};
use super::{CliError, Client, LogsArgs};

/// The node API path and query of what `args` asks of container `c` of pod `ns/name`.
pub fn query(ns: &str, name: &str, c: &str, args: &LogsArgs) -> String {
    let mut q: Vec<(&str, String)> = Vec::new();
    if args.follow {
        q.push(("follow", "true".into()));
    }
    if args.previous {
        q.push(("previous", "true".into()));
    }
    if let Some(n) = args.tail.filter(|n| *n >= 0) {
        q.push(("tailLines", n.to_string()));
    }
    if let Some(s) = args.since.filter(|s| *s > 0) {
        q.push(("sinceSeconds", s.to_string()));
    }
    if args.timestamps {
        q.push(("timestamps", "true".into()));
    }
    let mut path = format!("/containerLogs/{ns}/{name}/{c}");
    if !q.is_empty() {
        path.push('?');
        path.push_str(&serde_urlencoded::to_string(&q).unwrap_or_default());
    }
    path
}

/// Prints the log; with `-f`, until the container stops or the agent goes.
///
/// Errors: the pod or container unknown ([`find_pod`], [`container`]), the agent's refusal
/// (no previous instance, say), the connection lost.
pub async fn run(client: &Client, args: &LogsArgs) -> Result<(), CliError> {
    let pods = super::pods(client).await?;
    let pod = find_pod(&pods, args.ns.scope(), &args.pod)?;
    let (c, notice) = container(pod, args.container.as_deref())?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let (ns, name) = ns_name(pod);
    let mut body = client.get(&query(ns, name, &c, args)).await?.into_body();
    let mut out = tokio::io::stdout();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            CliError::Io(format!(
                "the agent ended the log stream midway (stopped?): {e}"
            ))
        })?;
        if let Some(data) = frame.data_ref() {
            // tokio's stdout reports a closed pipe (`| head`) at the flush: done, quietly.
            if out.write_all(data).await.is_err() || out.flush().await.is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}
