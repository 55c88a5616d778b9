//! Events posted to the apiserver, as kubelet's event broadcaster does (client-go
//! `tools/record`: `EventCorrelator` and `EventSinkImpl`), from the agent's [`Recorder`].
//!
//! Every recorded event goes through the correlator, in client-go's order:
//! 1. **aggregation**: events about the same object with the same type and reason but different
//!    messages are one event once [`AGGREGATE_MAX_EVENTS`] distinct messages arrived within
//!    [`AGGREGATE_WINDOW`], its message prefixed `(combined from similar events): `;
//! 2. **deduplication**: an event seen before (same object, type, reason, message) is not created
//!    again: the existing Event's `count` and `lastTimestamp` are patched;
//! 3. **spam filter**: per object, a token bucket of [`SPAM_BURST`] refilled one token every
//!    [`SPAM_REFILL`]; an event without a token is dropped (logged at debug).
//!
//! Then at most [`EVENT_BURST`] requests at once and [`EVENT_RECORD_QPS`] a second on average
//! (KubeletConfiguration's `eventRecordQPS` and `eventBurst` defaults; the fields themselves are
//! not read yet). While the apiserver cannot be reached, requests wait (at most
//! [`MAX_PENDING`], the oldest dropped first, as client-go's broadcaster queue) and are retried
//! with back-off.
//!
//! The Event: `involvedObject` the pod (kind Pod, namespace, name, UID, and for an event about one
//! of its containers the container's `fieldPath`, `spec.containers{app}`) or, for events about a
//! manifest file or a cgroup, the Node (kind Node, UID the node name, as kubelet's node
//! reference), the file or cgroup then named at the start of the message; `source.component`
//! `kubelet` (what tooling selects on), `source.host` and `reportingInstance` the node name; name
//! `<object name>.<nanoseconds in hex>` in the object's namespace (`default` for the Node).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tracing::{debug, info, warn};

use crate::events::{Event, Recorder};

/// Tokens per object in the spam filter (client-go `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// One token back per object this often (client-go `defaultSpamQPS`, 1/300 per second).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Distinct messages after which similar events are combined (client-go
/// `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_EVENTS: usize = 10;
/// Window in which similar events are counted (client-go `defaultAggregateIntervalInSeconds`).
pub const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// Events (and objects, for the spam filter) remembered for deduplication, aggregation and the
/// spam filter; beyond, that memory starts afresh (client-go keeps LRUs of 4096).
pub const MAX_REMEMBERED: usize = 4096;
/// Requests waiting for the apiserver; the oldest is dropped beyond (client-go
/// `maxQueuedEvents`).
pub const MAX_PENDING: usize = 1000;
/// Requests a second on average (KubeletConfiguration `eventRecordQPS` default).
pub const EVENT_RECORD_QPS: u32 = 50;
/// Requests at once (KubeletConfiguration `eventBurst` default).
pub const EVENT_BURST: u32 = 100;
/// Longest wait between tries while the apiserver cannot be reached.
pub const MAX_EVENT_BACKOFF: Duration = Duration::from_secs(8);
/// The prefix of a combined event's message (client-go's).
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// One request to the apiserver.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Create this Event.
    Create(Box<ApiEvent>),
    /// Patch the Event of that name and namespace to this `count`, `message` and
    /// `lastTimestamp`; created as it stands when the patch finds none.
    Count {
        /// The Event with its new count, message and last timestamp.
        event: Box<ApiEvent>,
    },
}

struct Bucket {
    tokens: f64,
    at: Duration,
}

struct Similar {
    messages: HashSet<String>,
    since: Duration,
}

/// The correlator: aggregation, deduplication and spam filter, on a clock given by the caller
/// (`now`: time since any fixed start).
pub struct Correlator {
    node: String,
    spam: HashMap<String, Bucket>,
    similar: HashMap<String, Similar>,
    seen: HashMap<String, ApiEvent>,
}

