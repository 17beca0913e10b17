//! Spot checks of one pipeline stage: what a stage was given and what it
//! answered for one sequence, recorded step by step (`Tap`, `Tapped`), is
//! recomputed in one prefill on a trusted copy of the same layers and
//! judged (`check`). A stage that passes hidden states on must give each
//! row within a relative distance of the recomputed one; the last stage
//! must have drawn the tokens the recomputed logits draw under the same
//! sampling (seed and position included), a near tie allowed, and report
//! their log-probabilities within a tolerance. Only rows whose position
//! was not written again later are judged (a rejected draft's rows are
//! overwritten by the next step), and a record must start at position 0:
//! the KV behind it is recomputed from the record alone.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::error::{EngineError, Result};
use crate::executor::Step;
use crate::model::llama::{PartInput, PartOutput};
use crate::model::{ModelBatch, SeqChunk};
use crate::pipeline::{LocalStage, Stage, StageOutput};
use crate::request::RequestId;
use crate::sampling::{OwnedSampling, Sampled, logprobs, sample};

/// What one chunk of a watched sequence gave a stage and got back.
#[derive(Debug, Clone)]
struct Recorded {
    start_pos: usize,
    tokens: Vec<u32>,
    draft: Vec<u32>,
    want_logits: bool,
    /// The hidden rows it was given (none on the first stage).
    input: Vec<f32>,
    output: RecordedOutput,
}

#[derive(Debug, Clone)]
enum RecordedOutput {
    Hidden(Vec<f32>),
    Sampled(Vec<Sampled>, Option<Box<OwnedSampling>>),
}

/// One sequence's traffic through one stage, from position 0.
#[derive(Debug, Clone)]
pub struct StageRecord {
    pub seq: RequestId,
    /// Which stage of the chain, and its layers.
    pub stage: usize,
    pub layers: Range<usize>,
    hidden: usize,
    chunks: Vec<Recorded>,
    /// One past the furthest position recorded.
    end: usize,
    /// A chunk did not follow (a gap): the record cannot be checked.
    broken: bool,
}

impl StageRecord {
    pub fn new(seq: RequestId, stage: usize, layers: Range<usize>, hidden: usize) -> Self {
        Self {
            seq,
            stage,
            layers,
            hidden,
            chunks: Vec::new(),
            end: 0,
            broken: false,
        }
    }

    /// Positions recorded (one past the furthest).
    pub fn positions(&self) -> usize {
        self.end
    }

    /// Whether it holds anything to check.
    pub fn checkable(&self) -> bool {
        !self.broken && !self.chunks.is_empty()
    }

    /// Adds chunk `c`'s traffic: its input rows (empty on the first
    /// stage) and the stage's output for it.
    fn push(&mut self, c: &SeqChunk, input: &[f32], output: RecordedOutput) {
        if c.start_pos > self.end {
            self.broken = true;
            return;
        }
        self.end = self.end.max(c.start_pos + c.tokens.len());
        self.chunks.push(Recorded {
            start_pos: c.start_pos,
            tokens: c.tokens.clone(),
            draft: c.draft.clone(),
            want_logits: c.want_logits,
            input: input.to_vec(),
            output,
        });
    }
}

/// How close a stage's answer must be to the recomputed one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Largest `|got - want| / |want|` (L2 norms) of a hidden row (the
    /// same CPU build recomputes honest rows exactly; the room is for
    /// another instruction set's sums).
    pub hidden: f32,
    /// A drawn token that differs passes if it is drawn once its logit
    /// is raised by this much and the reference's token's lowered by it.
    pub tie: f32,
    /// Largest difference of a reported log-probability (nats).
    pub logprob: f32,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            hidden: 2e-3,
            tie: 0.05,
            logprob: 0.25,
        }
    }
}

/// How a stage's record came out.
#[derive(Debug, Clone, PartialEq)]
pub enum StageVerdict {
    /// Passed: the largest relative distance of a hidden row (or of a
    /// log-probability, on the last stage) and the rows judged.
    Pass {
        worst: f32,
        rows: usize,
    },
    Fail(String),
}

