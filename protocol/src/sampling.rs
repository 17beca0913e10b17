//! The sampling a worker runs, both ways in one place: the server's
//! resolved choice as the wire's `JobParams` (`JobParams::of`), and the
//! engine parameters a worker runs from them (`JobParams::sampling`).
//! What does not cross the wire, on purpose: stop strings (the server
//! matches them on the text it detokenizes), `n` (each choice is its own
//! job), the priority (a worker's queue is its own), and structured
//! output (its matcher cannot resume elsewhere: it stays on the house
//! engine). Every job asks for the sampled tokens' log-probabilities,
//! whether or not the client did, so a worker cannot tell a spot-checked
//! attempt from another. A round-trip property pins all of it below.

use engine::SamplingParams;

use crate::JobParams;

impl JobParams {
    /// The wire form of one resolved choice of `p` (its seed set; none is
    /// 0), for a worker that knows the request's tenant as `tenant`.
    pub fn of(p: &SamplingParams, tenant: u64) -> Self {
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        Self {
            tenant,
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: n(p.top_k),
            min_p: p.min_p,
            seed: p.seed.unwrap_or_default(),
            max_tokens: n(p.max_tokens),
            stop_token_ids: p.stop_token_ids.clone(),
            ignore_eos: p.ignore_eos,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
            logit_bias: p.logit_bias.clone(),
            logprobs: Some(p.logprobs.map_or(0, n)),
        }
    }

    /// The engine parameters a worker runs the job with.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k as usize,
            seed: Some(self.seed),
            max_tokens: self.max_tokens as usize,
            stop: Vec::new(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.clone(),
            logprobs: self.logprobs.map(|n| n as usize),
            n: 1,
            priority: 0,
            tenant: self.tenant,
            grammar: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A resolved choice as the server's relay holds it: one choice, its
    /// seed drawn, its stop strings kept back, any of the rest.
    fn choice() -> impl Strategy<Value = SamplingParams> {
        let draw = (
            (0.0f32..2.0, 0.01f32..=1.0, 0usize..100_000, 0.0f32..1.0),
            (any::<u64>(), 1usize..=u32::MAX as usize, any::<bool>()),
            (0.5f32..2.0, -2.0f32..2.0, -2.0f32..2.0),
            prop::collection::vec(any::<u32>(), 0..4),
            prop::collection::vec((any::<u32>(), -100.0f32..100.0), 0..4),
            prop::option::of(0usize..=20),
            (any::<i32>(), any::<u64>()),
        );
        draw.prop_map(
            |(
                (temperature, top_p, top_k, min_p),
                (seed, max_tokens, ignore_eos),
                (repetition_penalty, frequency_penalty, presence_penalty),
                stop_token_ids,
                logit_bias,
                logprobs,
                (priority, tenant),
            )| SamplingParams {
                temperature,
                top_p,
                top_k,
                seed: Some(seed),
                max_tokens,
                stop_token_ids,
                ignore_eos,
                min_p,
                repetition_penalty,
                frequency_penalty,
                presence_penalty,
                logit_bias,
                logprobs,
                priority,
                tenant,
                ..SamplingParams::default()
            },
        )
    }

    proptest! {
        #[test]
        fn a_choice_crosses_the_wire_as_the_worker_runs_it(p in choice(), tenant in any::<u64>()) {
            let wire = JobParams::of(&p, tenant);
            // Through its JSON, as a worker decodes it.
            let text = serde_json::to_string(&wire).expect("encode");
            let read: JobParams = serde_json::from_str(&text).expect("decode");
            prop_assert_eq!(&read, &wire);
            let ran = read.sampling();
            // Everything but what stays with the server: the worker's own
            // tenant number, no priority, and log-probabilities always asked.
            let want = SamplingParams {
                tenant,
                priority: 0,
                logprobs: Some(p.logprobs.unwrap_or(0)),
                ..p.clone()
            };
            prop_assert_eq!(&ran, &want);
            // And back: the worker's parameters are the same job.
            prop_assert_eq!(JobParams::of(&ran, tenant), wire);
        }
    }

    #[test]
    fn what_stays_with_the_server_does_not_cross() {
        let p = SamplingParams {
            stop: vec!["END".into()],
            n: 3,
            priority: -5,
            ..SamplingParams::default()
        };
        let ran = JobParams::of(&p, 7).sampling();
        assert!(ran.stop.is_empty() && ran.grammar.is_none());
        assert_eq!((ran.n, ran.priority, ran.tenant), (1, 0, 7));
        assert_eq!(ran.logprobs, Some(0), "asked of every job");
        assert_eq!(ran.seed, Some(0), "an unseeded choice runs with seed 0");
    }
}
