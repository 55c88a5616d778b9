//! Garbage collection: what nodelet created and no longer needs goes on schedule (kubelet's
//! `containerGC`, `realImageGCManager`, `podContainerDeletor` and the orphan clean-ups of
//! `HandlePodCleanups`).
//!
//! - [`GarbageCollector`] runs its own task: a container pass every
//!   [`GcSettings::container_period`] (kubelet's `ContainerGCPeriod`, 1 minute) over the whole
//!   node ([`containers::plan`]), a pass over one pod each time its worker finds more dead
//!   instances of a container than the policy keeps ([`DeadContainers`]; kubelet feeds its pod
//!   container deletor from the PLEG's `ContainerDied`), so a crash-looping container leaves one
//!   dead instance, and an image pass every `imageGCPeriod` ([`images`]). The eviction manager
//!   calls it under disk pressure ([`GarbageCollector::reclaim`], kubelet's
//!   `reclaimNodeLevelResources`).
//! - Housekeeping removes the directories of pods that are gone ([`orphans`]): pod
//!   directories with their volumes, and pod log directories, on their own filesystem only
//!   ([`crate::volume::removal`]); a directory that cannot go (it holds a mount another process
//!   made) is reported once and retried with back-off.
//!
//! Orphaned pod cgroups are the container manager's
//! ([`crate::cm::ContainerManager::cleanup_orphans`]).

pub mod containers;
pub mod images;
pub mod orphans;

pub use orphans::OrphanedDirs;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::clock::SharedClock;
use crate::cri::{CriError, CriRuntime};
use crate::events::Recorder;
use crate::metrics::{Metrics, ReasonLabel};
use containers::{ContainerGcPolicy, Why};
use images::{ImageGcPolicy, ImageRecords, PodImages, Victim};

/// Capacity of the channel of pods with dead containers to remove (kubelet's
/// `containerDeletorBufferLimit`); when full, the pod waits for the next periodic pass.
pub const DEAD_CAPACITY: usize = 50;

/// The pod workers' word to the garbage collector that a pod holds more dead instances of a
/// container than the policy keeps (kubelet feeds its pod container deletor from the PLEG's
/// `ContainerDied`; nodelet's workers see the same in the status each sync starts from). The
/// collector then runs a pass over that pod. Cheap to clone; never blocks: when the channel is
/// full (`nodelet_channel_full_total{channel="dead_containers"}`) the next periodic pass does it.
/// The default tells no one (unit tests).
#[derive(Clone, Default)]
pub struct DeadContainers {
    tx: Option<(tokio::sync::mpsc::Sender<String>, Arc<Metrics>)>,
}

impl DeadContainers {
    /// A sender and the receiver [`GarbageCollector::run`] reads.
    pub fn channel(metrics: Arc<Metrics>) -> (Self, tokio::sync::mpsc::Receiver<String>) {
        let (tx, rx) = tokio::sync::mpsc::channel(DEAD_CAPACITY);
        (
            Self {
                tx: Some((tx, metrics)),
            },
            rx,
        )
    }

    /// Tells the collector about pod `uid` when `rt`, its runtime status, holds more than
    /// `keep` dead instances of one container name.
    pub fn report(&self, uid: &str, rt: &crate::container::RuntimePodStatus, keep: i64) {
        let Some((tx, metrics)) = &self.tx else {
            return;
        };
        let mut dead: HashMap<&str, i64> = HashMap::new();
        for c in &rt.containers {
            if c.state() != crate::container::ContainerState::Running {
                *dead.entry(c.name.as_str()).or_default() += 1;
            }
        }
        if keep >= 0 && dead.values().any(|n| *n > keep) && tx.try_send(uid.to_owned()).is_err() {
            metrics.channel_full("dead_containers");
        }
    }
}

/// How long after every source has reported the first image pass runs: the admitted pods'
/// first syncs register their images meanwhile (a housekeeping period).
pub const IMAGES_AFTER_SOURCES: Duration = Duration::from_secs(2);

