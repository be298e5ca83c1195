//! Rows by id, with the ids of every node's rows beside them, for the
//! memory store: a reconcile reads one node's links and routes, and a scan
//! of them all made that read grow with the fleet (at 10,000 nodes each of
//! a convergence's reconciles walked 4,950 links and 19,800 routes, under
//! the store's one lock). Every change goes through these methods, so the
//! index cannot drift from the rows.

use std::collections::{BTreeMap, BTreeSet};

/// A row with an id of its own that belongs to up to two nodes (a link:
/// its source and its destination; a route: its source).
pub(super) trait ByNode {
    fn id(&self) -> &str;
    fn nodes(&self) -> [Option<&str>; 2];
}

/// The rows, and per node the ids of the rows that name it.
#[derive(Clone, Debug)]
pub(super) struct Indexed<T> {
    rows: BTreeMap<String, T>,
    by_node: BTreeMap<String, BTreeSet<String>>,
}

impl<T> Default for Indexed<T> {
    fn default() -> Self {
        Self {
            rows: BTreeMap::new(),
            by_node: BTreeMap::new(),
        }
    }
}

impl<T: ByNode> Indexed<T> {
    /// Inserts `row`, or replaces the row of its id; returns the one
    /// replaced.
    pub(super) fn insert(&mut self, row: T) -> Option<T> {
        let old = self.remove(row.id());
        self.index(&row);
        self.rows.insert(row.id().to_string(), row);
        old
    }

    pub(super) fn remove(&mut self, id: &str) -> Option<T> {
        let row = self.rows.remove(id)?;
        self.unindex(id, row.nodes().into_iter().flatten());
        Some(row)
    }

    pub(super) fn get(&self, id: &str) -> Option<&T> {
        self.rows.get(id)
    }

    /// Changes the row `id` in place with `change`; a change of the nodes
    /// it names moves it in the index too.
    pub(super) fn update<R>(&mut self, id: &str, change: impl FnOnce(&mut T) -> R) -> Option<R> {
        let row = self.rows.get_mut(id)?;
        let before = owned(row.nodes());
        let out = change(row);
        if before != owned(row.nodes()) {
            self.unindex(id, before.iter().flatten().map(String::as_str));
            if let Some(row) = self.rows.get(id) {
                index_into(&mut self.by_node, row);
            }
        }
        Some(out)
    }

    /// Puts `puts`, then removes `removes`; if `check` then refuses the
    /// rows, puts back what was there and returns its refusal. A refused
    /// change costs what it touched, not a copy of every row.
    pub(super) fn change_checked<E>(
        &mut self,
        puts: Vec<T>,
        removes: &[String],
        check: impl FnOnce(&Self) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut undo: Vec<(String, Option<T>)> = Vec::with_capacity(puts.len() + removes.len());
        for row in puts {
            let id = row.id().to_string();
            undo.push((id, self.insert(row)));
        }
        for id in removes {
            if let Some(old) = self.remove(id) {
                undo.push((id.clone(), Some(old)));
            }
        }
        let verdict = check(self);
        if verdict.is_err() {
            for (id, old) in undo.into_iter().rev() {
                match old {
                    Some(row) => drop(self.insert(row)),
                    None => drop(self.remove(&id)),
                }
            }
        }
        verdict
    }

    /// Every row, in id order.
    pub(super) fn values(&self) -> impl Iterator<Item = &T> {
        self.rows.values()
    }

    /// The rows that name `node`, in id order.
    pub(super) fn of_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a T> + 'a {
        let ids = self.by_node.get(node).into_iter().flatten();
        ids.filter_map(|id| self.rows.get(id))
    }

    fn unindex<'n>(&mut self, id: &str, nodes: impl Iterator<Item = &'n str>) {
        for node in nodes {
            if let Some(ids) = self.by_node.get_mut(node) {
                ids.remove(id);
                if ids.is_empty() {
                    self.by_node.remove(node);
                }
            }
        }
    }

    fn index(&mut self, row: &T) {
        index_into(&mut self.by_node, row);
    }
}

/// Adds `row` to the ids of each node it names; a node's key is copied
/// only the first time.
fn index_into<T: ByNode>(by_node: &mut BTreeMap<String, BTreeSet<String>>, row: &T) {
    for node in row.nodes().into_iter().flatten() {
        let id = row.id().to_string();
        match by_node.get_mut(node) {
            Some(ids) => drop(ids.insert(id)),
            None => drop(by_node.insert(node.to_string(), BTreeSet::from([id]))),
        }
    }
}

