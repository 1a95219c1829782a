// The unmodified npm @e2b/code-interpreter SDK (pinned in package.json)
// against corral's code-interpreter template: Sandbox.create({template:
// 'code-interpreter'}) and sbx.runCode(...), configured as every test of
// this suite (E2B_API_URL and E2B_SANDBOX_URL point at corral, so the SDK
// sends its calls to corral's one URL with E2b-Sandbox-Port: 49999).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { NotFoundError, SandboxError, TimeoutError } from 'e2b'
import { RUN_ID, rejection, assertErrorClass, describeError } from './helpers.mjs'

const TEMPLATE = 'code-interpreter'

/** A code-interpreter sandbox for test t, killed when t ends. */
async function newInterpreter(t) {
  const sbx = await Sandbox.create({
    template: TEMPLATE,
    timeoutMs: 180_000,
    metadata: { suite: 'corral-e2b-compat', run: RUN_ID, test: t.name.slice(0, 200) },
  })
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

test('runCode keeps state, streams logs and gives the execution count', async (t) => {
  const sbx = await newInterpreter(t)
  const first = await sbx.runCode('x = 1')
  assert.equal(first.error, undefined)
  const out = []
  const err = []
  const run = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)\nx += 1\nx', {
    onStdout: (m) => out.push(m.line),
    onStderr: (m) => err.push(m.line),
  })
  assert.equal(run.error, undefined)
  assert.equal(run.text, '2')
  assert.equal(run.results.length, 1)
  assert.equal(run.results[0].isMainResult, true)
  assert.deepEqual(run.logs.stdout, ['to out\n'])
  assert.deepEqual(run.logs.stderr, ['to err\n'])
  assert.deepEqual(out, ['to out\n'])
  assert.deepEqual(err, ['to err\n'])
  assert.equal(run.executionCount, first.executionCount + 1)
})

test('runCode reports an error with name, value and traceback', async (t) => {
  const sbx = await newInterpreter(t)
  const seen = []
  const run = await sbx.runCode('print("before")\n1/0', { onError: (e) => seen.push(e) })
  assert.ok(run.error, 'no error')
  assert.equal(run.error.name, 'ZeroDivisionError')
  assert.equal(run.error.value, 'division by zero')
  assert.match(run.error.traceback, /ZeroDivisionError/)
  assert.equal(seen.length, 1)
  assert.deepEqual(run.logs.stdout, ['before\n'])
})

test('a matplotlib figure comes back as a PNG and a chart without plt.show()', async (t) => {
  const sbx = await newInterpreter(t)
  const results = []
  const run = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9], label="squares")\nplt.title("squares")\nplt.xlabel("n")\nNone',
    { onResult: (r) => results.push(r) },
  )
  assert.equal(run.error, undefined)
  const fig = run.results.find((r) => r.png)
  assert.ok(fig, `no PNG result in ${JSON.stringify(run.results.map((r) => r.formats()))}`)
  assert.equal(fig.isMainResult, false)
  assert.ok(Buffer.from(fig.png, 'base64').subarray(0, 8).equals(Buffer.from('\x89PNG\r\n\x1a\n', 'latin1')))
  assert.ok(fig.formats().includes('png'))
  assert.equal(fig.chart?.type, 'line')
  assert.equal(fig.chart?.title, 'squares')
  assert.equal(results.length, run.results.length)
})

test('a pandas DataFrame comes back as HTML and data', async (t) => {
  const sbx = await newInterpreter(t)
  const run = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
  assert.equal(run.error, undefined)
  const [r] = run.results
  assert.ok(r.html.includes('<table'), r.html)
  assert.deepEqual(r.data, { a: [1, 2], b: ['x', 'y'] })
  assert.ok(r.formats().includes('html') && r.formats().includes('data'), String(r.formats()))
})

test('contexts: create, separate state and cwd, list, restart, remove', async (t) => {
  const sbx = await newInterpreter(t)
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
  assert.equal(ctx.cwd, '/tmp')
  assert.equal(ctx.language, 'python')
  await sbx.runCode('y = "mine"', { context: ctx })
  assert.equal((await sbx.runCode('import os\n(y, os.getcwd())', { context: ctx })).text, "('mine', '/tmp')")
  assert.equal((await sbx.runCode('import os\n("y" in globals(), os.getcwd())')).text, "(False, '/home/user')")
  const list = await sbx.listCodeContexts()
  assert.ok(list.some((c) => c.id === ctx.id && c.cwd === '/tmp'), JSON.stringify(list))
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode('import os\n("y" in globals(), os.getcwd())', { context: ctx })).text, "(False, '/tmp')")
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  const err = await rejection(sbx.runCode('1', { context: ctx }), 'a run in a removed context')
  assertErrorClass(err, NotFoundError)
  assert.match(err.message, new RegExp(`Context ${ctx.id} not found`))
})

test('an unknown language is refused', async (t) => {
  const sbx = await newInterpreter(t)
  const err = await rejection(sbx.runCode('1', { language: 'cobol' }), 'a run in cobol')
  assertErrorClass(err, SandboxError)
})

test('env vars apply to their run only', async (t) => {
  const sbx = await newInterpreter(t)
  const code = 'import os\nstr(os.environ.get("CI_VAR"))'
  assert.equal((await sbx.runCode(code, { envs: { CI_VAR: 'per-run' } })).text, 'per-run')
  assert.equal((await sbx.runCode(code)).text, 'None')
})

test('a timeout interrupts the run and the context keeps its state', async (t) => {
  const sbx = await newInterpreter(t)
  await sbx.runCode('kept = "yes"')
  const err = await rejection(sbx.runCode('import time\ntime.sleep(120)', { timeoutMs: 2_000 }), 'a run past its timeout')
  assertErrorClass(err, TimeoutError)
  // The hang-up interrupted the kernel: the next run is not stuck behind
  // the sleep and the state survived.
  const next = await sbx.runCode('kept', { timeoutMs: 60_000 })
  assert.equal(next.text, 'yes', describeError(next.error))
})

test('two contexts run at once', async (t) => {
  const sbx = await newInterpreter(t)
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext()
  // a waits for a file that only b makes: serialized contexts would time out.
  const waiting = sbx.runCode(
    'import os, time\nwhile not os.path.exists("/tmp/go"):\n    time.sleep(0.05)\n"a done"',
    { context: a, timeoutMs: 60_000 },
  )
  const making = sbx.runCode('open("/tmp/go", "w").close()\n"b done"', { context: b, timeoutMs: 60_000 })
  const [ra, rb] = await Promise.all([waiting, making])
  assert.equal(ra.text, 'a done')
  assert.equal(rb.text, 'b done')
})

test('a sandbox killed mid-run ends the run with an error, not a success', async (t) => {
  const sbx = await newInterpreter(t)
  await sbx.runCode('1')
  const running = sbx.runCode('import time\nprint("sleeping", flush=True)\ntime.sleep(120)', { timeoutMs: 90_000 })
  const caught = running.then(
    (v) => ({ value: v }),
    (e) => ({ error: e }),
  )
  await new Promise((resolve) => setTimeout(resolve, 1_000))
  await sbx.kill()
  const got = await caught
  // Either the SDK throws (the connection closed) or the run ends with
  // an error line (corral's control plane ends a cut-short answer with
  // UnexpectedEndOfExecution); it never ends as a success, nor hangs.
  if (got.error) {
    assert.notEqual(got.error.name, 'AbortError', describeError(got.error))
  } else {
    assert.equal(got.value.error?.name, 'UnexpectedEndOfExecution', JSON.stringify(got.value))
  }
})
