// Runs a WebAssembly test binary built for wasm32-wasip1 under Node's WASI
// (cargo's runner for that target, set by scripts/test-wasm.sh): the
// kernels' tests on the browser worker's SIMD128 code. Arguments after the
// file go to the binary (libtest's filters and flags); its exit code is
// this process's.
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';

const [file, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: 'preview1',
  args: [file, ...args],
  env: process.env,
  preopens: { '.': '.' },
  returnOnExit: true,
});
// Each WASI call goes through a plain JS function: Node 20 crashed
// (SIGSEGV in V8) when a long test binary called the imports directly.
const imports = wasi.getImportObject();
const calls = imports.wasi_snapshot_preview1;
for (const [name, call] of Object.entries(calls)) {
  calls[name] = (...a) => call(...a);
}
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, imports);
process.exitCode = wasi.start(instance);