/// What the garbage collector needs to know of the node.
#[derive(Debug, Clone)]
pub struct GcSettings {
    /// The node's name: only sandboxes labelled with it are touched.
    pub node_name: String,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// A directory on the image filesystem (CRI `ImageFsInfo`'s mount point, else the agent's
    /// root directory): its use decides the image passes.
    pub imagefs: PathBuf,
    /// The runtime's sandbox image (containerd's `sandbox_image`), never removed.
    pub sandbox_image: Option<String>,
    /// The container policy (kubelet's defaults: [`ContainerGcPolicy::KUBELET`]).
    pub containers: ContainerGcPolicy,
    /// Period of the whole-node container pass (nodelet's `containerGCPeriod`, default 1m).
    pub container_period: Duration,
    /// The image policy and period.
    pub images: ImageGcPolicy,
}

/// What an image pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImagePass {
    /// Images removed.
    pub removed: usize,
    /// Bytes they held, as the runtime reports their sizes.
    pub freed: u64,
}

/// The garbage collector: one per agent, its passes serialized.
pub struct GarbageCollector<R: CriRuntime + Clone> {
    cri: R,
    settings: GcSettings,
    /// The image manager's records; held for a whole image pass.
    records: tokio::sync::Mutex<ImageRecords>,
    /// Images refused by the runtime, reported once each.
    refused: Mutex<HashSet<String>>,
    /// A pass could not free enough and said so; said again only after a pass that could.
    short_reported: AtomicBool,
    /// Serializes container passes.
    container_pass: tokio::sync::Mutex<()>,
    pod_images: PodImages,
    /// The pods that exist (desired, or still handled by a worker), as housekeeping last saw
    /// them, and when (wall clock, ns); `None` until every source has reported.
    existing: Mutex<Option<(HashSet<String>, i64)>>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    clock: SharedClock,
}

