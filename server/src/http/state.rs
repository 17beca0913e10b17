//! `AppState`: what every handler can reach, typed: the served models,
//! access policy, metering, the response cache and the drain flag. The
//! HTTP layer's composition root: it holds services, services never see it.

use std::sync::Arc;

use engine::registry::{ModelLoader, ModelRegistry};

/// Shared handler state.
#[derive(Debug, Clone)]
pub struct AppState {
    pub models: Arc<ModelRegistry>,
    /// HTTP request counts for `/metrics`.
    pub http: Arc<crate::http::metrics::HttpMetrics>,
    /// API keys, limits and the admin token.
    pub auth: Arc<crate::http::auth::Auth>,
    /// Loads models added through the admin API.
    pub loader: Arc<ModelLoader>,
    /// Metering, the ledger and the market (`None`: requests are not
    /// metered, as in router tests that do not need it).
    pub billing: Option<Arc<crate::services::metering::Billing>>,
    /// The response cache (`None`: off).
    pub cache: Option<Arc<crate::cache::ResponseCache>>,
    /// What a cache hit costs, as a fraction of the generated price (bps).
    pub cache_price_bps: i64,
    /// Set at shutdown: `/health` and `/ready` answer 503 and new API
    /// requests are refused while running ones finish.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The provider workers connected to this server.
    pub fleet: Arc<crate::fleet::registry::Registry>,
    /// Placement of choices on the house engine or on workers.
    pub dispatch: Arc<crate::services::dispatch::Dispatch>,
    /// The console's overview: samples of the last hour.
    pub overview: Arc<crate::http::sampler::Overview>,
    /// The request series of every generation, by model and executor.
    pub served: Arc<crate::services::served::Served>,
}

impl AppState {
    /// Open mode: no keys needed.
    pub fn new(models: Arc<ModelRegistry>) -> Self {
        Self::with_auth(models, crate::http::auth::Auth::open())
    }

    pub fn with_auth(models: Arc<ModelRegistry>, auth: crate::http::auth::Auth) -> Self {
        let fleet: Arc<crate::fleet::registry::Registry> = Arc::default();
        Self {
            models,
            http: Arc::default(),
            auth: Arc::new(auth),
            loader: Arc::default(),
            billing: None,
            cache: None,
            cache_price_bps: 1_000,
            draining: Arc::default(),
            fleet: fleet.clone(),
            dispatch: Arc::new(crate::services::dispatch::Dispatch::new(
                fleet,
                Default::default(),
                None,
            )),
            overview: Arc::default(),
            served: Arc::default(),
        }
    }

    /// The generation service over this state's models, limits, meter
    /// and cache (handles: cheap to build per request).
    pub fn generation(&self) -> crate::services::generation::Generation {
        crate::services::generation::Generation {
            models: self.models.clone(),
            limiter: self.auth.limiter.clone(),
            billing: self.billing.clone(),
            caching: self
                .cache
                .clone()
                .map(|cache| crate::services::caching::ResponseCaching {
                    cache,
                    models: self.models.clone(),
                    price_bps: self.cache_price_bps,
                    dispatch: Some(self.dispatch.clone()),
                }),
            dispatch: Some(self.dispatch.clone()),
            served: self.served.clone(),
        }
    }

    /// What the overview's sampler reads.
    pub fn overview_sources(&self) -> crate::http::sampler::Sources {
        crate::http::sampler::Sources {
            models: self.models.clone(),
            http: self.http.clone(),
            fleet: self.fleet.clone(),
            cache: self.cache.clone(),
            dispatch: self.dispatch.clone(),
            served: self.served.clone(),
            store: self.billing.as_ref().map(|b| b.ledger.db.clone()),
        }
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn with_cache(mut self, cache: Arc<crate::cache::ResponseCache>, price_bps: i64) -> Self {
        self.cache = Some(cache);
        self.cache_price_bps = price_bps;
        self
    }

    pub fn with_billing(mut self, billing: Arc<crate::services::metering::Billing>) -> Self {
        self.billing = Some(billing);
        self
    }

    pub fn with_loader(mut self, loader: ModelLoader) -> Self {
        self.loader = Arc::new(loader);
        self
    }
}
