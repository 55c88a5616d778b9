//! Memory threshold notifier (kubelet's `memoryThresholdNotifier` with the cgroup v1
//! `linuxCgroupNotifier`): the kernel wakes us the moment a memory cgroup's usage crosses a
//! threshold, instead of waiting for the next periodic check.
//!
//! For each threshold an eventfd is registered by writing `"<eventfd> <usage fd> <bytes>"` to the
//! cgroup's `cgroup.event_control`, with `memory.usage_in_bytes` as the usage file. One thread
//! waits in `epoll_wait` on every eventfd and sends the crossed threshold's key on a crossbeam
//! channel. kubelet's threshold is `capacity - eviction threshold + inactive_file`; the caller
//! re-arms a threshold as inactive_file moves by registering the same key again, which replaces
//! (and closes) the previous eventfd.
//!
//! cgroup v2 has no usage threshold notification (and kubelet has no notifier there). On a v2
//! host nodelet wakes on the kubepods cgroup's `memory.pressure` PSI trigger (`some <stall µs>
//! <window µs>`, polled for `EPOLLPRI`) and on changes of its `memory.events` (the `high` and
//! `max` counters; kernfs files signal `EPOLLPRI` when modified). Both go into the same epoll set.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// Bound of the wake channel (notifier → eviction manager). One pending wake-up is enough for
/// the eviction manager to run a pass that reads every signal afresh, so a wake-up that finds
/// the channel full is coalesced with those waiting and counted
/// (`nodelet_channel_full_total{channel="eviction_wake"}`).
pub const WAKE_CAPACITY: usize = 64;

/// A notifier that could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("memory threshold notifier for {cgroup}: {message}")]
pub struct NotifierError {
    /// The memory cgroup directory.
    pub cgroup: PathBuf,
    /// What failed.
    pub message: String,
}

enum Registration {
    /// cgroup v1: the eventfd, and the usage file the kernel watches through it.
    Threshold { eventfd: EventFd, _usage: File },
    /// cgroup v2: a PSI trigger; nothing to read, the trigger lives while the file is open.
    Psi(File),
    /// cgroup v2: a kernfs file (`memory.events`) read again after each change.
    Events(File),
}

impl Registration {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Self::Threshold { eventfd, .. } => eventfd.as_fd(),
            Self::Psi(f) | Self::Events(f) => f.as_fd(),
        }
    }

    /// Acknowledges a wake-up so that the next one is reported.
    fn reset(&self) {
        match self {
            Self::Threshold { eventfd, .. } => {
                let _ = eventfd.read();
            }
            Self::Psi(_) => {}
            Self::Events(f) => {
                use std::io::{Read, Seek};
                let mut f = f;
                let mut buf = [0u8; 512];
                let _ = f.seek(std::io::SeekFrom::Start(0));
                let _ = f.read(&mut buf);
            }
        }
    }
}

/// The trigger line written to a PSI file: wake when tasks stall on memory for `stall` in any
/// `window` (kernel `Documentation/accounting/psi.rst`; windows from 500ms to 10s). It ends in
/// a newline: the kernel's `/proc/pressure/*` files drop the last byte written (kernel 6.1
/// `psi_write`), so a line without one loses its window's last digit and is refused.
pub fn psi_trigger(stall: Duration, window: Duration) -> String {
    format!("some {} {}\n", stall.as_micros(), window.as_micros())
}

/// Registered thresholds and the epoll set that waits on them.
pub struct MemcgNotifier {
    epoll: Epoll,
    registrations: Mutex<HashMap<u64, (String, Registration)>>,
    next_token: Mutex<u64>,
}

