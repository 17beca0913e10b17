//! Spot checks of pipeline stages on the real model: an engine runs 1,000
//! honest requests of every sampling kind (greedy, seeded, top-p, top-k,
//! penalties, log-probabilities, prompt-lookup drafts) through three
//! in-process stages while every sequence's traffic at every stage is
//! recorded; each record recomputed in one prefill on a fresh copy of the
//! stage's layers passes. A stage that lies (skips its layers, scales its
//! output, draws another token, reports another log-probability) fails
//! every check of its records, and the honest stages around it pass.

mod common;

use std::ops::Range;
use std::sync::{Arc, Mutex};

use engine::error::Result;
use engine::executor::{Executor, Step};
use engine::kv_cache::{KvDtype, KvLayout};
use engine::loader::load_gguf;
use engine::model::llama::PartInput;
use engine::pipeline::{LocalStage, Stage, StageOutput, even_split, load_part_file, run_chain};
use engine::sampling::Sampled;
use engine::stage_check::{StageRecord, StageVerdict, Tap, Tapped, Tolerance, check};
use engine::{
    EngineBuilder, EngineHandle, GenerateRequest, ModelFacts, RequestId, SamplingParams,
    SchedulerConfig, TemplateChoice,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = 16;
const BLOCKS: usize = 512;
/// Positions a check may recompute.
const CHECK_POSITIONS: usize = 256;

/// An executor over a chain of stages that watches every new sequence at
/// every stage.
struct Watching {
    stages: Vec<Box<dyn Stage>>,
    ranges: Vec<Range<usize>>,
    tap: Arc<Mutex<Tap>>,
    layout: KvLayout,
    hidden: usize,
}

impl Executor for Watching {
    fn name(&self) -> String {
        "watching".into()
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn execute(&mut self, step: &Step<'_>) -> Result<Vec<Vec<Sampled>>> {
        {
            let mut tap = self.tap.lock().expect("tap");
            for c in step.batch.chunks.iter().filter(|c| c.start_pos == 0) {
                if !tap.watching(c.seq) {
                    for (i, r) in self.ranges.iter().enumerate() {
                        assert!(tap.watch(c.seq, i, r.clone(), self.hidden));
                    }
                }
            }
        }
        run_chain(&mut self.stages, step)
    }

    fn release(&mut self, seq: RequestId) {
        self.tap.lock().expect("tap").finish(seq);
    }
}

/// How a lying stage lies.
#[derive(Debug, Clone, Copy)]
enum Lie {
    /// Passes its input on without running its layers.
    Skip,
    /// Scales its output by this much.
    Scale(f32),
    /// Draws the next token id instead of its own.
    OtherToken,
    /// Reports a log-probability 1 nat off.
    OtherLogprob,
}

struct Liar {
    inner: LocalStage,
    lie: Lie,
}

impl Stage for Liar {
    fn name(&self) -> String {
        "liar".into()
    }

    fn layers(&self) -> Range<usize> {
        self.inner.layers()
    }

    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    fn run(&mut self, step: &Step<'_>, input: PartInput<'_>) -> Result<StageOutput> {
        if let (Lie::Skip, PartInput::Hidden(h)) = (self.lie, input) {
            return Ok(StageOutput::Hidden(h.to_vec()));
        }
        Ok(match (self.inner.run(step, input)?, self.lie) {
            (StageOutput::Hidden(mut h), Lie::Scale(f)) => {
                h.iter_mut().for_each(|v| *v *= f);
                StageOutput::Hidden(h)
            }
            (StageOutput::Sampled(mut s), Lie::OtherToken) => {
                for (t, _) in s.iter_mut().flatten() {
                    *t = (*t + 1) % 1000;
                }
                StageOutput::Sampled(s)
            }
            (StageOutput::Sampled(mut s), Lie::OtherLogprob) => {
                for lp in s.iter_mut().flatten().filter_map(|t| t.1.as_mut()) {
                    lp.logprob -= 1.0;
                }
                StageOutput::Sampled(s)
            }
            (out, _) => out,
        })
    }

    fn release(&mut self, _seq: RequestId) {}
}

fn model() -> std::path::PathBuf {
    common::model_path(common::SMOLLM2)
}

fn stage(layers: Range<usize>, blocks: usize) -> LocalStage {
    LocalStage::new(
        load_part_file(&model(), layers).expect("part"),
        BLOCK,
        blocks,
        KvDtype::F16,
    )
    .expect("stage")
}

/// An engine over three stages of the default model (`liar` lies at
/// stage `.0`), with its tap and the stages' layers.
fn engine(
    liar: Option<(usize, Lie)>,
    drafts: usize,
) -> (EngineHandle, Arc<Mutex<Tap>>, Vec<Range<usize>>) {
    let loaded = load_gguf(&model(), &TemplateChoice::Auto).expect("load");
    let mc = &loaded.model.config;
    let ranges = even_split(mc.n_layer, 3);
    let tap = Arc::new(Mutex::new(Tap::new(CHECK_POSITIONS, 100_000)));
    let stages = ranges
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let honest = stage(r.clone(), BLOCKS);
            let inner: Box<dyn Stage> = match liar {
                Some((at, lie)) if at == i => Box::new(Liar { inner: honest, lie }),
                _ => Box::new(honest),
            };
            Box::new(Tapped {
                inner,
                index: i,
                tap: tap.clone(),
            }) as Box<dyn Stage>
        })
        .collect();
    let executor = Watching {
        stages,
        ranges: ranges.clone(),
        tap: tap.clone(),
        layout: KvLayout {
            dtype: KvDtype::F16,
            ..mc.kv_layout(BLOCK, BLOCKS)
        },
        hidden: mc.hidden,
    };
    let facts = ModelFacts {
        architecture: mc.architecture.clone(),
        context_length: mc.context_length,
        vocab_size: mc.vocab_size,
        generation: Default::default(),
    };
    let handle = EngineBuilder::new(loaded.tokenizer, loaded.template, facts)
        .scheduler(SchedulerConfig {
            num_speculative_tokens: drafts,
            ..SchedulerConfig::default()
        })
        .executor(Box::new(executor))
        .start()
        .expect("engine");
    (handle, tap, ranges)
}

