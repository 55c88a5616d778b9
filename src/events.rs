//! Event recorder: what kubelet posts as Events, kept in memory (newest last, at most
//! [`MAX_EVENTS`]) and served at `GET /events`; in cluster mode also posted to the apiserver
//! ([`crate::cluster::events`]), which reads them in order by [`Event::seq`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

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

/// What an event is about: `pod/<namespace>/<name>` with the pod's UID (and, for one of its
/// containers, the container's field path), or another object named by text (`file:<path>`,
/// `cgroup:<path>`: posted to the API about the Node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Involved {
    /// How `/events` and the logs name it.
    pub text: String,
    /// The pod's UID, for a pod.
    pub uid: Option<String>,
    /// The container within the pod, as the Event's `involvedObject.fieldPath`
    /// (`spec.containers{app}`): see [`Involved::container`].
    pub field_path: Option<String>,
}

impl Involved {
    /// The pod `pod` (its `pod/<namespace>/<name>` and UID).
    pub fn pod(pod: &Pod) -> Self {
        Involved {
            text: crate::pod::pod_ref(pod),
            uid: pod.metadata.uid.clone(),
            field_path: None,
        }
    }

    /// The container named `container` of `pod`: the pod, with the field path kubelet's
    /// `GenerateContainerRef` gives (`spec.containers{name}`, `spec.initContainers{name}` or
    /// `spec.ephemeralContainers{name}`, the first list holding the name; a container the spec
    /// does not hold: `implicitly required container <name>`).
    pub fn container(pod: &Pod, container: &str) -> Self {
        let spec = pod.spec.as_ref();
        let holds = |list: Option<&Vec<k8s_openapi::api::core::v1::Container>>| {
            list.is_some_and(|l| l.iter().any(|c| c.name == container))
        };
        let field_path = if holds(spec.map(|s| &s.containers)) {
            format!("spec.containers{{{container}}}")
        } else if holds(spec.and_then(|s| s.init_containers.as_ref())) {
            format!("spec.initContainers{{{container}}}")
        } else if spec
            .and_then(|s| s.ephemeral_containers.as_ref())
            .is_some_and(|l| l.iter().any(|c| c.name == container))
        {
            format!("spec.ephemeralContainers{{{container}}}")
        } else {
            format!("implicitly required container {container}")
        };
        Involved {
            field_path: Some(field_path),
            ..Involved::pod(pod)
        }
    }
}

impl From<String> for Involved {
    fn from(text: String) -> Self {
        Involved {
            text,
            uid: None,
            field_path: None,
        }
    }
}

impl From<&str> for Involved {
    fn from(text: &str) -> Self {
        Involved::from(text.to_owned())
    }
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
    /// The pod's UID when the event is about a pod (not in `/events`).
    #[serde(skip)]
    pub involved_uid: Option<String>,
    /// The container the event is about within the pod, as [`Involved::field_path`]
    /// (`spec.containers{app}`); absent for the pod itself and other objects.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    /// Position in the recorder, from 1, increasing (`nodelet events -w` prints those above the
    /// last it printed).
    pub seq: u64,
}

#[derive(Default)]
struct Log {
    events: VecDeque<Event>,
    last_seq: u64,
}

/// A shared, bounded event log.
#[derive(Clone, Default)]
pub struct Recorder {
    log: Arc<Mutex<Log>>,
    recorded: Arc<tokio::sync::Notify>,
}

impl Recorder {
    /// Records a `Normal` event.
    pub fn normal(&self, object: impl Into<Involved>, reason: &str, message: impl Into<String>) {
        self.push("Normal", object.into(), reason, message.into());
    }

    /// Records a `Warning` event.
    pub fn warning(&self, object: impl Into<Involved>, reason: &str, message: impl Into<String>) {
        self.push("Warning", object.into(), reason, message.into());
    }

    fn push(&self, type_: &'static str, object: Involved, reason: &str, message: String) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.last_seq += 1;
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            involved_object: truncate(object.text),
            message: truncate(message),
            time: crate::pod::now_rfc3339(),
            involved_uid: object.uid,
            field_path: object.field_path,
            seq: log.last_seq,
        };
        if log.events.len() == MAX_EVENTS {
            log.events.pop_front();
        }
        log.events.push_back(ev);
        drop(log);
        self.recorded.notify_one();
    }

    /// A copy of the events, oldest first.
    pub fn list(&self) -> Vec<Event> {
        self.since(0)
    }

    /// A copy of the events held whose [`Event::seq`] is above `seq`, oldest first.
    pub fn since(&self, seq: u64) -> Vec<Event> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let skip = log.events.partition_point(|e| e.seq <= seq);
        log.events.iter().skip(skip).cloned().collect()
    }

    /// Waits until an event is recorded (one recorded since the last wait returns at once).
    pub async fn recorded(&self) {
        self.recorded.notified().await;
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

    #[test]
    fn a_containers_field_path_is_its_place_in_the_spec() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {
                "initContainers": [{"name": "init"}],
                "containers": [{"name": "app"}, {"name": "side"}],
                "ephemeralContainers": [{"name": "debugger"}]
            }
        }))
        .unwrap();
        let path = |name: &str| Involved::container(&pod, name).field_path.unwrap();
        assert_eq!(path("app"), "spec.containers{app}");
        assert_eq!(path("side"), "spec.containers{side}");
        assert_eq!(path("init"), "spec.initContainers{init}");
        assert_eq!(path("debugger"), "spec.ephemeralContainers{debugger}");
        assert_eq!(path("gone"), "implicitly required container gone");
        let c = Involved::container(&pod, "app");
        assert_eq!(
            (c.text.as_str(), c.uid.as_deref()),
            ("pod/ns/p", Some("u1"))
        );
        assert_eq!(Involved::pod(&pod).field_path, None);
        let r = Recorder::default();
        r.normal(c, "Started", "Started container app");
        r.normal(Involved::pod(&pod), "SandboxChanged", "m");
        let json = serde_json::to_value(r.list()).unwrap();
        assert_eq!(json[0]["fieldPath"], "spec.containers{app}");
        assert!(json[1].get("fieldPath").is_none(), "{json}");
    }

    #[test]
    fn events_are_read_in_order_from_a_position() {
        let r = Recorder::default();
        r.normal("file:a", "One", "1");
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("u1".into());
        r.warning(Involved::pod(&p), "Two", "2");
        let all = r.since(0);
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(all[1].involved_object, "pod/ns/p");
        assert_eq!(all[1].involved_uid.as_deref(), Some("u1"));
        assert_eq!(r.since(1).len(), 1);
        assert!(r.since(2).is_empty());
        for i in 0..MAX_EVENTS {
            r.normal("file:a", "More", format!("{i}"));
        }
        let tail = r.since(1);
        assert_eq!(tail.len(), MAX_EVENTS, "what is still held");
        assert_eq!(tail[0].seq, 3);
    }
}
