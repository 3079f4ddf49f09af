// exo dashboard: cluster view, model catalog and launcher, chat. Plain ES modules, no build step.
// State comes from GET /state (polled once a second); the DOM is updated in place (keyed
// elements) so nothing flickers. Conversations live in localStorage.
import { Marked } from '/vendor/marked.esm.js';

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
};

// ---------- formatting and state accessors (tolerant of tagged unions: {"Tag": {...}}) ----------
export function untag(v) {
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    const keys = Object.keys(v);
    if (keys.length === 1 && /^[A-Z]/.test(keys[0])) return [keys[0], v[keys[0]] ?? {}];
  }
  return [null, v];
}
const bytesOf = (v) => (v == null ? null : typeof v === 'number' ? v : (v.inBytes ?? v.in_bytes ?? v.bytes ?? null));
export function fmtBytes(n) {
  if (n == null || Number.isNaN(n)) return '—';
  const u = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${u[i]}`;
}
const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
function findKey(obj, key, depth = 0) {
  if (!obj || typeof obj !== 'object' || depth > 6) return undefined;
  if (key in obj) return obj[key];
  for (const v of Object.values(obj)) {
    const r = findKey(v, key, depth + 1);
    if (r !== undefined) return r;
  }
  return undefined;
}

// ---------- API ----------
const apiKey = localStorage.getItem('exo.apiKey') || '';
async function api(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  if (opts.body && typeof opts.body !== 'string') { headers['content-type'] = 'application/json'; opts.body = JSON.stringify(opts.body); }
  if (apiKey) headers.authorization = `Bearer ${apiKey}`;
  const r = await fetch(path, { ...opts, headers });
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try { const j = await r.json(); msg = j.error?.message || j.detail || j.message || msg; } catch { /* not JSON */ }
    throw new Error(msg);
  }
  const ct = r.headers.get('content-type') || '';
  return ct.includes('json') ? r.json() : r.text();
}
function toast(msg) {
  const t = $('#toast');
  t.textContent = msg;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
}

// ---------- tabs ----------
function selectTab(name) {
  for (const b of document.querySelectorAll('[role=tab]')) {
    const on = b.id === `tab-${name}`;
    b.setAttribute('aria-selected', on);
    b.tabIndex = on ? 0 : -1;
    $(`#${b.getAttribute('aria-controls')}`).hidden = !on;
  }
  if (name === 'models') refreshModels();
}
for (const b of document.querySelectorAll('[role=tab]')) {
  b.addEventListener('click', () => selectTab(b.id.slice(4)));
  b.addEventListener('keydown', (e) => {
    const tabs = [...document.querySelectorAll('[role=tab]')];
    const i = tabs.indexOf(b);
    const next = e.key === 'ArrowRight' ? tabs[(i + 1) % tabs.length] : e.key === 'ArrowLeft' ? tabs[(i + tabs.length - 1) % tabs.length] : null;
    if (next) { next.focus(); selectTab(next.id.slice(4)); }
  });
}

// ---------- cluster state ----------
let state = {};
let models = [];

