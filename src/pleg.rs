//! Pod lifecycle event generator (kubelet's `pkg/kubelet/pleg`): the events the sync loop reacts
//! to when a container changes state in the runtime.
//!
//! The skeleton defines the event and its channel; the relist and the containerd event stream
//! that produce events arrive with the PLEG issue. Until then pods in motion are re-synced by
//! their workers ([`crate::podworkers::Requeue::Soon`]) and every pod every `syncFrequency`.

/// Capacity of the PLEG channel (kubelet's `plegChannelCapacity`); events beyond it are dropped.
pub const CHANNEL_CAPACITY: usize = 1000;

/// What happened to a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLifecycleEventType {
    /// A container started running.
    ContainerStarted,
    /// A container exited.
    ContainerDied,
    /// A container was removed.
    ContainerRemoved,
    /// A container changed state otherwise.
    ContainerChanged,
}

/// One event about one pod (kubelet's `PodLifecycleEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Pod UID.
    pub uid: String,
    /// Event type.
    pub kind: PodLifecycleEventType,
    /// Container ID concerned.
    pub container_id: String,
}