/// Recomputes `record` on `stage` (the same layers, trusted; its KV
/// blocks must cover the record's positions) in one prefill and judges
/// what the stage under check answered.
pub fn check(
    stage: &mut LocalStage,
    record: &StageRecord,
    tol: &Tolerance,
) -> Result<StageVerdict> {
    if !record.checkable() {
        return Err(EngineError::Execution(
            "the record has a gap or nothing in it".into(),
        ));
    }
    if stage.layers() != record.layers {
        return Err(EngineError::Execution(format!(
            "a check of layers {:?} on a stage of {:?}",
            record.layers,
            stage.layers()
        )));
    }
    let replay = Replay::of(record);
    let first_logits = replay.first_logits(record);
    let block = stage.block_size();
    let blocks = record.end.div_ceil(block);
    if blocks > stage.num_blocks() {
        return Err(EngineError::Execution(format!(
            "{} positions need {blocks} KV blocks; the checking stage holds {}",
            record.end,
            stage.num_blocks()
        )));
    }
    let chunk = SeqChunk {
        seq: record.seq,
        tokens: replay.tokens.clone(),
        start_pos: 0,
        want_logits: first_logits.is_some(),
        block_table: (0..blocks as u32).collect(),
        swa_table: Vec::new(),
        draft: first_logits.map_or_else(Vec::new, |lo| replay.tokens[lo + 1..].to_vec()),
    };
    let batch = ModelBatch {
        chunks: vec![chunk],
    };
    let input = if replay.input.is_empty() {
        PartInput::Tokens
    } else {
        PartInput::Hidden(&replay.input)
    };
    let out = stage.forward(&batch, input)?;
    Ok(match out {
        PartOutput::Hidden(h) => judge_hidden(record, &replay, &h, tol),
        PartOutput::Logits(rows) => {
            judge_sampled(record, &replay, &rows, first_logits.unwrap_or(0), tol)
        }
    })
}

/// Each position's last input, and which chunk wrote it last.
struct Replay {
    tokens: Vec<u32>,
    input: Vec<f32>,
    writer: Vec<usize>,
}

impl Replay {
    fn of(r: &StageRecord) -> Self {
        let h = r.hidden;
        let mut tokens = vec![0; r.end];
        let mut input = Vec::new();
        if r.chunks.iter().any(|c| !c.input.is_empty()) {
            input = vec![0.0; r.end * h];
        }
        let mut writer = vec![usize::MAX; r.end];
        for (ci, c) in r.chunks.iter().enumerate() {
            for (j, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + j;
                tokens[p] = t;
                writer[p] = ci;
                if let Some(row) = c.input.get(j * h..(j + 1) * h) {
                    input[p * h..(p + 1) * h].copy_from_slice(row);
                }
            }
        }
        Self {
            tokens,
            input,
            writer,
        }
    }

    /// The first position whose logits the last stage's record needs.
    fn first_logits(&self, r: &StageRecord) -> Option<usize> {
        r.chunks
            .iter()
            .filter(|c| c.want_logits && matches!(c.output, RecordedOutput::Sampled(..)))
            .map(|c| c.start_pos + c.tokens.len() - (c.draft.len() + 1))
            .min()
    }
}

/// Relative L2 distance of `got` from `want` (infinite when not finite).
fn distance(got: &[f32], want: &[f32]) -> f32 {
    let (mut d, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        d += f64::from(g - w).powi(2);
        n += f64::from(w).powi(2);
    }
    let r = (d.sqrt() / n.sqrt().max(1e-12)) as f32;
    if r.is_finite() && got.len() == want.len() {
        r
    } else {
        f32::INFINITY
    }
}

fn judge_hidden(r: &StageRecord, replay: &Replay, want: &[f32], tol: &Tolerance) -> StageVerdict {
    let h = r.hidden;
    let (mut worst, mut rows) = (0f32, 0);
    for (ci, c) in r.chunks.iter().enumerate() {
        let RecordedOutput::Hidden(got) = &c.output else {
            return StageVerdict::Fail("a hidden stage's record holds tokens".into());
        };
        if got.len() != c.tokens.len() * h {
            return StageVerdict::Fail(format!(
                "{} values for {} rows of {h}",
                got.len(),
                c.tokens.len()
            ));
        }
        for j in 0..c.tokens.len() {
            let p = c.start_pos + j;
            if replay.writer[p] != ci {
                continue;
            }
            let d = distance(&got[j * h..(j + 1) * h], &want[p * h..(p + 1) * h]);
            if d > tol.hidden {
                return StageVerdict::Fail(format!(
                    "position {p}: hidden state {d:.4} away from the recomputed one (at most {})",
                    tol.hidden
                ));
            }
            worst = worst.max(d);
            rows += 1;
        }
    }
    StageVerdict::Pass { worst, rows }
}

