//! Random message sequences on a live southbound stream: whatever a node
//! sends after registering, good and bad entries mixed with stray replies,
//! the session stays served and the store holds exactly the good names the
//! node announced and did not withdraw.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{RawNode, mk_name, wait_for};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use slim_cp::proto::sb::control_message::Payload;
use slim_cp::proto::{dp, sb};
use slim_cp::server::{self, Options, Running};
use slim_cp::store::{MemoryStore, Store};

/// A name a node may send: one of a few good ones, or one the door drops.
#[derive(Debug, Clone)]
enum Spec {
    Good(u8),
    Empty,
    Control,
    TooLong,
    Nameless,
}

#[derive(Debug, Clone)]
enum Op {
    Announce(Vec<Spec>),
    Withdraw(Vec<Spec>),
    Claim(Vec<Option<String>>),
    StrayAck(String, bool),
    StrayRoutes(String, bool),
    StrayRegister,
    Empty,
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        4 => (0u8..6).prop_map(Spec::Good),
        1 => Just(Spec::Empty),
        1 => Just(Spec::Control),
        1 => Just(Spec::TooLong),
        1 => Just(Spec::Nameless),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let link = prop_oneof![
        Just(None),
        "[a-z0-9-]{1,12}".prop_map(Some),
        Just(Some("x".repeat(400))),
    ];
    prop_oneof![
        4 => prop::collection::vec(spec(), 0..5).prop_map(Op::Announce),
        3 => prop::collection::vec(spec(), 0..5).prop_map(Op::Withdraw),
        1 => prop::collection::vec(link, 0..4).prop_map(Op::Claim),
        1 => ("[a-z0-9]{0,8}", any::<bool>()).prop_map(|(id, ok)| Op::StrayAck(id, ok)),
        1 => ("[a-z0-9]{0,8}", any::<bool>()).prop_map(|(id, done)| Op::StrayRoutes(id, done)),
        1 => Just(Op::StrayRegister),
        1 => Just(Op::Empty),
    ]
}

fn wire(spec: &Spec) -> sb::Route {
    let name = |last: &str| Some(mk_name(last));
    let name = match spec {
        Spec::Good(i) => name(&format!("good{i}")),
        Spec::Empty => name(""),
        Spec::Control => name("bad\u{0}name"),
        Spec::TooLong => name(&"y".repeat(300)),
        Spec::Nameless => None::<dp::Name>,
    };
    sb::Route {
        name,
        ..Default::default()
    }
}

fn payload(op: &Op) -> Option<Payload> {
    let command = |set: &[Spec], delete: &[Spec], claims: &[Option<String>]| {
        Payload::ConfigCommand(sb::ConfigurationCommand {
            routes_to_set: set.iter().map(wire).collect(),
            routes_to_delete: delete.iter().map(wire).collect(),
            connections_received: claims
                .iter()
                .map(|l| sb::ConnectionEntry {
                    link_id: l.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    };
    Some(match op {
        Op::Announce(s) => command(s, &[], &[]),
        Op::Withdraw(s) => command(&[], s, &[]),
        Op::Claim(c) => command(&[], &[], c),
        Op::StrayAck(id, success) => Payload::Ack(sb::Ack {
            original_message_id: id.clone(),
            success: *success,
            messages: vec![],
        }),
        Op::StrayRoutes(id, done) => Payload::RouteListResponse(sb::RouteListResponse {
            original_message_id: id.clone(),
            entries: vec![sb::RouteEntry::default()],
            done: *done,
        }),
        Op::StrayRegister => Payload::RegisterNodeRequest(common::mk_register("other", "x")),
        Op::Empty => return None,
    })
}

/// The good names announced and not withdrawn since, in order.
fn model(ops: &[Op]) -> BTreeSet<String> {
    let mut held = BTreeSet::new();
    for op in ops {
        let (specs, announce) = match op {
            Op::Announce(s) => (s, true),
            Op::Withdraw(s) => (s, false),
            _ => continue,
        };
        for spec in specs {
            let Spec::Good(i) = spec else { continue };
            let name = format!("good{i}");
            if announce {
                held.insert(name);
            } else {
                held.remove(&name);
            }
        }
    }
    held
}

async fn case(cp: &Running, n: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let group = format!("p{n}");
    let node = format!("{group}/n");
    let raw = RawNode::connect(cp, &group, "n").await;
    for op in &ops {
        let msg = sb::ControlMessage {
            message_id: format!("m{n}"),
            payload: payload(op),
        };
        raw.tx
            .send(msg)
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    // The sentinel comes last on the stream: once it is recorded, every
    // fact before it has been.
    raw.send(common::announce(&["sentinel"])).await;
    let mut want = model(&ops);
    want.insert("sentinel".into());
    let got = wait_for("the sentinel recorded", || async {
        match common::announced_by(cp, &node).await? {
            got if got.contains("sentinel") => Ok(got),
            got => Err(format!("{got:?}")),
        }
    })
    .await;
    prop_assert_eq!(got, want);
    let rec = cp
        .store
        .get_node(&node)
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(
        rec.is_some_and(|r| r.ready_session().is_some()),
        "the session stands"
    );
    Ok(())
}

fn run(on_postgres: bool, cases: u32) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let cp = rt.block_on(async {
        let store: Arc<dyn Store> = match on_postgres {
            true => common::pg::fresh_pg_store().await,
            false => Arc::new(MemoryStore::new()),
        };
        server::start(Options::loopback(), store)
            .await
            .expect("replica starts")
    });
    let seq = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let ops = prop::collection::vec(op(), 0..24);
    let result = runner.run(&ops, |ops| {
        let n = seq.fetch_add(1, Ordering::Relaxed);
        rt.block_on(case(&cp, n, ops))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn random_sequences_on_memory() {
    run(false, 48);
}

#[test]
fn random_sequences_on_postgres() {
    run(true, 12);
}
