//! Watching the static pod directory: inotify events (through `notify`) decide when the
//! [`FileSource`] lists again (`react`), a [`ListSchedule`] keeps the periodic listing and the
//! settle delay, and [`run`] is the file source's thread (kubelet's `file_linux.go`).

use std::path::Path;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver};
use notify::{EventKind, RecursiveMode, Watcher};

use super::{FileSource, REWATCH_INTERVAL, SETTLE};
use crate::metrics::Metrics;
use crate::source::mux::{SourceMsg, SourceSender};

/// True for names editors and tools give finished manifests (`.yaml`, `.yml`, `.json`): a write
/// to one is acted on at once; other names (temporary files of `sed -i`, editors' swap files) are
/// given [`SETTLE`] to be renamed or removed first.
fn has_manifest_extension(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// What to do about one inotify event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reaction {
    /// The watched path itself went away or was replaced: watch it again and re-list.
    Rewatch,
    /// A manifest was finished, renamed into place or removed: re-list now.
    Relist,
    /// Something else changed: re-list after [`SETTLE`].
    Settle,
    /// Reads and other noise.
    Ignore,
}

fn react(ev: &notify::Event, watched: &Path) -> Reaction {
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    let close_write = matches!(
        ev.kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
    );
    let renamed = matches!(ev.kind, EventKind::Modify(ModifyKind::Name(_)));
    let removed = matches!(ev.kind, EventKind::Remove(_));
    if ev.need_rescan() {
        // The kernel's inotify queue overflowed: events were lost, so list what is there now.
        return Reaction::Relist;
    }
    if (removed || renamed) && ev.paths.iter().any(|p| p == watched) {
        return Reaction::Rewatch;
    }
    // For a rename the destination (last path) is what will be listed.
    let finished_manifest = if renamed {
        ev.paths.last().is_some_and(|p| has_manifest_extension(p))
    } else {
        ev.paths.iter().all(|p| has_manifest_extension(p))
    };
    match ev.kind {
        _ if (close_write || renamed || removed) && finished_manifest => Reaction::Relist,
        _ if close_write => Reaction::Settle,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => Reaction::Settle,
        _ => Reaction::Ignore,
    }
}

/// When the directory is listed next: every `period`, and [`SETTLE`] after an event that may
/// be followed by more (the earliest such deadline wins). Times come from the caller's clock.
#[derive(Debug, Clone, Copy)]
pub struct ListSchedule {
    period: Duration,
    next_period: Instant,
    settle_at: Option<Instant>,
}

impl ListSchedule {
    /// A schedule whose first periodic listing is `period` after `now`.
    pub fn new(now: Instant, period: Duration) -> Self {
        Self {
            period,
            next_period: now + period,
            settle_at: None,
        }
    }

    /// An event that needs a listing once things settle, seen at `now`.
    pub fn settle(&mut self, now: Instant) {
        let due = now + SETTLE;
        self.settle_at = Some(self.settle_at.map_or(due, |t| t.min(due)));
    }

    /// A listing happened at `now`: the next is a period later, and no settle is pending.
    pub fn listed(&mut self, now: Instant) {
        self.settle_at = None;
        self.next_period = now + self.period;
    }

    /// True when a listing is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.settle_at.is_some_and(|t| t <= now) || self.next_period <= now
    }

    /// How long from `now` until the next listing is due.
    pub fn wait(&self, now: Instant) -> Duration {
        let next = self
            .settle_at
            .map_or(self.next_period, |t| t.min(self.next_period));
        next.saturating_duration_since(now)
    }
}

/// Bound of the queue from the inotify watcher to the file source's thread: the kernel's own
/// default bound of an inotify queue (`fs.inotify.max_queued_events`, 16384; a few MB of events
/// at most). No event may be dropped: the events tell the source which files are still being
/// written, and it reads them all before it lists (a file caught half-written would be reported
/// broken, then again once complete). So a watcher that finds the queue full waits (on
/// notify's own thread, never a tokio one) and the kernel's queue holds what comes meanwhile;
/// each wait is counted (`nodelet_channel_full_total{channel="manifest_dir_events"}`). Should
/// the kernel's queue overflow too, it says so and the directory is listed afresh (`react`).
/// A bound small enough to fill while a burst of files is written would let the source list
/// before it sees that burst's events: `tests/hostile_manifests.rs` (1,000 entries written at
/// once) shows the difference. The queue takes memory only for the events it holds
/// (`DirEventQueue`).
pub const DIR_EVENTS_CAPACITY: usize = 16384;

/// The bound of the watcher's queue, kept beside an unbounded channel: a bounded crossbeam
/// channel allocates and touches every slot when made (16384 slots of 72 bytes, 1.1 MiB of the
/// agent's RSS for a queue that is empty nearly always), the unbounded one grows and shrinks in
/// blocks of 31 events as they come and go.
///
/// One watcher thread offers ([`DirEventQueue::offer`]), the file source's thread reports what
/// it took ([`DirEventQueue::taken`]) and, when it stops, [`DirEventQueue::close`]s it.
struct DirEventQueue {
    backlog: std::sync::Mutex<Backlog>,
    room: std::sync::Condvar,
    capacity: usize,
}

