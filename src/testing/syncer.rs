//! A recording pod syncer for the pod worker and sync loop tests: each call is recorded as
//! `sync <name>`, `kill <name> <grace>` or `kill <name> <grace> <reason>: <message>` for a kill
//! with a failure (`<name>` is `metadata.name`, else the UID); a gated
//! syncer makes each call wait for a permit, so a test can hold work in progress; after
//! [`RecordingSyncer::panic_next`] the next sync is recorded and then panics, and the
//! [`PodSyncer::sync_panicked`] reports are kept as `panicked <name>: <message>` calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use crate::podworkers::{KillPodOptions, PodSyncer, Requeue};

/// The recording syncer.
pub struct RecordingSyncer {
    calls: Mutex<Vec<String>>,
    gate: Option<tokio::sync::Semaphore>,
    panic_next: AtomicBool,
    held: Mutex<Vec<String>>,
}

impl RecordingSyncer {
    /// Calls go through at once.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            gate: None,
            panic_next: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Each call waits for a permit from [`RecordingSyncer::release`].
    pub fn gated() -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            gate: Some(tokio::sync::Semaphore::new(0)),
            panic_next: AtomicBool::new(false),
            held: Mutex::new(Vec::new()),
        })
    }

    /// Lets `n` more calls through.
    pub fn release(&self, n: usize) {
        if let Some(g) = &self.gate {
            g.add_permits(n);
        }
    }

    /// Makes the next sync panic (after it is recorded).
    pub fn panic_next(&self) {
        self.panic_next.store(true, Ordering::SeqCst);
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The UIDs of the pods whose syncs were held ([`PodSyncer::sync_held`]), in order.
    pub fn held(&self) -> Vec<String> {
        self.held.lock().unwrap().clone()
    }

    /// Forgets the calls so far.
    pub fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    async fn pass(&self) {
        if let Some(g) = &self.gate {
            g.acquire().await.unwrap().forget();
        }
    }
}

fn name(pod: &Pod) -> String {
    pod.metadata
        .name
        .clone()
        .unwrap_or_else(|| crate::pod::pod_uid(pod).to_owned())
}

impl PodSyncer for RecordingSyncer {
    type Error = std::convert::Infallible;

    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Requeue, Self::Error> {
        self.pass().await;
        self.calls
            .lock()
            .unwrap()
            .push(format!("sync {}", name(&pod)));
        if self.panic_next.swap(false, Ordering::SeqCst) {
            panic!("injected panic in the sync of {}", name(&pod));
        }
        Ok(Requeue::Normal)
    }

    fn sync_held(&self, pod: &Arc<Pod>) {
        self.held
            .lock()
            .unwrap()
            .push(crate::pod::pod_uid(pod).to_owned());
    }

    fn sync_panicked(&self, pod: &Pod, message: &str) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("panicked {}: {message}", name(pod)));
    }

    async fn terminate_pod(&self, pod: Arc<Pod>, opts: KillPodOptions) -> Result<(), Self::Error> {
        self.pass().await;
        let what = match (&opts.grace, &opts.failure) {
            (_, Some(f)) => format!(
                "kill {} {:?} {}: {}",
                name(&pod),
                opts.grace,
                f.reason,
                f.message
            ),
            (g, None) => format!("kill {} {g:?}", name(&pod)),
        };
        self.calls.lock().unwrap().push(what);
        Ok(())
    }
}
