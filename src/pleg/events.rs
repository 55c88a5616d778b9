//! containerd's own event stream as a PLEG trigger (the event-driven PLEG).
//!
//! containerd 1.6 does not implement CRI `GetContainerEvents`, but its Events service streams
//! task events on the same socket. nodelet subscribes to the task events that change what CRI
//! reports of a container or sandbox in the `k8s.io` namespace ([`FILTERS`]: a task started,
//! exited, deleted, OOM-killed) and triggers a relist on each, so the change goes through the
//! same diff, cache and channel as a periodic relist. A task exit with a non-zero status, or
//! after the container's OOM event, is also reported at once ([`Pleg::container_exited`]):
//! containerd 1.6's CRI plugin shows the container as exited only after it has deleted the
//! task, some 50 ms later.
//! An OOM event marks the container OOMKilled in the pod cache whenever it comes: containerd's
//! CRI status says `Completed` for a container whose shell survived the kill and exited 0, and
//! the event may come after the exit (seen 11 ms after). So an exit with status 0 and no OOM
//! event yet is left to the relist that follows the task's deletion, by which time a late OOM
//! event has arrived; one arriving later still syncs the pod again. The stream marks the PLEG
//! healthy while it runs; when it breaks the PLEG falls back to the 1 s relist and the stream is
//! reconnected every second.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use containerd_client::events::{TaskDelete, TaskExit, TaskOom};
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::SubscribeRequest;
use hyper_util::rt::TokioIo;
use prost::Message;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use super::Pleg;

/// How long a subscription must stand unrefused before the stream is trusted without an event.
pub const SUBSCRIBE_SETTLE: Duration = Duration::from_secs(1);

/// Filters of the subscription (containerd ORs the strings and ANDs the terms within one): the
/// task events of the CRI namespace after which CRI reports a container or sandbox otherwise.
/// Left out: `/tasks/create` (CRI shows a container `CREATED` from CreateContainer on, and
/// `RUNNING` only once its task starts), `/tasks/exec-added` and `/tasks/exec-started` (a
/// probe's or hook's process), `/tasks/paused`, `/tasks/resumed`, `/tasks/checkpointed`: each
/// event delivered wakes the agent, and a pod start brought four where two say something.
pub const FILTERS: [&str; 4] = [
    "namespace==k8s.io,topic==\"/tasks/start\"",
    "namespace==k8s.io,topic==\"/tasks/exit\"",
    "namespace==k8s.io,topic==\"/tasks/delete\"",
    "namespace==k8s.io,topic==\"/tasks/oom\"",
];

/// Follows containerd's events on `socket` until the task is dropped, triggering `pleg`.
pub async fn run(socket: PathBuf, pleg: Arc<Pleg>) {
    let mut logged_down = false;
    loop {
        match follow(&socket, &pleg).await {
            Ok(()) => info!("containerd event stream ended; reconnecting"),
            Err(e) if !logged_down => {
                warn!(error = %e, "containerd event stream unavailable; PLEG relists every second");
                logged_down = true;
            }
            Err(_) => {}
        }
        pleg.set_stream_healthy(false);
        crate::clock::sleep(Duration::from_secs(1)).await;
    }
}

