//! Eviction manager (kubelet's `pkg/kubelet/eviction`), in progress: the pieces that are pure
//! and tested so far — threshold parsing with kubelet's rules ([`threshold`]) and the ranking of
//! pods under pressure ([`rank`]). The signals, the memcg eventfd/epoll notifier, the manager loop
//! with grace and transition periods, node conditions and admission are not built yet; nothing
//! here is wired into the agent.

pub mod rank;
pub mod threshold;
