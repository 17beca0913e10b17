//! Metering API requests: before a request runs, a quote from the market
//! (the house provider's prices under the engine's current load) and a hold
//! of its worst case on the payer's account; while it runs, a `Tab` counts
//! the tokens each choice produced (checkpointed onto the hold every
//! second, for recovery if this server dies); when it ends, however it ends
//! (finished, failed, or dropped because the client left), the tab settles
//! the hold from that count, exactly once. Also, in the background: the house
//! provider's throughput measured from the engine's counters, its standing
//! asks and its price history.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{EngineHandle, TokenEvent, Usage};

use crate::services::ServiceError;
use engine::registry::{ModelKind, ModelRegistry};
use money::ledger::amount::Stages;
use money::ledger::holds::HoldRequest;
use money::ledger::{Closed, HOUSE_PROVIDER, LOCAL_USER, Ledger, Outcome, Quote, Tokens};
use money::market::book::Side;
use money::market::pricing::Occupancy;
use money::market::{Market, NewOrder};
use money::store::keys::KeyRecord;

/// The ledger and the market, as the API uses them.
#[derive(Debug)]
pub struct Billing {
    pub ledger: Ledger,
    pub market: Arc<Market>,
    /// Sequences each engine runs at once (for utilization).
    pub capacity: u64,
    /// Engine counters at the start of the current throughput window.
    pub window: std::sync::Mutex<Option<engine::EngineStats>>,
}

/// Forward time a window needs before its throughput updates the profile.
const MIN_WINDOW_BUSY_MICROS: u64 = 5_000_000;

/// Who pays: the key's account, or the local account in open mode.
#[derive(Debug, Clone)]
pub struct Payer {
    pub account_id: String,
    pub key_id: Option<String>,
}

impl Payer {
    pub fn of(key: Option<&KeyRecord>) -> Self {
        match key {
            Some(k) => Self {
                account_id: k.account_id.clone(),
                key_id: Some(k.id.clone()),
            },
            None => Self {
                account_id: LOCAL_USER.to_string(),
                key_id: None,
            },
        }
    }
}

/// What one choice has used so far.
#[derive(Debug, Clone, Copy, Default)]
struct ChoiceUse {
    prompt: u64,
    cached: u64,
    completion: u64,
    done: bool,
}

/// A running request's meter. Dropping it settles the hold from what was
/// counted (or releases it if nothing ran).
#[derive(Debug)]
pub struct Tab {
    ledger: Ledger,
    request_id: String,
    choices: Vec<ChoiceUse>,
    started: bool,
    failed: bool,
    closed: bool,
    /// When the usage was last checkpointed onto the hold.
    checkpointed: Instant,
    /// The prices it runs at (a cached copy of its answer is priced from
    /// them).
    prices: money::ledger::Prices,
    /// Which providers' executors delivered the tokens (the relays add to
    /// it); empty when the house engine ran everything.
    credits: Credits,
}

/// Who ran one request's attempts, shared with its relays: the providers
/// and the tokens their executors delivered (`""` is the house engine),
/// the executor that ran the first prefill, and those that decoded.
#[derive(Debug, Clone, Default)]
pub struct Credits(std::sync::Arc<std::sync::Mutex<Attempts>>);

#[derive(Debug, Default)]
struct Attempts {
    work: Vec<money::ledger::settle::Work>,
    /// Layer-tokens each pipeline stage computed for the request, by
    /// (executor, provider, payout share).
    stages: std::collections::BTreeMap<(String, String, i64), u64>,
    prefill: Option<String>,
    decode: Vec<String>,
    /// Whose request it is, for a clawback's refund.
    payer: Option<PaidBy>,
    /// What each pipeline stage (by executor) was paid at settlement,
    /// for a clawback.
    paid_stages: Vec<(String, money::ledger::settle::Work)>,
}

/// Who pays a request, and how (a spot check that fails refunds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidBy {
    pub account_id: String,
    pub request_id: String,
    /// The protocol fee its providers' pay is net of.
    pub fee_bps: i64,
    /// Paid per token (false: prepaid capacity, nothing to refund).
    pub refundable: bool,
}

impl Credits {
    /// Credits of a request `payer` pays.
    fn of(payer: PaidBy) -> Self {
        let c = Self::default();
        c.0.lock().unwrap_or_else(|e| e.into_inner()).payer = Some(payer);
        c
    }

