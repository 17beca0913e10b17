// The browser worker's engine alone, under Node (V8, Chromium's engine):
// a 32-token prompt and 8 greedy tokens through the `tab` module's
// TabWorker, each engine turn timed (the first is the prefill). A
// benchmark, not a test; after `scripts/build-tab.sh`:
//
//     node loadtest/tab_engine_bench.mjs [model.gguf] [tab build dir ...]
//
// Several build directories (wasm-bindgen's output, default target/tab)
// are measured one after the other on the same model, for side-by-side
// comparisons of two builds.
import { readFileSync } from "fs";
import { resolve } from "path";
import { pathToFileURL } from "url";

const model = process.argv[2] ?? "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf";
const dirs = process.argv.length > 3 ? process.argv.slice(3) : ["target/tab"];
const bytes = readFileSync(model);
const p = {max_tokens:8,temperature:0,top_p:1,top_k:0,min_p:0,seed:1,ignore_eos:true,repetition_penalty:1,frequency_penalty:0,presence_penalty:0,logprobs:0};
const prompt = Array.from({length: 32}, (_, i) => 100 + i);
for (const dir of dirs) {
  const glue = await import(pathToFileURL(resolve(dir, "tab.js")).href);
  glue.initSync({ module: readFileSync(resolve(dir, "tab_bg.wasm")) });
  const w = new glue.TabWorker("m", bytes, 64e6, "n", "eu", "node", 2, "");
  w.register();
  w.receive(JSON.stringify({v:1,type:"assign",job:1,attempt:1,model:"m",prompt,resume:[],params:p}));
  let t = performance.now(), times = [], toks = [];
  while (w.busy()) { const out = w.turn(); const now = performance.now(); times.push(now - t); t = now; for (const s of out) { const m = JSON.parse(s); if (m.tokens) toks.push(m.tokens[0].id); } }
  const decode = times.slice(1).filter(x => x > 0.5).sort((a, b) => a - b);
  const median = decode[Math.floor(decode.length / 2)];
  console.log(`${dir}: prefill ${times[0].toFixed(0)} ms (${(32e3 / times[0]).toFixed(1)} tok/s), decode median ${median.toFixed(1)} ms/step (${(1e3 / median).toFixed(1)} tok/s), steps ms ${times.map(x => x.toFixed(0)).join(" ")}, tokens ${toks.join(",")}`);
}
