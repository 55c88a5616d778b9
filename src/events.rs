//! Event recorder: what kubelet would post as Events to the API server, kept in memory here
//! (newest last, at most [`MAX_EVENTS`]) and served at `GET /events`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// How many events are kept; older ones are dropped first.
pub const MAX_EVENTS: usize = 1000;

/// Longest message kept, bytes (as client-go's event recorder truncates); a longer one is cut
/// at a character boundary and ends with `...`.
pub const MAX_MESSAGE_BYTES: usize = 1024;

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s.shrink_to_fit();
    s
}

/// One event, shaped like a core/v1 Event's main fields.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// CamelCase reason, e.g. `InvalidManifest`, `Started`.
    pub reason: String,
    /// What the event is about: `pod/<namespace>/<name>` or `file:<path>`.
    pub involved_object: String,
    /// Human-readable message.
    pub message: String,
    /// RFC 3339 time of the event.
    pub time: String,
}

/// A shared, bounded event log.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<VecDeque<Event>>>);

impl Recorder {
    /// Records a `Normal` event.
    pub fn normal(&self, object: impl Into<String>, reason: &str, message: impl Into<String>) {
        self.push("Normal", object.into(), reason, message.into());
    }

    /// Records a `Warning` event.
    pub fn warning(&self, object: impl Into<String>, reason: &str, message: impl Into<String>) {
        self.push("Warning", object.into(), reason, message.into());
    }

    fn push(&self, type_: &'static str, involved_object: String, reason: &str, message: String) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            involved_object: truncate(involved_object),
            message: truncate(message),
            time: crate::pod::now_rfc3339(),
        };
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == MAX_EVENTS {
            q.pop_front();
        }
        q.push_back(ev);
    }

    /// A copy of the events, oldest first.
    pub fn list(&self) -> Vec<Event> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_events() {
        let r = Recorder::default();
        for i in 0..MAX_EVENTS + 5 {
            r.warning("file/x", "InvalidManifest", format!("{i}"));
        }
        let l = r.list();
        assert_eq!(l.len(), MAX_EVENTS);
        assert_eq!(l[0].message, "5");
        assert_eq!(l.last().unwrap().type_, "Warning");
        r.warning("file/x", "DecodeError", "é".repeat(3000));
        let m = r.list().last().unwrap().message.clone();
        assert!(
            m.len() <= MAX_MESSAGE_BYTES && m.ends_with("..."),
            "{}",
            m.len()
        );
    }
}
