//! The settlement writer: one task per instance takes queued settlements
//! and releases and commits them in batches (one transaction per batch, a
//! handful of statements whatever its size). Exactly-once comes from the
//! first statement: only holds still `open` are closed, and only the rows
//! it returns are billed, so a second settlement of a request (in the same
//! batch, a later one, or on another replica) does nothing.

use std::collections::{HashMap, HashSet};

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::{mpsc, oneshot, watch};

use super::amount::{Prices, Quote, Stages, Tokens};
use super::holds;
use super::{Amount, Closed, LedgerError, Outcome, TREASURY};
use crate::store::{Backend, Db, now};

/// Most closings per transaction.
const MAX_BATCH: usize = 256;
/// Attempts of a whole batch before closing its items one by one.
const ATTEMPTS: usize = 3;

type Reply = oneshot::Sender<Result<Closed, LedgerError>>;

/// Work for the writer.
#[derive(Debug)]
pub enum Job {
    Close(Box<Item>, Option<Reply>),
    /// What a running request has used so far (kept on its open hold, so
    /// recovery can bill it if this instance dies).
    Checkpoint(String, Tokens),
    /// Answered once everything queued before it is committed.
    Flush(oneshot::Sender<()>),
}

/// One hold to close: settled from `usage`, or released when `None`.
/// With `charge`, the hold is first placed in the same transaction (a
/// request whose cost is known up front, such as a cache hit): if the
/// funds no longer cover it, nothing is billed.
#[derive(Debug, Clone)]
pub struct Item {
    pub request_id: String,
    pub usage: Option<(Tokens, Outcome)>,
    pub charge: Option<Charge>,
    /// Who did the work: the providers sharing its pay, the executors.
    pub who: Attribution,
}

/// Who did a request's work, when it is not only the hold's provider on
/// the executors the hold names (the fleet's relays know).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The accepted work of each attempt (none: the hold's provider did
    /// it all, at the hold's prices).
    pub work: Vec<Work>,
    /// The executors that ran its prefill and decode, for its usage
    /// record (`None`: those named on the hold).
    pub stages: Option<super::amount::Stages>,
}

/// One attempt's accepted work: its provider's claim is `tokens` at
/// `prices` (what a user pays on its executor, fee included), less the
/// protocol fee, times its `payout_bps` (at most 1x). The user pays the
/// hold's quote for what was delivered; the providers share at most that
/// less the fee (claims past it are scaled down: a replay's second prompt
/// is the platform's cost, never the user's or the treasury's), and the
/// treasury keeps the rest. Work of an id that is no provider account
/// pays no one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub provider: String,
    pub prices: Prices,
    pub payout_bps: i64,
    pub tokens: Tokens,
}

/// The highest payout share: 1x, so no one is paid more than its work's
/// price net of the fee.
const MAX_PAYOUT_BPS: i64 = super::amount::BPS;

/// A hold to place and settle at once.
#[derive(Debug, Clone)]
pub struct Charge {
    pub account_id: String,
    pub key_id: Option<String>,
    pub quote: Quote,
    pub amount: Amount,
    pub instance: String,
}

impl Job {
    pub fn close(
        request_id: &str,
        usage: Option<(Tokens, Outcome)>,
        who: Attribution,
        reply: Option<Reply>,
    ) -> Self {
        let item = Item {
            request_id: request_id.to_string(),
            usage,
            charge: None,
            who,
        };
        Self::Close(Box::new(item), reply)
    }
}