export function nodesOf(s) {
  const ids = new Set();
  for (const k of ['nodeIdentities', 'nodeMemory', 'nodeSystem', 'lastSeen']) for (const id of Object.keys(s[k] || {})) ids.add(id);
  for (const n of s.topology?.nodes || []) ids.add(typeof n === 'string' ? n : (n.nodeId ?? n.id));
  return [...ids].filter(Boolean).sort().map((id) => {
    const ident = s.nodeIdentities?.[id] || {};
    const mem = s.nodeMemory?.[id] || {};
    const sys = s.nodeSystem?.[id] || {};
    const disk = s.nodeDisk?.[id] || {};
    return {
      id,
      name: ident.friendlyName || ident.friendly_name || id.slice(0, 8),
      ramTotal: bytesOf(mem.ramTotal), ramAvailable: bytesOf(mem.ramAvailable),
      cpu: sys.cpuModel || sys.chip || sys.cpu || '', cores: sys.cpuCores || sys.cores || '',
      simd: sys.simd || sys.simdLevel || '',
      gpus: sys.gpus || [],
      diskTotal: bytesOf(disk.total ?? disk.diskTotal), diskAvailable: bytesOf(disk.available ?? disk.diskAvailable),
      master: s.masterNodeId === id || s.master === id,
    };
  });
}
export function linksOf(s) {
  const out = [];
  for (const c of s.topology?.connections || s.topology?.links || []) {
    const [, v] = untag(c);
    const a = v.source ?? v.from ?? v.localNodeId ?? v.a;
    const b = v.sink ?? v.to ?? v.sendBackNodeId ?? v.b;
    if (a && b) out.push({ a, b, latencyMs: v.latencyMs ?? v.latency_ms ?? null,
      bandwidth: v.bandwidthMbps != null ? (v.bandwidthMbps * 1e6) / 8 : (v.bandwidthBytesPerSecond ?? v.bandwidth ?? null) });
  }
  return out;
}
export function instancesOf(s) {
  return Object.entries(s.instances || {}).map(([id, raw]) => {
    const [kind, inst] = untag(raw);
    const modelId = findKey(inst, 'modelId') ?? findKey(inst, 'model_id') ?? '?';
    const nodeToRunner = findKey(inst, 'nodeToRunner') || {};
    const runnerIds = Object.values(nodeToRunner);
    const runners = runnerIds.map((rid) => {
      const [status, detail] = untag(s.runners?.[rid] ?? { Unknown: {} });
      return { id: rid, status: (status || 'Unknown').replace(/^Runner/, ''), detail };
    });
    const sharding = kind && /Tensor/i.test(JSON.stringify(inst)) ? 'Tensor' : 'Pipeline';
    return { id, kind, modelId, runners, nodes: Object.keys(nodeToRunner), sharding };
  });
}

function renderSummary() {
  const nodes = nodesOf(state);
  const inst = instancesOf(state);
  const ready = inst.filter((i) => i.runners.length && i.runners.every((r) => r.status === 'Ready' || r.status === 'Running')).length;
  $('#cluster-summary').textContent = `${nodes.length} node${nodes.length === 1 ? '' : 's'} · ${inst.length} instance${inst.length === 1 ? '' : 's'} (${ready} ready)`;
}

function keyedUpdate(container, items, key, make, update) {
  const existing = new Map([...container.children].map((c) => [c.dataset.key, c]));
  let prev = null;
  for (const item of items) {
    const k = key(item);
    let node = existing.get(k);
    if (!node) { node = make(item); node.dataset.key = k; }
    existing.delete(k);
    update(node, item);
    if (node.previousElementSibling !== prev || node.parentNode !== container) {
      if (prev) prev.after(node); else container.prepend(node);
    }
    prev = node;
  }
  for (const gone of existing.values()) gone.remove();
}

function renderNodes() {
  const nodes = nodesOf(state);
  keyedUpdate($('#node-cards'), nodes, (n) => n.id,
    () => el('article', { class: 'card' }),
    (card, n) => {
      const used = n.ramTotal && n.ramAvailable != null ? n.ramTotal - n.ramAvailable : null;
      const pct = n.ramTotal ? Math.round((100 * used) / n.ramTotal) : 0;
      const gpu = n.gpus.length ? n.gpus.map((g) => `${g.name || 'GPU'} ${fmtBytes(bytesOf(g.memory ?? g.memoryTotal))}`).join(', ') : 'none';
      const html = `<h3>${escapeHtml(n.name)}${n.master ? ' <span class="badge" title="master">master</span>' : ''}</h3>
        <dl><dt>CPU</dt><dd>${escapeHtml(n.cpu || '—')}${n.cores ? ` · ${n.cores} cores` : ''}${n.simd ? ` · ${escapeHtml(n.simd)}` : ''}</dd>
        <dt>GPU</dt><dd>${escapeHtml(gpu)}</dd>
        <dt>Memory</dt><dd>${fmtBytes(used)} / ${fmtBytes(n.ramTotal)}<div class="bar" role="progressbar" aria-label="memory used" aria-valuenow="${pct}" aria-valuemin="0" aria-valuemax="100"><span style="width:${pct}%"></span></div></dd>
        <dt>Disk</dt><dd>${fmtBytes(n.diskAvailable)} free of ${fmtBytes(n.diskTotal)}</dd>
        <dt>Id</dt><dd class="muted">${escapeHtml(n.id.slice(0, 16))}</dd></dl>`;
      if (card.dataset.html !== html) { card.innerHTML = html; card.dataset.html = html; }
    });
  renderTopology(nodes);
}

