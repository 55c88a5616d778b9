//! Wiring of the agent (kubelet's `RunKubelet` / `NewMainKubelet`): builds every component from
//! the configuration and runs them until a stop signal.
//!
//! Threads: a tokio runtime (gRPC, HTTP, pod workers), the sync loop on its own thread, the file
//! source on its own thread. Stopping the agent leaves pods running: the next start adopts them.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Receiver;
use tracing::{error, info, warn};

use crate::cm::cgroupfs::{Cgroupfs, Hierarchies};
use crate::cm::{detect_capacity, CmError, ContainerManager, NodeConfig};
use crate::config::Config;
use crate::container::cache::{PodCache, PodCacheWriter};
use crate::cri::{Cri, ImageService, RuntimeService};
use crate::events::Recorder;
use crate::kuberuntime::sandbox::parse_resolv_conf;
use crate::kuberuntime::{KubeRuntimeManager, Settings};
use crate::metrics::Metrics;
use crate::pleg::{Pleg, PodLifecycleEvent};
use crate::podsync::PodSync;
use crate::podworkers::{Periods, PodWorkers, WorkQueue};
use crate::prober::ProbeResult;
use crate::runtime_state::RuntimeState;
use crate::source::checkpoint::CheckpointStore;
use crate::source::file::FileSource;
use crate::source::mux::Mux;
use crate::source::PodUpdate;
use crate::status::failed::FailedPods;
use crate::status::StatusManager;
use crate::syncloop::{Channels, SyncLoop};

/// Command-line settings that are not in the configuration file (kubelet's flags).
#[derive(Debug, Clone)]
pub struct Flags {
    /// `--hostname-override`.
    pub hostname_override: Option<String>,
    /// `--root-dir` (default `/var/lib/nodelet`).
    pub root_dir: PathBuf,
    /// `--node-ip`; detected when absent.
    pub node_ip: Option<IpAddr>,
    /// `--node-labels`, beside kubelet's own labels.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// `--kubeconfig`: join this cluster (see [`crate::cluster`]); standalone when absent.
    pub kubeconfig: Option<PathBuf>,
    /// Gives the allocator's free pages back to the kernel; called after a housekeeping pass
    /// that read the node for orphans (the pods in use changed, or every 10 s). The binary
    /// passes glibc's `malloc_trim`: this crate forbids unsafe code.
    pub release_free_heap: fn(),
}