/// The object an event is about (kind, namespace, name, UID), and the text to put before its
/// message (for a file or cgroup, reported about the Node).
fn object_of(ev: &Event, node: &str) -> (ObjectReference, String) {
    if let Some(rest) = ev.involved_object.strip_prefix("pod/") {
        if let Some((ns, name)) = rest.split_once('/') {
            let r = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(ns.to_owned()),
                name: Some(name.to_owned()),
                uid: ev.involved_uid.clone(),
                field_path: ev.field_path.clone(),
                ..Default::default()
            };
            return (r, String::new());
        }
    }
    let r = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        uid: Some(node.to_owned()),
        ..Default::default()
    };
    // The node itself ("node"): no prefix; a file or cgroup: its name before the message.
    let prefix = if ev.involved_object == "node" {
        String::new()
    } else {
        format!("{}: ", ev.involved_object)
    };
    (r, prefix)
}

fn object_key(r: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}",
        r.kind.as_deref().unwrap_or_default(),
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default(),
        r.uid.as_deref().unwrap_or_default()
    )
}

/// The event's own time, else `wall`.
fn event_time(ev: &Event, wall: SystemTime) -> SystemTime {
    ev.time
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map_or(wall, SystemTime::from)
}

impl Correlator {
    /// A correlator for events of node `node`.
    pub fn new(node: &str) -> Self {
        Correlator {
            node: node.to_owned(),
            spam: HashMap::new(),
            similar: HashMap::new(),
            seen: HashMap::new(),
        }
    }

    /// What to send for `ev` at `now` (monotonic) and `wall` (for the Event's timestamps and
    /// name), or `None` when the spam filter drops it.
    pub fn correlate(&mut self, ev: &Event, now: Duration, wall: SystemTime) -> Option<Request> {
        let (object, prefix) = object_of(ev, &self.node);
        let okey = object_key(&object);
        let message = format!("{prefix}{}", ev.message);
        // 1. Aggregation.
        let akey = format!("{okey}\u{0}{}\u{0}{}", ev.type_, ev.reason);
        if self.similar.len() >= MAX_REMEMBERED && !self.similar.contains_key(&akey) {
            self.similar.clear();
        }
        let s = self.similar.entry(akey.clone()).or_insert(Similar {
            messages: HashSet::new(),
            since: now,
        });
        if now.saturating_sub(s.since) > AGGREGATE_WINDOW {
            s.messages.clear();
            s.since = now;
        }
        // Ten distinct messages are all that matter: no more are kept.
        if s.messages.len() < AGGREGATE_MAX_EVENTS {
            s.messages.insert(message.clone());
        }
        // The aggregation key leaves the field path out and the deduplication key has it
        // (client-go's `EventAggregatorByReasonFunc` and `getEventKey`): one container's repeats
        // are counted, two containers' same message are two Events.
        let (dkey, message) = if s.messages.len() >= AGGREGATE_MAX_EVENTS {
            (akey, format!("{COMBINED_PREFIX}{message}"))
        } else {
            let field_path = ev.field_path.as_deref().unwrap_or_default();
            (format!("{akey}\u{0}{field_path}\u{0}{message}"), message)
        };
        // 3. Spam filter (before anything is remembered of an event it drops).
        if self.spam.len() >= MAX_REMEMBERED && !self.spam.contains_key(&okey) {
            self.spam.clear();
        }
        let b = self.spam.entry(okey).or_insert(Bucket {
            tokens: f64::from(SPAM_BURST),
            at: now,
        });
        let refill = now.saturating_sub(b.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        b.tokens = (b.tokens + refill).min(f64::from(SPAM_BURST));
        b.at = now;
        if b.tokens < 1.0 {
            return None;
        }
        b.tokens -= 1.0;
        // 2. Deduplication.
        let time = crate::pod::api_time(event_time(ev, wall));
        if let Some(e) = self.seen.get_mut(&dkey) {
            e.count = Some(e.count.unwrap_or(1) + 1);
            e.last_timestamp = Some(time);
            e.message = Some(message);
            return Some(Request::Count {
                event: Box::new(e.clone()),
            });
        }
        let nanos = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let event = ApiEvent {
            metadata: kube::api::ObjectMeta {
                name: Some(format!(
                    "{}.{nanos:x}",
                    object.name.as_deref().unwrap_or_default()
                )),
                namespace: Some(object.namespace.clone().unwrap_or_else(|| "default".into())),
                ..Default::default()
            },
            involved_object: object,
            reason: Some(ev.reason.clone()),
            message: Some(message),
            type_: Some(ev.type_.to_owned()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(self.node.clone()),
            }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(self.node.clone()),
            first_timestamp: Some(time.clone()),
            last_timestamp: Some(time),
            count: Some(1),
            ..Default::default()
        };
        if self.seen.len() >= MAX_REMEMBERED {
            self.seen.clear();
        }
        self.seen.insert(dkey, event.clone());
        Some(Request::Create(Box::new(event)))
    }
}

/// The client-side rate limit: [`EVENT_BURST`] tokens, [`EVENT_RECORD_QPS`] back a second.
pub struct RateLimit {
    tokens: f64,
    at: Duration,
}

impl RateLimit {
    /// A full bucket at `now`.
    pub fn new(now: Duration) -> Self {
        RateLimit {
            tokens: f64::from(EVENT_BURST),
            at: now,
        }
    }

