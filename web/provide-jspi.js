// How the tab's engine waits for the page's GPU inside a step (imported by
// tab.js: the `tab` crate's `gpu` module). A browser maps a GPU buffer
// only from its event loop, so a read suspends the engine's WebAssembly
// on a promise (JSPI: `WebAssembly.Suspending`) that the mapping's end
// resolves, or 100 ms later, when the engine looks again. Where the
// browser has no JSPI, the page runs the CPU kernels and never calls
// these.

let resume = null;

function suspended() {
  return new Promise((r) => {
    resume = r;
    setTimeout(r, 100);
  });
}

export const synor_gpu_wait = typeof WebAssembly.Suspending === 'function'
  ? new WebAssembly.Suspending(suspended)
  : () => { throw new Error('this browser cannot suspend WebAssembly (no JSPI)'); };

export function synor_gpu_wake() {
  const r = resume;
  resume = null;
  r?.();
}