/// Start-up failures; each ends the process with a message.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The node name could not be determined.
    #[error("node name: {0}")]
    NodeName(String),
    /// A directory the agent needs could not be created.
    #[error("cannot create directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The tokio runtime could not start.
    #[error("cannot start async runtime: {0}")]
    Runtime(std::io::Error),
    /// The container manager could not set up the cgroup tree (e.g. `cgroupRoot` is missing).
    #[error("container manager: {0}")]
    ContainerManager(#[from] CmError),
    /// The healthz listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The prober's HTTP client could not be built.
    #[error("prober: {0}")]
    Prober(String),
    /// `--kubeconfig` names a file that is not a usable kubeconfig.
    #[error(transparent)]
    Kubeconfig(#[from] crate::cluster::ClusterError),
    /// The runtime's cgroup driver is not `cgroupDriver` ([`crate::cm::runtime_driver`]).
    #[error("{0}")]
    CgroupDriverMismatch(String),
    /// The node API cannot start: its certificate, key or client CA file, a TLS setting, its
    /// address, or an authorization mode the node cannot serve; the message names the setting.
    #[error("{0}")]
    NodeApi(String),
}

/// What every subsystem is wired to: made once in [`run`], lent to each start function.
struct Core {
    rt: tokio::runtime::Runtime,
    node_name: String,
    node_ip: IpAddr,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    status: StatusManager,
    pressure: crate::eviction::NodePressure,
    failed: FailedPods,
    cri: Cri,
    cm: Arc<ContainerManager>,
    runtime_state: RuntimeState,
    /// Closed when the agent stops: every thread's loop ends.
    stop: Receiver<()>,
    /// Requests to fail a pod, to the sync loop (the one writer of the failed-pods record).
    fail: crossbeam_channel::Sender<crate::status::failed::FailPod>,
}

/// Runs the agent until SIGTERM or SIGINT, with the typed configuration (validated at load;
/// nothing here re-reads the file's strings).
///
/// The order is kubelet's: the node's facts and the container manager (cgroups) first, the
/// HTTP endpoints before the runtime answers (operators see the agent waiting), then the runtime,
/// the cluster, the PLEG, the runtime manager and pod workers, the pod sources, the eviction
/// manager, node shutdown and the sync loop.
///
/// Errors: [`AgentError`] for anything that prevents start-up; once running, runtime failures
/// are logged and retried, never fatal.
pub fn run(config: Config, flags: Flags) -> Result<(), AgentError> {
    let (node_name, node_ip, node_config, local_socket) = prepare_node(&config, &flags)?;
    // Declared before the runtime, so dropped after it: the socket goes once nothing serves it.
    let _socket_file =
        crate::nodeapi::local::SocketFile(crate::nodeapi::local::socket_path(&flags.root_dir));
    let mut ports = bind_ports(&config)?;
    let metrics = Metrics::new();
    let recorder = Recorder::default();
    // kubelet's `BirthCry`, the node's first event.
    recorder.normal("node", "Starting", "Starting kubelet.");
    let settings = runtime_settings(&config, &flags, &node_name, node_ip, &node_config);
    let driver_is_systemd = node_config.layout.systemd;
    let cm = start_container_manager(node_config, &metrics, &recorder)?;
    apply_own_oom_score_adj(config.oom_score_adj, &metrics);
    raise_open_files_limit();
    info!(node = %node_name, node_ip = %node_ip, runtime = %config.container_runtime_endpoint, "starting nodelet");

    // One worker thread: the pod workers' file-system steps run on the blocking pool
    // (`crate::blocking`, bounded), and a second worker cost more CPU than it saved.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(crate::blocking::MAX_THREADS)
        .thread_name("nodelet-rt")
        .enable_all()
        .build()
        .map_err(AgentError::Runtime)?;
    let cri = rt.block_on(async {
        Cri::new(
            &config.runtime_socket,
            &config.image_socket,
            config.runtime_request_timeout,
            metrics.clone(),
        )
    });
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let (fail_tx, fail_rx) =
        crossbeam_channel::bounded(crate::status::failed::FAIL_REQUESTS_CAPACITY);
    let core = Core {
        rt,
        node_name,
        node_ip,
        metrics,
        recorder,
        status: StatusManager::default(),
        pressure: crate::eviction::NodePressure::default(),
        failed: FailedPods::persistent(flags.root_dir.join("evicted-pods.json")),
        cri,
        cm,
        runtime_state: RuntimeState::default(),
        stop: stop_rx,
        fail: fail_tx,
    };

    let pleg_slot: Arc<std::sync::OnceLock<Arc<Pleg>>> = Arc::default();
    let stats_slot = crate::nodeapi::StatsSlot::default();
    serve_http(&core, &mut ports, &pleg_slot, &stats_slot)?;
    let Some(runtime_version) = core
        .rt
        .block_on(async { wait_for_runtime(&core.cri).await })
    else {
        return Ok(());
    };
    check_runtime_cgroup_driver(&core, driver_is_systemd, &config)?;
    core.rt.spawn(crate::runtime_state::run(
        core.cri.clone(),
        core.runtime_state.clone(),
        core.metrics.runtime_up.clone(),
    ));
    let cluster_client = join_cluster(&core, &config, &flags, &runtime_version)?;
    let (pleg, cache, pleg_rx) = start_pleg(&core, &config, &pleg_slot);
    let imagefs = image_fs(&core);
    let _ = stats_slot.set(node_stats(&core, &config, &flags, imagefs.clone()));
    let objects = crate::objects::LocalObjects::default();
    let api_objects = crate::objects::ApiObjects::default();
    if let Some(client) = &cluster_client {
        api_objects.tokens().set_client(client.clone());
    }
    let (manager, probe_rx, to_gc) = start_runtime_manager(
        &core,
        settings,
        &pleg,
        cache,
        (objects.clone(), api_objects.clone()),
    )?;
    let gc = start_garbage_collector(&core, &config, &flags, imagefs.clone(), to_gc);
    start_node_api(
        &core,
        &config,
        &flags,
        (&manager, local_socket, ports.node_api.take()),
        cluster_client.clone(),
        &pleg_slot,
        &stats_slot,
    )?;
    start_qos_resync(&core);
    let queue = WorkQueue::default();
    let workers = start_pod_workers(&core, &config, &manager, &queue);

    let mut threads = Vec::new();
    let (sources_ready, config_rx) = start_sources(
        &core,
        &config,
        &flags,
        Sources {
            objects,
            api_objects,
            cluster_client,
            pleg: pleg.clone(),
        },
        &mut threads,
    );
    // Pods already running are adopted as their manifests arrive, not admitted again.
    let adopted: HashSet<String> = core
        .rt
        .block_on(manager.runtime().runtime_pods())
        .map(|pods| pods.ours.iter().map(|p| p.uid.clone()).collect())
        .unwrap_or_default();
    let listed_by_pleg = pleg.clone();
    let housekeeper = crate::housekeeping::housekeeper(
        manager,
        workers.clone(),
        gc.clone(),
        Box::new(move || listed_by_pleg.runtime_pods()),
        core.metrics.clone(),
        core.rt.handle().clone(),
        flags.release_free_heap,
    );
    threads.push(start_eviction_manager(
        &core, &config, &flags, &workers, imagefs, gc,
    ));
    threads.extend(start_node_shutdown(&core, &config, &flags, &workers));
    let mut sync_loop = SyncLoop::new(
        workers,
        queue,
        sources_ready.clone(),
        housekeeper,
        core.recorder.clone(),
        config.max_pods,
    )
    .with_admission(admitter(&core, &config, &flags), core.status.clone())
    .with_adopted(adopted);
    sync_loop.on_iteration = watchdog();
    notify_ready_when(sources_ready);
    let channels = Channels {
        config: config_rx,
        pleg: pleg_rx,
        probes: probe_rx,
        failures: fail_rx,
        stop: core.stop.clone(),
    };
    threads.push(spawn_thread("sync-loop", move || sync_loop.run(channels)));

    core.rt.block_on(wait_for_signal());
    info!("stopping nodelet; pods keep running");
    drop(stop_tx);
    for t in threads {
        let _ = t.join();
    }
    let Core { rt, failed, .. } = core;
    rt.shutdown_timeout(Duration::from_secs(2));
    failed.flush();
    Ok(())
}

/// The node's name and IP, the directories the agent writes, the node's cgroup settings with
/// what this kernel offers (hugepage sizes; MemoryQoS only on cgroup v2), and the local socket,
/// claimed before anything a running agent owns is touched (its cgroups): a second agent on the
/// same `--root-dir` stops here.
fn prepare_node(
    config: &Config,
    flags: &Flags,
) -> Result<(String, IpAddr, NodeConfig, std::os::unix::net::UnixListener), AgentError> {
    let node_name =
        crate::node::node_name(flags.hostname_override.as_deref()).map_err(AgentError::NodeName)?;
    let node_ip = flags.node_ip.unwrap_or_else(crate::node::node_ip);
    for dir in [flags.root_dir.clone(), config.pod_logs_dir.clone()] {
        std::fs::create_dir_all(&dir).map_err(|source| AgentError::Dir {
            path: dir.clone(),
            source,
        })?;
    }
    let mut node_config = config.node_config(detect_capacity());
    node_config.policy.hugepage_sizes = crate::cm::hugepage_sizes();
    if node_config.policy.memory_qos_throttling_factor.is_some() && !Hierarchies::current().is_v2()
    {
        // kubelet: MemoryQoS works on cgroup v2 only.
        warn!("featureGates.MemoryQoS needs cgroup v2 alone; this node has cgroup v1 hierarchies, so it is off");
        node_config.policy.memory_qos_throttling_factor = None;
    }
    let socket = crate::nodeapi::local::socket_path(&flags.root_dir);
    let local_socket = crate::nodeapi::local::claim(&socket).map_err(AgentError::NodeApi)?;
    Ok((node_name, node_ip, node_config, local_socket))
}

/// What the runtime manager needs to know of the node to build sandboxes and containers.
fn runtime_settings(
    config: &Config,
    flags: &Flags,
    node_name: &str,
    node_ip: IpAddr,
    node_config: &NodeConfig,
) -> Settings {
    let resolv = match &config.resolv_conf {
        // An empty resolvConf means no host resolver for pods, as in kubelet.
        None => Default::default(),
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => parse_resolv_conf(&text),
            Err(e) => {
                warn!(path = %path.display(), error = %e, "cannot read resolvConf; pods get no host DNS");
                Default::default()
            }
        },
    };
    Settings {
        node_name: node_name.to_owned(),
        hostname: crate::node::hostname(node_name),
        node_ip: node_ip.to_string(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        resolv_conf: resolv,
        cluster_dns: config.cluster_dns.iter().map(ToString::to_string).collect(),
        cluster_domain: config.cluster_domain.clone(),
        root_dir: flags.root_dir.clone(),
        cgroup_policy: node_config.policy.clone(),
        memory_capacity: node_config.capacity.memory,
        allocatable: {
            let a = crate::cm::resources::node_allocatable(
                node_config.capacity,
                node_config.system_reserved,
                node_config.kube_reserved,
            );
            crate::kuberuntime::Allocatable {
                cpu_milli: a.cpu_milli,
                memory: a.memory,
                ephemeral_storage: crate::eviction::signals::filesystem(&flags.root_dir)
                    .map_or(0, |(bytes, _)| bytes.capacity),
            }
        },
        apparmor: crate::admission::apparmor::host_enabled(),
        crash_backoff: config.crash_loop_back_off,
        pull_backoff: config.image_pull_back_off,
    }
}

/// The container manager with the configured cgroup driver (the systemd driver owns the QoS and
/// pod cgroups as slices, through systemd's D-Bus API), its node-level cgroups made.
fn start_container_manager(
    node_config: NodeConfig,
    metrics: &Arc<Metrics>,
    recorder: &Recorder,
) -> Result<Arc<ContainerManager>, AgentError> {
    let cgroups: Arc<dyn crate::cm::cgroupfs::CgroupManager> = if node_config.layout.systemd {
        Arc::new(
            crate::cm::systemd::SystemdCgroups::new(Hierarchies::current())
                .map_err(CmError::from)?,
        )
    } else {
        Arc::new(Cgroupfs::new(Hierarchies::current()))
    };
    let cm = Arc::new(
        ContainerManager::new(cgroups, node_config)
            .with_metrics(metrics.clone())
            .with_recorder(recorder.clone()),
    );
    cm.start()?;
    Ok(cm)
}

/// The agent's TCP ports, bound before anything on the node is changed (the cgroup tree): a
/// second agent started with this one's configuration stops at the port it cannot have, with
/// nothing of the first's touched (the values of its `kubepods` cgroup were rewritten before).
struct Ports {
    healthz: Option<(SocketAddr, std::net::TcpListener)>,
    read_only: Option<(SocketAddr, std::net::TcpListener)>,
    node_api: Option<std::net::TcpListener>,
}

/// Binds `healthzPort`, `readOnlyPort` and the node API's `port` (each on its address), the
/// ones configured.
///
/// Errors: [`AgentError::Listen`] (healthz, read-only) or [`AgentError::NodeApi`] naming the
/// address that cannot be bound (in use: another kubelet or nodelet).
fn bind_ports(config: &Config) -> Result<Ports, AgentError> {
    let bind = |addr: SocketAddr| {
        std::net::TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l))
    };
    let plain = |addr: Option<SocketAddr>| {
        addr.map(|a| {
            bind(a)
                .map(|l| (a, l))
                .map_err(|source| AgentError::Listen { addr: a, source })
        })
        .transpose()
    };
    Ok(Ports {
        healthz: plain(config.healthz_address)?,
        read_only: plain(config.read_only_address)?,
        node_api: config
            .node_api
            .as_ref()
            .map(|api| {
                bind(api.address).map_err(|e| {
                    AgentError::NodeApi(format!(
                        "node API: cannot listen on {} (address, port): {e}",
                        api.address
                    ))
                })
            })
            .transpose()?,
    })
}

