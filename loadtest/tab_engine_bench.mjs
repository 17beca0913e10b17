// The browser worker's engine alone, under Node (V8, Chromium's engine):
// a 32-token prompt and 8 greedy tokens through the `tab` module's
// TabWorker, each engine turn timed (the first is the prefill). A
// benchmark, not a test; after `scripts/build-tab.sh`:
//
//     node loadtest/tab_engine_bench.mjs [model.gguf]
import { readFileSync } from "fs";
import { initSync, TabWorker } from "../target/tab/tab.js";
initSync({ module: readFileSync(new URL("../target/tab/tab_bg.wasm", import.meta.url)) });
const w = new TabWorker("m", readFileSync(process.argv[2] ?? "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"), 64e6, "n", "eu", "node", 2);
w.register();
const p = {max_tokens:8,temperature:0,top_p:1,top_k:0,min_p:0,seed:1,ignore_eos:true,repetition_penalty:1,frequency_penalty:0,presence_penalty:0,logprobs:0};
const prompt = Array.from({length: 32}, (_, i) => 100 + i);
w.receive(JSON.stringify({v:1,type:"assign",job:1,attempt:1,model:"m",prompt,resume:[],params:p}));
let t = performance.now(), times = [], toks = [];
while (w.busy()) { const out = w.turn(); const now = performance.now(); times.push(now - t); t = now; for (const s of out) { const m = JSON.parse(s); if (m.tokens) toks.push(m.tokens[0].id); } }
console.log("step ms", times.map(x => x.toFixed(0)).join(" "), "tokens", toks.join(","));
