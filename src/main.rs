//! The `nodelet` binary: flags, configuration, logging, then [`nodelet::agent::run`].

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nodelet::config::{Config, KubeletConfiguration};

/// nodelet: a small, fast node agent modeled on the Kubernetes kubelet.
#[derive(Parser, Debug)]
#[command(name = "nodelet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// KubeletConfiguration file (kubelet.config.k8s.io/v1beta1). Required.
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        help_heading = "Configuration"
    )]
    config: Option<PathBuf>,
    /// Use this name as the node name instead of the hostname.
    #[arg(long, value_name = "NAME", global = true, help_heading = "Node")]
    hostname_override: Option<String>,
    /// The node's IP address (status.hostIP); detected when absent.
    #[arg(long, value_name = "IP", help_heading = "Node")]
    node_ip: Option<IpAddr>,
    /// Labels of the node, `key=value,...`, beside kubelet's own (`kubernetes.io/hostname`,
    /// `kubernetes.io/os`, `kubernetes.io/arch`); pods' node selectors and affinity match them.
    #[arg(long, value_name = "LABELS", global = true, value_parser = parse_labels, default_value = "", help_heading = "Node")]
    node_labels: std::collections::BTreeMap<String, String>,
    /// Join the cluster of this kubeconfig (client certificate or token; kubelet's
    /// `--kubeconfig`): register the node and keep its status and Lease. Without it nodelet runs
    /// standalone, static pods only.
    #[arg(long, value_name = "FILE", global = true, help_heading = "Cluster")]
    kubeconfig: Option<PathBuf>,
    /// Directory for the agent's own files (and its local socket, `nodelet.sock`, which the
    /// command line's `get`, `describe`, `logs`, `exec`, `top` and `events` use).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/nodelet",
        env = nodelet::cli::complete::ROOT_DIR_ENV,
        global = true,
        help_heading = "Node"
    )]
    root_dir: PathBuf,
    /// Log verbosity: 0-1 info, 2-3 debug, 4+ trace (RUST_LOG overrides).
    #[arg(
        short = 'v',
        long = "v",
        value_name = "N",
        default_value_t = 0,
        help_heading = "Logging"
    )]
    verbosity: u8,
    /// Log format.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"], help_heading = "Logging")]
    log_format: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate the configuration and print it as YAML with every default filled in.
    /// Exit 0 when valid, 2 (with the field and value named) when not. The node API's files
    /// (clientCAFile, tlsCertFile/tlsPrivateKeyFile) are loaded as at start; give --kubeconfig
    /// when the node joins a cluster (Webhook authorization needs one): it is read and parsed
    /// too (not dialled).
    CheckConfig,
    /// Print, as YAML, what nodelet would do with each manifest on this node (QoS class, pod
    /// cgroup path and values, container resources and oom_score_adj, and whether admission
    /// would take the pod, counting the manifests before it as running, with kubelet's reason
    /// and message when not) without touching the runtime or the cgroup tree. Exit 2 when a
    /// manifest cannot be decoded.
    Plan {
        /// Node memory capacity to assume (a quantity such as 16Gi); default: this node's.
        #[arg(long, value_name = "QUANTITY")]
        node_memory: Option<String>,
        /// Node cpu capacity to assume (a quantity such as 4 or 3500m); default: this node's.
        #[arg(long, value_name = "QUANTITY")]
        node_cpu: Option<String>,
        /// Pod manifests (YAML or JSON).
        #[arg(required = true, value_name = "MANIFEST")]
        manifests: Vec<PathBuf>,
    },
    /// List the agent's pods as `kubectl get pods` does (through the local socket; root only).
    Get(nodelet::cli::GetArgs),
    /// Show a pod in detail, with its events, as `kubectl describe pod` does.
    Describe(nodelet::cli::DescribeArgs),
    /// Print a container's log.
    Logs(nodelet::cli::LogsArgs),
    /// Run a command in a container; exits with its status.
    Exec(nodelet::cli::ExecArgs),
    /// Show cpu and memory of the pods or the node.
    Top(nodelet::cli::TopArgs),
    /// List the agent's events.
    Events(nodelet::cli::EventsArgs),
    /// Print the shell completion script (`source <(nodelet completion bash)`); pod names are
    /// completed from the running agent.
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: nodelet::cli::Shell,
    },
}

