#!/usr/bin/env node
'use strict';
// Translate with a tfm-export model directory: encoder once, decoder_step per token with the KV cache
// fed back, greedy decoding. Follows docs/graph-contract.md; nothing here is specific to Python.
//
//   node translate.js MODEL_DIR [TEXT ...]      (no TEXT: one sentence per line on stdin)

const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');
const { readManifest } = require('./manifest');
const { Tokenizer } = require('./tokenizer');

async function loadModel(dir) {
  const manifest = readManifest(dir);
  // This example feeds float32 caches and reads float32 logits; an fp16 directory's graphs (for GPUs) take fp16.
  const step = manifest.graphs.decoder_step;
  const other = [...step.inputs, ...step.outputs].find((t) => t.dtype.startsWith('float') && t.dtype !== 'float32');
  if (other) {
    throw new Error(`${dir}: ${other.name} is ${other.dtype} (a ${manifest.precision} directory); this example runs ` +
                    'float32 tensors: give it the fp32 or int8 directory, or one quantized with --keep-io-types');
  }
  const options = { graphOptimizationLevel: 'all' };
  return {
    manifest,
    encoder: await ort.InferenceSession.create(path.join(dir, manifest.graphs.encoder.file), options),
    decoder: await ort.InferenceSession.create(path.join(dir, manifest.graphs.decoder_step.file), options),
    source: new Tokenizer(path.join(dir, manifest.tokenizer.source)),
    target: new Tokenizer(path.join(dir, manifest.tokenizer.target)),
  };
}

const int64 = (values, dims) => new ort.Tensor('int64', BigInt64Array.from(values.map(BigInt)), dims);

async function translate(model, text) {
  const { manifest, source, target } = model;
  const { bos, eos, pad } = manifest.special_tokens;
  const { n_layers: layers, n_head: heads, d_k: dk, d_v: dv } = manifest.model;
  const ids = [bos, ...source.encode(text), eos];
  if (ids.length > manifest.limits.max_source_length) {
    throw new Error(`"${text}" has ${ids.length} tokens; the model takes ${manifest.limits.max_source_length}`);
  }
  const mask = int64(ids.map(() => 1), [1, ids.length]);
  const enc = await model.encoder.run({ input_ids: int64(ids, [1, ids.length]), attention_mask: mask });

  // Empty self-attention cache (past length 0); cross-attention K/V come from the encoder, once.
  const cache = {};
  for (let i = 0; i < layers; i++) {
    cache[`past_key_values.${i}.decoder.key`] = new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, dk]);
    cache[`past_key_values.${i}.decoder.value`] = new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, dv]);
    cache[`past_key_values.${i}.encoder.key`] = enc[`present.${i}.encoder.key`];
    cache[`past_key_values.${i}.encoder.value`] = enc[`present.${i}.encoder.value`];
  }
  const output = [];
  let token = bos;
  for (let step = 0; step < manifest.limits.max_target_length; step++) {
    const out = await model.decoder.run({ input_ids: int64([token], [1, 1]), encoder_attention_mask: mask, ...cache });
    const logits = out.logits.data; // [1, 1, vocab]
    token = -1;
    for (let v = 0; v < logits.length; v++) {
      if (v !== pad && (token < 0 || logits[v] > logits[token])) token = v; // first maximum; <blank> never
    }
    if (token === eos) break;
    output.push(token);
    for (let i = 0; i < layers; i++) {
      for (const role of ['key', 'value']) {
        cache[`past_key_values.${i}.decoder.${role}`] = out[`present.${i}.decoder.${role}`];
      }
    }
  }
  return target.decode(output);
}

async function main() {
  const [dir, ...texts] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node translate.js MODEL_DIR [TEXT ...]   (no TEXT: reads lines from stdin)');
    process.exit(2);
  }
  const lines = texts.length ? texts : fs.readFileSync(0, 'utf8').split('\n');
  if (!texts.length && lines[lines.length - 1] === '') lines.pop();
  const model = await loadModel(dir);
  for (const line of lines) {
    process.stdout.write((line.trim() ? await translate(model, line) : '') + '\n');
  }
}

main().catch((err) => {
  console.error(`error: ${err.message}`);
  process.exit(1);
});
