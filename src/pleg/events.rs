//! containerd's own event stream as a PLEG trigger (the event-driven PLEG).
//!
//! containerd 1.6 does not implement CRI `GetContainerEvents`, but its Events service streams
//! task events on the same socket. nodelet subscribes to `/tasks/` topics in the `k8s.io`
//! namespace and triggers a relist on each, so the change goes through the same diff, cache and
//! channel as a periodic relist. A task exit with a non-zero status is also reported at once
//! ([`Pleg::container_exited`]): containerd 1.6's CRI plugin shows the container as exited only
//! after it has deleted the task, some 50 ms later. An OOM event before the exit marks it as
//! OOMKilled, as the runtime's own status later says. An exit with status 0 is left to the
//! relist that follows the task's deletion: the OOM event of a container whose shell survived
//! the OOM kill and exited 0 may come after the exit (seen 11 ms after), and only the runtime's
//! status then tells a completed container from an OOM-killed one. The stream marks the PLEG
//! healthy while it runs; when it breaks the PLEG falls back to the 1 s relist and the stream is
//! reconnected every second.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use containerd_client::events::{TaskExit, TaskOom};
use containerd_client::services::v1::events_client::EventsClient;
use containerd_client::services::v1::SubscribeRequest;
use hyper_util::rt::TokioIo;
use prost::Message;
use tonic::transport::Endpoint;
use tracing::{debug, info, warn};

use super::Pleg;

/// Filter of the subscription: task events of the CRI namespace (one string: AND).
pub const FILTER: &str = "namespace==k8s.io,topic~=\"^/tasks/\"";

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
        tokio::time::sleep(Duration::from_secs(1)).await;
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
    // The call returns once the first event arrives; until then the stream is not proven, so
    // the PLEG keeps its 1 s relist.
    let mut stream = client
        .subscribe(SubscribeRequest {
            filters: vec![FILTER.to_string()],
        })
        .await?
        .into_inner();
    pleg.set_stream_healthy(true);
    info!("following containerd task events; PLEG relist is the safety net");
    while let Some(envelope) = stream.message().await? {
        debug!(topic = %envelope.topic, "containerd event");
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
                // The task itself, not an exec'd process in it; a zero status waits for the
                // runtime's own status (see the module docs).
                if (exit.id == exit.container_id || exit.id.is_empty()) && exit.exit_status != 0 {
                    let at = exit
                        .exited_at
                        .map_or(0, |t| t.seconds * 1_000_000_000 + i64::from(t.nanos));
                    pleg.container_exited(&exit.container_id, exit.exit_status as i32, at);
                }
            }
        }
        pleg.trigger();
    }
    Ok(())
}
