// What the browser tests share: where the binaries are, free ports, named steps and stopping a
// child process. Each test file keeps only its own scenario.

import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The e2e folder and the repository root. */
export const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..');

/** The CLI under test (XAGENT_CONNECTOR_BIN, default the workspace's debug build). */
export const bin = process.env.XAGENT_CONNECTOR_BIN || path.join(root, 'target/debug/xagent-connector');

/** The system Chromium playwright-core drives (CHROMIUM, default Debian's). */
export const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';

/** How long a test waits for anything it expects. */
export const TIMEOUT = 20_000;

/** One line on stdout. */
export function log(line) {
  process.stdout.write(line + '\n');
}

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export async function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** The names of the steps that passed, in order. */
export const steps = [];

/** Runs one named step, logging how long it took. */
export async function step(name, body) {
  const started = Date.now();
  await body();
  steps.push(name);
  log(`ok   ${name} (${Date.now() - started} ms)`);
}

/** Interrupts a child like Ctrl-C, killing it when it has not exited after 10 s. */
export async function stopChild(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGINT');
  const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(timer);
}

/** Calls `onLine` with each trimmed line a child prints on `stream`, and `onChunk` with the raw text. */
export function onLines(stream, onLine, onChunk = () => {}) {
  let buffer = '';
  stream.on('data', (chunk) => {
    const text = chunk.toString();
    onChunk(text);
    buffer += text;
    let index;
    while ((index = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, index).trim();
      buffer = buffer.slice(index + 1);
      onLine(line);
    }
  });
}

/** Ends the test process with the error's stack when `main` fails. */
export function runMain(main) {
  main().catch((error) => {
    process.stderr.write(`FAILED: ${error.stack || error}\n`);
    process.exit(1);
  });
}
