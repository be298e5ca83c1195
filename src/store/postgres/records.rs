//! A reconcile's record of what its node answered, written with group
//! commit (see [`super::group`]): the records the leader's workers make
//! while a batch of them commits go together into the next batch. A wave
//! of commands then costs a few transactions of three statements each,
//! whatever the number of nodes, instead of one transaction per node.
//!
//! A batch is one fenced transaction per leadership epoch among its
//! records (one, except across a change of term). Each record keeps its
//! meaning: a link's answer counts only while the link is live at the
//! record's source, and a later record's mark or answer wins over an
//! earlier one's, as when written one by one.

use super::group::{Group, WriteFuture};
use super::tx::{Db, Mode, Op, Tx, TxError, relaxed};
use super::{links, routes};
use crate::store::StoreError;
use crate::store::model::{LinkAnswer, RouteMark};

/// One reconcile's record.
#[derive(Debug, Clone)]
pub(super) struct Record {
    /// The epoch of the leader writing it, when fenced.
    pub fence: Option<u64>,
    pub source: String,
    pub answers: Vec<LinkAnswer>,
    pub marks: Vec<RouteMark>,
    /// Tombstones the node no longer holds.
    pub forgotten: Vec<String>,
}

/// The group writing records on `tx` (the leader's pool).
pub(super) fn spawn(tx: Tx) -> Group<Record, ()> {
    Group::spawn(move |calls| write_batch(tx.clone(), calls), |r| &r.source)
}

/// A batch's answers. Within one term, a failure is the whole batch's, so
/// that one the database refuses is written again record by record.
fn write_batch(tx: Tx, calls: Vec<Record>) -> WriteFuture<()> {
    Box::pin(async move {
        let terms = terms(&calls);
        if let [only] = terms.as_slice() {
            write_term(&tx, only).await?;
            return Ok(vec![Ok(()); calls.len()]);
        }
        let mut answers = Vec::with_capacity(calls.len());
        for term in &terms {
            let written = write_term(&tx, term).await;
            answers.extend(term.iter().map(|_| written.clone()));
        }
        Ok(answers)
    })
}

/// One fenced transaction for records of one epoch.
async fn write_term(tx: &Tx, records: &[&Record]) -> Result<(), StoreError> {
    let op = Op::new("record_acknowledgement", Mode::Derive(records[0].fence));
    tx.run(op, records, |db, records| {
        Box::pin(relaxed(db, write(db, records)))
    })
    .await
}

/// The calls in runs of one epoch, in call order.
fn terms(calls: &[Record]) -> Vec<Vec<&Record>> {
    let mut out: Vec<Vec<&Record>> = Vec::new();
    for r in calls {
        match out.last_mut() {
            Some(run) if run[0].fence == r.fence => run.push(r),
            _ => out.push(vec![r]),
        }
    }
    out
}

/// The records' three writes, sent together: they touch different rows,
/// and each waits only for its own answers.
async fn write(db: &Db<'_>, records: &[&Record]) -> Result<(), TxError> {
    let answered: Vec<(&str, &[LinkAnswer])> = (records.iter())
        .filter(|r| !r.answers.is_empty())
        .map(|r| (r.source.as_str(), r.answers.as_slice()))
        .collect();
    let marks = records.iter().flat_map(|r| &r.marks);
    let forgotten: Vec<String> = (records.iter())
        .flat_map(|r| r.forgotten.iter().cloned())
        .collect();
    tokio::try_join!(
        links::mark_sent(db, &answered),
        routes::mark(db, marks),
        links::delete(db, &forgotten)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(source: &str, fence: Option<u64>) -> Record {
        Record {
            fence,
            source: source.into(),
            answers: Vec::new(),
            marks: Vec::new(),
            forgotten: Vec::new(),
        }
    }

    #[test]
    fn a_batch_is_split_where_the_epoch_changes_only() {
        let calls = [
            record("a", Some(1)),
            record("b", Some(1)),
            record("c", Some(2)),
            record("d", Some(2)),
            record("e", None),
        ];
        let runs: Vec<Vec<&str>> = terms(&calls)
            .iter()
            .map(|run| run.iter().map(|r| r.source.as_str()).collect())
            .collect();
        assert_eq!(runs, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
    }
}
