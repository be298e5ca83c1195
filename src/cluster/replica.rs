//! What this replica is and does right now, for `Inspect`, `status` and
//! step-down.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;
use tonic::Status;

use super::{ElectionHandle, Identity, Leadership, Role};
use crate::ops::Health;
use crate::proto::cluster as pb;
use crate::transport::Transport;

/// The leader's reconcile queue depth (0 when not leading).
pub type QueueDepth = Box<dyn Fn() -> u64 + Send + Sync>;
/// Leader writes refused by fencing so far (0 on the memory store).
pub type FencedWrites = Box<dyn Fn() -> u64 + Send + Sync>;

pub struct Replica {
    pub identity: Arc<Identity>,
    pub leadership: Arc<Leadership>,
    pub transport: Arc<Transport>,
    /// `None` for the single replica of the memory store.
    pub election: Option<ElectionHandle>,
    pub queue_depth: QueueDepth,
    pub fenced_writes: FencedWrites,
    pub health: Arc<Health>,
    /// Wakes whoever drains this replica (`slim-cp drain`).
    pub drain_requested: Arc<Notify>,
}

impl Replica {
    /// This replica's live state (refusal counts are the relay's to add).
    pub fn state(&self) -> pb::ReplicaState {
        let me = self.identity.current();
        let role = self.leadership.role();
        let counters = self.transport.counters();
        pb::ReplicaState {
            id: me.id,
            incarnation: me.incarnation,
            leader: matches!(role, Role::Leader(_)),
            epoch: role.epoch().unwrap_or(0),
            sessions: self.transport.registry().len() as u64,
            ready: self.health.ready().is_ok(),
            queue_depth: (self.queue_depth)(),
            relay_refused: Default::default(),
            commands_sent: counters.sent(),
            commands_fenced: counters.fenced.load(Ordering::Relaxed),
            highest_epoch: self.transport.highest_epoch(),
            pid: std::process::id(),
            host: super::hostname().unwrap_or_default(),
            fenced_writes: (self.fenced_writes)(),
        }
    }

    /// Asks this replica to drain its nodes to the others, then stop.
    /// Returns the sessions it held when asked.
    pub fn request_drain(&self) -> pb::DrainReply {
        self.drain_requested.notify_one();
        pb::DrainReply {
            replica: self.identity.id(),
            sessions: self.transport.registry().len() as u64,
        }
    }

    /// Hands leadership over if this replica leads.
    pub async fn step_down(&self) -> Result<pb::StepDownReply, Status> {
        let Some(election) = &self.election else {
            return Err(Status::failed_precondition(
                "a single replica on the memory store has nobody to hand leadership to",
            ));
        };
        match election.resign().await {
            Some(epoch) => Ok(pb::StepDownReply {
                replica: self.identity.id(),
                epoch,
            }),
            None => Err(Status::failed_precondition(format!(
                "replica {} is not the leader",
                self.identity.id()
            ))),
        }
    }
}