fn owned(nodes: [Option<&str>; 2]) -> [Option<String>; 2] {
    nodes.map(|n| n.map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Id, first node, second node, a value.
    #[derive(Clone, Debug, PartialEq)]
    struct Row(String, String, Option<String>, u8);

    impl ByNode for Row {
        fn id(&self) -> &str {
            &self.0
        }

        fn nodes(&self) -> [Option<&str>; 2] {
            [Some(self.1.as_str()), self.2.as_deref()]
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(Row),
        Remove(u8),
        Update(u8, u8),
    }

    fn node() -> impl Strategy<Value = String> {
        (0u8..4).prop_map(|n| format!("n{n}"))
    }

    /// Ids from a small range, so that rows are replaced and removed.
    fn row() -> impl Strategy<Value = Row> {
        (0u8..8, node(), proptest::option::of(node()), any::<u8>())
            .prop_map(|(id, a, b, v)| Row(id.to_string(), a, b, v))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            row().prop_map(Op::Insert),
            (0u8..8).prop_map(Op::Remove),
            (0u8..8, any::<u8>()).prop_map(|(id, v)| Op::Update(id, v)),
        ]
    }

    fn table(rows: Vec<Row>) -> Indexed<Row> {
        let mut t = Indexed::default();
        rows.into_iter().for_each(|r| drop(t.insert(r)));
        t
    }

    proptest! {
        /// After any sequence of changes, a node's rows are exactly those a
        /// scan of every row finds, in the same order.
        #[test]
        fn a_nodes_rows_are_what_a_scan_finds(ops in proptest::collection::vec(op(), 0..60)) {
            let mut t: Indexed<Row> = Indexed::default();
            for op in ops {
                match op {
                    Op::Insert(r) => drop(t.insert(r)),
                    Op::Remove(id) => drop(t.remove(&id.to_string())),
                    Op::Update(id, v) => drop(t.update(&id.to_string(), |r| {
                        r.3 = v;
                        // Some updates move the row to other nodes.
                        if v % 3 == 0 {
                            r.2 = Some(format!("n{}", v % 4));
                        }
                    })),
                }
            }
            for n in 0..5 {
                let n = format!("n{n}");
                let scanned: Vec<&Row> = t.values().filter(|r| r.nodes().contains(&Some(n.as_str()))).collect();
                let looked_up: Vec<&Row> = t.of_node(&n).collect();
                prop_assert_eq!(scanned, looked_up);
            }
            prop_assert!(t.by_node.values().all(|ids| !ids.is_empty()), "no empty entry is kept");
        }
    }

    proptest! {
        /// A refused change leaves every row and the index as they were.
        #[test]
        fn a_refused_change_undoes_itself(
            before in proptest::collection::vec(row(), 0..30),
            puts in proptest::collection::vec(row(), 0..8),
            removes in proptest::collection::vec(0u8..8, 0..8),
        ) {
            let mut t = table(before);
            let (rows, index) = (t.rows.clone(), t.by_node.clone());
            let removes: Vec<String> = removes.iter().map(u8::to_string).collect();
            let refused = t.change_checked(puts, &removes, |_| Err("no"));
            prop_assert_eq!(refused, Err("no"));
            prop_assert_eq!(&t.rows, &rows);
            prop_assert_eq!(&t.by_node, &index);
        }

        /// An accepted change is the puts, then the removes, one after the
        /// other.
        #[test]
        fn an_accepted_change_is_its_puts_then_its_removes(
            before in proptest::collection::vec(row(), 0..30),
            puts in proptest::collection::vec(row(), 0..8),
            removes in proptest::collection::vec(0u8..8, 0..8),
        ) {
            let mut t = table(before.clone());
            let mut expected = table(before);
            puts.iter().for_each(|r| drop(expected.insert(r.clone())));
            let removes: Vec<String> = removes.iter().map(u8::to_string).collect();
            removes.iter().for_each(|id| drop(expected.remove(id)));
            let accepted = t.change_checked(puts, &removes, |_| Ok::<(), ()>(()));
            prop_assert_eq!(accepted, Ok(()));
            prop_assert_eq!(&t.rows, &expected.rows);
            prop_assert_eq!(&t.by_node, &expected.by_node);
        }
    }

    #[test]
    fn a_replaced_row_leaves_its_old_nodes() {
        let mut t = table(vec![Row("l".into(), "a".into(), Some("b".into()), 0)]);
        let old = t.insert(Row("l".into(), "c".into(), None, 1));
        assert_eq!(old.map(|r| r.1), Some("a".to_string()));
        assert_eq!(t.of_node("a").count(), 0);
        assert_eq!(t.of_node("b").count(), 0);
        assert_eq!(t.of_node("c").map(|r| r.3).collect::<Vec<_>>(), [1]);
    }
}
