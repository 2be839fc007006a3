// The tokenizers JSON files tfm-export writes, read in C++17 the way Hugging Face's `tokenizers` (the library
// tfm-run uses) reads them, for the models tfm-export exports:
//   - added tokens are taken out of the text first, where they appear (longest first), as their ids; a language
//     code that is no special token (opus-mt's >>fra<<) only at the start of a piece of text;
//   - WordLevel (the seed layout): the normalizer (NFKC, Lowercase, Strip, Replace) and pre-tokenizer
//     (WhitespaceSplit, Metaspace, Split) steps through ICU, so any UTF-8 text is read as Python reads it;
//   - Unigram and BPE (Marian, M2M100/NLLB, mBART, T5): the SentencePiece model the manifest names, through
//     libsentencepiece, given each text whole ("text": the model's own normalizer and whitespace rules) or each word
//     the JSON's normalizer and pre-tokenizer give ("words"); its pieces become ids through the JSON's table. A run
//     of characters the model lacks is one unknown piece, looked up as the table names such runs (between U+FDD0 and
//     U+FDD1: the target language's pieces a Marian model reads that way), else the unknown token;
//   - the post-processor's template frames a source (<s> $A </s>, eng_Latn $A </s>), with a language code chosen
//     in place of the template's; the Metaspace decoder joins target pieces, special tokens left out.
// What it cannot read (a byte-level BPE as BART's) is refused in one line that points to --ids.
#pragma once
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tfm {

namespace text {

inline const std::string kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
inline const std::string kRunStart = "\xEF\xB7\x90", kRunEnd = "\xEF\xB7\x91";  // U+FDD0, U+FDD1

// The byte offset of the first bytes that are not UTF-8 (overlong forms and surrogates included), npos if none.
inline size_t invalid_utf8(const std::string& s) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t length = static_cast<int32_t>(s.size());
  for (int32_t i = 0; i < length;) {
    const int32_t at = i;
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    if (c < 0) return static_cast<size_t>(at);
  }
  return std::string::npos;
}

inline std::vector<UChar32> code_points(const std::string& s) {
  std::vector<UChar32> out;
  const auto* bytes = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t length = static_cast<int32_t>(s.size());
  for (int32_t i = 0; i < length;) {
    UChar32 c;
    U8_NEXT(bytes, i, length, c);
    out.push_back(c);
  }
  return out;
}

inline std::string utf8(const icu::UnicodeString& s) {
  std::string out;
  return s.toUTF8String(out);
}

inline std::string utf8(UChar32 c) { return utf8(icu::UnicodeString(c)); }

// Unicode's White_Space: what Rust's char::is_whitespace (Strip, WhitespaceSplit) and the regex engine's \s take.
inline bool is_space(UChar32 c) { return u_isUWhiteSpace(c); }

// Python's str.isspace: White_Space and the information separators U+001C..U+001F (tfm-run's blank lines).
inline bool is_python_space(UChar32 c) { return is_space(c) || (c >= 0x1C && c <= 0x1F); }

inline bool blank(const std::string& s) {
  for (UChar32 c : code_points(s))
    if (!is_python_space(c)) return false;
  return true;
}

// An ICU regex for a `tokenizers` Regex pattern: \s is Unicode's White_Space there, and in ICU it lacks U+000B and
// U+0085, so it is spelled as the property.
inline std::unique_ptr<icu::RegexPattern> regex(const std::string& pattern) {
  std::string spelled;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      spelled += pattern[i + 1] == 's' ? std::string("\\p{White_Space}") : pattern.substr(i, 2);
      ++i;
    } else {
      spelled += pattern[i];
    }
  }
  UErrorCode status = U_ZERO_ERROR;
  UParseError where;
  std::unique_ptr<icu::RegexPattern> compiled(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(spelled), where, status));
  if (U_FAILURE(status)) throw std::runtime_error("regex '" + pattern + "' is not one ICU reads");
  return compiled;
}

inline std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

}  // namespace text