impl MemcgNotifier {
    /// An empty notifier.
    ///
    /// Errors: the epoll instance cannot be created.
    pub fn new() -> Result<Arc<Self>, NotifierError> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| NotifierError {
            cgroup: PathBuf::new(),
            message: format!("epoll_create: {e}"),
        })?;
        Ok(Arc::new(Self {
            epoll,
            registrations: Mutex::new(HashMap::new()),
            next_token: Mutex::new(1),
        }))
    }

    fn add(&self, key: &str, reg: Registration, events: EpollFlags) -> Result<(), String> {
        let mut regs = self.registrations.lock().unwrap_or_else(|e| e.into_inner());
        // Re-arming: the previous registration under this key goes (closing its fd ends it).
        let old: Vec<u64> = regs
            .iter()
            .filter(|(_, (k, _))| k == key)
            .map(|(t, _)| *t)
            .collect();
        for t in old {
            if let Some((_, r)) = regs.remove(&t) {
                let _ = self.epoll.delete(r.fd());
            }
        }
        let token = {
            let mut t = self.next_token.lock().unwrap_or_else(|e| e.into_inner());
            *t += 1;
            *t
        };
        self.epoll
            .add(reg.fd(), EpollEvent::new(events, token))
            .map_err(|e| format!("epoll_ctl: {e}"))?;
        regs.insert(token, (key.to_owned(), reg));
        Ok(())
    }

    /// Number of live registrations.
    pub fn len(&self) -> usize {
        self.registrations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// cgroup v2: registers a PSI trigger ([`psi_trigger`]) on `pressure_file` (a cgroup's
    /// `memory.pressure`, or `/proc/pressure/memory`), replacing any registration under `key`.
    ///
    /// Errors: the file cannot be opened or refuses the trigger (no PSI in this kernel).
    pub fn register_psi(
        &self,
        key: &str,
        pressure_file: &Path,
        stall: Duration,
        window: Duration,
    ) -> Result<(), NotifierError> {
        use std::io::Write;
        let err = |message: String| NotifierError {
            cgroup: pressure_file.to_owned(),
            message,
        };
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(pressure_file)
            .map_err(|e| err(format!("open: {e}")))?;
        f.write_all(psi_trigger(stall, window).as_bytes())
            .map_err(|e| err(format!("write trigger: {e}")))?;
        self.add(key, Registration::Psi(f), EpollFlags::EPOLLPRI)
            .map_err(err)
    }

    /// cgroup v2: wakes whenever `events_file` (a cgroup's `memory.events`) changes, replacing
    /// any registration under `key`.
    ///
    /// Errors: the file cannot be opened or polled.
    pub fn register_events(&self, key: &str, events_file: &Path) -> Result<(), NotifierError> {
        let err = |message: String| NotifierError {
            cgroup: events_file.to_owned(),
            message,
        };
        let f = File::open(events_file).map_err(|e| err(format!("open: {e}")))?;
        let reg = Registration::Events(f);
        reg.reset();
        self.add(key, reg, EpollFlags::EPOLLPRI).map_err(err)
    }

    /// Registers a wake-up when `memory.usage_in_bytes` of the memory cgroup directory `cgroup`
    /// crosses `threshold_bytes`; `key` names it in notifications (e.g. the signal). A previous
    /// registration under the same key is replaced.
    ///
    /// Errors: the cgroup files cannot be opened or written (not a v1 memory cgroup).
    pub fn register(
        &self,
        key: &str,
        cgroup: &Path,
        threshold_bytes: u64,
    ) -> Result<(), NotifierError> {
        let err = |message: String| NotifierError {
            cgroup: cgroup.to_owned(),
            message,
        };
        let usage = File::open(cgroup.join("memory.usage_in_bytes"))
            .map_err(|e| err(format!("open memory.usage_in_bytes: {e}")))?;
        let eventfd =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(|e| err(format!("eventfd: {e}")))?;
        let line = format!(
            "{} {} {threshold_bytes}",
            eventfd.as_raw_fd(),
            usage.as_raw_fd()
        );
        std::fs::write(cgroup.join("cgroup.event_control"), line)
            .map_err(|e| err(format!("write cgroup.event_control: {e}")))?;
        self.add(
            key,
            Registration::Threshold {
                eventfd,
                _usage: usage,
            },
            EpollFlags::EPOLLIN,
        )
        .map_err(err)
    }

    /// Waits up to `timeout` and returns the keys of the thresholds crossed meanwhile.
    pub fn wait(&self, timeout: Duration) -> Vec<String> {
        let mut events = [EpollEvent::empty(); 16];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let n = self
            .epoll
            .wait(&mut events, EpollTimeout::from(ms))
            .unwrap_or(0);
        let regs = self.registrations.lock().unwrap_or_else(|e| e.into_inner());
        events[..n]
            .iter()
            .filter_map(|ev| regs.get(&ev.data()))
            .map(|(key, r)| {
                // Acknowledge so the next crossing wakes us again.
                r.reset();
                key.clone()
            })
            .collect()
    }

    /// Runs the wait loop on a thread of its own, offering each wake-up's wall time and crossed
    /// key on `tx` until the receiver is dropped. A wake-up that finds `tx` full (see
    /// [`WAKE_CAPACITY`]) is coalesced with those waiting: `full` is called (the agent counts
    /// `nodelet_channel_full_total{channel="eviction_wake"}`) and the notifier waits on.
    pub fn spawn(
        self: Arc<Self>,
        tx: crossbeam_channel::Sender<(std::time::SystemTime, String)>,
        full: Box<dyn Fn() + Send>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name("memcg-notifier".into())
            .spawn(move || loop {
                let keys = self.wait(Duration::from_secs(1));
                let at = crate::clock::wall_now();
                for key in keys {
                    match tx.try_send((at, key)) {
                        Ok(()) => {}
                        Err(crossbeam_channel::TrySendError::Full(_)) => full(),
                        Err(crossbeam_channel::TrySendError::Disconnected(_)) => return,
                    }
                }
            })
            .expect("spawning the notifier thread at start-up")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this machine's cgroup v1 memory hierarchy: a process that grows past the threshold
    /// wakes the notifier within a second.
    #[test]
    fn a_memory_cgroup_crossing_its_threshold_wakes_the_notifier() {
        let mem = Path::new("/sys/fs/cgroup/memory");
        if !mem.join("cgroup.event_control").exists() {
            eprintln!(
                "no cgroup v1 memory hierarchy here; the notifier is tested where there is one"
            );
            return;
        }
        let cg = mem.join(format!("nodelet-notifier-test-{}", std::process::id()));
        std::fs::create_dir_all(&cg).unwrap();
        let n = MemcgNotifier::new().unwrap();
        n.register("memory.available", &cg, 16 << 20).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(WAKE_CAPACITY);
        let _t = n.clone().spawn(tx, Box::new(|| {}));
        // A shell that joins the cgroup, then holds ~64 MiB in memory for a moment.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && head -c 64m /dev/zero | tail > /dev/null",
                cg.display()
            ))
            .spawn()
            .unwrap();
        let got = rx.recv_timeout(Duration::from_secs(10)).map(|(_, k)| k);
        let _ = child.wait();
        // Re-arming under the same key replaces the registration.
        n.register("memory.available", &cg, 32 << 20).unwrap();
        assert_eq!(n.len(), 1);
        let _ = std::fs::remove_dir(&cg);
        assert_eq!(got.as_deref(), Ok("memory.available"));
    }

    /// The cgroup v2 path, as far as this machine allows: its v2 hierarchy has no memory
    /// controller and its kernel refuses PSI triggers (EINVAL), so the kernfs change wake-up is
    /// tested on a v2 cgroup's `cgroup.events` (the same mechanism as `memory.events`), and the
    /// PSI trigger's format and its refusal are checked.
    #[test]
    fn cgroup_v2_file_changes_wake_the_notifier_and_psi_triggers_are_formatted() {
        assert_eq!(
            psi_trigger(Duration::from_millis(100), Duration::from_secs(1)),
            "some 100000 1000000\n"
        );
        let n = MemcgNotifier::new().unwrap();
        if let Err(e) = n.register_psi(
            "psi",
            Path::new("/proc/pressure/memory"),
            Duration::from_millis(100),
            Duration::from_secs(1),
        ) {
            assert_eq!(e.cgroup, Path::new("/proc/pressure/memory"), "{e}");
        }
        assert!(n
            .register_events("events", Path::new("/no/such/memory.events"))
            .is_err());
        let unified = Path::new("/sys/fs/cgroup/unified");
        if !unified.join("cgroup.procs").exists() {
            eprintln!("no cgroup v2 hierarchy here");
            return;
        }
        let cg = unified.join(format!("nodelet-notifier-v2-test-{}", std::process::id()));
        std::fs::create_dir_all(&cg).unwrap();
        n.register_events("events", &cg.join("cgroup.events"))
            .unwrap();
        n.register_events("events", &cg.join("cgroup.events"))
            .unwrap();
        assert!(n.len() <= 2, "re-registering replaces");
        assert!(
            n.wait(Duration::from_millis(50)).is_empty(),
            "quiet until it changes"
        );
        // The channel holds its bound: with one slot, already taken, the wake-up is coalesced
        // and counted rather than queued.
        let (tx, rx) = crossbeam_channel::bounded(1);
        tx.send((crate::clock::wall_now(), "earlier".to_owned()))
            .unwrap();
        let full = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = full.clone();
        let _t = n.clone().spawn(
            tx,
            Box::new(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        );
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && sleep 0.3",
                cg.display()
            ))
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while full.load(std::sync::atomic::Ordering::SeqCst) == 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.wait();
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::fs::remove_dir(&cg);
        assert!(
            full.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "counted"
        );
        assert_eq!(rx.try_recv().map(|(_, k)| k).as_deref(), Ok("earlier"));
        assert!(rx.is_empty(), "nothing queued beyond the bound");
    }
}
