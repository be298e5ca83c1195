//! The stored routes as a derivation compares with them: by id, and by
//! name, so that a derivation looking at a few names reads only theirs.

use super::{FastMap, FastSet};
use crate::store::model::{Name, Route};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoredRoutes {
    /// Route id to its source node and name.
    by_id: FastMap<String, (String, Name)>,
    by_name: FastMap<Name, FastSet<String>>,
}

impl StoredRoutes {
    pub fn new<'r>(routes: impl IntoIterator<Item = &'r Route>) -> Self {
        let mut out = StoredRoutes::default();
        for r in routes {
            out.insert(r);
        }
        out
    }

    pub fn insert(&mut self, r: &Route) {
        self.remove(&r.id);
        let ids = self.by_name.entry(r.name.clone()).or_default();
        ids.insert(r.id.clone());
        let entry = (r.source_node.clone(), r.name.clone());
        self.by_id.insert(r.id.clone(), entry);
    }

    pub fn remove(&mut self, id: &str) {
        let Some((_, name)) = self.by_id.remove(id) else {
            return;
        };
        if let Some(ids) = self.by_name.get_mut(&name) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_name.remove(&name);
            }
        }
    }

    /// The stored id equal to `id`, if there is one.
    pub fn get(&self, id: &str) -> Option<&str> {
        self.by_id.get_key_value(id).map(|(k, _)| k.as_str())
    }

    /// Every route as `(id, source node)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_id
            .iter()
            .map(|(id, (s, _))| (id.as_str(), s.as_str()))
    }

    /// The ids of the routes of `name`.
    pub fn ids_of(&self, name: &Name) -> Option<&FastSet<String>> {
        self.by_name.get(name)
    }

    /// The source node of route `id`.
    pub fn source_of(&self, id: &str) -> Option<&str> {
        self.by_id.get(id).map(|(s, _)| s.as_str())
    }

    /// The names with routes, in no order.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.by_name.keys()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