// The SentencePiece model a manifest names for the source tokenizer: its checked path, and whether it reads each
// text whole or each word.
struct SentencePieceFile {
  std::string path;
  bool whole_text = true;
};

class Tokenizer {
 public:
  // encodes: text goes in (the source's), else it only decodes (the target's) and needs no SentencePiece model.
  Tokenizer(const std::string& path, const std::optional<SentencePieceFile>& spm, bool encodes = true) : path_(path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + ": cannot open tokenizer");
    json_ = nlohmann::json::parse(in);
    const auto& model = json_.at("model");
    type_ = model.at("type").get<std::string>();
    read_table(model);
    for (const auto& t : json_.at("added_tokens")) {
      Added added{t.at("content").get<std::string>(), t.at("id").get<int64_t>(), t.at("special").get<bool>(),
                  t.value("lstrip", false), t.value("rstrip", false)};
      if (added.special) special_.push_back(added.id);
      if (static_cast<size_t>(added.id) >= tokens_.size()) tokens_.resize(added.id + 1);
      tokens_[added.id] = added.content;
      (added.special || !t.at("normalized").get<bool>() ? anywhere_ : at_start_).push_back(added);
    }
    for (auto* list : {&anywhere_, &at_start_})  // longest first: a token that contains another wins
      std::stable_sort(list->begin(), list->end(), [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
    read_template(json_.at("post_processor"));
    if (type_ == "WordLevel" || !encodes) return;
    if (type_ != "Unigram" && type_ != "BPE") throw std::runtime_error(path + ": a " + type_ + " model; give token ids with --ids");
    if (!spm) throw std::runtime_error(path + ": no SentencePiece model reproduces this tokenizer (" + describe() +
                                       "); give token ids from the model's own tokenizer with --ids");
    whole_text_ = spm->whole_text;
    sentencepiece_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const auto status = sentencepiece_->Load(spm->path);
    if (!status.ok()) throw std::runtime_error(spm->path + ": not a SentencePiece model (" + status.ToString() + ")");
  }

  // Token ids of `text` (UTF-8, which the caller has checked), without the source framing.
  std::vector<int64_t> encode(const std::string& text) const {
    std::vector<int64_t> ids;
    for (const auto& [segment, id] : split_added(text, anywhere_)) {
      if (id >= 0) {
        ids.push_back(id);
        continue;
      }
      std::string rest = segment;
      for (const auto& code : at_start_)
        if (rest.rfind(code.content, 0) == 0) {
          ids.push_back(code.id);
          rest = rest.substr(code.content.size());
          break;
        }
      for (int64_t piece : model_ids(rest)) ids.push_back(piece);
    }
    return ids;
  }

  // A source as the encoder takes it: the template around the text's ids.
  std::vector<int64_t> framed(const std::vector<int64_t>& ids) const {
    std::vector<int64_t> out;
    for (const auto& part : template_) {
      if (part.empty()) out.insert(out.end(), ids.begin(), ids.end());
      else out.push_back(required(part));
    }
    return out;
  }

  // Which of `codes` the template puts around a source (the source language's).
  std::vector<std::string> framing_codes(const std::vector<std::string>& codes) const {
    std::vector<std::string> found;
    for (const auto& part : template_)
      if (std::find(codes.begin(), codes.end(), part) != codes.end()) found.push_back(part);
    return found;
  }

  // Frame sources with `code`: in place of the template's code among `codes`, before the text where it has none.
  void frame_with(const std::string& code, const std::vector<std::string>& codes) {
    bool replaced = false;
    for (auto& part : template_)
      if (std::find(codes.begin(), codes.end(), part) != codes.end()) part = code, replaced = true;
    if (!replaced) template_.insert(template_.begin(), code);
  }

  std::optional<int64_t> id(const std::string& token) const {
    auto it = vocab_.find(token);
    if (it != vocab_.end()) return it->second;
    for (const auto* list : {&anywhere_, &at_start_})
      for (const auto& added : *list)
        if (added.content == token) return added.id;
    return std::nullopt;
  }

  const std::string& token(int64_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) throw std::runtime_error(path_ + ": no token has id " + std::to_string(id));
    return tokens_[id];
  }

