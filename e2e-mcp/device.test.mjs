// End-to-end test of `xagent-connector mcp` against the Device reference Connector
// (`device.homie`) with the TypeScript MCP SDK client (Client + StdioClientTransport from
// @modelcontextprotocol/sdk, the same package as mcp.test.mjs). Everything runs on 127.0.0.1:
// a throw-away Mosquitto on a free port in a temp dir, the simulated Homie device `homie-sim`,
// `xagent-connector homie` with a pairing code (from the environment, never the command
// line), and the bridge spawned by the SDK with the homie_bind form flow (API key in the
// environment, never on the command line). Acting as the agent, the client:
//   1. lists the Tools: the homie Tools are there, without a device id argument;
//   2. sets the thermostat's settable target-temperature within its range with
//      homie_property_set: the result confirms the value, homie_property_read reads it back,
//      and an MQTT observer on the broker (a few lines of MQTT 3.1.1 here, no client library)
//      sees the Connector's `/set` and the device publishing the new value;
//   3. sets it out of range: an MCP tool error with code invalid_arguments, nothing published
//      on `/set`, the device keeps its value;
//   4. kills the device (SIGKILL, so the broker publishes its last will `lost`): the client
//      receives notifications/tools/list_changed, the homie Tools leave the list, the channel
//      shows `offline`, and a call is a tool error with code connector_channel_unavailable
//      (the runtime refuses a Tool its Descriptor marks unavailable, section 10.1);
//   5. starts the device again: the Tools come back after notifications/tools/list_changed;
//   6. the bridge's stderr shows neither the API key nor the pairing code.
// Every child process is killed at the end, on failure too, and the whole run is bounded.
//
// Environment: XAGENT_CONNECTOR_BIN (default ../target/debug/xagent-connector), HOMIE_SIM_BIN
// (default ../target/debug/homie-sim), MOSQUITTO_BIN (default /usr/sbin/mosquitto).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { bin, log, root, until } from './support.mjs';

const simBin = process.env.HOMIE_SIM_BIN || path.join(root, 'target/debug/homie-sim');
const mosquittoBin = process.env.MOSQUITTO_BIN || '/usr/sbin/mosquitto';
// The whole run, start to end: past it every process is killed and the test fails.
const RUN_LIMIT = 180_000;
const apiKey = `e2e-${randomBytes(16).toString('hex')}`;
const deviceId = `e2e-thermostat-${randomBytes(3).toString('hex')}`;
const pairingCode = `pair-${randomBytes(8).toString('hex')}`;
const HOMIE_TOOLS = ['homie_device_describe', 'homie_property_read', 'homie_property_set', 'homie_camera_snapshot'];

/** Every child process this test started, killed at the end whatever happens. */
const children = new Set();
/** The bridge's pid (the SDK spawns it); killed on any exit too. */
let bridgePid;

/** Starts a process whose stdout and stderr are collected; it is killed at the end. */
function start(command, args, env = {}) {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk.toString()));
  child.stderr.on('data', (chunk) => (output += chunk.toString()));
  children.add(child);
  child.once('exit', () => children.delete(child));
  return { child, output: () => output };
}

/** Waits for a line matching `pattern` in a started process's output. */
async function waitOutput(proc, pattern, what) {
  return until(() => {
    if (proc.child.exitCode !== null || proc.child.signalCode !== null) {
      throw new Error(`${what}: the process exited:\n${proc.output()}`);
    }
    const match = proc.output().match(pattern);
    return match && (match[1] ?? match[0]);
  }, what);
}

async function stop(proc, signal) {
  if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
  const exited = new Promise((resolve) => proc.child.once('exit', resolve));
  proc.child.kill(signal);
  const bounded = await Promise.race([exited.then(() => true), new Promise((r) => setTimeout(() => r(false), 5_000))]);
  if (!bounded) proc.child.kill('SIGKILL');
}

/** A free TCP port on 127.0.0.1 (the OS picks it; released before Mosquitto binds it). */
async function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function canConnect(port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host: '127.0.0.1', port }, () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

function mqttString(text) {
  const bytes = Buffer.from(text, 'utf8');
  const length = Buffer.alloc(2);
  length.writeUInt16BE(bytes.length);
  return Buffer.concat([length, bytes]);
}

