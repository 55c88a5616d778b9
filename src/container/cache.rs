//! The pod cache (kubelet's `kubecontainer.Cache`): the latest runtime status of each pod with
//! the time it was read, so that a pod worker never acts on a status older than its last sync.
//!
//! One writer, the PLEG ([`PodCacheWriter`]): its relist (for pods whose containers changed),
//! containerd's events, and the reads pod workers hand it ([`crate::pleg::feed`]). What a worker
//! made (sandbox IPs, created containers, the [`Making`] guard) is that worker's own note on its
//! own pod, read by the relist.
//!
//! [`PodCache::get_newer_than`] answers only with a status read at or after the given time; the
//! PLEG's [`PodCacheWriter::update_time`] marks every entry fresh as of a relist that saw no change.
//!
//! The cache also remembers the containers containerd reported OOM-killed (its `/tasks/oom`
//! event), and every status written or already held shows them exited as `OOMKilled`:
//! containerd 1.6's CRI status says `Completed` for a container whose shell survived the kill
//! and exited 0, and the event may come before or after the exit.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::RuntimePodStatus;

#[derive(Default)]
struct Inner {
    pods: HashMap<String, (Arc<RuntimePodStatus>, Instant)>,
    /// Time of the last relist: every pod without a newer entry is unchanged since then.
    global: Option<Instant>,
    /// Pods that changed in a relist whose status read failed: their entry is current only as
    /// of its own read, never as of a later relist, until a status is written again (kubelet's
    /// cache holds the read error for them instead).
    unverified: HashSet<String>,
    /// Containers with an OOM kill (bounded: cleared past [`MAX_OOM_KILLED`]).
    oom_killed: HashSet<String>,
    /// IPs of sandboxes as their pod worker read them when it made them (so the PLEG need not
    /// ask again), by sandbox ID; forgotten with the pod, and a pod's older sandboxes when it
    /// gets a new one.
    sandbox_ips: HashMap<String, (String, Vec<String>)>,
    /// What pod workers know of the containers they created, by container ID (see
    /// [`MadeContainer`]); a pod keeps one per container name, forgotten with the pod.
    made_containers: HashMap<String, (String, MadeContainer)>,
    /// Pods whose worker is making a sandbox or a container and has not yet recorded what it
    /// learned (see [`PodCache::making`]), with how many such calls are in flight.
    making: HashMap<String, usize>,
}

/// What a pod worker knows of a container it created, as ContainerStatus would report it
/// while the container is still in state Created: the PLEG need not ask the runtime for it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MadeContainer {
    /// Container name in the pod spec.
    pub name: String,
    /// Image reference as containerd's ContainerStatus gives it: the image's first repository
    /// digest (`docker.io/library/busybox@sha256:…`), else its ID; `None` when the worker did
    /// not read the image's status (it pulled the image), and ContainerStatus must be asked.
    pub image_ref: Option<String>,
    /// Absolute path of the container's CRI log (`<pod log dir>/<name>/<restart>.log`).
    pub log_path: String,
}

/// Held by a pod worker while it makes a sandbox or a container (from the CRI call until it
/// records what it learned); on drop the pod is settled again and waiting relists go on. See
/// [`PodCache::making`].
pub struct Making {
    cache: PodCache,
    uid: String,
}

impl Drop for Making {
    fn drop(&mut self) {
        {
            let mut g = self.cache.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = g.making.get_mut(&self.uid) {
                *n -= 1;
                if *n == 0 {
                    g.making.remove(&self.uid);
                }
            }
        }
        self.cache.1.changed.notify_waiters();
    }
}

/// Most OOM-killed container IDs remembered.
const MAX_OOM_KILLED: usize = 1024;

/// Marks the exited containers of `status` that are in `oom` as OOMKilled; true when any was.
fn apply_oom(status: &mut RuntimePodStatus, oom: &HashSet<String>) -> bool {
    let mut changed = false;
    for c in &mut status.containers {
        if c.state == Some(super::ContainerState::Exited)
            && c.reason != "OOMKilled"
            && oom.contains(&c.id)
        {
            c.reason = "OOMKilled".into();
            changed = true;
        }
    }
    changed
}

