//! The planner of a pipeline model's lanes: each lane's chain from the
//! workers that offer parts of the model and no earlier lane uses, kept
//! while it stands, re-planned when measured speeds say so, formed again
//! when a stage leaves or fails.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use protocol::bus::WorkerInfo;
use protocol::stage::PartOffer;
use protocol::{ToWorker, VERSION};

use super::plan::{Candidate, plan};
use super::remote::{Chain, StageRef};
use super::{Lane, PipelineModel};
use crate::fleet::registry::Registry;

/// How long a worker asked to load a part has before it is asked again.
const ASK_AGAIN: Duration = Duration::from_secs(30);

/// This replica's workers that may hold a part of `m` now, with their
/// offers.
fn candidates(fleet: &Registry, m: &PipelineModel) -> Vec<(WorkerInfo, PartOffer)> {
    let n = m.sizes.n_layer as u32;
    fleet
        .list()
        .into_iter()
        .filter(|w| fleet.is_local(&w.id) && matches!(w.state.as_str(), "active" | "calibrating"))
        .filter(|w| !m.lanes.iter().any(|l| l.cell.is_failed(&w.id)))
        .filter_map(|w| {
            let o = w
                .parts
                .iter()
                .find(|o| {
                    o.model == m.spec.name && o.layers == n && o.hidden as usize == m.sizes.hidden
                })?
                .clone();
            Some((w, o))
        })
        .collect()
}

/// Whether `w` holds `s`'s layers of `m` with its KV.
fn holds(w: &WorkerInfo, m: &PipelineModel, s: &StageRef) -> bool {
    w.holds.iter().any(|h| {
        h.model == m.spec.name
            && (h.first, h.end) == (s.layers.start, s.layers.end)
            && h.blocks == m.spec.blocks
    })
}

/// One look at the fleet for `m`'s lanes, in order, each from the
/// workers no other lane uses (a lane without workers plans only when
/// every earlier lane has some); then the parts of workers no lane uses
/// are dropped, once the first lane runs.
pub(super) async fn replan(fleet: &Registry, m: &PipelineModel) {
    let all = candidates(fleet, m);
    let mut used: Vec<HashSet<String>> = m
        .lanes
        .iter()
        .map(|l| l.workers().into_iter().collect())
        .collect();
    for (i, lane) in m.lanes.iter().enumerate() {
        if used[i].is_empty() && used[..i].iter().any(HashSet::is_empty) {
            continue;
        }
        let others: HashSet<&String> = used
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .flat_map(|(_, u)| u.iter())
            .collect();
        let cands: Vec<_> = all
            .iter()
            .filter(|(w, _)| !others.contains(&w.id))
            .cloned()
            .collect();
        replan_lane(fleet, m, lane, &cands).await;
        used[i] = lane.workers().into_iter().collect();
    }
    let taken: HashSet<&String> = used.iter().flatten().collect();
    if m.lanes.first().is_none_or(|l| l.cell.get().is_none()) {
        return;
    }
    for (w, _) in &all {
        if !taken.contains(&w.id) && w.holds.iter().any(|h| h.model == m.spec.name) {
            let msg = ToWorker::DropPart {
                v: VERSION,
                model: m.spec.name.clone(),
            };
            fleet.send_local(&w.id, msg).await;
        }
    }
}

