//! Memory threshold notifier (kubelet's `memoryThresholdNotifier` with the cgroup v1
//! `linuxCgroupNotifier`): the kernel wakes us the moment a memory cgroup's usage crosses a
//! threshold, instead of waiting for the next periodic check.
//!
//! For each threshold an eventfd is registered by writing `"<eventfd> <usage fd> <bytes>"` to the
//! cgroup's `cgroup.event_control`, with `memory.usage_in_bytes` as the usage file. One thread
//! waits in `epoll_wait` on every eventfd and sends the crossed threshold's key on a crossbeam
//! channel. kubelet's threshold is `capacity - eviction threshold + inactive_file`; the caller
//! re-arms (replaces) a threshold as inactive_file moves.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A notifier that could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("memory threshold notifier for {cgroup}: {message}")]
pub struct NotifierError {
    /// The memory cgroup directory.
    pub cgroup: PathBuf,
    /// What failed.
    pub message: String,
}

struct Registration {
    eventfd: EventFd,
    // Kept open: the kernel watches usage through it.
    _usage: File,
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

    /// Registers a wake-up when `memory.usage_in_bytes` of the memory cgroup directory `cgroup`
    /// crosses `threshold_bytes`; `key` names it in notifications (e.g. the signal).
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
        let token = {
            let mut t = self.next_token.lock().unwrap_or_else(|e| e.into_inner());
            *t += 1;
            *t
        };
        self.epoll
            .add(&eventfd, EpollEvent::new(EpollFlags::EPOLLIN, token))
            .map_err(|e| err(format!("epoll_ctl: {e}")))?;
        self.registrations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                token,
                (
                    key.to_owned(),
                    Registration {
                        eventfd,
                        _usage: usage,
                    },
                ),
            );
        Ok(())
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
                // Reset the counter so the next crossing wakes us again.
                let _ = r.eventfd.read();
                key.clone()
            })
            .collect()
    }

    /// Runs the wait loop on a thread of its own, sending crossed keys on `tx` until the
    /// receiver is dropped.
    pub fn spawn(
        self: Arc<Self>,
        tx: crossbeam_channel::Sender<String>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name("memcg-notifier".into())
            .spawn(move || loop {
                for key in self.wait(Duration::from_secs(1)) {
                    if tx.send(key).is_err() {
                        return;
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
        let (tx, rx) = crossbeam_channel::unbounded();
        let _t = n.clone().spawn(tx);
        // A shell that joins the cgroup, then holds ~64 MiB in memory for a moment.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && head -c 64m /dev/zero | tail > /dev/null",
                cg.display()
            ))
            .spawn()
            .unwrap();
        let got = rx.recv_timeout(Duration::from_secs(10));
        let _ = child.wait();
        let _ = std::fs::remove_dir(&cg);
        assert_eq!(got.as_deref(), Ok("memory.available"));
    }
}
