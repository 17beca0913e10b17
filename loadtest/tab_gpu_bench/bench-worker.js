// The browser worker's engine alone, in Chromium: a prompt and greedy
// tokens through the `tab` module's TabWorker on the CPU kernels or on
// the browser's WebGPU adapter, each engine turn timed (the first is the
// prefill). Driven by loadtest/tab_gpu_bench.py.
import init, { TabWorker, open_gpu, last_panic } from './tab.js';

onmessage = async ({ data: c }) => {
  try {
    const wasm = await init();
    let gpu = '';
    if (c.device === 'webgpu') {
      await open_gpu();
      const i = (await navigator.gpu.requestAdapter()).info;
      gpu = `${i.vendor} ${i.architecture}`;
    }
    const bytes = new Uint8Array(await (await fetch(c.model)).arrayBuffer());
    const t0 = performance.now();
    const w = new TabWorker('m', bytes, 64e6, 'n', 'eu', 'bench', 1, gpu);
    const load = performance.now() - t0;
    w.register();
    const p = { max_tokens: c.tokens, temperature: 0, top_p: 1, top_k: 0, min_p: 0, seed: 1, ignore_eos: true,
      repetition_penalty: 1, frequency_penalty: 0, presence_penalty: 0, logprobs: 0 };
    const prompt = Array.from({ length: c.prompt }, (_, i) => 100 + i);
    w.receive(JSON.stringify({ v: 1, type: 'assign', job: 1, attempt: 1, model: 'm', prompt, resume: [], params: p }));
    const step = gpu ? WebAssembly.promising(wasm.synor_tab_turn) : null;
    const times = [];
    const tokens = [];
    while (w.busy()) {
      const t = performance.now();
      let out;
      if (step) {
        if (await step(w.slot()) !== 0) throw new Error('turn refused');
        out = w.take_sent();
      } else {
        out = w.turn();
      }
      times.push(performance.now() - t);
      for (const s of out) {
        const m = JSON.parse(s);
        if (m.tokens) tokens.push(...m.tokens.map((x) => x.id));
      }
    }
    postMessage({ device: gpu || 'cpu', load, times, tokens });
  } catch (e) {
    postMessage({ error: e instanceof WebAssembly.RuntimeError ? last_panic() ?? e.message : e.message ?? String(e) });
  }
};
