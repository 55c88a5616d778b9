//! A recording fake CRI runtime: sandboxes, containers and images in memory, every call
//! recorded, failures injected per call, container exits and sandbox deaths simulated. Times
//! come from a [`FakeClock`], so back-off can be tested by advancing it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, FakeClock};
use crate::cri::{api, CriError, CriResult, ImageService, RuntimeService};

#[derive(Debug, Clone)]
struct FakeSandbox {
    config: api::PodSandboxConfig,
    ready: bool,
    created_at: i64,
    ip: String,
}

#[derive(Debug, Clone)]
struct FakeContainer {
    sandbox_id: String,
    config: api::ContainerConfig,
    state: api::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
}

#[derive(Default)]
struct State {
    calls: Vec<String>,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    images: HashSet<String>,
    failures: HashMap<&'static str, VecDeque<(tonic::Code, String)>>,
    /// What the next ExecSync calls return: (exit code, stderr).
    exec_exits: VecDeque<(i32, String)>,
    /// Calls that, once done, wait for a permit before they return (see
    /// [`FakeRuntime::hold_after`]).
    holds: HashMap<&'static str, Arc<tokio::sync::Semaphore>>,
    next: u64,
}

/// The fake runtime. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    /// The time its timestamps come from.
    pub clock: FakeClock,
}

impl FakeRuntime {
    /// A runtime with the images `busybox:1.36` and `registry.k8s.io/pause:3.9`, on `clock`.
    pub fn new(clock: FakeClock) -> Self {
        let mut st = State::default();
        st.images.insert("busybox:1.36".into());
        st.images.insert("registry.k8s.io/pause:3.9".into());
        Self {
            state: Arc::new(Mutex::new(st)),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call so far, in order, e.g. `RunPodSandbox web`, `CreateContainer c`,
    /// `StopContainer c grace=30`.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Calls whose name starts with `prefix`.
    pub fn calls_of(&self, prefix: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.starts_with(prefix))
            .collect()
    }

    /// Forgets the calls recorded so far.
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Makes the next call of `operation` (kubelet's name, e.g. `create_container`) fail with
    /// `message`.
    pub fn fail_next(&self, operation: &'static str, message: &str) {
        self.fail_next_with(operation, tonic::Code::Unknown, message);
    }

    /// Like [`FakeRuntime::fail_next`], with the gRPC status `code` (containerd answers
    /// `NotFound` for what is gone).
    pub fn fail_next_with(&self, operation: &'static str, code: tonic::Code, message: &str) {
        self.lock()
            .failures
            .entry(operation)
            .or_default()
            .push_back((code, message.into()));
    }

    /// Makes the next ExecSync exit with `code`, `stderr` its output (a command that ran and
    /// failed; [`FakeRuntime::fail_next`] makes one the runtime refuses).
    pub fn exec_exits_next(&self, code: i32, stderr: &str) {
        self.lock().exec_exits.push_back((code, stderr.into()));
    }

    /// Adds an image to the store.
    pub fn add_image(&self, image: &str) {
        self.lock().images.insert(image.into());
    }

    /// The images it holds, sorted.
    pub fn images(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().images.iter().cloned().collect();
        v.sort();
        v
    }

    /// Removes an image from the store (the next use pulls it).
    pub fn remove_image(&self, image: &str) {
        self.lock().images.remove(image);
    }

    /// The running container named `name` exits with `code` now.
    pub fn exit(&self, name: &str, code: i32) {
        let now = self.clock.epoch_ns();
        let mut st = self.lock();
        for c in st.containers.values_mut() {
            if c.name() == name && c.state == api::ContainerState::ContainerRunning {
                c.state = api::ContainerState::ContainerExited;
                c.finished_at = now;
                c.exit_code = code;
                c.reason = if code == 0 { "Completed" } else { "Error" }.into();
            }
        }
    }

    /// Every ready sandbox dies (as when its pause process is killed): not ready, its containers
    /// exited with 137.
    pub fn kill_sandboxes(&self) {
        let now = self.clock.epoch_ns();
        let mut st = self.lock();
        let ids: Vec<String> = st.sandboxes.keys().cloned().collect();
        for id in ids {
            kill_sandbox(&mut st, &id, now);
        }
    }

    /// (name, state, attempt, sandbox ID) of every container, oldest first.
    pub fn containers(&self) -> Vec<(String, api::ContainerState, u32, String)> {
        let st = self.lock();
        st.containers
            .values()
            .map(|c| {
                (
                    c.name(),
                    c.state,
                    c.config.metadata.as_ref().map_or(0, |m| m.attempt),
                    c.sandbox_id.clone(),
                )
            })
            .collect()
    }

    /// Names of the running containers, sorted.
    pub fn running(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .containers()
            .into_iter()
            .filter(|c| c.1 == api::ContainerState::ContainerRunning)
            .map(|c| c.0)
            .collect();
        v.sort();
        v
    }

    /// (ID, ready, attempt) of every sandbox, oldest first.
    pub fn sandboxes(&self) -> Vec<(String, bool, u32)> {
        let st = self.lock();
        let mut v: Vec<_> = st.sandboxes.iter().collect();
        v.sort_by_key(|(_, s)| s.created_at);
        v.into_iter()
            .map(|(id, s)| {
                (
                    id.clone(),
                    s.ready,
                    s.config.metadata.as_ref().map_or(0, |m| m.attempt),
                )
            })
            .collect()
    }

    /// The IDs of the containers named `name`, newest first.
    pub fn containers_named(&self, name: &str) -> Vec<String> {
        let st = self.lock();
        let mut v: Vec<_> = st
            .containers
            .iter()
            .filter(|(_, c)| c.name() == name)
            .collect();
        v.sort_by_key(|(_, c)| std::cmp::Reverse(c.created_at));
        v.into_iter().map(|(id, _)| id.clone()).collect()
    }

    /// The config a container was created with (its latest instance of that name).
    pub fn container_config(&self, name: &str) -> Option<api::ContainerConfig> {
        let st = self.lock();
        st.containers
            .values()
            .filter(|c| c.name() == name)
            .max_by_key(|c| c.created_at)
            .map(|c| c.config.clone())
    }

    /// The config of the newest sandbox.
    pub fn sandbox_config(&self) -> Option<api::PodSandboxConfig> {
        let st = self.lock();
        st.sandboxes
            .values()
            .max_by_key(|s| s.created_at)
            .map(|s| s.config.clone())
    }

    fn name_of(&self, container_id: &str) -> String {
        self.lock()
            .containers
            .get(container_id)
            .map(FakeContainer::name)
            .unwrap_or_default()
    }

    /// From now on, each `operation` (`run_podsandbox`, `create_container`) takes effect and
    /// then waits for a permit of the returned semaphore before it returns: a test can look at
    /// the runtime between a call's effect and its caller learning the result, as a relist can
    /// on the real runtime.
    pub fn hold_after(&self, operation: &'static str) -> Arc<tokio::sync::Semaphore> {
        self.lock()
            .holds
            .entry(operation)
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(0)))
            .clone()
    }

