#!/usr/bin/env node
// Translate stdin, one line per line, with transformers.js on a directory written by `tfm-export hf`, from local
// files only: pipeline("translation") for text; with --ids, the same tokenizer and model through generate(), each
// line's generated token ids printed (after the decoder's start token, </s> included). A multilingual model (NLLB,
// M2M100, mBART-50) takes --tgt-lang, and --src-lang where the source is not the directory's default, spelled as
// its transformers.js tokenizer spells them: eng_Latn, en_XX, and M2M100's without underscores (fr for __fr__).
// Usage: node translate.mjs DIR [--dtype fp32|fp16|q8] [--batch N] [--src-lang CODE] [--tgt-lang CODE] [--ids] < lines
import { AutoModelForSeq2SeqLM, AutoTokenizer, env, pipeline } from '@huggingface/transformers';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  return at >= 0 ? args[at + 1] : fallback;
};
const dir = args[0] && path.resolve(args[0]);
if (!dir || args[0].startsWith('--')) {
  console.error('usage: node translate.mjs DIR [--dtype fp32|fp16|q8] [--batch N] [--src-lang CODE] ' +
    '[--tgt-lang CODE] [--ids] < lines');
  process.exit(2);
}
env.allowRemoteModels = false;
env.localModelPath = '/';
const options = { dtype: option('--dtype', 'fp32'), local_files_only: true };
// The pipeline's own default (max_new_tokens 256) overrides generation_config.json's length limit; give it back,
// or a sentence that never ends runs past the model's positions.
const { max_length } = JSON.parse(fs.readFileSync(path.join(dir, 'generation_config.json'), 'utf8'));
const limit = { max_new_tokens: max_length - 1 };
const languages = Object.fromEntries(
  [['src_lang', option('--src-lang')], ['tgt_lang', option('--tgt-lang')]].filter(([, code]) => code !== undefined));
// One sentence per call by default: transformers.js 4.3's greedy loop has no per-row stop, so in a batch a row
// that ended keeps decoding past its </s> until every row has ended at once (docs/ecosystem.md).
const batch = Number(option('--batch', '1'));
const lines = [];
for await (const line of readline.createInterface({ input: process.stdin })) lines.push(line);

if (args.includes('--ids')) {
  const tokenizer = await AutoTokenizer.from_pretrained(dir, options);
  const model = await AutoModelForSeq2SeqLM.from_pretrained(dir, options);
  for (const line of lines) {
    // languages as the translation pipeline sets them: its tokenizer's step frames the source and forces the target
    const settings = { ...limit, ...languages };
    const inputs = settings.tgt_lang ? tokenizer._build_translation_inputs([line], {}, settings) : tokenizer([line]);
    const output = await model.generate({ ...inputs, ...settings });
    console.log(output.tolist()[0].slice(1).join(' '));
  }
} else {
  const translator = await pipeline('translation', dir, options);
  for (let i = 0; i < lines.length; i += batch) {
    const outputs = await translator(lines.slice(i, i + batch), { ...limit, ...languages });
    for (const output of outputs) console.log(output.translation_text);
  }
}
