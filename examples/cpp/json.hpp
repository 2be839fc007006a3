// A small JSON reader: enough for manifest.json and tokenizer.json (objects, arrays, strings with
// \u escapes, numbers, booleans, null). Kept here so the example needs only ONNX Runtime and a C++17 compiler.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mini_json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object } kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Value> array;
  std::map<std::string, Value> object;

  const Value& operator[](const std::string& key) const {
    auto it = object.find(key);
    if (kind != Kind::Object || it == object.end()) throw std::runtime_error("missing JSON key: " + key);
    return it->second;
  }
  bool has(const std::string& key) const { return kind == Kind::Object && object.count(key) > 0; }
  bool is_null() const { return kind == Kind::Null; }
  int64_t as_int() const { return static_cast<int64_t>(number); }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}
  Value parse() {
    Value v = value();
    space();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(i_));
  }
  void space() { while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_; }
  bool take(char c) { space(); if (i_ < s_.size() && s_[i_] == c) { ++i_; return true; } return false; }
  void expect(char c) { if (!take(c)) fail(std::string("expected '") + c + "'"); }

  Value value() {
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    Value v;
    char c = s_[i_];
    if (c == '{') {
      v.kind = Value::Kind::Object; ++i_;
      if (take('}')) return v;
      do { space(); std::string key = str(); expect(':'); v.object[key] = value(); } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Value::Kind::Array; ++i_;
      if (take(']')) return v;
      do { v.array.push_back(value()); } while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Value::Kind::String; v.string = str();
    } else if (s_.compare(i_, 4, "true") == 0) { v.kind = Value::Kind::Bool; v.boolean = true; i_ += 4; }
    else if (s_.compare(i_, 5, "false") == 0) { v.kind = Value::Kind::Bool; i_ += 5; }
    else if (s_.compare(i_, 4, "null") == 0) { i_ += 4; }
    else {
      size_t used = 0;
      v.kind = Value::Kind::Number; v.number = std::stod(s_.substr(i_, 32), &used);
      if (used == 0) fail("bad value");
      i_ += used;
    }
    return v;
  }

  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) { out += static_cast<char>(cp); }
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)); out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    uint32_t cp = std::stoul(s_.substr(i_, 4), nullptr, 16);
    i_ += 4;
    return cp;
  }

  std::string str() {
    if (i_ >= s_.size() || s_[i_] != '"') fail("expected string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') { out += c; continue; }
      char e = s_[i_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {
            i_ += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4() - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
};

inline Value parse(const std::string& text) { return Parser(text).parse(); }

}  // namespace mini_json
