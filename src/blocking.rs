//! File-system work off the runtime's thread.
//!
//! The agent's tokio runtime has one worker thread ([`crate::agent`]): every pod worker, probe,
//! CRI call and HTTP request is a task on it. The pod workers' file-system steps (the pod's
//! cgroup, its volumes, its sandbox's and containers' log directories, a container's
//! termination-message and hosts files and its subPath mounts) and the QoS cgroups' periodic update run on tokio's
//! blocking pool through [`run`], so a slow or hung file system (an NFS `hostPath`, a cgroup
//! file system under load) holds the pods that touch it and never `/healthz`, the node API,
//! the probes or the running pods' status; other pods' starts go on while fewer than
//! [`MAX_THREADS`] steps wait on it. kubelet gets the same from Go, whose scheduler moves a
//! goroutine blocked in a system call off its thread. A gone pod's directory removal,
//! housekeeping's sweeps, the log rotation's sizes, removals and renames
//! ([`crate::kuberuntime::logs`]) and an exited container's termination message
//! ([`crate::kuberuntime::termination_message`], read in the pod's status) run on the same
//! pool, as do tokio's file reads (the node API's and the command line's container logs); what
//! stays on the runtime's thread is the node API's reading of cgroup statistics.
//!
//! Why one worker: a second worker thread costs the agent CPU (the two threads parking, waking
//! and stealing each other's tasks) for nothing a node needs: the pod workers' own CPU work is
//! small and a burst of pod starts is bound by the runtime (containerd), not by the agent
//! (benches/README.md, "CPU per pod start").

/// Threads of tokio's blocking pool (tokio's default is 512). Unbounded, a burst of 110 pod
/// starts grew the pool to about 45 threads, each a stack and a thread for the kernel to
/// schedule; with 8 the burst started as fast (benches/README.md). More file-system steps than
/// this wait in the pool's queue: on a hung file system, once this many wait on it, other
/// pods' file-system steps wait too, while the runtime's thread (probes, `/healthz`, the node
/// API, the running pods' status) goes on.
pub const MAX_THREADS: usize = 8;

/// Runs `f` on tokio's blocking pool and returns its value; the calling task waits without
/// holding the runtime's thread.
///
/// A panic in `f` is raised again in the caller, so a pod worker's panic handling
/// ([`crate::crash`]) sees it as its own. When the runtime is shutting down (the blocking task
/// was cancelled before it ran) the caller never resumes: the runtime drops it.
pub async fn run<T, F>(f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    #[cfg(test)]
    handoffs::count();
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => std::future::pending().await,
    }
}

/// Hand-offs counted per task, for tests that hold how many a piece of work makes (each costs
/// the agent about 80 µs of CPU: benches/README.md, "CPU per pod start").
#[cfg(test)]
pub(crate) mod handoffs {
    use std::cell::Cell;

    tokio::task_local! {
        static COUNT: Cell<usize>;
    }

    pub(super) fn count() {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
    }

    /// Runs `work` and returns its value with the number of [`super::run`] calls it made
    /// (on its own task; not those of tasks it spawned).
    pub(crate) async fn counted<T>(work: impl std::future::Future<Output = T>) -> (T, usize) {
        COUNT
            .scope(Cell::new(0), async {
                let v = work.await;
                (v, COUNT.with(Cell::get))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_work_runs_on_another_thread_and_its_value_comes_back() {
        let here = std::thread::current().id();
        let (value, there) = run(|| (7, std::thread::current().id())).await;
        assert_eq!(value, 7);
        assert_ne!(here, there, "the work ran on the runtime's own thread");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_the_work_is_the_callers() {
        let caught = tokio::spawn(run(|| -> u8 { panic!("cgroup file system gone") })).await;
        let panic = caught.expect_err("the panic came back").into_panic();
        assert_eq!(
            panic.downcast_ref::<&str>().copied(),
            Some("cgroup file system gone")
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_call_does_not_hold_the_runtime() {
        // The runtime has one thread; a call blocked on the pool leaves it free for others.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let blocked = tokio::spawn(run(move || wait.recv().is_ok()));
        let other = tokio::spawn(async { 42 }).await.expect("ran");
        assert_eq!(other, 42);
        release.send(()).expect("still waiting");
        assert!(blocked.await.expect("returned"));
    }
}
