//! The network a partition drill runs its replicas on, and the cuts it
//! makes. By default each replica runs in its own network namespace and a
//! cut drops packets ([`netns`]); Postgres, which listens on loopback only,
//! is reached through a plain TCP forwarder in the root namespace, one per
//! replica, listening on that replica's database link. Where namespaces
//! cannot be made the drill fails, saying so, unless `SLIM_CP_NO_NETNS=1`
//! asks for the black-holing proxies instead ([`fallback`]).

#![allow(dead_code)]

pub mod drill;
mod fallback;
pub mod netns;
pub mod report;
mod slot;
pub mod watch;

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

use crate::cluster_support::Placement;
use crate::common::cut::pg_addr;
use crate::common::proxy::Proxy;
use netns::Netns;

pub enum Fabric {
    Netns {
        spaces: Vec<Netns>,
        /// One Postgres forwarder per replica, on its `db0` link.
        forwarders: Vec<Proxy>,
        /// Relay cuts in force, as (from, to) replica indexes.
        cuts: Mutex<Vec<(usize, usize)>>,
    },
    Proxies(fallback::Proxies),
}

impl Fabric {
    /// The network for `n` replicas; panics, saying what to do, when
    /// namespaces cannot be made and the fallback was not asked for.
    pub async fn new(n: usize) -> Fabric {
        if std::env::var("SLIM_CP_NO_NETNS").is_ok_and(|v| v == "1") {
            return Fabric::Proxies(fallback::Proxies::new(n).await);
        }
        let mut spaces = Vec::new();
        for _ in 0..n {
            match Netns::create() {
                Ok(ns) => spaces.push(ns),
                Err(why) => panic!(
                    "partition drills need network namespaces (root, iproute2): {why}; \
                     set SLIM_CP_NO_NETNS=1 to run them on black-holing proxies instead"
                ),
            }
        }
        let mut forwarders = Vec::new();
        for ns in &spaces {
            let bind = SocketAddr::new(IpAddr::V4(ns.db_host()), 0);
            forwarders.push(Proxy::start_on(bind, pg_addr()).await);
        }
        Fabric::Netns {
            spaces,
            forwarders,
            cuts: Mutex::new(Vec::new()),
        }
    }

    /// Which network ran, for the drill's report.
    pub fn kind(&self) -> &'static str {
        match self {
            Fabric::Netns { .. } => "netns (packets dropped)",
            Fabric::Proxies(_) => "black-holing proxies (SLIM_CP_NO_NETNS=1)",
        }
    }

    /// For [`crate::cluster_support::Cluster::start_placed`]: replica
    /// `i`'s database URL (from `url`) and placement.
    pub fn place(&self, i: usize, url: &str) -> (String, Placement) {
        let pg = pg_addr().to_string();
        match self {
            Fabric::Netns {
                spaces, forwarders, ..
            } => {
                let place = Placement {
                    host: IpAddr::V4(spaces[i].addr()),
                    netns: Some(spaces[i].name.clone()),
                    relay_advertise: None,
                    relay_port: None,
                };
                (url.replace(&pg, &forwarders[i].addr.to_string()), place)
            }
            Fabric::Proxies(p) => p.place(i, url, &pg),
        }
    }

    /// Replica `i` cut off from everything: database, peers, balancer.
    pub fn cut_all(&self, i: usize) {
        match self {
            Fabric::Netns { spaces, .. } => {
                spaces[i].cut(true).expect("database path cut");
                spaces[i].cut(false).expect("network cut");
            }
            Fabric::Proxies(p) => p.cut_all(i),
        }
    }

    /// Replica `i` cut off from Postgres only.
    pub fn cut_db(&self, i: usize) {
        match self {
            Fabric::Netns { spaces, .. } => spaces[i].cut(true).expect("database path cut"),
            Fabric::Proxies(p) => p.cut_db(i),
        }
    }

    /// Replicas `a` and `b` cut off from each other (their relays).
    pub fn cut_between(&self, a: usize, b: usize) {
        match self {
            Fabric::Netns { spaces, cuts, .. } => {
                netns::blackhole(spaces[a].addr(), spaces[b].addr(), true)
                    .expect("blackhole rules added");
                lock(cuts).push((a, b));
            }
            Fabric::Proxies(p) => p.cut_relay(b),
        }
    }

    /// Every cut undone.
    pub fn heal(&self) {
        match self {
            Fabric::Netns { spaces, cuts, .. } => {
                for ns in spaces {
                    ns.heal(true);
                    ns.heal(false);
                }
                for (a, b) in lock(cuts).drain(..) {
                    let _ = netns::blackhole(spaces[a].addr(), spaces[b].addr(), false);
                }
            }
            Fabric::Proxies(p) => p.heal(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Fabric {
    /// Rules live in the shared root namespace: never leave one behind.
    fn drop(&mut self) {
        self.heal();
    }
}