/// What [`DirEventQueue`] guards: events sent and not yet taken, and whether the file source
/// has stopped.
#[derive(Default)]
struct Backlog {
    queued: usize,
    closed: bool,
}

impl DirEventQueue {
    fn new(capacity: usize) -> Self {
        Self {
            backlog: std::sync::Mutex::new(Backlog::default()),
            room: std::sync::Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Backlog> {
        // The guarded counts stay consistent whatever panicked while holding the lock.
        self.backlog
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Hands an inotify event to the file source's channel `tx` (the watcher's own thread calls
    /// this), waiting for room while `capacity` events are queued, which is counted once per
    /// wait. Returns false once the file source has stopped.
    fn offer(
        &self,
        tx: &crossbeam_channel::Sender<notify::Result<notify::Event>>,
        event: notify::Result<notify::Event>,
        metrics: &Metrics,
    ) -> bool {
        let mut backlog = self.lock();
        if backlog.queued >= self.capacity && !backlog.closed {
            metrics.channel_full("manifest_dir_events");
            while backlog.queued >= self.capacity && !backlog.closed {
                backlog = self
                    .room
                    .wait(backlog)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if backlog.closed {
            return false;
        }
        backlog.queued += 1;
        drop(backlog);
        tx.send(event).is_ok()
    }

    /// The file source took `n` events off the channel: room for as many.
    fn taken(&self, n: usize) {
        let mut backlog = self.lock();
        backlog.queued = backlog.queued.saturating_sub(n);
        drop(backlog);
        self.room.notify_all();
    }

    /// The file source stopped: a waiting watcher returns, later offers are refused.
    fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }
}

/// Closes the [`DirEventQueue`] when the file source's thread leaves [`run`], however it leaves.
struct CloseOnDrop(std::sync::Arc<DirEventQueue>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Runs the file source on the calling thread until `stop` fires: watches `dir`, re-lists on
/// changes and as [`ListSchedule`] says, and feeds `config`. When the directory disappears the
/// watch is dropped, the path is looked for every [`REWATCH_INTERVAL`], and it is watched and
/// listed again once it is back. Time comes from `clock`.
pub fn run(
    mut source: FileSource,
    period: Duration,
    config: SourceSender,
    stop: Receiver<()>,
    clock: crate::clock::SharedClock,
) {
    let (ev_tx, ev_rx) = crossbeam_channel::unbounded::<notify::Result<notify::Event>>();
    let queue = std::sync::Arc::new(DirEventQueue::new(DIR_EVENTS_CAPACITY));
    let _close = CloseOnDrop(queue.clone());
    let metrics = source.metrics.clone();
    let offers = queue.clone();
    let mut watcher = match notify::recommended_watcher(move |e| {
        let _ = offers.offer(&ev_tx, e, &metrics);
    }) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "inotify unavailable; relying on periodic listing");
            None
        }
    };
    let mut watching = false;
    let mut schedule = ListSchedule::new(clock.now(), period);
    let mut relist = true;
    loop {
        if !watching {
            if let Some(w) = watcher.as_mut() {
                let _ = w.unwatch(&source.dir);
                watching = w.watch(&source.dir, RecursiveMode::NonRecursive).is_ok();
                // Whatever was written while nothing watched is found by listing now.
                relist |= watching;
            }
        }
        if relist {
            if let Some(pods) = source.list_if_changed() {
                let changed = source.take_changed_objects();
                if !config.blocking_send(SourceMsg::Snapshot(pods)) {
                    return;
                }
                if !changed.is_empty() && !config.blocking_send(SourceMsg::ObjectsChanged(changed))
                {
                    return;
                }
            }
            relist = false;
            schedule.listed(clock.now());
            if source.take_unsettled() {
                schedule.settle(clock.now());
            }
            watching &= !source.dir_missing();
        }
        let mut wait = schedule.wait(clock.now());
        if !watching && watcher.is_some() {
            // The path is missing: look for it again soon rather than at the next period.
            wait = wait.min(REWATCH_INTERVAL);
        }
        select! {
            recv(stop) -> _ => return,
            recv(ev_rx) -> ev => {
                let Ok(first) = ev else { return };
                // With it, the events already queued: they tell which other files are still
                // being written before anything is listed.
                let mut took = 0;
                for ev in std::iter::once(first).chain(ev_rx.try_iter()) {
                    took += 1;
                    match ev {
                        Ok(ev) => {
                            source.observe(&ev);
                            match react(&ev, &source.dir) {
                                Reaction::Rewatch => {
                                    watching = false;
                                    relist = true;
                                }
                                Reaction::Relist => relist = true,
                                Reaction::Settle => schedule.settle(clock.now()),
                                Reaction::Ignore => {}
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "inotify error; re-watching");
                            watching = false;
                            relist = true;
                        }
                    }
                }
                queue.taken(took);
            }
            recv(clock.after(wait)) -> _ => relist = schedule.due(clock.now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_full_dir_events_queue_holds_its_bound_and_the_watcher_waits_counted() {
        let metrics = Metrics::new();
        let queue = std::sync::Arc::new(DirEventQueue::new(DIR_EVENTS_CAPACITY));
        let (tx, rx) = crossbeam_channel::unbounded();
        let any = || Ok(notify::Event::new(notify::EventKind::Any));
        for _ in 0..DIR_EVENTS_CAPACITY {
            assert!(queue.offer(&tx, any(), &metrics));
        }
        let waits = || -> u64 {
            metrics
                .encode()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("nodelet_channel_full_total{channel=\"manifest_dir_events\"} ")
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        // Until the watcher has counted a wait (it counts, then waits), to a deadline.
        let waited_more_than = |before: u64| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while waits() <= before {
                assert!(std::time::Instant::now() < deadline, "no wait counted");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let (q, m) = (queue.clone(), metrics.clone());
        let watcher = std::thread::spawn(move || (0..3).all(|_| q.offer(&tx, any(), &m)));
        waited_more_than(0);
        assert_eq!(rx.len(), DIR_EVENTS_CAPACITY, "the queue holds its bound");
        assert!(!watcher.is_finished(), "the watcher waits rather than drop");
        let mut received = 0;
        while received < DIR_EVENTS_CAPACITY + 3 {
            let event = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("every event arrives");
            assert!(event.is_ok(), "the event offered");
            received += 1;
            queue.taken(1);
        }
        assert!(watcher.join().unwrap());
        assert!(rx.is_empty(), "nothing more than was offered");
        let counted = waits();
        assert!((1..=3).contains(&counted), "each wait counted: {counted}");
        // A watcher waiting when the file source stops is let go, and told.
        let (tx, _rx) = crossbeam_channel::unbounded();
        let full = std::sync::Arc::new(DirEventQueue::new(1));
        assert!(full.offer(&tx, any(), &metrics));
        let (q, m) = (full.clone(), metrics.clone());
        let waiting = std::thread::spawn(move || q.offer(&tx, any(), &m));
        waited_more_than(counted);
        assert!(!waiting.is_finished(), "the watcher waits for room");
        drop(CloseOnDrop(full.clone()));
        assert!(!waiting.join().unwrap(), "a stopped source is told");
        let (tx, _rx) = crossbeam_channel::unbounded();
        assert!(!full.offer(&tx, any(), &metrics), "and later offers too");
    }

    #[test]
    fn events_are_acted_on_by_kind_and_name() {
        use notify::event::{
            AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind, RenameMode,
        };
        let dir = Path::new("/m");
        let ev = |kind, paths: &[&str]| notify::Event {
            kind,
            paths: paths.iter().map(PathBuf::from).collect(),
            attrs: Default::default(),
        };
        let close = EventKind::Access(AccessKind::Close(AccessMode::Write));
        assert_eq!(react(&ev(close, &["/m/a.yaml"]), dir), Reaction::Relist);
        assert_eq!(react(&ev(close, &["/m/sedX1b2"]), dir), Reaction::Settle);
        assert_eq!(
            react(
                &ev(EventKind::Create(CreateKind::File), &["/m/a.yaml"]),
                dir
            ),
            Reaction::Settle
        );
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        assert_eq!(
            react(&ev(rename, &["/m/.a.tmp", "/m/a.yaml"]), dir),
            Reaction::Relist
        );
        assert_eq!(
            react(&ev(EventKind::Remove(RemoveKind::Folder), &["/m"]), dir),
            Reaction::Rewatch
        );
        assert_eq!(
            react(
                &ev(EventKind::Access(AccessKind::Read), &["/m/a.yaml"]),
                dir
            ),
            Reaction::Ignore
        );
    }

    #[test]
    fn listings_come_each_period_and_a_settle_after_an_event() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = ListSchedule::new(t0, Duration::from_secs(20));
        assert!(!s.due(t0));
        assert_eq!(s.wait(t0), Duration::from_secs(20));
        // A temporary file appears: listed 200 ms later, not before.
        s.settle(t0 + ms(1000));
        assert_eq!(s.wait(t0 + ms(1000)), SETTLE);
        // More events meanwhile do not push the listing back.
        s.settle(t0 + ms(1100));
        assert!(!s.due(t0 + ms(1199)));
        assert!(s.due(t0 + ms(1200)));
        s.listed(t0 + ms(1200));
        assert!(!s.due(t0 + ms(1300)));
        assert_eq!(s.wait(t0 + ms(1200)), Duration::from_secs(20));
        assert!(
            s.due(t0 + ms(21_200)),
            "the period counts from the last listing"
        );
    }
}
