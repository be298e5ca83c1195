//! Many simulated nodes against one control plane, sharing HTTP/2
//! connections so that thousands fit in one process's file descriptors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::network::Change;
use super::node::{SimNode, endpoint_of};
use super::session::Dialer;
use super::{NodeState, SimError, SimNetwork, SimNodeSpec, SimOptions};

/// Shortest pause between two checks of a fleet-wide predicate.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// Knobs of a fleet.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Nodes per gRPC channel (one HTTP/2 connection each). 1 gives every
    /// node its own TCP connection per attempt, like real nodes.
    pub nodes_per_channel: usize,
    /// Options of every node.
    pub node: SimOptions,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            nodes_per_channel: 32,
            node: SimOptions::default(),
        }
    }
}

/// A started fleet. Dropping it crashes every node.
#[derive(Debug)]
pub struct SimFleet {
    nodes: Vec<SimNode>,
    index: HashMap<String, usize>,
    network: Arc<SimNetwork>,
    changes: Arc<watch::Sender<Change>>,
    endpoint: tonic::transport::Endpoint,
    options: SimOptions,
}

impl SimFleet {
    /// Creates the nodes of `specs` on a fresh network and starts them all
    /// (needs a tokio runtime).
    pub fn start(
        control_plane: &str,
        specs: Vec<SimNodeSpec>,
        options: FleetOptions,
    ) -> Result<SimFleet, SimError> {
        let fleet = Self::create(control_plane, specs, options)?;
        for node in &fleet.nodes {
            node.start()?;
        }
        Ok(fleet)
    }

    /// Creates the nodes without starting them (see [`SimNode::start`]).
    pub fn create(
        control_plane: &str,
        specs: Vec<SimNodeSpec>,
        options: FleetOptions,
    ) -> Result<SimFleet, SimError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(SimError::NoRuntime);
        }
        let network = SimNetwork::new();
        let changes = Arc::new(watch::Sender::new(Change::new()));
        let endpoint = endpoint_of(control_plane, &options.node)?;
        let per_channel = options.nodes_per_channel.max(1);
        let mut nodes = Vec::with_capacity(specs.len());
        let mut index = HashMap::new();
        let mut dialer = None;
        for (i, spec) in specs.into_iter().enumerate() {
            if per_channel == 1 {
                dialer = Some(Dialer::PerAttempt(Box::new(endpoint.clone())));
            } else if i % per_channel == 0 || dialer.is_none() {
                dialer = Some(Dialer::Shared(endpoint.connect_lazy()));
            }
            let Some(d) = dialer.clone() else {
                continue;
            };
            let node = SimNode::with_dialer(
                spec,
                d,
                network.clone(),
                options.node.clone(),
                Some(changes.clone()),
            )?;
            index.insert(node.effective_id().to_string(), nodes.len());
            index.entry(node.id().to_string()).or_insert(nodes.len());
            nodes.push(node);
        }
        Ok(SimFleet {
            nodes,
            index,
            network,
            changes,
            endpoint,
            options: options.node,
        })
    }

    /// Starts a node from `spec` on this fleet's network, with its own TCP
    /// connection. A stopped or lost node of the same id is replaced (a
    /// machine coming back with a new configuration, say a new endpoint).
    pub fn spawn(&mut self, spec: SimNodeSpec) -> Result<&SimNode, SimError> {
        let id = spec.effective_id();
        if let Some(old) = self
            .node(&id)
            .filter(|n| n.state() == NodeState::Registered)
        {
            return Err(SimError::DuplicateNode(old.effective_id().to_string()));
        }
        let dialer = Dialer::PerAttempt(Box::new(self.endpoint.clone()));
        let node = SimNode::with_dialer(
            spec,
            dialer,
            self.network.clone(),
            self.options.clone(),
            Some(self.changes.clone()),
        )?;
        node.start()?;
        let slot = match self.index.get(&id) {
            Some(&i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.index.insert(id, slot);
        Ok(&self.nodes[slot])
    }

    /// All nodes, in spec order.
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// A node by effective id (`group/node`) or by bare node id.
    pub fn node(&self, id: &str) -> Option<&SimNode> {
        self.index.get(id).and_then(|i| self.nodes.get(*i))
    }

    /// The fleet's data-plane network.
    pub fn network(&self) -> &Arc<SimNetwork> {
        &self.network
    }

    /// Nodes currently registered.
    pub fn registered_count(&self) -> usize {
        self.count(|s| *s == NodeState::Registered)
    }

    /// `ConfigurationCommand` messages all nodes received so far.
    pub fn commands_received(&self) -> u64 {
        self.nodes.iter().map(SimNode::commands_received).sum()
    }

    /// Nodes that gave up on the control plane.
    pub fn lost_count(&self) -> usize {
        self.count(|s| matches!(s, NodeState::Lost { .. }))
    }

    /// Ids and reasons of lost nodes.
    pub fn lost(&self) -> Vec<(String, String)> {
        let lost = self.nodes.iter().filter_map(|n| match n.state() {
            NodeState::Lost { reason } => Some((n.effective_id().to_string(), reason)),
            _ => None,
        });
        lost.collect()
    }

    fn count(&self, pred: impl Fn(&NodeState) -> bool) -> usize {
        self.nodes.iter().filter(|n| pred(&n.state())).count()
    }

    /// Waits until every node is registered; false on timeout.
    pub async fn wait_all_registered(&self, timeout: Duration) -> bool {
        let total = self.nodes.len();
        self.wait_until(|f| f.registered_count() == total, timeout)
            .await
    }

    /// Waits until `pred` holds, re-checking whenever some node's state or
    /// tables change; returns whether it held before `timeout`.
    pub async fn wait_until(
        &self,
        mut pred: impl FnMut(&SimFleet) -> bool,
        timeout: Duration,
    ) -> bool {
        let mut changes = self.changes.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if pred(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                // Debounce: a fleet changes in bursts, and `pred` is O(nodes).
                Ok(Ok(())) => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + DEBOUNCE)).await
                }
                _ => return pred(self),
            }
        }
    }

    /// The latest change of any node's state or tables. A change is
    /// counted under the lock that guards what it changed, so whatever a
    /// read saw is counted by the time the read returns.
    pub fn last_change(&self) -> Change {
        *self.changes.borrow()
    }

    /// Waits until a change after the `count`th, or `deadline`; whether
    /// there was one.
    pub async fn changed_after(&self, count: u64, deadline: Instant) -> bool {
        let mut changes = self.changes.subscribe();
        let moved = changes.wait_for(|c| c.count != count);
        matches!(tokio::time::timeout_at(deadline, moved).await, Ok(Ok(_)))
    }

    /// Crashes every node.
    pub fn crash_all(&self) {
        for node in &self.nodes {
            node.crash();
        }
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        self.crash_all();
    }
}
