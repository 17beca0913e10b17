//! Which layers each worker of a pipeline holds (Parallax's first phase,
//! for one chain): the fewest workers whose memory holds the model, the
//! first and the last of them the two that can hold the most with the
//! model's ends, and the layers split in proportion to each one's measured
//! speed, water-filled under its memory cap. Pure: the planner feeds it
//! the fleet's offers and speeds.

use std::ops::Range;

/// A worker that could hold part of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub id: String,
    /// The most layers it holds in the middle of a chain, and at an end
    /// (next to the embeddings or the head).
    pub mid: u32,
    pub end: u32,
    /// Layers a second it computes (relative: only ratios matter).
    pub speed: f64,
}

/// One stage of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub worker: String,
    pub layers: Range<u32>,
}

/// A chain that holds `n` layers over the fewest of `candidates`, or
/// `None` if all of them together cannot.
pub fn plan(n: u32, candidates: &[Candidate]) -> Option<Vec<Placed>> {
    if n == 0 {
        return None;
    }
    let mut by_room: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.end > 0 || c.mid > 0)
        .collect();
    by_room.sort_by(|a, b| (b.mid, b.end, &a.id).cmp(&(a.mid, a.end, &b.id)));
    (1..=by_room.len()).find_map(|k| chain_of(n, &by_room[..k]))
}

/// A chain over exactly `chosen`, if their caps hold `n` layers.
fn chain_of(n: u32, chosen: &[&Candidate]) -> Option<Vec<Placed>> {
    let order = arrange(chosen);
    let last = order.len() - 1;
    let caps: Vec<u32> = order
        .iter()
        .enumerate()
        .map(|(i, c)| if i == 0 || i == last { c.end } else { c.mid })
        .collect();
    if caps.contains(&0) || caps.iter().map(|&c| u64::from(c)).sum::<u64>() < u64::from(n) {
        return None;
    }
    let speeds: Vec<f64> = order.iter().map(|c| c.speed.max(1e-9)).collect();
    let counts = water_fill(n, &caps, &speeds)?;
    let mut start = 0;
    Some(
        order
            .iter()
            .zip(counts)
            .map(|(c, k)| {
                let p = Placed {
                    worker: c.id.clone(),
                    layers: start..start + k,
                };
                start += k;
                p
            })
            .collect(),
    )
}

/// The chain's order: the two with the most room at an end first and
/// last, the rest between them by id.
fn arrange<'a>(chosen: &[&'a Candidate]) -> Vec<&'a Candidate> {
    let mut by_end: Vec<&Candidate> = chosen.to_vec();
    by_end.sort_by(|a, b| (b.end, &a.id).cmp(&(a.end, &b.id)));
    if by_end.len() < 2 {
        return by_end;
    }
    let (first, last) = (by_end[0], by_end[1]);
    let mut middle: Vec<&Candidate> = by_end[2..].to_vec();
    middle.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = vec![first];
    out.extend(middle);
    out.push(last);
    out
}

/// `n` layers in proportion to `speeds`, none past its cap, each stage at
/// least one: shares capped at their caps, the rest shared again among
/// the others, then rounded by largest remainder.
fn water_fill(n: u32, caps: &[u32], speeds: &[f64]) -> Option<Vec<u32>> {
    let k = caps.len();
    if (n as usize) < k {
        return None;
    }
    let mut share = vec![0.0f64; k];
    let mut open: Vec<usize> = (0..k).collect();
    let mut left = f64::from(n);
    while !open.is_empty() && left > 1e-9 {
        let total: f64 = open.iter().map(|&i| speeds[i]).sum();
        let mut capped = Vec::new();
        for &i in &open {
            let want = share[i] + left * speeds[i] / total;
            if want >= f64::from(caps[i]) {
                capped.push(i);
            }
        }
        if capped.is_empty() {
            for &i in &open {
                share[i] += left * speeds[i] / total;
            }
            left = 0.0;
        } else {
            for &i in &capped {
                left -= f64::from(caps[i]) - share[i];
                share[i] = f64::from(caps[i]);
            }
            open.retain(|i| !capped.contains(i));
        }
    }
    round(n, caps, &share)
}

