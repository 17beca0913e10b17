//! A real `synor serve` process on a free port, with the tiny fixture
//! model and its own ledger and cache, killed on drop.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TINY: &str = "tiny";

/// A fixture model under the models directory (`SYNOR_MODELS_DIR`, else
/// the repository's `models/`).
fn model_path(rel: &str) -> PathBuf {
    let dir = std::env::var_os("SYNOR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"));
    let p = dir.join(rel);
    assert!(
        p.exists(),
        "{} is missing: run `make models` first",
        p.display()
    );
    p
}

/// A real `synor serve` process on a free port, killed on drop.
pub struct Synor {
    pub base: String,
    child: Child,
}

impl Synor {
    /// Starts the binary with the tiny model and no embedding model.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// `start`, with extra `serve` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_synor"))
            .args([
                "serve",
                "--open",
                "--bind",
                "127.0.0.1:0",
                "--embedding-model",
                "none",
                "--served-model-name",
                TINY,
            ])
            .arg("--model")
            .arg(model_path("tiny/tiny.gguf"))
            // Each server its own ledger and cache, outside the source tree.
            .args(own_data_dir())
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn synor");
        let mut synor = Self {
            base: String::new(),
            child,
        };
        let stdout = synor.child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(
                Instant::now() < deadline,
                "synor did not report its address"
            );
            let line = lines
                .next()
                .expect("synor exited before listening")
                .expect("read stdout");
            if let Some(url) = line.split("listening on ").nth(1) {
                synor.base = url.trim().to_string();
                return synor;
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "synor did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Synor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--database-url` and `--cache-dir` in a fresh temporary folder.
fn own_data_dir() -> [String; 4] {
    let dir = std::env::temp_dir().join(format!("synor-test-{}", uuid_like()));
    [
        "--database-url".into(),
        format!("sqlite://{}/ledger.db", dir.display()),
        "--cache-dir".into(),
        dir.join("cache").display().to_string(),
    ]
}

/// A unique-enough name without another dependency.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{t}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
