//! The fleet over HTTP: the gateway where provider workers connect
//! (`GET /v1/providers/connect`, a WebSocket authenticated by a worker
//! token; a provider's money is `routes::earnings`) and the admin view:
//! `GET /admin/fleet` (asks in units), `POST /admin/fleet/{id}/pause` and
//! `/resume`, `DELETE /admin/fleet/{id}` to send one away. The socket is adapted here to the
//! socket-free session in `fleet::session`, through bounded channels.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::market::billing;
use crate::fleet::registry::{Paused, pause_step};
use crate::fleet::session::{self, Inbound, Outbound, Peer};
use crate::http::api::bodies::{List, WorkerChange};
use crate::http::api::workers::WorkerView;
use crate::http::auth::bearer;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use protocol::{HEADER, MAX_PAYLOAD};

/// How often workers report their load.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Frames queued each way between the socket and the session.
const QUEUE: usize = 16;

pub fn router() -> Router<AppState> {
    Router::new().route("/v1/providers/connect", get(connect))
}

/// The subprotocol a browser asks for: a page cannot set `Authorization`
/// on a WebSocket, so a tab offers `synor.worker.v1` and its token as a
/// second protocol, `bearer.<token>` (never in the URL, where logs and
/// history keep it). The server answers with `synor.worker.v1` alone.
pub const TAB_PROTOCOL: &str = "synor.worker.v1";

/// The worker token a browser offered among its WebSocket subprotocols
/// beside `TAB_PROTOCOL`.
fn offered_token(headers: &HeaderMap) -> Option<&str> {
    let offered: Vec<&str> = headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    offered
        .contains(&TAB_PROTOCOL)
        .then(|| offered.iter().find_map(|p| p.strip_prefix("bearer.")))
        .flatten()
        .filter(|t| !t.is_empty())
}

/// The active worker token in `Authorization: Bearer` (401 otherwise).
pub(crate) async fn worker_token(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<money::store::workers::WorkerToken, ApiError> {
    let secret = bearer(headers).ok_or(ApiError::Unauthorized(
        "no worker token: send Authorization: Bearer <token>",
    ))?;
    find_worker_token(state, secret).await
}

/// The active worker token whose secret is `secret` (401 otherwise).
async fn find_worker_token(
    state: &AppState,
    secret: &str,
) -> Result<money::store::workers::WorkerToken, ApiError> {
    billing(state)?
        .ledger
        .db
        .find_worker_token(secret)
        .await
        .map_err(|e| ApiError::Storage(e.to_string()))?
        .ok_or(ApiError::Unauthorized("incorrect or revoked worker token"))
}

pub fn admin_router() -> Router<AppState> {
    Router::new()
        .route("/admin/fleet", get(list))
        .route("/admin/fleet/utilization", get(utilization))
        .route("/admin/fleet/{id}", delete(drain))
        .route("/admin/fleet/{id}/pause", post(pause))
        .route("/admin/fleet/{id}/resume", post(resume))
        .route("/admin/spotchecks", get(spot_checks))
}

/// The gateway: a worker token in `Authorization: Bearer` (or, from a
/// browser, offered as the subprotocol `bearer.<token>` beside
/// `synor.worker.v1`), then a WebSocket speaking the worker protocol
/// (`docs/fleet-protocol.md`).
#[utoipa::path(get, path = "/v1/providers/connect", tag = "providers",
    responses((status = 101, description = "Switching to the worker protocol"), (status = 401, description = "Missing, wrong or revoked worker token", body = crate::http::error::ErrorResponse), (status = 400, description = "Not a WebSocket upgrade", body = crate::http::error::ErrorResponse)),
    security(("worker_token" = [])))]
pub(crate) async fn connect(
    State(state): State<AppState>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let token = match (bearer(&headers), offered_token(&headers)) {
        (None, Some(secret)) => find_worker_token(&state, secret).await?,
        _ => worker_token(&state, &headers).await?,
    };
    if token.quarantined_at.is_some() {
        return Err(ApiError::Unauthorized(
            "this worker token is quarantined: a check caught its work (an admin can clear it)",
        ));
    }
    let ws = ws.map_err(|e| ApiError::invalid("upgrade", e.body_text()))?;
    let peer = Peer {
        provider_id: token.account_id,
        token_id: token.id,
        remote: peer.map_or_else(
            || "unknown".into(),
            |Extension(ConnectInfo(a))| a.to_string(),
        ),
    };
    let registry = state.fleet.clone();
    Ok(ws
        .protocols([TAB_PROTOCOL])
        .max_message_size(HEADER + MAX_PAYLOAD)
        .max_frame_size(HEADER + MAX_PAYLOAD)
        .on_upgrade(move |socket| pump(socket, registry, peer)))
}