/// Request `i`'s sampling: every kind in turn.
fn params(i: u64, rng: &mut StdRng) -> SamplingParams {
    let base = SamplingParams {
        max_tokens: rng.random_range(2..14),
        ignore_eos: true,
        seed: Some(i),
        ..Default::default()
    };
    match i % 6 {
        0 => SamplingParams {
            temperature: 0.0,
            ..base
        },
        1 => SamplingParams {
            temperature: 0.9,
            ..base
        },
        2 => SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            logprobs: Some(2),
            ..base
        },
        3 => SamplingParams {
            temperature: 1.1,
            top_k: 20,
            ..base
        },
        4 => SamplingParams {
            temperature: 0.0,
            repetition_penalty: 1.3,
            frequency_penalty: 0.4,
            presence_penalty: 0.2,
            logprobs: Some(1),
            ..base
        },
        _ => SamplingParams {
            temperature: 0.8,
            min_p: 0.05,
            repetition_penalty: 1.1,
            ..base
        },
    }
}

/// A prompt of distinct random tokens, with a repeated run now and then
/// (so prompt lookup drafts).
fn prompt(rng: &mut StdRng) -> Vec<u32> {
    let n = rng.random_range(3..60);
    let mut p: Vec<u32> = (0..n).map(|_| rng.random_range(100..40_000)).collect();
    if rng.random_bool(0.5) {
        let run: Vec<u32> = p.iter().take(6).copied().collect();
        p.extend(run.iter().chain(&run));
    }
    p
}

/// Runs `n` requests, `at_once` at a time.
async fn run(h: &EngineHandle, n: u64, at_once: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut i = 0;
    while i < n {
        let mut streams = Vec::new();
        for _ in 0..at_once.min(n - i) {
            let req = GenerateRequest {
                prompt_tokens: prompt(&mut rng),
                params: params(i, &mut rng),
            };
            let s = h.validate(req).and_then(|r| h.submit(r)).expect("submit");
            streams.push(tokio::spawn(common::drain(s)));
            i += 1;
        }
        for s in streams {
            s.await.expect("join");
        }
    }
}

