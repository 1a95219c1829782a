// End-to-end test of corral's operator console in a real browser: Debian's
// chromium driven by playwright-core, against a live server with real
// sandboxes. Run by TestConsole (test/integration/console_test.go), which
// passes:
//   CORRAL_URL        the server
//   CORRAL_KEY        a member key of the team under test
//   CORRAL_OTHER_KEY  a member key of another team
//   CORRAL_SHOTS      the directory screenshots are written to
//   CHROMIUM          the browser (default /usr/bin/chromium)
// It prints `step: ...` lines as it goes and, at the end, one line
// `RESULT {json}` with the ids it made, which the Go test checks through
// the API. Any failed assertion exits non-zero.
import { chromium } from 'playwright-core';
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import assert from 'node:assert/strict';

const URL_ = process.env.CORRAL_URL;
const KEY = process.env.CORRAL_KEY;
const OTHER = process.env.CORRAL_OTHER_KEY;
const SHOTS = process.env.CORRAL_SHOTS;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
if (!URL_ || !KEY || !OTHER || !SHOTS) throw new Error('CORRAL_URL, CORRAL_KEY, CORRAL_OTHER_KEY and CORRAL_SHOTS are required');
mkdirSync(SHOTS, { recursive: true });

// Payloads in attacker-controlled places: each would set window.__xss if
// the console ever parsed it as markup.
const XSS_META = '<img src=x onerror="window.__xss=1">';
const XSS_META2 = '<script>window.__xss=2</script>';
const XSS_FILE = '<img src=x onerror=window.__xss=3>';
const WAIT = { timeout: 60_000 };

const step = msg => console.log('step: ' + msg);
const result = {};