function mqttPacket(firstByte, body) {
  const length = [];
  let n = body.length;
  do {
    let digit = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) digit |= 0x80;
    length.push(digit);
  } while (n > 0);
  return Buffer.concat([Buffer.from([firstByte, ...length]), body]);
}

/**
 * A minimal MQTT 3.1.1 observer (CONNECT, SUBSCRIBE at QoS 0, PUBLISH received), an
 * independent view of what the device and the Connector publish on the broker, without a
 * client library. `messages` collects `{topic, payload, retained}` in arrival order.
 */
class MqttObserver {
  constructor(port, filter) {
    this.messages = [];
    this.socket = net.connect({ host: '127.0.0.1', port });
    let buffer = Buffer.alloc(0);
    this.ready = new Promise((resolve, reject) => {
      this.socket.once('error', reject);
      this.socket.on('connect', () => {
        const connect = Buffer.concat([
          mqttString('MQTT'), Buffer.from([4, 0x02, 0, 30]), mqttString(`e2e-observer-${randomBytes(4).toString('hex')}`),
        ]);
        this.socket.write(mqttPacket(0x10, connect));
        this.socket.write(mqttPacket(0x82, Buffer.concat([Buffer.from([0, 1]), mqttString(filter), Buffer.from([0])])));
      });
      this.socket.on('data', (chunk) => {
        buffer = Buffer.concat([buffer, chunk]);
        for (;;) {
          if (buffer.length < 2) return;
          let length = 0;
          let multiplier = 1;
          let at = 1;
          for (;;) {
            if (at >= buffer.length) return;
            const digit = buffer[at++];
            length += (digit & 0x7f) * multiplier;
            multiplier *= 128;
            if ((digit & 0x80) === 0) break;
            if (at > 4) return reject(new Error('bad MQTT remaining length'));
          }
          if (buffer.length < at + length) return;
          const header = buffer[0];
          const type = header >> 4;
          const body = buffer.subarray(at, at + length);
          buffer = buffer.subarray(at + length);
          if (type === 2 && body[1] !== 0) reject(new Error(`the broker refused the observer (${body[1]})`));
          if (type === 9) resolve();
          if (type === 3) {
            const topicLength = body.readUInt16BE(0);
            const qos = (header >> 1) & 0x03;
            const payloadAt = 2 + topicLength + (qos > 0 ? 2 : 0);
            this.messages.push({
              topic: body.subarray(2, 2 + topicLength).toString('utf8'),
              payload: body.subarray(payloadAt).toString('utf8'),
              retained: (header & 0x01) === 1,
            });
          }
        }
      });
    });
  }
  /** The payloads received on one topic, oldest first. */
  payloads(topic) {
    return this.messages.filter((m) => m.topic === topic).map((m) => m.payload);
  }
  close() {
    this.socket.destroy();
  }
}

async function call(client, name, args = {}) {
  return client.callTool({ name, arguments: args }, undefined, { timeout: 30_000 });
}

function structured(result) {
  assert.ok(!result.isError, `tool error: ${JSON.stringify(result.content)}`);
  return result.structuredContent ?? JSON.parse(result.content[0].text);
}

function toolError(result) {
  assert.ok(result.isError, `expected a tool error, got ${JSON.stringify(result.content)}`);
  return result.structuredContent?.error ?? JSON.parse(result.content[0].text).error;
}

