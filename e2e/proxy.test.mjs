// The deployment behind TLS, tested (issue 26, item 8): a real nginx (Debian) with a
// certificate made for this run serves `xagent-connector demo` (im.webchat plus its agent
// stand-in) under the path prefix /connectors/webchat/, using deploy/nginx/*.conf as shipped.
//
// Through the proxy it checks that:
//   1. `xagent-connector conformance --base-url https://127.0.0.1:PORT/connectors/webchat
//      --ca-cert ca.pem` passes (the client trusts the test's CA through the documented option,
//      and refuses the proxy without it);
//   2. the page works in Chromium: join, send, receive the streamed reply, a file both ways;
//   3. wrong access codes from two client addresses (127.0.0.2 and 127.0.0.3, forwarded by
//      nginx) are throttled apart, a forged X-Forwarded-For sent through nginx does not move a
//      guesser to another address, and one sent straight to the Connector by a peer that is not
//      a trusted proxy is ignored; the log names the real addresses.
//
// Environment: XAGENT_CONNECTOR_BIN (default ../target/debug/xagent-connector), CHROMIUM
// (default /usr/bin/chromium), NGINX (default /usr/sbin/nginx).

import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { TIMEOUT, bin, chromiumPath, freePort, log, onLines, root, runMain, step, steps, stopChild } from './support.mjs';

const nginxPath = process.env.NGINX || '/usr/sbin/nginx';
const PREFIX = '/connectors/webchat';

/** A CA and a server certificate for 127.0.0.1 signed by it, made with openssl. */
function makeCertificates(dir) {
  const run = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  run('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'ca.key',
    '-out', 'ca.pem', '-days', '2', '-subj', '/CN=xagent proxy test CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  run('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', 'server.key',
    '-out', 'server.csr', '-subj', '/CN=127.0.0.1');
  writeFileSync(path.join(dir, 'server.ext'),
    'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n');
  run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
    '-out', 'server.pem', '-days', '2', '-extfile', 'server.ext');
  // Chromium trusts exactly this server key (its SPKI hash), nothing else.
  const spki = execFileSync('sh', ['-c',
    'openssl x509 -in server.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64'],
  { cwd: dir }).toString().trim();
  return { ca: path.join(dir, 'ca.pem'), spki };
}

/** Starts nginx in front of the Connector at `upstream`, listening on `port`. */
async function startNginx(dir, port, upstream) {
  for (const sub of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) {
    mkdirSync(path.join(dir, 'temp', sub), { recursive: true });
    chmodSync(path.join(dir, 'temp', sub), 0o777);
  }
  const conf = `
daemon off;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log info;
events { worker_connections 256; }
http {
    access_log ${dir}/access.log;
    client_body_temp_path ${dir}/temp/body;
    proxy_temp_path ${dir}/temp/proxy;
    fastcgi_temp_path ${dir}/temp/fastcgi;
    uwsgi_temp_path ${dir}/temp/uwsgi;
    scgi_temp_path ${dir}/temp/scgi;
    include ${root}/deploy/nginx/xagent-upgrade-map.conf;
    server {
        listen 127.0.0.1:${port} ssl;
        ssl_certificate ${dir}/server.pem;
        ssl_certificate_key ${dir}/server.key;
        client_max_body_size 30m;
        location ${PREFIX}/ {
            proxy_pass http://${upstream}/;
            include ${root}/deploy/nginx/xagent-proxy.conf;
        }
    }
}
`;
  writeFileSync(path.join(dir, 'nginx.conf'), conf);
  execFileSync(nginxPath, ['-t', '-p', dir, '-e', `${dir}/error.log`, '-c', `${dir}/nginx.conf`], { stdio: 'pipe' });
  const child = spawn(nginxPath, ['-p', dir, '-e', `${dir}/error.log`, '-c', `${dir}/nginx.conf`], { stdio: 'ignore' });
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    const open = await new Promise((resolve) => {
      const socket = net.connect(port, '127.0.0.1', () => { socket.end(); resolve(true); });
      socket.on('error', () => resolve(false));
    });
    if (open) break;
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`nginx did not start:\n${readFileSync(path.join(dir, 'error.log'), 'utf8')}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return child;
}

/** Starts the demo behind the proxy and resolves once it printed its links. */
function startDemo(port, stateDir, publicUrl, ca) {
  const child = spawn(bin, ['demo', '--listen', `127.0.0.1:${port}`, '--state-dir', stateDir,
    '--public-url', publicUrl, '--trusted-proxy', '127.0.0.1', '--ca-cert', ca, '--delta-interval', '60'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const demo = { child, roomUrl: null, conformance: null, output: '' };
  onLines(child.stdout, (line) => {
    let match;
    if ((match = line.match(/^Open (http\S+)/))) demo.roomUrl = match[1];
    if (line.startsWith('xagent-connector conformance ')) demo.conformance = line.split(/\s+/).slice(1);
  }, (text) => { demo.output += text; });
  child.stderr.on('data', (chunk) => { demo.output += chunk.toString(); });
  demo.ready = async () => {
    const deadline = Date.now() + TIMEOUT;
    while (!(demo.roomUrl && demo.conformance)) {
      if (child.exitCode !== null) throw new Error(`the demo exited (${child.exitCode}):\n${demo.output}`);
      if (Date.now() > deadline) throw new Error(`the demo printed no links:\n${demo.output}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  };
  demo.stop = () => stopChild(child);
  return demo;
}

