// End-to-end test of `xagent-connector mcp` in front of im.matrix, with the TypeScript MCP SDK's
// Client as the agent: a person in an end-to-end encrypted Matrix room (on a real Synapse)
// asks a question and the MCP agent answers it.
//
// The person and the homeserver come from `matrix_human` (an example of the
// xagent-connector-matrix crate): it starts Synapse through the testkit, registers the bot
// and the person, and acts as the person on a Matrix client of its own, driven by JSON lines.
//   1. im.matrix starts with the bot's password in the environment;
//   2. the bridge starts with --flow matrix_room; the pairing code is read from its sign-in
//      resource, the person posts it in a new encrypted room, the Tools appear;
//   3. the person asks; connector_message_wait hands the question to the agent once;
//   4. the agent answers with connector_message_send and with matrix_message_send; the person
//      reads both in the encrypted room.
//
// Environment: XAGENT_CONNECTOR_BIN (default ../target/debug/xagent-connector),
// XAGENT_MATRIX_HUMAN_BIN (default ../target/debug/examples/matrix_human).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { bin, root, log, until } from './support.mjs';

const humanBin = process.env.XAGENT_MATRIX_HUMAN_BIN || path.join(root, 'target/debug/examples/matrix_human');
const apiKey = `e2e-${randomBytes(16).toString('hex')}`;

/** The person's driver: JSON lines in and out. */
function startHuman() {
  const child = spawn(humanBin, [], { stdio: ['pipe', 'pipe', 'pipe'] });
  const seen = [];
  let buffer = '';
  let errors = '';
  child.stdout.on('data', (chunk) => {
    buffer += chunk.toString();
    let at;
    while ((at = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, at);
      buffer = buffer.slice(at + 1);
      try { seen.push(JSON.parse(line)); } catch { /* not ours */ }
    }
  });
  child.stderr.on('data', (chunk) => (errors += chunk.toString()));
  const send = (command) => child.stdin.write(`${JSON.stringify(command)}\n`);
  return { child, seen, send, errors: () => errors };
}

async function startMatrix(stateDir, setup) {
  const child = spawn(bin, ['matrix', '--listen', '127.0.0.1:0', '--state-dir', stateDir,
    '--homeserver', setup.homeserver, '--user', setup.bot_user, '--edit-interval-ms', '300'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey, XAGENT_MATRIX_PASSWORD: setup.bot_password },
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk.toString()));
  child.stderr.on('data', (chunk) => (output += chunk.toString()));
  const url = await until(() => {
    if (child.exitCode !== null) throw new Error(`im.matrix exited:\n${output}`);
    const match = output.match(/im\.matrix listening on (http\S+)/);
    return match && match[1];
  }, 'im.matrix to listen', 60_000);
  return { child, url, output: () => output };
}

function structured(result) {
  assert.ok(!result.isError, `tool error: ${JSON.stringify(result.content)}`);
  return result.structuredContent ?? JSON.parse(result.content[0].text);
}

async function main() {
  const work = mkdtempSync(path.join(tmpdir(), 'xagent-mcp-matrix-'));
  const human = startHuman();
  let matrix;
  let client;
  const stderr = [];
  try {
    const setup = await until(() => human.seen.find((e) => e.homeserver), 'the homeserver', 180_000);
    mkdirSync(path.join(work, 'allowed'));
    matrix = await startMatrix(path.join(work, 'connector'), setup);
    log('ok 1 - im.matrix runs against the test homeserver');

    human.send({ cmd: 'room', encrypted: true });
    const joined = await until(() => human.seen.find((e) => e.event === 'joined'), 'the bot to join', 60_000);
    assert.equal(joined.encrypted, true, 'the room is end-to-end encrypted');

    const transport = new StdioClientTransport({
      command: bin,
      args: ['mcp', '--base-url', matrix.url, '--state-dir', path.join(work, 'bridge'),
        '--allow-dir', path.join(work, 'allowed'), '--flow', 'matrix_room'],
      env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey, RUST_LOG: 'info' },
      stderr: 'pipe',
    });
    transport.stderr?.on('data', (chunk) => stderr.push(chunk.toString()));
    const changed = [];
    client = new Client({ name: 'xagent-mcp-matrix-e2e', version: '0.1.0' }, { capabilities: {} });
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed.push(Date.now()));
    await client.connect(transport);
    const signIn = await until(async () => {
      try {
        const contents = (await client.readResource({ uri: 'xagent-connector://sign-in' })).contents;
        const text = contents.map((c) => c.text || '').join('\n');
        return /pairing code in the room: \S+/.test(text) && text;
      } catch { return false; }
    }, 'the sign-in resource with the pairing code', 60_000);
    assert.match(signIn, /https:\/\/matrix\.to\/#\/@/, 'the link names the bot');
    const code = signIn.match(/pairing code in the room: (\S+)/)[1];
    human.send({ cmd: 'say', text: code });
    await until(async () => (await client.listTools()).tools.some((t) => t.name === 'matrix_message_send'), 'the Tools after pairing', 60_000);
    // The list can show the Tools a moment before the notification that announces them
    // arrives (the bridge reads the Descriptor before its event loop announces the change).
    await until(() => changed.length > 0, 'notifications/tools/list_changed announcing them', 10_000);
    log('ok 2 - the room is paired through the MCP client');

    human.send({ cmd: 'say', text: 'What is two plus two?' });
    const question = structured(await client.callTool({ name: 'connector_message_wait', arguments: { timeout_seconds: 60 } }, undefined, { timeout: 90_000 })).message;
    assert.ok(question && /What is two plus two\?$/.test(question.text), `the question reached the agent: ${JSON.stringify(question)}`);
    log('ok 3 - the person\'s question reaches the MCP agent');

    const channels = structured(await client.callTool({ name: 'connector_channels_list', arguments: {} }));
    const channel = (channels.channels || channels)[0].connector_channel_id;
    structured(await client.callTool({ name: 'connector_message_send', arguments: { connector_channel_id: channel, text: 'Four.' } }));
    structured(await client.callTool({ name: 'matrix_message_send', arguments: { text: 'Anything else?' } }));
    for (const body of ['Four.', 'Anything else?']) {
      const seen = await until(() => human.seen.find((e) => e.event === 'message' && e.body === body), `"${body}" in the room`, 60_000);
      assert.equal(seen.encrypted, true, 'the answer came through the encrypted room');
    }
    log('ok 4 - the MCP agent answers the person in the encrypted room');
    assert.ok(!stderr.join('').includes(apiKey) && !matrix.output().includes(setup.bot_password), 'no secret in the logs');
    log('all MCP + im.matrix end-to-end checks passed');
  } catch (error) {
    process.stderr.write(`--- bridge stderr ---\n${stderr.join('')}\n`);
    if (matrix) process.stderr.write(`--- im.matrix output ---\n${matrix.output()}\n`);
    process.stderr.write(`--- person driver stderr ---\n${human.errors()}\n`);
    throw error;
  } finally {
    if (client) await client.close().catch(() => {});
    if (matrix) {
      matrix.child.kill('SIGINT');
      await new Promise((resolve) => matrix.child.once('exit', resolve));
    }
    human.child.stdin.end();
    human.child.kill('SIGTERM');
    rmSync(work, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(1);
  },
);
