//! Deterministic gateway choice by rendezvous (highest-random-weight)
//! hashing: every candidate gets a pseudo-random score for the key and the
//! highest wins. It spreads load like a random pick, any leader recomputes
//! the same answer, and removing one candidate only moves the keys it held.

use std::hash::Hasher;

use twox_hash::XxHash64;

fn score(key: &str, candidate: &str) -> u64 {
    let mut h = XxHash64::with_seed(0x005e_ed0f_5117);
    h.write(key.as_bytes());
    h.write_u8(0xff);
    h.write(candidate.as_bytes());
    h.finish()
}

/// The candidate with the highest score for `key` (ties by id, so the
/// answer never depends on the candidates' order).
pub fn choose<'a, I>(key: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    candidates
        .into_iter()
        .max_by(|a, b| score(key, a).cmp(&score(key, b)).then_with(|| b.cmp(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_ignores_candidate_order() {
        let a = ["n1", "n2", "n3", "n4"];
        let b = ["n4", "n2", "n1", "n3"];
        for key in ["a|b", "a|c", "x|y"] {
            assert_eq!(choose(key, a), choose(key, b));
        }
    }

    #[test]
    fn removing_a_loser_keeps_the_winner() {
        let all = ["n1", "n2", "n3", "n4", "n5"];
        let winner = choose("g1|g2", all).unwrap();
        let fewer: Vec<&str> = all.iter().copied().filter(|n| *n != winner).collect();
        let loser = fewer[0];
        let rest: Vec<&str> = all.iter().copied().filter(|n| *n != loser).collect();
        assert_eq!(choose("g1|g2", rest), Some(winner));
    }

    #[test]
    fn load_spreads_over_candidates() {
        let nodes = ["n1", "n2", "n3", "n4"];
        let mut counts = [0usize; 4];
        for i in 0..400 {
            let key = format!("pair-{i}");
            let w = choose(&key, nodes).unwrap();
            counts[nodes.iter().position(|n| *n == w).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50), "{counts:?}");
        assert_eq!(choose("k", std::iter::empty()), None);
    }
}