    /// A worker's encoder on `executor` embedded the request: its
    /// provider is paid for `work`.
    pub fn encoded(&self, executor: &str, work: money::ledger::settle::Work) {
        let mut a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        a.prefill = Some(executor.to_string());
        a.decode = vec![executor.to_string()];
        a.work.push(work);
    }

    /// A pipeline's stages ran one of the request's sequences: each
    /// `(executor, provider, payout share, layer-tokens computed)`. At
    /// settlement every stage's provider is paid its share of all the
    /// layer-tokens of the request's counted tokens, at the request's
    /// prices.
    pub fn stages(&self, ran: Vec<(String, String, i64, u64)>) {
        let mut a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (executor, provider, payout_bps, n) in ran {
            a.prefill.get_or_insert_with(|| executor.clone());
            if !a.decode.contains(&executor) {
                a.decode.push(executor.clone());
            }
            *a.stages
                .entry((executor, provider, payout_bps))
                .or_default() += n;
        }
    }

    /// What pipeline stage `executor` was paid when the request settled
    /// (nothing before).
    pub fn stage_pay(&self, executor: &str) -> Vec<money::ledger::settle::Work> {
        let a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        a.paid_stages
            .iter()
            .filter(|(e, _)| e == executor)
            .map(|(_, w)| w.clone())
            .collect()
    }

    /// Who pays the request (`None` for an unmetered one).
    pub fn payer(&self) -> Option<PaidBy> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .payer
            .clone()
    }

    /// An attempt on `executor` ended having done `work` (accepted only
    /// if it delivered a token).
    pub fn attempt(&self, executor: &str, work: money::ledger::settle::Work) {
        let mut a = self.0.lock().unwrap_or_else(|e| e.into_inner());
        a.prefill.get_or_insert_with(|| executor.to_string());
        if work.tokens.completion > 0 {
            a.work.push(work);
            if !a.decode.iter().any(|d| d == executor) {
                a.decode.push(executor.to_string());
            }
        }
    }

    /// What settlement needs for `t` counted tokens at `prices` (nothing
    /// when no relay or pipeline ran: the hold's own provider and
    /// executors stand).
    fn take(&self, t: Tokens, prices: money::ledger::Prices) -> money::ledger::settle::Attribution {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let payer = g.payer.clone();
        let a = std::mem::take(&mut *g);
        g.payer = payer;
        let mut work = a.work;
        let staged = stage_work(&a.stages, t, prices);
        work.extend(staged.iter().map(|(_, w)| w.clone()));
        g.paid_stages = staged;
        drop(g);
        let stages = a.prefill.map(|prefill| Stages {
            decode: if a.decode.is_empty() {
                prefill.clone()
            } else {
                a.decode.join(",")
            },
            prefill,
        });
        money::ledger::settle::Attribution { work, stages }
    }
}

/// Each pipeline stage's provider's work, by executor: its share of the
/// layer-tokens computed, of the counted tokens `t` (rounded down: the
/// rest is no one's), at `prices`.
fn stage_work(
    stages: &std::collections::BTreeMap<(String, String, i64), u64>,
    t: Tokens,
    prices: money::ledger::Prices,
) -> Vec<(String, money::ledger::settle::Work)> {
    let total: u128 = stages.values().map(|&n| u128::from(n)).sum();
    if total == 0 {
        return Vec::new();
    }
    let part = |x: u64, n: u64| (u128::from(x) * u128::from(n) / total) as u64;
    stages
        .iter()
        .map(|((executor, provider, payout_bps), &n)| {
            let work = money::ledger::settle::Work {
                provider: provider.clone(),
                prices,
                payout_bps: *payout_bps,
                tokens: Tokens {
                    prompt: part(t.prompt, n),
                    cached: part(t.cached, n),
                    completion: part(t.completion, n),
                },
            };
            (executor.clone(), work)
        })
        .collect()
}

/// How often a running request records its usage on its hold, besides
/// at its first token (what recovery bills if this server dies
/// mid-request: at most this long of its tokens go unbilled, and the
/// settlement writer's commit).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

impl Billing {
    /// The engine's load as the pricing engine sees it.
    pub fn load_of(&self, engine: &EngineHandle) -> Occupancy {
        let s = engine.stats();
        Occupancy {
            running: s.num_running,
            waiting: s.num_waiting,
            capacity: self.capacity,
        }
    }