  // Text of target ids, special tokens left out, as `tokenizers` decodes with skip_special_tokens.
  std::string decode(const std::vector<int64_t>& ids) const {
    std::vector<std::string> pieces;
    for (int64_t id : ids)
      if (std::find(special_.begin(), special_.end(), id) == special_.end()) pieces.push_back(token(id));
    const auto& decoder = json_.at("decoder");
    std::string out;
    if (decoder.is_null()) {
      for (size_t i = 0; i < pieces.size(); ++i) out += (i ? " " : "") + pieces[i];
      return out;
    }
    const auto type = decoder.at("type").get<std::string>();
    if (type != "Metaspace") throw std::runtime_error(path_ + ": a " + type + " decoder; decode ids with --ids");
    for (const auto& p : pieces) out += p;
    out = text::replace_all(out, decoder.at("replacement").get<std::string>(), " ");
    const bool prepends = decoder.value("prepend_scheme", "always") != "never";
    return prepends && out.rfind(' ', 0) == 0 ? out.substr(1) : out;
  }

 private:
  struct Added {
    std::string content;
    int64_t id;
    bool special, lstrip, rstrip;
  };

  std::string path_, type_;
  nlohmann::json json_;
  std::map<std::string, int64_t> vocab_;  // the model's table
  std::vector<std::string> tokens_;       // by id, added tokens included
  std::vector<int64_t> special_;
  std::vector<Added> anywhere_, at_start_;
  std::vector<std::string> template_;               // the framing: token names, "" for the text
  std::map<std::string, std::vector<int64_t>> framing_ids_;
  int64_t unk_ = -1;
  bool whole_text_ = true;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sentencepiece_;

  std::string describe() const {
    const auto& pre = json_.at("pre_tokenizer");
    return "a " + type_ + " model" + (pre.is_object() && pre.value("type", "") == "ByteLevel" ? " over bytes" : "");
  }

  void read_table(const nlohmann::json& model) {
    const auto& vocab = model.at("vocab");
    if (type_ == "Unigram") {
      for (size_t id = 0; id < vocab.size(); ++id) vocab_.emplace(vocab[id].at(0).get<std::string>(), static_cast<int64_t>(id));
      unk_ = model.at("unk_id").is_null() ? -1 : model.at("unk_id").get<int64_t>();
    } else if (vocab.is_object()) {  // WordLevel and BPE: token -> id
      for (const auto& [token, value] : vocab.items()) vocab_.emplace(token, value.get<int64_t>());
      const auto& unk = model.contains("unk_token") ? model.at("unk_token") : nlohmann::json();
      if (unk.is_string() && vocab_.count(unk.get<std::string>())) unk_ = vocab_.at(unk.get<std::string>());
    }
    for (const auto& [token, id] : vocab_) {
      if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(id + 1);
      tokens_[id] = token;
    }
  }

  void read_template(const nlohmann::json& post) {
    if (post.is_null()) {
      template_ = {""};
      return;
    }
    if (post.at("type") != "TemplateProcessing") throw std::runtime_error(path_ + ": a " + post.at("type").get<std::string>() + " post-processor");
    for (const auto& part : post.at("single"))
      template_.push_back(part.contains("Sequence") ? "" : part.at("SpecialToken").at("id").get<std::string>());
    for (const auto& [name, entry] : post.at("special_tokens").items())
      framing_ids_[name] = entry.at("ids").get<std::vector<int64_t>>();
  }

  int64_t required(const std::string& name) const {
    auto framed = framing_ids_.find(name);
    if (framed != framing_ids_.end() && framed->second.size() == 1) return framed->second[0];
    const auto found = id(name);
    if (!found) throw std::runtime_error(path_ + ": the framing's token " + name + " has no id");
    return *found;
  }

