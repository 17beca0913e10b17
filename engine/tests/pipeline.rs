//! A model split into contiguous layer parts computes what the whole model
//! computes, bit for bit: every architecture's logits through a chain of
//! parts equal the whole model's, and an engine whose executor is a
//! pipeline of stages generates the same tokens, greedy and seeded, as an
//! engine on the whole model.

mod common;

use std::ops::Range;

use engine::executor::LocalExecutor;
use engine::gguf::Gguf;
use engine::kv_cache::KvDtype;
use engine::loader::load_gguf;
use engine::model::llama::{Llama, PartInput, PartOutput};
use engine::model::{ModelBatch, SeqChunk};
use engine::pipeline::{LocalStage, PipelineExecutor, Stage, even_split};
use engine::{
    EngineBuilder, EngineHandle, GenerateRequest, ModelFacts, RequestId, SamplingParams,
    TemplateChoice,
};
use kernels::cpu::backend::CpuBackend;

const BLOCK: usize = 16;
const BLOCKS: usize = 64;

fn part(model: &str, layers: Range<usize>) -> Llama {
    let path = common::model_path(model);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).expect("open"));
    let ct = Gguf::read(&mut reader).expect("gguf");
    Llama::load_part(CpuBackend, &ct, &mut reader, layers).expect("part")
}

fn n_layer(model: &str) -> usize {
    let path = common::model_path(model);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).expect("open"));
    let ct = Gguf::read(&mut reader).expect("gguf");
    engine::model::llama::LlamaConfig::from_gguf(&ct)
        .expect("config")
        .n_layer
}

fn stages(model: &str, parts: usize) -> Vec<LocalStage> {
    even_split(n_layer(model), parts)
        .into_iter()
        .map(|r| LocalStage::new(part(model, r), BLOCK, BLOCKS, KvDtype::F16).expect("stage"))
        .collect()
}

fn chunk(seq: u64, tokens: Vec<u32>, start: usize, want: bool) -> SeqChunk {
    let first = seq as u32 * 8;
    SeqChunk {
        seq: RequestId(seq),
        tokens,
        start_pos: start,
        want_logits: want,
        block_table: (first..first + 8).collect(),
        swa_table: Vec::new(),
        draft: Vec::new(),
    }
}

/// Two steps of a mixed batch: prompts in chunks, then decode tokens.
fn steps() -> Vec<ModelBatch> {
    let p0: Vec<u32> = (0..37).map(|i| 10 + i * 3).collect();
    let p1: Vec<u32> = (0..5).map(|i| 20 + i).collect();
    vec![
        ModelBatch {
            chunks: vec![
                chunk(0, p0[..20].to_vec(), 0, false),
                chunk(1, p1.clone(), 0, true),
            ],
        },
        ModelBatch {
            chunks: vec![
                chunk(0, p0[20..].to_vec(), 20, true),
                chunk(1, vec![42], p1.len(), true),
            ],
        },
    ]
}

fn through_chain(chain: &mut [LocalStage], batch: &ModelBatch) -> Vec<Vec<f32>> {
    let mut hidden: Option<Vec<f32>> = None;
    for stage in chain.iter_mut() {
        let input = hidden
            .as_deref()
            .map_or(PartInput::Tokens, PartInput::Hidden);
        match stage.forward(batch, input).expect("stage") {
            PartOutput::Hidden(h) => hidden = Some(h),
            PartOutput::Logits(rows) => return rows,
        }
    }
    panic!("the chain ended without logits")
}