/// Latest runtime status per pod UID. Cheap to clone.
#[derive(Clone, Default)]
pub struct PodCache(Arc<Mutex<Inner>>, Arc<Waiters>);

/// Pod workers waiting for a newer status, and how to ask the PLEG for one.
#[derive(Default)]
struct Waiters {
    /// Woken on every write and relist.
    changed: tokio::sync::Notify,
    /// Asks the PLEG for a relist (set by the agent; none in unit tests).
    relist: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl PodCache {
    /// kubelet's blocking `GetNewerThan`: the status of `uid` once it is current at or after
    /// `t`, asking the PLEG for a relist (one relist serves every waiting worker) and waiting
    /// at most `max_wait`. `None` when it is not newer by then, or when there is no PLEG to ask.
    pub async fn wait_newer_than(
        &self,
        uid: &str,
        t: Instant,
        max_wait: std::time::Duration,
    ) -> Option<Arc<RuntimePodStatus>> {
        if let Some(st) = self.get_newer_than(uid, t) {
            return Some(st);
        }
        let relist = self.1.relist.get()?;
        let deadline = tokio::time::Instant::now() + max_wait;
        // One request: a relist that starts after it is newer than `t` (the end of the
        // worker's last sync, which is past).
        relist();
        loop {
            let changed = self.1.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(st) = self.get_newer_than(uid, t) {
                return Some(st);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.get_newer_than(uid, t);
            }
        }
    }

    /// True when containerd reported `container_id` OOM-killed.
    pub fn is_oom_killed(&self, container_id: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .oom_killed
            .contains(container_id)
    }

    /// The status of `uid` if it is known to be current at or after `t`: read at or after `t`,
    /// or unchanged as of a relist at or after `t`.
    pub fn get_newer_than(&self, uid: &str, t: Instant) -> Option<Arc<RuntimePodStatus>> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (status, at) = g.pods.get(uid)?;
        let fresh = *at >= t
            || (!g.unverified.contains(uid) && g.global.is_some_and(|gt| gt >= t && gt >= *at));
        fresh.then(|| status.clone())
    }

    /// For a pod never synced (kubelet's first sync, whose minimum time is zero): its latest
    /// status with the time it is current as of, or, when a relist has run and found nothing of
    /// it, an empty status as of that relist. `None` before the first relist.
    pub fn get_first(&self, uid: &str) -> Option<(Arc<RuntimePodStatus>, Instant)> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let global = g.global.filter(|_| !g.unverified.contains(uid));
        match (g.pods.get(uid), global) {
            (Some((st, at)), global) => Some((st.clone(), global.map_or(*at, |gt| gt.max(*at)))),
            (None, Some(gt)) => Some((Arc::new(RuntimePodStatus::default()), gt)),
            (None, None) => None,
        }
    }

    /// The latest status of `uid`, however old.
    pub fn latest(&self, uid: &str) -> Option<Arc<RuntimePodStatus>> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(uid)
            .map(|(s, _)| s.clone())
    }

    /// Records the IPs of sandbox `id` of pod `uid`, read when it was made (the pod's older
    /// sandboxes are forgotten: only the newest one's IPs are ever asked for).
    pub fn remember_sandbox_ips(&self, uid: &str, id: &str, ips: &[String]) {
        {
            let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
            g.sandbox_ips.retain(|_, (u, _)| u != uid);
            g.sandbox_ips
                .insert(id.to_owned(), (uid.to_owned(), ips.to_vec()));
        }
        // A relist may be waiting for it.
        self.1.changed.notify_waiters();
    }

    /// Records what the worker of pod `uid` knows of container `id`, which it just created
    /// (an earlier container of the same name in the pod is forgotten).
    pub fn remember_container(&self, uid: &str, id: &str, made: MadeContainer) {
        {
            let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
            g.made_containers
                .retain(|_, (u, m)| u != uid || m.name != made.name);
            g.made_containers
                .insert(id.to_owned(), (uid.to_owned(), made));
        }
        // A relist may be waiting for it.
        self.1.changed.notify_waiters();
    }

    /// What a pod worker recorded of container `id` when it created it.
    pub fn made_container(&self, id: &str) -> Option<MadeContainer> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.made_containers.get(id).map(|(_, m)| m.clone())
    }

    /// The CRI log path of container `id`: from the status of its pod held here, else from
    /// what its pod worker recorded when it created it. Log rotation's lookup.
    pub fn log_path(&self, id: &str) -> Option<String> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.pods
            .values()
            .flat_map(|(st, _)| st.containers.iter())
            .find(|c| c.id == id && !c.log_path.is_empty())
            .map(|c| c.log_path.clone())
            .or_else(|| g.made_containers.get(id).map(|(_, m)| m.log_path.clone()))
    }

    /// Marks pod `uid` as having a sandbox or container in the making until the guard is
    /// dropped: a relist that lists what it made before it is recorded waits for the record
    /// ([`PodCache::wait_made`], bounded) instead of asking the runtime what the worker is about
    /// to record (issue 14: PodSandboxStatus and ContainerStatus once per pod start).
    pub fn making(&self, uid: &str) -> Making {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .making
            .entry(uid.to_owned())
            .or_default() += 1;
        Making {
            cache: self.clone(),
            uid: uid.to_owned(),
        }
    }

    /// Waits until `recorded` holds (what the caller needs has been recorded) or no worker of
    /// pod `uid` is making a sandbox or a container, at most `max_wait`. Returns at once when
    /// either holds already. `recorded` may call this cache's methods.
    pub async fn wait_made(
        &self,
        uid: &str,
        max_wait: std::time::Duration,
        recorded: impl Fn(&PodCache) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let changed = self.1.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let making = self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .making
                .contains_key(uid);
            if !making || recorded(self) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return;
            }
        }
    }

    /// The IPs of sandbox `id` if its pod worker recorded them.
    pub fn sandbox_ips(&self, id: &str) -> Option<Vec<String>> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.sandbox_ips.get(id).map(|(_, ips)| ips.clone())
    }
}

