//! `tab`: a browser tab as a provider's worker. The engine compiled to
//! WebAssembly (`wasm32-unknown-unknown`, through wasm-bindgen), behind
//! the small surface the `/provide` page's Web Worker drives: load a model
//! from bytes, the registration, each message from the server, engine
//! turns, heartbeats. The session itself (`session`) is plain Rust and is
//! tested natively; this file only carries strings and bytes across.

pub mod session;

use wasm_bindgen::prelude::*;

use session::{Identity, Session};

/// A tab's worker, as the page's script holds it.
#[wasm_bindgen]
pub struct TabWorker {
    session: Session,
    who: Identity,
}

/// Whether this tab can still allocate `bytes` (the browser bounds a
/// page's memory): asked before a model is fetched, so a tab that cannot
/// hold it refuses cleanly instead of failing halfway.
#[wasm_bindgen]
pub fn can_hold(bytes: f64) -> bool {
    let mut probe: Vec<u8> = Vec::new();
    bytes.is_finite() && bytes >= 0.0 && probe.try_reserve_exact(bytes as usize).is_ok()
}

#[wasm_bindgen]
impl TabWorker {
    /// Loads `weights` (a GGUF) as `model`, with `kv_bytes` of KV cache.
    #[wasm_bindgen(constructor)]
    pub fn new(
        model: &str,
        weights: &[u8],
        kv_bytes: f64,
        name: &str,
        region: &str,
        browser: &str,
        cores: u32,
    ) -> Result<TabWorker, JsError> {
        let session = Session::load(model, weights, kv_bytes.max(0.0) as usize)
            .map_err(|e| JsError::new(&e))?;
        let who = Identity {
            name: name.to_string(),
            region: region.to_string(),
            browser: browser.to_string(),
            cores,
        };
        Ok(TabWorker { session, who })
    }

    /// The first message to send.
    pub fn register(&mut self) -> String {
        text(&self.session.register(&self.who))
    }

    /// The messages to send after `message` from the server; an error
    /// means the server ended the session (its text says why).
    pub fn receive(&mut self, message: &str) -> Result<Vec<String>, JsError> {
        let reply = self.session.receive(message);
        match reply.close {
            Some(why) => Err(JsError::new(&why)),
            None => Ok(reply.send.iter().map(text).collect()),
        }
    }

    /// Whether jobs are running (call `turn` again).
    pub fn busy(&self) -> bool {
        self.session.busy()
    }

    /// One engine turn; the messages it produced.
    pub fn turn(&mut self) -> Vec<String> {
        self.session.turn().iter().map(text).collect()
    }

    /// The heartbeat.
    pub fn status(&mut self) -> String {
        text(&self.session.status())
    }

    /// This tab's own counts, as JSON.
    pub fn counts(&self) -> String {
        serde_json::to_string(self.session.counts()).unwrap_or_default()
    }

    /// The tab stops taking work: the message to send.
    pub fn leave(&mut self) -> String {
        text(&self.session.leave())
    }

    /// The socket closed: every job stops (the server replays them).
    pub fn lost(&mut self) {
        self.session.lost();
    }
}

fn text(msg: &protocol::FromWorker) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}
