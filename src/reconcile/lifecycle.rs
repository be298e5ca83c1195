//! Level-based node lifecycle: what happened to a node, derived by comparing
//! its current record with what the leader saw when it last derived. No
//! event stream is trusted, so a crash followed by a quick re-registration
//! (one signal, or none before the next sweep) is still a departure of the
//! old generation and an arrival of the new one.

use crate::store::model::{DepartureKind, NodeRecord};

/// What the leader last derived from, per node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub generation: u64,
    pub connected: bool,
}

/// A change the leader must act on, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The session of `generation` ended.
    Departed {
        generation: u64,
        kind: DepartureKind,
    },
    /// A session of `generation` is ready.
    Arrived { generation: u64 },
}

/// The transitions from `seen` to `record`, and what the leader has seen
/// afterwards (`None`: nothing left to remember).
pub fn transitions(
    seen: Option<Seen>,
    record: Option<&NodeRecord>,
) -> (Vec<Transition>, Option<Seen>) {
    let Some(rec) = record else {
        let gone = seen.filter(|s| s.connected).map(|s| Transition::Departed {
            generation: s.generation,
            kind: DepartureKind::Deregistered,
        });
        return (gone.into_iter().collect(), None);
    };
    let live = rec.ready_session().map(|s| s.generation);
    if let Some(generation) = live {
        let now = Seen {
            generation,
            connected: true,
        };
        if seen == Some(now) {
            return (Vec::new(), seen);
        }
        let mut out: Vec<Transition> = replaced(seen).into_iter().collect();
        out.push(Transition::Arrived { generation });
        return (out, Some(now));
    }
    let out = match unhandled_departure(seen, rec) {
        Some(t) => Some(t),
        None if rec.session.is_some() => replaced(seen),
        None => None,
    };
    let last = seen
        .map_or(0, |s| s.generation)
        .max(rec.departure.map_or(0, |d| d.generation));
    (
        out.into_iter().collect(),
        Some(Seen {
            generation: last,
            connected: false,
        }),
    )
}

/// A session the leader saw connected was replaced by a newer one without a
/// goodbye: for its generation, that is a crash.
fn replaced(seen: Option<Seen>) -> Option<Transition> {
    seen.filter(|s| s.connected).map(|s| Transition::Departed {
        generation: s.generation,
        kind: DepartureKind::Crash,
    })
}

/// The record's own departure, unless the leader already acted on it. It
/// covers every older session too: cleanup is bounded by generation.
fn unhandled_departure(seen: Option<Seen>, rec: &NodeRecord) -> Option<Transition> {
    let dep = rec.departure.filter(|_| rec.session.is_none())?;
    let handled = seen.is_some_and(|s| {
        s.generation > dep.generation || (s.generation == dep.generation && !s.connected)
    });
    (!handled).then_some(Transition::Departed {
        generation: dep.generation,
        kind: dep.kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::{Departure, ReplicaRef, Session, SessionState};

    fn mk_record(
        session: Option<(u64, SessionState)>,
        departure: Option<(u64, DepartureKind)>,
    ) -> NodeRecord {
        let generation = session
            .map(|s| s.0)
            .into_iter()
            .chain(departure.map(|d| d.0))
            .max()
            .unwrap_or(0);
        NodeRecord {
            id: "g/n".into(),
            group: Some("g".into()),
            connection_details: vec![],
            reported_connections: vec![],
            reported_routes: vec![],
            revision: Default::default(),
            received_links: vec![],
            session: session.map(|(generation, state)| Session {
                id: uuid::Uuid::new_v4(),
                generation,
                owner: ReplicaRef {
                    id: "r".into(),
                    incarnation: 1,
                },
                state,
            }),
            generation,
            departure: departure.map(|(generation, kind)| Departure { generation, kind }),
            updated_at: 0,
        }
    }

    fn seen(generation: u64, connected: bool) -> Option<Seen> {
        Some(Seen {
            generation,
            connected,
        })
    }

    const READY: SessionState = SessionState::Ready;
    const CRASH: DepartureKind = DepartureKind::Crash;
    const BYE: DepartureKind = DepartureKind::Deregistered;

    #[test]
    fn first_ready_session_is_an_arrival() {
        let rec = mk_record(Some((3, READY)), None);
        let (t, s) = transitions(None, Some(&rec));
        assert_eq!(t, [Transition::Arrived { generation: 3 }]);
        assert_eq!(s, seen(3, true));
    }

    #[test]
    fn same_ready_session_again_is_nothing() {
        let rec = mk_record(Some((3, READY)), None);
        assert_eq!(
            transitions(seen(3, true), Some(&rec)),
            (vec![], seen(3, true))
        );
    }

    #[test]
    fn registering_session_waits_for_ready() {
        let rec = mk_record(Some((3, SessionState::Registering)), None);
        let (t, _) = transitions(None, Some(&rec));
        assert!(t.is_empty());
    }

    #[test]
    fn crash_then_fast_reregistration_is_departure_then_arrival() {
        let rec = mk_record(Some((7, READY)), None);
        let (t, s) = transitions(seen(3, true), Some(&rec));
        assert_eq!(
            t,
            [
                Transition::Departed {
                    generation: 3,
                    kind: CRASH
                },
                Transition::Arrived { generation: 7 }
            ]
        );
        assert_eq!(s, seen(7, true));
    }

    #[test]
    fn crash_is_a_departure_once() {
        let rec = mk_record(None, Some((3, CRASH)));
        let (t, s) = transitions(seen(3, true), Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 3,
                kind: CRASH
            }]
        );
        assert_eq!(transitions(s, Some(&rec)).0, []);
    }

    #[test]
    fn deregistration_keeps_its_kind() {
        let rec = mk_record(None, Some((3, BYE)));
        let (t, _) = transitions(seen(3, true), Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 3,
                kind: BYE
            }]
        );
    }

    #[test]
    fn departure_never_seen_connected_is_cleaned_up_once() {
        let rec = mk_record(None, Some((5, BYE)));
        let (t, s) = transitions(None, Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 5,
                kind: BYE
            }]
        );
        assert_eq!(transitions(s, Some(&rec)).0, []);
    }

    #[test]
    fn session_that_came_and_went_unseen_is_cleaned_up() {
        let rec = mk_record(None, Some((9, CRASH)));
        let (t, _) = transitions(seen(3, false), Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 9,
                kind: CRASH
            }]
        );
    }

    #[test]
    fn missed_deregistration_after_a_missed_session_keeps_its_kind() {
        let rec = mk_record(None, Some((9, BYE)));
        let (t, _) = transitions(seen(3, true), Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 9,
                kind: BYE
            }]
        );
    }

    #[test]
    fn replaced_by_a_registering_session_is_a_crash_then_wait() {
        let rec = mk_record(Some((7, SessionState::Registering)), None);
        let (t, s) = transitions(seen(3, true), Some(&rec));
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 3,
                kind: CRASH
            }]
        );
        let ready = mk_record(Some((7, READY)), None);
        assert_eq!(
            transitions(s, Some(&ready)).0,
            [Transition::Arrived { generation: 7 }]
        );
    }

    #[test]
    fn forgotten_record_of_a_connected_node_is_a_departure() {
        let (t, s) = transitions(seen(4, true), None);
        assert_eq!(
            t,
            [Transition::Departed {
                generation: 4,
                kind: BYE
            }]
        );
        assert_eq!(s, None);
    }
}
