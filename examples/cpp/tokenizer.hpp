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

#include <nlohmann/json.hpp>

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + ": cannot open tokenizer");
    json_ = nlohmann::json::parse(in);
    const auto& model = json_.at("model");
    if (model.at("type") != "WordLevel") throw std::runtime_error(path + ": unsupported model type");
    for (const auto& [token, value] : model.at("vocab").items()) {
      const auto id = value.get<int64_t>();
      vocab_[token] = id;
      if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(id + 1);
      tokens_[id] = token;
    }
    unk_ = vocab_.at(model.at("unk_token").get<std::string>());
    for (const auto& t : json_.at("added_tokens"))
      if (t.at("special").get<bool>()) special_.insert(t.at("id").get<int64_t>());
  }

  std::vector<int64_t> encode(const std::string& text) const {
    for (unsigned char c : text) if (c >= 0x80) throw std::runtime_error("non-ASCII input needs ICU normalization");
    std::string normalized = normalize(json_.at("normalizer"), text);
    std::vector<std::string> pieces;
    if (!normalized.empty()) pieces = pre_tokenize(json_.at("pre_tokenizer"), {normalized});
    std::vector<int64_t> ids;
    for (const auto& piece : pieces) {
      auto it = vocab_.find(piece);
      ids.push_back(it == vocab_.end() ? unk_ : it->second);
    }
    return ids;
  }

  const std::string& token(int64_t id) const { return tokens_.at(id); }

  std::string decode(const std::vector<int64_t>& ids) const {
    std::vector<std::string> pieces;
    for (int64_t id : ids) if (!special_.count(id)) pieces.push_back(tokens_.at(id));
    const auto& dec = json_.at("decoder");
    std::string out;
    if (dec.is_null()) {
      for (size_t i = 0; i < pieces.size(); ++i) out += (i ? " " : "") + pieces[i];
      return out;
    }
    const auto type = dec.at("type").get<std::string>();
    if (type != "Metaspace") throw std::runtime_error("unsupported decoder " + type);
    for (const auto& p : pieces) out += p;
    out = replace_all(out, dec.at("replacement").get<std::string>(), " ");
    return out.rfind(' ', 0) == 0 ? out.substr(1) : out;
  }

 private:
  nlohmann::json json_;
  std::map<std::string, int64_t> vocab_;
  std::vector<std::string> tokens_;
  std::set<int64_t> special_;
  int64_t unk_ = 0;

  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
    return s;
  }

  static std::string text(const nlohmann::json& spec, const std::string& key) { return spec.at(key).get<std::string>(); }
  static bool flag(const nlohmann::json& spec, const std::string& key) { return spec.at(key).get<bool>(); }

  static std::string normalize(const nlohmann::json& spec, std::string s) {
    if (spec.is_null()) return s;
    const std::string type = text(spec, "type");
    if (type == "Sequence") { for (const auto& step : spec.at("normalizers")) s = normalize(step, s); return s; }
    if (type == "NFKC") return s;  // identity on ASCII, which encode() checks
    if (type == "Lowercase") { for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c))); return s; }
    if (type == "Strip") {
      size_t b = flag(spec, "strip_left") ? s.find_first_not_of(" \t\n\r\f\v") : 0;
      if (b == std::string::npos) return "";
      size_t e = flag(spec, "strip_right") ? s.find_last_not_of(" \t\n\r\f\v") + 1 : s.size();
      return s.substr(b, e - b);
    }
    if (type == "Replace") {
      const auto& pattern = spec.at("pattern");
      if (pattern.contains("Regex")) return std::regex_replace(s, std::regex(text(pattern, "Regex")), text(spec, "content"));
      return replace_all(s, text(pattern, "String"), text(spec, "content"));
    }
    throw std::runtime_error("unsupported normalizer " + type);
  }

  static std::vector<std::string> pre_tokenize(const nlohmann::json& spec, std::vector<std::string> pieces) {
    if (spec.is_null()) return pieces;
    const std::string type = text(spec, "type");
    std::vector<std::string> out;
    if (type == "Sequence") {
      for (const auto& step : spec.at("pretokenizers")) pieces = pre_tokenize(step, pieces);
      return pieces;
    }
    if (type == "WhitespaceSplit") {
      for (const auto& p : pieces) { std::istringstream words(p); for (std::string w; words >> w;) out.push_back(w); }
      return out;
    }
    if (type == "Metaspace") {
      const std::string mark = text(spec, "replacement");
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
    if (type == "Split" && text(spec, "behavior") == "Isolated" && !flag(spec, "invert")) {
      std::regex pattern(text(spec.at("pattern"), "Regex"));
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
