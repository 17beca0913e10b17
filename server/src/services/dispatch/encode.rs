//! Embeddings on workers: an embedding request (or the semantic cache's
//! query embedding) runs on the house encoder or on a worker of this
//! replica that serves the same encoder, whichever is expected to finish
//! first: each executor's milliseconds per input as this server measured
//! them (a worker not measured yet is taken to be as fast as the house),
//! times the jobs it runs plus this one, plus the link's round trip. The
//! house's expectation is weighed by `--placement-house-factor`, as for
//! generations. A worker's answer is checked (one finite vector of the
//! model's width per input) and billed by this server's own token count;
//! a worker that fails, answers wrongly or times out loses the job, which
//! then runs on the house.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use engine::{EmbedInput, EmbeddingHandle, Embeddings, EngineError};
use tokio::sync::mpsc;

use super::decide::worker_target;
use super::{Dispatch, HOUSE, Target, lock};
use crate::fleet::assignments::JobEvent;
use protocol::{MAX_CONTROL, ToWorker, VERSION};

/// How long a worker has to answer an embedding job.
const EMBED_TIMEOUT: Duration = Duration::from_secs(30);

/// One executor's embedding measures.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodeMeasure {
    /// Jobs it runs for this server now.
    pub outstanding: u32,
    /// Moving average of milliseconds per input (0: not measured).
    pub ms_per_input: f64,
}

/// Every executor's embedding measures.
#[derive(Debug, Default)]
pub struct Encoders(std::sync::Mutex<HashMap<String, EncodeMeasure>>);

impl Encoders {
    fn with<T>(&self, key: &str, f: impl FnOnce(&mut EncodeMeasure) -> T) -> T {
        f(lock(&self.0).entry(key.to_string()).or_default())
    }

    fn get(&self, key: &str) -> EncodeMeasure {
        lock(&self.0).get(key).copied().unwrap_or_default()
    }
}

/// The inputs of one request.
fn count(input: &EmbedInput) -> usize {
    match input {
        EmbedInput::Texts(t) => t.len(),
        EmbedInput::Tokens(t) => t.len(),
    }
}

impl Dispatch {
    /// Embeds `input` with `model` on the executor expected to finish
    /// first (`query`: one text for the semantic cache, by the query
    /// encoder); answers the vectors and where they were computed.
    pub async fn embed(
        &self,
        model: &str,
        house: &EmbeddingHandle,
        input: EmbedInput,
        query: bool,
    ) -> Result<(Embeddings, Target), EngineError> {
        let n = count(&input).max(1);
        // A worker's answer must fit one control message.
        let fits = n * house.dimensions * 16 + 1024 <= MAX_CONTROL;
        let target = if fits {
            self.pick_encoder(model, n)
        } else {
            Target::House
        };
        if let Target::Worker {
            worker: id,
            provider,
            ..
        } = &target
        {
            match self.embed_on(id, model, house, &input, query).await {
                Ok(out) => return self.checked(out, &target, house, input, query).await,
                Err(why) => {
                    tracing::warn!(worker = %id, reason = %why, "an embedding job was lost; running it here");
                    self.fleet.record(id, provider, 0, true);
                    self.encoders
                        .with(id, |m| m.ms_per_input = m.ms_per_input.max(1.0) * 2.0);
                }
            }
        }
        Ok((self.embed_here(house, input, query).await?, Target::House))
    }

    /// A worker's vectors, spot-checked as often as its generations
    /// (against the house encoder, on the same inputs): passed, they are
    /// the answer; failed, the house's are (the worker is not paid) and
    /// its token is quarantined.
    async fn checked(
        &self,
        out: Embeddings,
        target: &Target,
        house: &EmbeddingHandle,
        input: EmbedInput,
        query: bool,
    ) -> Result<(Embeddings, Target), EngineError> {
        let Target::Worker {
            worker: id,
            provider,
            ..
        } = target
        else {
            return Ok((out, target.clone()));
        };
        let jobs = self.fleet.standing.get(provider).jobs_ok;
        if self.spot.checker().pick(jobs) {
            let reference = self.embed_here(house, input, query).await?;
            let who = crate::services::spotcheck::Who {
                worker: id,
                provider,
            };
            let verdict = self
                .spot
                .checker()
                .check_vectors(&out.vectors, &reference.vectors, who);
            if let crate::services::spotcheck::Verdict::Fail(why) = verdict {
                self.spot.quarantine(id, provider, &why).await;
                let prompt_tokens = out.prompt_tokens;
                return Ok((
                    Embeddings {
                        prompt_tokens,
                        ..reference
                    },
                    Target::House,
                ));
            }
        }
        self.fleet.record(id, provider, 0, false);
        Ok((out, target.clone()))
    }

    /// Embeds `input` on the house encoder (`query`: one text, by the
    /// query encoder), measured.
    async fn embed_here(
        &self,
        house: &EmbeddingHandle,
        input: EmbedInput,
        query: bool,
    ) -> Result<Embeddings, EngineError> {
        let n = count(&input).max(1);
        let started = Instant::now();
        self.encoders.with(HOUSE, |m| m.outstanding += 1);
        let out = match (query, input) {
            (true, EmbedInput::Texts(t)) if t.len() == 1 => {
                house.embed_query(&t[0]).await.map(|v| Embeddings {
                    vectors: vec![v],
                    prompt_tokens: 0,
                })
            }
            (_, input) => house.embed_input(input).await,
        };
        self.encoders.with(HOUSE, |m| {
            m.outstanding = m.outstanding.saturating_sub(1);
            observe(m, started.elapsed(), n);
        });
        out
    }

