#!/usr/bin/env node
// Translate stdin, one line per line, with transformers.js's pipeline("translation") on a directory written by
// `tfm-export hf`, from local files only. Usage: node translate.mjs DIR [--dtype fp32|fp16|q8] [--batch N]
import { env, pipeline } from '@huggingface/transformers';
import path from 'node:path';
import readline from 'node:readline';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : fallback;
};
const dir = args[0];
if (!dir || dir.startsWith('--')) {
  console.error('usage: node translate.mjs DIR [--dtype fp32|fp16|q8] [--batch N] < lines');
  process.exit(2);
}
env.allowRemoteModels = false;
env.localModelPath = '/';
const translator = await pipeline('translation', path.resolve(dir), {
  dtype: option('--dtype', 'fp32'), local_files_only: true,
});
// one sentence per call by default: transformers.js 4.3's greedy loop has no per-row stop, so in a batch a row
// that ended keeps decoding past its </s> until every row has ended at once (docs/ecosystem.md)
const batch = Number(option('--batch', '1'));
const lines = [];
for await (const line of readline.createInterface({ input: process.stdin })) lines.push(line);
for (let i = 0; i < lines.length; i += batch) {
  const outputs = await translator(lines.slice(i, i + batch));
  for (const output of outputs) console.log(output.translation_text);
}