async function main() {
  const work = mkdtempSync(path.join(tmpdir(), 'xagent-mcp-device-e2e-'));
  const port = await freePort();
  const mqttUrl = `mqtt://127.0.0.1:${port}`;
  const topic = `homie/${deviceId}/thermostat/target-temperature`;
  writeFileSync(path.join(work, 'mosquitto.conf'), `listener ${port} 127.0.0.1\nallow_anonymous true\npersistence false\n`);
  let mosquitto;
  let sim;
  let homie;
  let transport;
  let client;
  let observer;
  const stderr = [];
  const toolsChanged = [];
  try {
    mosquitto = start(mosquittoBin, ['-c', path.join(work, 'mosquitto.conf')]);
    await until(async () => {
      if (mosquitto.child.exitCode !== null) throw new Error(`mosquitto exited:\n${mosquitto.output()}`);
      return canConnect(port);
    }, 'mosquitto to listen');
    sim = start(simBin, ['--mqtt-url', mqttUrl, '--device-id', deviceId]);
    await waitOutput(sim, /homie device \S+ ready/, 'the simulated device to be ready');
    homie = start(bin, [
      'homie', '--listen', '127.0.0.1:0', '--state-dir', path.join(work, 'homie'), '--mqtt-url', mqttUrl,
    ], { XAGENT_CONNECTOR_API_KEY: apiKey, XAGENT_HOMIE_PAIRING_CODES: `${deviceId}=${pairingCode}` });
    const baseUrl = await waitOutput(homie, /device\.homie listening on (http\S+)/, 'device.homie to listen');
    log(`mosquitto on ${port}, device ${deviceId}, device.homie at ${baseUrl}`);

    transport = new StdioClientTransport({
      command: bin,
      args: [
        'mcp', '--base-url', baseUrl, '--state-dir', path.join(work, 'bridge'),
        '--flow', 'homie_bind', '--input', `device_id=${deviceId}`, '--input', `pairing_code=${pairingCode}`,
      ],
      env: { ...process.env, XAGENT_CONNECTOR_API_KEY: apiKey, RUST_LOG: 'info' },
      stderr: 'pipe',
    });
    transport.stderr?.on('data', (chunk) => stderr.push(chunk.toString()));
    client = new Client({ name: 'xagent-mcp-device-e2e', version: '0.1.0' }, { capabilities: {} });
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => toolsChanged.push(Date.now()));
    await client.connect(transport);
    bridgePid = transport.pid;

    // 1. The homie Tools are listed (the bound device is ready, so they are available).
    const names = await until(async () => {
      const listed = (await client.listTools()).tools.map((t) => t.name);
      return HOMIE_TOOLS.every((n) => listed.includes(n)) && listed;
    }, 'the homie Tools in the list');
    for (const name of ['connector_channels_list', 'connector_message_send']) assert.ok(names.includes(name), `${name} is listed`);
    const setTool = (await client.listTools()).tools.find((t) => t.name === 'homie_property_set');
    assert.deepEqual([...setTool.inputSchema.required].sort(), ['node', 'property', 'value'], 'the set Tool takes node, property, value');
    assert.ok(!JSON.stringify(setTool.inputSchema).includes('device_id'), 'no Tool takes a device id');
    const channels = structured(await call(client, 'connector_channels_list')).channels;
    assert.equal(channels.length, 1);
    assert.equal(channels[0].status, 'connected');
    log(`ok 1 - the homie Tools are listed (${names.join(', ')})`);

    // 2. A settable property set within range through MCP.
    const describe = structured(await call(client, 'homie_device_describe'));
    const thermostat = describe.nodes.find((n) => n.node === 'thermostat');
    const target = thermostat.properties.find((p) => p.property === 'target-temperature');
    assert.equal(target.settable, true, 'target-temperature is settable');
    const newValue = target.value === 23.5 ? 24.5 : 23.5;
    observer = new MqttObserver(port, `homie/${deviceId}/thermostat/#`);
    await observer.ready;
    const set = structured(await call(client, 'homie_property_set', { node: 'thermostat', property: 'target-temperature', value: newValue }));
    assert.equal(set.value, newValue, 'the result carries the value the device published');
    assert.equal(set.confirmed, true, 'the device confirmed it');
    const read = structured(await call(client, 'homie_property_read', { node: 'thermostat', property: 'target-temperature' }));
    assert.equal(read.value, newValue, 'homie_property_read reads the new value');
    await until(() => observer.payloads(`${topic}/set`).some((v) => Number(v) === newValue), `the Connector's ${topic}/set`);
    const onBroker = await until(() => observer.payloads(topic).find((v) => Number(v) === newValue), `the device's ${topic}`);
    log(`ok 2 - homie_property_set sets target-temperature to ${newValue}: result, read Tool and the device's topic (${onBroker}) agree`);

    // 3. Out of range: invalid_arguments, nothing published.
    const outOfRange = toolError(await call(client, 'homie_property_set', { node: 'thermostat', property: 'target-temperature', value: 99 }));
    assert.equal(outOfRange.code, 'invalid_arguments', `out of range is invalid_arguments (${JSON.stringify(outOfRange)})`);
    const sets = observer.payloads(`${topic}/set`);
    assert.ok(sets.every((v) => Number(v) === newValue), `nothing out of range was published to the device (${sets})`);
    const reread = structured(await call(client, 'homie_property_read', { node: 'thermostat', property: 'target-temperature' }));
    assert.equal(reread.value, newValue, 'the device keeps the value set before');
    log('ok 3 - a value out of range is an MCP tool error with code invalid_arguments');

    // 4. The device drops off the broker: the Tools become unavailable.
    const changesBefore = toolsChanged.length;
    await stop(sim, 'SIGKILL');
    await until(() => toolsChanged.length > changesBefore, 'notifications/tools/list_changed after the device was lost');
    const remaining = await until(async () => {
      const listed = (await client.listTools()).tools.map((t) => t.name);
      return !listed.includes('homie_property_set') && listed;
    }, 'homie_property_set to leave the list');
    for (const name of HOMIE_TOOLS) assert.ok(!remaining.includes(name), `${name} is gone (got ${remaining})`);
    assert.ok(remaining.includes('connector_channels_list'), 'the built-ins stay');
    const lost = structured(await call(client, 'connector_channels_list')).channels;
    assert.equal(lost[0].status, 'offline', `the channel shows the device offline (${JSON.stringify(lost)})`);
    const offline = toolError(await call(client, 'homie_property_set', { node: 'thermostat', property: 'target-temperature', value: 21 }));
    // The Descriptor marks the Tool unavailable, so the runtime refuses the call itself
    // (section 10.1: no channel on which the Tool is available) without asking the Connector.
    assert.equal(offline.code, 'connector_channel_unavailable', `a call while the device is lost is refused (${JSON.stringify(offline)})`);
    log(`ok 4 - the device lost: notifications/tools/list_changed, the homie Tools are gone, a call gets ${offline.code}`);

    // 5. The device comes back: so do the Tools.
    const changesBeforeReturn = toolsChanged.length;
    sim = start(simBin, ['--mqtt-url', mqttUrl, '--device-id', deviceId]);
    await waitOutput(sim, /homie device \S+ ready/, 'the simulated device to be ready again');
    await until(() => toolsChanged.length > changesBeforeReturn, 'notifications/tools/list_changed after the device came back');
    await until(async () => (await client.listTools()).tools.some((t) => t.name === 'homie_property_set'), 'homie_property_set back in the list');
    const again = structured(await call(client, 'homie_property_set', { node: 'thermostat', property: 'mode', value: 'cool' }));
    assert.equal(again.value, 'cool');
    assert.equal(structured(await call(client, 'connector_channels_list')).channels[0].status, 'connected');
    log('ok 5 - the device back: the Tools return after notifications/tools/list_changed and work');

    // 6. Secrets stay out of the bridge's logs.
    const logs = stderr.join('');
    assert.ok(logs.length > 0, 'the bridge logged to stderr');
    assert.ok(!logs.includes(apiKey), 'the API key is not logged');
    assert.ok(!logs.includes(pairingCode), 'the pairing code is not logged');
    assert.ok(typeof bridgePid === 'number');
    log('ok 6 - the bridge logs neither the API key nor the pairing code');
    log('all MCP device end-to-end checks passed');
  } catch (error) {
    process.stderr.write(`--- bridge stderr ---\n${stderr.join('')}\n`);
    if (homie) process.stderr.write(`--- device.homie output ---\n${homie.output()}\n`);
    if (sim) process.stderr.write(`--- homie-sim output ---\n${sim.output()}\n`);
    if (mosquitto) process.stderr.write(`--- mosquitto output ---\n${mosquitto.output()}\n`);
    throw error;
  } finally {
    if (observer) observer.close();
    if (client) await client.close().catch(() => {});
    bridgePid = undefined;
    await stop(homie, 'SIGINT');
    await stop(sim, 'SIGTERM');
    await stop(mosquitto, 'SIGTERM');
    rmSync(work, { recursive: true, force: true });
  }
}

// Kill whatever is left on any exit, and bound the whole run.
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
  if (bridgePid) {
    try {
      process.kill(bridgePid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
});
setTimeout(() => {
  process.stderr.write(`the device end-to-end test did not finish within ${RUN_LIMIT / 1000} s\n`);
  process.exit(1);
}, RUN_LIMIT).unref();

main().then(
  () => process.exit(0),
  (error) => {
    process.stderr.write(`${error.stack || error}\n`);
    process.exit(1);
  },
);