fn judge_sampled(
    r: &StageRecord,
    replay: &Replay,
    logits: &[Vec<f32>],
    first: usize,
    tol: &Tolerance,
) -> StageVerdict {
    let (mut worst, mut rows) = (0f32, 0);
    for (ci, c) in r.chunks.iter().enumerate() {
        let (got, Some(s)) = (match &c.output {
            RecordedOutput::Sampled(t, s) => (t, s.as_deref()),
            RecordedOutput::Hidden(_) => {
                return StageVerdict::Fail("the last stage's record holds hidden states".into());
            }
        }) else {
            continue;
        };
        let at = c.start_pos + c.tokens.len() - (c.draft.len() + 1);
        let rows_of = |j: usize| logits.get(at + j - first).map(Vec::as_slice);
        match judge_chunk(c, s, got, rows_of, |p| replay.writer[p] == ci, tol) {
            Ok((w, n)) => {
                worst = worst.max(w);
                rows += n;
            }
            Err(why) => return StageVerdict::Fail(format!("chunk at {}: {why}", c.start_pos)),
        }
    }
    StageVerdict::Pass { worst, rows }
}

/// Judges one chunk's drawn tokens against the recomputed rows, as
/// `sample_chunk` draws them (penalties see the tokens drawn before).
fn judge_chunk<'r>(
    c: &Recorded,
    s: &OwnedSampling,
    got: &[Sampled],
    rows: impl Fn(usize) -> Option<&'r [f32]>,
    own: impl Fn(usize) -> bool,
    tol: &Tolerance,
) -> std::result::Result<(f32, usize), String> {
    let most = c.draft.len() + 1;
    if got.is_empty() || got.len() > most {
        return Err(format!("{} tokens for {most} rows", got.len()));
    }
    let at = c.start_pos + c.tokens.len() - most;
    let mut penalties = s.penalties.clone();
    let (mut worst, mut n) = (0f32, 0);
    for (j, (token, lp)) in got.iter().enumerate() {
        // Every token but the last must be the accepted draft; the last
        // ends the chunk (a correction, or the row after the last draft).
        let accepted = c.draft.get(j) == Some(token);
        if accepted != (j + 1 < got.len()) {
            return Err(format!("token {j} ({token}) does not follow the drafts"));
        }
        let row = rows(j).ok_or("a row the recomputation lacks")?;
        if own(at + j) {
            let allowed = if j == 0 { s.allowed.as_ref() } else { None };
            let draw = |l: &[f32]| {
                sample(
                    &s.spec,
                    penalties.as_ref(),
                    allowed,
                    s.position + j as u64,
                    l,
                )
                .0
            };
            let want = draw(row);
            if want != *token {
                let mut nudged = row.to_vec();
                let bump = |l: &mut Vec<f32>, t: u32, by: f32| {
                    if let Some(v) = l.get_mut(t as usize) {
                        *v += by;
                    }
                };
                bump(&mut nudged, *token, tol.tie);
                bump(&mut nudged, want, -tol.tie);
                if draw(&nudged) != *token {
                    return Err(format!(
                        "row {j}: drew {token} where the recomputed logits draw {want}"
                    ));
                }
            }
            if let (Some(lp), Some(k)) = (lp, s.spec.logprobs) {
                let reference = logprobs(row, *token, k);
                let d = (lp.logprob - reference.logprob).abs();
                if d.is_nan() || d > tol.logprob || lp.token != *token {
                    return Err(format!(
                        "row {j}: log-probability {:.3} reported, {:.3} recomputed",
                        lp.logprob, reference.logprob
                    ));
                }
                worst = worst.max(d);
            }
            n += 1;
        }
        if let Some(p) = penalties.as_mut() {
            p.push(*token);
        }
    }
    Ok((worst, n))
}