    /// What `provider`'s worker earns for embedding `tokens` tokens at
    /// `prices` (the request's), net of the fee, times its reputation share.
    pub fn encoder_work(
        &self,
        provider: &str,
        prices: money::ledger::Prices,
        tokens: usize,
    ) -> money::ledger::settle::Work {
        let r = self.fleet.standing.get(provider);
        money::ledger::settle::Work {
            provider: provider.to_string(),
            prices,
            payout_bps: money::market::pricing::payout_bps(r.reputation_bps()),
            tokens: money::ledger::amount::Tokens {
                prompt: tokens as u64,
                cached: 0,
                completion: 0,
            },
        }
    }

    /// The executor expected to embed `n` inputs soonest.
    fn pick_encoder(&self, model: &str, n: usize) -> Target {
        let workers = self.fleet.encoding(model);
        if workers.is_empty() {
            return Target::House;
        }
        let house = self.encoders.get(HOUSE);
        let per = |m: &EncodeMeasure| {
            if m.ms_per_input > 0.0 {
                m.ms_per_input
            } else {
                house.ms_per_input.max(0.1)
            }
        };
        let expect = |m: &EncodeMeasure| f64::from(m.outstanding + 1) * per(m) * n as f64;
        let mut best = (expect(&house) * self.config.house_factor, Target::House);
        for w in &workers {
            let e = expect(&self.encoders.get(&w.id)) + w.rtt_ms;
            if e < best.0 {
                best = (e, worker_target(w));
            }
        }
        best.1
    }

    /// Runs one embedding job on worker `id`; why not, when it failed.
    async fn embed_on(
        &self,
        id: &str,
        model: &str,
        house: &EmbeddingHandle,
        input: &EmbedInput,
        query: bool,
    ) -> Result<Embeddings, String> {
        let n = count(input);
        // What the user pays for and the worker is paid for: the tokens
        // this server counts, never the worker's own count.
        let counted = house.count_tokens(input).map_err(|e| e.to_string())?;
        let job = self.fleet.jobs.next_id();
        let (tx, mut rx) = mpsc::unbounded_channel();
        self.fleet.jobs.place(job, id, 1, tx);
        let (texts, tokens) = match input {
            EmbedInput::Texts(t) => (t.clone(), Vec::new()),
            EmbedInput::Tokens(t) => (Vec::new(), t.clone()),
        };
        let msg = ToWorker::Embed {
            v: VERSION,
            job,
            model: model.to_string(),
            texts,
            tokens,
            query,
        };
        let started = Instant::now();
        self.encoders.with(id, |m| m.outstanding += 1);
        let result = async {
            if !self.fleet.send(id, msg).await {
                return Err("the worker is gone".to_string());
            }
            match tokio::time::timeout(EMBED_TIMEOUT, rx.recv()).await {
                Ok(Some(JobEvent::Embedded(out))) => {
                    check(out, n, house.dimensions).map(|out| Embeddings {
                        prompt_tokens: counted,
                        ..out
                    })
                }
                Ok(Some(JobEvent::Lost(why))) => Err(why),
                Ok(Some(JobEvent::Core(_))) => Err("tokens for an embedding job".into()),
                Ok(None) => Err("the worker is gone".into()),
                Err(_) => Err(format!("no answer in {} s", EMBED_TIMEOUT.as_secs())),
            }
        }
        .await;
        self.fleet.jobs.end(job);
        self.encoders.with(id, |m| {
            m.outstanding = m.outstanding.saturating_sub(1);
            if result.is_ok() {
                observe(m, started.elapsed(), n);
            }
        });
        self.stats
            .embedded_on_workers
            .inc_by(u64::from(result.is_ok()));
        result
    }
}

/// A worker's vectors, if they are what was asked: `n` of them, each
/// `dims` finite values.
fn check(out: Embeddings, n: usize, dims: usize) -> Result<Embeddings, String> {
    if out.vectors.len() != n {
        return Err(format!("{} vectors for {n} inputs", out.vectors.len()));
    }
    if let Some(v) = out
        .vectors
        .iter()
        .find(|v| v.len() != dims || v.iter().any(|x| !x.is_finite()))
    {
        return Err(format!(
            "a vector of {} values, want {dims} finite",
            v.len()
        ));
    }
    Ok(out)
}

/// Takes one job's time into the executor's milliseconds per input.
fn observe(m: &mut EncodeMeasure, took: Duration, n: usize) {
    let ms = took.as_secs_f64() * 1e3 / n.max(1) as f64;
    m.ms_per_input = if m.ms_per_input == 0.0 {
        ms
    } else {
        0.8 * m.ms_per_input + 0.2 * ms
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_vectors_are_checked_before_use() {
        let ok = |vectors: Vec<Vec<f32>>| Embeddings {
            vectors,
            prompt_tokens: 3,
        };
        assert!(check(ok(vec![vec![0.1; 4]; 2]), 2, 4).is_ok());
        assert!(check(ok(vec![vec![0.1; 4]]), 2, 4).is_err(), "one short");
        assert!(check(ok(vec![vec![0.1; 3]; 2]), 2, 4).is_err(), "narrow");
        assert!(check(ok(vec![vec![f32::NAN; 4]; 2]), 2, 4).is_err(), "NaN");
    }

    #[test]
    fn the_measure_follows_the_observed_times() {
        let mut m = EncodeMeasure::default();
        observe(&mut m, Duration::from_millis(40), 4);
        assert!((m.ms_per_input - 10.0).abs() < 1e-9);
        observe(&mut m, Duration::from_millis(20), 1);
        assert!((m.ms_per_input - 12.0).abs() < 1e-9);
    }
}
