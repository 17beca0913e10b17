//! End-to-end generation through `EngineHandle` with real weights.

mod common;

use engine::{
    ChatMessage, EngineHandle, FinishReason, GenerateRequest, SamplingParams, SchedulerConfig,
    TokenEvent,
};
use tokio_stream::StreamExt;

async fn collect(
    handle: &EngineHandle,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> (String, FinishReason, usize) {
    let mut stream = handle
        .submit(GenerateRequest {
            prompt_tokens: prompt,
            params,
        })
        .expect("submit");
    let mut text = String::new();
    while let Some(ev) = stream.next().await {
        match ev {
            TokenEvent::Delta { text: t, .. } => text.push_str(&t),
            TokenEvent::Finished { reason, usage } => {
                return (text, reason, usage.completion_tokens);
            }
            TokenEvent::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("stream ended without Finished");
}

fn chat_prompt(handle: &EngineHandle, question: &str) -> Vec<u32> {
    let text = handle
        .render_chat(&[ChatMessage::new("user", question)])
        .expect("template");
    handle.tokenizer().encode_prompt(&text).expect("tokenize")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_answers_the_capital_of_france_greedily() {
    let handle = EngineHandle::start_gguf(
        &common::model_path(common::SMOLLM2),
        &Default::default(),
        SchedulerConfig::default(),
    )
    .expect("load SmolLM2");
    let prompt = chat_prompt(&handle, "What is the capital of France?");
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 40,
        ..Default::default()
    };
    let (text, reason, n) = collect(&handle, prompt.clone(), params.clone()).await;
    eprintln!("answer ({n} tokens, {reason:?}): {text:?}");
    assert!(text.contains("Paris"), "answer was {text:?}");
    assert_eq!(reason, FinishReason::Stop);
    // Greedy decoding is deterministic, also when two requests share a batch.
    let (a, b) = tokio::join!(
        collect(&handle, prompt.clone(), params.clone()),
        collect(&handle, prompt, params)
    );
    assert_eq!(a.0, text);
    assert_eq!(b.0, text);
    handle.shutdown();
}
