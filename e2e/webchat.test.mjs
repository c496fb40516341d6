// Browser test of the im.webchat page, headless system Chromium driven by playwright-core.
//
// It starts `xagent-connector demo` (the im.webchat Connector plus the xAgent stand-in, in one
// process) on a free port with a fresh state directory, then in the browser:
//   1. opens the room link, sends a message, sees the reply grow (several draft lengths) and
//      settle into exactly one final message, with the activity line shown meanwhile;
//   2. uploads an image and sees it arrive back from the agent as a loaded <img>;
//   3. sends a message the stand-in rejects and sees the rejection under it;
//   4. restarts the demo process on the same port and state: the page reconnects by itself
//      and the conversation continues;
//   5. uploads an SVG carrying a script: it is a sandboxed download, never an image, and the
//      script does not run (issue 14, H1); no visitor token is in localStorage or a URL;
//   6. reopens the room with its history: the list shows the newest message, on desktop and
//      phone sizes, also after the images loaded;
//   7. saves screenshots (desktop and phone size) of the finished conversation;
//   8. completes the QR pairing flow from the printed link and chats in the new room;
//   9. restarts the demo: the paired room still has its agent.
//
// Environment: XAGENT_CONNECTOR_BIN (default ../target/debug/xagent-connector), CHROMIUM
// (default /usr/bin/chromium), WEBCHAT_SCREENSHOT_DIR (default e2e/out).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { TIMEOUT, bin, chromiumPath, freePort, here, log, onLines, runMain, step, steps, stopChild } from './support.mjs';

const shots = process.env.WEBCHAT_SCREENSHOT_DIR || path.join(here, 'out');