/// The healthz listener, and the read-only port when configured; both serve every endpoint,
/// from before the runtime answers, so operators can see the agent waiting. The read-only port
/// also serves the stats paths of `stats` (kubelet's read-only port serves them without
/// authentication), 503 until the runtime answers.
fn serve_http(
    core: &Core,
    ports: &mut Ports,
    pleg: &Arc<std::sync::OnceLock<Arc<Pleg>>>,
    stats: &crate::nodeapi::StatsSlot,
) -> Result<(), AgentError> {
    let listeners = [
        ports.healthz.take().map(|l| (l, false)),
        ports.read_only.take().map(|l| (l, true)),
    ];
    for ((addr, listener), read_only) in listeners.into_iter().flatten() {
        let mut app = crate::server::router(server_state(core, pleg));
        if read_only {
            app = app.merge(crate::nodeapi::stats_router(stats.clone()));
        }
        let server = {
            let _runtime = core.rt.enter();
            crate::server::serve(listener, app)
                .map_err(|source| AgentError::Listen { addr, source })?
        };
        core.rt.spawn(async move {
            if let Err(e) = server.await {
                error!(error = %e, "HTTP server stopped");
            }
        });
        if read_only {
            info!(%addr, "read-only port: serving /healthz /pods /node /metrics /metrics/probes /events /stats/summary /metrics/resource /metrics/cadvisor");
        } else {
            info!(%addr, "serving /healthz /pods /node /metrics /metrics/probes /events");
        }
    }
    Ok(())
}