async fn follow(socket: &std::path::Path, pleg: &Pleg) -> Result<(), tonic::Status> {
    let socket = socket.to_owned();
    let channel = Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = EventsClient::new(channel);
    // containerd answers the call only with the first event, which on a quiet node may never
    // come. A subscription it refuses (a bad filter, a closing connection) fails at once, so one
    // still pending after SUBSCRIBE_SETTLE is in place: the stream is trusted from then on, or
    // from the first event if that comes sooner. (Waiting for the first event left an agent
    // restarted on a quiet node relisting every second for good.)
    let subscribe = client.subscribe(SubscribeRequest {
        filters: FILTERS.iter().map(|f| (*f).to_owned()).collect(),
    });
    tokio::pin!(subscribe);
    let mut stream = tokio::select! {
        r = &mut subscribe => r?.into_inner(),
        () = crate::clock::sleep(SUBSCRIBE_SETTLE) => {
            pleg.set_stream_healthy(true);
            info!("following containerd task events; PLEG relist is the safety net");
            subscribe.await?.into_inner()
        }
    };
    if !pleg.stream_healthy() {
        pleg.set_stream_healthy(true);
        info!("following containerd task events; PLEG relist is the safety net");
    }
    while let Some(envelope) = stream.message().await? {
        debug!(topic = %envelope.topic, "containerd event");
        if !about_a_container(
            &envelope.topic,
            envelope.event.as_ref().map(|a| a.value.as_slice()),
        ) {
            // An exec'd process (a probe, a hook): the containers did not change.
            continue;
        }
        if envelope.topic == "/tasks/oom" {
            if let Some(oom) = envelope
                .event
                .as_ref()
                .and_then(|any| TaskOom::decode(any.value.as_slice()).ok())
            {
                pleg.container_oom(&oom.container_id);
            }
        }
        if envelope.topic == "/tasks/exit" {
            if let Some(exit) = envelope
                .event
                .and_then(|any| TaskExit::decode(any.value.as_slice()).ok())
            {
                // Only the container's own process: an exec'd one (a probe, a hook) exits with
                // its exec ID. A zero status waits for the runtime's status unless the OOM kill
                // is known (see the module docs).
                let init_process = exit.id.is_empty() || exit.id == exit.container_id;
                if init_process && (exit.exit_status != 0 || pleg.is_oom_killed(&exit.container_id))
                {
                    // Go's zero time comes as a large negative number of seconds.
                    let at = exit.exited_at.map_or(0, |t| {
                        t.seconds
                            .checked_mul(1_000_000_000)
                            .and_then(|ns| ns.checked_add(i64::from(t.nanos)))
                            .unwrap_or(0)
                            .max(0)
                    });
                    pleg.container_exited(&exit.container_id, exit.exit_status as i32, at);
                }
            }
        }
        pleg.trigger();
    }
    Ok(())
}

/// True for an event about a container's own task, false for one about a process exec'd in it
/// (`/tasks/exec-added`, `/tasks/exec-started`, and the exit and delete of an exec'd process,
/// whose `id` is the exec ID): exec probes and hooks must not cost a relist each.
fn about_a_container(topic: &str, event: Option<&[u8]>) -> bool {
    let exec_id = |id: &str, container: &str| !id.is_empty() && id != container;
    match topic {
        "/tasks/exec-added" | "/tasks/exec-started" => false,
        "/tasks/exit" => event
            .and_then(|a| TaskExit::decode(a).ok())
            .is_none_or(|e| !exec_id(&e.id, &e.container_id)),
        "/tasks/delete" => event
            .and_then(|a| TaskDelete::decode(a).ok())
            .is_none_or(|e| !exec_id(&e.id, &e.container_id)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any<M: Message>(m: &M) -> Vec<u8> {
        m.encode_to_vec()
    }

    #[test]
    fn exec_processes_do_not_count_as_container_changes() {
        let exec_exit = TaskExit {
            container_id: "c".into(),
            id: "exec-1".into(),
            ..Default::default()
        };
        let task_exit = TaskExit {
            container_id: "c".into(),
            id: "c".into(),
            ..Default::default()
        };
        assert!(!about_a_container(
            "/tasks/exit",
            Some(any(&exec_exit).as_slice())
        ));
        assert!(about_a_container(
            "/tasks/exit",
            Some(any(&task_exit).as_slice())
        ));
        assert!(!about_a_container("/tasks/exec-added", None));
        assert!(!about_a_container("/tasks/exec-started", None));
        let exec_delete = TaskDelete {
            container_id: "c".into(),
            id: "exec-1".into(),
            ..Default::default()
        };
        assert!(!about_a_container(
            "/tasks/delete",
            Some(any(&exec_delete).as_slice())
        ));
        assert!(about_a_container("/tasks/start", None));
        assert!(about_a_container("/tasks/oom", None));
    }
}
