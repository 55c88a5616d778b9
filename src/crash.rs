//! Panics: reported through the log, and survived where the work belongs to one pod.
//!
//! kubelet's pod worker goroutine defers `runtime.HandleCrash` (`pod_workers.go`), which logs
//! the panic and then, by default, raises it again: the whole kubelet exits and systemd starts it
//! anew, every pod's work interrupted for one pod's fault. nodelet keeps the rest running instead:
//! [`catch`] turns a panic in a pod's sync into a [`Panic`] the pod worker
//! reports and retries after its back-off (see [`crate::podworkers`]), and [`install_hook`] makes
//! every panic one structured `ERROR` line (thread, location, message) instead of the standard
//! library's text on stderr. The release profile unwinds (no `panic = "abort"`), so this holds in
//! the shipped binary.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;

/// A caught panic: its message (the `&str` or `String` payload; other payloads read "a panic
/// with a non-text payload").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Panic(pub String);

impl std::fmt::Display for Panic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "panic: {}", self.0)
    }
}

/// The message of a panic payload.
fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}

/// Runs `work` to completion, returning `Err` with the panic's message if it panicked.
///
/// Whatever state `work` shared is seen by later work as the panic left it (the caller asserts
/// unwind safety): the pod workers' syncs keep no invariant across an await that a retry does not
/// rebuild, as kubelet's syncs do not.
pub async fn catch<F: Future>(work: F) -> Result<F::Output, Panic> {
    AssertUnwindSafe(work)
        .catch_unwind()
        .await
        .map_err(|p| Panic(message(p.as_ref())))
}

/// Replaces the standard library's panic hook with one that logs the panic at `ERROR` through
/// `tracing` (fields `thread`, `location`, `panic`; a backtrace when `RUST_BACKTRACE` asks for
/// one). Call once, after the subscriber is installed.
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        let backtrace = match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => backtrace.to_string(),
            _ => String::new(),
        };
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            location,
            panic = message(info.payload()),
            backtrace,
            "panicked"
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_caught_with_its_message_and_a_value_passes_through() {
        assert_eq!(catch(async { 7 }).await, Ok(7));
        let r = catch(async { panic!("boom {}", 1) }).await;
        assert_eq!(r, Err(Panic("boom 1".into())));
        let r: Result<(), Panic> = catch(async { std::panic::panic_any(5_u8) }).await;
        assert_eq!(
            r.unwrap_err().to_string(),
            "panic: a panic with a non-text payload"
        );
    }
}