/// Both sides must place containers the same way: the runtime's cgroup driver (from its verbose
/// status) against `cgroupDriver` (kubelet refuses a mismatch too).
fn check_runtime_cgroup_driver(
    core: &Core,
    driver_is_systemd: bool,
    config: &Config,
) -> Result<(), AgentError> {
    let runtime_driver = core
        .rt
        .block_on(core.cri.status_info())
        .ok()
        .and_then(|i| crate::cm::runtime_driver::runtime_uses_systemd(&i));
    crate::cm::runtime_driver::check(
        driver_is_systemd,
        runtime_driver,
        &config.container_runtime_endpoint,
    )
    .map_err(AgentError::CgroupDriverMismatch)
}

/// With `--kubeconfig`: registers the node and keeps its status and Lease
/// ([`crate::cluster::spawn`]); returns the client for the API pod source.
fn join_cluster(
    core: &Core,
    config: &Config,
    flags: &Flags,
    runtime_version: &str,
) -> Result<Option<kube::Client>, AgentError> {
    let Some(path) = &flags.kubeconfig else {
        return Ok(None);
    };
    let client = core.rt.block_on(crate::cluster::client(path))?;
    let facts = crate::cluster::node_status::NodeFacts {
        name: core.node_name.clone(),
        ip: core.node_ip.to_string(),
        hostname: crate::node::hostname(&core.node_name),
        labels: crate::admission::node_affinity::NodeIdentity::new(
            &core.node_name,
            &flags.node_labels,
        )
        .labels,
        capacity: core.cm.capacity(),
        allocatable: core.cm.allocatable(),
        max_pods: config.max_pods,
        info: crate::cluster::node_status::system_info(runtime_version),
        api_port: config.node_api.as_ref().map_or(0, |a| a.address.port()),
    };
    crate::cluster::spawn(
        core.rt.handle(),
        client.clone(),
        facts,
        crate::cluster::node_status::StatusInputs {
            pressure: core.pressure.clone(),
            runtime: core.runtime_state.clone(),
        },
        core.status.clone(),
        core.recorder.clone(),
    );
    info!(kubeconfig = %path.display(), "cluster mode: registering the node with the API server");
    Ok(Some(client))
}

/// imagefs: the filesystem CRI names for images, when the runtime says.
fn image_fs(core: &Core) -> Option<PathBuf> {
    core.rt
        .block_on(core.cri.image_fs_mountpoints())
        .ok()
        .and_then(|m| m.into_iter().next())
        .map(PathBuf::from)
}

/// The pod workers over `manager`, with the periodic sync queue `queue` (`syncFrequency`, and a
/// 10 s back-off after an error).
fn start_pod_workers(
    core: &Core,
    config: &Config,
    manager: &Arc<PodSync>,
    queue: &WorkQueue,
) -> PodWorkers<PodSync> {
    let periods = Periods {
        resync: config.sync_frequency,
        backoff: Duration::from_secs(10),
    };
    PodWorkers::new(
        manager.clone(),
        queue.clone(),
        periods,
        core.rt.handle().clone(),
        core.metrics.pod_worker_panics.clone(),
    )
}

/// What the HTTP endpoints read.
fn server_state(
    core: &Core,
    pleg: &Arc<std::sync::OnceLock<Arc<Pleg>>>,
) -> crate::server::ServerState {
    crate::server::ServerState {
        status: core.status.clone(),
        metrics: core.metrics.clone(),
        recorder: core.recorder.clone(),
        pleg: pleg.clone(),
        pressure: core.pressure.clone(),
        runtime: core.runtime_state.clone(),
    }
}

