//! The simulated fleet as described in `fleet.toml`: processor profiles
//! (speed, memory, power, price of the hardware, each figure with where
//! it comes from), electricity regions, the models served, and groups of
//! providers (a profile, a count, regions, a model, an availability
//! schedule, a failure rate and a share of cheats), expanded with a seeded
//! random draw into one `Provider` each. Each provider's cost profile is
//! the production `money::market::pricing::CostProfile`, so prices come
//! from the production pricing engine.

use std::collections::BTreeMap;

use money::ledger::amount::TICKS_PER_UNIT;
use money::market::pricing::CostProfile;
use protocol::bus::Profile;
use rand::Rng;
use rand::rngs::StdRng;
use serde::Deserialize;

/// A fleet file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// The protocol fee (basis points, 500-1000).
    #[serde(default = "default_fee")]
    pub fee_bps: i64,
    #[serde(rename = "region")]
    pub regions: Vec<Region>,
    #[serde(rename = "profile")]
    pub profiles: Vec<ProcessorProfile>,
    #[serde(rename = "model")]
    pub models: Vec<ModelSpec>,
    #[serde(rename = "group")]
    pub groups: Vec<Group>,
    /// The cloud the fleet is compared with.
    pub baseline: Baseline,
    /// Who buys capacity on the books (absent: everyone pays spot).
    #[serde(default)]
    pub market: Option<crate::market::MarketSpec>,
}

fn default_fee() -> i64 {
    700
}

/// A region: where users and providers are, and what electricity costs
/// there.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    pub name: String,
    /// Electricity price for data centres (industrial tariffs), currency
    /// units per kWh.
    pub price_per_kwh: f64,
    /// Electricity price at home (residential tariffs).
    pub home_price_per_kwh: f64,
    /// Hours ahead of UTC (for schedules in local time).
    #[serde(default)]
    pub utc_offset_h: f64,
    /// Where the price comes from.
    pub source: String,
}

/// What one kind of processor does with the reference model (8B
/// parameters, 4-bit weights): datasheet and published-benchmark figures.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorProfile {
    pub name: String,
    /// The processor type it reports under (`gpu`, `tpu`, `lpu`, `npu`,
    /// `cpu`, `webgpu`).
    pub kind: String,
    pub prefill_tokens_per_s: f64,
    pub decode_step_ms_1: f64,
    pub decode_step_ms_4: f64,
    /// Sequences it runs at once.
    pub max_batch: u32,
    /// Memory for weights and KV, GB.
    pub memory_gb: f64,
    /// Power draw under load.
    pub watts: i64,
    pub pue: f64,
    /// Price of the hardware, currency units, written off over
    /// `life_years`.
    pub hardware_cost: f64,
    pub life_years: f64,
    pub network_per_hour: f64,
    /// Round trip to the server (and to a pipeline's next stage).
    pub rtt_ms: f64,
    /// Its link's bandwidth (what a pipeline's activations cross).
    pub link_mbps: f64,
    /// Where the figures come from.
    pub source: String,
}

/// A model the fleet serves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    /// Its work per token against the reference model's (8B: 1).
    pub scale: f64,
    /// Memory its weights and a working KV cache need, GB.
    pub memory_gb: f64,
    /// Its transformer layers (what a sharded pipeline divides).
    #[serde(default = "default_layers")]
    pub layers: u32,
    /// Its hidden size: a pipeline sends this many 16-bit values a token
    /// from one stage to the next.
    #[serde(default = "default_hidden")]
    pub hidden_size: u32,
}

fn default_hidden() -> u32 {
    4096
}

fn default_layers() -> u32 {
    32
}

/// When a provider is online.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    Always,
    /// Between `from` and `to` o'clock, local time (wrapping midnight).
    Hours {
        from: f64,
        to: f64,
    },
}

impl Availability {
    /// Whether it is online at `hour` (0-24) local time.
    pub fn online_at(self, hour: f64) -> bool {
        match self {
            Self::Always => true,
            Self::Hours { from, to } if from <= to => (from..to).contains(&hour),
            Self::Hours { from, to } => hour >= from || hour < to,
        }
    }

    /// Hours from `hour` until the schedule next changes (`None`: never).
    pub fn next_change(self, hour: f64) -> Option<f64> {
        let Self::Hours { from, to } = self else {
            return None;
        };
        let until = |edge: f64| (edge - hour).rem_euclid(24.0);
        let d = [until(from), until(to)]
            .into_iter()
            .filter(|d| *d > 1e-9)
            .fold(24.0, f64::min);
        Some(d)
    }
}

