// Drive the page in a real headless Chromium: serve it, type sentences, translate greedy and with beam 4, try
// bad input, save a screenshot, and print what the page showed as JSON (tests/examples/test_web_example.py compares it
// with tfm-run).
//
//   node check.mjs --model MODEL_DIR --inputs FILE [--screenshot PNG] [--chromium /usr/bin/chromium]
//
// Serves the examples/ folder (the page and ../node/tokenizer.js) and MODEL_DIR at /model/ on 127.0.0.1.

import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.json': 'application/json',
  '.wasm': 'application/wasm', '.onnx': 'application/octet-stream' };

function options(argv) {
  const out = { chromium: '/usr/bin/chromium', screenshot: null };
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  if (!out.model || !out.inputs) throw new Error('usage: node check.mjs --model DIR --inputs FILE [--screenshot PNG]');
  return out;
}

function serve(roots) {
  const server = http.createServer((request, response) => {
    const url = decodeURIComponent(new URL(request.url, 'http://x').pathname);
    const [prefix, root] = Object.entries(roots).find(([p]) => url.startsWith(p));
    const file = path.join(root, url.slice(prefix.length));
    if (!file.startsWith(root) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { 'Content-Type': TYPES[path.extname(file)] || 'application/octet-stream' });
    fs.createReadStream(file).pipe(response);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

async function translate(page, beams) {
  await page.selectOption('#beams', String(beams));
  await page.click('#translate');
  await page.waitForSelector('#status:is([data-state="done"], [data-state="error"])', { timeout: 300000 });
  return {
    translations: await page.locator('#output td.translation').allTextContents(),
    error: await page.textContent('#error'),
    status: await page.textContent('#status'),
  };
}

async function badInput(page, action) {
  const start = Date.now();
  await action();
  await page.waitForSelector('#status[data-state="error"]', { timeout: 10000 }); // an error, not a hang
  return { error: await page.textContent('#error'), ms: Date.now() - start };
}

async function main() {
  const opts = options(process.argv.slice(2));
  const lines = fs.readFileSync(opts.inputs, 'utf8').split('\n').filter((line) => line !== '');
  const server = await serve({ '/model/': path.resolve(opts.model), '/': path.resolve(HERE, '..') });
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tfm-web-chromium-'));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: opts.chromium, headless: true, args: FLAGS, viewport: { width: 1100, height: 900 } });
  try {
    const page = browser.pages()[0] || await browser.newPage();
    const console = [];
    page.on('console', (message) => console.push(message.text()));
    await page.goto(`http://127.0.0.1:${server.address().port}/web/index.html?model=/model/`);
    await page.waitForSelector('#status:is([data-state="ready"], [data-state="error"])', { timeout: 120000 });
    const loaded = await page.textContent('#status');
    if (await page.getAttribute('#status', 'data-state') === 'error') throw new Error(await page.textContent('#error'));
    await page.locator('#input').pressSequentially(lines.join('\n'), { timeout: 300000 }); // typed, key by key
    const greedy = await translate(page, 1);
    const beam = await translate(page, 4);
    if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
    const errors = {
      too_long: await badInput(page, async () => {
        await page.fill('#input', `forty-two\n${'one '.repeat(400)}`);
        await page.click('#translate');
      }),
      lone_surrogate: await badInput(page, async () => {
        // Set in the page: text sent from here travels as UTF-8, which has no lone surrogates.
        await page.$eval('#input', (input) => { input.value = 'forty-two\nfifty\uD800'; });
        await page.click('#translate');
      }),
      not_utf8: await badInput(page, () => page.setInputFiles('#file', {
        name: 'latin1.txt', mimeType: 'text/plain', buffer: Buffer.from([...Buffer.from('forty-two\n'), 0xe9, 0x0a]) })),
    };
    process.stdout.write(`${JSON.stringify({ loaded, greedy, beam, errors, console })}\n`);
  } finally {
    await browser.close();
    server.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((err) => {
  process.stderr.write(`error: ${err.message}\n`);
  process.exit(1);
});
