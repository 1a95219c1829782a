// The official MCP TypeScript SDK's client against a live corral server,
// over stdio (spawning `corral mcp`, as a desktop client does) and over
// streamable HTTP (/mcp). Run by test/integration/mcp_test.go
// (TestMCPTypeScript) with CORRAL_URL, CORRAL_API_KEY and CORRAL_BIN set.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.env.CORRAL_URL;
const key = process.env.CORRAL_API_KEY;
const bin = process.env.CORRAL_BIN;
if (!url || !key || !bin) throw new Error("CORRAL_URL, CORRAL_API_KEY and CORRAL_BIN must be set");

async function rest(method, path, body) {
  const res = await fetch(url + path, {
    method,
    headers: { "X-API-Key": key, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json() };
}

async function newTask(maxCalls) {
  const { status, body } = await rest("POST", "/v1/tasks", { agent: "mcp-ts", max_calls: maxCalls });
  assert.equal(status, 201, JSON.stringify(body));
  return body.id;
}

async function waitEnded(id) {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const { body } = await rest("GET", "/v1/sandboxes/" + id);
    if (body.state === "ended") return;
    if (Date.now() > deadline) assert.fail(`sandbox ${id} still ${body.state} after its session ended`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

// The two ways a client reaches corral's MCP tools.
const transports = {
  stdio: (task) => {
    const env = { ...process.env, CORRAL_URL: url, CORRAL_API_KEY: key };
    if (task) env.CORRAL_TASK = task;
    const t = new StdioClientTransport({ command: bin, args: ["mcp"], env, stderr: "inherit" });
    return { transport: t, end: async (client) => client.close() };
  },
  http: (task) => {
    const headers = { Authorization: "Bearer " + key };
    if (task) headers["Corral-Task"] = task;
    const t = new StreamableHTTPClientTransport(new URL(url + "/mcp"), { requestInit: { headers } });
    return {
      transport: t,
      end: async (client) => {
        await t.terminateSession();
        await client.close();
      },
    };
  },
};

async function connect(kind, task) {
  const { transport, end } = transports[kind](task);
  const client = new Client({ name: "corral-mcp-ts-test", version: "1.0.0" });
  await client.connect(transport);
  return { client, end: () => end(client) };
}

function text(res) {
  return res.content.filter((c) => c.type === "text").map((c) => c.text).join("");
}

for (const kind of Object.keys(transports)) {
  test(`${kind}: tools, code, commands, files; the session's end kills its sandbox`, async () => {
    const { client, end } = await connect(kind);
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), [
      "create_sandbox", "kill_sandbox", "list_files", "read_file", "run_code", "run_command", "snapshot_sandbox", "write_file",
    ]);
    for (const t of tools) assert.equal(t.inputSchema.type, "object", t.name);

    let res = await client.callTool({ name: "run_code", arguments: { code: "print(2**10)" } });
    assert.ok(!res.isError, text(res));
    assert.equal(res.structuredContent.stdout, "1024\n");
    assert.equal(res.structuredContent.exit_code, 0);
    assert.equal(typeof res.structuredContent.duration_ms, "number");
    const id = res.structuredContent.sandbox_id;
    assert.ok(id);

    res = await client.callTool({ name: "run_command", arguments: { command: "uname -s; echo oops >&2; exit 2" } });
    assert.equal(res.structuredContent.stdout, "Linux\n");
    assert.equal(res.structuredContent.stderr, "oops\n");
    assert.equal(res.structuredContent.exit_code, 2);
    assert.equal(res.structuredContent.sandbox_id, id);

    res = await client.callTool({ name: "write_file", arguments: { path: "/tmp/ts.txt", content: "from typescript" } });
    assert.ok(!res.isError, text(res));
    res = await client.callTool({ name: "read_file", arguments: { path: "/tmp/ts.txt" } });
    assert.equal(res.structuredContent.content, "from typescript");
    res = await client.callTool({ name: "list_files", arguments: { path: "/tmp" } });
    assert.ok(res.structuredContent.entries.some((e) => e.name === "ts.txt" && e.type === "file"), text(res));

    res = await client.callTool({ name: "run_code", arguments: { code: "print('y' * 50000)" } });
    assert.equal(res.structuredContent.truncated, true);
    assert.ok(res.structuredContent.stdout.length <= 8192);

    await end();
    await waitEnded(id);
  });

  test(`${kind}: a call past the task's budget is refused with the breaker's message`, async () => {
    const task = await newTask(2);
    const { client, end } = await connect(kind, task);
    let id;
    for (let i = 0; i < 2; i++) {
      const res = await client.callTool({ name: "run_command", arguments: { command: `echo ${i}` } });
      assert.ok(!res.isError, text(res));
      id = res.structuredContent.sandbox_id;
    }
    const res = await client.callTool({ name: "run_code", arguments: { code: "print('must not run')" } });
    assert.equal(res.isError, true);
    assert.match(text(res), /^budget_exhausted: .*summarise/);
    assert.equal(res.structuredContent.code, "budget_exhausted");
    await end();
    await waitEnded(id);
  });
}