/// Which sequences are watched at which stages, and what was recorded.
#[derive(Debug)]
pub struct Tap {
    watches: HashMap<(RequestId, usize), StageRecord>,
    /// Records finished (their sequence ended, or they grew to
    /// `max_positions`), waiting to be checked.
    ready: Vec<StageRecord>,
    /// A record stops growing at this many positions.
    max_positions: usize,
    /// At most this many records are open at once.
    max_open: usize,
}

impl Tap {
    /// A tap whose records stop growing at `max_positions` (the
    /// checking stage's KV must hold that many), at most `max_open` of
    /// them open at once.
    pub fn new(max_positions: usize, max_open: usize) -> Self {
        Self {
            watches: HashMap::new(),
            ready: Vec::new(),
            max_positions: max_positions.max(1),
            max_open,
        }
    }

    /// Watches `seq` at stage `stage` (layers `layers`) from its next
    /// chunk, which must start at position 0; false when too many are
    /// open.
    pub fn watch(
        &mut self,
        seq: RequestId,
        stage: usize,
        layers: Range<usize>,
        hidden: usize,
    ) -> bool {
        if self.watches.len() >= self.max_open {
            return false;
        }
        self.watches
            .entry((seq, stage))
            .or_insert_with(|| StageRecord::new(seq, stage, layers, hidden));
        true
    }

    /// Whether `seq` is watched at any stage.
    pub fn watching(&self, seq: RequestId) -> bool {
        self.watches.keys().any(|(s, _)| *s == seq)
    }

    /// Sequence `seq` ended: its records are ready.
    pub fn finish(&mut self, seq: RequestId) {
        let keys: Vec<_> = self
            .watches
            .keys()
            .filter(|k| k.0 == seq)
            .copied()
            .collect();
        for k in keys {
            if let Some(r) = self.watches.remove(&k) {
                self.ready.push(r);
            }
        }
    }

    /// The records ready to check.
    pub fn take_ready(&mut self) -> Vec<StageRecord> {
        std::mem::take(&mut self.ready)
    }

    /// Forgets every open record (the chain changed: what they hold can
    /// no longer be recomputed as one).
    pub fn clear(&mut self) {
        self.watches.clear();
    }

    /// Records stage `stage`'s traffic for the watched chunks of `step`.
    fn record(&mut self, stage: usize, step: &Step<'_>, input: PartInput<'_>, out: &StageOutput) {
        let max_positions = self.max_positions;
        let mut row = 0;
        for (ci, c) in step.batch.chunks.iter().enumerate() {
            let rows = row..row + c.tokens.len();
            row = rows.end;
            let Some(r) = self.watches.get_mut(&(c.seq, stage)) else {
                continue;
            };
            let h = r.hidden;
            let input = match input {
                PartInput::Hidden(x) => x.get(rows.start * h..rows.end * h).unwrap_or(&[]),
                PartInput::Tokens => &[],
            };
            let output = match out {
                StageOutput::Hidden(x) => RecordedOutput::Hidden(
                    x.get(rows.start * h..rows.end * h).unwrap_or(&[]).to_vec(),
                ),
                StageOutput::Sampled(s) => RecordedOutput::Sampled(
                    s.get(ci).cloned().unwrap_or_default(),
                    step.sampling
                        .get(ci)
                        .and_then(|s| s.as_ref())
                        .map(|s| Box::new(s.to_owned())),
                ),
            };
            r.push(c, input, output);
            if (r.broken || r.end >= max_positions)
                && let Some(r) = self.watches.remove(&(c.seq, stage))
                && !r.broken
            {
                self.ready.push(r);
            }
        }
    }
}

/// A stage whose traffic for the sequences its tap watches is recorded.
pub struct Tapped {
    pub inner: Box<dyn Stage>,
    pub index: usize,
    pub tap: Arc<Mutex<Tap>>,
}