/// Providers alike.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub profile: String,
    pub count: usize,
    /// Regions drawn from uniformly.
    pub regions: Vec<String>,
    pub model: String,
    pub availability: Availability,
    /// Mean hours between crashes (absent: never).
    #[serde(default)]
    pub mtbf_hours: Option<f64>,
    /// Hours a crashed provider stays away.
    #[serde(default = "default_repair")]
    pub repair_hours: f64,
    /// Share of its providers that cheat.
    #[serde(default)]
    pub dishonest: f64,
    /// At home (residential electricity), not in a data centre.
    #[serde(default)]
    pub home: bool,
    /// Providers arrive over this many hours from the start (0: all there
    /// at the start).
    #[serde(default)]
    pub arrive_within_h: f64,
    /// Mean hours a provider stays once arrived before leaving for good
    /// (absent: it stays).
    #[serde(default)]
    pub stay_h: Option<f64>,
    /// Its providers hold a model larger than one of them as layer-sharded
    /// pipelines, chained per region by the production pipeline planner.
    #[serde(default)]
    pub shard: bool,
}

fn default_repair() -> f64 {
    1.0
}

/// The cloud the fleet is compared with: on-demand GPUs of one profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    pub profile: String,
    /// On-demand price of one processor-hour, currency units.
    pub price_per_hour: f64,
    /// The share of its capacity a cloud deployment runs at (it is
    /// provisioned for the peak).
    pub target_utilization: f64,
    pub source: String,
}

/// How a dishonest provider cheats (each draws one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cheat {
    /// Answers without running the model.
    Garbage,
    /// Reports more tokens than it ran.
    InflatedCounts,
    /// Sends KV it did not compute.
    ForgedKv,
    /// Runs ten times slower than it calibrated.
    Stall,
}

impl Cheat {
    pub const ALL: [Cheat; 4] = [
        Cheat::Garbage,
        Cheat::InflatedCounts,
        Cheat::ForgedKv,
        Cheat::Stall,
    ];
}

/// One simulated provider.
#[derive(Debug, Clone)]
pub struct Provider {
    pub id: String,
    pub profile: usize,
    pub region: usize,
    pub model: usize,
    pub availability: Availability,
    pub mtbf_hours: Option<f64>,
    pub repair_hours: f64,
    pub cheat: Option<Cheat>,
    /// Its calibrated profile for its model.
    pub calibrated: Profile,
    /// Its costs, for the production pricing engine.
    pub cost: CostProfile,
    /// Its region's electricity price, micro-units per kWh.
    pub micros_per_kwh: i64,
    /// A pipeline's stages: its members' ids and layer ranges (empty for
    /// a provider on its own).
    pub stages: Vec<(String, std::ops::Range<u32>)>,
    /// When it arrives and when it leaves for good (hours; churn).
    pub arrives_h: f64,
    pub leaves_h: Option<f64>,
}

/// The fleet, checked and expanded.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub file: FleetFile,
    pub providers: Vec<Provider>,
    /// Providers of sharded groups the planner could not chain.
    pub unchained: usize,
}

fn index_of<'a, T>(items: &'a [T], name: &str, of: impl Fn(&'a T) -> &'a str) -> Option<usize> {
    items.iter().position(|x| of(x) == name)
}

/// Calibration of `p` on a model `scale` times the reference's work.
pub fn profile_on(p: &ProcessorProfile, scale: f64) -> Profile {
    Profile {
        prefill_tokens_per_s: p.prefill_tokens_per_s / scale,
        prefill_ms_long: 0.0,
        decode_step_ms_1: p.decode_step_ms_1 * scale,
        decode_step_ms_4: p.decode_step_ms_4 * scale,
        measured_at: 0,
    }
}

/// The cost profile of `p` serving at `calibrated`'s speed in `region`.
fn cost_profile(p: &ProcessorProfile, c: &Profile, region: &str) -> CostProfile {
    let ticks = |units: f64| (units * TICKS_PER_UNIT as f64).round() as i64;
    let batch = p.max_batch.max(1);
    let decode_per_s = f64::from(batch) * 1e3 / c.step_ms(batch).max(1e-3);
    CostProfile {
        region: region.to_string(),
        watts: p.watts,
        pue_milli: (p.pue * 1000.0).round() as i64,
        depreciation_per_hour: ticks(p.hardware_cost / (p.life_years * 8766.0)),
        network_per_hour: ticks(p.network_per_hour),
        prefill_tokens_per_hour: (c.prefill_tokens_per_s * 3600.0).max(1.0) as i64,
        decode_tokens_per_hour: (decode_per_s * 3600.0).max(1.0) as i64,
        cached_bps: 1_000,
        preemptible_discount_bps: 3_000,
    }
}

