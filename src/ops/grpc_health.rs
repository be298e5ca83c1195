//! The gRPC health service (`grpc.health.v1`) on the public listeners,
//! for load balancers and `grpc_health_probe`: the overall status ("") and
//! each served service follow the replica's readiness.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::Health;

/// How often readiness is copied into the health services.
const EVERY: Duration = Duration::from_millis(500);

/// Keeps `reporters` (one per listener) in step with `health` for the
/// overall status and `services`, until `cancel`.
pub fn follow(
    health: Arc<Health>,
    reporters: Vec<HealthReporter>,
    services: Vec<&'static str>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let now = match health.ready() {
                Ok(()) => ServingStatus::Serving,
                Err(_) => ServingStatus::NotServing,
            };
            if last != Some(now) {
                for r in &reporters {
                    for name in std::iter::once("").chain(services.iter().copied()) {
                        r.set_service_status(name, now).await;
                    }
                }
                last = Some(now);
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(EVERY) => {}
            }
        }
    })
}