/// Where the node's usage is read (cgroups, nodefs, imagefs, pod logs): the eviction manager's
/// signals and the stats read the same places.
fn node_paths(
    core: &Core,
    config: &Config,
    flags: &Flags,
    imagefs: Option<PathBuf>,
) -> crate::eviction::provider::Paths {
    crate::eviction::provider::Paths {
        hierarchies: Hierarchies::current(),
        layout: core.cm.layout().clone(),
        memory_capacity: core.cm.memory_capacity(),
        nodefs: flags.root_dir.clone(),
        imagefs,
        pod_logs_dir: config.pod_logs_dir.clone(),
    }
}

/// Usage of the node, its pods and containers, read on demand for the node API and the
/// read-only port, from the same files the eviction manager reads (`imagefs`: the runtime's
/// image filesystem, `None` when it is nodefs).
fn node_stats(
    core: &Core,
    config: &Config,
    flags: &Flags,
    imagefs: Option<PathBuf>,
) -> Arc<crate::nodeapi::stats::Stats> {
    Arc::new(crate::nodeapi::stats::Stats::new(
        core.cri.clone(),
        core.status.clone(),
        Arc::new(node_paths(core, config, flags, imagefs)),
        core.node_name.clone(),
    ))
}

/// The node API on `address:port` (kubelet's server on 10250): its TLS pair (configured, or
/// self-signed under `--root-dir`), authentication and authorization, logs, exec, attach and
/// port-forward. Nothing when `port` is 0. Before it, and whatever `port` is, the same paths on
/// the local socket `<root-dir>/nodelet.sock` for root ([`crate::nodeapi::local`]: the command
/// line's).
///
/// Errors: [`AgentError::NodeApi`], naming the setting: another agent on the local socket, a
/// certificate, key or CA file that
/// cannot be used, an address in use, `authorization.mode: Webhook` on a standalone node where a
/// client could authenticate (nothing could authorize it).
fn start_node_api(
    core: &Core,
    config: &Config,
    flags: &Flags,
    (manager, local_socket, listener): (
        &PodSync,
        std::os::unix::net::UnixListener,
        Option<std::net::TcpListener>,
    ),
    client: Option<kube::Client>,
    pleg: &Arc<std::sync::OnceLock<Arc<Pleg>>>,
    stats: &crate::nodeapi::StatsSlot,
) -> Result<(), AgentError> {
    use crate::config::typed::AuthorizationMode;
    use crate::nodeapi::auth;
    let node_api = crate::nodeapi::NodeApi {
        status: core.status.clone(),
        cri: core.cri.clone(),
        settings: Arc::new(manager.runtime().settings().clone()),
        configz: Arc::new(config.configz.clone()),
        // kubelet's default when the node API is off (`port: 0`) too: the local socket serves
        // logs and exec to root, who could read and enter the containers anyway.
        debugging: config.node_api.as_ref().is_none_or(|a| a.debugging),
        layout: core.cm.layout().clone(),
    };
    let local =
        crate::nodeapi::local::router(node_api.clone(), server_state(core, pleg), stats.clone());
    crate::nodeapi::local::start(&core.rt, local_socket, local).map_err(AgentError::NodeApi)?;
    let (Some(api), Some(listener)) = (&config.node_api, listener) else {
        return Ok(());
    };
    api.check(client.is_some()).map_err(AgentError::NodeApi)?;
    let (crt, key) = match &api.tls.cert_and_key {
        Some(pair) => pair.clone(),
        None => crate::nodeapi::tls::ensure_self_signed(
            &flags.root_dir,
            &core.node_name,
            &[core.node_ip],
        )
        .map_err(AgentError::NodeApi)?,
    };
    let tls =
        crate::nodeapi::tls::server_config(&crt, &key, &api.tls).map_err(AgentError::NodeApi)?;
    let x509 = api
        .client_ca_file
        .as_deref()
        .map(auth::X509::from_file)
        .transpose()
        .map_err(AgentError::NodeApi)?;
    let authorizer = match (api.authorization, &client) {
        (AuthorizationMode::AlwaysAllow, _) => None,
        (
            AuthorizationMode::Webhook {
                allowed_ttl,
                denied_ttl,
            },
            Some(c),
        ) => Some(auth::SarWebhook::new(
            c.clone(),
            core.node_name.clone(),
            allowed_ttl,
            denied_ttl,
        )),
        // Nothing can authenticate (every request is 401): nothing to authorize. With an
        // authenticator, `NodeApiConfig::check` refused this above.
        (AuthorizationMode::Webhook { .. }, None) => None,
    };
    let tokens = match (api.token_webhook_ttl, &client) {
        (Some(ttl), Some(c)) => Some(auth::TokenWebhook::new(c.clone(), ttl)),
        _ => None,
    };
    let auth = Arc::new(auth::Auth {
        x509,
        tokens,
        anonymous: api.anonymous,
        authorizer,
    });
    let app = crate::nodeapi::router(node_api, server_state(core, pleg), stats.clone(), auth);
    crate::nodeapi::start(&core.rt, listener, tls, app).map_err(AgentError::NodeApi)?;
    Ok(())
}