/// Moves frames between the socket and the session until either ends.
async fn pump(
    socket: WebSocket,
    registry: std::sync::Arc<crate::fleet::registry::Registry>,
    peer: Peer,
) {
    let (mut sink, mut stream) = socket.split();
    let (to_session, inbound) = mpsc::channel(QUEUE);
    let (outbound, mut from_session) = mpsc::channel(QUEUE);
    let session = tokio::spawn(session::run(registry, peer, inbound, outbound, HEARTBEAT));
    // The link's round trip, for the cost of moving KV: a ping every
    // heartbeat, its payload the microseconds since `epoch`.
    let epoch = std::time::Instant::now();
    let writer = async move {
        // The first ping after a heartbeat: the welcome goes first.
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
        loop {
            let msg = tokio::select! {
                out = from_session.recv() => match out {
                    Some(Outbound::Text(t)) => Message::Text(t.into()),
                    Some(Outbound::Binary(b)) => Message::Binary(b.into()),
                    Some(Outbound::Close(code, reason)) => Message::Close(Some(CloseFrame {
                        code,
                        reason: reason.into(),
                    })),
                    None => break,
                },
                _ = ping.tick() => {
                    let at = epoch.elapsed().as_micros() as u64;
                    Message::Ping(at.to_le_bytes().to_vec().into())
                }
            };
            let last = matches!(msg, Message::Close(_));
            if sink.send(msg).await.is_err() || last {
                break;
            }
        }
        let _ = sink.close().await;
    };
    let reader = async move {
        while let Some(frame) = stream.next().await {
            let inbound = match frame {
                Ok(Message::Text(t)) => Inbound::Text(t.to_string()),
                Ok(Message::Binary(b)) => Inbound::Binary(b.to_vec()),
                Ok(Message::Pong(p)) => match pong_rtt(&p, epoch) {
                    Some(rtt) => Inbound::Pong(rtt),
                    None => continue,
                },
                Ok(Message::Ping(_)) => continue,
                Ok(Message::Close(_)) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "worker socket error");
                    break;
                }
            };
            // Back-pressure: a worker that floods waits for the session.
            if to_session.send(inbound).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = writer => {}
        () = reader => {}
    }
    // Both channel ends are gone: the session ends at once; a stuck one
    // is aborted (it leaves the registry either way).
    let abort = session.abort_handle();
    if tokio::time::timeout(Duration::from_secs(5), session)
        .await
        .is_err()
    {
        abort.abort();
    }
}

/// The round trip a pong says (its payload: when the ping left, in
/// microseconds since `epoch`); `None` for a pong that is not ours.
fn pong_rtt(payload: &[u8], epoch: std::time::Instant) -> Option<Duration> {
    let at = u64::from_le_bytes(payload.try_into().ok()?);
    let now = epoch.elapsed().as_micros() as u64;
    now.checked_sub(at).map(Duration::from_micros)
}