    /// The current quote for `model` (priced under `load`).
    pub fn quote(&self, model: &str, load: Occupancy) -> Result<Quote, ServiceError> {
        Ok(self.market.quote(HOUSE_PROVIDER, model, load, false)?)
    }

    /// Quotes and holds the worst case of a request whose choices have
    /// these prompt lengths and completion limits; 402 if the payer cannot
    /// cover it.
    pub async fn open(
        &self,
        payer: &Payer,
        quote: &Quote,
        choices: &[(u64, u64)],
    ) -> Result<Tab, ServiceError> {
        self.open_held(payer, quote, choices, true).await
    }

    /// `open`, holding the worst case only if `held` (a request covered by
    /// capacity its payer bought is prepaid: a hold of zero caps its cost
    /// at zero, and its usage is still recorded at the trade price).
    async fn open_held(
        &self,
        payer: &Payer,
        quote: &Quote,
        choices: &[(u64, u64)],
        held: bool,
    ) -> Result<Tab, ServiceError> {
        let amount = choices
            .iter()
            .map(|&(prompt, max)| quote.worst_case(prompt, max))
            .fold(0i64, i64::saturating_add)
            * i64::from(held);
        let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
        let max_completion = choices.iter().map(|&(_, max)| max).sum();
        self.ledger
            .hold(HoldRequest {
                request_id: &request_id,
                account_id: &payer.account_id,
                key_id: payer.key_id.as_deref(),
                quote,
                amount,
                max_completion: Some(max_completion),
            })
            .await?;
        let choices = choices
            .iter()
            .map(|&(prompt, _)| ChoiceUse {
                prompt,
                ..ChoiceUse::default()
            })
            .collect();
        let credits = Credits::of(PaidBy {
            account_id: payer.account_id.clone(),
            request_id: request_id.clone(),
            fee_bps: quote.fee_bps,
            refundable: held,
        });
        Ok(Tab {
            ledger: self.ledger.clone(),
            request_id,
            choices,
            started: false,
            failed: false,
            closed: false,
            checkpointed: Instant::now(),
            prices: quote.prices,
            credits,
        })
    }

    /// Holds for a generation: one choice per engine request per `n`, at
    /// the house quote, or at the `planned` executor's terms where the
    /// dispatcher placed the first choice.
    pub async fn open_generation(
        &self,
        payer: &Payer,
        model: &str,
        engine: &EngineHandle,
        requests: &[engine::ValidRequest],
        planned: Option<(&str, &crate::services::placement::Terms)>,
        cover: Option<&money::market::contracts::Cover>,
    ) -> Result<Tab, ServiceError> {
        let mut quote = self.quote(model, self.load_of(engine))?;
        let info = engine.info();
        quote.stages = Stages {
            prefill: info.executor.clone(),
            decode: info.decode_executor.clone(),
        };
        if let Some((executor, terms)) = planned {
            quote.provider_id = terms.provider_id.clone();
            quote.prices = terms.prices;
            quote.payout_bps = terms.payout_bps;
            quote.stages = Stages::one(executor);
        }
        if let Some(c) = cover {
            quote.provider_id = c.seller.clone();
            quote.prices = money::ledger::Prices {
                input: c.price,
                cached_input: c.price,
                output: c.price,
            };
        }
        self.open_held(payer, &quote, &choices_of(requests), cover.is_none())
            .await
    }

    /// Covers a generation from capacity `payer` bought on the book, if a
    /// contract of it has room for the requests' worst case and its
    /// seller `can_serve` the model.
    pub async fn cover(
        &self,
        payer: &Payer,
        model: &str,
        requests: &[engine::ValidRequest],
        can_serve: impl Fn(&str) -> bool,
    ) -> Option<money::market::contracts::Cover> {
        let worst = worst_tokens(requests);
        self.market
            .cover(&payer.account_id, model, worst, can_serve)
            .await
    }
}

/// The most tokens the requests' choices can come to: what a key's
/// tokens-per-minute limit is charged, and what bought capacity must cover.
pub fn worst_tokens(requests: &[engine::ValidRequest]) -> u64 {
    choices_of(requests).iter().map(|(p, m)| p + m).sum()
}

