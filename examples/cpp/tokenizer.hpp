// The tokenizers-JSON WordLevel tokenizer that tfm-export writes, in C++17 (same steps as
// examples/node/tokenizer.js). Unicode-aware steps (NFKC, lowercasing) are exact for ASCII text;
// other text is refused rather than tokenized differently from Python (use ICU to extend this).
#pragma once
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + ": cannot open tokenizer");
    std::stringstream buffer;
    buffer << in.rdbuf();
    json_ = mini_json::parse(buffer.str());
    const auto& model = json_["model"];
    if (model["type"].string != "WordLevel") throw std::runtime_error(path + ": unsupported model type");
    for (const auto& [token, id] : model["vocab"].object) {
      vocab_[token] = id.as_int();
      if (static_cast<size_t>(id.as_int()) >= tokens_.size()) tokens_.resize(id.as_int() + 1);
      tokens_[id.as_int()] = token;
    }
    unk_ = vocab_.at(model["unk_token"].string);
    for (const auto& t : json_["added_tokens"].array) if (t["special"].boolean) special_.insert(t["id"].as_int());
  }

  std::vector<int64_t> encode(const std::string& text) const {
    for (unsigned char c : text) if (c >= 0x80) throw std::runtime_error("non-ASCII input needs ICU normalization");
    std::string normalized = normalize(json_["normalizer"], text);
    std::vector<std::string> pieces;
    if (!normalized.empty()) pieces = pre_tokenize(json_["pre_tokenizer"], {normalized});
    std::vector<int64_t> ids;
    for (const auto& piece : pieces) {
      auto it = vocab_.find(piece);
      ids.push_back(it == vocab_.end() ? unk_ : it->second);
    }
    return ids;
  }

  std::string decode(const std::vector<int64_t>& ids) const {
    std::vector<std::string> pieces;
    for (int64_t id : ids) if (!special_.count(id)) pieces.push_back(tokens_.at(id));
    const auto& dec = json_["decoder"];
    std::string out;
    if (dec.is_null()) {
      for (size_t i = 0; i < pieces.size(); ++i) out += (i ? " " : "") + pieces[i];
      return out;
    }
    if (dec["type"].string != "Metaspace") throw std::runtime_error("unsupported decoder " + dec["type"].string);
    for (const auto& p : pieces) out += p;
    out = replace_all(out, dec["replacement"].string, " ");
    return out.rfind(' ', 0) == 0 ? out.substr(1) : out;
  }

 private:
  mini_json::Value json_;
  std::map<std::string, int64_t> vocab_;
  std::vector<std::string> tokens_;
  std::set<int64_t> special_;
  int64_t unk_ = 0;

  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    return s;
  }

  static std::string normalize(const mini_json::Value& spec, std::string s) {
    if (spec.is_null()) return s;
    const std::string& type = spec["type"].string;
    if (type == "Sequence") { for (const auto& step : spec["normalizers"].array) s = normalize(step, s); return s; }
    if (type == "NFKC") return s;  // identity on ASCII, which encode() checks
    if (type == "Lowercase") { for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); return s; }
    if (type == "Strip") {
      size_t b = spec["strip_left"].boolean ? s.find_first_not_of(" \t\n\r\f\v") : 0;
      if (b == std::string::npos) return "";
      size_t e = spec["strip_right"].boolean ? s.find_last_not_of(" \t\n\r\f\v") + 1 : s.size();
      return s.substr(b, e - b);
    }
    if (type == "Replace") {
      const auto& pattern = spec["pattern"];
      if (pattern.has("Regex")) return std::regex_replace(s, std::regex(pattern["Regex"].string), spec["content"].string);
      return replace_all(s, pattern["String"].string, spec["content"].string);
    }
    throw std::runtime_error("unsupported normalizer " + type);
  }

  static std::vector<std::string> pre_tokenize(const mini_json::Value& spec, std::vector<std::string> pieces) {
    if (spec.is_null()) return pieces;
    const std::string& type = spec["type"].string;
    std::vector<std::string> out;
    if (type == "Sequence") {
      for (const auto& step : spec["pretokenizers"].array) pieces = pre_tokenize(step, pieces);
      return pieces;
    }
    if (type == "WhitespaceSplit") {
      for (const auto& p : pieces) { std::istringstream words(p); for (std::string w; words >> w;) out.push_back(w); }
      return out;
    }
    if (type == "Metaspace") {
      const std::string& mark = spec["replacement"].string;
      for (const auto& p : pieces) {
        std::string s = replace_all(p, " ", mark);
        if (s.rfind(mark, 0) != 0) s = mark + s;
        for (size_t start = 0; start < s.size();) {
          size_t next = s.find(mark, start + mark.size());
          out.push_back(s.substr(start, next == std::string::npos ? std::string::npos : next - start));
          start = next == std::string::npos ? s.size() : next;
        }
      }
      return out;
    }
    if (type == "Split" && spec["behavior"].string == "Isolated" && !spec["invert"].boolean) {
      std::regex pattern(spec["pattern"]["Regex"].string);
      for (const auto& p : pieces) {
        size_t last = 0;
        for (auto it = std::sregex_iterator(p.begin(), p.end(), pattern); it != std::sregex_iterator(); ++it) {
          size_t at = static_cast<size_t>(it->position());
          if (at > last) out.push_back(p.substr(last, at - last));
          out.push_back(it->str());
          last = at + it->length();
        }
        if (last < p.size()) out.push_back(p.substr(last));
      }
      return out;
    }
    throw std::runtime_error("unsupported pre-tokenizer " + type);
  }
};