impl<R: CriRuntime + Clone> GarbageCollector<R> {
    /// A collector over `cri` with `settings`; `pod_images` is the registry the pod workers
    /// write the images of admitted pods to.
    pub fn new(
        cri: R,
        settings: GcSettings,
        pod_images: PodImages,
        metrics: Arc<Metrics>,
        recorder: Recorder,
        clock: SharedClock,
    ) -> Self {
        Self {
            cri,
            settings,
            records: tokio::sync::Mutex::default(),
            refused: Mutex::default(),
            short_reported: AtomicBool::new(false),
            container_pass: tokio::sync::Mutex::default(),
            pod_images,
            existing: Mutex::new(None),
            metrics,
            recorder,
            clock,
        }
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &GcSettings {
        &self.settings
    }

    /// Housekeeping's report of the pods that exist (written by housekeeping alone, once every
    /// source has reported): a pod not in it is gone, and its dead containers and sandboxes go.
    pub fn set_existing(&self, uids: HashSet<String>) {
        let at = self.clock.epoch_ns();
        *self.existing.lock().unwrap_or_else(|e| e.into_inner()) = Some((uids, at));
    }

    /// A container pass with `policy`, over the whole node or over the pod `only`: removes
    /// the dead containers and sandboxes [`containers::plan`] chooses, with the containers'
    /// log files. Returns how many containers and sandboxes went.
    ///
    /// Errors: the listings'. A removal that fails is logged and left to the next pass.
    pub async fn collect_containers(
        &self,
        policy: ContainerGcPolicy,
        only: Option<&str>,
    ) -> Result<usize, CriError> {
        let _pass = self.container_pass.lock().await;
        let filter: HashMap<String, String> = only
            .map(|uid| {
                [(
                    crate::kuberuntime::labels::POD_UID.to_owned(),
                    uid.to_owned(),
                )]
                .into()
            })
            .unwrap_or_default();
        let (sandboxes, containers) = tokio::try_join!(
            self.cri.list_pod_sandbox(filter.clone()),
            self.cri.list_containers(filter)
        )?;
        let mut existing = self
            .existing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let (Some((uids, _)), Some(uid)) = (&mut existing, only) {
            // Its worker asked: it exists.
            uids.insert(uid.to_owned());
        }
        let plan = containers::plan(
            &sandboxes,
            &containers,
            &self.settings.node_name,
            existing.as_ref().map(|(uids, at)| containers::Existing {
                uids,
                as_of_ns: *at,
            }),
            policy,
            self.clock.epoch_ns(),
            &self.settings.pod_logs_dir,
        );
        let mut removed = 0;
        for c in &plan.containers {
            match self.cri.remove_container(&c.id).await {
                Ok(()) => {
                    removed += 1;
                    self.count_container(c.why, policy);
                    if let Some(log) = &c.log {
                        remove_log(log);
                    }
                    debug!(id = %c.id, uid = %c.pod_uid, "removed dead container");
                }
                Err(e) if e.code == tonic::Code::NotFound => {}
                Err(e) => {
                    warn!(id = %c.id, uid = %c.pod_uid, error = %e, "cannot remove dead container")
                }
            }
        }
        for (id, why) in &plan.sandboxes {
            match self.cri.remove_pod_sandbox(id).await {
                Ok(()) => {
                    removed += 1;
                    self.count_container(*why, policy);
                    debug!(sandbox = %id, "removed dead sandbox");
                }
                Err(e) if e.code == tonic::Code::NotFound => {}
                Err(e) => warn!(sandbox = %id, error = %e, "cannot remove dead sandbox"),
            }
        }
        Ok(removed)
    }

    fn count_container(&self, why: Why, policy: ContainerGcPolicy) {
        let reason = if policy == ContainerGcPolicy::ALL_DEAD && why == Why::Policy {
            "disk-pressure"
        } else {
            why.label()
        };
        self.metrics
            .containers_garbage_collected
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc();
    }

    /// The periodic image pass (kubelet's `GarbageCollect`): images unused for longer than
    /// `imageMaximumGCAge`, then, above `imageGCHighThresholdPercent`, unused images least
    /// recently used first down to `imageGCLowThresholdPercent`. A pass that freed space draws
    /// a Normal `FreedDiskSpace` event on the node; one that could not free enough a Warning
    /// `FreeDiskSpaceFailed` with kubelet's message (once, until a pass frees enough).
    ///
    /// Errors: the runtime's listings.
    pub async fn collect_images(&self) -> Result<ImagePass, CriError> {
        let (records, in_use, now, _held) = self.detect_images().await?;
        let policy = self.settings.images;
        let old = records.too_old(&in_use, now, policy.max_age);
        let mut pass = self.remove_images(&old, "age").await;
        if let Some((capacity, available)) = fs_bytes(&self.settings.imagefs) {
            let available = available.saturating_add(pass.freed);
            if let Some(need) = policy.bytes_to_free(capacity, available) {
                // What the age step tried (removed, or refused) is not tried again.
                let mut tried = in_use.clone();
                tried.extend(old.iter().map(|v| v.id.clone()));
                let victims = records.to_free(&tried, now, policy.min_age, need);
                let freed = self.remove_images(&victims, "space").await;
                pass.removed += freed.removed;
                pass.freed += freed.freed;
                let short = freed.freed < need;
                let said = self.short_reported.swap(short, Ordering::Relaxed);
                if short && !said {
                    let message = format!(
                        "Failed to garbage collect required amount of images. Attempted to free {need} bytes, but only found {} bytes eligible to free.",
                        freed.freed
                    );
                    warn!(
                        need,
                        freed = freed.freed,
                        "image garbage collection could not free enough (reported once until it can)"
                    );
                    self.recorder
                        .warning("node", "FreeDiskSpaceFailed", message);
                }
            } else {
                self.short_reported.store(false, Ordering::Relaxed);
            }
        }
        self.announce(pass, "image garbage collection");
        Ok(pass)
    }

    /// Disk pressure's reclaim (kubelet's `reclaimNodeLevelResources`): every dead container
    /// goes, then, when `images` (the signal is on the image filesystem, or nodefs holds the
    /// images), every unused image past `imageMinimumGCAge` (kubelet's `DeleteUnusedImages`).
    /// Returns the containers removed and the image pass.
    ///
    /// Errors: the runtime's listings.
    pub async fn reclaim(&self, images: bool) -> Result<(usize, ImagePass), CriError> {
        let containers = self
            .collect_containers(ContainerGcPolicy::ALL_DEAD, None)
            .await?;
        let pass = if images {
            let (records, in_use, now, _held) = self.detect_images().await?;
            let victims = records.to_free(&in_use, now, self.settings.images.min_age, u64::MAX);
            self.remove_images(&victims, "space").await
        } else {
            ImagePass::default()
        };
        Ok((containers, pass))
    }

    /// Lists images and what uses them, and records them; returns the records (held), the
    /// IDs in use, the time, and the held registry of admitted pods' images (no pod registers
    /// one until the pass ends).
    async fn detect_images(
        &self,
    ) -> Result<
        (
            tokio::sync::MutexGuard<'_, ImageRecords>,
            HashSet<String>,
            Instant,
            tokio::sync::MutexGuard<'_, HashMap<String, Vec<String>>>,
        ),
        CriError,
    > {
        let mut records = self.records.lock().await;
        let held = self.pod_images.hold().await;
        let (list, containers) = tokio::try_join!(
            self.cri.list_images(),
            self.cri.list_containers(HashMap::new())
        )?;
        let mut refs: Vec<&str> = held.values().flatten().map(String::as_str).collect();
        refs.extend(self.settings.sandbox_image.as_deref());
        for c in &containers {
            refs.push(&c.image_ref);
            if let Some(spec) = &c.image {
                refs.push(&spec.image);
            }
        }
        let in_use = images::resolve(refs, &list);
        let now = self.clock.now();
        records.detect(&list, &in_use, now);
        Ok((records, in_use, now, held))
    }

    async fn remove_images(&self, victims: &[Victim], reason: &str) -> ImagePass {
        let mut pass = ImagePass::default();
        for v in victims {
            match self.cri.remove_image(&v.id).await {
                Ok(()) => {
                    pass.removed += 1;
                    pass.freed += v.size;
                    info!(image = %v.id, size = v.size, reason, "removed unused image");
                    self.metrics
                        .images_garbage_collected
                        .get_or_create(&ReasonLabel {
                            reason: reason.into(),
                        })
                        .inc();
                    self.refused
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&v.id);
                }
                Err(e) if e.code == tonic::Code::NotFound => {}
                Err(e) => {
                    let first = self
                        .refused
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(v.id.clone());
                    if first {
                        warn!(image = %v.id, error = %e, "the runtime refused to remove an unused image; skipped (reported once)");
                        self.recorder.warning(
                            "node",
                            "ImageGCFailed",
                            format!("cannot remove image {}: {}", v.id, e.message),
                        );
                    }
                }
            }
        }
        pass
    }