async function api(method, path, body, key = KEY) {
  const r = await fetch(URL_ + path, {
    method,
    headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  return { status: r.status, data };
}

async function must(method, path, body, want) {
  const r = await api(method, path, body);
  assert.equal(r.status, want, `${method} ${path}: ${r.status} ${JSON.stringify(r.data)}`);
  return r.data;
}

const sleep = ms => new Promise(res => setTimeout(res, ms));

// watch collects what must never happen on a page: script errors, CSP
// violations (reported as console errors), a request carrying the key in
// its address, a request to another origin.
function watch(page, key) {
  const bad = [];
  page.on('pageerror', e => bad.push('page error: ' + e.message));
  page.on('console', m => { if (m.type() === 'error' && !/the server responded with a status of 4\d\d/.test(m.text())) bad.push('console error: ' + m.text()); });
  page.on('request', r => {
    const u = r.url();
    if (u.includes(key)) bad.push('key in a request address: ' + u);
    if (!u.startsWith(URL_) && !u.startsWith('blob:') && !u.startsWith('data:')) bad.push('request off the origin: ' + u);
  });
  return bad;
}

async function signIn(page, key, team) {
  const resp = await page.goto(URL_ + '/ui/');
  const h = resp.headers();
  assert.match(h['content-security-policy'] || '', /default-src 'self'/, 'CSP header on /ui/');
  assert.match(h['content-security-policy'], /frame-ancestors 'none'/);
  assert.equal(h['x-frame-options'], 'DENY');
  await page.fill('#signin-key', key);
  await page.click('#signin-btn');
  await page.waitForSelector('#who-team', WAIT);
  assert.equal(await page.textContent('#who-team'), team);
  await page.waitForSelector('#live.on', WAIT);
  const store = await page.evaluate(() => ({ session: sessionStorage.getItem('corral.apiKey'), local: localStorage.length, cookie: document.cookie, url: location.href }));
  assert.equal(store.session, key, 'the key is in sessionStorage');
  assert.equal(store.local, 0, 'nothing in localStorage');
  assert.equal(store.cookie, '', 'no cookie');
  assert.ok(!store.url.includes(key), 'the key is not in the address');
}

async function noXSS(page) {
  assert.equal(await page.evaluate(() => window.__xss), undefined, 'an XSS payload ran');
}

async function main() {
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  try {
    const who = await must('GET', '/v1/whoami', undefined, 200);
    const team = who.team;
    const otherWho = (await api('GET', '/v1/whoami', undefined, OTHER)).data;

    // ---- desktop: the whole operator story ------------------------------
    step('desktop 1280x800: sign in');
    const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
    const page = await ctx.newPage();
    page.on('dialog', d => d.accept());
    const bad = watch(page, KEY);
    await signIn(page, KEY, team);
    await page.evaluate(() => { window.__noReload = 1; });

    step('a task and two sandboxes created through the API appear live');
    const task = await must('POST', '/v1/tasks', { agent: 'ui-agent', max_calls: 6, on_trip: 'keep' }, 201);
    result.task = task.id;
    const a = await must('POST', '/v1/sandboxes', { task: task.id, timeout: 900, metadata: { test: 'console', purpose: 'report-builder', run: 'nightly-42' } }, 201);
    result.sandbox = a.id;
    await page.waitForSelector(`tr[data-id="${a.id}"]`, WAIT);
    const b = await must('POST', '/v1/sandboxes', { task: task.id, timeout: 900, resources: { memory_mb: 64 }, metadata: { test: 'console', xss: XSS_META, name: XSS_META2 } }, 201);
    result.xss_sandbox = b.id;
    await page.waitForSelector(`tr[data-id="${b.id}"]`, WAIT);
    assert.equal(await page.evaluate(() => window.__noReload), 1, 'the list updated without a reload');

    step('the XSS payload in metadata is shown as text');
    const metaText = await page.textContent(`tr[data-id="${b.id}"]`);
    assert.ok(metaText.includes('xss=' + XSS_META), 'metadata shown verbatim: ' + metaText);
    assert.ok(metaText.includes('name=' + XSS_META2));
    assert.equal(await page.locator(`tr[data-id="${b.id}"] img, tr[data-id="${b.id}"] script`).count(), 0, 'no element made from metadata');
    await noXSS(page);

    step('search filters the list');
    await page.fill('#sb-search', 'report-builder');
    await page.waitForSelector(`tr[data-id="${b.id}"]`, { state: 'detached', ...WAIT });
    assert.equal(await page.locator(`tr[data-id="${a.id}"]`).count(), 1);
    await page.fill('#sb-search', '');
    await page.waitForSelector(`tr[data-id="${b.id}"]`, WAIT);

    step('the live list shows CPU and memory from the list itself, no request per sandbox');
    // Defends against a list view that asks every sandbox's /metrics at
    // each refresh (one request per sandbox per 5 s with a tab open):
    // the list's own current sample fills the CPU and MEM cells.
    const perSandbox = [], lists = [];
    const count = r => {
      const p = new globalThis.URL(r.url()).pathname;
      if (/^\/v1\/sandboxes\/[^/]+\/metrics$/.test(p)) perSandbox.push(p);
      if (p === '/v1/sandboxes') lists.push(p);
    };
    page.on('request', count);
    await page.waitForFunction(id => {
      const tds = document.querySelectorAll(`tr[data-id="${id}"] td`);
      return tds.length > 8 && /%$/.test(tds[7].textContent) && tds[8].textContent !== '—';
    }, a.id, WAIT);
    const listsBefore = lists.length;
    const t0 = Date.now();
    while (lists.length < listsBefore + 2 && Date.now() - t0 < 60_000) await page.waitForTimeout(250);
    page.off('request', count);
    assert.ok(lists.length >= listsBefore + 2, 'the list refreshed: ' + lists.length);
    assert.deepEqual(perSandbox, [], 'the list view asked sandboxes for /metrics');

    step('commands through the API');
    const run = async (id, command) => {
      const r = await api('POST', `/v1/sandboxes/${id}/exec`, { command });
      return r;
    };
    let r = await run(a.id, 'echo hello-from-console');
    assert.equal(r.status, 200, JSON.stringify(r.data));
    r = await run(a.id, 'sh -c "exit 3"');
    assert.equal(r.data.exit_code, 3);
    r = await run(a.id, `printf 'file content 42' > /tmp/hello.txt && touch '/tmp/${XSS_FILE}'`);
    assert.equal(r.data.exit_code, 0, JSON.stringify(r.data));
    r = await run(a.id, 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo spun');
    assert.equal(r.data.exit_code, 0, JSON.stringify(r.data));
    r = await run(a.id, 'nohup sleep 600 >/dev/null 2>&1 &');
    assert.equal(r.data.exit_code, 0, JSON.stringify(r.data));

    step('a memory bomb in the other sandbox is killed (oom)');
    r = await run(b.id, "python3 -c 'a=[]\nwhile True: a.append(bytearray(1<<20))'");
    assert.equal(r.data.end_reason, 'oom', JSON.stringify(r.data));

    step('the sandbox page: charts with limits, commands, processes');
    await page.click(`tr[data-id="${a.id}"] a`);
    await page.waitForSelector('#sb-head h1', WAIT);
    await page.waitForFunction(() => document.querySelectorAll('#charts svg.chart polyline').length === 4, null, WAIT);
    for (const c of ['cpu', 'memory', 'disk', 'pids']) {
      assert.equal(await page.locator(`#charts [data-chart="${c}"] line.limit`).count(), 1, c + ' chart draws its limit');
    }
    await page.waitForSelector('#commands td:text("echo hello-from-console")', WAIT);
    const exits = await page.$$eval('#commands tbody tr', rows => rows.map(r => r.children[1].textContent + ' => ' + r.children[2].textContent));
    // The record names the command as the agent ran it (bash -l -c ...).
    assert.ok(exits.some(e => e.endsWith('echo hello-from-console => 0')), exits.join('; '));
    assert.ok(exits.some(e => e.endsWith('sh -c "exit 3" => 3')), exits.join('; '));
    await page.waitForSelector('#processes td:text("sleep 600")', WAIT);
    await page.waitForSelector('#audit tr[data-kind="sandbox.created"]', WAIT);
    await page.waitForSelector('#audit tr[data-kind="command"]', WAIT);

    step('files: browse /tmp, a hostile file name is text, download a file');
    await page.waitForSelector('#files-path', WAIT);
    await page.fill('#files-path', '/tmp');
    await page.press('#files-path', 'Enter');
    await page.waitForSelector('#files tr[data-file="hello.txt"]', WAIT);
    const names = await page.$$eval('#files td.fname', tds => tds.map(td => td.textContent));
    assert.ok(names.includes(XSS_FILE), 'hostile file name listed as text: ' + names.join(', '));
    assert.equal(await page.locator('#files img').count(), 0);
    await noXSS(page);
    const [dl] = await Promise.all([page.waitForEvent('download', WAIT), page.click('#files tr[data-file="hello.txt"] button[data-action="download"]')]);
    assert.equal(dl.suggestedFilename(), 'hello.txt');
    assert.equal(readFileSync(await dl.path(), 'utf8'), 'file content 42');
    await page.waitForTimeout(2500); // a few more one-second samples in the charts
    await page.evaluate(() => { window.scrollTo(0, 0); document.getElementById('toast').hidden = true; });
    await page.screenshot({ path: join(SHOTS, 'sandbox-1280x800.png'), fullPage: false });
    await page.screenshot({ path: join(SHOTS, 'sandbox-1280x800-full.png'), fullPage: true });

    step('trip the call budget; the incident view shows the breaker and why');
    let refused = null;
    for (const cmd of ['date', 'uname -a', 'id', 'ls /', 'pwd', 'hostname', 'true']) {
      r = await run(a.id, cmd);
      if (r.status === 403) { refused = r.data; break; }
    }
    assert.ok(refused && refused.code === 'budget_exhausted', 'a call was refused for the budget: ' + JSON.stringify(refused));
    await page.click('nav a[data-view="incidents"]');
    await page.waitForSelector(`#tripped [data-task="${task.id}"] .reason`, WAIT);
    const reason = await page.textContent(`#tripped [data-task="${task.id}"] .reason`);
    assert.match(reason, /budget_exhausted \(max_calls\)/);
    await page.waitForSelector('#incidents tr[data-kind="task.breaker_open"]', WAIT);
    await page.waitForSelector('#incidents tr[data-kind="watchdog.oom"]', WAIT);
    await page.waitForSelector('#incident-count:not([hidden])', WAIT);
    await page.screenshot({ path: join(SHOTS, 'incidents-1280x800.png') });

    step('reset the breaker from the incident view');
    await page.click(`#tripped [data-task="${task.id}"] button[data-action="reset"]`);
    await page.waitForSelector(`#tripped [data-task="${task.id}"]`, { state: 'detached', ...WAIT });
    let t = await must('GET', `/v1/tasks/${task.id}`, undefined, 200);
    assert.equal(t.breaker.open, false, 'the API shows the breaker closed');
    assert.equal(t.state, 'open');

    step('raise the call budget from the task view');
    await page.goto(URL_ + '/ui/#/tasks/' + task.id);
    await page.waitForSelector(`[data-task="${task.id}"] [data-gauge="calls"]`, WAIT);
    await page.selectOption(`[data-task="${task.id}"] select.raise-budget`, 'max_calls');
    await page.fill(`[data-task="${task.id}"] input.raise-value`, '100');
    await page.click(`[data-task="${task.id}"] button[data-action="raise"]`);
    await page.waitForFunction(id => {
      const g = document.querySelector(`[data-task="${id}"] [data-gauge="calls"]`);
      return g && /\/ 100$/.test(g.textContent.trim());
    }, task.id, WAIT);
    t = await must('GET', `/v1/tasks/${task.id}`, undefined, 200);
    assert.equal(t.budgets.max_calls, 100);
    await page.screenshot({ path: join(SHOTS, 'task-1280x800.png') });

    step('the other views load');
    for (const v of ['resources', 'usage']) {
      await page.click(`nav a[data-view="${v}"]`);
      await page.waitForSelector(v === 'usage' ? '#usage table, #usage .empty' : '#templates table', WAIT);
      await page.screenshot({ path: join(SHOTS, `${v}-1280x800.png`) });
    }
    await page.click('nav a[data-view="sandboxes"]');
    await page.waitForSelector(`tr[data-id="${a.id}"]`, WAIT);
    await page.screenshot({ path: join(SHOTS, 'sandboxes-1280x800.png') });

    step('kill a sandbox from its page; it is gone');
    await page.click(`tr[data-id="${a.id}"] a`);
    await page.waitForSelector('#sb-head button[data-action="kill"]', WAIT);
    await page.click('#sb-head button[data-action="kill"]');
    await page.waitForSelector('#sb-head .state-ended', WAIT);
    const gone = await must('GET', `/v1/sandboxes/${a.id}`, undefined, 200);
    assert.equal(gone.state, 'ended');
    assert.equal(gone.end_reason, 'killed');
    await page.click('nav a[data-view="sandboxes"]');
    await page.waitForSelector(`tr[data-id="${b.id}"]`, WAIT);
    assert.equal(await page.locator(`tr[data-id="${a.id}"]`).count(), 0, 'a killed sandbox is not in the live list');
    await noXSS(page);
    assert.deepEqual(bad, [], 'problems on the desktop page');
    await ctx.close();

    // ---- another team's key sees none of it -------------------------------
    step('another team\'s key sees none of it');
    const octx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const opage = await octx.newPage();
    const obad = watch(opage, OTHER);
    await signIn(opage, OTHER, otherWho.team);
    await opage.waitForSelector('#sandboxes table, #sandboxes .empty', WAIT);
    let text = await opage.textContent('#view');
    for (const id of [a.id, b.id, task.id]) assert.ok(!text.includes(id), 'other team sees ' + id);
    await opage.goto(URL_ + '/ui/#/sandbox/' + b.id);
    await opage.waitForSelector('#sb-missing', WAIT);
    await opage.goto(URL_ + '/ui/#/tasks');
    await opage.waitForSelector('#tasks .card, #tasks .empty', WAIT);
    await opage.click('nav a[data-view="incidents"]');
    await opage.waitForSelector('#incidents table, #incidents .empty', WAIT);
    await sleep(1000);
    text = await opage.textContent('#view');
    for (const id of [a.id, b.id, task.id]) assert.ok(!text.includes(id), 'other team\'s incident view shows ' + id);
    assert.deepEqual(obad, [], 'problems on the other team\'s page');
    await octx.close();

    // ---- phone-sized viewport ---------------------------------------------
    step('phone 390x844: list, sandbox page, incidents');
    const pctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
    const ppage = await pctx.newPage();
    const pbad = watch(ppage, KEY);
    await signIn(ppage, KEY, team);
    await ppage.waitForSelector(`tr[data-id="${b.id}"]`, WAIT);
    const overflow = await ppage.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
    assert.ok(overflow <= 1, 'the page does not scroll sideways on a phone: ' + overflow + ' px');
    const killBox = await ppage.locator(`tr[data-id="${b.id}"] button[data-action="kill"]`).boundingBox();
    assert.ok(killBox && killBox.x >= 0 && killBox.x + killBox.width <= 390, 'kill is on the phone\'s screen: ' + JSON.stringify(killBox));
    await ppage.screenshot({ path: join(SHOTS, 'sandboxes-390x844.png') });
    await ppage.click(`tr[data-id="${b.id}"] a`);
    await ppage.waitForFunction(() => document.querySelectorAll('#charts svg.chart polyline').length === 4, null, WAIT);
    const metaPhone = await ppage.textContent('#sb-metadata');
    assert.ok(metaPhone.includes(XSS_META), 'phone page shows the payload as text');
    await noXSS(ppage);
    await ppage.screenshot({ path: join(SHOTS, 'sandbox-390x844.png') });
    await ppage.click('nav a[data-view="incidents"]');
    await ppage.waitForSelector('#incidents tr[data-kind="task.breaker_open"]', WAIT);
    await ppage.screenshot({ path: join(SHOTS, 'incidents-390x844.png') });
    assert.deepEqual(pbad, [], 'problems on the phone page');
    await pctx.close();
  } finally {
    await browser.close();
  }
  console.log('RESULT ' + JSON.stringify(result));
}

main().catch(e => {
  console.error(e && e.stack || e);
  console.log('RESULT ' + JSON.stringify(result));
  process.exit(1);
});
