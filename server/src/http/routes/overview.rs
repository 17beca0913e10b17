//! `GET /admin/overview` (the console's overview: the current sample and
//! the last hour) and `GET /admin/overview/stream` (the same, then every
//! sample as it is taken, as Server-Sent Events). A stream opened with a
//! console session ends when the session does.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::http::auth::console::SessionCheck;
use crate::http::sampler::OverviewAnswer;
use crate::http::state::AppState;

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/overview", get(overview))
        .route("/admin/overview/stream", get(stream_overview))
}

/// The platform now (rates and percentiles over the last ten seconds) and
/// one sample per ten seconds over the last hour.
#[utoipa::path(get, path = "/admin/overview", tag = "admin",
    responses((status = 200, description = "Now and the last hour", body = OverviewAnswer), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn overview(State(state): State<AppState>) -> Json<OverviewAnswer> {
    Json(state.overview.answer(&state.overview_sources()))
}

/// One Server-Sent Event of the overview stream: `event` is `overview`
/// (then `data` is an `OverviewAnswer`), `sample` (a `Sample`) or `ended`
/// (`{"reason"}`: the console session ended), `data` its JSON.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct OverviewEvent {
    pub event: String,
    pub data: String,
}

/// Server-Sent Events: `overview` (the body of `GET /admin/overview`),
/// then a `sample` (a `Sample`) every second; samples with `point: true`
/// are also the history's. A console session's stream ends when the
/// session expires or signs out, with an `ended` event.
#[utoipa::path(get, path = "/admin/overview/stream", tag = "admin",
    responses((status = 200, description = "An event stream of `overview`, then `sample`s", content_type = "text/event-stream", body = OverviewEvent), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn stream_overview(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Subscribed before the history is read: no point falls between.
    let rx = state.overview.subscribe();
    let first = state.overview.answer(&state.overview_sources());
    let session = matches!(
        state.auth.console.check(&Method::GET, &headers),
        SessionCheck::Ok
    );
    let stream = Feed {
        first: Some(first),
        rx,
        state,
        headers,
        session,
        done: false,
    };
    let events = stream::unfold(stream, |mut f| async move {
        let ev = f.next().await?;
        Some((ev, f))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// How often a stream without samples (a stalled sampler) still checks
/// its session.
const SESSION_CHECK: Duration = Duration::from_secs(2);

/// One subscriber's stream.
struct Feed {
    first: Option<OverviewAnswer>,
    rx: broadcast::Receiver<crate::http::sampler::Sample>,
    state: AppState,
    headers: HeaderMap,
    /// Opened with a console session: it ends with the session.
    session: bool,
    done: bool,
}

impl Feed {
    async fn next(&mut self) -> Option<Result<Event, Infallible>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(json_event("overview", &first));
        }
        loop {
            let got = tokio::time::timeout(SESSION_CHECK, self.rx.recv()).await;
            if self.session && !self.live() {
                self.done = true;
                let why = serde_json::json!({"reason": "the console session ended"});
                return Some(json_event("ended", &why));
            }
            match got {
                Ok(Ok(sample)) => return Some(json_event("sample", &sample)),
                Ok(Err(RecvError::Lagged(_))) | Err(_) => continue,
                Ok(Err(RecvError::Closed)) => return None,
            }
        }
    }

    fn live(&self) -> bool {
        matches!(
            self.state.auth.console.check(&Method::GET, &self.headers),
            SessionCheck::Ok
        )
    }
}

fn json_event<T: serde::Serialize>(name: &str, value: &T) -> Result<Event, Infallible> {
    Ok(Event::default()
        .event(name)
        .data(crate::http::api::stream::to_json(value)))
}