    fn announce(&self, pass: ImagePass, by: &str) {
        if pass.removed > 0 {
            self.recorder.normal(
                "node",
                "FreedDiskSpace",
                format!(
                    "{by}: removed {} unused images, {} bytes",
                    pass.removed, pass.freed
                ),
            );
        }
    }

    /// The collector's task: the whole-node container pass every `container_period` (first at
    /// start), the image pass every `imageGCPeriod` (first [`IMAGES_AFTER_SOURCES`] after every
    /// source has reported), and in between a pass over each pod a worker reported
    /// ([`DeadContainers`]) from `dead`.
    pub async fn run(self: Arc<Self>, mut dead: tokio::sync::mpsc::Receiver<String>) {
        let mut next_containers = self.clock.now();
        // Image passes wait for every source to have reported and the admitted pods' first
        // syncs to have registered their images (one housekeeping period after).
        let mut next_images: Option<Instant> = None;
        loop {
            let now = self.clock.now();
            if now >= next_containers {
                if let Err(e) = self
                    .collect_containers(self.settings.containers, None)
                    .await
                {
                    warn!(error = %e, "container garbage collection: cannot list the runtime");
                }
                next_containers = self.clock.now() + self.settings.container_period;
            }
            if next_images.is_none() && self.existing_known() {
                next_images = Some(now + IMAGES_AFTER_SOURCES);
            }
            if next_images.is_some_and(|t| now >= t) {
                if let Err(e) = self.collect_images().await {
                    warn!(error = %e, "image garbage collection failed");
                    self.recorder
                        .warning("node", "ImageGCFailed", e.to_string());
                }
                next_images = Some(self.clock.now() + self.settings.images.period);
            }
            let next = next_images.unwrap_or(now + IMAGES_AFTER_SOURCES);
            let wait = next_containers
                .min(next)
                .saturating_duration_since(self.clock.now());
            tokio::select! {
                uid = dead.recv() => match uid {
                    Some(uid) => {
                        if let Err(e) = self.collect_containers(self.settings.containers, Some(&uid)).await {
                            debug!(uid, error = %e, "container garbage collection of a pod: cannot list it");
                        }
                    }
                    None => return,
                },
                () = crate::clock::sleep(wait) => {}
            }
        }
    }

