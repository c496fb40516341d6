// End-to-end test of `xagent-connector mcp` with a real MCP client that no code in this
// repository wrote: the TypeScript SDK's Client + StdioClientTransport (@modelcontextprotocol/sdk
// from npm). It starts the im.webchat reference Connector, then the SDK spawns the bridge over
// stdio (API key in the environment, never on the command line) and, acting as the agent:
//   1. lists the Tools (the Connector's, projected, plus the built-ins), the Skill prompt and
//      the server instructions;
//   2. calls webchat_message_send and finds the text on the page through the visitor API, once
//      without connector_channel_id and once with a made-up one (section 10.1: it selects
//      nothing, the call runs on the signed-in channel);
//   3. subscribes to the channel's messages resource; a visitor message arrives through
//      notifications/resources/updated and the resource (once), and through
//      connector_message_wait exactly once;
//   4. files both ways: a visitor's file arrives as a resource with the same bytes; the agent
//      sends that resource and a file under --allow-dir to the page with webchat_file_send
//      (the page serves the same bytes); a path outside --allow-dir is refused;
//   5. connector_message_send reaches the page;
//   6. restarts the bridge: a message stored before the restart and one sent while it was down
//      both arrive once, and nothing handed before the restart is handed again;
//   7. another xAgent claims the room (with its owner code), the Connector revokes the bridge's
//      channel: the client
//      receives notifications/tools/list_changed and webchat_message_send is gone from the list;
//   8. the bridge's stderr never shows the API key or the room's access code;
//   9. the same bridge over streamable HTTP (--http): without the bearer token the SDK's
//      StreamableHTTPClientTransport is refused (401, `WWW-Authenticate: Bearer`); with the
//      token the bridge generated into its state directory (shown once on stdout, never in the
//      log), sent as an MCP client does (`requestInit.headers`), it lists the Tools and a
//      webchat_message_send reaches the page;
//  10. a QR sign-in finished through the MCP client: the pairing link is read from the sign-in
//      resource, a person confirms it on the page, the Tools appear after
//      notifications/tools/list_changed and work.
//
// Environment: XAGENT_CONNECTOR_BIN (default ../target/debug/xagent-connector).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';
import { bin, log, until } from './support.mjs';

const apiKey = `e2e-${randomBytes(16).toString('hex')}`;
const roomName = `mcp-e2e-${randomBytes(3).toString('hex')}`;
const accessCode = 'e2e-code-1234';
// The room's owner code: the Connector moves a room to another channel only with it.
const ownerCode = `owner-${randomBytes(8).toString('hex')}`;

/** Starts im.webchat on a free port; resolves with its Base URL. */
async function startWebchat(stateDir) {
  const child = spawn(bin, ['webchat', '--listen', '127.0.0.1:0', '--state-dir', stateDir], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey },
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk.toString()));
  child.stderr.on('data', (chunk) => (output += chunk.toString()));
  const url = await until(() => {
    if (child.exitCode !== null) throw new Error(`webchat exited:\n${output}`);
    const match = output.match(/im\.webchat listening on (http\S+)/);
    return match && match[1];
  }, 'im.webchat to listen');
  return { child, url, output: () => output };
}

const ROOM_FLOW = [
  '--flow', 'webchat_room', '--input', `room_name=${roomName}`, '--input', `access_code=${accessCode}`,
  '--input', `owner_code=${ownerCode}`,
];

/** Connects the SDK client to a freshly spawned bridge. */
async function startBridge(baseUrl, stateDir, allowDir, events, flow = ROOM_FLOW) {
  const transport = new StdioClientTransport({
    command: bin,
    args: ['mcp', '--base-url', baseUrl, '--state-dir', stateDir, '--allow-dir', allowDir, ...flow],
    env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey, RUST_LOG: 'info' },
    stderr: 'pipe',
  });
  const stderr = [];
  transport.stderr?.on('data', (chunk) => stderr.push(chunk.toString()));
  const client = new Client({ name: 'xagent-mcp-e2e', version: '0.1.0' }, { capabilities: {} });
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => events.updated.push(n.params.uri));
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => events.toolsChanged.push(Date.now()));
  await client.connect(transport);
  return { client, transport, stderr };
}

async function call(client, name, args = {}) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 60_000 });
}

function structured(result) {
  assert.ok(!result.isError, `tool error: ${JSON.stringify(result.content)}`);
  return result.structuredContent ?? JSON.parse(result.content[0].text);
}