impl Stage for Tapped {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn layers(&self) -> Range<usize> {
        self.inner.layers()
    }

    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    fn run(&mut self, step: &Step<'_>, input: PartInput<'_>) -> Result<StageOutput> {
        let out = self.inner.run(step, input)?;
        let mut tap = self.tap.lock().unwrap_or_else(|e| e.into_inner());
        if !tap.watches.is_empty() {
            tap.record(self.index, step, input, &out);
        }
        Ok(out)
    }

    fn release(&mut self, seq: RequestId) {
        self.inner.release(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingParams;
    use crate::sampling::SamplingSpec;

    fn greedy() -> OwnedSampling {
        OwnedSampling {
            spec: SamplingSpec::new(&SamplingParams {
                temperature: 0.0,
                seed: Some(1),
                ..Default::default()
            }),
            position: 0,
            penalties: None,
            allowed: None,
        }
    }

    fn decode(start_pos: usize, tokens: Vec<u32>, draft: Vec<u32>) -> Recorded {
        Recorded {
            start_pos,
            tokens,
            draft,
            want_logits: true,
            input: Vec::new(),
            output: RecordedOutput::Hidden(Vec::new()),
        }
    }

    #[test]
    fn a_near_tie_passes_and_a_clear_loss_or_a_broken_draft_rule_fails() {
        let s = greedy();
        let tol = Tolerance::default();
        let row = [0.0, 3.0, 2.99, -1.0];
        let c = decode(4, vec![7], vec![]);
        let judge = |got: &[u32], rows: &[&[f32]], c: &Recorded| {
            let got: Vec<Sampled> = got.iter().map(|&t| (t, None)).collect();
            judge_chunk(c, &s, &got, |j| rows.get(j).copied(), |_| true, &tol)
        };
        assert_eq!(judge(&[1], &[&row], &c), Ok((0.0, 1)));
        assert!(judge(&[2], &[&row], &c).is_ok(), "0.01 behind: a tie");
        assert!(judge(&[0], &[&row], &c).is_err(), "3 behind");
        assert!(judge(&[], &[&row], &c).is_err());
        // Two drafts: accepted ones first, then the correction (or the
        // row after the last draft); nothing after a rejected draft.
        let c = decode(4, vec![7, 1, 1], vec![1, 1]);
        let all: [&[f32]; 3] = [&row, &row, &row];
        assert!(judge(&[1, 1, 1], &all, &c).is_ok());
        assert!(
            judge(&[1, 2], &all, &c).is_ok(),
            "a correction within a tie"
        );
        assert!(
            judge(&[2, 1], &all, &c).is_err(),
            "a token after a rejection"
        );
        assert!(
            judge(&[1, 1, 1, 1], &all, &c).is_err(),
            "more tokens than rows"
        );
    }

    #[test]
    fn a_record_with_a_gap_is_not_checkable_and_rewritten_rows_are_not_judged() {
        let mut r = StageRecord::new(RequestId(1), 0, 0..2, 2);
        let chunk = |start_pos: usize, n: usize| SeqChunk {
            seq: RequestId(1),
            tokens: vec![5; n],
            start_pos,
            want_logits: false,
            block_table: vec![0],
            swa_table: Vec::new(),
            draft: Vec::new(),
        };
        let rows = |n: usize, v: f32| RecordedOutput::Hidden(vec![v; 2 * n]);
        r.push(&chunk(0, 3), &[], rows(3, 1.0));
        r.push(&chunk(2, 2), &[], rows(2, 2.0));
        assert!(r.checkable() && r.positions() == 4);
        // Position 2 was written again: only the second chunk's row counts.
        let replay = Replay::of(&r);
        assert_eq!(replay.writer, vec![0, 0, 1, 1]);
        let want = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0];
        let tol = Tolerance::default();
        assert_eq!(
            judge_hidden(&r, &replay, &want, &tol),
            StageVerdict::Pass {
                worst: 0.0,
                rows: 4
            }
        );
        let off = [1.0, 1.0, 1.0, 1.1, 2.0, 2.0, 2.0, 2.0];
        assert!(matches!(
            judge_hidden(&r, &replay, &off, &tol),
            StageVerdict::Fail(_)
        ));
        r.push(&chunk(6, 1), &[], rows(1, 0.0));
        assert!(!r.checkable(), "a gap");
    }
}
