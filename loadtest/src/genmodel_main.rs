//! `synor-genmodel`: writes a benchmark model of a realistic shape with
//! random weights (see `loadtest::genmodel`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use loadtest::genmodel::{Quant, SHAPES, generate, shape};

#[derive(Parser)]
#[command(about = "Writes a GGUF model of a realistic shape with random weights")]
struct Args {
    /// llama-1b, llama-3b, qwen2-0.5b, qwen3-4b or qwen3-30b-a3b (`all`:
    /// every dense one), or a parity shape (parity-llama, parity-llama3,
    /// parity-qwen3, parity-qwen3moe, parity-mixtral, parity-gemma3: the
    /// small models of the parity tests).
    #[arg(long, default_value = "llama-1b")]
    shape: String,
    /// q4_0 or q4_k_m, or every matrix in one type: f32, f16, bf16, q4_1,
    /// q8_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k.
    #[arg(long, default_value = "q4_0")]
    quant: Quant,
    /// The GGUF whose tokenizer the model gets.
    #[arg(long, env = "SYNOR_GENMODEL_TOKENIZER")]
    tokenizer: Option<PathBuf>,
    /// Where the files go (`<shape>.<quant>.gguf`).
    #[arg(long, default_value = "models/bench")]
    out_dir: PathBuf,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Fewer layers than the shape has (a model too large for the
    /// machine's memory, at its real width): the file is
    /// `<shape>-<N>l.<quant>.gguf`.
    #[arg(long)]
    layers: Option<usize>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let models =
        std::env::var_os("SYNOR_MODELS_DIR").map_or_else(|| PathBuf::from("models"), PathBuf::from);
    let tokenizer = a
        .tokenizer
        .unwrap_or_else(|| models.join("smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let shapes = match a.shape.as_str() {
        "all" => SHAPES.into_iter().filter(|s| s.experts.is_none()).collect(),
        name => vec![shape(name)?],
    };
    std::fs::create_dir_all(&a.out_dir)?;
    for mut s in shapes {
        let stem = match a.layers {
            Some(n) if n != s.layers && n > 0 => {
                s.layers = n;
                format!("{}-{n}l", s.name)
            }
            Some(_) | None => s.name.to_string(),
        };
        let out = a.out_dir.join(format!("{stem}.{}.gguf", a.quant.as_str()));
        let t = std::time::Instant::now();
        generate(&s, a.quant, &tokenizer, &out, a.seed)?;
        let mb = std::fs::metadata(&out)?.len() as f64 / 1e6;
        println!(
            "{} ({mb:.0} MB) in {:.1} s",
            out.display(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