impl Command {
    /// The command line's subcommands: clients of the running agent, which need no --config.
    fn client(self) -> Result<nodelet::cli::CliCommand, Self> {
        use nodelet::cli::CliCommand as C;
        Ok(match self {
            Command::Get(a) => C::Get(a),
            Command::Describe(a) => C::Describe(a),
            Command::Logs(a) => C::Logs(a),
            Command::Exec(a) => C::Exec(a),
            Command::Top(a) => C::Top(a),
            Command::Events(a) => C::Events(a),
            other => return Err(other),
        })
    }
}

/// Writes `text` to stdout. A reader that stops early (`nodelet plan … | head`) closes the pipe:
/// not an error (the write would otherwise panic in `print!`); any other failure is said.
fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("nodelet: cannot write to stdout: {e}");
        }
    }
}

/// What `plan` takes from the command line.
struct PlanFlags<'a> {
    node: Option<&'a str>,
    labels: std::collections::BTreeMap<String, String>,
    root_dir: &'a std::path::Path,
    memory: Option<String>,
    cpu: Option<String>,
}

fn plan(config: &Config, flags: PlanFlags<'_>, manifests: &[PathBuf]) -> ExitCode {
    let PlanFlags {
        node,
        labels,
        root_dir,
        memory,
        cpu,
    } = flags;
    let node = match nodelet::node::node_name(node) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("nodelet: {e}");
            return ExitCode::from(2);
        }
    };
    let capacity = match nodelet::plan::capacity_from_flags(
        nodelet::cm::detect_capacity(),
        memory.as_deref(),
        cpu.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nodelet: {e}");
            return ExitCode::from(2);
        }
    };
    // The root directory's filesystem (its nearest existing ancestor before the first start).
    let storage = root_dir
        .ancestors()
        .find_map(nodelet::eviction::signals::filesystem)
        .map_or(0, |(bytes, _)| bytes.capacity);
    let plan_node = nodelet::plan::PlanNode {
        name: node,
        labels,
        capacity,
        extra: nodelet::admission::node_resources::ExtraCapacity {
            ephemeral_storage: storage,
            hugepages: nodelet::cm::hugepage_capacity(),
        },
    };
    let (yaml, errors) = nodelet::plan::plan(config, &plan_node, manifests);
    print_stdout(&yaml);
    for e in &errors {
        eprintln!("nodelet: {e}");
    }
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn init_logging(verbosity: u8, format: &str) {
    let level = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    // kube-rs logs every failed request at ERROR (`kube_client::client::builder`): with the
    // apiserver down that is several lines a second, while nodelet's own tasks report the outage
    // once each and its end. Those lines are seen at -v 4.
    let kube = if verbosity >= 4 { "debug" } else { "off" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "nodelet={level},warn,kube_client::client::builder={kube}"
        ))
    });
    // Colours only for a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
    }
}

/// Tunes glibc's malloc for a long-running agent's RSS:
/// - the mmap threshold fixed at its default (128 KiB), so that every large block (a manifest
///   of megabytes, the pod decoded from it) is mapped on its own and returned to the kernel when
///   freed. Left dynamic, glibc raises the threshold after such a block is freed, later large
///   blocks come from the heap, and the agent's RSS stays up after the input is gone;
/// - one arena for every thread instead of 8 per core: each arena a thread allocated from keeps
///   its own free pages and its own fragments, and a second one held 1.6 MiB resident for
///   0.9 MiB in use at 110 pods (glibc's `malloc_stats`). The agent's threads allocate little
///   and seldom at once, so they hardly ever wait for the arena's lock.
///
/// Returns false when glibc refused either.
fn tune_malloc() -> bool {
    // SAFETY: mallopt only sets a tunable of the C allocator; it takes no pointers and is
    // called first thing in main, before any other thread runs. The standard library and nix
    // have no wrapper for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) == 1
            && libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
}