/// Each choice's prompt tokens and most completion tokens (the one count
/// the hold, the limit and the cover are made of).
fn choices_of(requests: &[engine::ValidRequest]) -> Vec<(u64, u64)> {
    requests
        .iter()
        .flat_map(|r| {
            let c = (r.prompt_tokens.len() as u64, r.params.max_tokens as u64);
            std::iter::repeat_n(c, r.params.n.max(1))
        })
        .collect()
}

/// Settles a finished non-streaming request and waits for the commit; a
/// failure is logged (the answer was served; the hold stays open).
pub async fn settle(tab: Option<Tab>) {
    if let Some(tab) = tab {
        let id = tab.request_id().to_string();
        if let Err(e) = tab.settle().await {
            tracing::error!(request_id = %id, error = %e, "settlement failed");
        }
    }
}

impl Tab {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The prices the request runs at.
    pub fn prices(&self) -> money::ledger::Prices {
        self.prices
    }

    /// Counts one engine event of choice `i`.
    pub fn on_event(&mut self, i: usize, ev: &TokenEvent) {
        self.started = true;
        match ev {
            TokenEvent::Delta { token_ids, .. } => {
                let first = self.choices.iter().all(|c| c.completion == 0);
                if let Some(c) = self.choices.get_mut(i) {
                    c.completion += token_ids.len() as u64;
                }
                if first || self.checkpointed.elapsed() >= CHECKPOINT_EVERY {
                    self.checkpointed = Instant::now();
                    self.ledger
                        .checkpoint_later(&self.request_id, self.usage().0);
                }
            }
            TokenEvent::Finished { usage, .. } => self.finished(i, usage),
            TokenEvent::Failed(_) => self.failed = true,
        }
    }

    /// The request failed on our side: it settles at no cost.
    pub fn fail(&mut self) {
        self.started = true;
        self.failed = true;
    }

    /// Choice `i` ended with the engine's own usage count.
    pub fn finished(&mut self, i: usize, usage: &Usage) {
        self.started = true;
        if let Some(c) = self.choices.get_mut(i) {
            *c = ChoiceUse {
                prompt: usage.prompt_tokens as u64,
                cached: usage.cached_tokens as u64,
                completion: usage.completion_tokens as u64,
                done: true,
            };
        }
    }

    /// What to bill, and how the request ended.
    fn usage(&self) -> (Tokens, Outcome) {
        let mut t = Tokens::default();
        for c in &self.choices {
            t.prompt += c.prompt;
            t.cached += c.cached;
            t.completion += c.completion;
        }
        let outcome = if self.failed {
            Outcome::Failed
        } else if self.choices.iter().all(|c| c.done) {
            Outcome::Finished
        } else {
            Outcome::Cut
        };
        (t, outcome)
    }

    /// Settles now and waits for the commit (non-streaming answers).
    pub async fn settle(mut self) -> Result<Closed, ServiceError> {
        self.closed = true;
        let (t, outcome) = self.usage();
        let who = self.credits.take(t, self.prices);
        Ok(self
            .ledger
            .settle_shared(&self.request_id, t, outcome, who)
            .await?)
    }

    /// The handle the relays credit providers through.
    pub fn credits(&self) -> Credits {
        self.credits.clone()
    }
}

impl Drop for Tab {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        if self.started {
            let (t, outcome) = self.usage();
            let who = self.credits.take(t, self.prices);
            self.ledger.settle_later(&self.request_id, t, outcome, who);
        } else {
            self.ledger.release_later(&self.request_id);
        }
    }
}

/// How long the house provider's asks stay valid.
const ASK_TTL_S: i64 = 60;

/// Every `every`: for each served text model, records the house prices in
/// the history and replaces the house ask (at the output price, for the
/// profile's decode capacity); sweeps expired orders.
pub async fn run_house(billing: Arc<Billing>, models: Arc<ModelRegistry>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Err(e) = house_round(&billing, &models).await {
            tracing::warn!(error = %e, "house market round failed");
        }
    }
}

