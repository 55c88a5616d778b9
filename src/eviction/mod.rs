//! Eviction manager (kubelet's `pkg/kubelet/eviction`), in progress. Built and tested so far:
//! threshold parsing with kubelet's rules ([`threshold`]), the memory and pid signals
//! ([`signals`]), thresholds and node conditions over time with grace and transition periods
//! ([`state`]), the ranking of pods under pressure ([`rank`]) and the cgroup v1 memory threshold
//! notifier, eventfd + epoll ([`notifier`]). The manager loop that ties them to the pod workers
//! (kill, Failed/Evicted status), the disk signals and admission are not built yet; nothing here
//! is wired into the agent.

pub mod notifier;
pub mod rank;
pub mod signals;
pub mod state;
pub mod threshold;
