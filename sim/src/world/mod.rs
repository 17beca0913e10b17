//! The simulation proper: a discrete-event loop in virtual microseconds
//! over the fleet's providers and a trace. Each request is placed by the
//! production placement policy (`server::services::placement::policy`)
//! over a `Snapshot` of the candidates serving its model in its region
//! (then the other regions in turn), priced by the production pricing
//! engine from each provider's costs and load, admitted under the
//! production `Measure`'s adaptive cap, spot-checked at the production
//! `SpotConfig`'s rates and settled by the production settlement rule
//! (`money::ledger::settle::payees`). Only execution is virtual: a
//! request's prefill and decode take the times its provider's calibrated
//! `Profile` predicts at its batch (a stalling cheat ten times that).
//! Providers crash and return, follow their schedules, and cheats are
//! caught, clawed back and quarantined.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use money::ledger::amount::BPS;
use money::market::pricing::{Occupancy, prices};
use rand::Rng;
use rand::rngs::StdRng;
use server::services::placement::policy::{Policy, PolicyKind, Snapshot, policy};
use server::services::placement::score::{Candidate, Measure, Terms, Weights};
use server::services::spotcheck::SpotConfig;

use crate::fleet::{Cheat, Fleet};
use crate::journal::Settled;
use crate::market::Market;
use crate::report::{ProviderTime, Tally};
use crate::workload::Request;

const US_PER_MS: f64 = 1e3;
const US_PER_S: f64 = 1e6;
const US_PER_H: f64 = 3.6e9;

/// A stalling cheat's steps take this many times its calibration.
const STALL: f64 = 10.0;

/// How long a crash takes to notice before its requests are replayed.
const DETECT_MS: f64 = 1_000.0;

mod bill;
mod trade;

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: PolicyKind,
    pub weights: Weights,
    pub spot: SpotConfig,
    /// Seconds between utilization samples.
    pub sample_s: f64,
    /// The decode step the adaptive caps aim under (the dispatcher's
    /// `step_target_ms`).
    pub step_target_ms: f64,
    /// Keep every settlement (`World::settled`), to replay into a ledger.
    pub record: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    Finish {
        p: usize,
        r: usize,
        attempt: u32,
    },
    Crash(usize),
    Return(usize),
    Schedule(usize),
    Sample,
    BidRound,
    /// A provider arrives (churn) or leaves for good.
    Arrives(usize),
    Leaves(usize),
}

/// A request in flight.
#[derive(Debug, Clone, Default)]
struct Live {
    attempt: u32,
    provider: Option<usize>,
    /// Its prices where it was placed (none until then).
    prices: Option<money::ledger::Prices>,
    started_us: u64,
    step_ms: f64,
    ttft_ms: f64,
    /// Runs on capacity its tenant bought (prepaid).
    covered: bool,
}

/// A provider's state.
#[derive(Debug, Clone)]
struct Slot {
    measure: Measure,
    /// The requests it runs.
    active: Vec<usize>,
    queue: VecDeque<usize>,
    up: bool,
    in_hours: bool,
    banned: bool,
    /// Arrived and not yet left for good.
    present: bool,
    /// Its index among its pool's candidates while online.
    at: Option<usize>,
    delivered: u64,
    /// Time with anything running, and sequence-time (running x time).
    busy_us: u64,
    seq_us: f64,
    /// When `active` last changed.
    changed_us: u64,
    online_us: u64,
    since_us: u64,
}

impl Slot {
    /// A provider calibrated at its profile, capped under the step
    /// target and its batch limit; not yet arrived.
    fn new(p: &crate::fleet::Provider, max_batch: u32, step_target_ms: f64) -> Self {
        let mut measure = Measure::calibrated(p.calibrated, step_target_ms);
        measure.cap = measure.cap.min(max_batch.max(1));
        Self {
            measure,
            active: Vec::new(),
            queue: VecDeque::new(),
            up: true,
            in_hours: false,
            banned: false,
            present: false,
            at: None,
            delivered: 0,
            busy_us: 0,
            seq_us: 0.0,
            changed_us: 0,
            online_us: 0,
            since_us: 0,
        }
    }

    fn running(&self) -> u32 {
        self.active.len() as u32
    }
}

