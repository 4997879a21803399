// shunt ui: draws the server's snapshots of the service map. The server
// aggregates flows into edges and sends at most 4 snapshots a second, so
// the page's work depends on the number of edges, not on the flow rate.
'use strict';

const SVGNS = 'http://www.w3.org/2000/svg';
const NODE_W = 170, NODE_H = 34, COL_GAP = 130, ROW_GAP = 16, PAD = 16, TITLE = 24, GROUP_GAP = 30;

// What the page measured, for tests and benchmarks: snapshots drawn, time
// spent drawing them, long tasks the browser reported.
const metrics = window.shuntUI = { snapshots: 0, rebuilds: 0, renderMs: [], longTasks: [], view: '', last: null };
if ('PerformanceObserver' in window && PerformanceObserver.supportedEntryTypes.includes('longtask')) {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) metrics.longTasks.push({ start: e.startTime, duration: e.duration });
  }).observe({ entryTypes: ['longtask'] });
}

const $ = (id) => document.getElementById(id);
const svg = $('map');
let source = null, view = '', selected = '', layoutKey = '', positions = new Map();
// A new layout moves every box: at most one every RELAYOUT_MS (it costs a
// rebuild of the whole SVG); meanwhile new edges between boxes already
// placed are drawn where they are, edges to boxes not yet placed wait.
const RELAYOUT_MS = 2000;
let lastLayout = 0, stale = false, intoCount = new Map(), relayoutTimer = null;
let nodeEls = new Map(), edgeEls = new Map(), lastFlows = 0, lastTime = 0, selectedSig = '';

