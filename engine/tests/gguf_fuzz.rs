//! The GGUF loader against mangled files: truncated anywhere, bytes
//! flipped in the header, the metadata and the tensor table, 64-bit
//! fields set to extreme values, and hand-made breakages (a zero
//! alignment, a tensor whose shape disagrees with the metadata). Every
//! file is refused with an error or loads; none panics. Seeded and
//! bounded (a few hundred files of the 2.8 MB test model), so it runs in
//! `make test`; `SYNOR_FUZZ_CASES=N` runs more.

mod common;

use std::path::Path;

use engine::loader::load_gguf;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// Bytes that hold the header, metadata and tensor table of the test
/// model (its tensor data starts after them).
const HEAD: usize = 64 * 1024;

fn cases() -> usize {
    std::env::var("SYNOR_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Loads `bytes` as a GGUF file; a panic is the failure.
fn load(bytes: &[u8], dir: &Path, what: &str) -> Result<(), String> {
    let path = dir.join("fuzz.gguf");
    std::fs::write(&path, bytes).expect("write");
    let got = std::panic::catch_unwind(|| {
        load_gguf(&path, &Default::default())
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    match got {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: the loader panicked: {msg}");
        }
    }
}

fn mutate(rng: &mut StdRng, src: &[u8]) -> (Vec<u8>, String) {
    let mut b = src.to_vec();
    let head = HEAD.min(b.len());
    match rng.random_range(0..4) {
        0 => {
            let at = rng.random_range(0..b.len());
            b.truncate(at);
            (b, format!("truncated at {at}"))
        }
        1 => {
            let n = rng.random_range(1..9);
            for _ in 0..n {
                let at = rng.random_range(0..head);
                b[at] ^= 1 << rng.random_range(0..8);
            }
            (b, format!("{n} bits flipped"))
        }
        2 => {
            const EXTREMES: [u64; 7] = [
                0,
                1,
                u32::MAX as u64,
                1 << 32,
                1 << 40,
                i64::MAX as u64,
                u64::MAX,
            ];
            let v = EXTREMES[rng.random_range(0..EXTREMES.len())];
            let at = rng.random_range(0..head - 8);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            (b, format!("{v} written at {at}"))
        }
        _ => {
            let at = rng.random_range(0..head);
            let n = rng.random_range(1..64).min(b.len() - at);
            rng.fill(&mut b[at..at + n]);
            (b, format!("{n} random bytes at {at}"))
        }
    }
}

/// Offset of the first occurrence of `needle`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("present in the test model")
}

#[test]
fn mangled_gguf_files_are_refused_never_a_panic() {
    let src = std::fs::read(common::model_path(common::TINY)).expect("the test model");
    let dir = tempdir();
    load(&src, &dir, "the file itself").expect("the test model loads");
    let mut rng = StdRng::seed_from_u64(42);
    let mut refused = 0;
    for i in 0..cases() {
        let (bytes, what) = mutate(&mut rng, &src);
        refused += usize::from(load(&bytes, &dir, &format!("case {i}: {what}")).is_err());
    }
    // Most mutations must be caught, not merely survived.
    assert!(
        refused > cases() / 3,
        "only {refused} of {} refused",
        cases()
    );
}

#[test]
fn a_tensor_that_disagrees_with_the_metadata_is_refused_by_name() {
    let src = std::fs::read(common::model_path(common::TINY)).expect("the test model");
    let dir = tempdir();
    // The key query projection's first dimension (16 inputs) becomes 32:
    // its name, then u32 dimension count 2, then the u64 dimensions.
    let name = b"blk.0.attn_q.weight";
    let at = find(&src, name) + name.len() + 4;
    let mut bytes = src.clone();
    bytes[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
    let why = load(&bytes, &dir, "a wider attn_q").expect_err("refused");
    assert!(why.contains("blk.0.attn_q.weight"), "{why}");
    // An IQ2_XXS tensor (type 16), a type the engine does not read:
    // refused, naming the tensor and the type.
    let ty_at = at + 16;
    let mut bytes = src.clone();
    bytes[ty_at..ty_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let why = load(&bytes, &dir, "an IQ2_XXS tensor").expect_err("refused");
    assert!(
        why.contains("blk.0.attn_q.weight") && why.contains("IQ2_XXS"),
        "{why}"
    );
    // An alignment of zero.
    let key = b"general.alignment";
    if let Some(at) = src.windows(key.len()).position(|w| w == key) {
        let mut bytes = src.clone();
        let v = at + key.len() + 4;
        bytes[v..v + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(load(&bytes, &dir, "alignment 0").is_err());
    }
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "synor-gguf-fuzz-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
