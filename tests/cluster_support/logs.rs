//! What the drills read in the replicas' logs: the commands each sent and
//! under which epoch, compared by the log's RFC 3339 timestamps.

use std::time::SystemTime;

/// The `command sent` lines under `epoch` logged after `since` (RFC 3339;
/// "" for all).
pub fn epoch_sends_after(log: &str, epoch: u64, since: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("command sent") && l.contains(&format!("epoch={epoch}")))
        .filter(|l| l.split_whitespace().next().is_some_and(|t| t > since))
        .map(str::to_string)
        .collect()
}

pub fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, dd) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