/// Runs until every sender is gone; bumps `settled` after each batch it
/// committed (what a clawback waiting for its request's settlement awaits).
pub async fn writer(
    db: Db,
    mut rx: mpsc::UnboundedReceiver<Job>,
    settled: std::sync::Arc<watch::Sender<u64>>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut checkpoints = HashMap::new();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Close(item, reply) => batch.push((*item, reply)),
                Job::Checkpoint(id, t) => {
                    checkpoints.insert(id, t);
                }
                Job::Flush(done) => {
                    flushes.push(done);
                    break;
                }
            }
            if batch.len() + checkpoints.len() < MAX_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            run(&db, batch).await;
            settled.send_modify(|n| *n = n.wrapping_add(1));
        }
        if let Err(e) = checkpoint(&db, &checkpoints).await {
            tracing::warn!(error = %e, n = checkpoints.len(), "usage checkpoint failed");
        }
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// Commits a batch (retrying a failed transaction), falling back to one
/// transaction per item so one bad item cannot block the others.
async fn run(db: &Db, batch: Vec<(Item, Option<Reply>)>) {
    let items: Vec<Item> = batch.iter().map(|(i, _)| i.clone()).collect();
    let mut last = None;
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            super::backoff(attempt as u32).await;
        }
        match close_batch(db, &items).await {
            Ok(results) => {
                for ((_, reply), r) in batch.into_iter().zip(results) {
                    answer(reply, Ok(r));
                }
                return;
            }
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        tracing::warn!(error = %e, n = items.len(), "settlement batch failed; closing one by one");
    }
    for (item, reply) in batch {
        let r = close_batch(db, std::slice::from_ref(&item)).await;
        if let Err(e) = &r {
            tracing::error!(request_id = %item.request_id, error = %e, "settlement failed; hold left open");
        }
        answer(reply, r.map(|mut v| v.remove(0)).map_err(Into::into));
    }
}