/// One look at `cands` for `lane`: keep its standing chain (re-planned
/// when measured speeds say so), or plan one, ask for its parts and
/// publish it once they are all held.
async fn replan_lane(
    fleet: &Registry,
    m: &PipelineModel,
    lane: &Lane,
    cands: &[(WorkerInfo, PartOffer)],
) {
    let held = |s: &StageRef| {
        cands
            .iter()
            .any(|(w, _)| w.id == s.worker && holds(w, m, s))
    };
    if let Some(c) = lane.cell.get() {
        if c.stages.iter().all(held) {
            if let Some(better) = faster(m, lane, &c, cands) {
                tracing::info!(model = %m.spec.name, stages = ?better, "re-planning the pipeline for its measured speeds");
                lane.cell.set(None);
                for s in &better {
                    ask(fleet, m, s).await;
                }
                *lane.target.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((better, Instant::now()));
            }
            return;
        }
        tracing::warn!(model = %m.spec.name, "a pipeline stage left: forming another chain");
        lane.cell.set(None);
    }
    let target = lane
        .target
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some((stages, asked)) = target {
        if stages.iter().all(held) {
            tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline re-formed");
            lane.cell.set(Some(stages));
            *lane.target.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return;
        }
        let gone = stages
            .iter()
            .any(|s| !cands.iter().any(|(w, _)| w.id == s.worker));
        if !gone && asked.elapsed() < ASK_AGAIN {
            return;
        }
        *lane.target.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    // Parts already held that make a chain are used as they are: a plan
    // would reload layers for nothing.
    if let Some(stages) = held_chain(cands, m) {
        tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline formed from the parts held");
        lane.cell.set(Some(stages));
        return;
    }
    let Some(placed) = plan(
        m.sizes.n_layer as u32,
        &offered(m, cands),
        m.spec.objective(),
    ) else {
        let mut stuck = lane.stuck.lock().unwrap_or_else(|e| e.into_inner());
        if !*stuck && !cands.is_empty() {
            tracing::warn!(model = %m.spec.name, workers = cands.len(), "the workers offering parts cannot hold every layer together");
        }
        *stuck = true;
        return;
    };
    *lane.stuck.lock().unwrap_or_else(|e| e.into_inner()) = false;
    let stages: Vec<StageRef> = placed
        .into_iter()
        .map(|p| StageRef {
            provider: provider_of(cands, &p.worker),
            worker: p.worker,
            layers: p.layers,
        })
        .collect();
    let mut ready = true;
    for s in &stages {
        if !held(s) {
            ready = false;
            ask(fleet, m, s).await;
        }
    }
    if ready {
        tracing::info!(model = %m.spec.name, stages = ?stages, "pipeline formed");
        lane.cell.set(Some(stages));
    } else {
        // Its workers are this lane's while their parts load.
        *lane.target.lock().unwrap_or_else(|e| e.into_inner()) = Some((stages, Instant::now()));
    }
}

/// The candidates as the plan sees them: their room and (with measured
/// placement) their measured speeds, a worker not measured yet taken to
/// be as fast as the others.
fn offered(m: &PipelineModel, cands: &[(WorkerInfo, PartOffer)]) -> Vec<Candidate> {
    let blocks = u64::from(m.spec.blocks);
    let speeds: HashMap<String, f64> = if m.spec.measured {
        m.lanes.iter().flat_map(|l| l.cell.speeds()).collect()
    } else {
        HashMap::new()
    };
    let typical = if speeds.is_empty() {
        1.0
    } else {
        speeds.values().sum::<f64>() / speeds.len() as f64
    };
    cands
        .iter()
        .map(|(w, o)| Candidate {
            id: w.id.clone(),
            mid: o.fits(blocks, false),
            end: o.fits(blocks, true),
            speed: speeds.get(&w.id).copied().unwrap_or(typical),
        })
        .collect()
}

/// Steps each stage must have run before its speed counts.
const MEASURED_STEPS: u64 = 50;
/// The least time between two re-plans for speed.
const MOVE_EVERY: Duration = Duration::from_secs(60);
/// A re-plan must cut the chain's cost by this share.
const MOVE_GAIN: f64 = 0.2;

/// A plan of the same workers whose cost (the stages' times, layers over
/// measured speed, summed or the slowest) is at least `MOVE_GAIN` below
/// standing chain `c`'s, when
/// placement is measured, every stage is measured and the last such
/// re-plan is `MOVE_EVERY` old.
fn faster(
    m: &PipelineModel,
    lane: &Lane,
    c: &Chain,
    cands: &[(WorkerInfo, PartOffer)],
) -> Option<Vec<StageRef>> {
    if !m.spec.measured {
        return None;
    }
    let measures: Vec<_> = c
        .stages
        .iter()
        .map(|s| lane.cell.measure(&s.worker))
        .collect();
    if measures
        .iter()
        .any(|x| x.steps < MEASURED_STEPS || x.speed <= 0.0)
    {
        return None;
    }
    if lane
        .moved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some_and(|at| at.elapsed() < MOVE_EVERY)
    {
        return None;
    }
    let objective = m.spec.objective();
    let speed = |w: &str| lane.cell.measure(w).speed;
    let now = objective.cost(
        c.stages
            .iter()
            .map(|s| (s.layers.len() as u32, speed(&s.worker))),
    );
    let mine: Vec<_> = cands
        .iter()
        .filter(|(w, _)| c.stages.iter().any(|s| s.worker == w.id))
        .cloned()
        .collect();
    let placed = plan(m.sizes.n_layer as u32, &offered(m, &mine), objective)?;
    let then = objective.cost(
        placed
            .iter()
            .map(|p| (p.layers.len() as u32, speed(&p.worker))),
    );
    if then > now * (1.0 - MOVE_GAIN) {
        return None;
    }
    *lane.moved.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    Some(
        placed
            .into_iter()
            .map(|p| StageRef {
                provider: provider_of(cands, &p.worker),
                worker: p.worker,
                layers: p.layers,
            })
            .collect(),
    )
}

fn provider_of(cands: &[(WorkerInfo, PartOffer)], worker: &str) -> String {
    cands
        .iter()
        .find(|(w, _)| w.id == worker)
        .map(|(w, _)| w.provider_id.clone())
        .unwrap_or_default()
}

/// A chain of the parts `cands` hold now, from layer 0 to the last, with
/// the fewest stages (each step takes the held part that reaches
/// furthest), if they make one.
fn held_chain(cands: &[(WorkerInfo, PartOffer)], m: &PipelineModel) -> Option<Vec<StageRef>> {
    let n = m.sizes.n_layer as u32;
    let held: Vec<StageRef> = cands
        .iter()
        .flat_map(|(w, _)| {
            w.holds
                .iter()
                .filter(|h| h.model == m.spec.name && h.blocks == m.spec.blocks && h.first < h.end)
                .map(|h| StageRef {
                    worker: w.id.clone(),
                    provider: w.provider_id.clone(),
                    layers: h.first..h.end,
                })
        })
        .collect();
    let mut chain: Vec<StageRef> = Vec::new();
    let mut at = 0;
    while at < n {
        let next = held
            .iter()
            .filter(|s| s.layers.start == at && !chain.iter().any(|c| c.worker == s.worker))
            .max_by(|a, b| (a.layers.end, &b.worker).cmp(&(b.layers.end, &a.worker)))?;
        at = next.layers.end;
        chain.push(next.clone());
    }
    (at == n).then_some(chain)
}

/// Asks `s.worker` to load its part, unless it was asked lately.
async fn ask(fleet: &Registry, m: &PipelineModel, s: &StageRef) {
    let key = (s.worker.clone(), s.layers.start, s.layers.end);
    {
        let mut asked = m.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.retain(|_, at| at.elapsed() < ASK_AGAIN);
        if asked.contains_key(&key) {
            return;
        }
        asked.insert(key, Instant::now());
    }
    let msg = ToWorker::LoadPart {
        v: VERSION,
        model: m.spec.name.clone(),
        first: s.layers.start,
        end: s.layers.end,
        blocks: m.spec.blocks,
        block_size: m.spec.block_size,
    };
    fleet.send_local(&s.worker, msg).await;
}
