//! L3: cached answers in Redis, shared by every server replica. Optional
//! (configured by URL). Every call has a short timeout; when Redis fails,
//! the tier logs one warning, stays out of the way for a few seconds, and
//! reports a miss, so an outage degrades to L1/L2 and never fails a request.
//! Keys are `synor:c:<scope hash>:<model hash>:<key>` so a flush by scope
//! or model is a SCAN.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use super::answer::{CachedAnswer, short_hash};

/// How long one Redis call may take.
const TIMEOUT: Duration = Duration::from_millis(250);
/// How long to leave Redis alone after a failure.
const BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct RedisTier {
    client: redis::Client,
    ttl: Duration,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    down_until: Mutex<Option<Instant>>,
}

fn redis_key(scope: &str, model: &str, key: &str) -> String {
    format!("synor:c:{}:{}:{key}", short_hash(scope), short_hash(model))
}

impl RedisTier {
    pub fn new(url: &str, ttl: Duration) -> Result<Self, redis::RedisError> {
        Ok(Self {
            client: redis::Client::open(url)?,
            ttl,
            conn: tokio::sync::Mutex::new(None),
            down_until: Mutex::new(None),
        })
    }

    fn is_down(&self) -> bool {
        let g = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        g.is_some_and(|t| Instant::now() < t)
    }

    fn failed(&self, what: &str, e: &dyn std::fmt::Display) {
        let mut g = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none_or(|t| Instant::now() >= t) {
            tracing::warn!(error = %e, what, "redis cache unavailable; using L1/L2 for {BACKOFF:?}");
        }
        *g = Some(Instant::now() + BACKOFF);
    }

    /// A connection (made on first use, again after a failure).
    async fn conn(&self) -> Option<MultiplexedConnection> {
        if self.is_down() {
            return None;
        }
        let mut g = self.conn.lock().await;
        if g.is_none() {
            match tokio::time::timeout(TIMEOUT, self.client.get_multiplexed_async_connection())
                .await
            {
                Ok(Ok(c)) => *g = Some(c),
                Ok(Err(e)) => self.failed("connect", &e),
                Err(e) => self.failed("connect", &e),
            }
        }
        g.clone()
    }

    async fn forget_conn(&self) {
        *self.conn.lock().await = None;
    }

    /// The answer under this key, or `None` (also when Redis is down).
    pub async fn get(&self, scope: &str, model: &str, key: &str) -> Option<CachedAnswer> {
        let mut c = self.conn().await?;
        let k = redis_key(scope, model, key);
        match tokio::time::timeout(TIMEOUT, c.get::<_, Option<Vec<u8>>>(k)).await {
            Ok(Ok(bytes)) => bytes.and_then(|b| serde_json::from_slice(&b).ok()),
            Ok(Err(e)) => {
                self.failed("get", &e);
                self.forget_conn().await;
                None
            }
            Err(e) => {
                self.failed("get", &e);
                None
            }
        }
    }

    /// Stores an answer (best effort).
    pub async fn put(&self, key: &str, a: &CachedAnswer) {
        let Some(mut c) = self.conn().await else {
            return;
        };
        let k = redis_key(&a.scope, &a.model, key);
        let Ok(bytes) = serde_json::to_vec(a) else {
            return;
        };
        let ttl = self.ttl.as_secs().max(1);
        match tokio::time::timeout(TIMEOUT, c.set_ex::<_, _, ()>(k, bytes, ttl)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.failed("set", &e);
                self.forget_conn().await;
            }
            Err(e) => self.failed("set", &e),
        }
    }

    /// Deletes the entries of `scope` and/or `model`; returns how many.
    pub async fn flush(&self, scope: Option<&str>, model: Option<&str>) -> usize {
        let Some(mut c) = self.conn().await else {
            return 0;
        };
        let pattern = format!(
            "synor:c:{}:{}:*",
            scope.map_or("*".to_string(), short_hash),
            model.map_or("*".to_string(), short_hash)
        );
        let keys: Vec<String> = match tokio::time::timeout(Duration::from_secs(5), async {
            let mut it = c.scan_match::<_, String>(&pattern).await?;
            let mut keys = Vec::new();
            while let Some(k) = futures_util::StreamExt::next(&mut it).await {
                keys.push(k?);
            }
            Ok::<_, redis::RedisError>(keys)
        })
        .await
        {
            Ok(Ok(k)) => k,
            _ => return 0,
        };
        if !keys.is_empty() {
            let _: Result<(), _> = c.del(&keys).await;
        }
        keys.len()
    }
}