/// Records the latest usage of running requests on their open holds.
async fn checkpoint(db: &Db, points: &HashMap<String, Tokens>) -> Result<(), sqlx::Error> {
    if points.is_empty() {
        return Ok(());
    }
    let rows: Vec<_> = points.iter().collect();
    let case = |k: usize| -> String {
        let arms: Vec<String> = (0..rows.len())
            .map(|i| {
                format!(
                    "WHEN ${} THEN CAST(${} AS BIGINT)",
                    4 * i + 1,
                    4 * i + 1 + k
                )
            })
            .collect();
        format!("CASE request_id {} ELSE 0 END", arms.join(" "))
    };
    let ids: Vec<String> = (0..rows.len()).map(|i| format!("${}", 4 * i + 1)).collect();
    let sql = format!(
        "UPDATE holds SET used_prompt = {}, used_cached = {}, used_completion = {} \
         WHERE state = 'open' AND request_id IN ({})",
        case(1),
        case(2),
        case(3),
        ids.join(", ")
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (id, t) in rows {
        q = q
            .bind(id.as_str())
            .bind(t.prompt as i64)
            .bind(t.cached as i64)
            .bind(t.completion as i64);
    }
    q.execute(&db.pool).await?;
    Ok(())
}

fn answer(reply: Option<Reply>, r: Result<Closed, LedgerError>) {
    if let Some(reply) = reply {
        let _ = reply.send(r);
    }
}

/// A hold as stored.
struct HoldRow {
    request_id: String,
    account_id: String,
    key_id: Option<String>,
    amount: Amount,
    quote: Quote,
}

fn hold_row(r: &AnyRow) -> Result<HoldRow, sqlx::Error> {
    Ok(HoldRow {
        request_id: r.try_get("request_id")?,
        account_id: r.try_get("account_id")?,
        key_id: r.try_get("key_id")?,
        amount: r.try_get("amount")?,
        quote: Quote {
            provider_id: r.try_get("provider_id")?,
            model: r.try_get("model")?,
            prices: Prices {
                input: r.try_get("price_input")?,
                cached_input: r.try_get("price_cached")?,
                output: r.try_get("price_output")?,
            },
            fee_bps: r.try_get("fee_bps")?,
            payout_bps: r.try_get("payout_bps")?,
            stages: Stages {
                prefill: r.try_get("prefill_by")?,
                decode: r.try_get("decode_by")?,
            },
        },
    })
}

/// `($a, $b, ...), (...)`: `rows` tuples of `cols` placeholders from `$start`.
fn tuples(rows: usize, cols: usize, start: usize) -> String {
    (0..rows)
        .map(|r| {
            let cells: Vec<String> = (0..cols)
                .map(|c| format!("${}", start + r * cols + c))
                .collect();
            format!("({})", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Closes the open holds among `ids` as `state`, returning those it closed.
async fn close_holds(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    ids: &[&str],
    state: &'static str,
) -> Result<Vec<HoldRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = (0..ids.len()).map(|i| format!("${}", i + 3)).collect();
    let sql = format!(
        "UPDATE holds SET state = $1, closed_at = $2 WHERE state = 'open' AND request_id IN ({}) \
         RETURNING request_id, account_id, key_id, model, provider_id, amount, price_input, \
         price_cached, price_output, fee_bps, payout_bps, prefill_by, decode_by",
        list.join(", ")
    );
    let mut q = sqlx::query(AssertSqlSafe(sql)).bind(state).bind(now());
    for id in ids {
        q = q.bind(*id);
    }
    q.fetch_all(&mut **tx).await?.iter().map(hold_row).collect()
}

/// The money movements of one batch.
#[derive(Default)]
struct Moves {
    /// Per account: (balance change, held change).
    accounts: HashMap<String, (Amount, Amount)>,
    /// Per key: (spent change, held change).
    keys: HashMap<String, (Amount, Amount)>,
    /// (request id, account, amount) entries of each usage transaction.
    entries: Vec<(String, String, Amount)>,
    /// Usage records: hold, tokens, outcome, cost, provider share, fee.
    usage: Vec<(HoldRow, Tokens, Outcome, Amount, Amount, Amount)>,
}

impl Moves {
    fn account(&mut self, id: &str, balance: Amount, held: Amount) {
        let e = self.accounts.entry(id.to_string()).or_default();
        e.0 += balance;
        e.1 += held;
    }

    fn key(&mut self, id: &Option<String>, spent: Amount, held: Amount) {
        if let Some(id) = id {
            let e = self.keys.entry(id.clone()).or_default();
            e.0 += spent;
            e.1 += held;
        }
    }

    fn release(&mut self, h: &HoldRow) {
        self.account(&h.account_id, 0, -h.amount);
        self.key(&h.key_id, 0, -h.amount);
    }

    /// Bills `h` for `t`: the user pays at most the hold; the providers
    /// (the hold's, or each attempt's at its own prices) and the treasury
    /// share the cost.
    fn settle(&mut self, h: HoldRow, t: Tokens, outcome: Outcome, work: Option<&[Work]>) -> Amount {
        let cost = match outcome {
            Outcome::Failed => 0,
            Outcome::Finished | Outcome::Cut => h.quote.cost(t).min(h.amount),
        };
        self.account(&h.account_id, -cost, -h.amount);
        self.key(&h.key_id, cost, -h.amount);
        let payees = match (cost > 0, work) {
            (false, _) => Vec::new(),
            (true, None) => vec![(h.quote.provider_id.clone(), h.quote.split(cost).provider)],
            (true, Some(work)) => payees(h.quote.fee_bps, cost, work),
        };
        let payees: Vec<_> = payees.into_iter().filter(|(_, a)| *a > 0).collect();
        let paid: Amount = payees.iter().map(|(_, a)| a).sum();
        let treasury = cost - paid;
        if cost > 0 {
            self.account(TREASURY, treasury, 0);
            let rid = &h.request_id;
            let mut parts = vec![
                (h.account_id.clone(), -cost),
                (TREASURY.to_string(), treasury),
            ];
            for (p, amount) in payees {
                self.account(&p, amount, 0);
                parts.push((p, amount));
            }
            for (acct, amount) in parts {
                if amount != 0 {
                    self.entries.push((rid.clone(), acct, amount));
                }
            }
        }
        self.usage.push((h, t, outcome, cost, paid, treasury));
        cost
    }
}

/// One transaction: close the open holds among `items`, write usage
/// records and journal entries, move balances. Returns one result per item.
pub(super) async fn close_batch(db: &Db, items: &[Item]) -> Result<Vec<Closed>, sqlx::Error> {
    let mut seen = HashSet::new();
    let first: Vec<bool> = items.iter().map(|i| seen.insert(&i.request_id)).collect();
    let pick = |settle: bool| -> Vec<&str> {
        items
            .iter()
            .zip(&first)
            .filter(|(i, f)| **f && i.usage.is_some() == settle)
            .map(|(i, _)| i.request_id.as_str())
            .collect()
    };
    let mut tx = db.pool.begin().await?;
    for (item, _) in items.iter().zip(&first).filter(|(_, f)| **f) {
        if let Some(c) = &item.charge {
            place(&mut tx, &item.request_id, c).await?;
        }
    }
    let settled = close_holds(&mut tx, &pick(true), "settled").await?;
    let released = close_holds(&mut tx, &pick(false), "released").await?;
    let mut moves = Moves::default();
    let mut results: HashMap<String, Closed> = HashMap::new();
    for h in &released {
        moves.release(h);
        results.insert(h.request_id.clone(), Closed::Released);
    }
    let usage_of: HashMap<&str, (Tokens, Outcome, &Attribution)> = items
        .iter()
        .zip(&first)
        .filter_map(|(i, f)| {
            let (t, o) = i.usage.filter(|_| *f)?;
            Some((i.request_id.as_str(), (t, o, &i.who)))
        })
        .collect();
    let providers = provider_accounts(&mut tx, items).await?;
    for mut h in settled {
        let (t, outcome, who) = usage_of[h.request_id.as_str()];
        if let Some(stages) = &who.stages {
            h.quote.stages = stages.clone();
        }
        // Work naming no provider account pays no one.
        let work: Vec<Work> = who
            .work
            .iter()
            .filter(|w| providers.contains(&w.provider))
            .cloned()
            .collect();
        let rid = h.request_id.clone();
        // A request the fleet's relays ran pays only their accepted work
        // (none accepted: no one); otherwise the hold's provider did it all.
        let relayed = !who.work.is_empty() || who.stages.is_some();
        let work = relayed.then_some(work.as_slice());
        let cost = moves.settle(h, t, outcome, work);
        results.insert(rid, Closed::Billed { cost });
    }
    write_moves(&mut tx, db.backend, &moves).await?;
    tx.commit().await?;
    Ok(items
        .iter()
        .zip(first)
        .map(|(i, f)| match (f, results.get(&i.request_id)) {
            (true, Some(r)) => *r,
            _ => Closed::AlreadyClosed,
        })
        .collect())
}

/// Which of the providers named in `items`' shares are provider accounts.
async fn provider_accounts(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    items: &[Item],
) -> Result<HashSet<String>, sqlx::Error> {
    let mut named: Vec<&str> = items
        .iter()
        .flat_map(|i| i.who.work.iter().map(|w| w.provider.as_str()))
        .filter(|p| !p.is_empty())
        .collect();
    named.sort_unstable();
    named.dedup();
    let mut found = HashSet::new();
    for p in named {
        let kind: Option<String> = sqlx::query_scalar("SELECT kind FROM accounts WHERE id = $1")
            .bind(p)
            .fetch_optional(&mut **tx)
            .await?;
        if kind.as_deref() == Some("provider") {
            found.insert(p.to_string());
        }
    }
    Ok(found)
}

/// What each provider earns for `work` (merged per provider, by id): its
/// tokens at its prices, less the protocol fee (`fee_bps`), times its
/// payout share (clamped to 0-1x), rounded down; scaled down, where the
/// claims add up to more, so that the total never passes what the user
/// paid (`cost`) less the fee inside it.
pub fn payees(fee_bps: i64, cost: Amount, work: &[Work]) -> Vec<(String, Amount)> {
    let mut merged: std::collections::BTreeMap<&str, i128> = std::collections::BTreeMap::new();
    for w in work {
        let q = Quote {
            provider_id: String::new(),
            model: String::new(),
            prices: w.prices,
            fee_bps,
            payout_bps: w.payout_bps.clamp(0, MAX_PAYOUT_BPS),
            stages: Stages::default(),
        };
        let earned = q.split(q.cost(w.tokens).max(0)).provider;
        *merged.entry(w.provider.as_str()).or_default() += i128::from(earned.max(0));
    }
    let total: i128 = merged.values().sum();
    let pool = i128::from(
        super::amount::split_fee(cost.max(0), fee_bps)
            .provider
            .max(0),
    );
    merged
        .into_iter()
        .map(|(p, a)| {
            let a = if total > pool { a * pool / total } else { a };
            (p.to_string(), i64::try_from(a).unwrap_or(0))
        })
        .filter(|(_, a)| *a > 0)
        .collect()
}

/// Places a charge's hold inside the batch's transaction, if the account
/// (and the key's budget) still cover it; otherwise nothing is placed and
/// the item finds no open hold (`AlreadyClosed`: not billed).
async fn place(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    request_id: &str,
    c: &Charge,
) -> Result<(), sqlx::Error> {
    // A savepoint, so a refusal undoes a half-made reservation only.
    let mut sp = sqlx::Acquire::begin(&mut **tx).await?;
    let key = c.key_id.as_deref();
    match holds::reserve(&mut sp, &c.account_id, key, c.amount).await? {
        holds::Reserved::Yes => {}
        holds::Reserved::NoFunds | holds::Reserved::OverBudget => {
            tracing::warn!(request_id, "charge no longer covered: not billed");
            return Ok(()); // dropping `sp` rolls it back
        }
    }
    let h = holds::HoldRequest {
        request_id,
        account_id: &c.account_id,
        key_id: key,
        quote: &c.quote,
        amount: c.amount,
        max_completion: None,
    };
    holds::insert_hold(&mut sp, &h, &c.instance).await?;
    sp.commit().await
}

async fn write_moves(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    m: &Moves,
) -> Result<(), sqlx::Error> {
    update_balances(tx, backend, "accounts", "balance", &m.accounts).await?;
    update_balances(tx, backend, "api_keys", "spent", &m.keys).await?;
    insert_usage(tx, &m.usage).await?;
    insert_journal(tx, &m.entries).await
}

/// `UPDATE <table> SET <first> = <first> + d0, held = held + d1` for every
/// row in `deltas`, in one statement. On Postgres the rows are locked in
/// id order first: one multi-row UPDATE locks rows in the order its scan
/// meets them, which concurrent updates can change (a row's new version
/// lands elsewhere in the heap), so two servers settling batches over the
/// same accounts (a user's, the treasury) could otherwise deadlock.
async fn update_balances(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    table: &str,
    first: &str,
    deltas: &HashMap<String, (Amount, Amount)>,
) -> Result<(), sqlx::Error> {
    if deltas.is_empty() {
        return Ok(());
    }
    let mut rows: Vec<_> = deltas.iter().collect();
    rows.sort_by(|a, b| a.0.cmp(b.0));
    if backend == Backend::Postgres {
        let ids: Vec<String> = (1..=rows.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT id FROM {table} WHERE id IN ({}) ORDER BY id FOR NO KEY UPDATE",
            ids.join(", ")
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (id, _) in &rows {
            q = q.bind(id.as_str());
        }
        q.fetch_all(&mut **tx).await?;
    }
    let case = |offset: usize| -> String {
        let arms: Vec<String> = (0..rows.len())
            .map(|i| {
                format!(
                    "WHEN ${} THEN CAST(${} AS BIGINT)",
                    3 * i + 1,
                    3 * i + 1 + offset
                )
            })
            .collect();
        format!("CASE id {} ELSE 0 END", arms.join(" "))
    };
    let ids: Vec<String> = (0..rows.len()).map(|i| format!("${}", 3 * i + 1)).collect();
    let sql = format!(
        "UPDATE {table} SET {first} = {first} + {}, held = held + {} WHERE id IN ({})",
        case(1),
        case(2),
        ids.join(", ")
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (id, (d0, d1)) in rows {
        q = q.bind(id.as_str()).bind(*d0).bind(*d1);
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

async fn insert_usage(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    usage: &[(HoldRow, Tokens, Outcome, Amount, Amount, Amount)],
) -> Result<(), sqlx::Error> {
    if usage.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO usage_records (request_id, account_id, key_id, model, provider_id, \
         prompt_tokens, cached_tokens, completion_tokens, cost, provider_amount, fee, outcome, \
         created_at, prefill_by, decode_by) VALUES {}",
        tuples(usage.len(), 15, 1)
    );
    let t = now();
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (h, tok, outcome, cost, provider, fee) in usage {
        q = q
            .bind(h.request_id.as_str())
            .bind(h.account_id.as_str())
            .bind(h.key_id.as_deref())
            .bind(h.quote.model.as_str())
            .bind(h.quote.provider_id.as_str())
            .bind(tok.prompt as i64)
            .bind(tok.cached.min(tok.prompt) as i64)
            .bind(tok.completion as i64)
            .bind(*cost)
            .bind(*provider)
            .bind(*fee)
            .bind(outcome.as_str())
            .bind(t)
            .bind(h.quote.stages.prefill.as_str())
            .bind(h.quote.stages.decode.as_str());
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

/// One `usage` journal transaction per billed request (its id derived from
/// the request id, which is also its unique `ref`), with its entries.
async fn insert_journal(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    entries: &[(String, String, Amount)],
) -> Result<(), sqlx::Error> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut refs: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    refs.dedup();
    let sql = format!(
        "INSERT INTO journal (id, kind, ref, created_at) VALUES {}",
        tuples(refs.len(), 4, 1)
    );
    let t = now();
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for r in &refs {
        q = q.bind(format!("usage:{r}")).bind("usage").bind(*r).bind(t);
    }
    q.execute(&mut **tx).await?;
    let sql = format!(
        "INSERT INTO entries (tx_id, account_id, amount) VALUES {}",
        tuples(entries.len(), 3, 1)
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (rid, acct, amount) in entries {
        q = q
            .bind(format!("usage:{rid}"))
            .bind(acct.as_str())
            .bind(*amount);
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_rows_then_columns() {
        assert_eq!(tuples(2, 2, 3), "($3, $4), ($5, $6)");
    }

    fn work(provider: &str, output: i64, completion: u64, payout_bps: i64) -> Work {
        Work {
            provider: provider.into(),
            prices: Prices {
                input: output,
                cached_input: output,
                output,
            },
            payout_bps,
            tokens: Tokens {
                prompt: 0,
                cached: 0,
                completion,
            },
        }
    }

    #[test]
    fn each_provider_earns_its_own_price_less_the_fee_never_more() {
        // 1,050,000 ticks per million tokens with a 5% fee: 1 tick net per
        // token; "b" asks for 2x, and is paid 1x.
        let w = [
            work("a", 1_050_000, 10, 10_000),
            work("b", 2_100_000, 10, 20_000),
            work("a", 1_050_000, 5, 10_000),
        ];
        assert_eq!(
            payees(500, 100, &w),
            vec![("a".into(), 15), ("b".into(), 20)]
        );
        // A poor reputation keeps part of it in the treasury.
        assert_eq!(
            payees(500, 100, &[work("a", 1_050_000, 10, 5_000)]),
            vec![("a".into(), 5)]
        );
        // Past what the user paid less the fee (21 - 1), every payout is
        // scaled down: 15 + 20 claimed, 20 to share.
        let got = payees(500, 21, &w);
        assert_eq!(got, vec![("a".into(), 8), ("b".into(), 11)]);
        // Nothing earned, nothing listed; a hostile multiplier is clamped
        // to 1x.
        assert!(payees(500, 100, &[work("a", 1_050_000, 0, 10_000)]).is_empty());
        let wild = payees(500, i64::MAX / 8, &[work("a", 1_050_000, 10, i64::MAX)]);
        assert_eq!(wild, vec![("a".into(), 10)]);
    }

    #[test]
    fn seeded_random_work_never_pays_more_than_the_user_paid_less_the_fee() {
        let mut rng = 0x2545_f491_u64;
        for _ in 0..10_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let cost = (rng % 1_000_000) as i64;
            let w: Vec<Work> = (0..(rng % 4))
                .map(|i| {
                    work(
                        ["a", "b", ""][(i % 3) as usize],
                        ((rng >> 8) % 10_000_000) as i64,
                        (rng >> 32) % 5_000,
                        ((rng >> 20) % 30_000) as i64,
                    )
                })
                .collect();
            let fee_bps = 500 + ((rng >> 4) % 501) as i64;
            let p = payees(fee_bps, cost, &w);
            let total: i64 = p.iter().map(|(_, a)| a).sum();
            let fee = super::super::amount::split_fee(cost, fee_bps).treasury;
            assert!(p.iter().all(|(_, a)| *a > 0));
            assert!(total <= cost - fee, "{total} for {cost} less {fee}");
        }
    }
}
