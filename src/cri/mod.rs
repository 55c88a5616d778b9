//! CRI client: tonic clients for the runtime and image services over a unix socket
//! (kubelet's `remote_runtime.go` / `remote_image.go`).
//!
//! Every call is counted in `kubelet_runtime_operations_total{operation_type}` (and the errors
//! counter) with kubelet's operation names, and bounded by `runtimeRequestTimeout` except where
//! kubelet extends it (StopContainer: timeout + grace period; PullImage: no deadline).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::clock::Stopwatch;
use crate::metrics::Metrics;

pub mod brief;

pub use brief::BriefKeys;
pub use k8s_cri::v1 as api;
/// One timed CRI call: `cri_call!(self, runtime.method, "operation", message, deadline)` sends
/// `message` through `self.runtime` (or `self.image`) with the deadline (see `Cri::request`),
/// and counts and times the answer as kubelet's `operation` (`Cri::record`). Every unary call of
/// [`Cri`] but the brief lists goes through it.
macro_rules! cri_call {
    ($cri:ident, $client:ident . $method:ident, $op:literal, $msg:expr, $deadline:expr $(,)?) => {{
        let watch = Stopwatch::start();
        let r = $cri
            .$client
            .clone()
            .$method($cri.request($msg, $deadline))
            .await;
        $cri.record(watch, $op, r)
    }};
}

/// A failed CRI call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("CRI {operation} failed: {code:?}: {message}")]
pub struct CriError {
    /// kubelet's operation name, e.g. `run_podsandbox`.
    pub operation: &'static str,
    /// gRPC status code.
    pub code: tonic::Code,
    /// The runtime's message.
    pub message: String,
}

/// Result of a CRI call.
pub type CriResult<T> = Result<T, CriError>;

/// Clients of one CRI runtime (and image) endpoint. Cheap to clone.
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    /// The runtime socket's channel, for the brief list calls (their own codec).
    runtime_channel: Channel,
    image: ImageServiceClient<Channel>,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

/// The longest deadline of a CRI call: a year (StopContainer's is the grace period plus
/// `runtimeRequestTimeout`, and a manifest may give any grace period).
pub const MAX_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

fn unix_channel(socket: PathBuf) -> Channel {
    // The URI is required by tonic but unused: the connector always dials the socket.
    Endpoint::from_static("http://[::1]:50051").connect_with_connector_lazy(tower::service_fn(
        move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        },
    ))
}