/// The candidates serving one model in one region.
#[derive(Debug)]
struct Pool {
    snap: Snapshot,
    members: Vec<usize>,
    policy: Box<dyn Policy>,
}

/// The simulation's state.
pub struct World<'a> {
    fleet: &'a Fleet,
    trace: &'a [Request],
    settings: Settings,
    rng: StdRng,
    now: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    slots: Vec<Slot>,
    pools: Vec<Pool>,
    live: Vec<Live>,
    /// Model and region indices of each request.
    keys: Vec<(usize, usize)>,
    pub tally: Tally,
    /// Every settlement, in order, when `Settings::record` is set.
    pub settled: Vec<Settled>,
    /// The books, when the fleet has a market.
    pub market: Option<Market>,
    /// What each tenant that buys capacity bids for, per model: its mean
    /// tokens a second and its largest request.
    demand: Vec<trade::Demand>,
    buyers: std::collections::HashSet<String>,
    /// Provider index by id.
    by_id: std::collections::HashMap<String, usize>,
    /// The policy that picks among the regions' nominees.
    nominate: Box<dyn Policy>,
}

impl<'a> World<'a> {
    /// A world at time 0 with every provider scheduled.
    pub fn new(
        fleet: &'a Fleet,
        trace: &'a [Request],
        settings: Settings,
        rng: StdRng,
    ) -> anyhow::Result<Self> {
        let f = &fleet.file;
        let keys = keys_of(fleet, trace)?;
        let pools = (0..f.models.len() * f.regions.len())
            .map(|_| Pool {
                snap: Snapshot::new(0, 0, Vec::new()),
                members: Vec::new(),
                policy: policy(settings.policy, settings.weights),
            })
            .collect();
        let slots = fleet
            .providers
            .iter()
            .map(|p| Slot::new(p, f.profiles[p.profile].max_batch, settings.step_target_ms))
            .collect();
        let b = trade::buyers(fleet, trace);
        let mut w = Self {
            nominate: policy(settings.policy, settings.weights),
            market: b.market,
            demand: b.demand,
            buyers: b.names,
            by_id: fleet
                .providers
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id.clone(), i))
                .collect(),
            fleet,
            trace,
            tally: Tally::new(fleet, settings.sample_s),
            settings,
            rng,
            now: 0,
            events: BinaryHeap::new(),
            seq: 0,
            slots,
            pools,
            settled: Vec::new(),
            live: vec![Live::default(); trace.len()],
            keys,
        };
        for (p, pr) in fleet.providers.iter().enumerate() {
            w.push((pr.arrives_h * US_PER_H) as u64, Event::Arrives(p));
            if let Some(h) = pr.leaves_h {
                w.push((h * US_PER_H) as u64, Event::Leaves(p));
            }
        }
        for (i, r) in trace.iter().enumerate() {
            w.push((r.at_s * US_PER_S) as u64, Event::Arrive(i));
        }
        w.push(0, Event::Sample);
        if w.market.is_some() {
            w.push(1, Event::BidRound);
        }
        Ok(w)
    }

    fn push(&mut self, at: u64, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, e)));
    }

    fn schedule_crash(&mut self, p: usize) {
        if let Some(h) = self.fleet.providers[p].mtbf_hours.filter(|h| *h > 0.0) {
            let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
            let at = self.now + (-u.ln() * h * US_PER_H) as u64;
            self.push(at, Event::Crash(p));
        }
    }

    /// Runs until every request has finished or failed; the events
    /// handled and the virtual time it ended at.
    pub fn run(&mut self) -> (u64, u64) {
        let mut handled = 0;
        let total = self.trace.len() as u64;
        while let Some(Reverse((at, _, e))) = self.events.pop() {
            self.now = at;
            handled += 1;
            match e {
                Event::Arrive(r) => self.arrive(r),
                Event::Finish { p, r, attempt } => self.finish(p, r, attempt),
                Event::Crash(p) => self.crash(p),
                Event::Return(p) => {
                    self.slots[p].up = true;
                    self.set_online(p);
                    self.schedule_crash(p);
                }
                Event::Schedule(p) => self.schedule(p),
                Event::Arrives(p) => {
                    self.slots[p].present = true;
                    self.schedule(p);
                    self.schedule_crash(p);
                }
                Event::Leaves(p) => self.leave(p),
                Event::BidRound => {
                    self.bid_round();
                    if self.tally.closed() < total {
                        let every = self.market.as_ref().map_or(3600.0, |m| m.spec.bid_every_s);
                        self.push(
                            self.now + (every.max(1.0) * US_PER_S) as u64,
                            Event::BidRound,
                        );
                    }
                }
                Event::Sample => {
                    self.take_sample();
                    if self.tally.closed() < total {
                        let next = self.now + (self.settings.sample_s * US_PER_S) as u64;
                        self.push(next, Event::Sample);
                    }
                }
            }
            if self.tally.closed() == total {
                break;
            }
        }
        self.close_time();
        (handled, self.now)
    }

    /// Whether `p` should take work now.
    fn online(&self, p: usize) -> bool {
        let s = &self.slots[p];
        s.present && s.up && s.in_hours && !s.banned
    }

    fn pool_of(&self, p: usize) -> usize {
        let pr = &self.fleet.providers[p];
        pr.model * self.fleet.file.regions.len() + pr.region
    }

    /// Puts `p` into or takes it out of its pool to match `online`; out,
    /// its queue is placed again.
    fn set_online(&mut self, p: usize) {
        let on = self.online(p);
        let pool = self.pool_of(p);
        let now = self.now;
        let s = &mut self.slots[p];
        match (on, s.at) {
            (true, None) => {
                s.since_us = now;
                let c = self.as_candidate(p);
                let pl = &mut self.pools[pool];
                self.slots[p].at = Some(pl.members.len());
                pl.members.push(p);
                pl.snap.candidates.push(c);
                self.refresh(p);
                self.post_ask(p);
            }
            (false, Some(i)) => {
                s.online_us += now - s.since_us;
                s.at = None;
                let queued: Vec<usize> = s.queue.drain(..).collect();
                let pl = &mut self.pools[pool];
                pl.members.swap_remove(i);
                pl.snap.candidates.swap_remove(i);
                if let Some(&moved) = pl.members.get(i) {
                    self.slots[moved].at = Some(i);
                }
                for r in queued {
                    self.replace(r);
                }
                if let Some(m) = &mut self.market {
                    m.withdraw(p, self.fleet.providers[p].model);
                }
            }
            _ => {}
        }
    }

    /// `p` as placement sees it.
    fn as_candidate(&self, p: usize) -> Candidate {
        let pr = &self.fleet.providers[p];
        Candidate {
            measure: self.slots[p].measure,
            terms: Terms {
                provider_id: pr.id.clone(),
                prices: self.prices_of(p),
                payout_bps: BPS,
                reputation_bps: BPS,
            },
            factor: 1.0,
            cached: 0,
            house: false,
        }
    }

    /// What a user pays on `p` now: the production pricing engine over
    /// its costs and load.
    fn prices_of(&self, p: usize) -> money::ledger::Prices {
        self.prices_of_load(
            p,
            self.slots[p].running() as usize + self.slots[p].queue.len(),
        )
    }

    /// `p`'s prices with `outstanding` sequences on it.
    fn prices_of_load(&self, p: usize, outstanding: usize) -> money::ledger::Prices {
        let pr = &self.fleet.providers[p];
        let cap = u64::from(self.slots[p].measure.cap.max(1));
        let n = outstanding as u64;
        let load = Occupancy {
            running: n.min(cap),
            waiting: n.saturating_sub(cap),
            capacity: cap,
        };
        prices(
            &pr.cost,
            pr.micros_per_kwh,
            load,
            self.fleet.file.fee_bps,
            false,
        )
    }

    /// Copies `p`'s load and prices into its pool's candidate.
    fn refresh(&mut self, p: usize) {
        let Some(i) = self.slots[p].at else {
            return;
        };
        let s = &mut self.slots[p];
        s.measure.outstanding = s.running() + s.queue.len() as u32;
        let (m, prices) = (s.measure, self.prices_of(p));
        let pool = self.pool_of(p);
        let c = &mut self.pools[pool].snap.candidates[i];
        c.measure = m;
        c.terms.prices = prices;
    }

    fn arrive(&mut self, r: usize) {
        if let Some(p) = self.covered_by(r) {
            self.live[r].provider = Some(p);
            self.live[r].covered = true;
            self.admit(r, p);
            return;
        }
        self.live[r].covered = false;
        match self.route(r) {
            Some(p) => {
                self.live[r].provider = Some(p);
                self.live[r].prices = Some(self.prices_of(p));
                self.admit(r, p);
            }
            None => self.tally.unserved(r),
        }
    }

    /// Where `r` goes: its region's pick by the policy; when that one is
    /// full, the policy's pick among it and every other region's pick
    /// (each region's gateway nominates, the policy decides).
    fn route(&mut self, r: usize) -> Option<usize> {
        let (model, home) = self.keys[r];
        let regions = self.fleet.file.regions.len();
        let req = &self.trace[r];
        let (prompt, max_tokens) = (req.prompt_tokens as usize, req.output_tokens as usize);
        let order = std::iter::once(home).chain((0..regions).filter(|&g| g != home));
        let mut nominees: Vec<(usize, Candidate)> = Vec::new();
        for g in order {
            let pool = &mut self.pools[model * regions + g];
            if pool.members.is_empty() {
                continue;
            }
            pool.snap.prompt = prompt;
            pool.snap.max_tokens = max_tokens;
            let Some(i) = pool.policy.pick(&pool.snap) else {
                continue;
            };
            let c = &pool.snap.candidates[i];
            if nominees.is_empty() && !c.measure.full() {
                return Some(pool.members[i]);
            }
            nominees.push((pool.members[i], c.clone()));
        }
        let (ids, candidates): (Vec<usize>, Vec<Candidate>) = nominees.into_iter().unzip();
        let snap = Snapshot::new(prompt, max_tokens, candidates);
        let i = self.nominate.pick(&snap)?;
        ids.get(i).copied()
    }

    /// Starts `r` on `p`, or queues it there at its cap.
    fn admit(&mut self, r: usize, p: usize) {
        if self.slots[p].running() < self.slots[p].measure.cap.max(1) {
            self.start(r, p);
        } else {
            self.slots[p].queue.push_back(r);
        }
        self.refresh(p);
    }

    /// Places `r` again (its provider went away): a failover.
    fn replace(&mut self, r: usize) {
        self.live[r].attempt += 1;
        self.tally.failover();
        let at = self.now + (DETECT_MS * US_PER_MS) as u64;
        self.push(at, Event::Arrive(r));
    }

    /// Adds (`Ok`) or removes (`Err`) a running request of `p`,
    /// accounting its busy time.
    fn busy_change(&mut self, p: usize, r: Result<usize, usize>) {
        let now = self.now;
        let s = &mut self.slots[p];
        let dt = now - s.changed_us;
        if !s.active.is_empty() {
            s.busy_us += dt;
        }
        s.seq_us += dt as f64 * s.active.len() as f64;
        s.changed_us = now;
        match r {
            Ok(r) => s.active.push(r),
            Err(r) => {
                if let Some(i) = s.active.iter().position(|&x| x == r) {
                    s.active.swap_remove(i);
                }
            }
        }
    }

    fn start(&mut self, r: usize, p: usize) {
        self.busy_change(p, Ok(r));
        let pr = &self.fleet.providers[p];
        let req = &self.trace[r];
        let cal = &pr.calibrated;
        let stall = if pr.cheat == Some(Cheat::Stall) {
            STALL
        } else {
            1.0
        };
        let prefill = cal.prefill_ms(req.prompt_tokens as usize) * stall;
        let step = cal.step_ms(self.slots[p].running()) * stall;
        let rtt = self.fleet.file.profiles[pr.profile].rtt_ms;
        let waited = (self.now as f64 - req.at_s * US_PER_S) / US_PER_MS;
        let l = &mut self.live[r];
        l.started_us = self.now;
        l.step_ms = step;
        l.ttft_ms = waited + prefill + rtt;
        let dur = prefill + f64::from(req.output_tokens) * step;
        let attempt = l.attempt;
        self.push(
            self.now + (dur * US_PER_MS) as u64,
            Event::Finish { p, r, attempt },
        );
    }

    fn finish(&mut self, p: usize, r: usize, attempt: u32) {
        if self.live[r].attempt != attempt || self.live[r].provider != Some(p) {
            return;
        }
        self.busy_change(p, Err(r));
        let step = self.live[r].step_ms;
        let target = self.settings.step_target_ms;
        let s = &mut self.slots[p];
        s.delivered += 1;
        s.measure.observe(step);
        s.measure.adapt(step, target);
        self.bill(p, r);
        while self.slots[p].running() < self.slots[p].measure.cap.max(1) {
            let Some(next) = self.slots[p].queue.pop_front() else {
                break;
            };
            self.start(next, p);
        }
        self.refresh(p);
    }

    fn crash(&mut self, p: usize) {
        if !self.slots[p].up || !self.slots[p].present {
            return;
        }
        self.slots[p].up = false;
        self.tally.crash();
        self.set_online(p);
        self.lose_running(p);
        let back = self.fleet.providers[p].repair_hours;
        self.push(self.now + (back * US_PER_H) as u64, Event::Return(p));
    }

    /// `p` went away: what it runs is lost and placed again.
    fn lose_running(&mut self, p: usize) {
        let running = self.slots[p].active.clone();
        for r in running {
            self.busy_change(p, Err(r));
            self.replace(r);
        }
    }

    /// `p` leaves for good: what it runs is placed again.
    fn leave(&mut self, p: usize) {
        self.slots[p].present = false;
        self.tally.departed();
        self.set_online(p);
        self.lose_running(p);
    }

    fn schedule(&mut self, p: usize) {
        if !self.slots[p].present {
            return;
        }
        let pr = &self.fleet.providers[p];
        let offset = self.fleet.file.regions[pr.region].utc_offset_h;
        let hour = (self.now as f64 / US_PER_H + offset).rem_euclid(24.0);
        self.slots[p].in_hours = pr.availability.online_at(hour);
        self.set_online(p);
        if let Some(h) = pr.availability.next_change(hour) {
            self.push(self.now + (h * US_PER_H) as u64 + 1, Event::Schedule(p));
        }
    }

    fn take_sample(&mut self) {
        let rows = self.slots.iter().enumerate().map(|(p, s)| {
            let pr = &self.fleet.providers[p];
            let cap = self.fleet.file.profiles[pr.profile].max_batch;
            (pr.profile, s.at.is_some(), s.running(), cap)
        });
        self.tally.record_sample(self.now, rows);
    }

    /// The market's report, once the run is over.
    pub fn market_report(&mut self) -> Option<crate::market::MarketReport> {
        self.market.take().map(Market::finish)
    }

    /// Closes every provider's online and busy time at the end.
    fn close_time(&mut self) {
        let now = self.now;
        for p in 0..self.slots.len() {
            self.busy_change(p, Err(usize::MAX));
            let s = &mut self.slots[p];
            if s.at.is_some() {
                s.online_us += now - s.since_us;
                s.since_us = now;
            }
            let t = ProviderTime {
                online_us: s.online_us,
                busy_us: s.busy_us,
                seq_us: s.seq_us,
                cap: self.fleet.file.profiles[self.fleet.providers[p].profile].max_batch,
                hourly_cost: {
                    let pr = &self.fleet.providers[p];
                    pr.cost.hourly_cost(pr.micros_per_kwh)
                },
                hourly_energy: {
                    let pr = &self.fleet.providers[p];
                    let power = money::market::pricing::CostProfile {
                        depreciation_per_hour: 0,
                        network_per_hour: 0,
                        ..pr.cost.clone()
                    };
                    power.hourly_cost(pr.micros_per_kwh)
                },
            };
            self.tally.provider_time(p, t);
        }
    }
}

/// Each request's model and region indices; an error names the first
/// request whose model or region the fleet lacks.
fn keys_of(fleet: &Fleet, trace: &[Request]) -> anyhow::Result<Vec<(usize, usize)>> {
    let f = &fleet.file;
    trace
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let m = f.models.iter().position(|m| m.name == r.model);
            let g = f.regions.iter().position(|g| g.name == r.region);
            match (m, g) {
                (Some(m), Some(g)) => Ok((m, g)),
                _ => Err(anyhow::anyhow!(
                    "request {i}: model {} or region {} is not in the fleet",
                    r.model,
                    r.region
                )),
            }
        })
        .collect()
}
