//! `nodelet events`: the agent's events (`/events`, the last 1000 since it started) as
//! `kubectl events` prints them: LAST SEEN (with `(xN over AGE)` for repeats), TYPE, REASON,
//! OBJECT, MESSAGE, oldest first; `-w` prints new ones as they come (the agent asked once a
//! second). Events about something other than a pod (a manifest file, a cgroup) belong to the
//! `default` namespace, as kubelet's Node events do.

use std::time::Duration;

use serde::Deserialize;

use super::table::{age, TABLE};
use super::{CliError, Client, EventsArgs};

/// An event as `/events` serves it ([`crate::events::Event`]).
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The reason.
    pub reason: String,
    /// `pod/<namespace>/<name>`, or another object named by text.
    pub involved_object: String,
    /// The container within the pod (`spec.containers{c}`), for a container's event.
    #[serde(default)]
    pub field_path: Option<String>,
    /// The message.
    pub message: String,
    /// RFC 3339.
    pub time: String,
    /// Position in the agent's log.
    #[serde(default)]
    pub seq: u64,
}

impl Event {
    /// The namespace and kubectl's name (`pod/<name>`) of the object.
    pub fn object(&self) -> (&str, String) {
        match self
            .involved_object
            .strip_prefix("pod/")
            .and_then(|r| r.split_once('/'))
        {
            Some((ns, name)) => (ns, format!("pod/{name}")),
            None => ("default", self.involved_object.clone()),
        }
    }

    fn time(&self) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
        self.time
            .parse()
            .ok()
            .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
    }
}

/// Events with the same type, reason, object, container and message, counted (client-go's
/// deduplication key: one container's repeats, not two containers' same message): (last,
/// count, first).
pub fn aggregate(events: &[Event]) -> Vec<(Event, usize, Event)> {
    let mut out: Vec<(Event, usize, Event)> = Vec::new();
    for e in events {
        let same = |o: &Event| {
            o.type_ == e.type_
                && o.reason == e.reason
                && o.involved_object == e.involved_object
                && o.field_path == e.field_path
                && o.message == e.message
        };
        match out.iter().position(|(l, _, _)| same(l)) {
            Some(i) => {
                let (_, n, first) = out.remove(i);
                out.push((e.clone(), n + 1, first));
            }
            None => out.push((e.clone(), 1, e.clone())),
        }
    }
    out
}

/// LAST SEEN of an aggregated event: its age, and `(xN over AGE)` of the first when repeated.
pub fn last_seen(last: &Event, count: usize, first: &Event, now: jiff::Timestamp) -> String {
    let l = age(last.time().as_ref(), now);
    if count > 1 {
        format!("{l} (x{count} over {})", age(first.time().as_ref(), now))
    } else {
        l
    }
}

/// The agent's events, oldest first.
///
/// Errors: as [`Client::get_json`].
pub async fn list(client: &Client) -> Result<Vec<Event>, CliError> {
    #[derive(Deserialize)]
    struct List {
        items: Vec<Event>,
    }
    Ok(client.get_json::<List>("/events").await?.items)
}

fn lines(events: &[(Event, usize, Event)], all: bool, now: jiff::Timestamp) -> String {
    let mut text = String::new();
    for (e, n, first) in events {
        let (ns, obj) = e.object();
        if all {
            text.push_str(ns);
            text.push('\t');
        }
        text.push_str(&format!(
            "{}\t{}\t{}\t{obj}\t{}\n",
            last_seen(e, *n, first, now),
            e.type_,
            e.reason,
            e.message.replace('\n', " ")
        ));
    }
    text
}

/// Prints the events; with `-w`, goes on printing new ones until interrupted.
///
/// Errors: as [`Client::get_json`].
pub async fn run(client: &Client, args: &EventsArgs) -> Result<(), CliError> {
    let all = args.ns.all_namespaces;
    let keep = |e: &Event| all || e.object().0 == args.ns.namespace;
    let events = list(client).await?;
    let mut seen = events.iter().map(|e| e.seq).max().unwrap_or(0);
    let mine: Vec<Event> = events.into_iter().filter(keep).collect();
    let header = if all {
        "NAMESPACE\tLAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE\n"
    } else {
        "LAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE\n"
    };
    if mine.is_empty() && !args.watch {
        eprintln!("No events found in {} namespace.", args.ns.namespace);
        return Ok(());
    }
    let now = super::now();
    super::print(&TABLE.format(&format!("{header}{}", lines(&aggregate(&mine), all, now))));
    if !args.watch {
        return Ok(());
    }
    loop {
        crate::clock::sleep(Duration::from_secs(1)).await;
        let all_now = list(client).await?;
        // An agent that restarted numbers its events from 1 again: all of them are new.
        if all_now.last().is_some_and(|e| e.seq < seen) {
            seen = 0;
        }
        let new: Vec<Event> = all_now.into_iter().filter(|e| e.seq > seen).collect();
        seen = new.iter().map(|e| e.seq).max().unwrap_or(seen);
        let new: Vec<(Event, usize, Event)> = new
            .into_iter()
            .filter(keep)
            .map(|e| (e.clone(), 1, e))
            .collect();
        if !new.is_empty() && !super::print(&TABLE.format(&lines(&new, all, super::now()))) {
            return Ok(());
        }
    }
}
