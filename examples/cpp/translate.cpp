// Translate with a tfm-export model directory from C++17 and the ONNX Runtime C++ API: encoder once,
// decoder_step per token with the KV cache fed back, greedy decoding. Follows docs/graph-contract.md.
//
//   tfm_translate MODEL_DIR [TEXT ...]      (no TEXT: one sentence per line on stdin)
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "json.hpp"
#include "tokenizer.hpp"

namespace {

mini_json::Value read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return mini_json::parse(buffer.str());
}

std::vector<std::string> names(const mini_json::Value& tensors) {
  std::vector<std::string> out;
  for (const auto& t : tensors.array) out.push_back(t["name"].string);
  return out;
}

std::vector<const char*> c_names(const std::vector<std::string>& v) {
  std::vector<const char*> out;
  for (const auto& s : v) out.push_back(s.c_str());
  return out;
}

class Model {
 public:
  explicit Model(const std::string& dir)
      : env_(ORT_LOGGING_LEVEL_WARNING, "tfm-export"),
        manifest_(read_json(dir + "/manifest.json")),
        encoder_(nullptr),
        decoder_(nullptr),
        source_(dir + "/" + manifest_["tokenizer"]["source"].string),
        target_(dir + "/" + manifest_["tokenizer"]["target"].string) {
    if (manifest_["format"].string != "tfm-export-model" || manifest_["format_version"].as_int() != 2)
      throw std::runtime_error(dir + ": not a tfm-export model directory (format version 2)");
    Ort::SessionOptions options;
    options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
    const auto& graphs = manifest_["graphs"];
    encoder_ = Ort::Session(env_, (dir + "/" + graphs["encoder"]["file"].string).c_str(), options);
    decoder_ = Ort::Session(env_, (dir + "/" + graphs["decoder_step"]["file"].string).c_str(), options);
    enc_out_ = names(graphs["encoder"]["outputs"]);
    dec_in_ = names(graphs["decoder_step"]["inputs"]);
    dec_out_ = names(graphs["decoder_step"]["outputs"]);
  }

  std::string translate(const std::string& text) {
    const auto& special = manifest_["special_tokens"];
    const int64_t bos = special["bos"].as_int(), eos = special["eos"].as_int(), pad = special["pad"].as_int();
    const auto& cfg = manifest_["model"];
    const int64_t heads = cfg["n_head"].as_int(), dk = cfg["d_k"].as_int(), dv = cfg["d_v"].as_int();
    const int64_t limit = manifest_["limits"]["max_target_length"].as_int();

    std::vector<int64_t> ids = source_.encode(text);
    ids.insert(ids.begin(), bos);
    ids.push_back(eos);
    if (static_cast<int64_t>(ids.size()) > manifest_["limits"]["max_source_length"].as_int())
      throw std::runtime_error("sentence longer than the model's positions");
    std::vector<int64_t> mask(ids.size(), 1), shape{1, static_cast<int64_t>(ids.size())};

    std::vector<Ort::Value> enc_in;
    enc_in.push_back(Ort::Value::CreateTensor<int64_t>(mem_, ids.data(), ids.size(), shape.data(), 2));
    enc_in.push_back(Ort::Value::CreateTensor<int64_t>(mem_, mask.data(), mask.size(), shape.data(), 2));
    const char* enc_in_names[] = {"input_ids", "attention_mask"};
    auto out_names = c_names(enc_out_);
    auto enc = encoder_.Run(Ort::RunOptions{nullptr}, enc_in_names, enc_in.data(), 2, out_names.data(),
                            out_names.size());
    std::map<std::string, Ort::Value> cache;  // by decoder input name
    for (size_t i = 0; i < enc_out_.size(); ++i) {
      const std::string& name = enc_out_[i];
      if (name.rfind("present.", 0) == 0) cache.emplace("past_key_values." + name.substr(8), std::move(enc[i]));
    }
    static float no_data = 0;  // a zero-length past still needs a (never read) data pointer
    for (const auto& name : dec_in_) {
      if (name.find(".decoder.") == std::string::npos) continue;
      std::vector<int64_t> empty{1, heads, 0, name.find(".key") != std::string::npos ? dk : dv};
      cache.emplace(name, Ort::Value::CreateTensor<float>(mem_, &no_data, 0, empty.data(), 4));
    }

    std::vector<int64_t> output;
    int64_t token = bos;
    std::vector<int64_t> one{1, 1};
    for (int64_t step = 0; step < limit; ++step) {
      std::vector<Ort::Value> inputs;
      for (const auto& name : dec_in_) {
        if (name == "input_ids") inputs.push_back(Ort::Value::CreateTensor<int64_t>(mem_, &token, 1, one.data(), 2));
        else if (name == "encoder_attention_mask")
          inputs.push_back(Ort::Value::CreateTensor<int64_t>(mem_, mask.data(), mask.size(), shape.data(), 2));
        else inputs.push_back(std::move(cache.at(name)));
      }
      auto in_names = c_names(dec_in_);
      auto dec_names = c_names(dec_out_);
      auto out = decoder_.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), inputs.size(),
                              dec_names.data(), dec_names.size());
      for (size_t i = 2; i < dec_in_.size(); ++i) cache[dec_in_[i]] = std::move(inputs[i]);  // encoder K/V back
      const float* logits = out[0].GetTensorData<float>();
      const size_t vocab = out[0].GetTensorTypeAndShapeInfo().GetElementCount();
      int64_t best = -1;
      for (size_t v = 0; v < vocab; ++v)
        if (static_cast<int64_t>(v) != pad && (best < 0 || logits[v] > logits[best])) best = v;  // first maximum
      token = best;
      if (token == eos) break;
      output.push_back(token);
      for (size_t i = 1; i < dec_out_.size(); ++i)  // present.i.decoder.* -> past_key_values.i.decoder.*
        cache["past_key_values." + dec_out_[i].substr(8)] = std::move(out[i]);
    }
    return target_.decode(output);
  }

 private:
  Ort::Env env_;
  Ort::MemoryInfo mem_ = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  mini_json::Value manifest_;
  Ort::Session encoder_, decoder_;
  Tokenizer source_, target_;
  std::vector<std::string> enc_out_, dec_in_, dec_out_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: tfm_translate MODEL_DIR [TEXT ...]   (no TEXT: reads lines from stdin)\n";
    return 2;
  }
  try {
    Model model(argv[1]);
    std::vector<std::string> lines(argv + 2, argv + argc);
    if (lines.empty()) for (std::string line; std::getline(std::cin, line);) lines.push_back(line);
    for (const auto& line : lines) {
      bool blank = std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); });
      std::cout << (blank ? "" : model.translate(line)) << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