    /// Takes a token for a request at `now` and says how long it must wait for it (zero: it
    /// may go now). A request that waits owes its token: the next one waits for its own.
    pub fn wait(&mut self, now: Duration) -> Duration {
        let refill = now.saturating_sub(self.at).as_secs_f64() * f64::from(EVENT_RECORD_QPS);
        self.tokens = (self.tokens + refill).min(f64::from(EVENT_BURST));
        self.at = now;
        let wait = if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / f64::from(EVENT_RECORD_QPS))
        };
        self.tokens -= 1.0;
        wait
    }
}

/// How a request went.
enum Sent {
    Done,
    /// The apiserver refused it: dropped (reported once per code and reason: the message
    /// names the event).
    Refused(String, String),
    Unreachable(kube::Error),
}

async fn send(client: &kube::Client, req: &Request) -> Sent {
    let (event, patch) = match req {
        Request::Create(e) => (e, false),
        Request::Count { event } => (event, true),
    };
    let ns = event.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<ApiEvent> = Api::namespaced(client.clone(), ns);
    let name = event.metadata.name.clone().unwrap_or_default();
    let result = if patch {
        let body = serde_json::json!({
            "count": event.count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            // Gone (expired, or its create never arrived): created as it stands.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                api.create(&PostParams::default(), event).await.map(|_| ())
            }
            r => r.map(|_| ()),
        }
    } else {
        api.create(&PostParams::default(), event).await.map(|_| ())
    };
    match result {
        Ok(()) => Sent::Done,
        // Already there (a retry after a create whose answer was lost).
        Err(kube::Error::Api(e)) if e.code == 409 => Sent::Done,
        Err(kube::Error::Api(e)) => Sent::Refused(format!("{} {}", e.code, e.reason), e.message),
        Err(e) => Sent::Unreachable(e),
    }
}

