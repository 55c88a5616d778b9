//! Image garbage collection (kubelet's `images/image_gc_manager.go`): which images may go, in
//! which order, and the pass that removes them.
//!
//! Every [`ImageGcPolicy::period`] (kubelet's `ImageGCPeriod`, 5 minutes) a pass
//! ([`super::GarbageCollector::collect_images`]):
//! 1. lists the runtime's images and records each one's first detection and last use
//!    ([`ImageRecords::detect`]); an image is in use while any container of the runtime (of any
//!    agent) was created from it, while it is the runtime's sandbox image, and from the moment a
//!    pod that names it is admitted until that pod is gone ([`PodImages`]);
//! 2. with `imageMaximumGCAge` set, removes unused images not used for longer than that
//!    (reason `age`);
//! 3. when the image filesystem is at or above `imageGCHighThresholdPercent` used, removes
//!    unused images, least recently used first, until `imageGCLowThresholdPercent` would be
//!    reached (reason `space`), skipping images first seen less than `imageMinimumGCAge` ago.
//!
//! Never removed: an image in use, a pinned image (CRI `pinned`), the sandbox image. Times are
//! monotonic, so a jump of the wall clock makes no image "old"; after an agent restart every
//! image counts as first seen at the restart, as in kubelet.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::cri::api;