impl FleetFile {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(toml::from_str(text)?)
    }

    /// Expands the groups into providers (seeded draws of region and
    /// cheat), checking every name and that each model fits its
    /// processor's memory.
    pub fn expand(self, rng: &mut StdRng) -> anyhow::Result<Fleet> {
        let mut providers = Vec::new();
        let mut unchained = 0;
        for (gi, g) in self.groups.iter().enumerate() {
            let (profile, model, regions) = self.resolve(gi, g)?;
            let drawn = self.draw(gi, g, (profile, model), &regions, rng)?;
            let (p, m) = (&self.profiles[profile], &self.models[model]);
            if g.shard {
                let (chains, left) = chain(drawn, p, m, &self.regions);
                providers.extend(chains);
                unchained += left;
            } else {
                providers.extend(drawn);
            }
        }
        anyhow::ensure!(
            index_of(&self.profiles, &self.baseline.profile, |p| &p.name).is_some(),
            "baseline: no profile {}",
            self.baseline.profile
        );
        Ok(Fleet {
            file: self,
            providers,
            unchained,
        })
    }

    /// Group `gi`'s profile, model and regions by index, checking every
    /// name and that its model fits (or is sharded).
    fn resolve(&self, gi: usize, g: &Group) -> anyhow::Result<(usize, usize, Vec<usize>)> {
        let profile = index_of(&self.profiles, &g.profile, |p| &p.name)
            .ok_or_else(|| anyhow::anyhow!("group {gi}: no profile {}", g.profile))?;
        let model = index_of(&self.models, &g.model, |m| &m.name)
            .ok_or_else(|| anyhow::anyhow!("group {gi}: no model {}", g.model))?;
        let regions: Vec<usize> = g
            .regions
            .iter()
            .map(|r| {
                index_of(&self.regions, r, |x| &x.name)
                    .ok_or_else(|| anyhow::anyhow!("group {gi}: no region {r}"))
            })
            .collect::<anyhow::Result<_>>()?;
        anyhow::ensure!(!regions.is_empty(), "group {gi}: no regions");
        let (p, m) = (&self.profiles[profile], &self.models[model]);
        anyhow::ensure!(
            g.shard || m.memory_gb <= p.memory_gb,
            "group {gi}: {} ({} GB) does not fit {} ({} GB): shard it",
            m.name,
            m.memory_gb,
            p.name,
            p.memory_gb
        );
        Ok((profile, model, regions))
    }

    /// Group `gi`'s providers: per provider, a region, its arrival and
    /// stay, and whether (and how) it cheats, drawn in that order.
    fn draw(
        &self,
        gi: usize,
        g: &Group,
        (profile, model): (usize, usize),
        regions: &[usize],
        rng: &mut StdRng,
    ) -> anyhow::Result<Vec<Provider>> {
        let (p, m) = (&self.profiles[profile], &self.models[model]);
        let c = profile_on(p, m.scale);
        let mut drawn = Vec::with_capacity(g.count);
        for i in 0..g.count {
            let region = regions[rng.random_range(0..regions.len())];
            let r = &self.regions[region];
            let arrives_h = match g.arrive_within_h {
                h if h > 0.0 => h * rng.random::<f64>(),
                _ => 0.0,
            };
            let leaves_h = g
                .stay_h
                .filter(|h| *h > 0.0)
                .map(|h| arrives_h - h * rng.random_range(f64::EPSILON..1.0).ln());
            let cost = cost_profile(p, &c, &r.name);
            cost.validate()
                .map_err(|(f, e)| anyhow::anyhow!("group {gi} ({}): {f}: {e}", p.name))?;
            let cheat = (rng.random::<f64>() < g.dishonest)
                .then(|| Cheat::ALL[rng.random_range(0..Cheat::ALL.len())]);
            let price = if g.home {
                r.home_price_per_kwh
            } else {
                r.price_per_kwh
            };
            drawn.push(Provider {
                id: format!("{}-{gi}-{i}", p.name),
                profile,
                region,
                model,
                availability: g.availability,
                mtbf_hours: g.mtbf_hours,
                repair_hours: g.repair_hours,
                cheat,
                calibrated: c,
                cost,
                micros_per_kwh: (price * 1e6).round() as i64,
                stages: Vec::new(),
                arrives_h,
                leaves_h,
            });
        }
        Ok(drawn)
    }
}