  // The text in pieces: (text, -1) between the added tokens found anywhere, (content, id) for each of those.
  static std::vector<std::pair<std::string, int64_t>> split_added(const std::string& s, const std::vector<Added>& added) {
    std::vector<std::pair<std::string, int64_t>> out;
    std::string pending;
    size_t at = 0;
    while (at < s.size()) {
      const Added* found = nullptr;
      for (const auto& token : added)
        if (!token.content.empty() && s.compare(at, token.content.size(), token.content) == 0) {
          found = &token;
          break;
        }
      if (!found) {
        pending += s[at++];
        continue;
      }
      if (found->lstrip) pending = rstrip(pending);
      if (!pending.empty()) out.emplace_back(pending, -1);
      pending.clear();
      out.emplace_back(found->content, found->id);
      at += found->content.size();
      if (found->rstrip)
        while (at < s.size() && std::isspace(static_cast<unsigned char>(s[at]))) ++at;
    }
    if (!pending.empty()) out.emplace_back(pending, -1);
    return out;
  }

  static std::string rstrip(const std::string& s) {
    size_t end = s.size();
    while (end && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
    return s.substr(0, end);
  }

  std::vector<int64_t> model_ids(const std::string& segment) const {
    std::vector<int64_t> ids;
    if (type_ != "WordLevel" && !sentencepiece_) throw std::logic_error(path_ + ": opened to decode, not to encode");
    if (sentencepiece_ && whole_text_) return pieces_ids(segment);
    const std::string normalized = normalize(json_.at("normalizer"), segment);
    if (normalized.empty()) return ids;
    for (const auto& word : pre_tokenize(json_.at("pre_tokenizer"), {normalized})) {
      if (sentencepiece_) {
        for (int64_t id : pieces_ids(word)) ids.push_back(id);
        continue;
      }
      auto it = vocab_.find(word);
      ids.push_back(it == vocab_.end() ? unk_ : it->second);
    }
    return ids;
  }

  // SentencePiece's segmentation as the table's ids; an unknown run as the table names it, else the unknown token.
  std::vector<int64_t> pieces_ids(const std::string& input) const {
    std::vector<int64_t> ids;
    const auto encoded = sentencepiece_->EncodeAsImmutableProto(input);  // its pieces point into it
    for (const auto& piece : encoded.pieces()) {
      const bool unknown = sentencepiece_->IsUnknown(piece.id());
      auto it = vocab_.find(unknown ? text::kRunStart + piece.surface() + text::kRunEnd : piece.piece());
      if (it != vocab_.end()) ids.push_back(it->second);
      else if (unk_ >= 0) ids.push_back(unk_);
      else throw std::runtime_error(path_ + ": '" + piece.piece() + "' has no id and the model has no unknown token");
    }
    return ids;
  }

  std::string normalize(const nlohmann::json& spec, std::string s) const {
    if (spec.is_null()) return s;
    const std::string type = spec.at("type").get<std::string>();
    if (type == "Sequence") {
      for (const auto& step : spec.at("normalizers")) s = normalize(step, s);
      return s;
    }
    if (type == "NFKC") {
      UErrorCode status = U_ZERO_ERROR;
      const icu::Normalizer2* nfkc = icu::Normalizer2::getNFKCInstance(status);
      icu::UnicodeString out = nfkc->normalize(icu::UnicodeString::fromUTF8(s), status);
      if (U_FAILURE(status)) throw std::runtime_error("ICU's NFKC failed: " + std::string(u_errorName(status)));
      return text::utf8(out);
    }
    if (type == "Lowercase") {  // each character alone, as Rust's char::to_lowercase (no final-sigma context)
      std::string out;
      for (UChar32 c : text::code_points(s)) out += text::utf8(icu::UnicodeString(c).toLower(icu::Locale::getRoot()));
      return out;
    }
    if (type == "Strip") {
      auto points = text::code_points(s);
      size_t begin = 0, end = points.size();
      if (spec.at("strip_left").get<bool>()) while (begin < end && text::is_space(points[begin])) ++begin;
      if (spec.at("strip_right").get<bool>()) while (end > begin && text::is_space(points[end - 1])) --end;
      std::string out;
      for (size_t i = begin; i < end; ++i) out += text::utf8(points[i]);
      return out;
    }
    if (type == "Replace") {
      const auto& pattern = spec.at("pattern");
      const std::string content = spec.at("content").get<std::string>();
      if (!pattern.contains("Regex")) return text::replace_all(s, pattern.at("String").get<std::string>(), content);
      UErrorCode status = U_ZERO_ERROR;
      auto compiled = text::regex(pattern.at("Regex").get<std::string>());
      const icu::UnicodeString input = icu::UnicodeString::fromUTF8(s);  // the matcher reads it, not a copy
      std::unique_ptr<icu::RegexMatcher> matcher(compiled->matcher(input, status));
      icu::UnicodeString replaced = matcher->replaceAll(literal(content), status);
      if (U_FAILURE(status)) throw std::runtime_error("ICU's regex replace failed: " + std::string(u_errorName(status)));
      return text::utf8(replaced);
    }
    if (type == "Precompiled")  // SentencePiece's charsmap: the "words" model applies it to each word
      return s;
    throw std::runtime_error(path_ + ": a " + type + " normalizer; give token ids with --ids");
  }

  // A replacement as ICU's replaceAll reads it: $ and \ taken literally.
  static icu::UnicodeString literal(const std::string& content) {
    return icu::UnicodeString::fromUTF8(text::replace_all(text::replace_all(content, "\\", "\\\\"), "$", "\\$"));
  }

  std::vector<std::string> pre_tokenize(const nlohmann::json& spec, std::vector<std::string> pieces) const {
    if (spec.is_null()) return pieces;
    const std::string type = spec.at("type").get<std::string>();
    std::vector<std::string> out;
    if (type == "Sequence") {
      for (const auto& step : spec.at("pretokenizers")) pieces = pre_tokenize(step, pieces);
      return pieces;
    }
    if (type == "WhitespaceSplit") {
      for (const auto& p : pieces) {
        std::string word;
        for (UChar32 c : text::code_points(p)) {
          if (!text::is_space(c)) word += text::utf8(c);
          else if (!word.empty()) out.push_back(word), word.clear();
        }
        if (!word.empty()) out.push_back(word);
      }
      return out;
    }
    if (type == "Metaspace") {
      const std::string mark = spec.at("replacement").get<std::string>();
      const std::string scheme = spec.value("prepend_scheme", "always");
      const bool split = spec.value("split", true);
      for (size_t i = 0; i < pieces.size(); ++i) {
        std::string s = text::replace_all(pieces[i], " ", mark);
        if ((scheme == "always" || (scheme == "first" && i == 0)) && s.rfind(mark, 0) != 0) s = mark + s;
        if (!split) {
          out.push_back(s);
          continue;
        }
        for (size_t start = 0; start < s.size();) {
          size_t next = s.find(mark, start + (s.compare(start, mark.size(), mark) == 0 ? mark.size() : 0));
          out.push_back(s.substr(start, next == std::string::npos ? std::string::npos : next - start));
          start = next == std::string::npos ? s.size() : next;
        }
      }
      return out;
    }
    if (type == "Split" && spec.at("behavior") == "Isolated" && !spec.at("invert").get<bool>()) {
      auto compiled = text::regex(spec.at("pattern").at("Regex").get<std::string>());
      for (const auto& p : pieces) {
        const icu::UnicodeString u = icu::UnicodeString::fromUTF8(p);
        UErrorCode status = U_ZERO_ERROR;
        std::unique_ptr<icu::RegexMatcher> matcher(compiled->matcher(u, status));
        int32_t last = 0;
        while (matcher->find(status)) {
          const int32_t begin = matcher->start(status), end = matcher->end(status);
          if (begin > last) out.push_back(text::utf8(u.tempSubStringBetween(last, begin)));
          if (end > begin) out.push_back(text::utf8(u.tempSubStringBetween(begin, end)));
          last = end;
        }
        if (last < u.length()) out.push_back(text::utf8(u.tempSubStringBetween(last)));
      }
      return out;
    }
    throw std::runtime_error(path_ + ": a " + type + " pre-tokenizer; give token ids with --ids");
  }
};

}  // namespace tfm
