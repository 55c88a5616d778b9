//! The command line an operator uses on the node, in pod names and looking like kubectl:
//! `nodelet get pods`, `describe pod`, `logs`, `exec`, `top`, `events`, `completion`. Each is a
//! client of the running agent through its local socket (`<root-dir>/nodelet.sock`, root only:
//! [`crate::nodeapi::local`]), so it needs no configuration file, no certificate and no network.
//!
//! Errors print one line (`error: …`) and exit 1: the agent not running (and how to start it),
//! an unknown pod (with the names it might have meant), a pod with several containers and no
//! `-c` (with the list). `exec` exits with the command's status.

pub mod client;
pub mod complete;
pub mod describe;
pub mod events;
pub mod exec;
pub mod get;
pub mod logs;
pub mod printers;
pub mod resolve;
pub mod table;
pub mod top;

use std::path::Path;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Pod;

pub use client::{CliError, Client};

/// Which pods: `-n NAMESPACE` (default `default`, as kubectl's) or `-A`.
#[derive(Args, Debug, Clone)]
pub struct Namespace {
    /// The pods' namespace.
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// Every namespace (a NAMESPACE column first).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

impl Namespace {
    /// The namespace a name is looked up in: `None` (any) with `-A`.
    pub fn scope(&self) -> Option<&str> {
        (!self.all_namespaces).then_some(self.namespace.as_str())
    }

    /// Whether `pod` is among the pods asked for.
    pub fn includes(&self, pod: &Pod) -> bool {
        self.all_namespaces || resolve::ns_name(pod).0 == self.namespace
    }
}

/// The pods resource, as kubectl spells it.
#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum PodsResource {
    /// Pods.
    #[value(alias = "pod", alias = "po")]
    Pods,
}

/// `nodelet get pods`.
#[derive(Args, Debug, Clone)]
pub struct GetArgs {
    /// What to list.
    #[arg(value_enum)]
    pub resource: PodsResource,
    /// Only these pods (with or without a static pod's `-<nodeName>` suffix).
    #[arg(value_name = "NAME", add = clap_complete::engine::ArgValueCompleter::new(complete::pod_names))]
    pub names: Vec<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
    /// Output format: the table, `wide` (IP, NODE, QOS), `yaml` or `json` (the pods as the API
    /// has them).
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = ["wide", "yaml", "json"])]
    pub output: Option<String>,
    /// After the list, print a pod's row again whenever it changes.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// `nodelet describe pod NAME`.
#[derive(Args, Debug, Clone)]
pub struct DescribeArgs {
    /// What to describe.
    #[arg(value_enum)]
    pub resource: PodsResource,
    /// The pod.
    #[arg(value_name = "NAME", add = clap_complete::engine::ArgValueCompleter::new(complete::pod_names))]
    pub name: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
}

/// `nodelet logs`.
#[derive(Args, Debug, Clone)]
pub struct LogsArgs {
    /// The pod.
    #[arg(value_name = "POD", add = clap_complete::engine::ArgValueCompleter::new(complete::pod_names))]
    pub pod: String,
    /// The container (default: the pod's `kubectl.kubernetes.io/default-container`, else its
    /// only one).
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub container: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
    /// Follow the log as it grows (across rotations) until the container stops.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// The previous instance's log (before the last restart).
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Only the last N lines (-1: all, as kubectl's default; below -1 is refused).
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(-1..))]
    pub tail: Option<i64>,
    /// Only lines newer than this (`5s`, `2m`, `1h`).
    #[arg(long, value_name = "DURATION", value_parser = parse_since)]
    pub since: Option<u64>,
    /// Each line with its RFC 3339 time.
    #[arg(long)]
    pub timestamps: bool,
}

/// `nodelet exec`.
#[derive(Args, Debug, Clone)]
pub struct ExecArgs {
    /// The pod.
    #[arg(value_name = "POD", add = clap_complete::engine::ArgValueCompleter::new(complete::pod_names))]
    pub pod: String,
    /// The container (default as for `logs`).
    #[arg(short = 'c', long, value_name = "CONTAINER")]
    pub container: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
    /// Pass this terminal's input to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal (raw mode here, resized with this window).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What `top` shows.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopResource {
    /// Each pod's cpu and memory.
    #[value(alias = "pod", alias = "po")]
    Pods,
    /// The node's.
    #[value(alias = "nodes", alias = "no")]
    Node,
}

/// `nodelet top pods|node`.
#[derive(Args, Debug, Clone)]
pub struct TopArgs {
    /// Pods or the node.
    #[arg(value_enum)]
    pub resource: TopResource,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
}

/// `nodelet events`.
#[derive(Args, Debug, Clone)]
pub struct EventsArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub ns: Namespace,
    /// After the list, print events as they come.
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// Shells whose completion `nodelet completion` prints.
#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum Shell {
    /// bash.
    Bash,
    /// zsh.
    Zsh,
}

/// A command of the command line.
#[derive(Debug, Clone)]
pub enum CliCommand {
    /// `get pods`.
    Get(GetArgs),
    /// `describe pod`.
    Describe(DescribeArgs),
    /// `logs`.
    Logs(LogsArgs),
    /// `exec`.
    Exec(ExecArgs),
    /// `top`.
    Top(TopArgs),
    /// `events`.
    Events(EventsArgs),
}

/// `5s`, `2m`, `1h30m` in seconds (kubectl's `--since`, Go's duration syntax); 0 means no
/// limit (as kubectl's), a fraction of a second counts as one.
fn parse_since(s: &str) -> Result<u64, String> {
    crate::duration::parse_go_duration(s)
        .map(|d| if d.is_zero() { 0 } else { d.as_secs().max(1) })
        .map_err(|e| format!("{e} (a duration such as 30s, 5m or 1h)"))
}

/// Runs `cmd` against the agent whose `--root-dir` is `root_dir`; prints what it answered and
/// returns the exit code (1 with one line on stderr for an error; `exec`: the command's).
pub fn run(root_dir: &Path, cmd: CliCommand) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = Client::new(root_dir);
    let result = rt.block_on(async {
        match cmd {
            CliCommand::Get(a) => get::run(&client, &a).await.map(|()| 0),
            CliCommand::Describe(a) => describe::run(&client, &a).await.map(|()| 0),
            CliCommand::Logs(a) => logs::run(&client, &a).await.map(|()| 0),
            CliCommand::Exec(a) => exec::run(&client, &a).await,
            CliCommand::Top(a) => top::run(&client, &a).await.map(|()| 0),
            CliCommand::Events(a) => events::run(&client, &a).await.map(|()| 0),
        }
    });
    // A read of stdin (`exec -i`) may still be blocked on its thread: not waited for.
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The agent's pods (`/pods`), sorted by namespace and name.
///
/// Errors: as [`Client::get_json`].
pub async fn pods(client: &Client) -> Result<Vec<Pod>, CliError> {
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<Pod>,
    }
    let l: List = client.get_json("/pods").await?;
    Ok(l.items)
}

/// Writes `text` to stdout; a closed pipe (`| head`) ends quietly.
/// Returns false when stdout is closed (the reader went away: a watch then ends).
pub fn print(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// The wall clock now ([`crate::clock::wall_now`]), for ages.
pub fn now() -> jiff::Timestamp {
    jiff::Timestamp::try_from(crate::clock::wall_now()).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}