function renderTopology(nodes) {
  const svg = $('#topology');
  const w = svg.clientWidth || 600, h = 220, r = Math.min(w, h) / 2 - 40;
  const pos = new Map(nodes.map((n, i) => {
    const a = (2 * Math.PI * i) / Math.max(nodes.length, 1) - Math.PI / 2;
    return [n.id, nodes.length === 1 ? [w / 2, h / 2] : [w / 2 + r * Math.cos(a), h / 2 + r * Math.sin(a)]];
  }));
  const seen = new Set();
  let out = '';
  for (const l of linksOf(state)) {
    const k = [l.a, l.b].sort().join('|');
    if (seen.has(k) || !pos.has(l.a) || !pos.has(l.b)) continue;
    seen.add(k);
    const [x1, y1] = pos.get(l.a), [x2, y2] = pos.get(l.b);
    const label = [l.latencyMs != null ? `${Number(l.latencyMs).toFixed(2)} ms` : '', l.bandwidth ? `${fmtBytes(l.bandwidth)}/s` : ''].filter(Boolean).join(' · ');
    out += `<line class="link" x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}"><title>${escapeHtml(label)}</title></line>`;
    if (label) out += `<text class="link-label" x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 - 4}" text-anchor="middle">${escapeHtml(label)}</text>`;
  }
  for (const n of nodes) {
    const [x, y] = pos.get(n.id);
    out += `<g class="node" data-node="${escapeHtml(n.id)}"><circle cx="${x}" cy="${y}" r="16" fill="${n.master ? '#ffd60a' : '#3a3f47'}" stroke="#eceff3"/><text x="${x}" y="${y + 32}" text-anchor="middle">${escapeHtml(n.name)}</text></g>`;
  }
  if (svg.dataset.html !== out) { svg.innerHTML = out; svg.dataset.html = out; }
}

function runnerText(r) {
  if (r.status === 'Loading' && r.detail?.totalLayers) return `Loading ${r.detail.layersLoaded ?? 0}/${r.detail.totalLayers} layers`;
  if (r.status === 'Failed') return `Failed: ${r.detail?.errorMessage || 'unknown error'}`;
  return r.status;
}
function renderInstances() {
  const list = instancesOf(state);
  const box = $('#instances');
  if (!list.length) { box.innerHTML = '<p class="muted">No instances. Launch one from Models, or just send a chat message.</p>'; return; }
  if (box.querySelector('p.muted')) box.innerHTML = '';
  keyedUpdate(box, list, (i) => i.id,
    (i) => el('div', { class: 'instance' },
      el('strong', { class: 'model' }), el('span', { class: 'muted meta' }), el('span', { class: 'runners' }),
      el('button', { class: 'danger', 'aria-label': `Delete instance ${i.id}`, onclick: () => deleteInstance(i.id) }, 'Delete')),
    (node, i) => {
      node.querySelector('.model').textContent = i.modelId;
      node.querySelector('.meta').textContent = `${i.sharding} · ${i.nodes.length} node${i.nodes.length === 1 ? '' : 's'} · ${i.id.slice(0, 8)}`;
      const rs = node.querySelector('.runners');
      const html = i.runners.map((r) => `<span class="runner-status ${r.status === 'Ready' || r.status === 'Running' ? 'ready' : r.status === 'Failed' ? 'failed' : 'loading'}">${escapeHtml(runnerText(r))}</span>`).join(' · ');
      if (rs.dataset.html !== html) { rs.innerHTML = html; rs.dataset.html = html; }
    });
}
async function deleteInstance(id) {
  try { await api(`/instance/${encodeURIComponent(id)}`, { method: 'DELETE' }); await pollState(); } catch (e) { toast(`Delete failed: ${e.message}`); }
}

