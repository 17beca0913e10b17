//! The HTTP listener: the router served by hyper with the limits a public
//! server needs. A client must send a request's headers within a deadline
//! (slow-header connections are closed, also when they sit idle between
//! keep-alive requests); each client address may hold a bounded number of
//! connections, and one over the cap is answered 503 and closed. On `stop`
//! it stops accepting and lets open connections finish, for a bounded
//! time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// The listener's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time a client has to send a request's headers, from connecting or
    /// from the end of its previous response.
    pub header_timeout: Duration,
    /// Open connections one client address may hold.
    pub max_per_client: usize,
}

/// Open connections per client address.
#[derive(Debug, Default)]
struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// One connection's place in `Clients`, given back on drop.
struct Slot {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Clients {
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut open = self.lock();
        let n = open.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.clients.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` until `stop` resolves, then stops accepting
/// and gives the open connections `linger` to finish their last answer.
///
/// HTTP/1.1 only: hyper times out an HTTP/1 connection that is slow to
/// send headers or idle between requests, but has no idle deadline for an
/// HTTP/2 connection that answers pings (so h2c is not offered).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
    linger: Duration,
) {
    let clients = Arc::new(Clients::default());
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Small writes go out at once: a worker's stage step is frames
        // and then a short message, which Nagle's algorithm would hold
        // for the peer's delayed ACK (40 ms a hop).
        let _ = stream.set_nodelay(true);
        let Some(slot) = clients.take(peer.ip(), limits.max_per_client) else {
            tracing::debug!(%peer, "too many connections from this client");
            tokio::spawn(refuse(stream));
            continue;
        };
        let svc = app
            .clone()
            .map_request(move |mut r: axum::extract::Request<_>| {
                r.extensions_mut().insert(ConnectInfo(peer));
                r
            });
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let first_byte = limits.header_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            // hyper's header deadline starts with the first byte: a client
            // that sends nothing at all is closed here.
            let mut probe = [0u8; 1];
            match tokio::time::timeout(first_byte, stream.peek(&mut probe)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(svc),
            );
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(linger, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?linger,
            "connections still open after the drain; closing them"
        );
    }
}

/// Answers a connection over the per-client cap and closes it.
async fn refuse(mut stream: TcpStream) {
    let body = r#"{"error":{"message":"too many connections from this address","type":"server_error","param":null,"code":"too_many_connections"}}"#;
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_cap_and_slots_come_back_on_drop() {
        let clients = Arc::new(Clients::default());
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let held: Vec<Slot> = (0..3).map(|_| clients.take(a, 3).expect("slot")).collect();
        assert!(clients.take(a, 3).is_none(), "a fourth is refused");
        assert!(clients.take(b, 3).is_some(), "another address is not");
        drop(held);
        assert!(clients.take(a, 3).is_some());
        assert!(clients.lock().is_empty(), "nothing left behind");
    }
}