    async fn held(&self, operation: &'static str) {
        let hold = self.lock().holds.get(operation).cloned();
        if let Some(h) = hold {
            if let Ok(p) = h.acquire().await {
                p.forget();
            }
        }
    }

    fn enter(&self, operation: &'static str, call: String) -> CriResult<()> {
        // Every call moves time a little, so creation times order like the runtime's.
        self.clock.advance(Duration::from_micros(1));
        let mut st = self.lock();
        st.calls.push(call);
        match st.failures.get_mut(operation).and_then(VecDeque::pop_front) {
            Some((code, message)) => Err(CriError {
                operation,
                code,
                message,
            }),
            None => Ok(()),
        }
    }
}

impl FakeContainer {
    fn name(&self) -> String {
        self.config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default()
    }
}

fn kill_sandbox(st: &mut State, id: &str, now: i64) {
    if let Some(s) = st.sandboxes.get_mut(id) {
        s.ready = false;
    }
    for c in st.containers.values_mut().filter(|c| c.sandbox_id == id) {
        if c.state == api::ContainerState::ContainerRunning {
            c.state = api::ContainerState::ContainerExited;
            c.finished_at = now;
            c.exit_code = 137;
            c.reason = "Error".into();
        }
    }
}

fn not_found(operation: &'static str, id: &str) -> CriError {
    CriError {
        operation,
        code: tonic::Code::NotFound,
        message: format!("{id} not found"),
    }
}