/** A join with `code` from `localAddress`, to `url` (https through the proxy or http straight). */
function join(url, code, { localAddress, headers = {}, ca }) {
  const target = new URL(url);
  const body = JSON.stringify({ access_code: code });
  const client = target.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const request = client.request(target, {
      method: 'POST', localAddress, ca, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...headers },
    }, (response) => {
      let text = '';
      response.on('data', (chunk) => { text += chunk; });
      response.on('end', () => resolve({ status: response.statusCode, text }));
    });
    request.setTimeout(TIMEOUT, () => request.destroy(new Error('the join timed out')));
    request.on('error', reject);
    request.end(body);
  });
}

async function main() {
  const dir = mkdtempSync(path.join(tmpdir(), 'webchat-proxy-'));
  chmodSync(dir, 0o755);
  const stateDir = path.join(dir, 'state');
  const profileDir = path.join(dir, 'chromium');
  const { ca, spki } = makeCertificates(dir);
  const caPem = readFileSync(ca);
  const proxyPort = await freePort();
  const upstreamPort = await freePort();
  const publicUrl = `https://127.0.0.1:${proxyPort}${PREFIX}`;
  const nginx = await startNginx(dir, proxyPort, `127.0.0.1:${upstreamPort}`);
  const demo = startDemo(upstreamPort, stateDir, publicUrl, ca);
  let context;
  try {
    await demo.ready();
    assert.ok(demo.roomUrl.startsWith(`${publicUrl}/chat/r/demo#code=`), `the room link is the proxy's: ${demo.roomUrl}`);
    const accessCode = new URL(demo.roomUrl).hash.replace('#code=', '');
    log(`nginx on ${proxyPort} in front of the demo on ${upstreamPort}`);

    await step('conformance through nginx passes, trusting the test CA by --ca-cert', async () => {
      // The demo's own suggestion, pointed at the proxy instead of the Connector itself.
      const args = demo.conformance.map((arg, i, all) => (all[i - 1] === '--base-url' ? publicUrl : arg));
      const untrusted = await run(bin, args);
      assert.notEqual(untrusted.status, 0, 'without --ca-cert the private CA is not trusted');
      const trusted = await run(bin, [...args, '--ca-cert', ca]);
      assert.equal(trusted.status, 0, `conformance through the proxy:\n${trusted.stdout}\n${trusted.stderr}`);
      assert.match(trusted.stdout, / 0 failed/);
      // The transfer plane under the prefix: an upload and its download through the proxy.
      assert.match(trusted.stdout, /^pass transfer\.upload /m);
      assert.match(trusted.stdout, /^pass transfer\.download /m);
    });

    await step('the page through nginx: join, send, receive, a file both ways', async () => {
      context = await chromium.launchPersistentContext(profileDir, {
        executablePath: chromiumPath,
        headless: true,
        viewport: { width: 960, height: 760 },
        args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
          '--disable-background-networking', '--disable-component-update', '--disable-sync',
          `--ignore-certificate-errors-spki-list=${spki}`],
      });
      context.setDefaultTimeout(TIMEOUT);
      const page = context.pages()[0] || (await context.newPage());
      page.on('pageerror', (error) => log(`page error: ${error.message}`));
      await page.goto(demo.roomUrl);
      await page.waitForSelector('#view-chat:not([hidden])');
      await page.waitForSelector('#agent-state.online');
      assert.ok(page.url().startsWith(`${publicUrl}/chat/r/demo`), `the page stays under the prefix: ${page.url()}`);
      await page.fill('#text', 'Hello through nginx');
      await page.press('#text', 'Enter');
      await page.waitForSelector('.msg.assistant:not(.draft) .text >> text=Hello through nginx');
      await page.waitForSelector('.msg.visitor .meta >> text=delivered');
      const dataUrl = await page.evaluate(() => {
        const canvas = document.createElement('canvas');
        canvas.width = 120;
        canvas.height = 80;
        const g = canvas.getContext('2d');
        g.fillStyle = '#2f5bea';
        g.fillRect(0, 0, 120, 80);
        g.fillStyle = '#ffd54f';
        g.fillRect(30, 20, 60, 40);
        return canvas.toDataURL('image/png');
      });
      await page.setInputFiles('#file-input', {
        name: 'through-proxy.png', mimeType: 'image/png', buffer: Buffer.from(dataUrl.split(',')[1], 'base64'),
      });
      await page.waitForSelector('.msg.assistant:not(.draft) .text >> text=through-proxy.png');
      const images = await page.waitForFunction((prefix) => {
        const all = [...document.querySelectorAll('.msg img')];
        const ok = (img) => img.complete && img.naturalWidth === 120 && new URL(img.src).pathname.startsWith(prefix);
        const visitor = all.filter((img) => img.closest('.msg.visitor')).some(ok);
        const agent = all.filter((img) => img.closest('.msg.assistant')).some(ok);
        return visitor && agent;
      }, PREFIX);
      assert.ok(await images.jsonValue(), 'the picture went up and came back through the proxy');
    });

    await step('wrong codes from two forwarded addresses are throttled apart; forged headers are ignored', async () => {
      const viaProxy = `${publicUrl}/chat/api/rooms/demo/join`;
      const direct = `http://127.0.0.1:${upstreamPort}/chat/api/rooms/demo/join`;
      // 127.0.0.2 guesses until its address is held back (5 free wrong codes, then a backoff).
      const statuses = [];
      for (let i = 0; i < 7; i += 1) {
        statuses.push((await join(viaProxy, `wrong-${i}`, { localAddress: '127.0.0.2', ca: caPem })).status);
      }
      assert.deepEqual(statuses.slice(0, 5), [403, 403, 403, 403, 403], `first wrong codes: ${statuses}`);
      const held = await join(viaProxy, accessCode, { localAddress: '127.0.0.2', ca: caPem });
      assert.equal(held.status, 429, `127.0.0.2 is held back even with the right code: ${held.text}`);
      assert.match(held.text, /from your address/);
      // Claiming to be someone else through nginx does not help: nginx appends the real address.
      const forged = await join(viaProxy, accessCode, {
        localAddress: '127.0.0.2', ca: caPem, headers: { 'x-forwarded-for': '127.0.0.9', forwarded: 'for=127.0.0.9' },
      });
      assert.equal(forged.status, 429, 'a forged X-Forwarded-For through nginx is not believed');
      // 127.0.0.3, forwarded by the same nginx, has a budget of its own.
      assert.equal((await join(viaProxy, 'wrong-other', { localAddress: '127.0.0.3', ca: caPem })).status, 403);
      assert.equal((await join(viaProxy, accessCode, { localAddress: '127.0.0.3', ca: caPem })).status, 200);
      // Straight to the Connector from a peer that is not a trusted proxy: the header is ignored.
      // Naming the locked address does not lock this peer out...
      const named = await join(direct, accessCode, { localAddress: '127.0.0.4', headers: { 'x-forwarded-for': '127.0.0.2' } });
      assert.equal(named.status, 200, `a forged header from an untrusted peer is ignored: ${named.text}`);
      // ...and naming a new address each time does not spread its guesses.
      const spread = [];
      for (let i = 0; i < 7; i += 1) {
        spread.push((await join(direct, `wrong-${i}`, { localAddress: '127.0.0.5', headers: { 'x-forwarded-for': `10.0.0.${i + 1}` } })).status);
      }
      assert.equal(spread.at(-1), 429, `one untrusted peer is one address whatever it claims: ${spread}`);
      // The log names the visitors' real addresses, not the proxy's.
      assert.match(demo.output, /127\.0\.0\.2/, 'the log names the forwarded address');
      assert.doesNotMatch(demo.output, /10\.0\.0\.\d/, 'a forged address never reaches the log');
    });

    log(`\n${steps.length} steps passed`);
  } catch (error) {
    if (context) {
      for (const open of context.pages()) {
        const shown = await open.evaluate(() => [...document.querySelectorAll('.msg')].map((m) => `${m.className}: ${m.textContent}`)).catch(() => []);
        log(`page ${open.url()}:\n  ${shown.join('\n  ')}`);
      }
    }
    log(`demo output:\n${demo.output}`);
    try { log(`nginx error log:\n${readFileSync(path.join(dir, 'error.log'), 'utf8').slice(-4000)}`); } catch {}
    throw error;
  } finally {
    if (context) await context.close().catch(() => {});
    await demo.stop();
    nginx.kill('SIGQUIT');
    await new Promise((resolve) => (nginx.exitCode !== null ? resolve() : nginx.once('exit', resolve)));
    rmSync(dir, { recursive: true, force: true });
  }
}

function run(command, args) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk) => { stdout += chunk; });
    child.stderr.on('data', (chunk) => { stderr += chunk; });
    child.on('exit', (status) => resolve({ status, stdout, stderr }));
  });
}

runMain(main);