/// The PLEG: relist (and containerd's event stream) → the pod cache and the sync loop's PLEG
/// channel; container log rotation (`containerLogMaxSize`, `containerLogMaxFiles`) over what it
/// lists.
fn start_pleg(
    core: &Core,
    config: &Config,
    slot: &std::sync::OnceLock<Arc<Pleg>>,
) -> (Arc<Pleg>, PodCache, Receiver<PodLifecycleEvent>) {
    let (pleg_tx, pleg_rx) = crossbeam_channel::bounded(crate::pleg::CHANNEL_CAPACITY);
    let pleg = Pleg::new(
        core.cri.clone(),
        core.node_name.clone(),
        PodCacheWriter::default(),
        pleg_tx,
        core.metrics.clone(),
    );
    let cache = pleg.cache();
    let _ = slot.set(pleg.clone());
    core.rt.spawn(crate::pleg::events::run(
        config.runtime_socket.clone(),
        pleg.clone(),
    ));
    core.rt.spawn(pleg.clone().run());
    let listed_by_pleg = pleg.clone();
    let log_paths = cache.clone();
    core.rt.spawn(crate::kuberuntime::logs::run(
        core.cri.clone(),
        Box::new(move || listed_by_pleg.runtime_pods()),
        Box::new(move |id| log_paths.log_path(id)),
        config.container_log,
        config.container_log_monitor_interval,
    ));
    (pleg, cache, pleg_rx)
}

/// What the pod workers hand the garbage collector: the images of admitted pods, and the pods
/// with dead containers to remove.
type ToGc = (
    crate::gc::images::PodImages,
    tokio::sync::mpsc::Receiver<String>,
);

/// The runtime manager (pod spec → CRI calls) with its probe manager, under the pod-sync layer
/// the pod workers call; returns the layer, the probe results channel the sync loop reads, and
/// what the workers hand the garbage collector.
fn start_runtime_manager(
    core: &Core,
    settings: Settings,
    pleg: &Pleg,
    cache: PodCache,
    (objects, api_objects): (crate::objects::LocalObjects, crate::objects::ApiObjects),
) -> Result<(Arc<PodSync>, Receiver<ProbeResult>, ToGc), AgentError> {
    let pod_images = crate::gc::images::PodImages::default();
    let (dead_containers, dead_rx) = crate::gc::DeadContainers::channel(core.metrics.clone());
    // The probe channel: its producer is the probe manager's workers.
    let (probe_tx, probe_rx) = crossbeam_channel::bounded(crate::prober::manager::UPDATES_CAPACITY);
    let probes = crate::prober::ProbeManager::new(crate::prober::manager::ProbeDeps {
        ctx: crate::prober::handlers::HandlerContext::new(crate::prober::handlers::exec_fn(
            core.cri.clone(),
        ))
        .map_err(AgentError::Prober)?,
        cache: cache.clone(),
        updates: probe_tx,
        recorder: core.recorder.clone(),
        metrics: core.metrics.clone(),
        clock: crate::clock::system(),
    });
    let runtime = Arc::new(KubeRuntimeManager::new(
        core.cri.clone(),
        settings,
        crate::kuberuntime::Shared {
            recorder: core.recorder.clone(),
            metrics: core.metrics.clone(),
            cache: cache.clone(),
            clock: crate::clock::system(),
            probes: probes.clone(),
            objects: objects.clone(),
            api_objects: api_objects.clone(),
        },
    ));
    let layer = PodSync::new(
        runtime,
        crate::podsync::Deps {
            cm: core.cm.clone(),
            status: core.status.clone(),
            recorder: core.recorder.clone(),
            metrics: core.metrics.clone(),
            cache,
            cache_feed: pleg.cache_feed(),
            failed: core.failed.clone(),
            clock: crate::clock::system(),
            probes,
            objects,
            api_objects,
            pod_images: pod_images.clone(),
            dead_containers,
        },
    );
    Ok((Arc::new(layer), probe_rx, (pod_images, dead_rx)))
}

/// The garbage collector ([`crate::gc`]) on its own task: containers every
/// `containerGCPeriod` and in between for each pod the workers report on `dead`, images every
/// `imageGCPeriod` over the image filesystem `imagefs` (else the root directory's), never the
/// runtime's sandbox image nor an image `pod_images` holds. Returns it (housekeeping tells it
/// which pods exist; the eviction manager reclaims through it).
fn start_garbage_collector(
    core: &Core,
    config: &Config,
    flags: &Flags,
    imagefs: Option<PathBuf>,
    (pod_images, dead): ToGc,
) -> Arc<crate::gc::GarbageCollector<Cri>> {
    let sandbox_image = core
        .rt
        .block_on(core.cri.status_info())
        .ok()
        .and_then(|i| crate::gc::images::runtime_sandbox_image(&i));
    let settings = crate::gc::GcSettings {
        node_name: core.node_name.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        imagefs: imagefs.unwrap_or_else(|| flags.root_dir.clone()),
        sandbox_image,
        containers: crate::gc::containers::ContainerGcPolicy::KUBELET,
        container_period: config.container_gc_period,
        images: config.image_gc,
    };
    info!(
        sandbox_image = settings.sandbox_image.as_deref().unwrap_or("(unknown)"),
        imagefs = %settings.imagefs.display(),
        "starting garbage collection"
    );
    let gc = Arc::new(crate::gc::GarbageCollector::new(
        core.cri.clone(),
        settings,
        pod_images,
        core.metrics.clone(),
        core.recorder.clone(),
        crate::clock::system(),
    ));
    core.rt.spawn(gc.clone().run(dead));
    gc
}

/// The QoS cgroups follow the pods as they come and go, and once a minute besides (kubelet's
/// periodic QoS update).
fn start_qos_resync(core: &Core) {
    let cm = core.cm.clone();
    core.rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let cm = cm.clone();
            if let Err(e) = crate::blocking::run(move || cm.resync_qos()).await {
                warn!(error = %e, "cannot update QoS cgroups");
            }
        }
    });
}

