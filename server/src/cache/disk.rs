//! L2: cached answers as files on the local disk, so they survive a
//! restart. A file is written to a temporary name, synced and renamed, so
//! a reader sees a whole file or none; each file carries a SHA-256 of its
//! payload, so a torn or corrupted file is detected, deleted and treated as
//! a miss. The total size is bounded: the least recently written files go
//! first. Entries older than the TTL are misses (and deleted).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use super::answer::CachedAnswer;

const MAGIC: &[u8; 8] = b"SYNORC01";

#[derive(Debug, Clone)]
struct FileInfo {
    size: u64,
    written: SystemTime,
    scope: String,
    model: String,
}

#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    max_bytes: u64,
    ttl: Duration,
    index: Mutex<(HashMap<String, FileInfo>, u64)>,
}

/// Encodes an answer: magic, payload length, SHA-256, JSON payload.
fn encode(a: &CachedAnswer) -> Vec<u8> {
    let payload = serde_json::to_vec(a).unwrap_or_default();
    let mut out = Vec::with_capacity(payload.len() + 48);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

/// Decodes a file; `None` if it is torn, corrupted or not ours.
fn decode(bytes: &[u8]) -> Option<CachedAnswer> {
    let body = bytes.strip_prefix(MAGIC.as_slice())?;
    let (len, rest) = body.split_at_checked(8)?;
    let len = u64::from_le_bytes(len.try_into().ok()?) as usize;
    let (sum, payload) = rest.split_at_checked(32)?;
    if payload.len() != len || Sha256::digest(payload)[..] != *sum {
        return None;
    }
    serde_json::from_slice(payload).ok()
}

impl DiskTier {
    /// Opens (and indexes) the cache folder, creating it if needed.
    pub fn open(dir: &Path, max_bytes: u64, ttl: Duration) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut index = HashMap::new();
        let mut total = 0;
        for e in std::fs::read_dir(dir)?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Ok(bytes) = std::fs::read(e.path()) else {
                continue;
            };
            let Some(a) = decode(&bytes) else {
                let _ = std::fs::remove_file(e.path());
                continue;
            };
            let written = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            total += bytes.len() as u64;
            index.insert(
                name,
                FileInfo {
                    size: bytes.len() as u64,
                    written,
                    scope: a.scope,
                    model: a.model,
                },
            );
        }
        let tier = Self {
            dir: dir.to_path_buf(),
            max_bytes,
            ttl,
            index: Mutex::new((index, total)),
        };
        tier.evict(0);
        Ok(tier)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<String, FileInfo>, u64)> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    pub fn bytes(&self) -> u64 {
        self.lock().1
    }

    pub fn len(&self) -> usize {
        self.lock().0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The answer under `key`, if present, whole and fresh.
    pub fn get(&self, key: &str) -> Option<CachedAnswer> {
        let info = self.lock().0.get(key).cloned()?;
        if info.written.elapsed().unwrap_or_default() > self.ttl {
            self.remove(key);
            return None;
        }
        let Some(a) = std::fs::read(self.path(key)).ok().and_then(|b| decode(&b)) else {
            tracing::warn!(key, "dropping a torn or corrupted disk cache entry");
            self.remove(key);
            return None;
        };
        Some(a)
    }

    /// Stores `a` under `key` (atomically); returns how many entries were
    /// evicted to make room.
    pub fn put(&self, key: &str, a: &CachedAnswer) -> std::io::Result<u64> {
        let bytes = encode(a);
        let tmp = self.dir.join(format!("{key}.{}.tmp", std::process::id()));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.path(key))?;
        let info = FileInfo {
            size: bytes.len() as u64,
            written: SystemTime::now(),
            scope: a.scope.clone(),
            model: a.model.clone(),
        };
        {
            let mut g = self.lock();
            if let Some(old) = g.0.insert(key.to_string(), info) {
                g.1 -= old.size;
            }
            g.1 += bytes.len() as u64;
        }
        Ok(self.evict(0))
    }

    fn remove(&self, key: &str) {
        let mut g = self.lock();
        if let Some(old) = g.0.remove(key) {
            g.1 -= old.size;
        }
        drop(g);
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Removes the oldest files until the total is within bounds (minus
    /// `room`); returns how many went.
    fn evict(&self, room: u64) -> u64 {
        let mut n = 0;
        loop {
            let victim = {
                let g = self.lock();
                if g.1 + room <= self.max_bytes {
                    return n;
                }
                g.0.iter()
                    .min_by_key(|(_, i)| i.written)
                    .map(|(k, _)| k.clone())
            };
            let Some(k) = victim else { return n };
            self.remove(&k);
            n += 1;
        }
    }

    /// Deletes the entries of `scope` and/or `model` (all if both `None`).
    pub fn flush(&self, scope: Option<&str>, model: Option<&str>) -> usize {
        let keys: Vec<String> = self
            .lock()
            .0
            .iter()
            .filter(|(_, i)| {
                scope.is_none_or(|s| s == i.scope) && model.is_none_or(|m| m == i.model)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            self.remove(k);
        }
        keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::answer::CachedChoice;

    fn answer(scope: &str, text: &str) -> CachedAnswer {
        CachedAnswer {
            scope: scope.into(),
            model: "m".into(),
            choices: vec![CachedChoice {
                text: text.into(),
                finish_reason: "stop".into(),
            }],
            prompt_tokens: 3,
            completion_tokens: 2,
            provider_id: "provider:house".into(),
            created_at: 0,
            prices: None,
        }
    }

    fn dir() -> PathBuf {
        std::env::temp_dir().join(format!("synor-l2-{}", uuid::Uuid::new_v4().simple()))
    }

    #[test]
    fn answers_survive_a_reopen_and_torn_files_are_misses() {
        let d = dir();
        let t = DiskTier::open(&d, 1 << 20, Duration::from_secs(60)).expect("open");
        t.put("k1", &answer("a", "Paris")).expect("put");
        t.put("k2", &answer("a", "Rome")).expect("put");
        drop(t);
        // A torn write: the file cut in the middle of its payload.
        let full = std::fs::read(d.join("k2")).expect("read");
        std::fs::write(d.join("k2"), &full[..full.len() - 3]).expect("tear");
        std::fs::write(d.join("k3.123.tmp"), b"half a write").expect("tmp");
        let t = DiskTier::open(&d, 1 << 20, Duration::from_secs(60)).expect("reopen");
        assert_eq!(
            t.get("k1").map(|a| a.choices[0].text.clone()),
            Some("Paris".into())
        );
        assert!(t.get("k2").is_none() && t.get("k3").is_none());
        assert_eq!(t.len(), 1);
        assert!(!d.join("k3.123.tmp").exists() && !d.join("k2").exists());
        // Corrupted after opening: detected on read.
        let mut bytes = std::fs::read(d.join("k1")).expect("read");
        let last = bytes.len() - 2;
        bytes[last] ^= 0x20;
        std::fs::write(d.join("k1"), bytes).expect("corrupt");
        assert!(t.get("k1").is_none());
        assert!(t.is_empty() && t.bytes() == 0);
    }

    #[test]
    fn the_size_bound_evicts_the_oldest_and_flush_is_scoped() {
        let d = dir();
        let one = encode(&answer("a", "x")).len() as u64;
        let t = DiskTier::open(&d, one * 3, Duration::from_secs(60)).expect("open");
        for i in 0..5 {
            t.put(
                &format!("k{i}"),
                &answer(if i % 2 == 0 { "a" } else { "b" }, "x"),
            )
            .expect("put");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(t.len(), 3);
        assert!(t.get("k0").is_none() && t.get("k4").is_some());
        assert!(t.bytes() <= one * 3);
        assert_eq!(t.flush(Some("a"), None), 2);
        assert_eq!(t.len(), 1);
        let short = DiskTier::open(&dir(), 1 << 20, Duration::ZERO).expect("open");
        short.put("k", &answer("a", "x")).expect("put");
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.get("k").is_none(), "expired");
    }
}
