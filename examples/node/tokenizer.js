'use strict';
// Reads the `tokenizers` JSON that tfm-export writes (WordLevel model) and applies the same steps:
// normalizer -> pre-tokenizer -> vocabulary lookup, and the decoder on the way back.
// Only the component types tfm-export emits are supported; anything else is refused by name.
// Runs in Node.js (require) and in the browser (a classic <script>, defining window.Tokenizer).

function normalizer(spec) {
  if (!spec) return (s) => s;
  switch (spec.type) {
    case 'Sequence': {
      const steps = spec.normalizers.map(normalizer);
      return (s) => steps.reduce((acc, f) => f(acc), s);
    }
    case 'NFKC': return (s) => s.normalize('NFKC');
    case 'Lowercase': return (s) => s.toLowerCase();
    case 'Strip': return (s) => {
      if (spec.strip_left) s = s.replace(/^\s+/u, '');
      if (spec.strip_right) s = s.replace(/\s+$/u, '');
      return s;
    };
    case 'Replace': {
      const pattern = spec.pattern.Regex !== undefined
        ? new RegExp(spec.pattern.Regex, 'gu')
        : new RegExp(spec.pattern.String.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'gu');
      return (s) => s.replace(pattern, spec.content);
    }
    default: throw new Error(`unsupported normalizer ${spec.type}`);
  }
}

// A pre-tokenizer maps a list of pieces to a list of pieces.
function preTokenizer(spec) {
  if (!spec) return (pieces) => pieces;
  switch (spec.type) {
    case 'Sequence': {
      const steps = spec.pretokenizers.map(preTokenizer);
      return (pieces) => steps.reduce((acc, f) => f(acc), pieces);
    }
    case 'WhitespaceSplit': return (pieces) => pieces.flatMap((p) => p.split(/\s+/u).filter(Boolean));
    case 'Metaspace': {
      if (spec.prepend_scheme !== 'always' || !spec.split) throw new Error('unsupported Metaspace settings');
      const mark = spec.replacement;
      return (pieces) => pieces.flatMap((p) => {
        let s = p.replace(/ /g, mark);
        if (!s.startsWith(mark)) s = mark + s;
        return s.split(new RegExp(`(?=${mark})`, 'u')).filter(Boolean);
      });
    }
    case 'Split': {
      if (spec.behavior !== 'Isolated' || spec.invert) throw new Error('unsupported Split settings');
      const pattern = new RegExp(spec.pattern.Regex, 'gu');
      return (pieces) => pieces.flatMap((p) => {
        const out = [];
        let last = 0;
        for (const m of p.matchAll(pattern)) {
          if (m.index > last) out.push(p.slice(last, m.index));
          out.push(m[0]);
          last = m.index + m[0].length;
        }
        if (last < p.length) out.push(p.slice(last));
        return out;
      });
    }
    default: throw new Error(`unsupported pre-tokenizer ${spec.type}`);
  }
}

function decoder(spec) {
  if (!spec) return (tokens) => tokens.join(' ');
  if (spec.type === 'Metaspace') {
    return (tokens) => tokens.join('').split(spec.replacement).join(' ').replace(/^ /, '');
  }
  throw new Error(`unsupported decoder ${spec.type}`);
}

class Tokenizer {
  // source: a file path (Node.js), or the parsed JSON (the browser fetches it).
  constructor(source, origin = source) {
    const json = typeof source === 'string' ? JSON.parse(require('fs').readFileSync(source, 'utf8')) : source;
    if (json.model.type !== 'WordLevel') throw new Error(`${origin}: unsupported model ${json.model.type}`);
    this.vocab = new Map(Object.entries(json.model.vocab));
    this.tokens = [];
    for (const [token, id] of this.vocab) this.tokens[id] = token;
    this.unk = this.vocab.get(json.model.unk_token);
    this.special = new Set(json.added_tokens.filter((t) => t.special).map((t) => t.id));
    this.normalize = normalizer(json.normalizer);
    this.preTokenize = preTokenizer(json.pre_tokenizer);
    this.decodeTokens = decoder(json.decoder);
  }

  encode(text) {
    const normalized = this.normalize(text);
    if (!normalized) return [];
    return this.preTokenize([normalized]).map((piece) => (this.vocab.has(piece) ? this.vocab.get(piece) : this.unk));
  }

  decode(ids) {
    return this.decodeTokens(ids.filter((id) => !this.special.has(id)).map((id) => this.tokens[id]));
  }
}

if (typeof module !== 'undefined') module.exports = { Tokenizer };
else globalThis.Tokenizer = Tokenizer;
