//! What a run measured (`Tally`, filled by the world as it goes) and what
//! it reports (`Report`): goodput under the latency targets, TTFT and
//! TPOT percentiles, utilization and idle share per processor type, the
//! money (users paid, providers earned, the treasury, refunds; cost per
//! million tokens against a cloud baseline at on-demand prices), failures
//! and what each kind of cheat cost. Amounts are kept in ticks (`i128`)
//! and shown in currency units.

use std::collections::BTreeMap;

use money::ledger::Tokens;
use money::ledger::amount::TICKS_PER_UNIT;
use serde::Serialize;

use crate::fleet::{Cheat, Fleet, profile_on};
use crate::workload::Request;

/// One utilization sample of one processor type.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    pub at_h: f64,
    pub online: u32,
    /// Online providers running anything.
    pub busy: u32,
    /// Sequences running over the online providers' caps.
    pub utilization: f64,
}

/// What one kind of cheat did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CheatTally {
    pub attempts: u64,
    /// Attempts whose answer was wrong.
    pub harmful: u64,
    pub caught: u64,
    /// What users paid for wrong answers never caught (units).
    pub cost_to_users: f64,
    /// The fees the treasury refunded on caught ones (units).
    pub cost_to_treasury: f64,
    #[serde(skip)]
    cost_ticks: i128,
    #[serde(skip)]
    treasury_ticks: i128,
}

/// One provider's time over a run.
#[derive(Debug, Clone, Copy)]
pub struct ProviderTime {
    pub online_us: u64,
    /// Time with anything running.
    pub busy_us: u64,
    /// Sequences running x time.
    pub seq_us: f64,
    pub cap: u32,
    /// What an hour of it costs its provider (ticks).
    pub hourly_cost: i64,
    /// Of that, the electricity under load.
    pub hourly_energy: i64,
}

/// Counters of a run.
#[derive(Debug, Clone)]
pub struct Tally {
    kinds: Vec<String>,
    profile_kind: Vec<usize>,
    provider_kind: Vec<usize>,
    sample_s: f64,
    served: u64,
    unserved: u64,
    met: u64,
    failovers: u64,
    crashes: u64,
    departures: u64,
    ttft: Vec<f32>,
    tpot: Vec<f32>,
    tokens: (u64, u64),
    user_paid: i128,
    providers_paid: i128,
    refunded: i128,
    clawed: i128,
    quarantined: u64,
    cheats: BTreeMap<Cheat, CheatTally>,
    samples: Vec<Vec<Sample>>,
    /// Per kind: online, busy and sequence time (microseconds).
    time: Vec<(u64, u64, f64)>,
    /// Per kind: cap x online time, the utilization's denominator.
    capacity: Vec<f64>,
    /// What the providers' online time cost them (ticks).
    operating: f64,
    /// The electricity of their busy time (ticks).
    energy: f64,
}

impl Tally {
    pub fn new(fleet: &Fleet, sample_s: f64) -> Self {
        let mut kinds: Vec<String> = fleet.file.profiles.iter().map(|p| p.kind.clone()).collect();
        kinds.sort();
        kinds.dedup();
        let profile_kind: Vec<usize> = fleet
            .file
            .profiles
            .iter()
            .map(|p| kinds.iter().position(|k| *k == p.kind).unwrap_or(0))
            .collect();
        let provider_kind = fleet
            .providers
            .iter()
            .map(|p| profile_kind[p.profile])
            .collect();
        Self {
            samples: vec![Vec::new(); kinds.len()],
            time: vec![(0, 0, 0.0); kinds.len()],
            capacity: vec![0.0; kinds.len()],
            kinds,
            profile_kind,
            provider_kind,
            sample_s,
            served: 0,
            unserved: 0,
            met: 0,
            failovers: 0,
            crashes: 0,
            departures: 0,
            ttft: Vec::new(),
            tpot: Vec::new(),
            tokens: (0, 0),
            user_paid: 0,
            providers_paid: 0,
            refunded: 0,
            clawed: 0,
            quarantined: 0,
            cheats: BTreeMap::new(),
            operating: 0.0,
            energy: 0.0,
        }
    }

    /// Requests finished or given up.
    pub fn closed(&self) -> u64 {
        self.served + self.unserved
    }

    pub fn unserved(&mut self, _request: usize) {
        self.unserved += 1;
    }

    pub fn failover(&mut self) {
        self.failovers += 1;
    }

