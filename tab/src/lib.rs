//! `tab`: a browser tab as a provider's worker. The engine compiled to
//! WebAssembly (`wasm32-unknown-unknown`, through wasm-bindgen), behind
//! the small surface the `/provide` page's Web Worker drives: load a model
//! from bytes, the registration, each message from the server, engine
//! turns, heartbeats. The session itself (`session`) is plain Rust and is
//! tested natively; this file only carries strings and bytes across.
//!
//! On the page's GPU (`gpu`), a turn waits for the GPU inside the step:
//! the page runs it through `synor_tab_turn`, a plain export it wraps in
//! `WebAssembly.promising`, then takes what it produced (`take_sent`).
//! While a turn is suspended the session is borrowed, and every other
//! call refuses with an error instead of touching it.

#[cfg(target_arch = "wasm32")]
pub mod gpu;
pub mod session;

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use wasm_bindgen::prelude::*;

use session::{Identity, On, Session};

/// A session and what its last promised turn produced.
struct Shared {
    session: RefCell<Session>,
    sent: RefCell<Vec<String>>,
}

thread_local! {
    /// Each worker's session by slot, for `synor_tab_turn`.
    static SLOTS: RefCell<Vec<Weak<Shared>>> = const { RefCell::new(Vec::new()) };
}

/// A tab's worker, as the page's script holds it.
#[wasm_bindgen]
pub struct TabWorker {
    shared: Rc<Shared>,
    slot: u32,
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
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(text: &str);
}

thread_local! {
    /// The last panic's message (a panic traps: the page asks for it).
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// On load: a panic is written to the console and kept for `last_panic`
/// (WebAssembly traps on it, and the page only sees "unreachable").
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        let text = info.to_string();
        console_error(&text);
        PANIC.with(|p| *p.borrow_mut() = Some(text));
    }));
}

/// What the engine's last panic said, if it panicked.
#[wasm_bindgen]
pub fn last_panic() -> Option<String> {
    PANIC.with(|p| p.borrow().clone())
}

fn busy_error() -> JsError {
    JsError::new("this tab's engine is in the middle of a step")
}

#[wasm_bindgen]
impl TabWorker {
    /// Loads `weights` (a GGUF) as `model`, with `kv_bytes` of KV cache;
    /// on the GPU `gpu::open_gpu` opened when `gpu` (its description) is
    /// not empty, else on the CPU.
    #[wasm_bindgen(constructor)]
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &str,
        weights: &[u8],
        kv_bytes: f64,
        name: &str,
        region: &str,
        browser: &str,
        cores: u32,
        gpu: &str,
    ) -> Result<TabWorker, JsError> {
        let on = match gpu {
            "" => On::Cpu,
            adapter => On::Gpu {
                adapter: adapter.to_string(),
            },
        };
        let session = Session::load(model, weights, kv_bytes.max(0.0) as usize, on)
            .map_err(|e| JsError::new(&e))?;
        let shared = Rc::new(Shared {
            session: RefCell::new(session),
            sent: RefCell::default(),
        });
        let slot = take_slot(&shared);
        let who = Identity {
            name: name.to_string(),
            region: region.to_string(),
            browser: browser.to_string(),
            cores,
        };
        Ok(TabWorker { shared, slot, who })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Session) -> T) -> Result<T, JsError> {
        let mut session = self
            .shared
            .session
            .try_borrow_mut()
            .map_err(|_| busy_error())?;
        Ok(f(&mut session))
    }

    /// This worker's slot, for `synor_tab_turn`.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The first message to send.
    pub fn register(&mut self) -> Result<String, JsError> {
        let who = &self.who;
        self.with(|s| text(&s.register(who)))
    }

    /// The messages to send after `message` from the server; an error
    /// means the server ended the session (its text says why).
    pub fn receive(&mut self, message: &str) -> Result<Vec<String>, JsError> {
        let reply = self.with(|s| s.receive(message))?;
        match reply.close {
            Some(why) => Err(JsError::new(&why)),
            None => Ok(reply.send.iter().map(text).collect()),
        }
    }

    /// Whether jobs are running (call `turn` again).
    pub fn busy(&self) -> bool {
        self.shared.session.try_borrow().map_or(true, |s| s.busy())
    }

    /// One engine turn on the CPU; the messages it produced.
    pub fn turn(&mut self) -> Result<Vec<String>, JsError> {
        self.with(|s| s.turn().iter().map(text).collect())
    }

    /// What the turns run through `synor_tab_turn` produced since the
    /// last call.
    pub fn take_sent(&mut self) -> Vec<String> {
        std::mem::take(&mut *self.shared.sent.borrow_mut())
    }

    /// The heartbeat.
    pub fn status(&mut self) -> Result<String, JsError> {
        self.with(|s| text(&s.status()))
    }

    /// This tab's own counts, as JSON.
    pub fn counts(&self) -> Result<String, JsError> {
        let s = self.shared.session.try_borrow().map_err(|_| busy_error())?;
        Ok(serde_json::to_string(s.counts()).unwrap_or_default())
    }

    /// The tab stops taking work: the message to send.
    pub fn leave(&mut self) -> Result<String, JsError> {
        self.with(|s| text(&s.leave()))
    }

    /// The socket closed: every job stops (the server replays them).
    pub fn lost(&mut self) -> Result<(), JsError> {
        self.with(Session::lost)
    }
}

/// A slot for `shared` (a free one, else a new one), for
/// `synor_tab_turn`.
fn take_slot(shared: &Rc<Shared>) -> u32 {
    SLOTS.with(|s| {
        let mut slots = s.borrow_mut();
        let weak = Rc::downgrade(shared);
        match slots.iter().position(|w| w.strong_count() == 0) {
            Some(i) => {
                slots[i] = weak;
                i as u32
            }
            None => {
                slots.push(weak);
                (slots.len() - 1) as u32
            }
        }
    })
}

/// One engine turn of the worker in `slot`, whose output `take_sent`
/// hands over: a plain export, so that the page can wrap it in
/// `WebAssembly.promising` and the GPU's reads can suspend it. 0: done;
/// 1: no such worker; 2: that worker is in the middle of a step.
#[allow(unsafe_code)] // an unmangled export: its name is the page's to call
#[unsafe(no_mangle)]
pub extern "C" fn synor_tab_turn(slot: u32) -> u32 {
    let Some(shared) = SLOTS.with(|s| s.borrow().get(slot as usize).and_then(Weak::upgrade)) else {
        return 1;
    };
    let Ok(mut session) = shared.session.try_borrow_mut() else {
        return 2;
    };
    let sent = session.turn();
    drop(session);
    shared.sent.borrow_mut().extend(sent.iter().map(text));
    0
}

fn text(msg: &protocol::FromWorker) -> String {
    serde_json::to_string(msg).unwrap_or_default()
}