async function pollState() {
  try {
    state = await api('/state');
    renderSummary();
    if (!$('#view-cluster').hidden) { renderNodes(); renderInstances(); }
    if (!$('#view-models').hidden) renderModelRows();
  } catch (e) {
    $('#cluster-summary').textContent = `cannot reach node: ${e.message}`;
  }
}

// ---------- models ----------
function clusterMemory() {
  const nodes = nodesOf(state);
  const avail = nodes.map((n) => n.ramAvailable ?? n.ramTotal ?? 0);
  return { total: avail.reduce((a, b) => a + b, 0), largest: Math.max(0, ...avail), count: nodes.length };
}
export function fitOf(model, mem) {
  const size = (model.storage_size_megabytes || 0) * 1024 * 1024;
  if (!size) return { cls: 'fit-ok', text: 'unknown size' };
  const need = size * 1.2; // weights + KV cache and activations headroom
  if (need <= mem.largest) return { cls: 'fit-ok', text: 'fits on 1 node' };
  if (need <= mem.total) {
    const sorted = nodesOf(state).map((n) => n.ramAvailable ?? 0).sort((a, b) => b - a);
    let acc = 0, k = 0;
    for (const m of sorted) { acc += m; k++; if (acc >= need) break; }
    return { cls: 'fit-multi', text: `needs ${k} nodes` };
  }
  return { cls: 'fit-no', text: 'does not fit' };
}
function downloadsFor(modelId) {
  const out = [];
  for (const [node, list] of Object.entries(state.downloads || {})) {
    for (const d of Array.isArray(list) ? list : Object.values(list)) {
      const [tag, v] = untag(d);
      const mid = findKey(v, 'modelId') ?? findKey(v, 'model_id');
      if (mid !== modelId) continue;
      const done = bytesOf(findKey(v, 'downloadedBytes') ?? findKey(v, 'downloaded'));
      const total = bytesOf(findKey(v, 'totalBytes') ?? findKey(v, 'total'));
      // readOnly: a copy the node holds in a read-only place (built-in, --models-path)
      out.push({ node, tag: (tag || '').replace(/^Download/, ''), done, total, readOnly: v?.readOnly === true });
    }
  }
  return out;
}
async function refreshModels() {
  try {
    const r = await api('/models');
    models = r.data || [];
    const fams = [...new Set(models.map((m) => m.family).filter(Boolean))].sort();
    const sel = $('#model-family');
    const cur = sel.value;
    sel.innerHTML = '<option value="">All</option>' + fams.map((f) => `<option>${escapeHtml(f)}</option>`).join('');
    sel.value = cur;
    renderModelRows();
    renderModelPicker();
  } catch (e) { toast(`Could not load models: ${e.message}`); }
}
function renderModelRows() {
  const q = $('#model-search').value.trim().toLowerCase();
  const fam = $('#model-family').value;
  const mem = clusterMemory();
  const rows = models.filter((m) => (!q || m.id.toLowerCase().includes(q) || (m.name || '').toLowerCase().includes(q)) && (!fam || m.family === fam));
  keyedUpdate($('#model-rows'), rows, (m) => m.id,
    (m) => el('tr', {},
      el('td', {}, el('div', { class: 'name' }), el('div', { class: 'muted small' })),
      el('td', { class: 'size' }), el('td', { class: 'fit' }), el('td', { class: 'dl' }),
      el('td', { class: 'actions' },
        el('button', { class: 'primary', onclick: () => showLaunch(m.id), 'aria-label': `Launch ${m.id}` }, 'Launch'), ' ',
        el('button', { class: 'delete', onclick: () => deleteDownloads(m.id), 'aria-label': `Delete downloads of ${m.id}` }, 'Delete files'))),
    (tr, m) => {
      tr.querySelector('.name').textContent = m.id;
      tr.querySelector('.small').textContent = [m.family, m.quantization, m.context_length ? `${m.context_length} ctx` : ''].filter(Boolean).join(' · ');
      tr.querySelector('.size').textContent = m.storage_size_megabytes ? fmtBytes(m.storage_size_megabytes * 1048576) : '—';
      const f = fitOf(m, mem);
      const fit = tr.querySelector('.fit');
      fit.className = `fit ${f.cls}`;
      fit.textContent = f.text;
      const dls = downloadsFor(m.id);
      const dl = dls.map((d) => `${d.node.slice(0, 6)}: ${d.tag}${d.total && d.tag !== 'Completed' ? ` ${Math.round((100 * (d.done || 0)) / d.total)}%` : ''}`).join(', ');
      tr.querySelector('.dl').textContent = dl || (m.downloaded ? 'on disk' : '—');
      // Files in a read-only place (built-in models, --models-path) cannot be deleted, on this
      // node or another.
      tr.querySelector('button.delete').hidden = !m.deletable && !dls.some((d) => !d.readOnly);
    });
}
async function deleteDownloads(modelId) {
  const nodes = nodesOf(state);
  try {
    for (const n of nodes) await api(`/download/${encodeURIComponent(n.id)}/${encodeURIComponent(modelId)}`, { method: 'DELETE' }).catch(() => {});
    toast(`Deleted files of ${modelId}`);
  } catch (e) { toast(e.message); }
}
async function showLaunch(modelId) {
  const panel = $('#launch-panel');
  panel.hidden = false;
  panel.innerHTML = `<p>Placements for <strong>${escapeHtml(modelId)}</strong>…</p>`;
  try {
    const r = await api(`/instance/previews?model_id=${encodeURIComponent(modelId)}`);
    const previews = r.previews || [];
    const table = el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'Sharding'), el('th', {}, 'Nodes'), el('th', {}, 'Memory per node'), el('th', {}, ''))));
    const body = el('tbody');
    for (const p of previews) {
      const mem = Object.entries(p.memory_delta_by_node || {}).map(([n, b]) => `${n.slice(0, 6)}: ${fmtBytes(bytesOf(b))}`).join(', ');
      const nodeCount = p.instance ? Object.keys(findKey(p.instance, 'nodeToRunner') || {}).length : (p.min_nodes ?? '');
      body.append(el('tr', {}, el('td', {}, p.sharding), el('td', {}, String(nodeCount)), el('td', {}, p.error ? el('span', { class: 'fit-no' }, p.error) : mem),
        el('td', {}, p.error ? '' : el('button', { class: 'primary', onclick: () => launch(modelId, p.sharding, p.instance_meta, nodeCount || 1) }, 'Launch'))));
    }
    table.append(body);
    panel.replaceChildren(el('p', {}, 'Launch ', el('strong', {}, modelId)), previews.length ? table : el('p', { class: 'muted' }, 'No placement fits this cluster.'),
      el('button', { onclick: () => { panel.hidden = true; } }, 'Close'));
  } catch (e) { panel.innerHTML = `<p class="fit-no">${escapeHtml(e.message)}</p>`; }
}
async function launch(modelId, sharding, meta, minNodes) {
  try {
    await api('/place_instance', { method: 'POST', body: { model_id: modelId, sharding, instance_meta: meta, min_nodes: minNodes } });
    $('#launch-panel').hidden = true;
    selectTab('cluster');
    pollState();
  } catch (e) { toast(`Launch failed: ${e.message}`); }
}
$('#model-search').addEventListener('input', renderModelRows);
$('#model-family').addEventListener('change', renderModelRows);
$('#add-model').addEventListener('submit', async (e) => {
  e.preventDefault();
  const id = $('#add-model-id').value.trim();
  if (!id) return;
  try { await api('/models/add', { method: 'POST', body: { model_id: id } }); $('#add-model-id').value = ''; refreshModels(); } catch (err) { toast(`Add failed: ${err.message}`); }
});

