//! `--config FILE` (or `SYNOR_CONFIG`): a deployment in one TOML file. Its
//! `[serve]` and `[worker]` tables hold the same options as the command
//! line, keyed by the flags' long names (`fleet-queue-timeout` or
//! `fleet_queue_timeout`); they are read through the same parser, so every
//! check and every error message is the command line's. A flag given on
//! the command line wins over the file, and the file over `SYNOR_*`
//! variables.
//!
//! ```toml
//! [serve]
//! bind = "0.0.0.0:8080"
//! model = "smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
//! max-num-seqs = 32
//! no-cache = true
//! extra-model = ["qwen=qwen3/qwen3-4b.gguf"]
//! ```

use std::ffi::OsString;
use std::path::Path;

/// The subcommands a file configures (its tables).
const TABLES: [&str; 2] = ["serve", "worker"];

/// `argv` with the options of the file `--config` (or `SYNOR_CONFIG`)
/// names inserted right after the subcommand, where the command line's
/// own flags, coming later, override them. Unchanged without a file.
pub fn expand(argv: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Some(sub) = argv.get(1).and_then(|s| s.to_str()).map(str::to_string) else {
        return Ok(argv);
    };
    if !TABLES.contains(&sub.as_str()) {
        return Ok(argv);
    }
    let path = config_path(&argv[2..]).or_else(|| std::env::var_os("SYNOR_CONFIG"));
    let Some(path) = path else {
        return Ok(argv);
    };
    let from_file = file_args(Path::new(&path), &sub)?;
    let mut out = argv[..2].to_vec();
    out.extend(from_file);
    out.extend(argv[2..].iter().cloned());
    Ok(out)
}

/// The value of `--config PATH` or `--config=PATH` among `args`.
fn config_path(args: &[OsString]) -> Option<OsString> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_str()?;
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(p.into());
        }
    }
    None
}

/// The `[sub]` table of the file at `path` as command-line arguments.
fn file_args(path: &Path, sub: &str) -> Result<Vec<OsString>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config {shown}: {e}"))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("--config {shown}: {}", e.message()))?;
    if let Some(other) = doc.keys().find(|k| !TABLES.contains(&k.as_str())) {
        return Err(format!(
            "--config {shown}: `{other}` is not a table this file holds (serve, worker)"
        ));
    }
    let Some(table) = doc.get(sub) else {
        return Ok(Vec::new());
    };
    let table = table
        .as_table()
        .ok_or_else(|| format!("--config {shown}: `{sub}` is not a table"))?;
    let mut out = Vec::new();
    for (key, value) in table {
        let flag = format!("--{}", key.replace('_', "-"));
        if flag == "--config" {
            return Err(format!("--config {shown}: a file cannot name another"));
        }
        flag_args(&flag, value, &mut out).map_err(|e| format!("--config {shown}: {e}"))?;
    }
    Ok(out)
}

/// `flag` with `value` as command-line arguments: a string, number or
/// date once, `true` as the bare flag (`false`: left out), an array as
/// the flag repeated.
fn flag_args(flag: &str, value: &toml::Value, out: &mut Vec<OsString>) -> Result<(), String> {
    use toml::Value as V;
    match value {
        V::Boolean(true) => out.push(flag.into()),
        V::Boolean(false) => {}
        V::String(s) => out.extend([flag.into(), s.into()]),
        V::Integer(n) => out.extend([flag.into(), n.to_string().into()]),
        V::Float(x) => out.extend([flag.into(), x.to_string().into()]),
        V::Datetime(d) => out.extend([flag.into(), d.to_string().into()]),
        V::Array(items) => {
            for item in items {
                if matches!(item, V::Array(_) | V::Table(_)) {
                    return Err(format!("`{flag}`: a list of plain values"));
                }
                flag_args(flag, item, out)?;
            }
        }
        V::Table(_) => return Err(format!("`{flag}`: a value, not a table")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::{Cli, Command, ServeArgs};

    fn file(text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!(
            "synor-config-{}-{}.toml",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::write(&path, text).expect("write");
        path
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn serve(args: Vec<OsString>) -> Result<ServeArgs, String> {
        let expanded = expand(args)?;
        let cli = Cli::try_parse_from(expanded).map_err(|e| e.to_string())?;
        let Command::Serve(s) = cli.command else {
            return Err("parsed as another command".into());
        };
        Ok(*s)
    }

    const DEPLOYMENT: &str = r#"
[serve]
bind = "127.0.0.1:9191"
max_num_seqs = 32
no-cache = true
spot-check-rate = 0.5
extra-model = ["a=x/a.gguf", "b=y/b.gguf"]

[worker]
region = "eu"
"#;

    #[test]
    fn a_file_sets_the_options_and_the_command_line_wins() {
        let path = file(DEPLOYMENT);
        let p = path.to_str().expect("utf-8");
        let s = serve(argv(&["synor", "serve", "--config", p])).expect("parses");
        assert_eq!(s.listen.bind.to_string(), "127.0.0.1:9191");
        assert_eq!(s.scheduler.max_num_seqs, 32);
        assert!(s.cache.no_cache);
        assert_eq!(s.spot.spot_check_rate, 0.5);
        assert_eq!(s.models.extra_models.len(), 2);
        let s = serve(argv(&[
            "synor",
            "serve",
            "--max-num-seqs",
            "4",
            &format!("--config={p}"),
        ]))
        .expect("parses");
        assert_eq!(s.scheduler.max_num_seqs, 4, "the command line wins");
        assert_eq!(s.listen.bind.to_string(), "127.0.0.1:9191");
    }

    #[test]
    fn a_bad_file_is_an_error_naming_the_file_and_the_option() {
        let bad_value = file("[serve]\nmax-num-seqs = 0\n");
        let err = serve(argv(&[
            "synor",
            "serve",
            "--config",
            bad_value.to_str().expect("path"),
        ]))
        .expect_err("out of range");
        assert!(err.contains("--max-num-seqs"), "{err}");
        let unknown = file("[serve]\nbogus-option = 1\n");
        let err = serve(argv(&[
            "synor",
            "serve",
            "--config",
            unknown.to_str().expect("path"),
        ]))
        .expect_err("unknown option");
        assert!(err.contains("--bogus-option"), "{err}");
        let table = file("[serve.fleet]\nx = 1\n");
        let err = serve(argv(&[
            "synor",
            "serve",
            "--config",
            table.to_str().expect("path"),
        ]))
        .expect_err("nested table");
        assert!(
            err.contains("--fleet") && err.contains("not a table"),
            "{err}"
        );
        let other = file("[server]\nbind = \"x\"\n");
        let p = other.to_str().expect("path");
        let err = serve(argv(&["synor", "serve", "--config", p])).expect_err("unknown table");
        assert!(err.contains(p) && err.contains("`server`"), "{err}");
        let err = serve(argv(&["synor", "serve", "--config", "/nonexistent.toml"]))
            .expect_err("missing file");
        assert!(err.contains("/nonexistent.toml"), "{err}");
    }

    #[test]
    fn other_subcommands_and_runs_without_a_file_are_left_alone() {
        let keys = argv(&["synor", "keys", "list"]);
        assert_eq!(expand(keys.clone()).expect("unchanged"), keys);
        let plain = argv(&["synor", "serve", "--no-cache"]);
        if std::env::var_os("SYNOR_CONFIG").is_none() {
            assert_eq!(expand(plain.clone()).expect("unchanged"), plain);
        }
    }
}
