'use strict';
// The page: load a tfm-export model directory that has generate.onnx (?model=URL, default model/), check every
// line, then translate them one by one with ONNX Runtime's BeamSearch op (docs/graph-contract.md, generate.onnx).
// Bad input (a line longer than the model takes, text with no UTF-8 form, a file that is not UTF-8, too many
// lines) is reported in the page before any decoding starts.

const MAX_LINES = 1000; // a bigger paste is refused instead of keeping the page busy for minutes
const $ = (id) => document.getElementById(id);
let model = null;

function setStatus(state, text) {
  $('status').dataset.state = state;
  $('status').textContent = text;
}

function showError(message) {
  $('error').textContent = message;
  setStatus('error', 'stopped');
}

async function fetchJson(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status} ${response.statusText}`);
  return response.json();
}

async function loadModel(base) {
  const manifest = await fetchJson(new URL('manifest.json', base));
  if (manifest.format !== 'tfm-export-model' || manifest.format_version !== 2) {
    throw new Error(`${base}: not a tfm-export model directory (format version 2)`);
  }
  if (!manifest.generate) throw new Error(`${base}: has no generate.onnx; make one with tfm-export generate`);
  ort.env.wasm.numThreads = 1; // more threads need a cross-origin-isolated page
  ort.env.wasm.wasmPaths = new URL('node_modules/onnxruntime-web/dist/', location.href).href;
  const url = new URL(manifest.generate.file, base).href;
  const session = await ort.InferenceSession.create(url, { executionProviders: ['wasm'] });
  const files = manifest.tokenizer;
  const source = new Tokenizer(await fetchJson(new URL(files.source, base)), files.source);
  const target = files.target === files.source ? source
    : new Tokenizer(await fetchJson(new URL(files.target, base)), files.target);
  return { manifest, session, source, target };
}

function sourceIds(line, index) {
  const { bos, eos } = model.manifest.special_tokens;
  const limit = model.manifest.limits.max_source_length;
  if (!line.isWellFormed()) {
    throw new Error(`line ${index + 1} holds a lone surrogate, which has no UTF-8 form; retype it`);
  }
  const ids = [bos, ...model.source.encode(line), eos];
  if (ids.length > limit) {
    throw new Error(`line ${index + 1}: ${ids.length} tokens with <s> and </s>, but the model takes at most `
      + `${limit}; shorten or split it`);
  }
  return ids;
}

const int32 = (values, dims) => new ort.Tensor('int32', Int32Array.from(values), dims);

async function translateIds(ids, beams, lengthPenalty) {
  const { sequences } = await model.session.run({
    input_ids: int32(ids, [1, ids.length]),
    max_length: int32([model.manifest.generate.max_length], [1]), // counts the start token <s>
    min_length: int32([0], [1]),
    num_beams: int32([beams], [1]),
    num_return_sequences: int32([1], [1]),
    length_penalty: new ort.Tensor('float32', Float32Array.from([lengthPenalty]), [1]),
  });
  // sequences [1, 1, max_length]: <s>, the generated ids, then <blank> padding; </s> is not written.
  const pad = model.manifest.special_tokens.pad;
  return model.target.decode(Array.from(sequences.data).slice(1).filter((id) => id !== pad));
}

function addRow(index, source, translation) {
  const row = document.createElement('tr');
  for (const [cls, text] of [['index', String(index + 1)], ['source', source], ['translation', translation]]) {
    const cell = document.createElement('td');
    cell.className = cls;
    cell.textContent = text;
    row.appendChild(cell);
  }
  $('output').appendChild(row);
}

function readRequest() {
  const lines = $('input').value.split('\n');
  if (lines.length > 1 && lines[lines.length - 1] === '') lines.pop();
  if (lines.length > MAX_LINES) throw new Error(`${lines.length} lines; translate at most ${MAX_LINES} at a time`);
  const beams = Number($('beams').value);
  const lengthPenalty = Number($('length-penalty').value);
  if (!Number.isFinite(lengthPenalty)) throw new Error('the length penalty must be a number');
  return { lines, ids: lines.map((line, i) => (line.trim() ? sourceIds(line, i) : null)), beams, lengthPenalty };
}

async function onTranslate() {
  $('error').textContent = '';
  $('output').textContent = '';
  let request;
  try {
    request = readRequest();
  } catch (err) {
    showError(err.message);
    return;
  }
  const { lines, ids, beams, lengthPenalty } = request;
  $('translate').disabled = true;
  const start = performance.now();
  try {
    for (let i = 0; i < lines.length; i++) {
      setStatus('busy', `translating ${i + 1}/${lines.length}…`);
      addRow(i, lines[i], ids[i] ? await translateIds(ids[i], beams, lengthPenalty) : '');
    }
    const mode = beams === 1 ? 'greedy' : `beam ${beams}`;
    setStatus('done', `${lines.length} lines, ${mode}, ${Math.round(performance.now() - start)} ms`);
  } catch (err) {
    showError(`ONNX Runtime failed: ${err.message}`);
  } finally {
    $('translate').disabled = false;
  }
}

function decodeUtf8(bytes, name) {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    // UTF-8 never uses the newline byte inside a character, so the file splits into lines as bytes.
    let line = 1;
    let start = 0;
    for (let i = 0; i <= bytes.length; i++) {
      if (i < bytes.length && bytes[i] !== 10) continue;
      try {
        new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(start, i));
      } catch {
        break;
      }
      line += 1;
      start = i + 1;
    }
    throw new Error(`${name}: line ${line} is not valid UTF-8; convert the file to UTF-8`);
  }
}

async function onFile(event) {
  const file = event.target.files[0];
  if (!file) return;
  try {
    $('input').value = decodeUtf8(new Uint8Array(await file.arrayBuffer()), file.name);
    $('error').textContent = '';
    setStatus('ready', `read ${file.name}`);
  } catch (err) {
    showError(err.message);
  }
}

async function main() {
  const param = new URLSearchParams(location.search).get('model') || 'model/';
  const base = new URL(param.endsWith('/') ? param : `${param}/`, location.href);
  try {
    model = await loadModel(base);
  } catch (err) {
    showError(`cannot load the model: ${err.message}`);
    return;
  }
  const { d_model: width, n_layers: layers } = model.manifest.model;
  setStatus('ready', `ready: ${base.pathname} (${model.manifest.precision}, d_model ${width}, ${layers}+${layers} layers)`);
  $('translate').disabled = false;
  $('translate').addEventListener('click', onTranslate);
  $('file').addEventListener('change', onFile);
}

main();
