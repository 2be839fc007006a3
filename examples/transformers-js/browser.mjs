#!/usr/bin/env node
// browser.html in a real headless Chromium on a `tfm-export hf` directory: serves this folder and the directory over
// 127.0.0.1 (nothing else is fetched), translates stdin's lines in the page, prints one translation per line.
// Usage: node browser.mjs DIR [--dtype fp32|fp16|q8] [--chromium /usr/bin/chromium] < lines
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const MIME = { '.html': 'text/html', '.js': 'text/javascript', '.mjs': 'text/javascript', '.json': 'application/json',
  '.wasm': 'application/wasm' };
const args = process.argv.slice(2);
const option = (name, fallback) => (args.includes(name) ? args[args.indexOf(name) + 1] : fallback);

// GET only, files under the two roots only: /models/view/ is the directory, the rest this folder
function handler(roots) {
  return (request, response) => {
    const url = decodeURIComponent(new URL(request.url, 'http://local').pathname);
    const [prefix, root] = roots.find(([p]) => url.startsWith(p));
    const file = path.join(root, url.slice(prefix.length));
    const ok = request.method === 'GET' && file.startsWith(root) && fs.existsSync(file) && fs.statSync(file).isFile();
    if (!ok) return response.writeHead(404).end();
    response.writeHead(200, { 'Content-Type': MIME[path.extname(file)] ?? 'application/octet-stream' });
    fs.createReadStream(file).pipe(response);
  };
}

const dir = args[0] && path.resolve(args[0]);
if (!dir || args[0].startsWith('--') || !fs.existsSync(path.join(dir, 'config.json'))) {
  console.error('usage: node browser.mjs DIR [--dtype fp32|fp16|q8] [--chromium PATH] < lines (DIR: tfm-export hf)');
  process.exit(2);
}
const lines = fs.readFileSync(0, 'utf8').split('\n').filter((line) => line !== '');
const server = http.createServer(handler([['/models/view/', dir + path.sep], ['/', HERE + path.sep]]));
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tfm-hf-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: option('--chromium', '/usr/bin/chromium'), headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking'] });
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  await page.goto(`http://127.0.0.1:${server.address().port}/browser.html?dtype=${option('--dtype', 'fp32')}`);
  await page.waitForSelector('#status:is([data-state="ready"], [data-state="error"])', { timeout: 120000 });
  if (await page.getAttribute('#status', 'data-state') === 'error') throw new Error(await page.textContent('#status'));
  const translations = await page.evaluate((texts) => window.translateLines(texts), lines);
  process.stdout.write(translations.map((t) => `${t}\n`).join(''));
} finally {
  await browser.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