fn matches(labels: &HashMap<String, String>, sel: &HashMap<String, String>) -> bool {
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl RuntimeService for FakeRuntime {
    async fn version(&self) -> CriResult<api::VersionResponse> {
        self.enter("version", "Version".into())?;
        Ok(api::VersionResponse {
            runtime_name: "fake".into(),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(
        &self,
        config: api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> CriResult<String> {
        let name = config.metadata.as_ref().map_or("", |m| m.name.as_str());
        let call = if runtime_handler.is_empty() {
            format!("RunPodSandbox {name}")
        } else {
            format!("RunPodSandbox {name} handler={runtime_handler}")
        };
        self.enter("run_podsandbox", call)?;
        let host_network = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.network == api::NamespaceMode::Node as i32);
        let now = self.clock.epoch_ns();
        let id = {
            let mut st = self.lock();
            st.next += 1;
            let id = format!("sb{}", st.next);
            let ip = if host_network {
                String::new()
            } else {
                format!("10.88.0.{}", st.next)
            };
            st.sandboxes.insert(
                id.clone(),
                FakeSandbox {
                    config,
                    ready: true,
                    created_at: now,
                    ip,
                },
            );
            id
        };
        self.held("run_podsandbox").await;
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> CriResult<()> {
        self.enter("stop_podsandbox", format!("StopPodSandbox {id}"))?;
        let now = self.clock.epoch_ns();
        kill_sandbox(&mut self.lock(), id, now);
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> CriResult<()> {
        self.enter("remove_podsandbox", format!("RemovePodSandbox {id}"))?;
        let mut st = self.lock();
        st.sandboxes.remove(id);
        st.containers.retain(|_, c| c.sandbox_id != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> CriResult<Option<api::PodSandboxStatus>> {
        self.enter("podsandbox_status", format!("PodSandboxStatus {id}"))?;
        let st = self.lock();
        let s = st
            .sandboxes
            .get(id)
            .ok_or_else(|| not_found("podsandbox_status", id))?;
        Ok(Some(api::PodSandboxStatus {
            id: id.into(),
            metadata: s.config.metadata.clone(),
            state: if s.ready {
                api::PodSandboxState::SandboxReady
            } else {
                api::PodSandboxState::SandboxNotready
            } as i32,
            created_at: s.created_at,
            network: Some(api::PodSandboxNetworkStatus {
                ip: s.ip.clone(),
                ..Default::default()
            }),
            labels: s.config.labels.clone(),
            annotations: s.config.annotations.clone(),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::PodSandbox>> {
        self.enter("list_podsandbox", "ListPodSandbox".into())?;
        let st = self.lock();
        Ok(st
            .sandboxes
            .iter()
            .filter(|(_, s)| matches(&s.config.labels, &labels))
            .map(|(id, s)| api::PodSandbox {
                id: id.clone(),
                metadata: s.config.metadata.clone(),
                state: if s.ready {
                    api::PodSandboxState::SandboxReady
                } else {
                    api::PodSandboxState::SandboxNotready
                } as i32,
                created_at: s.created_at,
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        _sandbox_config: api::PodSandboxConfig,
    ) -> CriResult<String> {
        let name = config.metadata.as_ref().map_or("", |m| m.name.as_str());
        self.enter("create_container", format!("CreateContainer {name}"))?;
        let now = self.clock.epoch_ns();
        let id = {
            let mut st = self.lock();
            if !st.sandboxes.get(sandbox_id).is_some_and(|s| s.ready) {
                return Err(CriError {
                    operation: "create_container",
                    code: tonic::Code::FailedPrecondition,
                    message: format!("sandbox {sandbox_id} is not ready"),
                });
            }
            st.next += 1;
            let id = format!("c{}", st.next);
            st.containers.insert(
                id.clone(),
                FakeContainer {
                    sandbox_id: sandbox_id.into(),
                    config,
                    state: api::ContainerState::ContainerCreated,
                    created_at: now,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    reason: String::new(),
                },
            );
            id
        };
        self.held("create_container").await;
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> CriResult<()> {
        let name = self.name_of(id);
        self.enter("start_container", format!("StartContainer {name}"))?;
        let now = self.clock.epoch_ns();
        let mut st = self.lock();
        let c = st
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found("start_container", id))?;
        c.state = api::ContainerState::ContainerRunning;
        c.started_at = now;
        Ok(())
    }

    async fn stop_container(&self, id: &str, grace_seconds: i64) -> CriResult<()> {
        let name = self.name_of(id);
        self.enter(
            "stop_container",
            format!("StopContainer {name} grace={grace_seconds}"),
        )?;
        let now = self.clock.epoch_ns();
        let mut st = self.lock();
        if let Some(c) = st.containers.get_mut(id) {
            if c.state == api::ContainerState::ContainerRunning {
                c.state = api::ContainerState::ContainerExited;
                c.finished_at = now;
                c.exit_code = 143;
                c.reason = "Error".into();
            }
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> CriResult<()> {
        let name = self.name_of(id);
        self.enter("remove_container", format!("RemoveContainer {name}"))?;
        self.lock().containers.remove(id);
        Ok(())
    }

    async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::Container>> {
        self.enter("list_containers", "ListContainers".into())?;
        let st = self.lock();
        Ok(st
            .containers
            .iter()
            .filter(|(_, c)| matches(&c.config.labels, &labels))
            .map(|(id, c)| api::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: c
                    .config
                    .image
                    .as_ref()
                    .map(|i| i.image.clone())
                    .unwrap_or_default(),
                state: c.state as i32,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                ..Default::default()
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> CriResult<Option<api::ContainerStatus>> {
        self.enter("container_status", format!("ContainerStatus {id}"))?;
        let st = self.lock();
        let c = st
            .containers
            .get(id)
            .ok_or_else(|| not_found("container_status", id))?;
        Ok(Some(api::ContainerStatus {
            id: id.into(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            reason: c.reason.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            ..Default::default()
        }))
    }

    async fn reopen_container_log(&self, id: &str) -> CriResult<()> {
        self.enter("reopen_container_log", format!("ReopenContainerLog {id}"))
    }

    /// No usage is measured by the fake: every container's stats are absent.
    async fn list_container_stats(
        &self,
        _labels: HashMap<String, String>,
    ) -> CriResult<Vec<api::ContainerStats>> {
        self.enter("list_container_stats", "ListContainerStats".into())?;
        Ok(Vec::new())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        _timeout: Duration,
    ) -> CriResult<api::ExecSyncResponse> {
        self.enter("exec_sync", format!("ExecSync {id} {}", cmd.join(" ")))?;
        let (exit_code, stderr) = self.lock().exec_exits.pop_front().unwrap_or_default();
        Ok(api::ExecSyncResponse {
            exit_code,
            stderr: stderr.into_bytes(),
            ..Default::default()
        })
    }
}

impl ImageService for FakeRuntime {
    async fn image_status(&self, image: &str) -> CriResult<Option<api::Image>> {
        self.enter("image_status", format!("ImageStatus {image}"))?;
        let present = self.lock().images.contains(image);
        Ok(present.then(|| api::Image {
            id: format!("sha256:{image}"),
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<api::AuthConfig>,
        _sandbox_config: Option<api::PodSandboxConfig>,
    ) -> CriResult<String> {
        let user = auth.as_ref().map(|a| a.username.as_str());
        let call = match user {
            Some(u) => format!("PullImage {image} as {u}"),
            None => format!("PullImage {image}"),
        };
        self.enter("pull_image", call)?;
        let mut st = self.lock();
        if image.contains("missing") {
            return Err(CriError {
                operation: "pull_image",
                code: tonic::Code::NotFound,
                message: format!("failed to resolve reference {image:?}: not found"),
            });
        }
        // A private registry: only the user `right` may pull from it.
        if image.contains("private") && user != Some("right") {
            return Err(CriError {
                operation: "pull_image",
                code: tonic::Code::Unknown,
                message: format!("failed to pull {image:?}: 401 Unauthorized"),
            });
        }
        st.images.insert(image.into());
        Ok(format!("sha256:{image}"))
    }

    async fn image_fs_mountpoints(&self) -> CriResult<Vec<String>> {
        self.enter("image_fs_info", "ImageFsInfo".into())?;
        Ok(Vec::new())
    }

    async fn list_images(&self) -> CriResult<Vec<api::Image>> {
        self.enter("list_images", "ListImages".into())?;
        let mut images: Vec<_> = self.lock().images.iter().cloned().collect();
        images.sort();
        Ok(images
            .into_iter()
            .map(|i| api::Image {
                id: format!("sha256:{i}"),
                repo_tags: vec![i],
                size: 1 << 20,
                ..Default::default()
            })
            .collect())
    }

    async fn remove_image(&self, id: &str) -> CriResult<()> {
        self.enter("remove_image", format!("RemoveImage {id}"))?;
        let name = id.strip_prefix("sha256:").unwrap_or(id).to_owned();
        self.lock().images.remove(&name);
        Ok(())
    }
}