// ---------- markdown + code highlighting ----------
const KEYWORDS = new Set('if else elif for while return def class function const let var import from export async await try catch except finally with as in not and or is None null true false True False struct int char void float double static include fn pub use impl match mut new this self break continue switch case default public private package func go type interface'.split(' '));
export function highlight(code) {
  const re = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_]\w*)/g;
  let out = '', last = 0, m;
  while ((m = re.exec(code))) {
    out += escapeHtml(code.slice(last, m.index));
    const [t] = m;
    if (m[1]) out += `<span class="tok-com">${escapeHtml(t)}</span>`;
    else if (m[2]) out += `<span class="tok-str">${escapeHtml(t)}</span>`;
    else if (m[3]) out += `<span class="tok-num">${t}</span>`;
    else out += KEYWORDS.has(t) ? `<span class="tok-kw">${t}</span>` : escapeHtml(t);
    last = m.index + t.length;
  }
  return out + escapeHtml(code.slice(last));
}
const markdown = new Marked({
  gfm: true, breaks: true,
  renderer: {
    html: (token) => escapeHtml(token.text ?? token.raw ?? ''), // model output never becomes live HTML
    code: (token) => `<pre><code class="language-${escapeHtml(token.lang || 'text')}">${highlight(token.text)}</code></pre>`,
  },
});

