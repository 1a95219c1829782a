// corral operator console. Plain JavaScript, no dependency, no build step.
//
// Security rules of this file (docs/console.md):
//  - Every value from the API (metadata, commands, file names, audit data)
//    is attacker-controlled: it reaches the page only as text (textContent,
//    createTextNode) or as an SVG attribute value; never innerHTML,
//    insertAdjacentHTML, document.write or an href built from data.
//  - The API key lives in sessionStorage only and is sent in the
//    Authorization header; never in a URL, a cookie or localStorage.
//  - Only the public API is called, with the signed-in key.
'use strict';
(() => {
  const KEY_STORE = 'corral.apiKey';
  const TEAM_STORE = 'corral.teamAll';
  const state = {
    key: sessionStorage.getItem(KEY_STORE) || '',
    who: null,
    teamAll: sessionStorage.getItem(TEAM_STORE) === '1',
    lastEventId: 0,
    streamGen: 0,
    streamAbort: null,
    handlers: new Set(),
    view: null,
  };
  const $ = (sel, root = document) => root.querySelector(sel);

  // ---- DOM helpers: text only ----------------------------------------

  function append(el, kids) {
    for (const k of kids) {
      if (k == null || k === false) continue;
      if (Array.isArray(k)) append(el, k);
      else if (k instanceof Node) el.appendChild(k);
      else el.appendChild(document.createTextNode(String(k)));
    }
  }

  // h makes an HTML element. props: class, on<event> handlers, dataset,
  // and a fixed set of properties; values are never parsed as markup.
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v == null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'href') el.setAttribute('href', safeHref(v));
      else if (['type', 'value', 'placeholder', 'title', 'disabled', 'selected', 'id', 'name', 'min', 'step'].includes(k)) el[k] = v;
      else el.setAttribute(k, String(v));
    }
    append(el, kids);
    return el;
  }

  // safeHref allows only the console's own hash routes: an address built
  // from data can never be javascript: or another site.
  function safeHref(v) {
    v = String(v);
    return v.startsWith('#/') ? v : '#/';
  }

  const SVGNS = 'http://www.w3.org/2000/svg';
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
    append(el, kids);
    return el;
  }

  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }

  function toast(msg, bad) {
    const t = $('#toast');
    t.textContent = msg;
    t.className = bad ? 'bad' : '';
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
  }

  // ---- formatting ----------------------------------------------------

  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  function bytes(n) {
    if (n == null || isNaN(n)) return '—';
    let i = 0;
    n = Number(n);
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
  }
  function dur(ms) {
    if (ms == null || isNaN(ms)) return '—';
    const neg = ms < 0;
    let sec = Math.floor(Math.abs(ms) / 1000);
    let out;
    if (sec < 60) out = sec + 's';
    else if (sec < 3600) out = Math.floor(sec / 60) + 'm' + String(sec % 60).padStart(2, '0') + 's';
    else if (sec < 86400) out = Math.floor(sec / 3600) + 'h' + String(Math.floor(sec % 3600 / 60)).padStart(2, '0') + 'm';
    else out = Math.floor(sec / 86400) + 'd' + Math.floor(sec % 86400 / 3600) + 'h';
    return neg ? '-' + out : out;
  }
  function when(t) {
    if (!t) return '—';
    const d = new Date(t);
    if (isNaN(d)) return String(t);
    return d.toLocaleTimeString([], { hour12: false }) + (Date.now() - d > 86400e3 ? ' ' + d.toLocaleDateString() : '');
  }
  function num(n, digits = 1) { return n == null || isNaN(n) ? '—' : Number(n).toFixed(digits); }
  function stateBadge(st, prefix = 'state') { return h('span', { class: 'state ' + prefix + '-' + String(st).replace(/[^a-z]/g, '') }, st); }
  function clip(str, n) { str = String(str ?? ''); return str.length > n ? str.slice(0, n) + '…' : str; }
  function kvs(obj) {
    return Object.entries(obj || {}).sort().map(([k, v]) => h('span', { class: 'kv' }, k + '=' + v));
  }

  // ---- API -----------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) { super(message || ('HTTP ' + status)); this.status = status; this.code = code; }
  }

  // withTeam adds ?team=all when an admin chose every team.
  function withTeam(path) {
    if (!state.teamAll || !state.who || state.who.role !== 'admin') return path;
    return path + (path.includes('?') ? '&' : '?') + 'team=all';
  }

  function authHeaders(extra) {
    return Object.assign({ Authorization: 'Bearer ' + state.key }, extra || {});
  }

  async function api(method, path, body, extra) {
    const headers = authHeaders(extra);
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const r = await fetch(withTeam(path), {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store', credentials: 'omit', redirect: 'error',
    });
    if (r.status === 401) {
      signOut('The server refused the key (missing, wrong or revoked).');
      throw new ApiError(401, 'unauthenticated', 'signed out');
    }
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
    if (!r.ok) throw new ApiError(r.status, data && data.code, (data && data.message) || text);
    return data;
  }

  // act runs a button's call, shows its error, and reports success.
  async function act(btn, what, fn) {
    if (btn) btn.disabled = true;
    try {
      await fn();
      toast(what + ': done');
      return true;
    } catch (e) {
      if (e.status !== 401) toast(what + ' failed: ' + (e.code ? e.code + ': ' : '') + e.message, true);
      return false;
    } finally {
      if (btn) btn.disabled = false;
    }
  }

  // ---- live events (server-sent events over fetch) ---------------------
  // EventSource cannot send an Authorization header, so the stream is read
  // with fetch and parsed here; a reconnect resumes with Last-Event-ID.

  const MAX_LINE = 1 << 20;

  function setLive(on) {
    const el = $('#live');
    el.textContent = on ? 'live' : 'offline';
    el.className = 'live ' + (on ? 'on' : 'off');
  }

  function onEvent(fn) { state.handlers.add(fn); return () => state.handlers.delete(fn); }

  function dispatch(ev) {
    if (ev.event !== 'audit' || ev.data.length === 0) return;
    let data;
    try { data = JSON.parse(ev.data.join('\n')); } catch (e) { return; }
    if (ev.id) state.lastEventId = Number(ev.id) || state.lastEventId;
    for (const fn of Array.from(state.handlers)) {
      try { fn(data); } catch (e) { console.error(e); }
    }
  }

  async function runStream() {
    const gen = ++state.streamGen;
    if (state.streamAbort) state.streamAbort.abort();
    let retry = 2000;
    while (state.key && gen === state.streamGen) {
      const ac = new AbortController();
      state.streamAbort = ac;
      try {
        const extra = state.lastEventId ? { 'Last-Event-ID': String(state.lastEventId) } : {};
        const r = await fetch(withTeam('/v1/events/stream'), { headers: authHeaders(extra), cache: 'no-store', credentials: 'omit', signal: ac.signal });
        if (r.status === 401) { signOut('The server refused the key (missing, wrong or revoked).'); return; }
        if (!r.ok) throw new Error('event stream: HTTP ' + r.status);
        setLive(true);
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        let ev = { id: '', event: 'message', data: [] };
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf('\n')) >= 0) {
            let line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (line.endsWith('\r')) line = line.slice(0, -1);
            if (line === '') { dispatch(ev); ev = { id: '', event: 'message', data: [] }; continue; }
            if (line[0] === ':') continue;
            const c = line.indexOf(':');
            const field = c < 0 ? line : line.slice(0, c);
            let val = c < 0 ? '' : line.slice(c + 1);
            if (val[0] === ' ') val = val.slice(1);
            if (field === 'data') ev.data.push(val);
            else if (field === 'id') ev.id = val;
            else if (field === 'event') ev.event = val;
            else if (field === 'retry' && /^\d+$/.test(val)) retry = Math.max(500, Number(val));
          }
          if (buf.length > MAX_LINE) throw new Error('event stream: line too long');
        }
      } catch (e) {
        if (gen !== state.streamGen) return;
      }
      setLive(false);
      await new Promise(res => setTimeout(res, retry));
    }
  }

  function stopStream() {
    state.streamGen++;
    if (state.streamAbort) state.streamAbort.abort();
    state.streamAbort = null;
    setLive(false);
  }

  // ---- sign in / out -------------------------------------------------

  async function signIn(key) {
    state.key = key;
    try {
      state.who = await api('GET', '/v1/whoami');
    } catch (e) {
      state.key = '';
      state.who = null;
      return e.status === 401 ? 'The server refused the key.' : 'Sign-in failed: ' + e.message;
    }
    sessionStorage.setItem(KEY_STORE, key);
    return '';
  }

  function signOut(msg) {
    sessionStorage.removeItem(KEY_STORE);
    sessionStorage.removeItem(TEAM_STORE);
    state.key = '';
    state.who = null;
    state.teamAll = false;
    state.lastEventId = 0;
    stopStream();
    if (state.badgeOff) state.badgeOff();
    teardownView();
    showSignIn(msg || '');
  }

  function showSignIn(msg) {
    $('#signin').hidden = false;
    $('#nav').hidden = true;
    $('#signout').hidden = true;
    clear($('#who'));
    clear($('#view'));
    $('#signin-error').textContent = msg || '';
    $('#signin-key').value = '';
    $('#signin-key').focus();
  }

  function showApp() {
    $('#signin').hidden = true;
    $('#nav').hidden = false;
    $('#signout').hidden = false;
    const who = clear($('#who'));
    append(who, ['team ', h('b', { id: 'who-team' }, state.who.team), ' · ', state.who.role, ' · key ', h('span', { class: 'mono' }, state.who.key_name || state.who.key_id)]);
    if (state.who.role === 'admin') {
      const sel = h('select', { id: 'team-scope', title: 'which teams to show', onchange: () => {
        state.teamAll = sel.value === 'all';
        sessionStorage.setItem(TEAM_STORE, state.teamAll ? '1' : '0');
        state.lastEventId = 0;
        runStream();
        route();
      } }, h('option', { value: 'own' }, 'own team'), h('option', { value: 'all', selected: state.teamAll }, 'every team'));
      append(who, [' · ', sel]);
    }
    if (state.badgeOff) state.badgeOff();
    let t = null;
    const off = onEvent(ev => {
      if (/^task\.(breaker_open|changed|ended)$/.test(ev.kind)) { clearTimeout(t); t = setTimeout(refreshIncidentBadge, 300); }
    });
    state.badgeOff = () => { clearTimeout(t); off(); state.badgeOff = null; };
    runStream();
    route();
    refreshIncidentBadge();
  }

  // ---- views ---------------------------------------------------------

  let current = null; // { cleanups: [] }

  function teardownView() {
    if (!current) return;
    for (const f of current.cleanups) { try { f(); } catch (e) { /* ignore */ } }
    current = null;
  }

  function viewCtx() {
    const ctx = { cleanups: [], alive: true };
    ctx.cleanups.push(() => { ctx.alive = false; });
    ctx.every = (ms, fn) => { const t = setInterval(() => { if (ctx.alive) fn(); }, ms); ctx.cleanups.push(() => clearInterval(t)); };
    ctx.on = fn => ctx.cleanups.push(onEvent(ev => { if (ctx.alive) fn(ev); }));
    ctx.debounce = (ms, fn) => {
      let t = null;
      ctx.cleanups.push(() => clearTimeout(t));
      return () => { clearTimeout(t); t = setTimeout(() => { if (ctx.alive) fn(); }, ms); };
    };
    return ctx;
  }

  function route() {
    if (!state.key || !state.who) return;
    teardownView();
    current = viewCtx();
    const el = clear($('#view'));
    const hash = location.hash || '#/';
    const parts = hash.slice(2).split('/').map(p => { try { return decodeURIComponent(p); } catch (e) { return ''; } });
    let name = parts[0] || 'sandboxes';
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === (name === 'sandbox' ? 'sandboxes' : name === 'task' ? 'tasks' : name));
    const views = { sandboxes: viewSandboxes, sandbox: viewSandbox, tasks: viewTasks, incidents: viewIncidents, resources: viewResources, usage: viewUsage };
    (views[name] || viewSandboxes)(current, el, parts.slice(1));
  }

  // table lays rows out under cols; each cell carries its column's name
  // (data-label), which a phone-sized screen shows beside the value when
  // it draws each row as a card.
  function table(cols, rows, empty) {
    if (!rows.length) return h('div', { class: 'scroll' }, h('div', { class: 'empty' }, empty || 'nothing to show'));
    for (const tr of rows) {
      Array.from(tr.children).forEach((td, i) => { if (cols[i] && cols[i].label) td.dataset.label = cols[i].label; });
    }
    return h('div', { class: 'scroll' }, h('table', null,
      h('thead', null, h('tr', null, cols.map(c => h('th', { class: c.wide ? 'wide' : null }, c.label)))),
      h('tbody', null, rows)));
  }

  function cell(col, ...kids) { return h('td', { class: [col && col.wide ? 'wide' : '', col && col.wrap ? 'wrap' : ''].join(' ').trim() || null }, ...kids); }

  // sandbox actions shared by the list and the page.
  function sandboxActions(sb, after) {
    const out = [];
    if (sb.state === 'running') {
      out.push(h('button', { type: 'button', dataset: { action: 'pause' }, onclick: e => { e.stopPropagation(); act(e.target, 'pause ' + sb.id, () => api('POST', '/v1/sandboxes/' + sb.id + '/pause', {})).then(after); } }, 'Pause'));
      out.push(h('button', { type: 'button', dataset: { action: 'extend' }, title: 'five more minutes', onclick: e => {
        e.stopPropagation();
        const left = Math.max(0, Math.round((new Date(sb.expires_at) - Date.now()) / 1000));
        act(e.target, 'extend ' + sb.id, () => api('POST', '/v1/sandboxes/' + sb.id + '/timeout', { timeout: Math.min(86400, left + 300) })).then(after);
      } }, '+5 min'));
    }
    if (sb.state === 'paused') {
      out.push(h('button', { type: 'button', dataset: { action: 'resume' }, onclick: e => { e.stopPropagation(); act(e.target, 'resume ' + sb.id, () => api('POST', '/v1/sandboxes/' + sb.id + '/resume', {})).then(after); } }, 'Resume'));
    }
    if (sb.state !== 'ended') {
      out.push(h('button', { type: 'button', class: 'danger', dataset: { action: 'kill' }, onclick: e => {
        e.stopPropagation();
        if (!confirm('Kill sandbox ' + sb.id + '?')) return;
        act(e.target, 'kill ' + sb.id, () => api('DELETE', '/v1/sandboxes/' + sb.id)).then(after);
      } }, 'Kill'));
    }
    return h('div', { class: 'actions' }, out);
  }

  // -- sandboxes list --

  function viewSandboxes(ctx, el) {
    const f = { q: '', state: '', template: '', runtime: '' };
    const search = h('input', { type: 'search', id: 'sb-search', class: 'grow', placeholder: 'search id, template, task, agent, metadata…', oninput: () => { f.q = search.value.toLowerCase(); draw(); } });
    const stSel = h('select', { id: 'sb-state', onchange: () => { f.state = stSel.value; load(); } },
      h('option', { value: '' }, 'running + paused'), h('option', { value: 'running' }, 'running'), h('option', { value: 'paused' }, 'paused'),
      h('option', { value: 'ended' }, 'ended'), h('option', { value: 'all' }, 'all'));
    const tplSel = h('select', { id: 'sb-template', onchange: () => { f.template = tplSel.value; draw(); } });
    const rtSel = h('select', { id: 'sb-runtime', onchange: () => { f.runtime = rtSel.value; draw(); } },
      h('option', { value: '' }, 'any runtime'), h('option', { value: 'runc' }, 'runc'), h('option', { value: 'gvisor' }, 'gvisor'));
    const count = h('span', { class: 'dim', id: 'sb-count' });
    const body = h('div', { id: 'sandboxes' });
    append(el, [h('h1', null, 'Sandboxes'), h('div', { class: 'toolbar' }, search, stSel, tplSel, rtSel, count), body]);
    let list = [], agents = {}, now = {};

    const cols = [
      { label: 'id' }, { label: 'state' }, { label: 'template' }, { label: 'runtime', wide: 1 }, { label: 'tier', wide: 1 },
      { label: 'age', wide: 1 }, { label: 'left' }, { label: 'cpu' }, { label: 'memory' }, { label: 'task', wide: 1 },
      { label: 'agent', wide: 1 }, { label: 'metadata', wrap: 1, wide: 1 }, { label: '' },
    ];

    function matches(sb) {
      if (f.template && sb.template !== f.template) return false;
      if (f.runtime && sb.runtime !== f.runtime) return false;
      if (!f.q) return true;
      const hay = [sb.id, sb.template, sb.task, agents[sb.task] || '', sb.state, sb.team, ...Object.entries(sb.metadata || {}).map(([k, v]) => k + '=' + v)].join(' ').toLowerCase();
      return hay.includes(f.q);
    }

    function draw() {
      const tpls = Array.from(new Set(list.map(sb => sb.template))).sort();
      const keep = tplSel.value;
      clear(tplSel);
      append(tplSel, [h('option', { value: '' }, 'any template'), tpls.map(t => h('option', { value: t, selected: t === keep }, t))]);
      const shown = list.filter(matches);
      count.textContent = shown.length + ' of ' + list.length;
      const rows = shown.map(sb => {
        const m = now[sb.id];
        const left = sb.state === 'running' ? dur(new Date(sb.expires_at) - Date.now()) : '—';
        return h('tr', { class: 'clickable', dataset: { id: sb.id }, onclick: () => { location.hash = '#/sandbox/' + encodeURIComponent(sb.id); } },
          cell(null, h('a', { href: '#/sandbox/' + encodeURIComponent(sb.id), class: 'mono' }, sb.id)),
          cell(null, stateBadge(sb.state)),
          cell(null, sb.template),
          cell(cols[3], sb.runtime), cell(cols[4], sb.tier),
          cell(cols[5], dur(Date.now() - new Date(sb.created_at))),
          cell(null, left),
          cell(null, m ? num(m.cpu_percent, 0) + '%' : '—'),
          cell(null, m ? bytes(m.memory_bytes) : '—'),
          cell(cols[9], sb.task ? h('a', { href: '#/tasks/' + encodeURIComponent(sb.task), class: 'mono' }, clip(sb.task, 14)) : '—'),
          cell(cols[10], agents[sb.task] || '—'),
          cell(cols[11], kvs(sb.metadata)),
          cell(null, sandboxActions(sb, load)));
      });
      clear(body).appendChild(table(cols, rows, list.length ? 'no sandbox matches the filters' : 'no sandboxes'));
    }

    async function load() {
      try {
        const [sbs, tasks] = await Promise.all([
          api('GET', '/v1/sandboxes' + (f.state ? '?state=' + encodeURIComponent(f.state) : '')),
          api('GET', '/v1/tasks?state=all').catch(() => ({ tasks: [] })),
        ]);
        if (!ctx.alive) return;
        list = sbs.sandboxes || [];
        agents = {};
        for (const t of tasks.tasks || []) agents[t.id] = t.agent;
        // The list carries each sandbox's newest sample (current): one
        // request per refresh, not one per sandbox.
        now = {};
        for (const sb of list) if (sb.current) now[sb.id] = sb.current;
        draw();
      } catch (e) {
        if (e.status !== 401) clear(body).appendChild(h('p', { class: 'error' }, 'could not list sandboxes: ' + e.message));
      }
    }
    const soon = ctx.debounce(250, load);
    ctx.on(ev => { if (/^sandbox\./.test(ev.kind) || ev.kind === 'task.breaker_open') soon(); });
    ctx.every(5000, load);
    load();
  }

  // -- charts --

  // chart draws a series as an SVG line with the limit as a dashed line.
  function chart(title, values, limit, fmt) {
    const W = 300, H = 100, P = 2;
    const max = Math.max(limit || 0, ...values, 1e-9) * 1.08;
    const x = i => values.length < 2 ? W : (i / (values.length - 1)) * W;
    const y = v => H - P - (v / max) * (H - 2 * P);
    const pts = values.map((v, i) => x(i).toFixed(1) + ',' + y(v).toFixed(1)).join(' ');
    const svg = s('svg', { class: 'chart', viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img', 'aria-label': title },
      s('line', { class: 'axis', x1: 0, y1: H - P, x2: W, y2: H - P }));
    if (values.length) {
      svg.appendChild(s('polygon', { class: 'area', points: '0,' + (H - P) + ' ' + pts + ' ' + W + ',' + (H - P) }));
      svg.appendChild(s('polyline', { class: 'line', points: pts }));
    }
    if (limit) {
      svg.appendChild(s('line', { class: 'limit', x1: 0, x2: W, y1: y(limit), y2: y(limit) }));
      svg.appendChild(s('text', { x: 3, y: Math.max(9, y(limit) - 2) }, 'limit ' + fmt(limit)));
    }
    const last = values.length ? values[values.length - 1] : null;
    return h('div', { class: 'card', dataset: { chart: title.toLowerCase() } },
      h('h3', null, title, h('span', { class: 'val' }, (last == null ? '—' : fmt(last)) + (limit ? ' / ' + fmt(limit) : ''))),
      svg, h('div', { class: 'dim' }, values.length + ' samples, one a second'));
  }

  // -- one sandbox --

  function viewSandbox(ctx, el, args) {
    const id = args[0] || '';
    const head = h('div', { id: 'sb-head' });
    const charts = h('div', { class: 'grid', id: 'charts' });
    const procs = h('div', { id: 'processes' });
    const cmds = h('div', { id: 'commands' });
    const egress = h('div', { id: 'egress' });
    const files = h('div', { id: 'files' });
    const audit = h('div', { id: 'audit' });
    append(el, [h('div', { class: 'crumbs' }, h('a', { href: '#/' }, 'Sandboxes'), ' / ', h('span', { class: 'mono' }, id)), head,
      h('h2', null, 'Resources'), charts, h('h2', null, 'Processes'), procs, h('h2', null, 'Commands'), cmds,
      h('h2', null, 'Egress'), egress, h('h2', null, 'Files'), files, h('h2', null, 'Audit story'), audit]);
    let sb = null;
    let events = [];
    const base = '/v1/sandboxes/' + encodeURIComponent(id);

    async function loadHead() {
      try {
        sb = await api('GET', base);
      } catch (e) {
        if (!ctx.alive || e.status === 401) return;
        clear(head).appendChild(h('p', { class: 'error', id: 'sb-missing' }, e.status === 404 ? 'No such sandbox (or not your team\'s).' : 'could not load: ' + e.message));
        return;
      }
      if (!ctx.alive) return;
      const left = sb.state === 'running' ? dur(new Date(sb.expires_at) - Date.now()) : '—';
      clear(head);
      append(head, [
        h('h1', null, 'Sandbox ', h('span', { class: 'mono' }, sb.id), ' ', stateBadge(sb.state)),
        h('div', { class: 'meta' },
          h('span', null, 'template ', h('b', null, sb.template)), h('span', null, 'runtime ', h('b', null, sb.runtime)),
          h('span', null, 'tier ', h('b', null, sb.tier)), h('span', null, 'team ', h('b', null, sb.team)),
          h('span', null, 'network ', h('b', null, sb.network)),
          h('span', null, 'created ', h('b', null, when(sb.created_at))), h('span', null, 'left ', h('b', { id: 'sb-left' }, left)),
          sb.task ? h('span', null, 'task ', h('a', { href: '#/tasks/' + encodeURIComponent(sb.task), class: 'mono' }, sb.task)) : null,
          sb.end_reason ? h('span', null, 'ended: ', h('b', { id: 'sb-end-reason' }, sb.end_reason)) : null),
        h('div', { class: 'meta', id: 'sb-metadata' }, kvs(sb.metadata)),
        sandboxActions(sb, () => { loadHead(); }),
      ]);
      if (sb.state === 'ended') {
        clear(charts).appendChild(h('p', { class: 'dim' }, 'The sandbox has ended: no live samples.'));
        clear(procs).appendChild(h('p', { class: 'dim' }, 'No processes: the sandbox has ended.'));
        clear(files).appendChild(h('p', { class: 'dim' }, 'No files: the sandbox has ended.'));
      }
    }

    async function loadMetrics() {
      if (sb && sb.state === 'ended') return;
      let m;
      try { m = await api('GET', base + '/metrics'); } catch (e) { return; }
      if (!ctx.alive) return;
      const ser = m.series || [];
      const lim = m.limits || {};
      clear(charts);
      append(charts, [
        chart('CPU', ser.map(p => p.cpu_percent), (lim.cpu || 0) * 100, v => num(v, 0) + '%'),
        chart('Memory', ser.map(p => p.memory_bytes), lim.memory_bytes, bytes),
        chart('Disk', ser.map(p => p.disk_bytes), lim.disk_bytes, bytes),
        chart('Pids', ser.map(p => p.pids), lim.pids, v => num(v, 0)),
      ]);
    }

    async function loadProcs() {
      if (sb && sb.state !== 'running') return;
      let p;
      try { p = await api('GET', base + '/processes'); } catch (e) { return; }
      if (!ctx.alive) return;
      const list = p.processes || [];
      const byPid = new Map(list.map(x => [x.pid, x]));
      const kids = new Map();
      for (const x of list) { const k = byPid.has(x.ppid) ? x.ppid : 0; if (!kids.has(k)) kids.set(k, []); kids.get(k).push(x); }
      const rows = [];
      const walk = (pid, depth) => {
        for (const x of (kids.get(pid) || []).sort((a, b) => a.pid - b.pid)) {
          rows.push(h('tr', null, h('td', null, x.pid), h('td', { class: 'wide' }, x.ppid), h('td', null, x.user || x.uid), h('td', { class: 'wide' }, x.state),
            h('td', null, num(x.cpu_seconds, 2)), h('td', null, bytes(x.rss_bytes)),
            h('td', { class: 'wrap mono tree' }, '  '.repeat(depth) + (depth ? '└ ' : '') + clip(x.command, 400))));
          if (depth < 32) walk(x.pid, depth + 1);
        }
      };
      walk(0, 0);
      clear(procs).appendChild(table([{ label: 'pid' }, { label: 'ppid', wide: 1 }, { label: 'user' }, { label: 'state', wide: 1 }, { label: 'cpu s' }, { label: 'rss' }, { label: 'command' }], rows, 'no processes'));
    }

    async function loadCmds() {
      let c;
      try { c = await api('GET', base + '/commands'); } catch (e) { return; }
      if (!ctx.alive) return;
      const rows = (c.commands || []).slice(-500).reverse().map(x => {
        const d = x.ended_at ? new Date(x.ended_at) - new Date(x.started_at) : null;
        const code = x.exit_code == null ? (x.ended_at ? '—' : 'running') : x.exit_code;
        return h('tr', { dataset: { command: x.id } },
          h('td', null, when(x.started_at)), h('td', { class: 'wrap mono' }, clip(x.command, 1000)),
          h('td', { class: 'exit ' + (x.exit_code === 0 ? 'exit-ok' : x.exit_code == null ? '' : 'exit-bad') }, code),
          h('td', null, d == null ? '—' : d < 1000 ? d + ' ms' : dur(d)),
          h('td', { class: 'wide' }, x.user), h('td', { class: 'wide' }, bytes(x.stdout_bytes) + ' / ' + bytes(x.stderr_bytes)),
          h('td', { class: 'wide' }, x.timed_out ? 'timed out' : (x.end_reason || '')));
      });
      clear(cmds).appendChild(table([{ label: 'started' }, { label: 'command' }, { label: 'exit' }, { label: 'took' }, { label: 'user', wide: 1 }, { label: 'out / err', wide: 1 }, { label: 'end', wide: 1 }], rows, 'no commands yet'));
    }

    function summary(ev) {
      const d = ev.data || {};
      const parts = [];
      for (const k of ['verdict', 'method', 'host', 'addr', 'port', 'reason', 'command', 'exit_code', 'code', 'budget', 'action', 'end_reason', 'message']) {
        if (d[k] != null && d[k] !== '') parts.push(k + '=' + (typeof d[k] === 'object' ? JSON.stringify(d[k]) : d[k]));
      }
      return parts.length ? parts.join(' ') : clip(JSON.stringify(d), 300);
    }

    function drawEvents() {
      const eg = events.filter(e => e.kind.startsWith('egress.')).slice(-500).reverse();
      clear(egress).appendChild(table([{ label: 'time' }, { label: 'kind', wide: 1 }, { label: 'destination' }, { label: 'verdict' }, { label: 'reason', wrap: 1 }],
        eg.map(e => {
          const d = e.data || {};
          const dest = (d.method ? d.method + ' ' : '') + (d.host || d.addr || '') + (d.port ? ':' + d.port : '');
          return h('tr', null, h('td', null, when(e.time)), h('td', { class: 'wide' }, e.kind), h('td', { class: 'wrap mono' }, clip(dest, 300)),
            h('td', null, d.verdict ? stateBadge(d.verdict, 'verdict') : e.kind === 'egress.summary' ? 'summary' : '—'), h('td', { class: 'wrap' }, clip(d.reason || (e.kind === 'egress.summary' ? JSON.stringify(d) : ''), 300)));
        }), 'no egress attempts'));
      clear(audit).appendChild(table([{ label: '#', wide: 1 }, { label: 'time' }, { label: 'kind' }, { label: 'details', wrap: 1 }],
        events.slice(-1000).map(e => h('tr', { dataset: { kind: e.kind } }, h('td', { class: 'wide' }, e.id), h('td', null, when(e.time)), h('td', { class: 'mono' }, e.kind), h('td', { class: 'wrap mono' }, clip(summary(e), 600)))),
        'no events'));
    }

    async function loadEvents() {
      let a;
      try { a = await api('GET', '/v1/audit?sandbox=' + encodeURIComponent(id) + '&limit=5000'); } catch (e) { return; }
      if (!ctx.alive) return;
      const seen = new Set(events.map(e => e.id));
      for (const e of a.events || []) if (!seen.has(e.id)) events.push(e);
      events.sort((x, y) => x.id - y.id);
      drawEvents();
    }

    // files: the agent's filesystem service (Connect, JSON) and /files.
    let cwd = '/';
    const userHdr = { 'X-API-Key': state.key, Authorization: 'Basic ' + btoa('root:') };
    async function listDir(path) {
      if (sb && sb.state !== 'running') return;
      cwd = path;
      let r;
      try {
        const resp = await fetch(withTeam(base + '/agent/filesystem.Filesystem/ListDir'), {
          method: 'POST', headers: Object.assign({ 'Content-Type': 'application/json' }, userHdr), body: JSON.stringify({ path, depth: 1 }),
          cache: 'no-store', credentials: 'omit', redirect: 'error' });
        r = await resp.json().catch(() => ({}));
        if (!resp.ok) throw new Error(r.message || ('HTTP ' + resp.status));
      } catch (e) {
        if (!ctx.alive) return;
        clear(files).appendChild(h('p', { class: 'error' }, 'could not list ' + path + ': ' + e.message));
        return;
      }
      if (!ctx.alive) return;
      const entries = (r.entries || []).sort((a, b) => (isDir(b) - isDir(a)) || String(a.name).localeCompare(String(b.name)));
      const up = path === '/' ? null : path.replace(/\/[^/]*\/?$/, '') || '/';
      const pathInput = h('input', { type: 'text', class: 'grow mono', id: 'files-path', value: path });
      const rows = [];
      if (up) rows.push(h('tr', { class: 'clickable', onclick: () => listDir(up) }, h('td', { class: 'mono' }, '..'), h('td', null, 'dir'), h('td', null, ''), h('td', null, '')));
      for (const en of entries) {
        const dir = isDir(en);
        const p = en.path || (path.replace(/\/$/, '') + '/' + en.name);
        rows.push(h('tr', { class: dir ? 'clickable' : null, dataset: { file: en.name }, onclick: dir ? () => listDir(p) : null },
          h('td', { class: 'wrap mono fname' }, en.name), h('td', null, dir ? 'dir' : String(en.type || '').replace('FILE_TYPE_', '').toLowerCase()),
          h('td', null, dir ? '' : bytes(Number(en.size || 0))),
          h('td', null, dir ? '' : h('button', { type: 'button', dataset: { action: 'download' }, onclick: e => { e.stopPropagation(); download(p, en.name, e.target); } }, 'Download'))));
      }
      clear(files);
      append(files, [h('form', { class: 'toolbar', onsubmit: e => { e.preventDefault(); listDir(pathInput.value || '/'); } }, pathInput, h('button', { type: 'submit' }, 'Open')),
        table([{ label: 'name' }, { label: 'type' }, { label: 'size' }, { label: '' }], rows, 'empty directory')]);
    }
    function isDir(en) { return en.type === 'FILE_TYPE_DIRECTORY' || en.type === 2 ? 1 : 0; }

    // download fetches the file with the key and saves it. The blob is
    // typed application/octet-stream: a file from the sandbox is never
    // rendered in the console's origin (an HTML file could run script).
    async function download(path, name, btn) {
      await act(btn, 'download ' + name, async () => {
        const resp = await fetch(withTeam(base + '/agent/files?path=' + encodeURIComponent(path) + '&username=root'), { headers: { 'X-API-Key': state.key }, cache: 'no-store', credentials: 'omit', redirect: 'error' });
        if (!resp.ok) throw new Error('HTTP ' + resp.status);
        const blob = new Blob([await resp.arrayBuffer()], { type: 'application/octet-stream' });
        const url = URL.createObjectURL(blob);
        const a = document.createElement('a');
        a.href = url;
        a.download = String(name).replace(/[\/\\\x00-\x1f]/g, '_') || 'download';
        document.body.appendChild(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(url), 10000);
      });
    }

    ctx.on(ev => {
      if (ev.sandbox !== id) return;
      if (!events.some(e => e.id === ev.id)) { events.push(ev); drawEvents(); }
      if (ev.kind === 'command') loadCmds();
      if (ev.kind.startsWith('sandbox.')) loadHead();
    });
    ctx.every(2000, loadMetrics);
    ctx.every(5000, () => { loadProcs(); loadCmds(); });
    ctx.every(1000, () => { const l = $('#sb-left'); if (l && sb && sb.state === 'running') l.textContent = dur(new Date(sb.expires_at) - Date.now()); });
    loadHead().then(() => { loadMetrics(); loadProcs(); listDir('/'); });
    loadCmds();
    loadEvents();
  }

  // -- tasks and brakes --

  function gauge(label, used, max, fmt) {
    fmt = fmt || (v => num(v, 0));
    const frac = max > 0 ? Math.min(1, used / max) : 0;
    const cls = 'fill' + (frac >= 1 ? ' bad' : frac >= 0.8 ? ' warn' : '');
    return h('div', { class: 'gauge', dataset: { gauge: label } },
      h('div', { class: 'lbl' }, h('span', null, label), h('span', { class: 'mono' }, fmt(used) + ' / ' + (max > 0 ? fmt(max) : '∞'))),
      s('svg', { viewBox: '0 0 100 10', preserveAspectRatio: 'none' }, s('rect', { class: 'track', x: 0, y: 0, width: 100, height: 10, rx: 2 }),
        s('rect', { class: cls, x: 0, y: 0, width: (frac * 100).toFixed(1), height: 10, rx: 2 })));
  }

  const BUDGETS = [
    ['max_calls', 'calls', t => t.usage.calls],
    ['max_tokens', 'tokens', t => t.usage.tokens],
    ['max_cpu_seconds', 'cpu seconds', t => t.usage.cpu_seconds, v => num(v, 1)],
    ['max_sandboxes', 'sandboxes', t => t.usage.sandboxes_created],
    ['max_duration_s', 'duration s', t => ((t.ended_at ? new Date(t.ended_at) : Date.now()) - new Date(t.created_at)) / 1000],
  ];

  function taskCard(t, loops, after) {
    const br = t.breaker || {};
    const budgetSel = h('select', { class: 'raise-budget' }, BUDGETS.map(([k, l]) => h('option', { value: k, selected: k === br.budget }, l)));
    const amount = h('input', { type: 'number', class: 'raise-value', min: '0', step: 'any', placeholder: 'new limit' });
    const controls = [];
    if (br.open) controls.push(h('button', { type: 'button', dataset: { action: 'reset' }, onclick: e => act(e.target, 'reset ' + t.id, () => api('PATCH', '/v1/tasks/' + t.id, { reset: true })).then(after) }, 'Reset breaker'));
    if (t.state !== 'ended') {
      controls.push(h('form', { class: 'actions', onsubmit: e => {
        e.preventDefault();
        const v = Number(amount.value);
        if (!amount.value || isNaN(v) || v < 0) { toast('give the new limit', true); return; }
        const body = {}; body[budgetSel.value] = budgetSel.value === 'max_cpu_seconds' ? v : Math.round(v);
        act(e.submitter, 'set ' + budgetSel.value + ' of ' + t.id, () => api('PATCH', '/v1/tasks/' + t.id, body)).then(after);
      } }, budgetSel, amount, h('button', { type: 'submit', dataset: { action: 'raise' } }, 'Set')));
    }
    return h('div', { class: 'card', dataset: { task: t.id } },
      h('h3', null, h('span', { class: 'mono' }, t.id), stateBadge(t.state)),
      h('div', { class: 'meta' }, h('span', null, 'agent ', h('b', null, t.agent || '—')), h('span', null, 'sandboxes ', h('b', null, (t.sandboxes || []).length)),
        h('span', null, 'on trip ', h('b', null, t.on_trip)), h('span', null, 'since ', h('b', null, when(t.created_at)))),
      h('div', { class: 'breaker' }, 'breaker ', stateBadge(br.open ? 'open' : 'closed', 'breaker'),
        br.open ? h('div', { class: 'reason' }, (br.code || '') + (br.budget ? ' (' + br.budget + ')' : '') + ': ' + (br.reason || '')) : null),
      BUDGETS.map(([k, l, used, fmt]) => gauge(l, used(t), t.budgets[k], fmt)),
      (loops || []).slice(-3).map(ev => h('div', { class: 'warnline' }, 'loop suspected ' + when(ev.time) + ': ' + clip((ev.data || {}).reason || JSON.stringify(ev.data), 300))),
      h('div', { class: 'actions' }, controls));
  }

  function viewTasks(ctx, el, args) {
    const only = args[0] || '';
    const stSel = h('select', { id: 'task-state', onchange: load }, h('option', { value: '' }, 'open + tripped'), h('option', { value: 'tripped' }, 'tripped'),
      h('option', { value: 'open' }, 'open'), h('option', { value: 'ended' }, 'ended'), h('option', { value: 'all' }, 'all'));
    const body = h('div', { class: 'grid', id: 'tasks' });
    append(el, [h('h1', null, only ? ['Task ', h('span', { class: 'mono' }, only)] : 'Tasks and brakes'), only ? h('div', { class: 'crumbs' }, h('a', { href: '#/tasks' }, 'All tasks')) : h('div', { class: 'toolbar' }, stSel), body]);
    async function load() {
      try {
        let tasks;
        if (only) tasks = [await api('GET', '/v1/tasks/' + encodeURIComponent(only))];
        else {
          const st = stSel.value;
          tasks = st ? (await api('GET', '/v1/tasks?state=' + st)).tasks : (await api('GET', '/v1/tasks?state=all')).tasks.filter(t => t.state !== 'ended');
        }
        const since = new Date(Date.now() - 6 * 3600e3).toISOString();
        const loops = (await api('GET', '/v1/audit?kind=task.loop_suspected&since=' + encodeURIComponent(since) + '&limit=2000')).events || [];
        if (!ctx.alive) return;
        const byTask = {};
        for (const ev of loops) (byTask[ev.task] = byTask[ev.task] || []).push(ev);
        tasks.sort((a, b) => (b.breaker.open - a.breaker.open) || String(b.created_at).localeCompare(String(a.created_at)));
        clear(body);
        if (!tasks.length) body.appendChild(h('p', { class: 'empty' }, 'no tasks'));
        append(body, tasks.slice(0, 300).map(t => taskCard(t, byTask[t.id], load)));
        refreshIncidentBadge();
      } catch (e) {
        if (e.status !== 401 && ctx.alive) clear(body).appendChild(h('p', { class: 'error' }, 'could not load tasks: ' + e.message));
      }
    }
    const soon = ctx.debounce(250, load);
    ctx.on(ev => { if (ev.kind.startsWith('task.') && ev.kind !== 'task.tokens' || ev.kind === 'command') soon(); });
    ctx.every(10000, load);
    load();
  }

  // -- incidents --

  // isIncident: a tripped brake, a CPU runaway, an OOM kill, or a refused
  // egress attempt.
  function isIncident(ev) {
    const k = ev.kind;
    if (k === 'task.breaker_open' || k === 'task.call_refused' || k === 'task.loop_suspected') return true;
    if (k === 'watchdog.cpu_runaway' || k === 'watchdog.oom' || k === 'watchdog.runaway_action') return true;
    if (k === 'sandbox.ended' && ev.data && ev.data.reason === 'oom') return true;
    if (k.startsWith('egress.')) return k === 'egress.summary' || (ev.data && ev.data.verdict === 'refused');
    return false;
  }

  async function refreshIncidentBadge() {
    try {
      const t = await api('GET', '/v1/tasks?state=tripped');
      const n = (t.tasks || []).length;
      const b = $('#incident-count');
      b.textContent = String(n);
      b.hidden = n === 0;
      b.title = n + ' tripped task(s)';
    } catch (e) { /* shown elsewhere */ }
  }

  function viewIncidents(ctx, el) {
    const win = h('select', { id: 'inc-window', onchange: load }, h('option', { value: '1' }, 'last hour'), h('option', { value: '6', selected: true }, 'last 6 hours'), h('option', { value: '24' }, 'last 24 hours'));
    const tripped = h('div', { class: 'grid', id: 'tripped' });
    const list = h('div', { id: 'incidents' });
    append(el, [h('h1', null, 'Incidents'), h('div', { class: 'toolbar' }, win), h('h2', null, 'Tripped now'), tripped, h('h2', null, 'Events'), list]);
    let events = [];
    function draw() {
      const rows = events.slice().sort((a, b) => b.id - a.id).slice(0, 2000).map(e => {
        const d = e.data || {};
        let what = '';
        if (e.kind.startsWith('egress.')) what = (d.verdict || '') + ' ' + (d.method ? d.method + ' ' : '') + (d.host || d.addr || '') + (d.port ? ':' + d.port : '') + (d.reason ? ' — ' + d.reason : '') + (e.kind === 'egress.summary' ? JSON.stringify(d) : '');
        else if (e.kind.startsWith('task.')) what = (d.code || '') + (d.budget ? ' (' + d.budget + ')' : '') + (d.reason ? ': ' + d.reason : '') + (d.command ? ' command: ' + d.command : '');
        else what = d.message || d.reason || JSON.stringify(d);
        return h('tr', { dataset: { kind: e.kind } }, h('td', null, when(e.time)), h('td', { class: 'mono' }, e.kind),
          h('td', null, e.sandbox ? h('a', { href: '#/sandbox/' + encodeURIComponent(e.sandbox), class: 'mono' }, clip(e.sandbox, 12)) : '—'),
          h('td', { class: 'wide' }, e.task ? h('a', { href: '#/tasks/' + encodeURIComponent(e.task), class: 'mono' }, clip(e.task, 14)) : '—'),
          h('td', { class: 'wrap' }, clip(what, 500)));
      });
      clear(list).appendChild(table([{ label: 'time' }, { label: 'kind' }, { label: 'sandbox' }, { label: 'task', wide: 1 }, { label: 'what', wrap: 1 }], rows, 'no incidents in the window'));
    }
    async function loadTripped() {
      try {
        const t = (await api('GET', '/v1/tasks?state=tripped')).tasks || [];
        if (!ctx.alive) return;
        clear(tripped);
        if (!t.length) tripped.appendChild(h('p', { class: 'empty' }, 'no tripped breaker'));
        append(tripped, t.map(x => taskCard(x, [], () => { loadTripped(); refreshIncidentBadge(); })));
      } catch (e) { /* ignore */ }
    }
    async function load() {
      const since = new Date(Date.now() - Number(win.value) * 3600e3).toISOString();
      const q = k => api('GET', '/v1/audit?kind=' + k + '&since=' + encodeURIComponent(since) + '&limit=10000').then(r => r.events || []).catch(() => []);
      const got = await Promise.all(['task', 'watchdog', 'egress', 'sandbox.ended'].map(q));
      if (!ctx.alive) return;
      events = [].concat(...got).filter(isIncident);
      draw();
      loadTripped();
    }
    const soon = ctx.debounce(300, loadTripped);
    ctx.on(ev => {
      if (isIncident(ev) && !events.some(e => e.id === ev.id)) { events.push(ev); draw(); }
      if (ev.kind.startsWith('task.')) soon();
    });
    load();
  }

  // -- templates, snapshots, pools, volumes --

  function viewResources(ctx, el) {
    const parts = { templates: h('div', { id: 'templates' }), snapshots: h('div', { id: 'snapshots' }), pools: h('div', { id: 'pools' }), volumes: h('div', { id: 'volumes' }) };
    append(el, [h('h1', null, 'Resources'), h('h2', null, 'Pools'), parts.pools, h('h2', null, 'Templates'), parts.templates, h('h2', null, 'Snapshots'), parts.snapshots, h('h2', null, 'Volumes'), parts.volumes]);
    const fail = (box, what) => e => { if (e.status !== 401 && ctx.alive) clear(box).appendChild(h('p', { class: 'error' }, 'could not load ' + what + ': ' + e.message)); };
    async function load() {
      api('GET', '/v1/pools').then(r => {
        if (!ctx.alive) return;
        clear(parts.pools).appendChild(table([{ label: 'template' }, { label: 'idle' }, { label: 'target' }, { label: 'min / max', wide: 1 }, { label: 'hit rate' }, { label: 'hits / misses', wide: 1 }, { label: 'refills', wide: 1 }, { label: 'refill ms avg', wide: 1 }, { label: 'team', wide: 1 }],
          (r.pools || []).map(p => {
            const tot = (p.hits || 0) + (p.misses || 0);
            return h('tr', null, h('td', null, p.template), h('td', null, p.idle), h('td', null, p.target), h('td', { class: 'wide' }, p.min + ' / ' + p.max),
              h('td', null, tot ? num(100 * p.hits / tot, 0) + '%' : '—'), h('td', { class: 'wide' }, p.hits + ' / ' + p.misses), h('td', { class: 'wide' }, p.refills),
              h('td', { class: 'wide' }, num(p.refill_ms_avg, 0)), h('td', { class: 'wide' }, p.team));
          }), 'no warm pools'));
      }, fail(parts.pools, 'pools'));
      api('GET', '/v1/templates').then(r => {
        if (!ctx.alive) return;
        clear(parts.templates).appendChild(table([{ label: 'ref' }, { label: 'current' }, { label: 'size' }, { label: 'runtime', wide: 1 }, { label: 'source', wide: 1 }, { label: 'owner' }, { label: 'created', wide: 1 }],
          (r.templates || []).map(t => h('tr', null, h('td', { class: 'mono' }, t.ref), h('td', null, t.current ? 'yes' : ''), h('td', null, bytes(t.size_bytes)),
            h('td', { class: 'wide' }, (t.config && t.config.runtime) || ''), h('td', { class: 'wide' }, clip(t.source, 60)), h('td', null, t.team || 'published'), h('td', { class: 'wide' }, when(t.created_at)))), 'no templates'));
      }, fail(parts.templates, 'templates'));
      api('GET', '/v1/snapshots').then(r => {
        if (!ctx.alive) return;
        clear(parts.snapshots).appendChild(table([{ label: 'id' }, { label: 'name' }, { label: 'sandbox', wide: 1 }, { label: 'template' }, { label: 'size' }, { label: 'created', wide: 1 }],
          (r.snapshots || []).map(x => h('tr', null, h('td', { class: 'mono' }, x.id), h('td', null, x.name || ''), h('td', { class: 'wide mono' }, x.sandbox), h('td', null, x.template), h('td', null, bytes(x.size_bytes)), h('td', { class: 'wide' }, when(x.created_at)))), 'no snapshots'));
      }, fail(parts.snapshots, 'snapshots'));
      api('GET', '/v1/volumes').then(r => {
        if (!ctx.alive) return;
        clear(parts.volumes).appendChild(table([{ label: 'name' }, { label: 'id', wide: 1 }, { label: 'size' }, { label: 'used' }, { label: 'created', wide: 1 }],
          (r.volumes || []).map(v => h('tr', null, h('td', null, v.name), h('td', { class: 'wide mono' }, v.id), h('td', null, bytes((v.size_mb || 0) * 1048576)), h('td', null, v.used_bytes == null ? '—' : bytes(v.used_bytes)), h('td', { class: 'wide' }, when(v.created_at)))), 'no volumes'));
      }, fail(parts.volumes, 'volumes'));
    }
    ctx.every(10000, load);
    load();
  }

  // -- usage --

  function viewUsage(ctx, el) {
    const since = h('select', { id: 'usage-since', onchange: load }, h('option', { value: '1h' }, 'last hour'), h('option', { value: '24h', selected: true }, 'last 24 hours'), h('option', { value: '168h' }, 'last 7 days'), h('option', { value: '' }, 'all time'));
    const by = h('select', { id: 'usage-by', onchange: load }, ['team', 'agent', 'task', 'sandbox'].map(b => h('option', { value: b }, 'by ' + b)));
    const body = h('div', { id: 'usage' });
    append(el, [h('h1', null, 'Usage'), h('div', { class: 'toolbar' }, since, by), body]);
    const amounts = [['cpu_seconds', 'cpu s', v => num(v, 1)], ['memory_gib_seconds', 'memory GiB·s', v => num(v, 1)], ['sandbox_seconds', 'sandbox s', v => num(v, 0)],
      ['egress_bytes', 'egress', bytes], ['commands', 'commands', v => num(v, 0)], ['sandboxes', 'sandboxes', v => num(v, 0)]];
    async function load() {
      let r;
      try { r = await api('GET', '/v1/usage?by=' + by.value + (since.value ? '&since=' + since.value : '')); } catch (e) {
        if (e.status !== 401 && ctx.alive) clear(body).appendChild(h('p', { class: 'error' }, 'could not load usage: ' + e.message));
        return;
      }
      if (!ctx.alive) return;
      const keys = ['team', 'agent', 'task', 'sandbox'].slice(0, ['team', 'agent', 'task', 'sandbox'].indexOf(by.value) + 1);
      const cols = keys.map(k => ({ label: k })).concat(amounts.map(([, l]) => ({ label: l })));
      const rows = (r.rows || []).map(x => h('tr', null, keys.map(k => h('td', { class: 'mono' }, x[k] || '—')), amounts.map(([k, , f]) => h('td', null, f(x[k])))));
      const tot = r.totals || {};
      clear(body);
      append(body, [h('div', { class: 'grid' }, amounts.map(([k, l, f]) => h('div', { class: 'card' }, h('h3', null, l, h('span', { class: 'val' }, f(tot[k]))))), ),
        h('h2', null, 'Rows'), table(cols, rows, 'no usage in the window')]);
    }
    ctx.every(15000, load);
    load();
  }

  // ---- start ---------------------------------------------------------

  function start() {
    $('#signin-form').addEventListener('submit', async e => {
      e.preventDefault();
      const key = $('#signin-key').value.trim();
      if (!key) return;
      const err = await signIn(key);
      $('#signin-key').value = '';
      if (err) { $('#signin-error').textContent = err; return; }
      showApp();
    });
    $('#signout').addEventListener('click', () => signOut(''));
    window.addEventListener('hashchange', route);
    if (state.key) {
      signIn(state.key).then(err => { if (err) showSignIn(err); else showApp(); });
    } else {
      showSignIn('');
    }
  }
  start();
})();