/// Integer counts summing to `n` from fractional `share`s (largest
/// remainder first), each in `1..=cap`.
fn round(n: u32, caps: &[u32], share: &[f64]) -> Option<Vec<u32>> {
    let mut counts: Vec<u32> = share
        .iter()
        .zip(caps)
        .map(|(s, &c)| (s.floor() as u32).clamp(1, c.max(1)))
        .collect();
    let mut order: Vec<usize> = (0..counts.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = share[a] - share[a].floor();
        let rb = share[b] - share[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    loop {
        let sum: u32 = counts.iter().sum();
        if sum == n {
            return Some(counts);
        }
        let next = if sum < n {
            order.iter().copied().find(|&i| counts[i] < caps[i])
        } else {
            order.iter().rev().copied().find(|&i| counts[i] > 1)
        }?;
        if sum < n {
            counts[next] += 1;
        } else {
            counts[next] -= 1;
        }
        // The one just moved goes last, so the next move is another's.
        order.retain(|&i| i != next);
        order.push(next);
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn cand(id: &str, mid: u32, end: u32, speed: f64) -> Candidate {
        Candidate {
            id: id.into(),
            mid,
            end,
            speed,
        }
    }

    fn counts(p: &[Placed]) -> Vec<u32> {
        p.iter().map(|s| s.layers.end - s.layers.start).collect()
    }

    #[test]
    fn one_worker_that_holds_the_model_is_never_split() {
        let p = plan(30, &[cand("a", 40, 35, 1.0), cand("b", 40, 35, 1.0)]).expect("plan");
        assert_eq!(
            p,
            vec![Placed {
                worker: "a".into(),
                layers: 0..30
            }]
        );
    }

    #[test]
    fn equal_workers_that_each_hold_a_third_get_ten_layers_each() {
        let c = [
            cand("a", 12, 10, 1.0),
            cand("b", 12, 10, 1.0),
            cand("c", 12, 10, 1.0),
        ];
        let p = plan(30, &c).expect("plan");
        assert_eq!(counts(&p), vec![10, 10, 10]);
    }

    #[test]
    fn a_faster_worker_gets_more_layers_within_its_memory() {
        let c = [
            cand("fast", 40, 20, 3.0),
            cand("s1", 14, 14, 1.0),
            cand("s2", 14, 14, 1.0),
        ];
        // The three are needed (two hold at most 20 + 14 at the ends).
        let p = plan(40, &c).expect("plan");
        assert_eq!(p.len(), 3);
        let fast = p.iter().find(|s| s.worker == "fast").expect("fast");
        assert!(fast.layers.len() >= 15, "{p:?}");
        assert!(plan(60, &c).is_none(), "more than all of them hold");
    }

    #[test]
    fn seeded_random_fleets_get_chains_that_cover_every_layer_within_caps() {
        let mut rng = StdRng::seed_from_u64(46);
        for _ in 0..2000 {
            let n = rng.random_range(1..80u32);
            let k = rng.random_range(1..8);
            let cands: Vec<Candidate> = (0..k)
                .map(|i| {
                    let mid = rng.random_range(0..40u32);
                    let end = rng.random_range(0..=mid);
                    cand(&format!("w{i}"), mid, end, rng.random_range(0.1..5.0))
                })
                .collect();
            let Some(p) = plan(n, &cands) else {
                continue;
            };
            assert_eq!(p.first().map(|s| s.layers.start), Some(0));
            assert_eq!(p.last().map(|s| s.layers.end), Some(n));
            assert!(p.windows(2).all(|w| w[0].layers.end == w[1].layers.start));
            let last = p.len() - 1;
            for (i, s) in p.iter().enumerate() {
                let c = cands
                    .iter()
                    .find(|c| c.id == s.worker)
                    .expect("a candidate");
                let cap = if i == 0 || i == last { c.end } else { c.mid };
                assert!(
                    !s.layers.is_empty() && s.layers.len() as u32 <= cap,
                    "{s:?} {c:?}"
                );
            }
            let mut ids: Vec<&str> = p.iter().map(|s| s.worker.as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), p.len(), "a worker twice");
        }
    }
}