// ---------- chat ----------
const STORE_KEY = 'exo.conversations';
let conversations = JSON.parse(localStorage.getItem(STORE_KEY) || '[]');
let current = conversations[0]?.id || null;
let inflight = null;
const save = () => localStorage.setItem(STORE_KEY, JSON.stringify(conversations.slice(0, 50)));
const conv = () => conversations.find((c) => c.id === current);

function newConversation() {
  const c = { id: crypto.randomUUID ? crypto.randomUUID() : String(Date.now()), title: 'New chat', messages: [], created: Date.now() };
  conversations.unshift(c);
  current = c.id;
  save();
  renderConversations();
  renderMessages();
  $('#prompt').focus();
}
function renderConversations() {
  const ul = $('#conversation-list');
  ul.replaceChildren(...conversations.map((c) => el('li', { class: c.id === current ? 'active' : '' },
    el('button', { class: 'open', onclick: () => { current = c.id; renderConversations(); renderMessages(); } }, c.title),
    el('button', { 'aria-label': `Delete conversation ${c.title}`, onclick: () => { conversations = conversations.filter((x) => x.id !== c.id); if (current === c.id) current = conversations[0]?.id || null; save(); renderConversations(); renderMessages(); } }, '×'))));
}
function messageNode(m) {
  const node = el('div', { class: `msg ${m.role}${m.error ? ' error' : ''}` });
  fillMessage(node, m);
  return node;
}
function fillMessage(node, m) {
  if (m.role === 'user') { node.textContent = m.content; return; }
  if (m.error) { node.textContent = m.error; return; }
  let html = '';
  if (m.reasoning) html += `<details class="thinking"${m.content ? '' : ' open'}><summary>Thinking</summary><div class="thinking-body">${escapeHtml(m.reasoning)}</div></details>`;
  html += markdown.parse(m.content || '');
  node.innerHTML = html;
}
function renderMessages() {
  const box = $('#messages');
  const c = conv();
  box.replaceChildren(...(c ? c.messages.map(messageNode) : [el('p', { class: 'muted' }, 'Pick a model and say hello.')]));
  box.scrollTop = box.scrollHeight;
}
function renderModelPicker() {
  const sel = $('#model-picker');
  const cur = sel.value || localStorage.getItem('exo.model') || '';
  const running = instancesOf(state).map((i) => i.modelId);
  const ids = [...new Set([...running, ...models.map((m) => m.id)])];
  sel.replaceChildren(...ids.map((id) => el('option', { value: id }, running.includes(id) ? `${id} (running)` : id)));
  if (ids.includes(cur)) sel.value = cur;
}
$('#model-picker').addEventListener('change', (e) => localStorage.setItem('exo.model', e.target.value));

export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const frame = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of frame.split('\n')) {
        if (line.startsWith('data: ')) yield { data: line.slice(6) };
        else if (line.startsWith(': ')) yield { comment: line.slice(2) };
      }
    }
  }
}

