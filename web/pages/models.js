// The models page: the served models with their engines' state (from
// /health), the model files in the models directory (load one with a
// click: a loaded model is kept across restarts), unloading one.

import { call, health, rows } from '../api.js';
import { action, badge, bytes, card, fill, flash, form, h, num, pct, placeholder, table } from '../ui.js';

const text = (m) => m.kind === 'text';
const ifText = (f) => (m) => (text(m) ? f(m) : '–');

function modelsTable(models, refresh) {
  return table([
    { label: 'Model', cell: (m) => h('strong', {}, m.id) },
    { label: 'Kind', cell: (m) => m.kind },
    { label: 'Running', num: true, cell: ifText((m) => num(m.running)) },
    { label: 'Waiting', num: true, cell: ifText((m) => num(m.waiting)) },
    { label: 'KV use', num: true, cell: ifText((m) => pct(m.kv_cache_usage)) },
    { label: 'KV blocks × size', num: true, cell: ifText((m) => `${num(m.kv_blocks)} × ${num(m.block_size)}`) },
    { label: 'Context', num: true, cell: ifText((m) => num(m.max_model_len)) },
    { label: 'Prefix hits', num: true, cell: ifText((m) => (m.prefix_cache_queries
      ? pct(m.prefix_cache_hits / m.prefix_cache_queries) : '–')) },
    { label: 'Generated', num: true, cell: ifText((m) => num(m.generated_tokens)) },
    { label: 'Preemptions', num: true, cell: ifText((m) => num(m.preemptions)) },
    { label: '', cell: (m) => action('Unload', async () => {
      await call('unloadModel', { params: { name: m.id } });
      flash(`Model ${m.id} unloaded.`);
      await refresh();
    }, { confirm: `Unload model ${m.id}? Its requests are refused from now on.`, cls: 'danger', testid: 'unload' }) },
  ], models, { rowAttrs: (m) => ({ 'data-model': m.id }), empty: 'No model is loaded.' });
}

function filesTable(files, refresh) {
  return table([
    { label: 'File', cell: (f) => h('code', {}, f.path) },
    { label: 'Kind', cell: (f) => f.kind },
    { label: 'Size', num: true, cell: (f) => bytes(f.bytes) },
    { label: 'Served as', cell: (f) => (f.loaded_as.length ? f.loaded_as.join(', ') : '–') },
    { label: '', cell: (f) => action('Load', async () => {
      const name = prompt(`Serve ${f.path} as:`, f.suggested_name);
      if (!name) return;
      const loaded = await call('loadModel', { body: { name, path: f.path, kind: f.kind } });
      flash(`Model ${loaded.id} loaded; it is served again after a restart.`);
      await refresh();
    }, { testid: 'load-file' }) },
  ], files, { rowAttrs: (f) => ({ 'data-file': f.path }), empty: 'No model files in the models directory.' });
}

function loadForm(refresh) {
  return form({
    name: 'load-model', submit: 'Load',
    fields: [
      { name: 'name', label: 'Name', required: true },
      { name: 'path', label: 'Path (inside the models directory)', required: true, placeholder: 'model.gguf' },
      { name: 'kind', label: 'Kind', options: [['text', 'text (GGUF file)'], ['embedding', 'embedding (folder)']] },
    ],
    onSubmit: async (x, f) => {
      const loaded = await call('loadModel', { body: { name: x.name, path: x.path, kind: x.kind } });
      f.reset();
      flash(`Model ${loaded.id} loaded.`);
      await refresh();
    },
  });
}

export async function render(main) {
  const list = placeholder();
  const files = placeholder();
  const status = h('span');
  const refresh = async () => {
    const [hl, found] = await Promise.all([health(), call('modelFiles')]);
    fill(status, badge(hl.status));
    fill(list, modelsTable(hl.models, refresh));
    fill(files, filesTable(rows(found), refresh));
  };
  fill(main,
    h('div', { class: 'title' }, h('h1', {}, 'Models'), status),
    card('Served models', list),
    card('Model files', files),
    card('Load a model by path', loadForm(refresh)));
  await refresh();
}
