//! The drills' network where namespaces cannot be made
//! (`SLIM_CP_NO_NETNS=1`): replicas on loopback, each one's database URL
//! and advertised relay address through a proxy that can black-hole (drop
//! every byte, keep connections open and silent). Coarser than namespaces:
//! southbound streams are never cut (a black-holing proxy in front of a
//! replica would accept the balancer's connect and so defeat its
//! redispatch), and a relay cut silences the replica's relay for every
//! peer, not for one.

use std::net::SocketAddr;

use crate::cluster_support::Placement;
use crate::cluster_support::replica::free_port;
use crate::common::cut::pg_addr;
use crate::common::proxy::Proxy;

pub struct Proxies {
    db: Vec<Proxy>,
    relay: Vec<Proxy>,
    relay_ports: Vec<u16>,
}

impl Proxies {
    pub async fn new(n: usize) -> Proxies {
        let (mut db, mut relay, mut relay_ports) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let port = free_port();
            db.push(Proxy::start(pg_addr()).await);
            relay.push(Proxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await);
            relay_ports.push(port);
        }
        Proxies {
            db,
            relay,
            relay_ports,
        }
    }

    pub fn place(&self, i: usize, url: &str, pg: &str) -> (String, Placement) {
        let place = Placement {
            relay_advertise: Some(self.relay[i].addr),
            relay_port: Some(self.relay_ports[i]),
            ..Placement::loopback()
        };
        (url.replace(pg, &self.db[i].addr.to_string()), place)
    }

    pub fn cut_all(&self, i: usize) {
        self.db[i].blackhole();
        self.relay[i].blackhole();
    }

    pub fn cut_db(&self, i: usize) {
        self.db[i].blackhole();
    }

    pub fn cut_relay(&self, i: usize) {
        self.relay[i].blackhole();
    }

    pub fn heal(&self) {
        for p in self.db.iter().chain(&self.relay) {
            p.restore();
        }
    }
}