async function send(text) {
  if (!current) newConversation();
  const c = conv();
  const model = $('#model-picker').value;
  if (!model) { toast('No model available: add or download one in Models.'); return; }
  c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat') c.title = text.slice(0, 40);
  const reply = { role: 'assistant', content: '', reasoning: '' };
  c.messages.push(reply);
  save();
  renderConversations();
  renderMessages();
  const node = $('#messages').lastElementChild;
  const system = $('#set-system').value.trim();
  const messages = [...(system ? [{ role: 'system', content: system }] : []), ...c.messages.slice(0, -1).filter((m) => !m.error).map((m) => ({ role: m.role, content: m.content }))];
  const abort = new AbortController();
  inflight = { abort, id: null };
  $('#send').hidden = true;
  $('#stop').hidden = false;
  const stats = $('#chat-stats');
  stats.textContent = 'waiting for the model (it starts on first use)…';
  const t0 = performance.now();
  let tFirst = null, nTokens = 0, usage = null, pending = false;
  const paint = () => { pending = false; fillMessage(node, reply); $('#messages').scrollTop = $('#messages').scrollHeight; };
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', signal: abort.signal,
      headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
      body: JSON.stringify({
        model, messages, stream: true, stream_options: { include_usage: true },
        temperature: Number($('#set-temperature').value), top_p: Number($('#set-top-p').value), max_tokens: Number($('#set-max-tokens').value),
      }),
    });
    if (!r.ok) { let m = `${r.status}`; try { m = (await r.json()).error?.message || m; } catch { /* */ } throw new Error(m); }
    for await (const ev of sseEvents(r)) {
      if (ev.comment?.startsWith('prefill_progress')) {
        try { const p = JSON.parse(ev.comment.slice(17)); stats.textContent = `processing prompt ${p.processed_tokens}/${p.total_tokens}…`; } catch { /* */ }
        continue;
      }
      if (!ev.data || ev.data === '[DONE]') continue;
      const chunk = JSON.parse(ev.data);
      if (chunk.error) throw new Error(chunk.error.message || 'generation failed');
      inflight.id = chunk.id;
      if (chunk.usage) usage = chunk.usage;
      const d = chunk.choices?.[0]?.delta || {};
      if (d.content || d.reasoning_content) {
        if (tFirst === null) tFirst = performance.now();
        nTokens++;
        reply.content += d.content || '';
        reply.reasoning += d.reasoning_content || '';
        if (!pending) { pending = true; requestAnimationFrame(paint); }
        const dt = (performance.now() - tFirst) / 1000;
        stats.textContent = `TTFT ${((tFirst - t0) / 1000).toFixed(2)} s · ${dt > 0 ? ((nTokens - 1) / dt).toFixed(1) : '—'} tok/s`;
      }
    }
    const dt = tFirst ? (performance.now() - tFirst) / 1000 : 0;
    const n = usage?.completion_tokens ?? nTokens;
    stats.textContent = `TTFT ${tFirst ? ((tFirst - t0) / 1000).toFixed(2) : '—'} s · ${dt > 0 ? ((n - 1) / dt).toFixed(1) : '—'} tok/s · ${n} tokens`;
    if (inflight?.stopped) stats.textContent = `stopped · ${stats.textContent}`;
  } catch (e) {
    if (e.name === 'AbortError' || inflight?.stopped) { stats.textContent = `stopped after ${nTokens} tokens`; } else { reply.error = `Error: ${e.message}`; stats.textContent = ''; }
  } finally {
    paint();
    node.className = `msg assistant${reply.error ? ' error' : ''}`;
    if (reply.error) node.textContent = reply.error;
    save();
    inflight = null;
    $('#send').hidden = false;
    $('#stop').hidden = true;
    pollState();
  }
}
$('#stop').addEventListener('click', async () => {
  if (!inflight) return;
  inflight.stopped = true;
  const { abort, id } = inflight;
  // Closing the stream already cancels server-side; the explicit cancel covers proxies that keep
  // the upstream connection open.
  abort.abort();
  if (id) await api(`/v1/cancel/${encodeURIComponent(id)}`, { method: 'POST' }).catch(() => {});
});
$('#composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('#prompt').value.trim();
  if (!text || inflight) return;
  $('#prompt').value = '';
  send(text);
});
$('#prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); $('#composer').requestSubmit(); }
});
$('#new-chat').addEventListener('click', newConversation);

// ---------- start ----------
renderConversations();
renderMessages();
selectTab('chat');
await pollState();
await refreshModels();
setInterval(pollState, 1000);
setInterval(() => { if (!$('#view-chat').hidden) renderModelPicker(); }, 3000);
window.exoDashboard = { ready: true };