function el(name, attrs, parent) {
  const e = document.createElementNS(SVGNS, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function filterQuery() {
  const q = new URLSearchParams();
  for (const [k, v] of new FormData($('filter'))) if (v.trim() !== '') q.set(k, v.trim());
  return q;
}

function connect() {
  if (source) source.close();
  const q = filterQuery();
  history.replaceState(null, '', q.toString() ? '?' + q : location.pathname);
  layoutKey = '';
  source = new EventSource('api/events?' + q);
  source.addEventListener('view', (ev) => { view = metrics.view = ev.data; });
  source.addEventListener('snapshot', (ev) => {
    const t0 = performance.now();
    const snap = JSON.parse(ev.data);
    draw(snap);
    metrics.snapshots++;
    metrics.last = snap;
    metrics.renderMs.push(performance.now() - t0);
    if (metrics.renderMs.length > 1000) metrics.renderMs.shift();
  });
  source.onerror = () => setStatus('connection to shunt ui lost; retrying…', true);
}

function setStatus(text, error) {
  $('status').textContent = text;
  $('status').className = error ? 'error' : '';
}

// layout: namespaces as groups side by side (wrapping), inside each group
// columns by depth along the edges (clients left, services, then backends).
function layout(snap) {
  const rank = new Map(snap.nodes.map((n) => [n.id, 0]));
  for (let i = 0; i < 6; i++) {
    for (const e of snap.edges) {
      if (e.from === e.to) continue;
      const r = rank.get(e.from) + 1;
      if (r > rank.get(e.to) && r < 8) rank.set(e.to, r);
    }
  }
  const groups = new Map();
  for (const n of snap.nodes) {
    const g = n.namespace || '';
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(n);
  }
  const names = [...groups.keys()].sort((a, b) => (a === '') - (b === '') || a.localeCompare(b));
  const width = Math.max(800, $('mapwrap').clientWidth - 20);
  const out = { nodes: new Map(), groups: [] };
  let x = PAD, y = PAD, rowH = 0;
  for (const g of names) {
    const cols = new Map();
    for (const n of groups.get(g)) {
      const r = rank.get(n.id);
      if (!cols.has(r)) cols.set(r, []);
      cols.get(r).push(n);
    }
    const ranks = [...cols.keys()].sort((a, b) => a - b);
    const gw = PAD * 2 + ranks.length * NODE_W + (ranks.length - 1) * COL_GAP;
    const rows = Math.max(...ranks.map((r) => cols.get(r).length));
    const gh = TITLE + PAD * 2 + rows * NODE_H + (rows - 1) * ROW_GAP;
    if (x > PAD && x + gw > width) { x = PAD; y += rowH + GROUP_GAP; rowH = 0; }
    out.groups.push({ name: g, x, y, w: gw, h: gh });
    ranks.forEach((r, ci) => {
      cols.get(r).sort((a, b) => a.id.localeCompare(b.id)).forEach((n, ri) => {
        out.nodes.set(n.id, { x: x + PAD + ci * (NODE_W + COL_GAP), y: y + TITLE + PAD + ri * (NODE_H + ROW_GAP) });
      });
    });
    x += gw + GROUP_GAP;
    rowH = Math.max(rowH, gh);
  }
  out.width = width;
  out.height = y + rowH + PAD;
  return out;
}

function rebuild(snap) {
  metrics.rebuilds++;
  const lay = layout(snap);
  positions = lay.nodes;
  svg.setAttribute('width', lay.width);
  svg.setAttribute('height', lay.height);
  const groups = $('groups'), nodes = $('nodes'), edges = $('edges');
  groups.replaceChildren(); nodes.replaceChildren(); edges.replaceChildren();
  nodeEls.clear(); edgeEls.clear();
  for (const g of lay.groups) {
    const ge = el('g', { class: 'group' + (g.name ? '' : ' outside'), 'data-namespace': g.name }, groups);
    el('rect', { x: g.x, y: g.y, width: g.w, height: g.h }, ge);
    el('text', { x: g.x + 10, y: g.y + 17 }, ge).textContent = g.name ? 'namespace ' + g.name : 'outside the namespaces';
  }
  for (const n of snap.nodes) {
    const p = positions.get(n.id);
    const ge = el('g', { class: 'node ' + n.kind, 'data-node': n.id, transform: `translate(${p.x},${p.y})` }, nodes);
    el('rect', { width: NODE_W, height: NODE_H }, ge);
    el('text', { x: 8, y: 13 }, ge).textContent = n.name;
    el('text', { x: 8, y: 27, class: 'kind' }, ge).textContent = n.kind === 'workload' ? `workload · ${(n.pods || []).length} pod(s)` : n.kind;
    const title = el('title', {}, ge);
    title.textContent = [n.id, ...(n.pods || [])].join('\n');
    nodeEls.set(n.id, ge);
  }
  intoCount = new Map();
  for (const e of snap.edges) addEdge(e);
}

function addEdge(e) {
  const edges = $('edges');
  {
    const a = positions.get(e.from), b = positions.get(e.to);
    const g = el('g', { 'data-edge': e.id, 'data-from': e.from, 'data-to': e.to }, edges);
    // A cubic Bézier from the right of the source to the left of the
    // target (or its right, going back); the label at its middle,
    // computed, not measured (getPointAtLength forces a layout per edge).
    let p0, p1, p2, p3;
    if (e.from === e.to) {
      p0 = [a.x + NODE_W, a.y + 8]; p1 = [p0[0] + 40, p0[1] - 30]; p2 = [p0[0] + 40, p0[1] + 40]; p3 = [p0[0], p0[1] + 18];
    } else {
      const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2;
      const back = b.x + NODE_W / 2 < x1;
      const x2 = back ? b.x + NODE_W : b.x, y2 = b.y + NODE_H / 2;
      const dx = Math.max(40, Math.abs(x2 - x1) / 2);
      p0 = [x1, y1]; p3 = [x2, y2];
      if (back) { p1 = [x1 + 60, y1]; p2 = [x2 + 60, y2]; } else { p1 = [x1 + dx, y1]; p2 = [x2 - dx, y2]; }
    }
    const d = `M${p0} C${p1} ${p2} ${p3}`;
    el('path', { d, class: 'hit' }, g);
    const line = el('path', { d, class: 'line' }, g);
    const label = el('text', {}, g);
    // Edges into the same node would put their labels on top of each
    // other at the middle: each sits a little further along than the last.
    const k = intoCount.get(e.to) || 0;
    intoCount.set(e.to, k + 1);
    const [lx, ly] = bezier(p0, p1, p2, p3, [0.5, 0.38, 0.62, 0.28, 0.72][k % 5]);
    label.setAttribute('x', lx);
    label.setAttribute('y', ly - 4);
    g.addEventListener('click', () => select(e.id));
    edgeEls.set(e.id, { g, line, label, cls: '', text: '', width: 0 });
  }
}

function bezier(p0, p1, p2, p3, t) {
  const u = 1 - t, a = u * u * u, b = 3 * u * u * t, c = 3 * u * t * t, d = t * t * t;
  return [a * p0[0] + b * p1[0] + c * p2[0] + d * p3[0], a * p0[1] + b * p1[1] + c * p2[1] + d * p3[1]];
}

function draw(snap) {
  const key = snap.nodes.map((n) => n.id).join('|');
  const t = performance.now();
  stale = stale || key !== layoutKey || snap.edges.some((e) => !edgeEls.has(e.id));
  if (!layoutKey || (stale && t - lastLayout >= RELAYOUT_MS)) {
    rebuild(snap);
    layoutKey = key; lastLayout = t; stale = false;
  } else {
    for (const e of snap.edges) {
      if (!edgeEls.has(e.id) && positions.has(e.from) && positions.has(e.to)) addEdge(e);
    }
    // The server sends nothing while nothing changes: lay out then
    // without waiting for its next snapshot.
    if (stale && !relayoutTimer) {
      relayoutTimer = setTimeout(() => { relayoutTimer = null; if (metrics.last) draw(metrics.last); }, RELAYOUT_MS - (t - lastLayout));
    }
  }
  const now = Date.parse(snap.time);
  for (const e of snap.edges) {
    const rec = edgeEls.get(e.id);
    if (!rec) continue; // its boxes come with the next layout
    const idle = now - Date.parse(e.last) > 30000;
    // Touch the DOM only where something changed: at thousands of flows a
    // second most labels change, classes and markers rarely.
    const cls = `edge ${e.state}${idle ? ' idle' : ''}${e.id === selected ? ' selected' : ''}`;
    if (rec.cls !== cls) {
      rec.cls = cls;
      rec.g.setAttribute('class', cls);
      rec.g.setAttribute('data-state', e.state);
      rec.line.setAttribute('marker-end', `url(#arrow-${e.state})`);
    }
    const flows = e.forwarded + e.dropped + e.httpDenied;
    // Thicker for more flows: 1.5 px, +1 per decade, at most 6.
    const width = Math.min(6, 1.5 + Math.floor(Math.log10(flows + 1)));
    if (rec.width !== width) { rec.width = width; rec.line.style.strokeWidth = width; }
    let text = String(flows);
    if (e.share) text = `${e.share.toFixed(1)}% of ${e.requests} req`;
    else if (e.requests) text = `${e.requests} req`;
    if (e.dropped) text += ` · ${e.dropped} dropped`;
    if (e.httpDenied) text += ` · ${e.httpDenied} denied`;
    if (rec.text !== text) {
      rec.text = text;
      rec.label.textContent = text;
      if (e.share) rec.g.setAttribute('data-share', e.share.toFixed(2)); else rec.g.removeAttribute('data-share');
    }
    if (e.id === selected) {
      const sig = `${flows}/${e.requests}`;
      if (sig !== selectedSig) { selectedSig = sig; loadEdge(e); }
    }
  }
  const dt = (now - lastTime) / 1000;
  const rate = lastTime && dt > 0 ? Math.round((snap.flows - lastFlows) / dt) : 0;
  lastFlows = snap.flows; lastTime = now;
  let text = `${snap.flows} flows (${rate}/s) · ${snap.nodes.length} nodes · ${snap.edges.length} edges`;
  if (snap.overflow) text += ` · ${snap.overflow} flows beyond the map's limits not shown`;
  if (snap.missed) text += ` · ${snap.missed} flows missed (the view fell behind)`;
  if (snap.source) text += ` · flow source: ${snap.source}`;
  setStatus(text, !!snap.source);
}

function select(id) {
  selected = id;
  selectedSig = '';
  for (const [eid, { g }] of edgeEls) g.classList.toggle('selected', eid === id);
  const e = metrics.last && metrics.last.edges.find((x) => x.id === id);
  if (e) loadEdge(e);
}

async function loadEdge(e) {
  $('panel').hidden = false;
  $('edge-title').textContent = `${e.from} → ${e.to}`;
  let counts = `${e.forwarded} forwarded · ${e.dropped} dropped · ${e.httpDenied} HTTP denied · protocols ${e.protocols.join(', ')}`;
  if (e.requests) {
    counts += ` · ${e.requests} HTTP requests (1xx–5xx: ${e.status.slice(1).join('/')}, no response ${e.status[0]})`;
    if (e.share) counts += ` · ${e.share.toFixed(1)}% of the Service's requests`;
  }
  $('edge-counts').textContent = counts;
  const resp = await fetch(`api/edge?view=${encodeURIComponent(view)}&edge=${encodeURIComponent(e.id)}`);
  if (!resp.ok) { $('edge-counts').textContent += ' · ' + (await resp.text()); return; }
  const data = await resp.json();
  const body = $('edge-flows').tBodies[0];
  body.replaceChildren();
  for (const f of data.flows) {
    const tr = document.createElement('tr');
    tr.className = f.verdict;
    const http = f.http ? `${f.http.method} ${f.http.path} → ${f.http.status || 'no response'}` +
      (f.http.route ? ` · route ${f.http.route}` : '') +
      (f.http.backendPod || f.http.backend ? ` · backend ${f.http.backendPod || f.http.backend}` : '') +
      (f.http.error ? ` · ${f.http.error}` : '') : '';
    const cells = [new Date(f.time).toISOString().slice(11, 23), side(f.source), side(f.destination) + (f.service && f.service.name ? ` (via ${f.service.name})` : ''),
      f.protocol, f.verdict, f.dropReason || '', f.policy || '', http];
    for (const c of cells) { const td = document.createElement('td'); td.textContent = c; tr.appendChild(td); }
    body.appendChild(tr);
  }
}

function side(s) {
  let who = s.pod || s.ip || (s.labels && s.labels[0]) || '?';
  if (s.port) who += ':' + s.port;
  return who;
}

$('filter').addEventListener('submit', (ev) => { ev.preventDefault(); closePanel(); connect(); });
$('clear').addEventListener('click', () => { $('filter').reset(); closePanel(); connect(); });
$('close').addEventListener('click', closePanel);
function closePanel() { selected = ''; $('panel').hidden = true; }

// The page's own address carries the filter (a reload keeps it).
for (const [k, v] of new URLSearchParams(location.search)) {
  const input = $('filter').elements[k];
  if (input) input.value = v;
}
connect();
