//! Eviction manager (kubelet's `pkg/kubelet/eviction`), in progress. Built and tested so far:
//! threshold parsing with kubelet's rules ([`threshold`]), the ranking of pods under pressure
//! ([`rank`]) and the cgroup v1 memory threshold notifier, eventfd + epoll ([`notifier`]). The
//! signals, the manager loop with grace and transition periods, node conditions and admission
//! are not built yet; nothing here is wired into the agent.

pub mod notifier;
pub mod rank;
pub mod threshold;
