//! Workers' asks in the order book: every round, each active worker's ask
//! for each model it serves is (re)posted on that model's book under its
//! provider's account, at its output price with the protocol fee added,
//! for its capacity (what it offered, or what calibration measured), until
//! its end (or a short TTL, renewed while it stays connected). A worker
//! that left has its asks cancelled. An ask the market refuses (outside
//! the price band of the model's posted price) is dropped from the worker,
//! which is told why and then takes the house's price: placement never
//! prices a worker at a price the market would not list.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::fleet::registry::{Registry, WorkerInfo};
use crate::services::placement::gross;
use money::ledger::amount::show_units;
use money::market::book::Side;
use money::market::{Market, MarketError, NewOrder};
use money::store::now;
use protocol::{ToWorker, VERSION};

/// How long a posted ask stands without being renewed.
const TTL_S: i64 = 30;
/// How often asks are renewed.
pub const EVERY: Duration = Duration::from_secs(10);

/// The book's order id of each (worker, model) ask.
#[derive(Debug, Default)]
pub struct Posted(HashMap<(String, String), String>);

/// Generated tokens a second a worker offers for its ask: what it said,
/// or four sequences at its calibrated four-sequence step.
fn capacity(w: &WorkerInfo, offered: u64) -> u64 {
    if offered > 0 {
        return offered;
    }
    w.profile
        .map_or(1, |p| (4_000.0 / p.decode_step_ms_4.max(0.01)) as u64)
        .clamp(1, 1_000_000_000)
}

/// One round: renew the asks of active workers, cancel those of workers
/// gone.
pub async fn round(fleet: &Registry, market: &Market, posted: &mut Posted) {
    let workers = fleet.local();
    let t = now();
    let mut live = HashMap::new();
    for w in workers.iter().filter(|w| w.state == "active") {
        for a in w.asks.iter().filter(|a| a.until == 0 || a.until > t) {
            let key = (w.id.clone(), a.model.clone());
            if let Some(old) = posted.0.remove(&key) {
                let _ = market.cancel(&old, Some(&w.provider_id)).await;
            }
            let order_price = gross(a.output, market.fee_bps);
            let order = NewOrder {
                side: Side::Ask,
                instrument: a.model.clone(),
                account_id: w.provider_id.clone(),
                key_id: None,
                price: order_price,
                quantity: capacity(w, a.capacity),
                priority: 0,
                interruptible: a.preemptible,
                expires_at: if a.until == 0 {
                    t + TTL_S
                } else {
                    a.until.min(t + TTL_S)
                },
            };
            match market.submit(order).await {
                Ok((o, _)) => {
                    live.insert(key, o.id);
                }
                Err(MarketError::Invalid(_, why)) => {
                    let why = format!(
                        "your output price {} per million tokens is {} with the protocol fee; {why}",
                        show_units(a.output),
                        show_units(order_price)
                    );
                    refuse(fleet, w, &a.model, &why).await
                }
                Err(e) => tracing::warn!(worker = %w.id, error = %e, "worker ask not posted"),
            }
        }
    }
    for ((worker, _), id) in posted.0.drain() {
        let provider = workers
            .iter()
            .find(|w| w.id == worker)
            .map(|w| w.provider_id.as_str());
        let _ = market.cancel(&id, provider).await;
    }
    posted.0 = live;
}

/// Drops a worker's ask the market refused and tells the worker why.
async fn refuse(fleet: &Registry, w: &WorkerInfo, model: &str, why: &str) {
    tracing::warn!(worker = %w.id, model, reason = why, "worker ask refused; it takes the house price");
    fleet.drop_ask(&w.id, model);
    let msg = ToWorker::Error {
        v: VERSION,
        code: "ask_refused".into(),
        message: format!("your ask for `{model}` was refused: {why}; you are paid the house price"),
    };
    let _ = fleet.send(&w.id, msg).await;
}

/// Renews asks every `EVERY` for good.
pub async fn run(fleet: Arc<Registry>, market: Arc<Market>) {
    let mut posted = Posted::default();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        round(&fleet, &market, &mut posted).await;
    }
}
