//! The cluster's Services, listed and watched for the pods' service environment variables
//! (kubelet's service reflector over every namespace, `NewMainKubelet`; the variables are
//! [`crate::envvars`]).
//!
//! One watch of all Services (the Node authorizer lets a node list and watch them); a listing
//! replaces the store ([`Services::replace`], which marks it synced), each change after it
//! writes one Service. The watch is retried with the API pod source's back-off; a failure is
//! logged once until the watch works again, and the store keeps what it last saw meanwhile.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::{watcher, WatchStreamExt};
use tracing::{info, warn};

use crate::envvars::{info as service_info, ServiceInfo, Services};

fn key(s: &Service) -> (String, String) {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

/// Marks `services` as fed by a watch (from now on an API pod's container waits for a first
/// listing) and spawns on `rt` the task that follows every Service of the cluster into it until
/// the runtime stops.
pub fn start(rt: &tokio::runtime::Handle, client: kube::Client, services: Services) {
    services.set_watched();
    rt.spawn(run(client, services));
}

async fn run(client: kube::Client, services: Services) {
    let api: kube::Api<Service> = kube::Api::all(client);
    let mut stream = watcher(api, watcher::Config::default())
        .backoff(crate::source::api::WatchBackoff::default())
        .boxed();
    let mut listing: HashMap<(String, String), ServiceInfo> = HashMap::new();
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(s)) => {
                if let Some(i) = service_info(&s) {
                    listing.insert(key(&s), i);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let n = listing.len();
                let first = !services.is_synced();
                services.replace(std::mem::take(&mut listing));
                if first {
                    info!(
                        services = n,
                        "services listed; pods get their environment variables"
                    );
                }
            }
            Ok(watcher::Event::Apply(s)) => {
                let (ns, name) = key(&s);
                services.set(&ns, &name, service_info(&s));
            }
            Ok(watcher::Event::Delete(s)) => {
                let (ns, name) = key(&s);
                services.set(&ns, &name, None);
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "cannot watch the cluster's services; retrying (pods from the API wait for a first listing)");
                    failing = true;
                }
                continue;
            }
        }
        failing = false;
    }
}