/// The workers connected to this server.
#[utoipa::path(get, path = "/admin/fleet", tag = "admin",
    responses((status = 200, description = "Every connected worker", body = List<WorkerView>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn list(State(state): State<AppState>) -> Json<List<WorkerView>> {
    Json(List::of(
        state
            .fleet
            .list()
            .into_iter()
            .map(WorkerView::from)
            .collect(),
    ))
}

/// How busy each executor (`house`, or a worker id) has been for this
/// server: the share of the last minute and five minutes with at least
/// one choice running on it, and the trend (the last minute less the one
/// before).
#[utoipa::path(get, path = "/admin/fleet/utilization", tag = "admin",
    responses((status = 200, description = "Per executor", body = List<crate::services::dispatch::utilization::ExecutorUse>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn utilization(
    State(state): State<AppState>,
) -> Json<List<crate::services::dispatch::utilization::ExecutorUse>> {
    Json(List::of(state.dispatch.stats.utilization.report()))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct RemoveQuery {
    /// Remove it now instead of draining: its connection is closed, its
    /// running work replayed elsewhere, and it does not reconnect by
    /// itself (revoke its token to bar it).
    now: Option<bool>,
}

/// Each worker's spot-check record (canaries included): checks judged,
/// passed and failed, and why the last failure failed.
#[utoipa::path(get, path = "/admin/spotchecks", tag = "admin",
    responses((status = 200, description = "Per worker", body = List<crate::services::spotcheck::WorkerChecks>), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn spot_checks(
    State(state): State<AppState>,
) -> Json<List<crate::services::spotcheck::WorkerChecks>> {
    Json(List::of(state.dispatch.spot.checker().records()))
}

/// Removes a worker: it takes no new work, finishes what it runs and
/// leaves (its process exits). A worker connected to another replica is
/// told through the fleet bus. With `now=true`, removes it at once (a
/// worker of this replica). To stop giving it work without sending it
/// away, pause it.
#[utoipa::path(delete, path = "/admin/fleet/{id}", tag = "admin",
    params(("id" = String, Path, description = "The worker's id"), RemoveQuery),
    responses((status = 200, description = "Draining, or removed", body = WorkerChange), (status = 404, description = "No such worker", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn drain(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> Result<Json<WorkerChange>, ApiError> {
    if q.now == Some(true) {
        if !state.fleet.close(&id, "removed by an admin").await {
            return Err(ApiError::NotFound { what: "worker", id });
        }
        return Ok(Json(WorkerChange {
            id,
            state: "removed".into(),
        }));
    }
    let here = state.fleet.drain(&id, true);
    let elsewhere = !here
        && state.fleet.list().iter().any(|w| w.id == id)
        && state
            .fleet
            .send(
                &id,
                protocol::ToWorker::Drain {
                    v: protocol::VERSION,
                },
            )
            .await;
    if !here && !elsewhere {
        return Err(ApiError::NotFound { what: "worker", id });
    }
    Ok(Json(WorkerChange {
        id,
        state: "draining".into(),
    }))
}

/// Pauses a worker: it gets no new work, finishes what it runs and stays
/// connected (its terminal says so) until resumed. Only an active or
/// calibrating worker pauses (409 otherwise).
#[utoipa::path(post, path = "/admin/fleet/{id}/pause", tag = "admin",
    params(("id" = String, Path, description = "The worker's id")),
    responses((status = 200, description = "Paused", body = WorkerChange), (status = 404, description = "No such worker", body = crate::http::error::ErrorResponse), (status = 409, description = "Its state does not allow it", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkerChange>, ApiError> {
    set_paused(&state, id, true).await
}

/// Resumes a paused worker: it takes work again (after calibration if it
/// was never measured). 409 for a worker that is not paused.
#[utoipa::path(post, path = "/admin/fleet/{id}/resume", tag = "admin",
    params(("id" = String, Path, description = "The worker's id")),
    responses((status = 200, description = "Resumed", body = WorkerChange), (status = 404, description = "No such worker", body = crate::http::error::ErrorResponse), (status = 409, description = "It is not paused", body = crate::http::error::ErrorResponse), (status = 401, description = "Missing or wrong admin token", body = crate::http::error::ErrorResponse)),
    security(("admin_token" = [])))]
pub(crate) async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkerChange>, ApiError> {
    set_paused(&state, id, false).await
}

/// Pauses or resumes a worker of this replica, or of another through the
/// fleet bus (its state there is checked against the last announcement).
async fn set_paused(
    state: &AppState,
    id: String,
    paused: bool,
) -> Result<Json<WorkerChange>, ApiError> {
    let refused = |now: String| {
        let verb = if paused { "pause" } else { "resume" };
        ApiError::Conflict(format!("worker `{id}` is {now}: an admin cannot {verb} it"))
    };
    match state.fleet.pause(&id, paused) {
        Paused::Now(now) => return Ok(Json(WorkerChange { id, state: now })),
        Paused::Refused(now) => return Err(refused(now)),
        Paused::Unknown => {}
    }
    let Some(w) = state.fleet.list().into_iter().find(|w| w.id == id) else {
        return Err(ApiError::NotFound { what: "worker", id });
    };
    let Some(next) = pause_step(&w, paused) else {
        return Err(refused(w.state));
    };
    let msg = protocol::ToWorker::Pause {
        v: protocol::VERSION,
        paused,
    };
    if !state.fleet.send(&id, msg).await {
        return Err(ApiError::NotFound { what: "worker", id });
    }
    Ok(Json(WorkerChange {
        id,
        state: next.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(values: &[&str]) -> Option<String> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                axum::http::header::SEC_WEBSOCKET_PROTOCOL,
                v.parse().expect("value"),
            );
        }
        offered_token(&h).map(str::to_string)
    }

    #[test]
    fn a_browser_offers_its_token_beside_the_worker_protocol_and_nowhere_else() {
        let t = "swt-synor-abc123";
        assert_eq!(
            offered(&[&format!("synor.worker.v1, bearer.{t}")]).as_deref(),
            Some(t)
        );
        assert_eq!(
            offered(&["synor.worker.v1", &format!("bearer.{t}")]).as_deref(),
            Some(t)
        );
        // Without the worker protocol, or without a token, there is none.
        assert_eq!(offered(&[&format!("bearer.{t}")]), None);
        assert_eq!(offered(&["synor.worker.v1"]), None);
        assert_eq!(offered(&["synor.worker.v1, bearer."]), None);
        assert_eq!(offered(&[]), None);
        assert_eq!(offered(&[&format!("chat, {t}")]), None);
    }
}