/// Every record checked on fresh stages: the verdicts, by stage.
fn check_all(records: Vec<StageRecord>, ranges: &[Range<usize>]) -> Vec<Vec<StageVerdict>> {
    let mut checkers: Vec<LocalStage> = ranges
        .iter()
        .map(|r| stage(r.clone(), CHECK_POSITIONS / BLOCK))
        .collect();
    let mut out = vec![Vec::new(); ranges.len()];
    let (started, mut positions) = (std::time::Instant::now(), 0);
    let n = records.len();
    for r in records {
        positions += r.positions();
        let v = check(&mut checkers[r.stage], &r, &Tolerance::default()).expect("check");
        out[r.stage].push(v);
    }
    let took = started.elapsed().as_secs_f64();
    eprintln!(
        "{n} records, {positions} positions recomputed in {took:.2} s ({:.2} ms a record)",
        took * 1e3 / n.max(1) as f64
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_honest_requests_pass_every_check_of_every_stage() {
    let mut all: Vec<Vec<StageVerdict>> = vec![Vec::new(); 3];
    let mut sequences = 0;
    for (drafts, n, seed) in [(0, 700, 1), (3, 300, 2)] {
        let (h, tap, ranges) = engine(None, drafts);
        run(&h, n, 24, seed).await;
        let records = tap.lock().expect("tap").take_ready();
        sequences += n as usize;
        for (s, v) in check_all(records, &ranges).into_iter().enumerate() {
            all[s].extend(v);
        }
    }
    for (s, verdicts) in all.iter().enumerate() {
        let failed: Vec<_> = verdicts
            .iter()
            .filter(|v| matches!(v, StageVerdict::Fail(_)))
            .collect();
        let worst = verdicts
            .iter()
            .filter_map(|v| match v {
                StageVerdict::Pass { worst, .. } => Some(*worst),
                StageVerdict::Fail(_) => None,
            })
            .fold(0f32, f32::max);
        let rows: usize = verdicts
            .iter()
            .map(|v| match v {
                StageVerdict::Pass { rows, .. } => *rows,
                StageVerdict::Fail(_) => 0,
            })
            .sum();
        eprintln!(
            "stage {s}: {} records, {rows} rows judged, worst {worst:.6}",
            verdicts.len()
        );
        assert!(failed.is_empty(), "stage {s}: {failed:?}");
        // A sequence that starts from a cached prefix cannot be checked;
        // these prompts share none.
        assert!(
            verdicts.len() * 100 >= sequences * 99,
            "stage {s}: {} records of {sequences}",
            verdicts.len()
        );
        assert!(rows > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_stage_fails_its_checks_and_the_honest_ones_pass() {
    let lies = [
        (1, Lie::Skip),
        (0, Lie::Scale(1.03)),
        (1, Lie::Scale(0.97)),
        (2, Lie::OtherToken),
        (2, Lie::OtherLogprob),
    ];
    for (at, lie) in lies {
        let (h, tap, ranges) = engine(Some((at, lie)), 0);
        run(&h, 12, 6, 7).await;
        let records = tap.lock().expect("tap").take_ready();
        for (s, verdicts) in check_all(records, &ranges).into_iter().enumerate() {
            assert_eq!(verdicts.len(), 12, "{lie:?} at {at}: stage {s}");
            for v in verdicts {
                match (s == at, &v, lie) {
                    // Only the requests that asked for log-probabilities
                    // carry one to lie about.
                    (true, StageVerdict::Pass { rows, .. }, Lie::OtherLogprob) => {
                        assert!(*rows > 0);
                    }
                    (true, StageVerdict::Fail(_), _) | (false, StageVerdict::Pass { .. }, _) => {}
                    _ => panic!("{lie:?} at stage {at}: stage {s} gave {v:?}"),
                }
            }
        }
    }
}
