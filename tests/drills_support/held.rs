//! What the nodes themselves hold, read from their own connection tables
//! (`slimctl controller connection list -n NODE`: the owning replica asks
//! the node over its control stream).

use super::Stage;
use crate::interop_support::Table;

/// An inter-group link: its id and its two ends (`group/id`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub id: String,
    /// The node that dials.
    pub source: String,
    /// The node dialled, at its external endpoint.
    pub dest: String,
}

impl Link {
    /// The link's end in `group`.
    pub fn end_in(&self, group: &str) -> &str {
        if in_group(&self.source, group) {
            &self.source
        } else {
            &self.dest
        }
    }
}

pub fn in_group(full_id: &str, group: &str) -> bool {
    full_id
        .strip_prefix(group)
        .is_some_and(|r| r.starts_with('/'))
}

/// The inter-group connections node `id` holds: (link id, direction in
/// lower case), or why the table could not be read.
fn remote_connections(stage: &Stage, id: &str) -> Result<Vec<(String, String)>, String> {
    let out = stage.ctl(&["connection", "list", "-n", id]);
    if !out.ok() {
        return Err(out.to_string());
    }
    let t: Table = out.table();
    Ok(t.rows
        .iter()
        .filter(|r| t.cell(r, "TYPE").eq_ignore_ascii_case("remote"))
        .map(|r| {
            (
                t.cell(r, "LINK_ID").to_string(),
                t.cell(r, "DIRECTION").to_ascii_lowercase(),
            )
        })
        .collect())
}

/// Every node in `ids` holds exactly what `link` asks of it: its source
/// the link outgoing, its destination the link incoming, every other
/// node no inter-group connection.
pub fn held_exactly(stage: &Stage, ids: &[String], link: &Link) -> Result<(), String> {
    for id in ids {
        let want: Vec<(String, String)> = if *id == link.source {
            vec![(link.id.clone(), "outgoing".into())]
        } else if *id == link.dest {
            vec![(link.id.clone(), "incoming".into())]
        } else {
            Vec::new()
        };
        let held = remote_connections(stage, id)?;
        if held != want {
            return Err(format!("{id} holds {held:?}, want {want:?}"));
        }
    }
    Ok(())
}