/// The PLEG's handle on the pod cache, and the only one that writes runtime statuses: its
/// relist and containerd's events write directly, and pod workers hand what they read to it
/// through [`crate::pleg::feed::CacheFeed`], applied on the PLEG's task. Not `Clone`: the agent
/// moves it into the PLEG. Reads go through [`PodCache`] (`Deref`, or [`PodCacheWriter::reader`]).
#[derive(Default)]
pub struct PodCacheWriter(PodCache);

impl std::ops::Deref for PodCacheWriter {
    type Target = PodCache;
    fn deref(&self) -> &PodCache {
        &self.0
    }
}

impl PodCacheWriter {
    /// Another writing handle on the same cache, for unit tests that play the PLEG beside one.
    #[cfg(test)]
    pub(crate) fn another(&self) -> PodCacheWriter {
        PodCacheWriter(self.0.clone())
    }

    /// A reading handle on the same cache (cheap to clone; pod workers, probes, log rotation).
    pub fn reader(&self) -> PodCache {
        self.0.clone()
    }

    /// Records `status` of `uid` as read at `at`; an older write never replaces a newer one.
    pub fn set(&self, uid: &str, mut status: RuntimePodStatus, at: Instant) {
        {
            let mut g = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
            if g.pods.get(uid).is_some_and(|(_, t)| *t > at) {
                return;
            }
            apply_oom(&mut status, &g.oom_killed);
            g.pods.insert(uid.to_owned(), (Arc::new(status), at));
            g.unverified.remove(uid);
        }
        self.0 .1.changed.notify_waiters();
    }

    /// Records that a relist saw `uid` change but could not read its status: until a status is
    /// written for it, [`PodCache::get_newer_than`] answers with its entry only when that was
    /// read at or after the time asked, so that no sync acts on what was true before the change
    /// (say, a container not yet started, which would then be started twice).
    pub fn mark_unverified(&self, uid: &str) {
        self.0
             .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unverified
            .insert(uid.to_owned());
    }

    /// How a waiting pod worker asks the PLEG for a relist (the agent sets the PLEG's
    /// trigger). Without one, [`PodCache::wait_newer_than`] does not wait.
    pub fn set_relist_requester(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.0 .1.relist.set(f);
    }

