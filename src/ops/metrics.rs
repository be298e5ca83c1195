//! Prometheus metrics (`/metrics`), with the `slim_cp_` prefix. Counters
//! the code increments as things happen live in [`Metrics`]; values other
//! parts already keep (sessions held, the leader's queue, commands, relay
//! refusals, the store's per-operation counters) are read at each scrape
//! by [`Live`], so nothing is counted twice.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cluster::Replica;
use crate::cluster::relay::Guard;
use crate::store::PgStore;

/// One label.
pub type Label = [(&'static str, &'static str); 1];
/// Two labels.
pub type Labels = [(&'static str, &'static str); 2];

/// What the code counts as it happens.
#[derive(Debug)]
pub struct Metrics {
    /// Registrations by outcome: `recorded`, `answered_unrecorded` (the
    /// store was away), `refused`.
    pub registrations: Family<Label, Counter>,
    /// Refused registrations by reason.
    pub refusals: Family<Label, Counter>,
    /// Facts recorded in the store, by kind.
    pub facts: Family<Label, Counter>,
    /// Facts waiting in sessions' outboxes.
    pub outbox: Gauge,
    /// Bytes those facts hold (see `southbound::outbox`).
    pub outbox_bytes: Gauge,
    /// Entries a node sent that were dropped, by reason (`bad_name`,
    /// `bad_link_id`, `too_many`, `store_rejected`, `outbox_full`).
    pub dropped: Family<Label, Counter>,
    /// Reconciles by outcome.
    pub reconciles: Family<Label, Counter>,
    pub reconcile_seconds: Histogram,
    /// Links deleted and created again to drop routes a node could no
    /// longer remove (see `reconcile::stranded`).
    pub links_recreated: Counter,
    /// Relay calls this replica answered, by method and outcome.
    pub relay_calls: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            registrations: Family::default(),
            refusals: Family::default(),
            facts: Family::default(),
            outbox: Gauge::default(),
            outbox_bytes: Gauge::default(),
            dropped: Family::default(),
            reconciles: Family::default(),
            // 1 ms to about 16 s.
            reconcile_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            links_recreated: Counter::default(),
            relay_calls: Family::default(),
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts `n` entries from nodes dropped for `reason`.
    pub fn drop_entries(&self, reason: &'static str, n: usize) {
        if n > 0 {
            let by = self.dropped.get_or_create(&[("reason", reason)]);
            by.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }

    /// The registry to scrape: these counters and `live`'s values.
    pub fn registry(&self, live: Live) -> Registry {
        let mut r = Registry::with_prefix("slim_cp");
        r.register(
            "registrations",
            "Registrations by outcome",
            self.registrations.clone(),
        );
        r.register(
            "registration_refusals",
            "Registrations refused, by reason",
            self.refusals.clone(),
        );
        r.register(
            "facts_recorded",
            "Facts recorded in the store, by kind",
            self.facts.clone(),
        );
        r.register(
            "outbox_facts",
            "Facts waiting in sessions' outboxes",
            self.outbox.clone(),
        );
        r.register(
            "outbox_bytes",
            "Bytes held by the facts in sessions' outboxes",
            self.outbox_bytes.clone(),
        );
        r.register(
            "entries_dropped",
            "Entries from nodes dropped instead of recorded, by reason",
            self.dropped.clone(),
        );
        r.register(
            "reconciles",
            "Reconciles by outcome",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time one reconcile took",
            self.reconcile_seconds.clone(),
        );
        r.register(
            "links_recreated",
            "Links re-created to drop routes a node could no longer remove",
            self.links_recreated.clone(),
        );
        r.register(
            "relay_calls",
            "Relay calls answered, by method and outcome",
            self.relay_calls.clone(),
        );
        r.register_collector(Box::new(live));
        r
    }
}

/// Values read from the rest of the replica at each scrape.
pub struct Live {
    pub replica: Arc<Replica>,
    pub guard: Option<Guard>,
    pub store: Option<PgStore>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counters<'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl IntoIterator<Item = (Vec<(&'static str, &'a str)>, u64)>,
) -> fmt::Result {
    let mut family = e.encode_descriptor(
        name,
        help,
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (labels, v) in values {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Live {
    fn replica_values(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let r = &self.replica;
        let sessions = signed(r.transport.registry().len() as u64);
        gauge(
            e,
            "sessions",
            "Node control sessions held by this replica",
            sessions,
        )?;
        let waiting = signed(r.transport.registry().waiting() as u64);
        gauge(
            e,
            "requests_waiting",
            "Requests to nodes waiting for their reply on this replica",
            waiting,
        )?;
        let role = r.leadership.role();
        gauge(
            e,
            "leader",
            "1 while this replica leads",
            i64::from(role.epoch().is_some()),
        )?;
        let epoch = signed(r.transport.highest_epoch());
        gauge(
            e,
            "epoch",
            "The highest leadership epoch this replica has seen",
            epoch,
        )?;
        if let Some(age) = r.leadership.lease_age().filter(|_| role.epoch().is_some()) {
            let g = ConstGauge::new(age.as_secs_f64());
            let help = "Time since the leader last renewed its lease";
            g.encode(e.encode_descriptor("lease_age_seconds", help, None, g.metric_type())?)?;
        }
        gauge(
            e,
            "drain_flag",
            "1 while the leader has flagged this replica for drain (its relay calls here fail)",
            i64::from(r.health.drain_flagged()),
        )?;
        gauge(
            e,
            "listening",
            "1 while the node listener is open (closed: draining, or the database unreachable)",
            i64::from(r.health.is_listening()),
        )?;
        let depth = signed((r.queue_depth)());
        gauge(
            e,
            "reconcile_queue_depth",
            "Nodes waiting for a reconcile (leader)",
            depth,
        )?;
        let c = r.transport.counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let results = [
            ("acked", load(&c.acked)),
            ("failed", load(&c.failed)),
            ("fenced", load(&c.fenced)),
        ];
        let help = "Commands to nodes by result (acked and failed ones were sent)";
        counters(
            e,
            "commands",
            help,
            results.map(|(k, v)| (vec![("result", k)], v)),
        )
    }

    fn relay_values(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some(guard) = &self.guard else {
            return Ok(());
        };
        let refused = guard.refused();
        let help = "Relay calls refused, by reason";
        counters(
            e,
            "relay_refused",
            help,
            refused
                .iter()
                .map(|(k, v)| (vec![("reason", k.as_str())], *v)),
        )
    }

    fn store_values(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let ops = store.metrics().ops;
        let outcomes = ops.iter().flat_map(|(op, m)| {
            let ok = m.calls - m.errors;
            let refused = m.errors - m.unavailable - m.fenced;
            [
                ("ok", ok),
                ("refused", refused),
                ("unavailable", m.unavailable),
                ("fenced", m.fenced),
            ]
            .map(|(o, v)| (vec![("op", *op), ("outcome", o)], v))
        });
        counters(
            e,
            "store_transactions",
            "Store transactions by operation and outcome",
            outcomes,
        )?;
        let retries = ops.iter().map(|(op, m)| (vec![("op", *op)], m.retries));
        counters(
            e,
            "store_retries",
            "Transactions rerun after a serialization failure or deadlock",
            retries,
        )?;
        let fenced: u64 = ops.values().map(|m| m.fenced).sum();
        counters(
            e,
            "fenced_writes",
            "Leader writes refused because another leader took over",
            [(vec![], fenced)],
        )?;
        let mut family = e.encode_descriptor(
            "store_transaction_seconds",
            "Time spent in store transactions, by operation",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (op, m) in &ops {
            let labels = [("op", *op)];
            ConstCounter::new(m.total_latency.as_secs_f64())
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        self.replica_values(&mut encoder)?;
        self.relay_values(&mut encoder)?;
        self.store_values(&mut encoder)
    }
}

/// The registry in the text format Prometheus scrapes.
pub fn render(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}
