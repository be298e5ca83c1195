//! A drill's steps: wait for a settled fleet, pick the target, perform
//! the fault, then measure until the fleet has converged again (see
//! [`super::view`]) or `within` has passed since the fault.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tonic::transport::Channel;

use super::fault::{self, Target};
use super::report::{Fencing, Report};
use super::snapshot::{self, admin, replicas};
use super::view::{Verdict, View, judge};
use super::{DrillError, Kind, Options};
use crate::proto::cluster as pb;
use crate::proto::cluster::admin_client::AdminClient;
use crate::store::PgStore;
use crate::store::model::ReplicaRef;

/// How often the leadership row is read while waiting for a new term: the
/// takeover it times takes tens of milliseconds.
const TERM_POLL: Duration = Duration::from_millis(10);

/// Runs the drill `opts` describes on the cluster `store` holds.
pub async fn drill(store: &PgStore, opts: &Options) -> Result<Report, DrillError> {
    opts.check()?;
    let admin = admin(&opts.server).await?;
    let before = settled(store, opts).await?;
    let listed = replicas(&admin).await?;
    let target = pick(opts, &before, &listed)?;
    let fault_cmd = render(opts.fault.as_ref(), &target)?;
    let resume_cmd = render(opts.resume.as_ref(), &target)?;
    let fenced_before = fencing(&listed);

    let t0 = Instant::now();
    match (&fault_cmd, opts.kind) {
        (_, Kind::StepDown) => step_down(&admin).await?,
        (Some(cmd), _) => fault::run(cmd).await?,
        (None, _) => return Err(DrillError::Input("no fault command".into())),
    }
    let new_term = if opts.kind.deposes() {
        let term = new_term(store, before.epoch, t0 + opts.within).await;
        if let Some(cmd) = &resume_cmd {
            fault::run(cmd).await.map_err(|e| {
                DrillError::Fault(format!(
                    "{e}; the leader may still be frozen: thaw it by hand"
                ))
            })?;
        }
        term
    } else {
        None
    };
    let gone: Vec<ReplicaRef> = if opts.kind.kills() {
        vec![ReplicaRef {
            id: target.replica.clone(),
            incarnation: target.incarnation,
        }]
    } else {
        Vec::new()
    };
    let (after, verdict, converged) = converge(store, opts, &before, &gone, t0).await?;
    let fenced_after = match replicas(&admin).await {
        Ok(listed) => Some(fencing(&listed)),
        Err(_) => None,
    };
    Ok(Report {
        kind: opts.kind.name(),
        target: target.replica,
        target_incarnation: target.incarnation,
        fault_cmd,
        resume_cmd,
        before: (&before).into(),
        after: (&after).into(),
        new_term_after: new_term.map(|d| d.as_secs_f64()),
        converged_after: converged.map(|d| d.as_secs_f64()),
        within: opts.within.as_secs_f64(),
        fencing: fenced_after.map(|a| Fencing::between(&fenced_before, &a)),
        verdict,
    })
}

/// The first settled view within `settle`.
async fn settled(store: &PgStore, opts: &Options) -> Result<View, DrillError> {
    let deadline = Instant::now() + opts.settle;
    loop {
        let view = snapshot::view(store).await?;
        match view.settled() {
            Ok(()) => return Ok(view),
            Err(why) if Instant::now() >= deadline => {
                return Err(DrillError::Unsettled(why, opts.settle));
            }
            Err(_) => sleep(opts.poll).await,
        }
    }
}

/// The replica the fault is aimed at, with what a template may name.
fn pick(opts: &Options, before: &View, listed: &[pb::ReplicaStatus]) -> Result<Target, DrillError> {
    let leader = before.leader.as_ref().map(|l| l.id.as_str());
    let status = match (opts.kind, &opts.replica) {
        (Kind::KillFollower, Some(id)) => listed
            .iter()
            .find(|r| r.id == *id)
            .ok_or_else(|| DrillError::NoTarget(format!("the cluster has no replica {id:?}")))?,
        (Kind::KillFollower, None) => listed
            .iter()
            .filter(|r| r.alive && Some(r.id.as_str()) != leader)
            .max_by_key(|r| (r.sessions, std::cmp::Reverse(r.id.clone())))
            .ok_or_else(|| DrillError::NoTarget("no live follower".into()))?,
        _ => listed
            .iter()
            .find(|r| Some(r.id.as_str()) == leader)
            .ok_or_else(|| DrillError::NoTarget("the leader is not among the replicas".into()))?,
    };
    if opts.kind == Kind::KillFollower && Some(status.id.as_str()) == leader {
        return Err(DrillError::NoTarget(format!(
            "{} leads: kill-follower kills a follower (kill-leader kills the leader)",
            status.id
        )));
    }
    let live = status.live.as_ref();
    Ok(Target {
        replica: status.id.clone(),
        incarnation: status.incarnation,
        relay: status.address.clone(),
        pid: live.map(|l| l.pid).filter(|p| *p != 0),
        host: live.map(|l| l.host.clone()).filter(|h| !h.is_empty()),
    })
}

fn render(
    template: Option<&super::Template>,
    target: &Target,
) -> Result<Option<String>, DrillError> {
    template.map(|t| t.render(target)).transpose()
}

async fn step_down(admin: &AdminClient<Channel>) -> Result<(), DrillError> {
    admin
        .clone()
        .step_down(pb::StepDownRequest {})
        .await
        .map(|_| ())
        .map_err(|s| DrillError::Admin(format!("step-down: {}", s.message())))
}

/// Time from the fault until the database shows a term above `epoch`;
/// `None` if none came before `deadline`. A database that does not answer
/// for a moment is read again.
async fn new_term(store: &PgStore, epoch: u64, deadline: Instant) -> Option<Duration> {
    let t0 = Instant::now();
    while Instant::now() < deadline {
        if let Ok(term) = store.leadership().await
            && term.epoch > epoch
            && term.leader.is_some()
        {
            return Some(t0.elapsed());
        }
        sleep(TERM_POLL).await;
    }
    None
}

/// Reads the fleet until it has converged again against `before` or
/// `within` has passed since `t0`; the last view, its verdict, and when it
/// converged.
async fn converge(
    store: &PgStore,
    opts: &Options,
    before: &View,
    gone: &[ReplicaRef],
    t0: Instant,
) -> Result<(View, Verdict, Option<Duration>), DrillError> {
    let deadline = t0 + opts.within;
    let mut last = None;
    loop {
        match snapshot::view(store).await {
            Ok(now) => {
                let verdict = judge(before, &now, gone, opts.kind.deposes());
                if verdict.converged {
                    return Ok((now, verdict, Some(t0.elapsed())));
                }
                last = Some((now, verdict));
            }
            // The database may be briefly away during a drill: read again.
            Err(e) if Instant::now() < deadline => tracing::debug!(error = %e, "reading again"),
            Err(e) => return last.map(|(v, j)| (v, j, None)).ok_or(e),
        }
        if Instant::now() >= deadline {
            return last.map(|(v, j)| (v, j, None)).ok_or_else(|| {
                DrillError::Database("no read of the fleet succeeded after the fault".into())
            });
        }
        sleep(opts.poll).await;
    }
}

/// Per replica id: its process and its fencing counters.
fn fencing(listed: &[pb::ReplicaStatus]) -> BTreeMap<String, (u32, u64, u64)> {
    listed
        .iter()
        .filter_map(|r| {
            let l = r.live.as_ref()?;
            Some((r.id.clone(), (l.pid, l.fenced_writes, l.commands_fenced)))
        })
        .collect()
}