/// What the pod sources read beside the configuration.
struct Sources {
    objects: crate::objects::LocalObjects,
    api_objects: crate::objects::ApiObjects,
    cluster_client: Option<kube::Client>,
    pleg: Arc<Pleg>,
}

/// The pod sources (kubelet's `PodConfig` and its mux): the static manifest directory on a
/// thread of its own (pushed to `threads`), the static pod URL and the API server as tasks, each
/// sending to the merger thread `pod-config`. Returns their readiness and the merged updates for
/// the sync loop.
fn start_sources(
    core: &Core,
    config: &Config,
    flags: &Flags,
    inputs: Sources,
    threads: &mut Vec<std::thread::JoinHandle<()>>,
) -> (crate::source::SourcesReady, Receiver<PodUpdate>) {
    let (config_tx, config_rx) = crossbeam_channel::bounded(50);
    let mut mux = Mux::new(config_tx);
    if let Some(static_pod_path) = &config.static_pod_path {
        let sender = mux.register(crate::source::file::SOURCE);
        let src = FileSource::new(
            static_pod_path.clone(),
            core.node_name.clone(),
            core.recorder.clone(),
            core.metrics.clone(),
            Some(CheckpointStore::new(flags.root_dir.join("static-pods"))),
        )
        .with_objects(inputs.objects);
        let (period, stop) = (config.file_check_frequency, core.stop.clone());
        threads.push(spawn_thread("file-source", move || {
            crate::source::file::run(src, period, sender, stop, crate::clock::system())
        }));
    }
    if let Some(url) = &config.static_pod_url {
        core.rt.spawn(crate::source::url::run(
            url.clone(),
            config.static_pod_url_header.clone(),
            config.http_check_frequency,
            core.node_name.clone(),
            mux.register(crate::source::url::SOURCE),
            core.recorder.clone(),
            core.metrics.clone(),
        ));
    }
    if let Some(client) = inputs.cluster_client {
        let sender = mux.register(crate::source::api::SOURCE);
        let references = mux.references(crate::source::api::SOURCE);
        let (held, listed) = (core.status.clone(), inputs.pleg);
        crate::cluster::services::start(
            core.rt.handle(),
            client.clone(),
            inputs.api_objects.services().clone(),
        );
        core.rt.spawn(crate::cluster::objects::run(
            client.clone(),
            sender.clone(),
            references,
            inputs.api_objects,
        ));
        core.rt.spawn(crate::source::api::run(
            client,
            core.node_name.clone(),
            sender,
            Box::new(move |uid| {
                held.get(uid).is_some()
                    || listed
                        .runtime_pods()
                        .is_none_or(|p| p.ours.iter().any(|pod| pod.uid == uid))
            }),
            core.recorder.clone(),
        ));
    }
    let ready = mux.readiness();
    // The merger ends once every source has stopped (the tasks go with the runtime), so it is
    // not joined with the threads that stop on the stop channel.
    mux.spawn();
    (ready, config_rx)
}

/// Graceful node shutdown (`shutdownGracePeriod`, by priority), on a thread of its own, when
/// configured.
fn start_node_shutdown(
    core: &Core,
    config: &Config,
    flags: &Flags,
    workers: &PodWorkers<PodSync>,
) -> Option<std::thread::JoinHandle<()>> {
    if config.shutdown_groups.is_empty() {
        return None;
    }
    let settings = crate::nodeshutdown::Settings {
        groups: config.shutdown_groups.clone(),
        root_dir: flags.root_dir.clone(),
    };
    let node = crate::nodeshutdown::AgentShutdownNode {
        status: core.status.clone(),
        fail: core.fail.clone(),
        workers: workers.clone(),
        recorder: core.recorder.clone(),
    };
    let state = core.runtime_state.shutdown();
    let stop = core.stop.clone();
    info!(groups = ?config.shutdown_groups, "graceful node shutdown: on");
    Some(spawn_thread("node-shutdown", move || {
        crate::nodeshutdown::run(settings, Box::new(node), state, stop)
    }))
}

/// Pod admission (kubelet's admit handlers): node shutdown, pressure, node affinity, resources
/// against allocatable, sysctls.
fn admitter(core: &Core, config: &Config, flags: &Flags) -> crate::admission::PodAdmitter {
    let extra = crate::admission::node_resources::ExtraCapacity {
        ephemeral_storage: crate::eviction::signals::filesystem(&flags.root_dir)
            .map_or(0, |(bytes, _)| bytes.capacity),
        hugepages: crate::cm::hugepage_capacity(),
    };
    let allocatable = crate::admission::node_resources::Allocatable::new(
        core.cm.capacity(),
        &extra,
        core.cm.reserved(),
        &config.eviction.thresholds,
        config.max_pods,
    );
    info!(allocatable = ?allocatable, "node allocatable for admission");
    crate::admission::PodAdmitter {
        shutdown: core.runtime_state.shutdown(),
        pressure: core.pressure.clone(),
        failed: core.failed.clone(),
        recorder: core.recorder.clone(),
        metrics: core.metrics.clone(),
        static_pods_are_critical: config.eviction.static_pods_are_critical,
        node: crate::admission::node_affinity::NodeIdentity::new(
            &core.node_name,
            &flags.node_labels,
        ),
        allocatable,
        allowed_unsafe_sysctls: config.allowed_unsafe_sysctls.clone(),
        requests: Default::default(),
    }
}