/** The visitor side of the page: join with the access code, then use the JSON API. */
class Visitor {
  constructor(baseUrl, roomId) {
    this.baseUrl = baseUrl;
    this.roomId = roomId;
  }
  async join() {
    const response = await fetch(`${this.baseUrl}/chat/api/rooms/${this.roomId}/join`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ access_code: accessCode }),
    });
    assert.equal(response.status, 200, 'the visitor joins the room');
    this.token = (await response.json()).token;
  }
  async say(text) {
    const response = await fetch(`${this.baseUrl}/chat/api/rooms/${this.roomId}/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${this.token}` },
      body: JSON.stringify({ text, client_id: randomBytes(8).toString('hex') }),
    });
    assert.equal(response.status, 200, `the page takes ${text}`);
    return response.json();
  }
  async upload(name, type, bytes, text) {
    const form = new FormData();
    form.append('file', new Blob([bytes], { type }), name);
    form.append('text', text);
    form.append('client_id', randomBytes(8).toString('hex'));
    const response = await fetch(`${this.baseUrl}/chat/api/rooms/${this.roomId}/uploads`, {
      method: 'POST',
      headers: { authorization: `Bearer ${this.token}` },
      body: form,
    });
    assert.equal(response.status, 200, 'the page takes the upload');
    return response.json();
  }
  /** The page's first Server-Sent Event: a snapshot of the conversation. */
  async snapshot() {
    const controller = new AbortController();
    const response = await fetch(`${this.baseUrl}/chat/api/rooms/${this.roomId}/events`, {
      signal: controller.signal,
      headers: { authorization: `Bearer ${this.token}` },
    });
    assert.equal(response.status, 200, 'the page opens its event stream');
    const reader = response.body.getReader();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) throw new Error('the event stream ended before the snapshot');
        buffer += new TextDecoder().decode(value);
        const end = buffer.indexOf('\n\n');
        if (end >= 0) {
          const data = buffer.slice(0, end).split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('');
          return JSON.parse(data);
        }
      }
    } finally {
      controller.abort();
    }
  }
  async agentMessages() {
    return (await this.snapshot()).messages.filter((m) => m.author === 'assistant');
  }
  async file(fileRef) {
    const response = await fetch(`${this.baseUrl}/chat/api/rooms/${this.roomId}/files/${fileRef}`, {
      headers: { authorization: `Bearer ${this.token}` },
    });
    assert.equal(response.status, 200, 'the page serves the file');
    return Buffer.from(await response.arrayBuffer());
  }
}

async function waitMessage(client, seconds) {
  return structured(await call(client, 'connector_message_wait', { timeout_seconds: seconds })).message;
}

