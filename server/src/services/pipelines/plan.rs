//! Which layers each worker of a pipeline holds (Parallax's first phase,
//! for one chain): the fewest workers whose memory holds the model, in the
//! order (which two at the ends, next to the embeddings and the head) and
//! with the layer counts that cost least under the objective: the sum of
//! the stages' times when a step walks the chain whole (the fastest takes
//! all it can), or the slowest stage's when steps overlap (layers in
//! proportion to measured speed, water-filled under each memory cap).
//! Pure: the planner feeds it the fleet's offers and speeds.

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

/// What a plan minimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// The sum of the stages' times: a step walks the chain whole, one
    /// stage after another (so the fastest worker takes all it can).
    Total,
    /// The slowest stage's time: steps overlap in the chain, and the
    /// slowest stage sets its pace (layers in proportion to speed).
    Bottleneck,
}

impl Objective {
    /// A chain's cost: its stages' (layers, speed) under this objective.
    pub fn cost(self, stages: impl Iterator<Item = (u32, f64)>) -> f64 {
        let times = stages.map(|(n, s)| f64::from(n) / s.max(1e-9));
        match self {
            Objective::Total => times.sum(),
            Objective::Bottleneck => times.fold(0.0, f64::max),
        }
    }
}

/// A chain that holds `n` layers over the fewest of `candidates` at the
/// least cost under `objective`, or `None` if all of them together cannot.
pub fn plan(n: u32, candidates: &[Candidate], objective: Objective) -> Option<Vec<Placed>> {
    if n == 0 {
        return None;
    }
    let mut by_room: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.end > 0 || c.mid > 0)
        .collect();
    by_room.sort_by(|a, b| (b.mid, b.end, &a.id).cmp(&(a.mid, a.end, &b.id)));
    (1..=by_room.len()).find_map(|k| best_chain(n, &by_room[..k], objective))
}

/// The cheapest chain over exactly `chosen`: every pair of them at the
/// ends (the rest between, by id), each with its layers counted.
fn best_chain(n: u32, chosen: &[&Candidate], objective: Objective) -> Option<Vec<Placed>> {
    let k = chosen.len();
    let mut best: Option<(f64, Vec<Placed>)> = None;
    for first in 0..k {
        for last in 0..k {
            if (first == last) != (k == 1) {
                continue;
            }
            let mut order = vec![chosen[first]];
            let mut middle: Vec<&Candidate> = (0..k)
                .filter(|&i| i != first && i != last)
                .map(|i| chosen[i])
                .collect();
            middle.sort_by(|a, b| a.id.cmp(&b.id));
            order.extend(middle);
            if k > 1 {
                order.push(chosen[last]);
            }
            let Some(p) = chain_of(n, &order, objective) else {
                continue;
            };
            let cost = objective.cost(
                p.iter()
                    .zip(&order)
                    .map(|(s, c)| (s.layers.end - s.layers.start, c.speed)),
            );
            if best.as_ref().is_none_or(|b| cost < b.0 - 1e-9) {
                best = Some((cost, p));
            }
        }
    }
    best.map(|b| b.1)
}

/// The chain `order` (in order), if their caps hold `n` layers.
fn chain_of(n: u32, order: &[&Candidate], objective: Objective) -> Option<Vec<Placed>> {
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
    // Without a difference in speed, the layers are shared evenly.
    let alike = speeds
        .iter()
        .all(|&s| (s - speeds[0]).abs() <= 1e-9 * s.abs());
    let counts = match objective {
        Objective::Total if !alike => fastest_first(n, &caps, &speeds)?,
        Objective::Total | Objective::Bottleneck => water_fill(n, &caps, &speeds)?,
    };
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

/// `n` layers, one each, the rest to the fastest up to its cap, then the
/// next fastest (ties to the earlier stage).
fn fastest_first(n: u32, caps: &[u32], speeds: &[f64]) -> Option<Vec<u32>> {
    let k = caps.len();
    if (n as usize) < k {
        return None;
    }
    let mut counts = vec![1u32; k];
    let mut left = n - k as u32;
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| speeds[b].total_cmp(&speeds[a]).then(a.cmp(&b)));
    for i in order {
        let add = left.min(caps[i].saturating_sub(1));
        counts[i] += add;
        left -= add;
    }
    (left == 0).then_some(counts)
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
        let p = plan(
            30,
            &[cand("a", 40, 35, 1.0), cand("b", 40, 35, 1.0)],
            Objective::Total,
        )
        .expect("plan");
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
        let p = plan(30, &c, Objective::Bottleneck).expect("plan");
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
        let p = plan(40, &c, Objective::Bottleneck).expect("plan");
        assert_eq!(p.len(), 3);
        let fast = p.iter().find(|s| s.worker == "fast").expect("fast");
        assert!(fast.layers.len() >= 15, "{p:?}");
        assert!(
            plan(69, &c, Objective::Bottleneck).is_none(),
            "more than all of them hold"
        );
        assert!(
            plan(68, &c, Objective::Total).is_some(),
            "the fast one in the middle"
        );
        // Walked whole, the fast one takes all it can: in the middle,
        // where it holds the most.
        let p = plan(40, &c, Objective::Total).expect("plan");
        assert_eq!(p[1].worker, "fast", "{p:?}");
        assert_eq!(counts(&p), vec![1, 38, 1], "{p:?}");
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
            let objective = if rng.random_bool(0.5) {
                Objective::Total
            } else {
                Objective::Bottleneck
            };
            let Some(p) = plan(n, &cands, objective) else {
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