/// Starts the eviction manager on a thread of its own, with the kernel memory threshold notifier
/// (its own thread, waiting in epoll) when `kernelMemcgNotification` is on.
fn start_eviction_manager(
    core: &Core,
    config: &Config,
    flags: &Flags,
    workers: &PodWorkers<PodSync>,
    imagefs: Option<PathBuf>,
    gc: Arc<crate::gc::GarbageCollector<Cri>>,
) -> std::thread::JoinHandle<()> {
    let separate_imagefs = imagefs.is_some();
    let mut node = crate::eviction::provider::AgentNode {
        paths: node_paths(core, config, flags, imagefs),
        status: core.status.clone(),
        failed: core.failed.clone(),
        fail: core.fail.clone(),
        workers: workers.clone(),
        recorder: core.recorder.clone(),
        notifier: None,
        runtime_stats: Some(crate::eviction::provider::RuntimeStats {
            cri: core.cri.clone(),
            handle: core.rt.handle().clone(),
        }),
        cm: Some(core.cm.clone()),
        reclaim: Some(crate::eviction::provider::Reclaim {
            gc,
            handle: core.rt.handle().clone(),
            separate_imagefs,
        }),
    };
    use crate::eviction::manager::Manager;
    let (wake_tx, wake_rx) = crossbeam_channel::bounded(crate::eviction::notifier::WAKE_CAPACITY);
    if config.kernel_memcg_notification {
        match crate::eviction::notifier::MemcgNotifier::new() {
            Ok(n) => {
                let metrics = core.metrics.clone();
                n.clone().spawn(
                    wake_tx,
                    Box::new(move || metrics.channel_full("eviction_wake")),
                );
                node.notifier = Some(n);
            }
            Err(e) => {
                warn!(error = %e, "no kernel memory notifications; the periodic check remains")
            }
        }
    }
    let settings = config.eviction.clone();
    info!(
        thresholds = ?settings.thresholds.iter().map(|t| t.signal.as_str()).collect::<Vec<_>>(),
        notifications = node.notifier.is_some(),
        period = ?settings.monitoring_period,
        "starting eviction manager"
    );
    let mut manager = Manager::new(settings, node, core.pressure.clone(), core.metrics.clone());
    manager.prime();
    let stop = core.stop.clone();
    spawn_thread("eviction-manager", move || manager.run(wake_rx, stop))
}

/// Sets the agent's own oom_score_adj (`oomScoreAdj`, kubelet's `ApplyOOMScoreAdj` on itself).
/// Where the kernel refuses (no CAP_SYS_RESOURCE for negative values), logs once and carries on;
/// `nodelet_process_oom_score_adj` shows the value in force.
fn apply_own_oom_score_adj(wanted: i32, metrics: &Metrics) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", wanted.to_string()) {
        warn!(wanted, error = %e, "cannot set the agent's oom_score_adj; continuing with the current value");
    }
    let actual = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or(0);
    metrics.own_oom_score_adj.set(actual);
    metrics.own_oom_score_adj_wanted.set(i64::from(wanted));
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("spawning a thread at start-up")
}

/// systemd: READY=1 once the runtime answers (the caller has waited for it) and every pod
/// source has delivered its first set of pods, so the first sync has been dispatched.
fn notify_ready_when(sources: crate::source::SourcesReady) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    spawn_thread("sd-notify", move || {
        while !sources.all_ready() {
            crate::clock::sleep_blocking(Duration::from_millis(20));
        }
        match sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status("running"),
        ]) {
            Ok(()) => info!("notified systemd: READY=1"),
            Err(e) => warn!(error = %e, "cannot notify systemd"),
        }
    });
}

/// systemd watchdog: WATCHDOG=1 from the sync loop (at most every half `WatchdogSec`), so a
/// wedged loop stops the pings and systemd restarts the agent; pods keep running.
fn watchdog() -> Option<Box<dyn Fn() + Send>> {
    let every = sd_notify::watchdog_enabled()? / 2;
    let last = Mutex::new(crate::clock::monotonic_now() - every);
    Some(Box::new(move || {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if last.elapsed() >= every {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            *last = crate::clock::monotonic_now();
        }
    }))
}

/// Waits until the runtime answers `Version`, logging while it does not. Returns the runtime's
/// version as nodeInfo spells it (`containerd://1.6.20`), or `None` when a stop signal came
/// first.
async fn wait_for_runtime(cri: &Cri) -> Option<String> {
    let mut logged = false;
    loop {
        match cri.version().await {
            Ok(v) => {
                info!(runtime = %v.runtime_name, version = %v.runtime_version, api = %v.runtime_api_version, "container runtime is ready");
                return Some(format!("{}://{}", v.runtime_name, v.runtime_version));
            }
            Err(e) => {
                if !logged {
                    warn!(error = %e, "waiting for the container runtime");
                    logged = true;
                }
            }
        }
        tokio::select! {
            _ = crate::clock::sleep(Duration::from_millis(500)) => {}
            _ = wait_for_signal() => return None,
        }
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime does for kubelet at
/// start (Go 1.19 and later): a walk of a deep volume tree ([`crate::eviction`]'s `du`) holds
/// a descriptor per level still being walked. Nothing is raised past the hard limit.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                warn!(soft, hard, error = %e, "cannot raise the open files limit");
            }
        }
    }
}