    pub fn crash(&mut self) {
        self.crashes += 1;
    }

    pub fn departed(&mut self) {
        self.departures += 1;
    }

    /// A request finished on a provider: whether it met its targets, its
    /// TTFT and TPOT, what its user paid and its provider was paid.
    pub fn finished(
        &mut self,
        _provider: usize,
        met: bool,
        (ttft, tpot): (f64, f64),
        (cost, paid): (i64, i64),
        t: Tokens,
    ) {
        self.served += 1;
        self.met += u64::from(met);
        self.ttft.push(ttft as f32);
        self.tpot.push(tpot as f32);
        self.tokens.0 += t.prompt;
        self.tokens.1 += t.completion;
        self.user_paid += i128::from(cost);
        self.providers_paid += i128::from(paid);
    }

    /// A cheat's attempt: whether its answer was wrong and whether a
    /// spot check looked at it.
    /// A cheat's attempt that cost its user `cost` and paid its provider
    /// `paid`: whether its answer was wrong and whether a spot check
    /// looked at it. A caught one costs the treasury the fee it refunds.
    pub fn cheated(&mut self, c: Cheat, (cost, paid): (i64, i64), harmful: bool, checked: bool) {
        let t = self.cheats.entry(c).or_default();
        t.attempts += 1;
        if harmful {
            t.harmful += 1;
            if checked {
                t.caught += 1;
                t.treasury_ticks += i128::from(cost - paid);
            } else {
                t.cost_ticks += i128::from(cost);
            }
        }
    }

    /// A contract filled: its bidder prepaid `cost`, its seller was paid
    /// `seller` (ticks).
    pub fn prepaid(&mut self, cost: i64, seller: i64) {
        self.user_paid += i128::from(cost);
        self.providers_paid += i128::from(seller);
    }

    /// A caught attempt: its user refunded, its pay clawed back, its
    /// provider quarantined.
    pub fn clawed_back(&mut self, _provider: usize, cost: i64, paid: i64) {
        self.refunded += i128::from(cost);
        self.clawed += i128::from(paid);
        self.quarantined += 1;
    }

    /// One utilization sample: per provider (profile, online, running,
    /// cap).
    pub fn record_sample(
        &mut self,
        now_us: u64,
        rows: impl Iterator<Item = (usize, bool, u32, u32)>,
    ) {
        let at_h = now_us as f64 / 3.6e9;
        let mut s = vec![
            (
                Sample {
                    at_h,
                    ..Sample::default()
                },
                0.0f64
            );
            self.kinds.len()
        ];
        for (profile, online, running, cap) in rows {
            if !online {
                continue;
            }
            let k = &mut s[self.profile_kind[profile]];
            k.0.online += 1;
            k.0.busy += u32::from(running > 0);
            k.0.utilization += f64::from(running);
            k.1 += f64::from(cap.max(1));
        }
        for (kind, (mut x, cap)) in s.into_iter().enumerate() {
            x.utilization = if cap > 0.0 { x.utilization / cap } else { 0.0 };
            self.samples[kind].push(x);
        }
    }

    /// A provider's time at the end.
    pub fn provider_time(&mut self, p: usize, t: ProviderTime) {
        let k = self.provider_kind[p];
        let x = &mut self.time[k];
        x.0 += t.online_us;
        x.1 += t.busy_us;
        x.2 += t.seq_us;
        self.capacity[k] += t.online_us as f64 * f64::from(t.cap.max(1));
        self.operating += t.hourly_cost as f64 * t.online_us as f64 / 3.6e9;
        self.energy += t.hourly_energy as f64 * t.busy_us as f64 / 3.6e9;
    }

    pub fn sample_s(&self) -> f64 {
        self.sample_s
    }
}