#[test]
fn a_chain_of_parts_gives_the_whole_models_logits_bit_for_bit() {
    let models = [common::TINY, common::SMOLLM2]
        .into_iter()
        .chain(common::ARCH_MODELS);
    for model in models {
        let n = n_layer(model);
        for parts in [2, 3] {
            let mut chain = stages(model, parts);
            let whole = load_gguf(&common::model_path(model), &TemplateChoice::Auto)
                .expect("load")
                .model;
            let layout = whole.config.kv_layout(BLOCK, BLOCKS);
            let mut alone = LocalExecutor::new(whole, layout).expect("executor");
            for (i, batch) in steps().iter().enumerate() {
                let want = alone.logits(batch).expect("whole");
                let got = through_chain(&mut chain, batch);
                assert_eq!(got, want, "{model}: {parts} parts of {n} layers, step {i}");
            }
        }
        // A part refuses what belongs to another part.
        let mut tail = stages(model, 2).pop().expect("tail");
        let batch = &steps()[0];
        assert!(tail.forward(batch, PartInput::Tokens).is_err(), "{model}");
        assert!(
            tail.forward(batch, PartInput::Hidden(&[0.0; 3])).is_err(),
            "{model}: hidden states of the wrong size"
        );
    }
}

#[test]
fn a_part_loads_only_its_own_layers() {
    let path = common::model_path(common::SMOLLM2);
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).expect("open"));
    let ct = Gguf::read(&mut reader).expect("gguf");
    for bad in [0..0, 5..5, 20..31, 31..40] {
        assert!(
            Llama::load_part(CpuBackend, &ct, &mut reader, bad.clone()).is_err(),
            "{bad:?}"
        );
    }
    let middle = Llama::load_part(CpuBackend, &ct, &mut reader, 10..20).expect("middle");
    assert_eq!(middle.layer_range(), 10..20);
    assert_eq!(middle.part_kv_layout(BLOCK, 4).n_layer, 10);
}

fn facts_of(mc: &engine::model::llama::LlamaConfig) -> ModelFacts {
    ModelFacts {
        architecture: mc.architecture.clone(),
        context_length: mc.context_length,
        vocab_size: mc.vocab_size,
        generation: Default::default(),
    }
}

fn pipeline_engine(model: &str, parts: usize) -> EngineHandle {
    let loaded = load_gguf(&common::model_path(model), &TemplateChoice::Auto).expect("load");
    let mc = &loaded.model.config;
    let facts = facts_of(mc);
    let layout = mc.kv_layout(BLOCK, BLOCKS);
    let chain: Vec<Box<dyn Stage>> = stages(model, parts)
        .into_iter()
        .map(|s| Box::new(s) as Box<dyn Stage>)
        .collect();
    let executor = PipelineExecutor::new(chain, layout).expect("pipeline");
    EngineBuilder::new(loaded.tokenizer, loaded.template, facts)
        .executor(Box::new(executor))
        .start()
        .expect("engine")
}

fn whole_engine(model: &str) -> EngineHandle {
    let loaded = load_gguf(&common::model_path(model), &TemplateChoice::Auto).expect("load");
    let mc = &loaded.model.config;
    let facts = facts_of(mc);
    let layout = mc.kv_layout(BLOCK, BLOCKS);
    EngineBuilder::new(loaded.tokenizer, loaded.template, facts)
        .executor(Box::new(
            LocalExecutor::new(loaded.model, layout).expect("exec"),
        ))
        .start()
        .expect("engine")
}

/// Four prompts at once, greedy and seeded.
async fn generate(h: &EngineHandle) -> Vec<Vec<u32>> {
    let mut streams = Vec::new();
    for i in 0..4u32 {
        let req = GenerateRequest {
            prompt_tokens: (0..12 + i * 9).map(|t| 300 + t * (i + 2)).collect(),
            params: SamplingParams {
                temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                seed: Some(u64::from(i)),
                max_tokens: 24,
                ignore_eos: true,
                ..Default::default()
            },
        };
        let s = h.validate(req).and_then(|r| h.submit(r)).expect("submit");
        streams.push(tokio::spawn(common::drain(s)));
    }
    let mut out = Vec::new();
    for s in streams {
        out.push(s.await.expect("join"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_a_pipeline_of_stages_generates_what_one_engine_does() {
    let want = generate(&whole_engine(common::SMOLLM2)).await;
    assert!(want.iter().all(|t| t.len() == 24));
    for parts in [2, 3] {
        let got = generate(&pipeline_engine(common::SMOLLM2, parts)).await;
        assert_eq!(got, want, "{parts} stages");
    }
}