    fn existing_known(&self) -> bool {
        self.existing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// Removes a dead container's log file and its rotated files.
fn remove_log(log: &Path) {
    for f in crate::kuberuntime::logs::rotated_files(log)
        .into_iter()
        .chain([log.to_path_buf()])
    {
        if let Err(e) = std::fs::remove_file(&f) {
            if e.kind() != std::io::ErrorKind::NotFound {
                debug!(path = %f.display(), error = %e, "cannot remove a dead container's log");
            }
        }
    }
}

/// Capacity and available bytes of the filesystem holding `path` (`statvfs`, as the eviction
/// manager's `imagefs.available`).
pub fn fs_bytes(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = st.fragment_size();
    Some((
        st.blocks().saturating_mul(frsize),
        st.blocks_available().saturating_mul(frsize),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector(
        rt: &crate::testing::runtime::FakeRuntime,
        clock: &crate::clock::FakeClock,
        images: ImageGcPolicy,
    ) -> (
        GarbageCollector<crate::testing::runtime::FakeRuntime>,
        Recorder,
        tempfile::TempDir,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let recorder = Recorder::default();
        let gc = GarbageCollector::new(
            rt.clone(),
            GcSettings {
                node_name: "n".into(),
                pod_logs_dir: tmp.path().join("logs"),
                imagefs: tmp.path().into(),
                sandbox_image: Some("registry.k8s.io/pause:3.9".into()),
                containers: ContainerGcPolicy::KUBELET,
                container_period: Duration::from_secs(60),
                images,
            },
            PodImages::default(),
            Metrics::new(),
            recorder.clone(),
            clock.shared(),
        );
        (gc, recorder, tmp)
    }

    #[tokio::test]
    async fn an_image_pass_keeps_admitted_pods_and_the_sandbox_image_and_waits_for_min_age() {
        let clock = crate::clock::FakeClock::new(0);
        let rt = crate::testing::runtime::FakeRuntime::new(clock.clone());
        rt.add_image("old:1");
        // Any disk is "full" at 1%: the pass frees all it may.
        let policy = ImageGcPolicy {
            high_threshold_percent: 1,
            low_threshold_percent: 0,
            ..ImageGcPolicy::KUBELET
        };
        let (gc, recorder, _tmp) = collector(&rt, &clock, policy);
        gc.pod_images.need("u1", vec!["busybox:1.36".into()]).await;
        assert_eq!(
            gc.collect_images().await.unwrap().removed,
            0,
            "all first seen now"
        );
        clock.advance(Duration::from_secs(121));
        let pass = gc.collect_images().await.unwrap();
        assert_eq!((pass.removed, pass.freed), (1, 1 << 20));
        assert_eq!(rt.images(), ["busybox:1.36", "registry.k8s.io/pause:3.9"]);
        assert!(recorder.list().iter().any(|e| e.reason == "FreedDiskSpace"));
        assert!(
            recorder
                .list()
                .iter()
                .any(|e| e.reason == "FreeDiskSpaceFailed"),
            "it could not reach 0% used"
        );
        // The pod is gone: its image may go too (it was used just now, but nothing is younger
        // than the minimum age any more).
        gc.pod_images.forget("u1").await;
        assert_eq!(gc.collect_images().await.unwrap().removed, 1);
        assert_eq!(rt.images(), ["registry.k8s.io/pause:3.9"]);
    }

    #[tokio::test]
    async fn a_refused_removal_is_reported_once() {
        let clock = crate::clock::FakeClock::new(0);
        let rt = crate::testing::runtime::FakeRuntime::new(clock.clone());
        let policy = ImageGcPolicy {
            max_age: Duration::from_secs(200),
            ..ImageGcPolicy::KUBELET
        };
        let (gc, recorder, _tmp) = collector(&rt, &clock, policy);
        gc.collect_images().await.unwrap();
        clock.advance(Duration::from_secs(201));
        for _ in 0..3 {
            rt.fail_next("remove_image", "image is in use by a container");
            assert_eq!(gc.collect_images().await.unwrap().removed, 0);
        }
        let failed = recorder
            .list()
            .iter()
            .filter(|e| e.reason == "ImageGCFailed")
            .count();
        assert_eq!(failed, 1);
        assert_eq!(
            gc.collect_images().await.unwrap().removed,
            1,
            "busybox, by age"
        );
    }
}