async function main() {
  const work = mkdtempSync(path.join(tmpdir(), 'xagent-mcp-e2e-'));
  const webchatState = path.join(work, 'webchat');
  const bridgeState = path.join(work, 'bridge');
  const allowDir = path.join(work, 'allowed');
  mkdirSync(allowDir);
  const events = { updated: [], toolsChanged: [] };
  const webchat = await startWebchat(webchatState);
  let bridge;
  let claimer;
  let httpBridge;
  let stderrBefore = '';
  try {
    log(`im.webchat at ${webchat.url}`);
    bridge = await startBridge(webchat.url, bridgeState, allowDir, events);
    const { client } = bridge;

    // 1. Tools, prompt, instructions.
    const tools = (await client.listTools()).tools;
    const names = tools.map((t) => t.name);
    for (const name of ['webchat_message_send', 'webchat_file_send', 'connector_channels_list', 'connector_message_send', 'connector_message_wait']) {
      assert.ok(names.includes(name), `${name} is listed (got ${names})`);
    }
    const fileSend = tools.find((t) => t.name === 'webchat_file_send');
    assert.ok(!(fileSend.inputSchema.required ?? []).includes('connector_channel_id'), 'the bridge resolves the channel');
    assert.ok(!JSON.stringify(fileSend.inputSchema).includes('x-xagent-upload-ref'), 'the upload-ref annotation is not shown');
    assert.match(fileSend.inputSchema.properties.file_ref.description, /xagent-connector:\/\/files\//, 'file_ref takes a file reference');
    const prompts = (await client.listPrompts()).prompts;
    assert.deepEqual(prompts.map((p) => p.name), ['connector-im-webchat']);
    const prompt = await client.getPrompt({ name: 'connector-im-webchat' });
    assert.match(prompt.messages[0].content.text, /name: connector-im-webchat/);
    assert.match(client.getInstructions() ?? '', /connector-im-webchat/, 'the Skill is in the instructions');
    log('ok 1 - tools, Skill prompt and instructions');

    const channels = structured(await call(client, 'connector_channels_list')).channels;
    assert.equal(channels.length, 1);
    const channel = channels[0];
    assert.equal(channel.status, 'connected');
    const roomId = channel.target.account_hint;
    const visitor = new Visitor(webchat.url, roomId);
    await visitor.join();

    // 2. webchat_message_send shows on the page.
    const sent = structured(await call(client, 'webchat_message_send', { text: 'hello from an MCP agent' }));
    assert.equal(sent.status, 'sent');
    await until(async () => (await visitor.agentMessages()).some((m) => m.text === 'hello from an MCP agent'), 'the message on the page');
    // Section 10.1: the model's connector_channel_id selects nothing. A made-up one still runs
    // on the bridge's signed-in channel (the schema does not even offer the argument).
    const sendTool = tools.find((t) => t.name === 'webchat_message_send');
    assert.ok(!('connector_channel_id' in (sendTool.inputSchema.properties ?? {})), 'the channel is not a choice');
    const madeUp = structured(await call(client, 'webchat_message_send', { connector_channel_id: 'cch_made_up_by_the_model', text: 'via a made-up channel id' }));
    assert.equal(madeUp.status, 'sent');
    await until(async () => (await visitor.agentMessages()).some((m) => m.text === 'via a made-up channel id'), 'the made-up-channel message on the page');
    log('ok 2 - webchat_message_send reaches the page, with or without a (made-up) connector_channel_id');

    // 3. A visitor message: resource subscription and waiting Tool, exactly once.
    const resourceUri = channel.messages_resource;
    const listed = (await client.listResources()).resources.map((r) => r.uri);
    assert.ok(listed.includes(resourceUri), 'the channel resource is listed');
    await client.subscribeResource({ uri: resourceUri });
    await visitor.say('first visitor message');
    await until(() => events.updated.includes(resourceUri), 'notifications/resources/updated');
    const read = async () => JSON.parse((await client.readResource({ uri: resourceUri })).contents[0].text).messages;
    const inResource = (await read()).filter((m) => m.text === 'first visitor message');
    assert.equal(inResource.length, 1, 'the resource shows the message once');
    const waited = await waitMessage(client, 10);
    assert.equal(waited.text, 'first visitor message');
    assert.equal(await waitMessage(client, 1), null, 'the waiting Tool hands it once');
    await until(async () => (await visitor.snapshot()).messages.some((m) => m.text === 'first visitor message' && m.status === 'delivered'), 'the page to show delivered');
    log('ok 3 - a visitor message arrives through the resource and the waiting Tool, once');

    // 4. Files both ways.
    const picture = randomBytes(2048);
    await visitor.upload('picture.png', 'image/png', picture, 'a picture');
    const withFile = await waitMessage(client, 15);
    assert.equal(withFile.text, 'a picture');
    assert.equal(withFile.files.length, 1);
    const fileUri = withFile.files[0].uri;
    assert.ok((await client.listResources()).resources.some((r) => r.uri === fileUri), 'the file is a resource');
    const blob = (await client.readResource({ uri: fileUri })).contents[0];
    assert.equal(blob.mimeType, 'image/png');
    assert.ok(Buffer.from(blob.blob, 'base64').equals(picture), 'the agent reads the same bytes');
    const back = structured(await call(client, 'webchat_file_send', { file_ref: fileUri, text: 'your picture' }));
    const report = Buffer.from('quarterly numbers\n');
    writeFileSync(path.join(allowDir, 'report.txt'), report);
    const fromDisk = structured(await call(client, 'webchat_file_send', { file_ref: path.join(allowDir, 'report.txt') }));
    const agentFiles = await until(async () => {
      const messages = await visitor.agentMessages();
      const a = messages.find((m) => m.message_id === back.message_id);
      const b = messages.find((m) => m.message_id === fromDisk.message_id);
      return a && b && [a.files[0], b.files[0]];
    }, 'both files on the page');
    assert.ok((await visitor.file(agentFiles[0].file_ref)).equals(picture), 'the page serves the resource file');
    assert.ok((await visitor.file(agentFiles[1].file_ref)).equals(report), 'the page serves the allowed file');
    const outside = await call(client, 'webchat_file_send', { file_ref: path.join(work, 'webchat') });
    assert.ok(outside.isError, 'a path outside --allow-dir is refused');
    assert.equal(outside.structuredContent.error.code, 'invalid_arguments');
    log('ok 4 - a file goes both ways; a path outside --allow-dir is refused');

    // 5. connector_message_send.
    const builtin = structured(await call(client, 'connector_message_send', { connector_channel_id: channel.connector_channel_id, text: 'sent with connector_message_send' }));
    assert.equal(builtin.status, 'accepted');
    await until(async () => (await visitor.agentMessages()).some((m) => m.text === 'sent with connector_message_send'), 'the built-in send on the page');
    const notOurs = await call(client, 'connector_message_send', { connector_channel_id: 'cch_someone_else', text: 'x' });
    assert.ok(notOurs.isError, 'a channel that is not the bridge user\'s is refused');
    assert.equal(notOurs.structuredContent.error.code, 'connection_not_found');
    log('ok 5 - connector_message_send reaches the page; another channel is refused');

    // 6. Restart: nothing accepted is lost, nothing is handed twice.
    const updatesBefore = events.updated.length;
    await visitor.say('stored before the restart');
    await until(() => events.updated.length > updatesBefore, 'the message to be stored');
    stderrBefore = bridge.stderr.join('');
    await client.close();
    bridge = null;
    await visitor.say('sent while the bridge was down');
    bridge = await startBridge(webchat.url, bridgeState, allowDir, events);
    const again = bridge.client;
    const afterRestart = [];
    for (;;) {
      const message = await waitMessage(again, afterRestart.length < 2 ? 15 : 2);
      if (!message) break;
      afterRestart.push(message.text);
    }
    assert.deepEqual(afterRestart, ['stored before the restart', 'sent while the bridge was down'], 'each arrives once after the restart');
    const history = JSON.parse((await again.readResource({ uri: resourceUri })).contents[0].text).messages.map((m) => m.text);
    for (const text of ['first visitor message', 'a picture', 'stored before the restart', 'sent while the bridge was down']) {
      assert.equal(history.filter((t) => t === text).length, 1, `${text} is stored once`);
    }
    log('ok 6 - a restart loses no accepted message and hands none twice');

    // 7. A Tool made unavailable disappears after the notification.
    const changesBefore = events.toolsChanged.length;
    claimer = spawn(bin, ['mock-xagent', '--base-url', webchat.url, ...ROOM_FLOW], {
      stdio: ['ignore', 'ignore', 'ignore'],
      env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey },
    });
    await until(() => events.toolsChanged.length > changesBefore, 'notifications/tools/list_changed');
    const remaining = (await again.listTools()).tools.map((t) => t.name);
    assert.ok(!remaining.includes('webchat_message_send'), `webchat_message_send is gone (got ${remaining})`);
    assert.ok(remaining.includes('connector_channels_list'), 'the built-ins stay');
    const refused = await call(again, 'webchat_message_send', { text: 'too late' });
    assert.ok(refused.isError);
    assert.equal(refused.structuredContent.error.code, 'connection_not_found', 'no signed-in channel is left (section 10.1)');
    log('ok 7 - a revoked channel takes its Tools off the list after notifications/tools/list_changed');

    // 8. Secrets stay out of the logs.
    const logs = bridge.stderr.join('') + stderrBefore;
    assert.ok(logs.length > 0, 'the bridge logged to stderr');
    assert.ok(!logs.includes(apiKey), 'the API key is not logged');
    assert.ok(!logs.includes(accessCode), 'the access code is not logged');
    assert.ok(!logs.includes(ownerCode), 'the owner code is not logged');
    log('ok 8 - logs go to stderr without the API key or form secrets');

    // 9. Streamable HTTP.
    await bridge.client.close();
    bridge = null;
    httpBridge = spawn(bin, [
      'mcp', '--base-url', webchat.url, '--state-dir', path.join(work, 'bridge-http'), '--http', '127.0.0.1:0',
      ...ROOM_FLOW,
    ], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey } });
    let httpOutput = '';
    let httpLog = '';
    httpBridge.stdout.on('data', (chunk) => (httpOutput += chunk.toString()));
    httpBridge.stderr.on('data', (chunk) => {
      httpOutput += chunk.toString();
      httpLog += chunk.toString();
    });
    const mcpUrl = await until(() => {
      if (httpBridge.exitCode !== null) throw new Error(`the HTTP bridge exited:\n${httpOutput}`);
      const match = httpOutput.match(/MCP over streamable HTTP at (http\S+)/);
      return match && match[1];
    }, 'the HTTP bridge to listen');
    // The token the bridge generated on its first start: in its state directory, owner-only,
    // shown once on stdout.
    const tokenFile = path.join(work, 'bridge-http', 'mcp-http-token');
    const token = readFileSync(tokenFile, 'utf8').trim();
    assert.equal(statSync(tokenFile).mode & 0o777, 0o600, 'the token file is readable only by its owner');
    await until(() => httpOutput.includes(token), 'the generated token shown once');
    const unauthenticated = new Client({ name: 'xagent-mcp-e2e-no-token', version: '0.1.0' }, { capabilities: {} });
    await assert.rejects(
      unauthenticated.connect(new StreamableHTTPClientTransport(new URL(mcpUrl))),
      (error) => /401|Unauthorized|Bearer/i.test(String(error)),
      'a client without the token is refused',
    );
    const bare = await fetch(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    assert.equal(bare.status, 401);
    assert.match(bare.headers.get('www-authenticate') ?? '', /^Bearer/);
    const httpClient = new Client({ name: 'xagent-mcp-e2e-http', version: '0.1.0' }, { capabilities: {} });
    await httpClient.connect(new StreamableHTTPClientTransport(new URL(mcpUrl), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    }));
    const httpTools = (await httpClient.listTools()).tools.map((t) => t.name);
    assert.ok(httpTools.includes('webchat_message_send'), `the HTTP session lists the Tools (got ${httpTools})`);
    const overHttp = structured(await call(httpClient, 'webchat_message_send', { text: 'hello over streamable HTTP' }));
    assert.equal(overHttp.status, 'sent');
    await until(async () => (await visitor.agentMessages()).some((m) => m.text === 'hello over streamable HTTP'), 'the HTTP message on the page');
    await httpClient.close();
    assert.ok(!httpLog.includes(token), 'the token is shown once on stdout, never in the log (stderr)');
    log('ok 9 - streamable HTTP transport, only with the bearer token');

    // 10. A QR sign-in shown to the user through the MCP client.
    const qrEvents = { updated: [], toolsChanged: [] };
    const qr = await startBridge(webchat.url, path.join(work, 'bridge-qr'), allowDir, qrEvents, ['--flow', 'webchat_qr_login']);
    bridge = qr;
    const before = (await qr.client.listTools()).tools.map((t) => t.name);
    assert.ok(!before.includes('webchat_message_send'), 'no Connector Tools before the sign-in');
    const signInResource = await until(async () => (await qr.client.listResources()).resources.find((r) => r.uri === 'xagent-connector://sign-in'), 'the sign-in resource');
    assert.equal(signInResource.mimeType, 'text/markdown');
    const signIn = (await qr.client.readResource({ uri: 'xagent-connector://sign-in' })).contents;
    const pairUrl = signIn[0].text.match(/(http\S+\/chat\/pair\/\S+)/)[1];
    assert.equal(signIn[1].mimeType, 'image/png', 'the QR code comes as an image too');
    assert.ok(Buffer.from(signIn[1].blob, 'base64').subarray(1, 4).toString() === 'PNG');
    const pairToken = pairUrl.split('/chat/pair/')[1];
    const scan = await fetch(`${webchat.url}/chat/api/pair/${pairToken}/scan`, { method: 'POST' });
    assert.equal(scan.status, 200, 'the person opens the link');
    const confirm = await fetch(`${webchat.url}/chat/api/pair/${pairToken}/confirm`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ room_name: `${roomName}-qr` }),
    });
    assert.equal(confirm.status, 200, 'the person confirms');
    const paired = await confirm.json();
    await until(async () => (await qr.client.listTools()).tools.some((t) => t.name === 'webchat_message_send'), 'the Tools after the QR sign-in');
    assert.ok(qrEvents.toolsChanged.length > 0, 'notifications/tools/list_changed announced them');
    structured(await call(qr.client, 'webchat_message_send', { text: 'hello after a QR sign-in' }));
    const qrVisitor = new Visitor(webchat.url, paired.room_id);
    qrVisitor.token = paired.token;
    await until(async () => (await qrVisitor.agentMessages()).some((m) => m.text === 'hello after a QR sign-in'), 'the message in the paired room');
    log('ok 10 - a QR sign-in is finished through the MCP client');
    log('all MCP end-to-end checks passed');
  } catch (error) {
    if (bridge) process.stderr.write(`--- bridge stderr ---\n${bridge.stderr.join('')}\n`);
    process.stderr.write(`--- webchat output ---\n${webchat.output()}\n`);
    throw error;
  } finally {
    if (claimer) claimer.kill('SIGINT');
    if (httpBridge) httpBridge.kill('SIGINT');
    if (bridge) await bridge.client.close().catch(() => {});
    webchat.child.kill('SIGINT');
    await new Promise((resolve) => webchat.child.once('exit', resolve));
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