/** Starts the demo and resolves once it printed its room link. */
function startDemo(port, stateDir) {
  const child = spawn(bin, ['demo', '--listen', `127.0.0.1:${port}`, '--state-dir', stateDir, '--delta-interval', '120'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const demo = { child, roomUrl: null, pairUrls: [], paired: 0, output: '', waiters: [] };
  const notify = () => {
    for (const waiter of demo.waiters.splice(0)) waiter();
  };
  onLines(child.stdout, (line) => {
    let match;
    if ((match = line.match(/^Open (http\S+)/))) demo.roomUrl = match[1];
    if ((match = line.match(/pair a new room with the agent: (http\S+)/))) demo.pairUrls.push(match[1]);
    if (line.startsWith('Paired:')) demo.paired += 1;
    notify();
  }, (text) => { demo.output += text; });
  child.stderr.on('data', (chunk) => {
    demo.output += chunk.toString();
  });
  child.on('exit', notify);
  demo.until = async (predicate, what) => {
    const deadline = Date.now() + TIMEOUT;
    while (!predicate()) {
      if (child.exitCode !== null) throw new Error(`the demo exited (${child.exitCode}) while waiting for ${what}:\n${demo.output}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}:\n${demo.output}`);
      await new Promise((resolve) => {
        demo.waiters.push(resolve);
        setTimeout(resolve, 200);
      });
    }
  };
  demo.stop = () => stopChild(child);
  return demo;
}

async function draftLengthsWhileStreaming(page, needle) {
  // Samples the streaming draft until the final message with `needle` is shown.
  const lengths = new Set();
  const deadline = Date.now() + TIMEOUT;
  while (Date.now() < deadline) {
    const state = await page.evaluate((text) => {
      const drafts = [...document.querySelectorAll('.msg.assistant.draft .text')].map((n) => n.textContent);
      const finals = [...document.querySelectorAll('.msg.assistant:not(.draft) .text')]
        .map((n) => n.textContent)
        .filter((t) => t.includes(text));
      return { drafts, finals };
    }, needle);
    for (const draft of state.drafts) lengths.add(draft.length);
    if (state.finals.length > 0 && state.drafts.length === 0) return { lengths, finals: state.finals };
    await page.waitForTimeout(40);
  }
  throw new Error('the reply never settled');
}

async function main() {
  mkdirSync(shots, { recursive: true });
  const stateDir = mkdtempSync(path.join(tmpdir(), 'webchat-e2e-state-'));
  const profileDir = mkdtempSync(path.join(tmpdir(), 'webchat-e2e-chromium-'));
  const port = await freePort();
  let demo = startDemo(port, stateDir);
  let context;
  let pairedPage;
  try {
    await demo.until(() => demo.roomUrl && demo.pairUrls.length > 0, 'the demo URLs');
    log(`demo on port ${port}: ${demo.roomUrl}`);
    context = await chromium.launchPersistentContext(profileDir, {
      executablePath: chromiumPath,
      headless: true,
      viewport: { width: 960, height: 760 },
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
      ],
    });
    context.setDefaultTimeout(TIMEOUT);
    const page = context.pages()[0] || (await context.newPage());
    page.on('pageerror', (error) => log(`page error: ${error.message}`));

    await step('open the room link and join with the code from the URL fragment', async () => {
      await page.goto(demo.roomUrl);
      await page.waitForSelector('#view-chat:not([hidden])');
      await page.waitForSelector('#agent-state.online');
      assert.equal(new URL(page.url()).hash, '', 'the access code is removed from the address bar');
      assert.equal(await page.textContent('#room-name'), 'demo');
    });

    await step('send a message, see the reply grow and settle into one message', async () => {
      await page.fill('#text', 'Hello from the browser test');
      await page.press('#text', 'Enter');
      await page.waitForSelector('.msg.visitor .text >> text=Hello from the browser test');
      await page.waitForSelector('#activity:not([hidden])');
      const activity = await page.textContent('#activity-text');
      assert.match(activity, /thinking|using/);
      const { lengths, finals } = await draftLengthsWhileStreaming(page, 'Hello from the browser test');
      assert.ok(lengths.size >= 3, `the draft grew through several lengths (saw ${[...lengths].join(', ')})`);
      assert.equal(finals.length, 1, 'exactly one final assistant message');
      await page.waitForSelector('.msg.visitor .meta >> text=delivered');
      await page.waitForSelector('#activity', { state: 'hidden' });
    });

    await step('upload an image and see it come back from the agent', async () => {
      // A small picture drawn in the page (a real PNG, so the browser must decode it).
      const dataUrl = await page.evaluate(() => {
        const canvas = document.createElement('canvas');
        canvas.width = 240;
        canvas.height = 150;
        const g = canvas.getContext('2d');
        const sky = g.createLinearGradient(0, 0, 240, 150);
        sky.addColorStop(0, '#2f5bea');
        sky.addColorStop(1, '#8e44ad');
        g.fillStyle = sky;
        g.fillRect(0, 0, 240, 150);
        g.fillStyle = '#ffd54f';
        g.beginPath();
        g.arc(182, 44, 22, 0, Math.PI * 2);
        g.fill();
        g.fillStyle = '#1b5e20';
        g.beginPath();
        g.moveTo(0, 150);
        g.lineTo(70, 70);
        g.lineTo(130, 150);
        g.moveTo(80, 150);
        g.lineTo(160, 86);
        g.lineTo(240, 150);
        g.fill();
        return canvas.toDataURL('image/png');
      });
      const picture = Buffer.from(dataUrl.split(',')[1], 'base64');
      await page.setInputFiles('#file-input', { name: 'picture.png', mimeType: 'image/png', buffer: picture });
      await page.waitForSelector('.msg.assistant:not(.draft) .text >> text=picture.png');
      const loaded = await page.waitForFunction(() => {
        const images = [...document.querySelectorAll('.msg img')];
        const visitor = images.filter((img) => img.closest('.msg.visitor') && img.src.includes('/files/'));
        const agent = images.filter((img) => img.closest('.msg.assistant'));
        const ok = (img) => img.complete && img.naturalWidth === 240;
        return visitor.some(ok) && agent.some(ok) ? agent.length : false;
      });
      assert.ok((await loaded.jsonValue()) >= 1);
    });

    await step('a message xAgent rejects shows the rejection', async () => {
      await page.fill('#text', '/reject this one please');
      await page.press('#text', 'Enter');
      const meta = await page.waitForSelector('.msg.visitor.rejected .meta');
      assert.match(await meta.textContent(), /not delivered: .*\/reject/);
    });

    await step('restart the Connector: the page reconnects by itself', async () => {
      await demo.stop();
      await page.waitForSelector('#banner:not([hidden])');
      demo = startDemo(port, stateDir);
      await demo.until(() => demo.roomUrl, 'the restarted demo');
      await page.waitForSelector('#banner', { state: 'hidden' });
      await page.waitForSelector('#agent-state.online');
      await page.fill('#text', 'Still there after the restart?');
      await page.press('#text', 'Enter');
      const { finals } = await draftLengthsWhileStreaming(page, 'Still there after the restart?');
      assert.equal(finals.length, 1);
      const count = await page.locator('.msg.visitor .text >> text=Hello from the browser test').count();
      assert.equal(count, 1, 'history is shown once after the reconnect');
    });

    await step('an uploaded SVG with a script never runs (H1: a sandboxed download, not an image)', async () => {
      const svg = Buffer.from(
        '<svg xmlns="http://www.w3.org/2000/svg" onload="top.__pwned = 1">' +
          '<script>top.__pwned = 1; try { localStorage.setItem("pwned", document.cookie || "1"); } catch (e) {}</script>' +
          '</svg>',
      );
      await page.setInputFiles('#file-input', { name: 'evil.svg', mimeType: 'image/svg+xml;charset=utf-8', buffer: svg });
      await page.waitForSelector('.msg.assistant:not(.draft) .text >> text=evil.svg');
      const seen = await page.evaluate(async () => {
        const links = [...document.querySelectorAll('.msg a.file-link')].filter((a) => a.textContent.includes('evil.svg'));
        const images = [...document.querySelectorAll('.msg img')].filter((img) => img.alt === 'evil.svg');
        const url = links.length ? links[links.length - 1].getAttribute('href') : null;
        let headers = null;
        if (url) {
          const response = await fetch(url, { credentials: 'same-origin' });
          headers = {
            type: response.headers.get('content-type'),
            disposition: response.headers.get('content-disposition'),
            csp: response.headers.get('content-security-policy'),
          };
          // Even put in a frame on purpose, the file does not run in the chat's origin.
          const frame = document.createElement('iframe');
          frame.src = url;
          document.body.appendChild(frame);
          await new Promise((resolve) => setTimeout(resolve, 1500));
          frame.remove();
        }
        return { links: links.length, images: images.length, url, headers, pwned: window.__pwned, stored: localStorage.getItem('pwned') };
      });
      assert.ok(seen.links >= 1, 'the SVG is offered as a download link');
      assert.equal(seen.images, 0, 'the SVG is never an <img>');
      assert.ok(!/token=/.test(seen.url || ''), 'no token in the file URL');
      assert.equal(seen.headers.type, 'application/octet-stream');
      assert.match(seen.headers.disposition, /^attachment/);
      assert.match(seen.headers.csp, /sandbox/);
      assert.equal(seen.pwned, undefined, 'the script did not run');
      assert.equal(seen.stored, null, 'the script wrote nothing to the page storage');
      const tokens = await page.evaluate(() => Object.keys(localStorage).filter((k) => k.startsWith('webchat.token.')));
      assert.deepEqual(tokens, [], 'no visitor token in localStorage');
    });

    await step('a room opened with history shows its newest message (desktop and phone, after images load)', async () => {
      for (const size of [{ width: 960, height: 760 }, { width: 390, height: 844 }]) {
        await page.setViewportSize(size);
        await page.goto(new URL('/chat/r/demo', demo.roomUrl).href);
        await page.waitForSelector('#view-chat:not([hidden])');
        await page.waitForSelector('.msg.assistant:not(.draft)');
        await page.waitForFunction(() => [...document.querySelectorAll('.msg img')].every((img) => img.complete));
        // Layout settles a few frames after the last image: wait (bounded) for the list to reach
        // its end, then judge the position it settled on.
        await page
          .waitForFunction(() => {
            const list = document.getElementById('messages');
            return list.scrollTop + list.clientHeight >= list.scrollHeight - 2;
          }, null, { timeout: 5000 })
          .catch(() => {});
        const position = await page.evaluate(() => {
          const list = document.getElementById('messages');
          return { top: list.scrollTop, height: list.scrollHeight, client: list.clientHeight };
        });
        assert.ok(position.height > position.client, `the history overflows at ${size.width}px (${JSON.stringify(position)})`);
        assert.ok(position.top + position.client >= position.height - 2, `scrolled to the newest at ${size.width}px (${JSON.stringify(position)})`);
      }
      // A visitor who scrolled up to read stays where they are when the layout changes.
      await page.evaluate(() => {
        document.getElementById('messages').scrollTop = 0;
      });
      await page.waitForTimeout(100);
      await page.setViewportSize({ width: 960, height: 760 });
      await page.waitForTimeout(300);
      const reading = await page.evaluate(() => document.getElementById('messages').scrollTop);
      assert.ok(reading < 5, `a visitor reading history is not pulled down by a resize (scrollTop ${reading})`);
    });

    await step('screenshots of the finished conversation (desktop and phone)', async () => {
      await page.evaluate(() => {
        const list = document.getElementById('messages');
        list.scrollTop = list.scrollHeight;
      });
      await page.setViewportSize({ width: 960, height: 1180 });
      await page.waitForTimeout(200);
      await page.evaluate(() => {
        const list = document.getElementById('messages');
        list.scrollTop = list.scrollHeight;
      });
      await page.screenshot({ path: path.join(shots, 'webchat.png') });
      await page.setViewportSize({ width: 390, height: 844 });
      await page.waitForTimeout(200);
      await page.evaluate(() => {
        const list = document.getElementById('messages');
        list.scrollTop = list.scrollHeight;
      });
      await page.screenshot({ path: path.join(shots, 'webchat-phone.png') });
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth);
      assert.equal(overflow, false, 'no horizontal scrolling on a phone');
    });

    await step('complete the QR pairing flow from the link and chat in the new room', async () => {
      await demo.until(() => demo.pairUrls.length > 0, 'a pairing link');
      const link = demo.pairUrls[demo.pairUrls.length - 1];
      const pair = await context.newPage();
      await pair.setViewportSize({ width: 390, height: 844 });
      await pair.goto(link);
      await pair.waitForSelector('#pair-confirm:not([hidden])');
      await pair.fill('#pair-room', 'Paired room');
      await pair.click('#pair-button');
      await pair.waitForSelector('#view-chat:not([hidden])');
      await pair.waitForSelector('#invite:not([hidden])');
      await demo.until(() => demo.paired > 0, 'the stand-in to finish pairing');
      assert.equal(await pair.textContent('#room-name'), 'Paired room');
      await pair.fill('#text', 'Hello paired room');
      await pair.press('#text', 'Enter');
      const { finals } = await draftLengthsWhileStreaming(pair, 'Hello paired room');
      assert.equal(finals.length, 1);
      await pair.waitForSelector('.msg.visitor .meta >> text=delivered');
      // The link is one-time.
      const again = await context.newPage();
      await again.goto(link);
      await again.waitForSelector('#pair-error:not([hidden])');
      assert.match(await again.textContent('#pair-error'), /already used|not valid/);
      pairedPage = pair;
    });

    await step('restart the demo: the paired room keeps its agent', async () => {
      await demo.stop();
      demo = startDemo(port, stateDir);
      await demo.until(() => demo.roomUrl, 'the restarted demo');
      await pairedPage.waitForSelector('#agent-state.online');
      await pairedPage.fill('#text', 'Paired room after the restart');
      await pairedPage.press('#text', 'Enter');
      const { finals } = await draftLengthsWhileStreaming(pairedPage, 'Paired room after the restart');
      assert.equal(finals.length, 1);
    });

    log(`\n${steps.length} steps passed; screenshots in ${shots}`);
  } catch (error) {
    if (context) {
      for (const [index, open] of context.pages().entries()) {
        await open.screenshot({ path: path.join(shots, `failure-${index}.png`) }).catch(() => {});
      }
    }
    throw error;
  } finally {
    if (context) await context.close().catch(() => {});
    await demo.stop();
    rmSync(stateDir, { recursive: true, force: true });
    rmSync(profileDir, { recursive: true, force: true });
  }
}

runMain(main);
