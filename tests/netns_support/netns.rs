//! One replica's network namespace, joined to the root namespace by two
//! veth pairs with private /30 subnets: `eth0` (10.77.S.x) carries
//! everything but the database, `db0` (10.78.S.x) only the database path,
//! so the two can be cut apart. The root namespace forwards between
//! namespaces (ip_forward), which is how replicas reach each other's relay.
//!
//! Cuts drop packets silently, as a partition does. This kernel has no
//! netem (`tc qdisc ... netem`: "qdisc kind is unknown") and no netfilter
//! tools, so drops are made with what iproute2 always has:
//! - a poisoned neighbour entry (a permanent ARP entry with a MAC nobody
//!   has) on both ends of a veth: every frame goes out and is discarded by
//!   the peer as addressed to another host; senders see no error;
//! - a `blackhole` policy rule in the root namespace between two replicas'
//!   addresses: forwarded packets are discarded without any ICMP.

use std::net::Ipv4Addr;
use std::process::Command;

use super::slot::Slot;

const NOBODY: &str = "02:00:00:00:00:01";
/// Priority of the drills' blackhole rules, below the main table's.
pub const RULE_PRIORITY: &str = "1000";

pub struct Netns {
    pub name: String,
    host_main: String,
    host_db: String,
    slot: Slot,
}

/// Runs `ip ARGS`; the error carries its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Address `host` (1) or `ns` (2) of slot `n`'s subnet in 10.`net`/16.
fn addr(net: u8, n: u32, end: u8) -> Ipv4Addr {
    let third = u8::try_from(n / 64).expect("slot below 16384");
    let fourth = u8::try_from(n % 64 * 4).expect("under 256") + end;
    Ipv4Addr::new(10, net, third, fourth)
}

impl Netns {
    /// Creates the namespace and its links for a fresh slot.
    pub fn create() -> Result<Netns, String> {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| format!("enabling ip_forward: {e}"))?;
        let slot = Slot::take(reclaim)?;
        let (n, pid) = (slot.n, std::process::id());
        let ns = Netns {
            name: format!("scp{n}-{pid}"),
            host_main: format!("s{n}m{pid}"),
            host_db: format!("s{n}d{pid}"),
            slot,
        };
        ns.build()?;
        Ok(ns)
    }

    fn build(&self) -> Result<(), String> {
        let ns = self.name.as_str();
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        for (host, inner, net) in [(&self.host_main, "eth0", 77), (&self.host_db, "db0", 78)] {
            let h = format!("{}/30", addr(net, self.slot.n, 1));
            let i = format!("{}/30", addr(net, self.slot.n, 2));
            ip(&[
                "link", "add", host, "type", "veth", "peer", "name", inner, "netns", ns,
            ])?;
            ip(&["addr", "add", &h, "dev", host])?;
            ip(&["link", "set", host, "up"])?;
            ip(&["-n", ns, "addr", "add", &i, "dev", inner])?;
            ip(&["-n", ns, "link", "set", inner, "up"])?;
        }
        let gw = self.gateway().to_string();
        ip(&["-n", ns, "route", "add", "default", "via", &gw])
    }

    /// The replica's own address, where it listens and is reached.
    pub fn addr(&self) -> Ipv4Addr {
        addr(77, self.slot.n, 2)
    }

    /// The root namespace's end of `eth0`.
    fn gateway(&self) -> Ipv4Addr {
        addr(77, self.slot.n, 1)
    }

    /// The root namespace's end of `db0`: where the Postgres forwarder
    /// listens for this replica.
    pub fn db_host(&self) -> Ipv4Addr {
        addr(78, self.slot.n, 1)
    }

    fn db_inner(&self) -> Ipv4Addr {
        addr(78, self.slot.n, 2)
    }

    /// (namespace or root, device, neighbour) of each end of a path.
    fn ends(&self, db: bool) -> [(Option<&str>, String, Ipv4Addr); 2] {
        let ns = Some(self.name.as_str());
        if db {
            [
                (ns, "db0".into(), self.db_host()),
                (None, self.host_db.clone(), self.db_inner()),
            ]
        } else {
            [
                (ns, "eth0".into(), self.gateway()),
                (None, self.host_main.clone(), self.addr()),
            ]
        }
    }

    /// Drops every packet on the database path (`db = true`) or on the
    /// other one, both ways.
    pub fn cut(&self, db: bool) -> Result<(), String> {
        for (ns, dev, peer) in self.ends(db) {
            let p = peer.to_string();
            let mut args = vec!["neigh", "replace", &p, "lladdr", NOBODY];
            args.extend(["dev", &dev, "nud", "permanent"]);
            ip(&in_ns(ns, &args))?;
        }
        Ok(())
    }

    /// Undoes [`Netns::cut`]; the neighbours are learnt again by ARP.
    pub fn heal(&self, db: bool) {
        for (ns, dev, peer) in self.ends(db) {
            let p = peer.to_string();
            let _ = ip(&in_ns(ns, &["neigh", "del", &p, "dev", &dev]));
        }
    }
}

fn in_ns<'a>(ns: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = ns.map_or_else(Vec::new, |n| vec!["-n", n]);
    all.extend_from_slice(args);
    all
}

/// Drops packets between `a` and `b` (forwarded through the root
/// namespace), both ways; `add = false` removes the rules.
pub fn blackhole(a: Ipv4Addr, b: Ipv4Addr, add: bool) -> Result<(), String> {
    let verb = if add { "add" } else { "del" };
    for (from, to) in [(a, b), (b, a)] {
        let (f, t) = (from.to_string(), to.to_string());
        let args = [
            "rule",
            verb,
            "from",
            &f,
            "to",
            &t,
            "priority",
            RULE_PRIORITY,
        ];
        ip(&[&args[..], &["blackhole"]].concat())?;
    }
    Ok(())
}

/// What a dead owner of slot `n` left: its namespace, its root-side
/// links (they outlive the namespace while a process still holds it), and
/// blackhole rules naming its address.
fn reclaim(n: u32) {
    let prefix = format!("scp{n}-");
    let listed = Command::new("ip").args(["netns", "list"]).output();
    for line in listed
        .map(|o| o.stdout)
        .unwrap_or_default()
        .split(|b| *b == b'\n')
    {
        let line = String::from_utf8_lossy(line);
        if let Some(name) = line.split_whitespace().next()
            && name.starts_with(&prefix)
        {
            let _ = ip(&["netns", "del", name]);
        }
    }
    let links = Command::new("ip").args(["-o", "link"]).output();
    for line in String::from_utf8_lossy(&links.map(|o| o.stdout).unwrap_or_default()).lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if name.starts_with(&format!("s{n}m")) || name.starts_with(&format!("s{n}d")) {
            let _ = ip(&["link", "del", name]);
        }
    }
    let me = addr(77, n, 2).to_string();
    while ip(&["rule", "del", "from", &me, "priority", RULE_PRIORITY]).is_ok() {}
    while ip(&["rule", "del", "to", &me, "priority", RULE_PRIORITY]).is_ok() {}
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_main]);
        let _ = ip(&["link", "del", &self.host_db]);
    }
}