/// One processor type's share of a run.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub kind: String,
    pub providers: usize,
    pub online_hours: f64,
    /// Share of online time with nothing running.
    pub idle_share: f64,
    /// Sequences run over capacity, while online.
    pub utilization: f64,
    pub samples: Vec<Sample>,
}

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    fn of(v: &mut [f32]) -> Self {
        v.sort_by(f32::total_cmp);
        let at = |q: f64| {
            if v.is_empty() {
                return 0.0;
            }
            f64::from(v[((v.len() - 1) as f64 * q).round() as usize])
        };
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// The money of a run, in currency units.
#[derive(Debug, Clone, Serialize)]
pub struct MoneyReport {
    pub users_paid: f64,
    pub providers_paid: f64,
    pub treasury: f64,
    pub refunded: f64,
    pub clawed_back: f64,
    /// What users paid per million tokens (prompt and output).
    pub user_cost_per_mtok: f64,
    /// What providers earned per million tokens.
    pub provider_earned_per_mtok: f64,
    /// What the providers' hardware, power and network cost them per
    /// million tokens, over their online hours.
    pub provider_cost_per_mtok: f64,
    /// The electricity of their busy hours per million tokens: the
    /// marginal cost of serving for hardware owned anyway.
    pub provider_energy_per_mtok: f64,
    /// Exact totals (ticks): users net of refunds, providers net of
    /// clawbacks.
    pub users_paid_ticks: i64,
    pub providers_paid_ticks: i64,
}

/// The same load on the cloud.
#[derive(Debug, Clone, Serialize)]
pub struct BaselineReport {
    pub profile: String,
    pub price_per_hour: f64,
    pub source: String,
    /// Processors provisioned for the peak window at the target
    /// utilization, for the whole run.
    pub provisioned: u64,
    pub cost_per_mtok_static: f64,
    /// Processors scaled each window to its load (a lower bound).
    pub cost_per_mtok_autoscaled: f64,
    /// How many times cheaper the fleet is for users than the static
    /// (and the autoscaled) cloud.
    pub fleet_cheaper_static: f64,
    pub fleet_cheaper_autoscaled: f64,
}

/// A run's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub policy: String,
    pub requests: u64,
    pub served: u64,
    pub unserved: u64,
    /// Share of requests served within both latency targets.
    pub goodput: f64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub hours: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub failovers: u64,
    pub crashes: u64,
    /// Providers that left for good (churn).
    pub departures: u64,
    pub quarantined: u64,
    /// Layer-sharded pipelines the planner chained, their members, and
    /// the sharded groups' providers left over.
    pub pipelines: u64,
    pub pipeline_members: u64,
    pub unchained: u64,
    pub money: MoneyReport,
    pub baseline: BaselineReport,
    pub cheats: BTreeMap<Cheat, CheatTally>,
    pub kinds: Vec<KindReport>,
    /// Share of online processor time with nothing running, over all.
    pub idle_share: f64,
    pub events: u64,
    pub wall_s: f64,
    /// The spot market's side, when the fleet has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub market: Option<crate::market::MarketReport>,
}

fn units(t: i128) -> f64 {
    t as f64 / TICKS_PER_UNIT as f64
}

/// The cloud's cost for `trace`: each request's processor-seconds on the
/// baseline profile at the largest batch that meets its TPOT target,
/// summed per window; provisioned for the peak window (or per window) at
/// the target utilization.
fn baseline(
    fleet: &Fleet,
    trace: &[Request],
    window_s: f64,
    tokens: f64,
    user_paid: f64,
) -> BaselineReport {
    let b = &fleet.file.baseline;
    let f = &fleet.file;
    let profile = f
        .profiles
        .iter()
        .find(|p| p.name == b.profile)
        .unwrap_or(&f.profiles[0]);
    let mut windows: BTreeMap<u64, f64> = BTreeMap::new();
    for r in trace {
        let scale = f
            .models
            .iter()
            .find(|m| m.name == r.model)
            .map_or(1.0, |m| m.scale);
        let c = profile_on(profile, scale);
        let batch = (1..=profile.max_batch.max(1))
            .rev()
            .find(|&n| c.step_ms(n) <= r.tpot_ms)
            .unwrap_or(1);
        let ms = c.prefill_ms(r.prompt_tokens as usize)
            + f64::from(r.output_tokens) * c.step_ms(batch) / f64::from(batch);
        *windows.entry((r.at_s / window_s) as u64).or_default() += ms / 1e3;
    }
    let need = |secs: f64| (secs / window_s / b.target_utilization.max(0.01)).ceil();
    let peak = windows.values().map(|&s| need(s)).fold(0.0, f64::max);
    let span_h = (windows.len().max(1) as f64) * window_s / 3600.0;
    let static_cost = peak * span_h * b.price_per_hour;
    let auto_cost: f64 = windows
        .values()
        .map(|&s| need(s) * window_s / 3600.0 * b.price_per_hour)
        .sum();
    let per_mtok = |c: f64| if tokens > 0.0 { c / tokens * 1e6 } else { 0.0 };
    let fleet = per_mtok(user_paid);
    let ratio = |c: f64| {
        if fleet > 0.0 {
            per_mtok(c) / fleet
        } else {
            0.0
        }
    };
    BaselineReport {
        profile: b.profile.clone(),
        price_per_hour: b.price_per_hour,
        source: b.source.clone(),
        provisioned: peak as u64,
        cost_per_mtok_static: per_mtok(static_cost),
        cost_per_mtok_autoscaled: per_mtok(auto_cost),
        fleet_cheaper_static: ratio(static_cost),
        fleet_cheaper_autoscaled: ratio(auto_cost),
    }
}