/// Gives the free pages of every malloc arena back to the kernel (glibc's `malloc_trim(0)`,
/// which also releases whole free pages inside an arena, not only at its top). Called by
/// housekeeping after the pods in use changed (see [`nodelet::agent::Flags`]).
fn release_free_heap() {
    // SAFETY: malloc_trim takes no pointers and is safe to call from any thread at any time;
    // the standard library and nix have no wrapper for it.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    nodelet::admission::node_affinity::parse_node_labels(s)
}

fn main() -> ExitCode {
    let malloc_tuned = tune_malloc();
    // A shell asking for completions (`COMPLETE=bash nodelet -- …`): answered, then exit.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command)
        .var(nodelet::cli::complete::COMPLETE_ENV)
        .complete();
    let mut cli = Cli::parse();
    if let Some(Command::Completion { shell }) = cli.command {
        let bin = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "nodelet".into());
        let mut out = std::io::stdout().lock();
        return match nodelet::cli::complete::write_script(shell, &bin, &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            // `| head`: the reader went away.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("nodelet: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match cli.command.take().map(Command::client) {
        Some(Ok(c)) => return nodelet::cli::run(&cli.root_dir, c),
        Some(Err(other)) => cli.command = Some(other),
        None => {}
    }
    init_logging(cli.verbosity, &cli.log_format);
    nodelet::crash::install_hook();
    if !malloc_tuned {
        tracing::warn!(
            "cannot tune malloc (mmap threshold, arenas); freed memory may stay resident"
        );
    }
    let Some(config_path) = cli.config.clone() else {
        eprintln!("nodelet: --config FILE is required (a KubeletConfiguration; scripts/up.sh installs /etc/nodelet/nodelet.yaml)");
        return ExitCode::from(2);
    };
    let loaded = match KubeletConfiguration::load(&config_path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nodelet: {e}");
            return ExitCode::from(2);
        }
    };
    if !loaded.unknown_fields.is_empty() {
        tracing::warn!(fields = ?loaded.unknown_fields, file = %config_path.display(), "configuration fields not supported by nodelet are ignored");
    }
    if let Some(Command::CheckConfig) = cli.command {
        // What start-up loads besides the file: the node API's certificates and its
        // authorization without an API server (`--kubeconfig` given or not, as at start).
        if let Some(api) = &loaded.config.node_api {
            if let Err(e) = api.check(cli.kubeconfig.is_some()) {
                eprintln!("nodelet: {}: {e}", config_path.display());
                return ExitCode::from(2);
            }
        }
        if let Some(path) = &cli.kubeconfig {
            if let Err(e) = nodelet::cluster::read_kubeconfig(path) {
                eprintln!("nodelet: {e}");
                return ExitCode::from(2);
            }
        }
        match serde_yaml::to_string(&loaded.file) {
            Ok(y) => {
                print_stdout(&y);
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("nodelet: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(Command::Plan {
        node_memory,
        node_cpu,
        manifests,
    }) = cli.command
    {
        return plan(
            &loaded.config,
            PlanFlags {
                node: cli.hostname_override.as_deref(),
                labels: cli.node_labels,
                root_dir: &cli.root_dir,
                memory: node_memory,
                cpu: node_cpu,
            },
            &manifests,
        );
    }
    let flags = nodelet::agent::Flags {
        hostname_override: cli.hostname_override,
        root_dir: cli.root_dir,
        node_ip: cli.node_ip,
        node_labels: cli.node_labels,
        kubeconfig: cli.kubeconfig,
        release_free_heap,
    };
    match nodelet::agent::run(loaded.config, flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "nodelet failed to start");
            eprintln!("nodelet: {e}");
            // A bad flag is bad input, like a bad config value: exit 2.
            let bad_input = matches!(e, nodelet::agent::AgentError::NodeName(_));
            ExitCode::from(if bad_input { 2 } else { 1 })
        }
    }
}
