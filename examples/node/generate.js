#!/usr/bin/env node
'use strict';
// Translate with generate.onnx (`tfm-export generate`): ONNX Runtime's BeamSearch op runs the whole greedy or
// beam search inside one session.run, so there is no decoding loop here. See docs/graph-contract.md.
//
//   node generate.js MODEL_DIR [--beams N] [--length-penalty A] [TEXT ...]   (no TEXT: lines from stdin)

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readManifest } = require('./manifest');
const { Tokenizer } = require('./tokenizer');

async function loadModel(dir) {
  const manifest = readManifest(dir);
  if (!manifest.generate) throw new Error(`${dir}: has no generate.onnx; make one with \`tfm-export generate\``);
  return {
    manifest,
    session: await ort.InferenceSession.create(path.join(dir, manifest.generate.file)),
    source: new Tokenizer(path.join(dir, manifest.tokenizer.source)),
    target: new Tokenizer(path.join(dir, manifest.tokenizer.target)),
  };
}

const int32 = (values, dims) => new ort.Tensor('int32', Int32Array.from(values), dims);

async function translate(model, text, beams, lengthPenalty) {
  const { manifest, source, target } = model;
  const { bos, eos, pad } = manifest.special_tokens;
  const ids = [bos, ...source.encode(text), eos];
  if (ids.length > manifest.limits.max_source_length) {
    throw new Error(`"${text}" has ${ids.length} tokens; the model takes ${manifest.limits.max_source_length}`);
  }
  const { sequences } = await model.session.run({
    input_ids: int32(ids, [1, ids.length]),
    max_length: int32([manifest.generate.max_length], [1]), // counts the start token <s>
    min_length: int32([0], [1]),
    num_beams: int32([beams], [1]),
    num_return_sequences: int32([1], [1]),
    length_penalty: new ort.Tensor('float32', Float32Array.from([lengthPenalty]), [1]),
  });
  // sequences [1, 1, max_length]: <s>, the generated ids, then <blank> padding; </s> is not written.
  return target.decode(Array.from(sequences.data).slice(1).filter((id) => id !== pad));
}

function parseArgs(argv) {
  const options = { beams: 4, lengthPenalty: 1.0, texts: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--beams') options.beams = Number(argv[++i]);
    else if (argv[i] === '--length-penalty') options.lengthPenalty = Number(argv[++i]);
    else options.texts.push(argv[i]);
  }
  if (!Number.isInteger(options.beams) || options.beams < 1) throw new Error('--beams takes a whole number >= 1');
  if (!Number.isFinite(options.lengthPenalty)) throw new Error('--length-penalty takes a number');
  return options;
}

async function main() {
  const [dir, ...rest] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node generate.js MODEL_DIR [--beams N] [--length-penalty A] [TEXT ...]');
    process.exit(2);
  }
  const { beams, lengthPenalty, texts } = parseArgs(rest);
  const lines = texts.length ? texts : fs.readFileSync(0, 'utf8').split('\n');
  if (!texts.length && lines[lines.length - 1] === '') lines.pop();
  const model = await loadModel(dir);
  for (const line of lines) {
    process.stdout.write((line.trim() ? await translate(model, line, beams, lengthPenalty) : '') + '\n');
  }
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(1);
});