/// Chains `drawn` (one sharded group's providers) into pipelines that
/// each hold model `m`, per region, with the production planner (the
/// fewest members whose memory holds its layers, layers by speed); each
/// pipeline is one provider whose step is its stages' shares of their
/// steps plus a round trip per hop, whose costs are its members' summed,
/// and which fails when any member does. Returns the pipelines and how
/// many providers were left over.
fn chain(
    drawn: Vec<Provider>,
    p: &ProcessorProfile,
    m: &ModelSpec,
    regions: &[Region],
) -> (Vec<Provider>, usize) {
    use server::services::pipelines::plan::{Candidate, Objective, plan};
    let per_layer = m.memory_gb / f64::from(m.layers.max(1));
    let holds = (p.memory_gb / per_layer).floor() as u32;
    let mut by_region: BTreeMap<usize, Vec<Provider>> = BTreeMap::new();
    for d in drawn {
        by_region.entry(d.region).or_default().push(d);
    }
    let (mut out, mut left) = (Vec::new(), 0);
    for (region, mut pool) in by_region {
        loop {
            let candidates: Vec<Candidate> = pool
                .iter()
                .map(|d| Candidate {
                    id: d.id.clone(),
                    mid: holds,
                    end: holds,
                    speed: 1.0 / d.calibrated.step_ms(1).max(1e-9),
                })
                .collect();
            let Some(stages) = plan(m.layers, &candidates, Objective::Total) else {
                left += pool.len();
                break;
            };
            let mut at: Vec<usize> = stages
                .iter()
                .filter_map(|s| pool.iter().position(|d| d.id == s.worker))
                .collect();
            // Highest first, so that no removal moves another member.
            at.sort_unstable_by(|a, b| b.cmp(a));
            let mut members: Vec<Provider> = at.into_iter().map(|i| pool.swap_remove(i)).collect();
            members.sort_by_key(|d| stages.iter().position(|s| s.worker == d.id));
            out.push(pipeline(members, stages, p, m, &regions[region]));
        }
    }
    (out, left)
}

/// One pipeline of `members` holding `stages` of model `m`: each hop
/// costs a decode step a round trip and a token's activations over the
/// link, and a prompt its activations over the link.
fn pipeline(
    members: Vec<Provider>,
    stages: Vec<server::services::pipelines::plan::Placed>,
    p: &ProcessorProfile,
    m: &ModelSpec,
    region: &Region,
) -> Provider {
    let k = members.len().max(1) as f64;
    let n = f64::from(m.layers.max(1));
    let first = &members[0];
    let full = profile_on(p, m.scale);
    let share = |s: &server::services::pipelines::plan::Placed| {
        f64::from(s.layers.end - s.layers.start) / n
    };
    // A token's activations (16-bit values) over the link, in ms.
    let send_ms = f64::from(m.hidden_size) * 16.0 / (p.link_mbps.max(1e-3) * 1e3);
    let hops = (k - 1.0) * (p.rtt_ms + send_ms);
    let secs_per_token: f64 = stages
        .iter()
        .map(|s| share(s) / full.prefill_tokens_per_s.max(1e-9))
        .sum::<f64>()
        + (k - 1.0) * send_ms / 1e3;
    let calibrated = Profile {
        prefill_tokens_per_s: 1.0 / secs_per_token.max(1e-12),
        prefill_ms_long: 0.0,
        decode_step_ms_1: stages
            .iter()
            .map(|s| share(s) * full.decode_step_ms_1)
            .sum::<f64>()
            + hops,
        decode_step_ms_4: stages
            .iter()
            .map(|s| share(s) * full.decode_step_ms_4)
            .sum::<f64>()
            + hops,
        measured_at: 0,
    };
    let together = ProcessorProfile {
        watts: (p.watts as f64 * k) as i64,
        hardware_cost: p.hardware_cost * k,
        network_per_hour: p.network_per_hour * k,
        ..p.clone()
    };
    Provider {
        id: format!("pipe-{}x{}", first.id, members.len()),
        cost: cost_profile(&together, &calibrated, &region.name),
        calibrated,
        mtbf_hours: first.mtbf_hours.map(|h| h / k),
        cheat: members.iter().find_map(|x| x.cheat),
        stages: stages.into_iter().map(|s| (s.worker, s.layers)).collect(),
        ..first.clone()
    }
}

impl Fleet {
    /// Providers per processor kind.
    pub fn kinds(&self) -> BTreeMap<String, usize> {
        let mut k = BTreeMap::new();
        for p in &self.providers {
            *k.entry(self.file.profiles[p.profile].kind.clone())
                .or_default() += 1;
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_wrap_midnight_and_say_when_they_change() {
        let night = Availability::Hours {
            from: 22.0,
            to: 7.0,
        };
        assert!(night.online_at(23.0) && night.online_at(3.0) && !night.online_at(12.0));
        assert_eq!(night.next_change(21.0), Some(1.0));
        assert_eq!(night.next_change(23.0), Some(8.0));
        let office = Availability::Hours {
            from: 9.0,
            to: 17.0,
        };
        assert!(office.online_at(9.0) && !office.online_at(17.0));
        assert_eq!(office.next_change(17.0), Some(16.0));
        assert_eq!(Availability::Always.next_change(5.0), None);
    }
}
