//! A split's KV as the decode side gathers it from relayed frames
//! (`protocol::kv_stream::KvAssembly`): any bytes, cut into frames (each
//! after its length, two bytes little-endian; the first byte the positions
//! the end claims), are refused or gather into a span, never a panic; a
//! span that verified gathers to itself again from `frames_of`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::ServedModel;
use protocol::kv_stream::{KvAssembly, KvDigest, frames_of};

fn model() -> ServedModel {
    ServedModel {
        name: "m".into(),
        layers: 2,
        kv_heads: 1,
        head_dim: 2,
        block_size: 16,
        context_length: 64,
    }
}

/// Gathers `frames` and ends with their own digest at `tokens` positions.
fn gather<'a>(
    frames: impl Iterator<Item = &'a [u8]>,
    tokens: u32,
) -> Result<protocol::kv_stream::KvSpan, String> {
    let mut kv = KvAssembly::new(7, model(), 0);
    let mut digest = KvDigest::default();
    for f in frames {
        kv.push(f);
        digest.frame(f);
    }
    kv.finish(tokens, &digest.hex(), tokens as usize)
}

fuzz_target!(|data: &[u8]| {
    let Some((&tokens, mut rest)) = data.split_first() else {
        return;
    };
    let mut frames = Vec::new();
    while rest.len() >= 2 {
        let end = (2 + usize::from(u16::from_le_bytes([rest[0], rest[1]]))).min(rest.len());
        frames.push(&rest[2..end]);
        rest = &rest[end..];
    }
    let tokens = u32::from(tokens);
    if let Ok(span) = gather(frames.into_iter(), tokens) {
        let again = frames_of(7, span.first, span.count, &span.layers);
        assert_eq!(gather(again.iter().map(Vec::as_slice), tokens), Ok(span));
    }
});
