//! The stored routes as a derivation compares with them: by id, and by
//! name, so that a derivation looking at a few names reads only theirs.
//!
//! A fleet has many routes (two per name and group at 10,000 nodes: 19,800)
//! and the leader keeps these for as long as it leads, so each id is held
//! once for both indexes, each name once for all its routes and each
//! source (a gateway) once for all of its.

use std::sync::Arc;

use super::{FastMap, FastSet};
use crate::store::model::{Name, Route};

#[derive(Debug, Default, Clone)]
pub struct StoredRoutes {
    /// Route id to its source node and name.
    by_id: FastMap<Arc<str>, (Arc<str>, Arc<Name>)>,
    by_name: FastMap<Arc<Name>, FastSet<Arc<str>>>,
    /// The sources seen, shared by their routes.
    sources: FastSet<Arc<str>>,
}

impl PartialEq for StoredRoutes {
    /// The same routes; which sources were seen on the way does not count.
    fn eq(&self, other: &Self) -> bool {
        self.by_id == other.by_id
    }
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
        let id: Arc<str> = Arc::from(r.id.as_str());
        let source = self.source(&r.source_node);
        let name = match self.by_name.get_key_value(&r.name) {
            Some((name, _)) => name.clone(),
            None => Arc::new(r.name.clone()),
        };
        let ids = self.by_name.entry(name.clone()).or_default();
        ids.insert(id.clone());
        self.by_id.insert(id, (source, name));
    }

    /// The shared copy of `node`'s id.
    fn source(&mut self, node: &str) -> Arc<str> {
        if let Some(s) = self.sources.get(node) {
            return s.clone();
        }
        let s: Arc<str> = Arc::from(node);
        self.sources.insert(s.clone());
        s
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
        self.by_id.get_key_value(id).map(|(k, _)| &**k)
    }

    /// Every route as `(id, source node)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_id.iter().map(|(id, (s, _))| (&**id, &**s))
    }

    /// The ids of the routes of `name`.
    pub fn ids_of(&self, name: &Name) -> impl Iterator<Item = &str> {
        self.by_name.get(name).into_iter().flatten().map(|id| &**id)
    }

    /// The stored copy of `id`, when it is a route of `name`.
    pub fn has(&self, name: &Name, id: &str) -> Option<&str> {
        let ids = self.by_name.get(name)?;
        ids.get(id).map(|id| &**id)
    }

    /// The source node of route `id`.
    pub fn source_of(&self, id: &str) -> Option<&str> {
        self.by_id.get(id).map(|(s, _)| &**s)
    }

    /// The names with routes, in no order.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.by_name.keys().map(|n| &**n)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}
