//! Work that may wait long on the kernel or on another process, run off the async runtime's
//! worker thread.
//!
//! The agent's tokio runtime has one worker thread ([`crate::agent::run`]): the pod workers,
//! the PLEG, the probes, the CRI client and the HTTP servers all take turns on it, so a call that
//! waits there holds every one of them. kubelet needs no rule for this (Go's scheduler moves a
//! goroutine blocked in a system call off its thread by itself); nodelet's is:
//!
//! - **on the blocking pool** ([`run`]): what can wait for much longer than it works: the pod
//!   cgroup with the systemd driver (a D-Bus job, then waiting for systemd to make it), volume
//!   set-up (mounts, the objects' files), a pod's directory and cgroup removal (the kernel
//!   reclaims its page cache, waiting for writeback), housekeeping's sweeps, log rotation's
//!   renames, the minutely QoS resync;
//! - **on the worker**: a pod start's few small file operations on the node's own file systems
//!   (cgroupfs `mkdir` and value writes, the pod's and the container's directories, the
//!   termination message file, `etc-hosts`: tens of microseconds each). Handing those to the
//!   pool cost more than the second worker thread saved: with the pod cgroup, the sandbox's log
//!   directory and each container's files handed over (four hand-offs a pod), a standalone agent
//!   starting 110 pods took 3.02 ms of CPU a pod (median of four rounds) against 2.71 doing them
//!   itself, each hand-off waking a pool thread and then the worker (2026-12-05).

/// Runs `work` on tokio's blocking pool inside the caller's tracing span and returns its value.
///
/// A panic in `work` is raised again in the caller, so a pod worker's supervision
/// ([`crate::crash::catch`]) sees it as a panic of its own sync (the panic hook has logged it
/// once, on the pool's thread, within the same span).
///
/// Panics: as `work` does; also if the runtime shuts down before `work` began (the caller is
/// being dropped then).
pub async fn run<T, F>(work: F) -> T
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(work)).await {
        Ok(v) => v,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => panic!("blocking work did not run: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// One worker thread, as the agent's runtime.
    fn one_worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn blocking_work_leaves_the_worker_free_for_other_tasks() {
        // The blocking work waits for a message that only another task on the one worker
        // sends: were it run on the worker, that task could not run and the wait would time out.
        one_worker().block_on(async {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let waiter = tokio::spawn(run(move || rx.recv_timeout(Duration::from_secs(10))));
            tokio::spawn(async move { tx.send(()).unwrap() });
            assert_eq!(waiter.await.unwrap(), Ok(()));
        });
    }

    #[test]
    fn the_value_comes_back_and_a_panic_reaches_the_caller() {
        one_worker().block_on(async {
            let worker = std::thread::current().id();
            let (v, thread) = run(|| (7, std::thread::current().id())).await;
            assert_eq!(v, 7);
            assert_ne!(thread, worker, "ran on the blocking pool");
            let caught = crate::crash::catch(run(|| -> u8 { panic!("disk gone {}", 1) })).await;
            assert_eq!(caught, Err(crate::crash::Panic("disk gone 1".into())));
        });
    }
}
