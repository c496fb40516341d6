// What both end-to-end tests of the MCP bridge share: where the binaries are, the wait for
// a condition, and the log line.

import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository root. */
export const root = path.resolve(here, '..');
/** The `xagent-connector` binary (XAGENT_CONNECTOR_BIN, default the debug build). */
export const bin = process.env.XAGENT_CONNECTOR_BIN || path.join(root, 'target/debug/xagent-connector');
/** How long one awaited condition may take. */
export const TIMEOUT = 20_000;

export function log(line) {
  process.stdout.write(line + '\n');
}

/** Polls `predicate` every 100 ms until it returns something truthy; fails after `timeout`. */
export async function until(predicate, what, timeout = TIMEOUT) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