/// CRI's runtime service, as nodelet uses it (kubelet's `internalapi.RuntimeService`): sandboxes, containers, exec.
/// Implemented by [`Cri`] over the socket, and by a recording fake in unit tests.
pub trait RuntimeService: Send + Sync + 'static {
    /// `Version`: runtime name and version.
    fn version(&self) -> impl Future<Output = CriResult<cri::VersionResponse>> + Send;

    /// `RunPodSandbox` under the runtime handler `runtime_handler` (empty: the runtime's
    /// default): returns the sandbox ID.
    fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> impl Future<Output = CriResult<String>> + Send;

    /// `StopPodSandbox`.
    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;

    /// `RemovePodSandbox` (removes its containers too).
    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;

    /// `PodSandboxStatus` (without verbose info).
    fn pod_sandbox_status(
        &self,
        id: &str,
    ) -> impl Future<Output = CriResult<Option<cri::PodSandboxStatus>>> + Send;

    /// `ListPodSandbox`, optionally filtered by labels.
    fn list_pod_sandbox(
        &self,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = CriResult<Vec<cri::PodSandbox>>> + Send;

    /// `CreateContainer` in `sandbox_id`: returns the container ID.
    fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> impl Future<Output = CriResult<String>> + Send;

    /// `StartContainer`.
    fn start_container(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;

    /// `StopContainer` with a grace period in seconds (SIGTERM, then SIGKILL after `grace`).
    /// The call's deadline is `runtimeRequestTimeout + grace`, as kubelet's.
    fn stop_container(
        &self,
        id: &str,
        grace_seconds: i64,
    ) -> impl Future<Output = CriResult<()>> + Send;

    /// `RemoveContainer`.
    fn remove_container(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;

    /// `ListContainers`, optionally filtered by labels.
    fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = CriResult<Vec<cri::Container>>> + Send;

    /// `ListPodSandbox` with, of the labels and annotations, only `keep`'s (see [`brief`]):
    /// what nodelet's own readers (the PLEG's relist, housekeeping, GetPodStatus, eviction) ask for.
    /// [`Cri`] skips the other entries while decoding; this default lists in full and trims.
    fn list_pod_sandbox_brief(
        &self,
        labels: HashMap<String, String>,
        keep: &'static BriefKeys,
    ) -> impl Future<Output = CriResult<Vec<cri::PodSandbox>>> + Send {
        async move {
            let mut items = self.list_pod_sandbox(labels).await?;
            items.iter_mut().for_each(|s| keep.trim_sandbox(s));
            Ok(items)
        }
    }

    /// `ListContainers` with, of the labels and annotations, only `keep`'s (see
    /// [`RuntimeService::list_pod_sandbox_brief`]).
    fn list_containers_brief(
        &self,
        labels: HashMap<String, String>,
        keep: &'static BriefKeys,
    ) -> impl Future<Output = CriResult<Vec<cri::Container>>> + Send {
        async move {
            let mut items = self.list_containers(labels).await?;
            items.iter_mut().for_each(|c| keep.trim_container(c));
            Ok(items)
        }
    }

    /// `ContainerStatus` (without verbose info).
    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = CriResult<Option<cri::ContainerStatus>>> + Send;

    /// `ExecSync`: runs `cmd` in the container and waits for it, at most `timeout` (zero: no
    /// limit); the call's own deadline is `timeout` plus `runtimeRequestTimeout`, as kubelet's.
    /// Returns the exit code, stdout and stderr.
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = CriResult<cri::ExecSyncResponse>> + Send;

    /// `ReopenContainerLog`: the runtime reopens the container's log file (after a rotation).
    fn reopen_container_log(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;

    /// `ListContainerStats`, optionally filtered by labels: each container's cpu, memory and
    /// writable layer (`writable_layer.used_bytes`, bytes) as the runtime measures them.
    fn list_container_stats(
        &self,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = CriResult<Vec<cri::ContainerStats>>> + Send;
}

/// CRI's image service, as nodelet uses it (kubelet's `internalapi.ImageManagerService`).
/// Implemented by [`Cri`] over the socket, and by a recording fake in unit tests.
pub trait ImageService: Send + Sync + 'static {
    /// `ImageStatus`: the image if present.
    fn image_status(
        &self,
        image: &str,
    ) -> impl Future<Output = CriResult<Option<cri::Image>>> + Send;

    /// `PullImage` with the registry credentials `auth` (none: anonymous): returns the image
    /// reference. No deadline (kubelet pulls without one).
    fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> impl Future<Output = CriResult<String>> + Send;

    /// `ImageFsInfo`: the mount points of the filesystems holding images (the imagefs of the
    /// eviction signals).
    fn image_fs_mountpoints(&self) -> impl Future<Output = CriResult<Vec<String>>> + Send;

    /// `ListImages` without a filter: every image the runtime holds (ID, tags, digests, size in
    /// bytes, `pinned`), for image garbage collection ([`crate::gc::images`]).
    fn list_images(&self) -> impl Future<Output = CriResult<Vec<cri::Image>>> + Send;

    /// `RemoveImage` by ID (all its tags go with it). Errors: the runtime's, e.g. an image a
    /// container still uses.
    fn remove_image(&self, id: &str) -> impl Future<Output = CriResult<()>> + Send;
}

/// A whole CRI runtime: both services (what the runtime manager drives).
pub trait CriRuntime: RuntimeService + ImageService {}

impl<T: RuntimeService + ImageService> CriRuntime for T {}

impl Cri {
    /// Clients for the runtime socket and the image socket (may be the same path). Connection is
    /// lazy: a missing socket shows up as `Unavailable` on the first call. `timeout` is
    /// `runtimeRequestTimeout`.
    pub fn new(
        runtime_socket: &Path,
        image_socket: &Path,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let rt = unix_channel(runtime_socket.to_owned());
        let im = if image_socket == runtime_socket {
            rt.clone()
        } else {
            unix_channel(image_socket.to_owned())
        };
        Self {
            runtime: RuntimeServiceClient::new(rt.clone()).max_decoding_message_size(16 << 20),
            runtime_channel: rt,
            image: ImageServiceClient::new(im).max_decoding_message_size(16 << 20),
            metrics,
            timeout,
        }
    }

    /// The deadline of an ordinary call: the configured `runtimeRequestTimeout`.
    fn bounded(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    /// A request with a deadline of `timeout`, at most [`MAX_DEADLINE`]: a grace period of
    /// `i64::MAX` seconds is valid in a manifest, and gRPC's timeout header cannot carry it
    /// (tonic refuses such a duration with a panic).
    fn request<T>(&self, msg: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = timeout {
            r.set_timeout(t.min(MAX_DEADLINE));
        }
        r
    }

    /// One brief list call (the method `Resp` answers) for the entries with `labels`, decoded by
    /// [`brief::BriefCodec`] (the generated client has no way to take another codec), counted as
    /// kubelet's operation.
    async fn brief_list<Resp: brief::BriefList>(
        &self,
        labels: HashMap<String, String>,
        keep: &'static BriefKeys,
    ) -> CriResult<Vec<Resp::Item>> {
        let watch = Stopwatch::start();
        let r = self.brief_call(Resp::request(labels), keep).await;
        self.record(watch, Resp::OPERATION, r).map(Resp::into_items)
    }

    async fn brief_call<Req, Resp>(
        &self,
        req: Req,
        keep: &'static BriefKeys,
    ) -> Result<tonic::Response<Resp>, tonic::Status>
    where
        Req: prost::Message + Send + 'static,
        Resp: brief::BriefList,
    {
        let mut grpc = tonic::client::Grpc::new(self.runtime_channel.clone())
            .max_decoding_message_size(16 << 20);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
        let mut request = self.request(req, self.bounded());
        request.extensions_mut().insert(tonic::GrpcMethod::new(
            "runtime.v1.RuntimeService",
            Resp::METHOD,
        ));
        grpc.unary(
            request,
            tonic::codegen::http::uri::PathAndQuery::from_static(Resp::PATH),
            brief::BriefCodec::new(keep),
        )
        .await
    }

    fn record<T>(
        &self,
        watch: Stopwatch,
        operation: &'static str,
        r: Result<tonic::Response<T>, tonic::Status>,
    ) -> CriResult<T> {
        self.metrics
            .runtime_operation(operation, r.is_ok(), watch.seconds());
        r.map(tonic::Response::into_inner).map_err(|s| CriError {
            operation,
            code: s.code(),
            message: s.message().to_owned(),
        })
    }
}

impl Cri {
    /// `Status` with `verbose`: the runtime's own information, by key (containerd: `config`,
    /// the CRI plugin's configuration as JSON, among others). Used once at start, to compare
    /// the runtime's cgroup driver with the agent's.
    pub async fn status_info(&self) -> CriResult<std::collections::HashMap<String, String>> {
        cri_call!(
            self,
            runtime.status,
            "status",
            cri::StatusRequest { verbose: true },
            self.bounded()
        )
        .map(|r| r.info)
    }
}

impl RuntimeService for Cri {
    async fn version(&self) -> CriResult<cri::VersionResponse> {
        cri_call!(
            self,
            runtime.version,
            "version",
            cri::VersionRequest {
                version: "v1".into(),
            },
            self.bounded(),
        )
    }

    async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> CriResult<String> {
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.into(),
        };
        cri_call!(
            self,
            runtime.run_pod_sandbox,
            "run_podsandbox",
            req,
            self.bounded()
        )
        .map(|r| r.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        cri_call!(
            self,
            runtime.stop_pod_sandbox,
            "stop_podsandbox",
            req,
            self.bounded()
        )
        .map(drop)
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        cri_call!(
            self,
            runtime.remove_pod_sandbox,
            "remove_podsandbox",
            req,
            self.bounded()
        )
        .map(drop)
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<Option<cri::PodSandboxStatus>> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        cri_call!(
            self,
            runtime.pod_sandbox_status,
            "podsandbox_status",
            req,
            self.bounded()
        )
        .map(|r| r.status)
    }

    async fn list_pod_sandbox(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<cri::PodSandbox>> {
        let filter = cri::PodSandboxFilter {
            label_selector: labels,
            ..Default::default()
        };
        cri_call!(
            self,
            runtime.list_pod_sandbox,
            "list_podsandbox",
            cri::ListPodSandboxRequest {
                filter: Some(filter),
            },
            self.bounded(),
        )
        .map(|r| r.items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> CriResult<String> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        cri_call!(
            self,
            runtime.create_container,
            "create_container",
            req,
            self.bounded()
        )
        .map(|r| r.container_id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        cri_call!(
            self,
            runtime.start_container,
            "start_container",
            req,
            self.bounded()
        )
        .map(drop)
    }

    async fn stop_container(&self, id: &str, grace_seconds: i64) -> CriResult<()> {
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout: grace_seconds,
        };
        let deadline = self
            .timeout
            .saturating_add(Duration::from_secs(grace_seconds.max(0) as u64));
        cri_call!(
            self,
            runtime.stop_container,
            "stop_container",
            req,
            Some(deadline)
        )
        .map(drop)
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        cri_call!(
            self,
            runtime.remove_container,
            "remove_container",
            req,
            self.bounded()
        )
        .map(drop)
    }

    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<cri::Container>> {
        let filter = cri::ContainerFilter {
            label_selector: labels,
            ..Default::default()
        };
        cri_call!(
            self,
            runtime.list_containers,
            "list_containers",
            cri::ListContainersRequest {
                filter: Some(filter),
            },
            self.bounded(),
        )
        .map(|r| r.containers)
    }

    async fn list_pod_sandbox_brief(
        &self,
        labels: HashMap<String, String>,
        keep: &'static BriefKeys,
    ) -> CriResult<Vec<cri::PodSandbox>> {
        self.brief_list::<brief::Sandboxes>(labels, keep).await
    }

    async fn list_containers_brief(
        &self,
        labels: HashMap<String, String>,
        keep: &'static BriefKeys,
    ) -> CriResult<Vec<cri::Container>> {
        self.brief_list::<brief::Containers>(labels, keep).await
    }

    async fn list_container_stats(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<cri::ContainerStats>> {
        let filter = cri::ContainerStatsFilter {
            label_selector: labels,
            ..Default::default()
        };
        cri_call!(
            self,
            runtime.list_container_stats,
            "list_container_stats",
            cri::ListContainerStatsRequest {
                filter: Some(filter),
            },
            self.bounded(),
        )
        .map(|r| r.stats)
    }

    async fn container_status(&self, id: &str) -> CriResult<Option<cri::ContainerStatus>> {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        cri_call!(
            self,
            runtime.container_status,
            "container_status",
            req,
            self.bounded()
        )
        .map(|r| r.status)
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> CriResult<cri::ExecSyncResponse> {
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: timeout.as_secs() as i64,
        };
        let deadline = (!timeout.is_zero()).then(|| timeout.saturating_add(self.timeout));
        cri_call!(self, runtime.exec_sync, "exec_sync", req, deadline)
    }

    async fn reopen_container_log(&self, id: &str) -> CriResult<()> {
        let req = cri::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        cri_call!(
            self,
            runtime.reopen_container_log,
            "reopen_container_log",
            req,
            self.bounded()
        )
        .map(drop)
    }
}

/// The streaming calls (kubelet's `getExec`, `getAttach`, `getPortForward`): each answers with
/// a one-time URL on the runtime's streaming server (containerd's: single use, valid one
/// minute), which the node API relays the client's upgraded connection to
/// ([`crate::nodeapi::streaming`]). Only the socket client has them: they need a streaming
/// server to be of any use.
impl Cri {
    /// `Exec`: the URL of an exec session in container `req.container_id`.
    ///
    /// Errors: the runtime's (NotFound for a container that is gone).
    pub async fn exec(&self, req: cri::ExecRequest) -> CriResult<String> {
        cri_call!(self, runtime.exec, "exec", req, self.bounded()).map(|r| r.url)
    }

    /// `Attach`: the URL of an attach session to container `req.container_id`.
    ///
    /// Errors: the runtime's.
    pub async fn attach(&self, req: cri::AttachRequest) -> CriResult<String> {
        cri_call!(self, runtime.attach, "attach", req, self.bounded()).map(|r| r.url)
    }

    /// `PortForward`: the URL of a port-forward session into sandbox `req.pod_sandbox_id`.
    ///
    /// Errors: the runtime's.
    pub async fn port_forward(&self, req: cri::PortForwardRequest) -> CriResult<String> {
        cri_call!(
            self,
            runtime.port_forward,
            "port_forward",
            req,
            self.bounded()
        )
        .map(|r| r.url)
    }
}

/// What the node API's `/stats/summary` asks beyond the runtime manager's calls.
impl Cri {
    /// `ImageFsInfo`: each image filesystem's use as the runtime counts it (bytes and inodes
    /// of its images, with the mount point holding them).
    ///
    /// Errors: the runtime's.
    pub async fn image_fs_usage(&self) -> CriResult<Vec<cri::FilesystemUsage>> {
        cri_call!(
            self,
            image.image_fs_info,
            "image_fs_info",
            cri::ImageFsInfoRequest {},
            self.bounded()
        )
        .map(|r| r.image_filesystems)
    }
}

impl ImageService for Cri {
    async fn image_status(&self, image: &str) -> CriResult<Option<cri::Image>> {
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        cri_call!(
            self,
            image.image_status,
            "image_status",
            req,
            self.bounded()
        )
        .map(|r| r.image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> CriResult<String> {
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth,
            sandbox_config,
        };
        cri_call!(self, image.pull_image, "pull_image", req, None).map(|r| r.image_ref)
    }

    async fn image_fs_mountpoints(&self) -> CriResult<Vec<String>> {
        self.image_fs_usage().await.map(|fs| {
            fs.into_iter()
                .filter_map(|f| f.fs_id.map(|id| id.mountpoint))
                .filter(|m| !m.is_empty())
                .collect()
        })
    }

    async fn list_images(&self) -> CriResult<Vec<cri::Image>> {
        cri_call!(
            self,
            image.list_images,
            "list_images",
            cri::ListImagesRequest { filter: None },
            self.bounded()
        )
        .map(|r| r.images)
    }

    async fn remove_image(&self, id: &str) -> CriResult<()> {
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: id.into(),
                ..Default::default()
            }),
        };
        cri_call!(
            self,
            image.remove_image,
            "remove_image",
            req,
            self.bounded()
        )
        .map(|_| ())
    }
}