/// Posts the events of `recorder` to the apiserver for node `node` until the task is dropped,
/// from the first event still held.
pub async fn run(client: kube::Client, node: String, recorder: Recorder) {
    let start = tokio::time::Instant::now();
    let mut correlator = Correlator::new(&node);
    let mut limit = RateLimit::new(Duration::ZERO);
    let mut pending: VecDeque<Request> = VecDeque::new();
    let mut last_seq = 0;
    let mut refused: HashSet<String> = HashSet::new();
    let mut failing = false;
    let mut dropped: u64 = 0;
    let mut backoff = Duration::from_secs(1);
    loop {
        if pending.is_empty() {
            recorder.recorded().await;
        }
        for ev in recorder.since(last_seq) {
            last_seq = ev.seq;
            match correlator.correlate(&ev, start.elapsed(), crate::clock::wall_now()) {
                Some(r) => {
                    if pending.len() == MAX_PENDING {
                        pending.pop_front();
                        dropped += 1;
                    }
                    pending.push_back(r);
                }
                None => {
                    debug!(object = %ev.involved_object, reason = %ev.reason, "event dropped by the spam filter")
                }
            }
        }
        while let Some(req) = pending.front() {
            let wait = limit.wait(start.elapsed());
            if !wait.is_zero() {
                crate::clock::sleep(wait).await;
            }
            match send(&client, req).await {
                Sent::Done => {
                    pending.pop_front();
                    if failing {
                        info!(dropped, "events posted again");
                        failing = false;
                        dropped = 0;
                    }
                    backoff = Duration::from_secs(1);
                }
                Sent::Refused(kind, message) => {
                    pending.pop_front();
                    if refused.insert(kind.clone()) {
                        warn!(refusal = %kind, error = %message, "event refused by the apiserver; dropped (such refusals are reported once)");
                    }
                }
                Sent::Unreachable(e) => {
                    if !failing {
                        warn!(error = %e, pending = pending.len(), "cannot post events; will retry with back-off");
                        failing = true;
                    }
                    crate::clock::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_EVENT_BACKOFF);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(object: &str, reason: &str, message: &str) -> Event {
        let r = Recorder::default();
        r.warning(object, reason, message);
        r.list().remove(0)
    }

    fn pod_ev(reason: &str, message: &str) -> Event {
        let mut e = ev("pod/ns/p", reason, message);
        e.involved_uid = Some("u1".into());
        e
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const WALL: SystemTime = SystemTime::UNIX_EPOCH;

    #[test]
    fn a_pod_event_is_about_the_pod_and_a_file_event_about_the_node() {
        let mut c = Correlator::new("n1");
        let Some(Request::Create(e)) = c.correlate(&pod_ev("BackOff", "m"), secs(0), WALL) else {
            panic!("created");
        };
        let o = &e.involved_object;
        assert_eq!(
            (o.kind.as_deref(), o.namespace.as_deref(), o.name.as_deref()),
            (Some("Pod"), Some("ns"), Some("p"))
        );
        assert_eq!(o.uid.as_deref(), Some("u1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert!(e.metadata.name.as_deref().unwrap().starts_with("p."));
        assert_eq!(e.source.as_ref().unwrap().host.as_deref(), Some("n1"));
        assert_eq!(e.count, Some(1));

        let Some(Request::Create(e)) = c.correlate(
            &ev("file:/m/x.yaml", "InvalidManifest", "bad"),
            secs(0),
            WALL,
        ) else {
            panic!("created");
        };
        assert_eq!(e.involved_object.kind.as_deref(), Some("Node"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("n1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.message.as_deref(), Some("file:/m/x.yaml: bad"));
    }

    #[test]
    fn a_repeated_event_is_counted_not_created_again() {
        let mut c = Correlator::new("n1");
        let first = c.correlate(&pod_ev("BackOff", "m"), secs(0), WALL);
        let Some(Request::Create(created)) = first else {
            panic!()
        };
        for n in 2..=4 {
            let Some(Request::Count { event }) =
                c.correlate(&pod_ev("BackOff", "m"), secs(n), WALL)
            else {
                panic!("counted")
            };
            assert_eq!(event.count, Some(n as i32));
            assert_eq!(event.metadata.name, created.metadata.name, "the same Event");
        }
    }

    #[test]
    fn a_containers_event_carries_its_field_path_and_is_counted_apart_from_another_containers() {
        let mut c = Correlator::new("n1");
        let on = |container: &str| {
            let mut e = pod_ev("Pulled", "Container image \"b\" already present on machine");
            e.field_path = Some(format!("spec.containers{{{container}}}"));
            e
        };
        let Some(Request::Create(a)) = c.correlate(&on("a"), secs(0), WALL) else {
            panic!("created");
        };
        assert_eq!(
            a.involved_object.field_path.as_deref(),
            Some("spec.containers{a}")
        );
        let Some(Request::Create(b)) = c.correlate(&on("b"), secs(1), WALL) else {
            panic!("the same message about another container is another Event");
        };
        assert_eq!(
            b.involved_object.field_path.as_deref(),
            Some("spec.containers{b}")
        );
        let Some(Request::Count { event }) = c.correlate(&on("a"), secs(2), WALL) else {
            panic!("a repeat about the first container is counted");
        };
        assert_eq!(
            (event.metadata.name, event.count),
            (a.metadata.name, Some(2))
        );
        let Some(Request::Create(p)) = c.correlate(&pod_ev("Killing", "m"), secs(3), WALL) else {
            panic!("created");
        };
        assert_eq!(p.involved_object.field_path, None, "about the pod itself");
    }

    #[test]
    fn ten_distinct_messages_of_one_reason_are_combined() {
        let mut c = Correlator::new("n1");
        for i in 0..AGGREGATE_MAX_EVENTS - 1 {
            let r = c.correlate(&pod_ev("Failed", &format!("m{i}")), secs(0), WALL);
            assert!(matches!(r, Some(Request::Create(_))), "{i}");
        }
        let Some(Request::Create(e)) = c.correlate(&pod_ev("Failed", "m9"), secs(1), WALL) else {
            panic!("the combined event is created")
        };
        assert_eq!(
            e.message.as_deref(),
            Some("(combined from similar events): m9")
        );
        let Some(Request::Count { event }) = c.correlate(&pod_ev("Failed", "m10"), secs(2), WALL)
        else {
            panic!("then counted")
        };
        assert_eq!(event.count, Some(2));
        assert_eq!(
            event.message.as_deref(),
            Some("(combined from similar events): m10")
        );
        // After the window, messages are counted afresh.
        let later = c.correlate(
            &pod_ev("Failed", "m11"),
            secs(2) + AGGREGATE_WINDOW + secs(1),
            WALL,
        );
        assert!(matches!(later, Some(Request::Create(e)) if e.message.as_deref() == Some("m11")));
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_per_object_then_one_per_5_minutes() {
        let mut c = Correlator::new("n1");
        let sent = (0..40)
            .filter(|i| {
                c.correlate(&pod_ev(&format!("R{i}"), "m"), secs(0), WALL)
                    .is_some()
            })
            .count();
        assert_eq!(sent, SPAM_BURST as usize);
        assert!(c.correlate(&pod_ev("Late", "m"), secs(299), WALL).is_none());
        assert!(c.correlate(&pod_ev("Late", "m"), secs(300), WALL).is_some());
        assert!(c
            .correlate(&pod_ev("Later", "m"), secs(301), WALL)
            .is_none());
        // Another object has its own bucket.
        assert!(c
            .correlate(&ev("pod/ns/q", "R", "m"), secs(301), WALL)
            .is_some());
    }

    #[test]
    fn requests_are_limited_to_the_burst_then_the_qps() {
        let mut l = RateLimit::new(secs(0));
        for _ in 0..EVENT_BURST {
            assert_eq!(l.wait(secs(0)), Duration::ZERO);
        }
        let step = Duration::from_millis(1000 / u64::from(EVENT_RECORD_QPS));
        assert_eq!(l.wait(secs(0)), step, "the 101st waits 1/qps s");
        assert_eq!(l.wait(secs(0)), step * 2, "the 102nd twice that");
        // Over a second past the burst: no more than the qps went.
        let mut at = secs(0);
        let mut sent = 0;
        while at < secs(1) {
            at += l.wait(at);
            sent += 1;
        }
        assert!(sent <= EVENT_RECORD_QPS + 1, "{sent} in a second");
    }
}
