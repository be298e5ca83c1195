//! A slot number unique on this machine, so that namespaces, interfaces and
//! subnets of tests running in parallel processes never collide. A slot is
//! a directory under [`ROOT`] holding its owner's pid: `mkdir` is atomic,
//! and a slot whose owner died (a crashed or killed test) is reclaimed by
//! renaming it away first, which only one process can do.

use std::path::PathBuf;

const ROOT: &str = "/run/slim-cp-netns";
/// Slots 1..MAX; each gets two /30 subnets (see `super::netns`).
const MAX: u32 = 4000;

pub struct Slot {
    pub n: u32,
    dir: PathBuf,
}

impl Slot {
    /// Takes a free slot; `reclaim(n)` cleans what a dead owner of slot
    /// `n` left behind before it is reused.
    pub fn take(reclaim: impl Fn(u32)) -> Result<Slot, String> {
        std::fs::create_dir_all(ROOT).map_err(|e| format!("creating {ROOT}: {e}"))?;
        let me = std::process::id();
        for n in 1..MAX {
            let dir = PathBuf::from(ROOT).join(n.to_string());
            if std::fs::create_dir(&dir).is_ok() {
                std::fs::write(dir.join("pid"), me.to_string())
                    .map_err(|e| format!("claiming slot {n}: {e}"))?;
                return Ok(Slot { n, dir });
            }
            if owner_alive(&dir) {
                continue;
            }
            let grave = PathBuf::from(ROOT).join(format!("dead-{n}-{me}"));
            if std::fs::rename(&dir, &grave).is_ok() {
                reclaim(n);
                let _ = std::fs::remove_dir_all(&grave);
                if std::fs::create_dir(&dir).is_ok() {
                    std::fs::write(dir.join("pid"), me.to_string())
                        .map_err(|e| format!("claiming slot {n}: {e}"))?;
                    return Ok(Slot { n, dir });
                }
            }
        }
        Err(format!("no free slot under {ROOT}"))
    }
}

/// A slot being claimed has no pid file yet for an instant: count it as
/// alive then.
fn owner_alive(dir: &std::path::Path) -> bool {
    match std::fs::read_to_string(dir.join("pid")) {
        Ok(pid) => std::path::Path::new("/proc").join(pid.trim()).exists(),
        Err(_) => true,
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