    /// Records an OOM kill of `container_id`. Returns the UID of the pod whose held status
    /// changed (the container had already exited), so its worker can act on it.
    pub fn mark_oom_killed(&self, container_id: &str) -> Option<String> {
        let mut g = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        if g.oom_killed.len() >= MAX_OOM_KILLED {
            g.oom_killed.clear();
        }
        g.oom_killed.insert(container_id.to_owned());
        let oom = std::mem::take(&mut g.oom_killed);
        let mut changed = None;
        for (uid, (st, _)) in g.pods.iter_mut() {
            if st.containers.iter().any(|c| c.id == container_id) {
                let mut copy = (**st).clone();
                if apply_oom(&mut copy, &oom) {
                    *st = Arc::new(copy);
                    changed = Some(uid.clone());
                }
            }
        }
        g.oom_killed = oom;
        changed
    }

    /// Marks every entry as current at `at` (a relist found no other change).
    pub fn update_time(&self, at: Instant) {
        {
            let mut g = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
            if g.global.is_none_or(|t| t < at) {
                g.global = Some(at);
            }
        }
        self.0 .1.changed.notify_waiters();
    }

    /// Forgets a pod (and the OOM kills of its containers).
    pub fn delete(&self, uid: &str) {
        let mut g = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        g.sandbox_ips.retain(|_, (u, _)| u != uid);
        g.made_containers.retain(|_, (u, _)| u != uid);
        g.unverified.remove(uid);
        if let Some((st, _)) = g.pods.remove(uid) {
            for c in &st.containers {
                g.oom_killed.remove(&c.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_pod_whose_status_read_failed_is_not_vouched_for_by_later_relists() {
        let c = PodCacheWriter::default();
        let t0 = Instant::now();
        let (t1, t2, t3) = (
            t0 + Duration::from_millis(1),
            t0 + Duration::from_millis(2),
            t0 + Duration::from_millis(3),
        );
        c.set("a", RuntimePodStatus::default(), t0);
        c.update_time(t2);
        assert!(c.get_newer_than("a", t1).is_some(), "unchanged as of t2");
        c.mark_unverified("a");
        assert!(c.get_newer_than("a", t1).is_none(), "read at t0 only");
        assert_eq!(c.get_first("a").map(|(_, at)| at), Some(t0));
        c.set("a", RuntimePodStatus::default(), t3);
        c.update_time(t3 + Duration::from_millis(1));
        assert!(
            c.get_newer_than("a", t1).is_some(),
            "a status was written again"
        );
    }

    #[test]
    fn an_oom_kill_marks_the_exit_whether_it_comes_before_or_after_it() {
        use crate::container::{ContainerState, RuntimeContainer};
        let c = PodCacheWriter::default();
        let exited = |id: &str| RuntimePodStatus {
            containers: vec![RuntimeContainer {
                id: id.into(),
                state: Some(ContainerState::Exited),
                reason: "Completed".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        // Before: the exit written later shows OOMKilled.
        assert_eq!(c.mark_oom_killed("a"), None);
        c.set("u1", exited("a"), Instant::now());
        assert_eq!(c.latest("u1").unwrap().containers[0].reason, "OOMKilled");
        // After: the held status changes, and its pod is named.
        c.set("u2", exited("b"), Instant::now());
        assert_eq!(c.mark_oom_killed("b").as_deref(), Some("u2"));
        assert_eq!(c.latest("u2").unwrap().containers[0].reason, "OOMKilled");
        assert!(c.is_oom_killed("b"));
        c.delete("u2");
        assert!(!c.is_oom_killed("b"), "forgotten with its pod");
    }

    #[test]
    fn answers_only_with_statuses_newer_than_asked() {
        let c = PodCacheWriter::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        assert!(c.get_newer_than("a", t0).is_none());
        c.set("a", RuntimePodStatus::default(), t1);
        assert!(c.get_newer_than("a", t0).is_some());
        assert!(c.get_newer_than("a", t2).is_none(), "read before t2");
        c.update_time(t2);
        assert!(
            c.get_newer_than("a", t2).is_some(),
            "a relist at t2 saw no change"
        );
        // An older write does not replace a newer one.
        let mut newer = RuntimePodStatus::default();
        newer.sandboxes.push(Default::default());
        c.set("a", newer, t2);
        c.set("a", RuntimePodStatus::default(), t1);
        assert_eq!(c.get_newer_than("a", t2).unwrap().sandboxes.len(), 1);
        c.delete("a");
        assert!(c.get_newer_than("a", t0).is_none());
    }

    #[test]
    fn a_first_sync_reads_the_cache_once_a_relist_has_run() {
        let c = PodCacheWriter::default();
        assert!(c.get_first("new").is_none(), "no relist yet");
        let t0 = Instant::now();
        c.update_time(t0);
        let (st, at) = c.get_first("new").unwrap();
        assert!(
            st.sandboxes.is_empty() && at == t0,
            "nothing of it in the runtime"
        );
        let mut known = RuntimePodStatus::default();
        known.sandboxes.push(Default::default());
        c.set("old", known, t0 + Duration::from_secs(1));
        let (st, at) = c.get_first("old").unwrap();
        assert_eq!((st.sandboxes.len(), at), (1, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn what_workers_made_is_kept_per_container_name_and_forgotten_with_the_pod() {
        use crate::container::{ContainerState, RuntimeContainer};
        let c = PodCacheWriter::default();
        let made = |name: &str, log: &str| MadeContainer {
            name: name.into(),
            image_ref: Some("sha256:1".into()),
            log_path: log.into(),
        };
        c.remember_container("u1", "c1", made("a", "/l/a/0.log"));
        c.remember_container("u1", "c2", made("b", "/l/b/0.log"));
        assert_eq!(c.log_path("c1").as_deref(), Some("/l/a/0.log"));
        // A's next container replaces its record; b's stays.
        c.remember_container("u1", "c3", made("a", "/l/a/1.log"));
        assert_eq!(c.made_container("c1"), None);
        assert_eq!(c.log_path("c3").as_deref(), Some("/l/a/1.log"));
        assert!(c.made_container("c2").is_some());
        // A status read from the runtime is the first answer for a log path.
        c.set(
            "u2",
            RuntimePodStatus {
                containers: vec![RuntimeContainer {
                    id: "c9".into(),
                    state: Some(ContainerState::Running),
                    log_path: "/l/x/0.log".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            Instant::now(),
        );
        assert_eq!(c.log_path("c9").as_deref(), Some("/l/x/0.log"));
        assert_eq!(c.log_path("nope"), None);
        // Sandboxes: only the pod's newest is remembered.
        c.remember_sandbox_ips("u1", "s1", &["10.0.0.1".into()]);
        c.remember_sandbox_ips("u1", "s2", &["10.0.0.2".into()]);
        assert_eq!(c.sandbox_ips("s1"), None);
        c.delete("u1");
        assert_eq!(c.made_container("c2"), None);
        assert_eq!(c.sandbox_ips("s2"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_is_in_the_making_until_every_guard_is_dropped() {
        let c = PodCacheWriter::default();
        let (a, b) = (c.making("u1"), c.making("u1"));
        drop(a);
        let t0 = tokio::time::Instant::now();
        let waited = c.wait_made("u1", Duration::from_secs(5), |_| false);
        let released = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(b);
        };
        tokio::join!(waited, released);
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(30),
            "woken by the last drop"
        );
        let t1 = tokio::time::Instant::now();
        c.wait_made("u1", Duration::from_secs(5), |_| false).await;
        c.wait_made("u2", Duration::from_secs(5), |_| false).await;
        assert_eq!(t1.elapsed(), Duration::ZERO, "nothing in the making");
        // A worker that goes on making something else: the wait ends with the record it needs.
        let _still = c.making("u1");
        let waited = c.wait_made("u1", Duration::from_secs(5), |c| {
            c.sandbox_ips("s1").is_some()
        });
        let recorded = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            c.remember_sandbox_ips("u1", "s1", &[]);
        };
        tokio::join!(waited, recorded);
        assert_eq!(t1.elapsed(), Duration::from_millis(10));
    }
}