impl Tally {
    /// The report of a finished run of `trace` over `fleet`; `end_us` is
    /// the virtual time it ended.
    pub fn report(
        mut self,
        fleet: &Fleet,
        trace: &[Request],
        policy: &str,
        end_us: u64,
        events: u64,
        wall_s: f64,
    ) -> Report {
        let tokens = (self.tokens.0 + self.tokens.1) as f64;
        let kinds = self.kind_reports();
        let all = self
            .time
            .iter()
            .fold((0u64, 0u64), |a, t| (a.0 + t.0, a.1 + t.1));
        for c in self.cheats.values_mut() {
            c.cost_to_users = units(c.cost_ticks);
            c.cost_to_treasury = units(c.treasury_ticks);
        }
        let money = self.money_report(tokens);
        Report {
            policy: policy.to_string(),
            requests: trace.len() as u64,
            served: self.served,
            unserved: self.unserved,
            goodput: self.met as f64 / trace.len().max(1) as f64,
            ttft_ms: Percentiles::of(&mut self.ttft),
            tpot_ms: Percentiles::of(&mut self.tpot),
            hours: end_us as f64 / 3.6e9,
            prompt_tokens: self.tokens.0,
            output_tokens: self.tokens.1,
            failovers: self.failovers,
            crashes: self.crashes,
            departures: self.departures,
            quarantined: self.quarantined,
            pipelines: fleet
                .providers
                .iter()
                .filter(|p| !p.stages.is_empty())
                .count() as u64,
            pipeline_members: fleet.providers.iter().map(|p| p.stages.len() as u64).sum(),
            unchained: fleet.unchained as u64,
            baseline: baseline(
                fleet,
                trace,
                self.sample_s.max(60.0),
                tokens,
                money.users_paid,
            ),
            money,
            cheats: self.cheats,
            kinds,
            idle_share: if all.0 > 0 {
                1.0 - all.1 as f64 / all.0 as f64
            } else {
                0.0
            },
            events,
            wall_s,
            market: None,
        }
    }

    /// Each processor type's hours, idle share, utilization and samples.
    fn kind_reports(&mut self) -> Vec<KindReport> {
        let mut kinds = Vec::new();
        for (k, name) in self.kinds.iter().enumerate() {
            let (online, busy, seq) = self.time[k];
            kinds.push(KindReport {
                kind: name.clone(),
                providers: self.provider_kind.iter().filter(|&&x| x == k).count(),
                online_hours: online as f64 / 3.6e9,
                idle_share: if online > 0 {
                    1.0 - busy as f64 / online as f64
                } else {
                    0.0
                },
                utilization: if self.capacity[k] > 0.0 {
                    seq / self.capacity[k]
                } else {
                    0.0
                },
                samples: std::mem::take(&mut self.samples[k]),
            });
        }
        kinds
    }

    /// The money, net of refunds and clawbacks, over `tokens` served.
    fn money_report(&self, tokens: f64) -> MoneyReport {
        let per_mtok = |t: i128| {
            if tokens > 0.0 {
                units(t) / tokens * 1e6
            } else {
                0.0
            }
        };
        let user_paid = self.user_paid - self.refunded;
        let providers_paid = self.providers_paid - self.clawed;
        MoneyReport {
            users_paid: units(user_paid),
            providers_paid: units(providers_paid),
            treasury: units(user_paid - providers_paid),
            refunded: units(self.refunded),
            clawed_back: units(self.clawed),
            user_cost_per_mtok: per_mtok(user_paid),
            provider_earned_per_mtok: per_mtok(providers_paid),
            provider_cost_per_mtok: per_mtok(self.operating as i128),
            provider_energy_per_mtok: per_mtok(self.energy as i128),
            users_paid_ticks: i64::try_from(user_paid).unwrap_or(i64::MAX),
            providers_paid_ticks: i64::try_from(providers_paid).unwrap_or(i64::MAX),
        }
    }
}