/// kubelet's image garbage collection settings (`KubeletConfiguration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent` (0..=100, default 85): a pass frees space when the image
    /// filesystem's use is at or above this percentage; 100 turns space-based collection off.
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (below the high one, default 80): the use a pass frees down to.
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge` (default 2m): an image first seen less than this ago is kept.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (default 0: off): an unused image not used for longer goes, whatever
    /// the disk use.
    pub max_age: Duration,
    /// How often a pass runs (kubelet's `ImageGCPeriod`, 5m; nodelet's `imageGCPeriod`).
    pub period: Duration,
}

impl ImageGcPolicy {
    /// kubelet's defaults.
    pub const KUBELET: ImageGcPolicy = ImageGcPolicy {
        high_threshold_percent: 85,
        low_threshold_percent: 80,
        min_age: Duration::from_secs(120),
        max_age: Duration::ZERO,
        period: Duration::from_secs(300),
    };

    /// Bytes to free on a filesystem of `capacity` bytes with `available` free, or `None` when
    /// its use is below the high threshold (kubelet: `usagePercent >= HighThresholdPercent` →
    /// free `capacity × (100 − low) / 100 − available`).
    pub fn bytes_to_free(&self, capacity: u64, available: u64) -> Option<u64> {
        if capacity == 0 || self.high_threshold_percent >= 100 {
            return None;
        }
        let available = available.min(capacity);
        let used_percent = 100 - available.saturating_mul(100) / capacity;
        if used_percent < u64::from(self.high_threshold_percent) {
            return None;
        }
        let target_available =
            u128::from(capacity) * u128::from(100 - self.low_threshold_percent.min(100)) / 100;
        Some(
            u64::try_from(target_available)
                .unwrap_or(u64::MAX)
                .saturating_sub(available),
        )
    }
}

/// What is known of one image (kubelet's `imageRecord`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    /// When a pass first saw it (monotonic).
    first_detected: Instant,
    /// When a pass last found it in use; `None`: never while this agent ran.
    last_used: Option<Instant>,
    /// Its size, bytes, as the runtime reports it.
    size: u64,
    /// CRI `pinned`: never removed.
    pinned: bool,
}

/// An image chosen for removal: its ID and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// The image ID (`sha256:…`).
    pub id: String,
    /// Bytes it frees, as the runtime reports its size.
    pub size: u64,
}

/// The image manager's records, by image ID (kubelet's `imageRecords`). Written only by the
/// garbage collector's passes, which hold it for the whole pass.
#[derive(Debug, Default)]
pub struct ImageRecords {
    records: HashMap<String, Record>,
}

impl ImageRecords {
    /// Records the runtime's `images` at `now` (kubelet's `detectImages`): a new one is first
    /// detected now; one whose ID is in `in_use` is used now; images gone from the runtime are
    /// forgotten.
    pub fn detect(&mut self, images: &[api::Image], in_use: &HashSet<String>, now: Instant) {
        let listed: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| listed.contains(id.as_str()));
        for image in images {
            let r = self.records.entry(image.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: image.size,
                pinned: image.pinned,
            });
            r.size = image.size;
            r.pinned = image.pinned;
            if in_use.contains(&image.id) {
                r.last_used = Some(now);
            }
        }
    }

    /// Number of images recorded.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when no image is recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Unused, unpinned images in kubelet's eviction order: never used first, then least
    /// recently used, ties by first detection, then by ID.
    fn eviction_order<'a>(&'a self, in_use: &HashSet<String>) -> Vec<(&'a String, &'a Record)> {
        let mut v: Vec<_> = self
            .records
            .iter()
            .filter(|(id, r)| !r.pinned && !in_use.contains(*id))
            .collect();
        v.sort_by(|(a_id, a), (b_id, b)| {
            (a.last_used, a.first_detected, a_id).cmp(&(b.last_used, b.first_detected, b_id))
        });
        v
    }

    /// The images to remove to free `bytes` at `now` (kubelet's `freeSpace`): in eviction
    /// order, skipping those first seen less than `min_age` ago, until their sizes reach
    /// `bytes` (`u64::MAX`: every one that may go, kubelet's `DeleteUnusedImages`).
    pub fn to_free(
        &self,
        in_use: &HashSet<String>,
        now: Instant,
        min_age: Duration,
        bytes: u64,
    ) -> Vec<Victim> {
        let mut freed = 0u64;
        let mut out = Vec::new();
        for (id, r) in self.eviction_order(in_use) {
            if freed >= bytes {
                break;
            }
            if now.saturating_duration_since(r.first_detected) < min_age {
                continue;
            }
            freed = freed.saturating_add(r.size);
            out.push(Victim {
                id: id.clone(),
                size: r.size,
            });
        }
        out
    }

    /// Unused images not used for longer than `max_age` at `now` (kubelet's `freeOldImages`;
    /// an image never used counts from its first detection). Empty when `max_age` is zero.
    pub fn too_old(
        &self,
        in_use: &HashSet<String>,
        now: Instant,
        max_age: Duration,
    ) -> Vec<Victim> {
        if max_age.is_zero() {
            return Vec::new();
        }
        self.eviction_order(in_use)
            .into_iter()
            .filter(|(_, r)| {
                now.saturating_duration_since(r.last_used.unwrap_or(r.first_detected)) > max_age
            })
            .map(|(id, r)| Victim {
                id: id.clone(),
                size: r.size,
            })
            .collect()
    }
}

/// The IDs of `images` that `references` (as written in pod specs, or image IDs) name: by
/// normalised tag or digest, or by ID (`sha256:…`, or its hex alone).
pub fn resolve<'a>(
    references: impl IntoIterator<Item = &'a str>,
    images: &[api::Image],
) -> HashSet<String> {
    let mut by_name: HashMap<&str, &str> = HashMap::new();
    for i in images {
        by_name.insert(&i.id, &i.id);
        if let Some(hex) = i.id.strip_prefix("sha256:") {
            by_name.insert(hex, &i.id);
        }
        for r in i.repo_tags.iter().chain(&i.repo_digests) {
            by_name.insert(r, &i.id);
        }
    }
    let mut out = HashSet::new();
    for r in references {
        let id = by_name
            .get(r)
            .or_else(|| by_name.get(crate::parsers::normalize_reference(r).as_str()));
        if let Some(id) = id {
            out.insert((*id).to_owned());
        }
    }
    out
}

/// The images each admitted pod needs, by pod UID: an image is in use from the pod's first
/// sync (which registers it before it looks the image up or pulls it) until the pod is gone.
/// A pass of image garbage collection holds this for its whole length, so a pod that comes
/// while images are being removed waits for the pass, then finds its image gone and pulls it:
/// a pull is never raced by a removal.
#[derive(Clone, Default)]
pub struct PodImages {
    inner: std::sync::Arc<tokio::sync::Mutex<HashMap<String, Vec<String>>>>,
}

impl PodImages {
    /// Registers `images` (as written in the spec) as needed by the pod `uid`; written by that
    /// pod's worker alone.
    pub async fn need(&self, uid: &str, images: Vec<String>) {
        let mut m = self.inner.lock().await;
        if m.get(uid) != Some(&images) {
            m.insert(uid.to_owned(), images);
        }
    }

    /// The pod `uid` is gone: its images are no longer needed by it.
    pub async fn forget(&self, uid: &str) {
        self.inner.lock().await.remove(uid);
    }

    /// Holds the registry for a pass: no pod registers an image until the guard is dropped.
    pub async fn hold(&self) -> tokio::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.inner.lock().await
    }
}

/// The runtime's sandbox image from its verbose `Status` info: containerd's configuration
/// (`info["config"]`, JSON) names it `sandboxImage`. `None` when the runtime does not say.
pub fn runtime_sandbox_image(info: &std::collections::HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    config
        .get("sandboxImage")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The images a pod's containers (init, sidecar and regular) name.
pub fn images_of(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let mut v: Vec<String> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|c| c.image.clone())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64, tags: &[&str]) -> api::Image {
        api::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn thresholds_give_kubelets_amount_to_free() {
        let p = ImageGcPolicy::KUBELET;
        assert_eq!(p.bytes_to_free(1000, 200), None, "80% used: below 85%");
        // 90% used: free down to 80% used, i.e. 200 available.
        assert_eq!(p.bytes_to_free(1000, 100), Some(100));
        assert_eq!(
            p.bytes_to_free(1000, 150),
            Some(50),
            "85% used is at the threshold"
        );
        let off = ImageGcPolicy {
            high_threshold_percent: 100,
            ..p
        };
        assert_eq!(off.bytes_to_free(1000, 0), None);
        assert_eq!(p.bytes_to_free(0, 0), None);
    }

    #[test]
    fn references_resolve_to_image_ids_by_normalised_tag_or_id() {
        let images = [
            image("sha256:aa", 1, &["docker.io/library/busybox:1.36"]),
            image("sha256:bb", 1, &["registry.k8s.io/pause:3.9"]),
        ];
        assert_eq!(
            resolve(["busybox:1.36", "bb", "nothing:1"], &images),
            ["sha256:aa".to_string(), "sha256:bb".to_string()].into()
        );
    }

    #[test]
    fn unused_images_go_least_recently_used_first_after_their_minimum_age() {
        let t0 = Instant::now();
        let min = Duration::from_secs(120);
        let mut r = ImageRecords::default();
        let all = [
            image("sha256:used", 10, &[]),
            image("sha256:old", 10, &[]),
            image("sha256:never", 10, &[]),
            image("sha256:pinned", 10, &[]),
        ];
        let mut pinned = all.to_vec();
        pinned[3].pinned = true;
        r.detect(
            &pinned,
            &["sha256:used".into(), "sha256:old".into()].into(),
            t0,
        );
        let in_use: HashSet<String> = ["sha256:used".into()].into();
        assert!(
            r.to_free(&in_use, t0 + Duration::from_secs(60), min, u64::MAX)
                .is_empty(),
            "younger than imageMinimumGCAge"
        );
        let later = t0 + Duration::from_secs(600);
        r.detect(&pinned, &in_use, later);
        let ids = |v: Vec<Victim>| v.into_iter().map(|v| v.id).collect::<Vec<_>>();
        assert_eq!(
            ids(r.to_free(&in_use, later, min, u64::MAX)),
            ["sha256:never", "sha256:old"],
            "never used first, then least recently used; in use and pinned kept"
        );
        assert_eq!(ids(r.to_free(&in_use, later, min, 5)), ["sha256:never"]);
        // Max age counts from the last use.
        assert_eq!(
            ids(r.too_old(&in_use, later, Duration::from_secs(500))),
            ["sha256:never", "sha256:old"]
        );
        assert!(r.too_old(&in_use, later, Duration::ZERO).is_empty());
        // An image gone from the runtime is forgotten.
        r.detect(&pinned[..1], &in_use, later);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn the_sandbox_image_is_read_from_containerds_config() {
        let info = [(
            "config".to_string(),
            r#"{"sandboxImage":"registry.k8s.io/pause:3.9","containerd":{}}"#.to_string(),
        )]
        .into();
        assert_eq!(
            runtime_sandbox_image(&info).as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
        assert_eq!(runtime_sandbox_image(&Default::default()), None);
    }

    #[test]
    fn a_pods_images_include_init_containers_once() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "spec": {"initContainers": [{"name": "i", "image": "busybox"}],
                     "containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "x:1"}]}
        }))
        .unwrap();
        assert_eq!(images_of(&pod), ["busybox", "x:1"]);
    }
}