/// Updates the house profile's tokens per hour from what the (first) text
/// engine did since the window started, once it has enough forward time:
/// the new rate is the mean of the old one and the measured one.
async fn measure_house(b: &Billing, engine: &EngineHandle) -> Result<(), ServiceError> {
    let now = engine.stats();
    let start = {
        let mut w = b.window.lock().unwrap_or_else(|e| e.into_inner());
        let start = *w.get_or_insert(now);
        if now.busy_micros.saturating_sub(start.busy_micros) < MIN_WINDOW_BUSY_MICROS {
            return Ok(());
        }
        *w = Some(now);
        start
    };
    let Some(mut house) = b
        .market
        .providers()
        .into_iter()
        .find(|p| p.account_id == HOUSE_PROVIDER)
    else {
        return Ok(());
    };
    let generated = now.generated_tokens.saturating_sub(start.generated_tokens);
    let batched = now.batched_tokens.saturating_sub(start.batched_tokens);
    let busy = now.busy_micros.saturating_sub(start.busy_micros);
    let prompt = batched.saturating_sub(generated);
    if let Some((pre, dec)) =
        money::market::pricing::measured_rates(&house.profile, prompt, generated, busy)
    {
        let p = &mut house.profile;
        p.prefill_tokens_per_hour = (p.prefill_tokens_per_hour + pre) / 2;
        p.decode_tokens_per_hour = (p.decode_tokens_per_hour + dec) / 2;
        tracing::info!(
            prefill = p.prefill_tokens_per_hour,
            decode = p.decode_tokens_per_hour,
            "house throughput measured"
        );
        b.market.set_provider(house).await?;
    }
    Ok(())
}

async fn house_round(b: &Billing, models: &ModelRegistry) -> Result<(), ServiceError> {
    b.market.expire().await?;
    let first_text = models.list().into_iter().find_map(|m| match m.kind {
        ModelKind::Text(e) => Some(e),
        ModelKind::Embedding(_) => None,
    });
    if let Some(engine) = first_text {
        measure_house(b, &engine).await?;
    }
    let capacity = b
        .market
        .providers()
        .into_iter()
        .find(|p| p.account_id == HOUSE_PROVIDER)
        .map_or(1, |p| {
            (p.profile.decode_tokens_per_hour / 3600).max(1) as u64
        });
    for m in models.list() {
        let ModelKind::Text(engine) = &m.kind else {
            continue;
        };
        let q = b.quote(&m.name, b.load_of(engine))?;
        b.market.record_prices(&m.name, q.prices).await?;
        b.market.cancel_all(&m.name, HOUSE_PROVIDER).await?;
        b.market
            .submit(NewOrder {
                key_id: None,
                side: Side::Ask,
                instrument: m.name.clone(),
                account_id: HOUSE_PROVIDER.to_string(),
                price: q.prices.output,
                quantity: capacity,
                priority: 0,
                interruptible: false,
                expires_at: money::store::now() + ASK_TTL_S,
            })
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn prices() -> money::ledger::Prices {
        money::ledger::Prices {
            input: 100,
            cached_input: 10,
            output: 400,
        }
    }

    #[test]
    fn each_stage_is_paid_its_share_of_the_counted_tokens_and_never_more() {
        let mut stages = BTreeMap::new();
        for (w, n) in [("a", 300u64), ("b", 300), ("c", 600)] {
            stages.insert((w.to_string(), format!("provider:{w}"), 10_000), n);
        }
        let t = Tokens {
            prompt: 40,
            cached: 8,
            completion: 20,
        };
        let work = stage_work(&stages, t, prices());
        let got: Vec<(&str, u64, u64, u64)> = work
            .iter()
            .map(|(e, w)| {
                (
                    e.as_str(),
                    w.tokens.prompt,
                    w.tokens.cached,
                    w.tokens.completion,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("a", 10, 2, 5), ("b", 10, 2, 5), ("c", 20, 4, 10)]
        );
        assert!(stage_work(&BTreeMap::new(), t, prices()).is_empty());
        let mut rng = StdRng::seed_from_u64(46);
        for _ in 0..1000 {
            let mut stages = BTreeMap::new();
            for i in 0..rng.random_range(1..6) {
                let n = rng.random_range(0..10_000u64);
                stages.insert((format!("w{i}"), format!("p{i}"), 10_000), n);
            }
            let t = Tokens {
                prompt: rng.random_range(0..5000),
                cached: 0,
                completion: rng.random_range(0..5000),
            };
            let w = stage_work(&stages, t, prices());
            assert!(w.iter().map(|w| w.1.tokens.prompt).sum::<u64>() <= t.prompt);
            assert!(w.iter().map(|w| w.1.tokens.completion).sum::<u64>() <= t.completion);
        }
    }
}
