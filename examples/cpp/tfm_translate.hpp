// Translate with a tfm-export model directory from C++17 and the ONNX Runtime C++ API; copy this header into an
// app that has nlohmann-json and OpenSSL's libcrypto (SHA-256). It follows docs/graph-contract.md:
//
//   tfm::ModelDir        reads manifest.json and opens only the files it names, each a plain name inside the
//                        directory whose sha256 matches the manifest's
//   tfm::StepSearch      encoder once, then decoder_step_search per token with each layer's cache buffer bound as
//                        both its past input and its present output (the graph writes the new token in place);
//                        greedy and beam search with tfm-run's rules: stopping, ranking, ties, n-best
//   tfm::GenerateSearch  generate.onnx (`tfm-export generate`): the whole search in one Run
//
// Both take one source as the encoder takes it (ids with their framing, `<s> ... </s>` in the seed layout) and
// return hypotheses of target ids; text goes through tokenizer.hpp.
#pragma once
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

namespace tfm {

// The graph contract's names: the only place this example spells them.
namespace contract {
inline const std::string kManifest = "manifest.json", kFormat = "tfm-export-model";
inline const std::string kSentencePiece = "sentencepiece";  // the manifest's entry: {"file", "input"}
inline const std::vector<std::string> kSentencePieceInputs = {"text", "words"};
inline const int kFormatVersion = 2;
inline const std::string kEncoder = "encoder", kSearch = "decoder_step_search",
                         kSearchFused = "decoder_step_search_fused", kGenerate = "generate";
inline const std::vector<std::string> kEncoderInputs = {"input_ids", "attention_mask"};
inline const std::string kEncoderHidden = "last_hidden_state";
inline const std::string kLogits = "logits", kTopLogprobs = "top_logprobs", kTopIds = "top_ids";
inline const std::vector<std::string> kGenerateInputs = {"input_ids", "max_length", "min_length", "num_beams",
                                                         "num_return_sequences", "length_penalty"};
inline const std::vector<std::string> kGenerateOutputs = {"sequences", "sequences_scores"};

// past_key_values.{i}.decoder.key, present.{i}.encoder.value, ...
inline std::string cache(const std::string& prefix, int layer, const std::string& side, const std::string& role) {
  return prefix + "." + std::to_string(layer) + "." + side + "." + role;
}
// decoder_step_search's inputs in order: the step's token, the source mask, the cache length, the decoding rules,
// (the fused twin: the total length, cache length + 1, an int32 its attention kernel reads on the host), then per
// layer its decoder key, decoder value, encoder key, encoder value.
inline const std::string kTotalLength = "total_sequence_length";
inline std::vector<std::string> search_inputs(int layers, bool fused) {
  std::vector<std::string> out = {"input_ids", "encoder_attention_mask", "cache_length", "token_bias", "forced_token"};
  if (fused) out.push_back(kTotalLength);
  for (int i = 0; i < layers; ++i)
    for (const char* side : {"decoder", "encoder"})
      for (const char* role : {"key", "value"}) out.push_back(cache("past_key_values", i, side, role));
  return out;
}
inline std::vector<std::string> search_outputs(int layers) {
  std::vector<std::string> out = {kLogits, kTopLogprobs, kTopIds};
  for (int i = 0; i < layers; ++i)
    for (const char* role : {"key", "value"}) out.push_back(cache("present", i, "decoder", role));
  return out;
}
inline std::vector<std::string> encoder_cache_outputs(int layers) {
  std::vector<std::string> out;
  for (int i = 0; i < layers; ++i)
    for (const char* role : {"key", "value"}) out.push_back(cache("present", i, "encoder", role));
  return out;
}
}  // namespace contract

constexpr int kCapacityStep = 16;  // cache positions added when a buffer is full (attention reads the unused ones)
constexpr int kOpMaxLength = 4096;  // generate.onnx's BeamSearch refuses a longer max_length (<s> counted)
constexpr double kMaxLengthPenalty = 10.0;  // beyond +-10 every ranking is degenerate

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Which ids a decoder starts from, stops at, never produces or must produce: the seed layout, or a pretrained
// model's generation config (the manifest's token_rules).
struct TokenRules {
  int64_t pad = 1, start = 2, eos = 3;
  std::vector<int64_t> banned = {1};
  int64_t forced_bos = -1, forced_eos = -1;  // -1: none
  int64_t max_new_tokens = 0;                // the default length limit; 0: the model's positions
  bool transformers_rule = false;            // beam search as transformers' generate() runs it
  enum class EarlyStopping { False, True, Never } early_stopping = EarlyStopping::False;
  int num_beams = 1;
  double length_penalty = 1.0;
  bool seed_layout = true;
  std::vector<std::string> languages;  // the model's language codes (eng_Latn, __fr__, >>fra<<), if multilingual
  std::string language_rule;           // where a target language's code goes: forced_bos, decoder_start or
                                       // source_prefix (before the source text); "" without languages
};

// One result of a search.
struct Hypothesis {
  std::vector<int64_t> tokens;  // generated ids, without the start token and </s>
  double score = 0;             // summed log-probabilities, </s> included when generated
  bool finished = true;         // ended with </s> (false: cut at the length limit)

  size_t length() const { return tokens.size() + (finished ? 1 : 0); }  // what the length penalty divides by
  double normalized(double penalty) const {
    return score / std::pow(static_cast<double>(std::max<size_t>(length(), 1)), penalty);
  }
};

struct SearchOptions {
  int beam_size = 1;  // 1: greedy
  double length_penalty = 1.0;
  int n_best = 1;      // hypotheses returned, best first (beam search; at most beam_size)
  int max_length = 0;  // generated tokens at most, </s> included; 0: the model's default
  int min_length = 0;  // </s> barred before this many tokens
};

struct SessionSettings {
  int threads = 0;     // ONNX Runtime intra-op threads; 0: its default (all cores)
  bool fused = true;   // decoder_step_search_fused where the directory has it (ONNX Runtime kernels, same I/O)
  std::string device = "cpu";  // one of kDevices: the execution provider every session asks for first
};

// --device's values and the execution provider each needs in the ONNX Runtime library
inline const std::vector<std::pair<std::string, std::string>> kDevices = {
    {"cpu", "CPUExecutionProvider"}, {"cuda", "CUDAExecutionProvider"}, {"tensorrt", "TensorrtExecutionProvider"}};

// Refuses a device whose execution provider this ONNX Runtime library lacks: one line, never a CPU decode instead.
inline void check_device(const std::string& device) {
  for (const auto& [name, provider] : kDevices) {
    if (name != device) continue;
    for (const std::string& available : Ort::GetAvailableProviders())
      if (available == provider) return;
    throw Error("--device " + device + ": this ONNX Runtime library (" + Ort::GetVersionString() + ") has no " +
                provider + "; build against a library with it (onnxruntime-gpu's, or JetPack's)");
  }
  throw Error("--device takes cpu, cuda or tensorrt, not '" + device + "'");  // the command line checked it
}

namespace detail {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  return nlohmann::json::parse(in);
}

inline int64_t id_or_none(const nlohmann::json& v) { return v.is_null() ? -1 : v.get<int64_t>(); }

// A file's SHA-256 in hex, through OpenSSL's EVP interface, a chunk at a time.
inline std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1)
    throw Error(path + ": OpenSSL could not start a SHA-256 digest");
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (EVP_DigestUpdate(context.get(), buffer.data(), static_cast<size_t>(in.gcount())) != 1)
      throw Error(path + ": OpenSSL's SHA-256 digest failed");
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(context.get(), digest, &size) != 1) throw Error(path + ": OpenSSL's SHA-256 digest failed");
  std::string hex;
  char two[3];
  for (unsigned int i = 0; i < size; ++i) std::snprintf(two, sizeof two, "%02x", digest[i]), hex += two;
  return hex;
}

inline std::vector<std::string> names(const Ort::Session& session, bool inputs) {
  Ort::AllocatorWithDefaultOptions allocator;
  std::vector<std::string> out;
  size_t count = inputs ? session.GetInputCount() : session.GetOutputCount();
  for (size_t i = 0; i < count; ++i)
    out.emplace_back(inputs ? session.GetInputNameAllocated(i, allocator).get()
                            : session.GetOutputNameAllocated(i, allocator).get());
  return out;
}

// A graph whose inputs or outputs are not the ones this code feeds is refused before any run, naming the first
// that differs.
inline void check_names(const Ort::Session& session, const std::string& path, bool inputs,
                        const std::vector<std::string>& expected) {
  const std::string kind = inputs ? "input" : "output";
  const std::vector<std::string> got = names(session, inputs);
  for (size_t i = 0; i < std::max(got.size(), expected.size()); ++i) {
    if (i >= got.size()) throw Error(path + ": lacks the contract's " + kind + " '" + expected[i] + "'");
    if (i >= expected.size()) throw Error(path + ": has " + kind + " '" + got[i] + "', which the contract lacks");
    if (got[i] != expected[i])
      throw Error(path + ": " + kind + " " + std::to_string(i) + " is '" + got[i] + "' where the contract has '" +
                  expected[i] + "'");
  }
}

// ONNX Runtime's version as major * 1000 + minor (1.32 -> 1032).
inline int runtime_version() {
  int major = 0, minor = 0;
  return std::sscanf(Ort::GetVersionString().c_str(), "%d.%d", &major, &minor) == 2 ? major * 1000 + minor : 0;
}

inline Ort::Session open(Ort::Env& env, const std::string& path, const Ort::SessionOptions& options) {
  try {
    return Ort::Session(env, path.c_str(), options);
  } catch (const Ort::Exception& e) {
    throw Error(path + ": ONNX Runtime cannot load this graph (" + e.what() + ")");
  }
}

inline std::vector<int64_t> output_shape(const Ort::Session& session, size_t index) {
  return session.GetOutputTypeInfo(index).GetTensorTypeAndShapeInfo().GetShape();
}

inline Ort::SessionOptions session_options(const SessionSettings& settings, bool arena, bool fold_qdq) {
  Ort::SessionOptions options;
  options.SetIntraOpNumThreads(settings.threads);
  options.SetInterOpNumThreads(1);
  options.SetGraphOptimizationLevel(GraphOptimizationLevel::ORT_ENABLE_ALL);
  options.SetLogSeverityLevel(3);
  if (!arena) options.DisableCpuMemArena();  // the step loop allocates little per step: less peak memory
  // threads spin between a run's ops and stop when it returns, leaving the core to the search between steps
  options.AddConfigEntry("session.intra_op.allow_spinning", "1");
  options.AddConfigEntry("session.force_spinning_stop", "1");
  if (fold_qdq) options.AddConfigEntry("session.disable_quant_qdq", "1");  // int8 static: Q/DQ as float ops
  check_device(settings.device);
  if (settings.device == "tensorrt") options.AppendExecutionProvider_TensorRT(OrtTensorRTProviderOptions{});
  if (settings.device != "cpu") options.AppendExecutionProvider_CUDA(OrtCUDAProviderOptions{});
  return options;
}

}  // namespace detail

// A model directory: the manifest read and checked, and the files it names opened only after their checks.
class ModelDir {
 public:
  explicit ModelDir(const std::string& dir) : dir_(dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) throw Error(dir + ": not a directory");
    const std::string path = (fs::path(dir) / contract::kManifest).string();
    if (!fs::exists(path)) throw Error(dir + ": not a tfm-export model directory (no " + contract::kManifest + ")");
    try {
      manifest_ = detail::read_json(path);
    } catch (const std::exception& e) {
      throw Error(path + ": cannot read it (" + e.what() + ")");
    }
    try {
      read_fields();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(path + ": " + e.what() + "; export the model again");
    }
  }

  const std::string& path() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const TokenRules& rules() const { return rules_; }
  bool has_graph(const std::string& name) const { return manifest_.at("graphs").contains(name); }
  int layers() const { return layers_; }
  int heads() const { return heads_; }
  int d_k() const { return d_k_; }
  int d_v() const { return d_v_; }
  int positions() const { return positions_; }
  int max_source() const { return max_source_; }
  int max_target() const { return max_target_; }
  int source_vocab() const { return source_vocab_; }
  int target_vocab() const { return target_vocab_; }
  bool int8_static() const {
    return manifest_.at("precision") == "int8" && manifest_.contains("int8") && manifest_["int8"].contains("mode") &&
           manifest_["int8"]["mode"] == "static";
  }

  // A file the manifest names: a plain file name whose real path is inside the directory, and whose sha256 is the
  // one the manifest records (a swapped or damaged file is refused before anything reads it).
  std::string verified(const std::string& name, const std::string& sha256) const {
    namespace fs = std::filesystem;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\\') != std::string::npos)
      throw Error(dir_ + ": '" + name + "' is not a plain file name in the directory; export the model again");
    const fs::path path = fs::path(dir_) / name;
    std::error_code error;
    const fs::path real = fs::canonical(path, error);
    if (error || !fs::is_regular_file(real)) throw Error(path.string() + ": missing or not a file");
    if (real.parent_path() != fs::canonical(dir_)) throw Error(path.string() + ": points outside " + dir_);
    if (sha256.empty()) throw Error(path.string() + ": the manifest records no sha256 for it");
    if (detail::file_sha256(real.string()) != sha256)
      throw Error(path.string() + ": sha256 differs from " + contract::kManifest +
                  " (file changed or damaged); export the model again");
    return real.string();
  }

  // A graph's file, and its external weights where it has them, checked.
  std::string graph(const std::string& name) const {
    if (!has_graph(name)) throw Error(dir_ + ": has no " + name + ".onnx; export the model again");
    return graph_file(manifest_["graphs"][name]);  // has_graph checked both keys
  }

  // A manifest entry's graph file and its external weights: the file the entry names (every graph of a large model
  // shares one, hashed once here), else <file>.data where there is one.
  std::string graph_file(const nlohmann::json& entry) const {
    const auto file = entry.at("file").get<std::string>();
    const std::string path = verified(file, entry.at("sha256").get<std::string>());
    const std::string data = entry.contains("data") ? entry["data"].get<std::string>() : file + ".data";
    if ((entry.contains("data") || files().contains(data) ||
         std::filesystem::exists(std::filesystem::path(dir_) / data)) && checked_.insert(data).second)
      verified(data, recorded(data));
    return path;
  }

  // The tokenizer file of one side ("source" or "target"), checked.
  std::string tokenizer(const std::string& side) const {
    const auto name = manifest_.at("tokenizer").at(side).get<std::string>();
    return verified(name, recorded(name));
  }

  // The source tokenizer's SentencePiece model (checked) and whether it reads texts whole (else word by word);
  // "" where the manifest names none.
  std::pair<std::string, bool> sentencepiece() const {
    if (sentencepiece_file_.empty()) return {"", true};
    return {verified(sentencepiece_file_, recorded(sentencepiece_file_)), sentencepiece_whole_text_};
  }

  // Translate into the language of `code` (the target tokenizer's id): where the model's language_rule puts it.
  void choose_target(int64_t code) {
    if (rules_.language_rule == "forced_bos") rules_.forced_bos = code;
    else if (rules_.language_rule == "decoder_start") rules_.start = code;
  }

 private:
  std::string dir_;
  nlohmann::json manifest_;
  mutable std::set<std::string> checked_;  // external weight files already verified
  TokenRules rules_;
  int layers_ = 0, heads_ = 0, d_k_ = 0, d_v_ = 0, positions_ = 0, max_source_ = 0, max_target_ = 0;
  int source_vocab_ = 0, target_vocab_ = 0;
  std::string sentencepiece_file_;  // the manifest's sentencepiece entry, where it has one
  bool sentencepiece_whole_text_ = true;

  const nlohmann::json& files() const { return manifest_.at("files"); }

  // The sha256 the manifest records for a file, "" where it records none.
  std::string recorded(const std::string& name) const {
    return files().contains(name) ? files()[name].get<std::string>() : "";
  }

  void read_fields() {
    const auto& m = manifest_;
    if (!m.is_object() || m.value("format", "") != contract::kFormat || !m.contains("format_version") ||
        m["format_version"] != contract::kFormatVersion)
      throw Error(dir_ + ": not a tfm-export model directory (its manifest's format is not " + contract::kFormat +
                  " version " + std::to_string(contract::kFormatVersion) + ")");
    const auto& model = m.at("model");
    layers_ = static_cast<int>(model.at("n_layers").get<int64_t>());
    heads_ = static_cast<int>(model.at("n_head").get<int64_t>());
    d_k_ = static_cast<int>(model.at("d_k").get<int64_t>());
    d_v_ = static_cast<int>(model.at("d_v").get<int64_t>());
    positions_ = static_cast<int>(model.at("n_position").get<int64_t>());
    source_vocab_ = static_cast<int>(model.at("src_vocab_size").get<int64_t>());
    target_vocab_ = static_cast<int>(model.at("trg_vocab_size").get<int64_t>());
    max_source_ = std::min(positions_, static_cast<int>(m.at("limits").at("max_source_length").get<int64_t>()));
    max_target_ = std::min(positions_, static_cast<int>(m.at("limits").at("max_target_length").get<int64_t>()));
    if (m.contains(contract::kSentencePiece)) {
      const auto& entry = m[contract::kSentencePiece];
      const auto input = entry.at("input").get<std::string>();
      const auto& inputs = contract::kSentencePieceInputs;
      if (std::find(inputs.begin(), inputs.end(), input) == inputs.end())
        throw Error(dir_ + "/" + contract::kManifest + ": sentencepiece.input '" + input + "' is not one this reads");
      sentencepiece_file_ = entry.at("file").get<std::string>();
      sentencepiece_whole_text_ = input == inputs[0];
    }
    if (!m.contains("token_rules")) {  // the seed layout: <blank> 1 never generated, <s> 2 first, </s> 3 last
      const auto& special = m.at("special_tokens");
      rules_.pad = special.at("pad").get<int64_t>(), rules_.start = special.at("bos").get<int64_t>();
      rules_.eos = special.at("eos").get<int64_t>(), rules_.banned = {rules_.pad};
      return;
    }
    const auto& r = m.at("token_rules");
    rules_.seed_layout = false;
    rules_.pad = r.at("pad").get<int64_t>(), rules_.start = r.at("start").get<int64_t>();
    rules_.eos = r.at("eos").get<int64_t>();
    rules_.banned.clear();
    for (const auto& id : r.at("banned")) rules_.banned.push_back(id.get<int64_t>());
    rules_.forced_bos = detail::id_or_none(r.at("forced_bos"));
    rules_.forced_eos = detail::id_or_none(r.at("forced_eos"));
    const auto& limit = r.at("max_new_tokens");
    rules_.max_new_tokens = limit.is_null() ? 0 : limit.get<int64_t>();
    rules_.transformers_rule = r.at("beam_rule") == "transformers";
    if (r.contains("early_stopping")) {
      const auto& e = r["early_stopping"];
      rules_.early_stopping = e.is_string()   ? TokenRules::EarlyStopping::Never
                              : e.get<bool>() ? TokenRules::EarlyStopping::True
                                              : TokenRules::EarlyStopping::False;
    }
    if (r.contains("num_beams")) rules_.num_beams = static_cast<int>(r.at("num_beams").get<int64_t>());
    if (r.contains("length_penalty")) rules_.length_penalty = r["length_penalty"].get<double>();
    if (r.contains("languages")) rules_.languages = r["languages"].get<std::vector<std::string>>();
    if (r.contains("language_rule") && r["language_rule"].is_string())
      rules_.language_rule = r["language_rule"].get<std::string>();
  }
};

// Options as a search takes them: the model's defaults filled in, each checked (one line when out of range).
inline SearchOptions resolved(const ModelDir& model, SearchOptions o, int widest_beam) {
  if (o.max_length == 0) {
    const int64_t limit = model.rules().max_new_tokens ? model.rules().max_new_tokens : model.max_target();
    o.max_length = static_cast<int>(std::min<int64_t>(limit, model.max_target()));
  }
  if (o.beam_size < 1 || o.beam_size > widest_beam)
    throw Error("--beam-size " + std::to_string(o.beam_size) + " is outside 1.." + std::to_string(widest_beam));
  if (o.n_best < 1 || o.n_best > o.beam_size)
    throw Error("--n-best " + std::to_string(o.n_best) + " needs --beam-size >= " + std::to_string(o.n_best));
  if (o.max_length < 1 || o.max_length > model.max_target())
    throw Error("--max-length " + std::to_string(o.max_length) + " is outside 1.." +
                std::to_string(model.max_target()) + " (the model's positions)");
  if (o.min_length < 0 || !(std::abs(o.length_penalty) <= kMaxLengthPenalty))
    throw Error("--min-length must be >= 0 and --length-penalty within -10..10");
  return o;
}

inline void check_source(const ModelDir& model, const std::vector<int64_t>& source) {
  if (source.empty()) throw Error("an empty source (a source has at least its framing, e.g. </s>)");
  if (static_cast<int>(source.size()) > model.max_source())
    throw Error("source of " + std::to_string(source.size()) + " tokens is longer than the model's " +
                std::to_string(model.max_source()) + "; shorten it");
  for (int64_t id : source)
    if (id < 0 || id >= model.source_vocab())
      throw Error("source id " + std::to_string(id) + " is outside the source vocabulary of " +
                  std::to_string(model.source_vocab()));
}

// The hypotheses ranked as tfm-run ranks them: by normalized score, earlier ones first among equals.
inline std::vector<Hypothesis> best(std::vector<Hypothesis> found, double length_penalty, size_t count) {
  std::stable_sort(found.begin(), found.end(), [&](const Hypothesis& a, const Hypothesis& b) {
    return a.normalized(length_penalty) > b.normalized(length_penalty);
  });
  if (found.size() > count) found.resize(count);
  return found;
}

// Encoder once, decoder_step_search per token, the cache written in place; greedy and beam search.
class StepSearch {
 public:
  StepSearch(Ort::Env& env, const ModelDir& model, const SessionSettings& settings = {})
      : model_(model), rules_(model.rules()), encoder_(nullptr), decoder_(nullptr) {
    const bool fold = model.int8_static();
    Ort::SessionOptions encoder_options = detail::session_options(settings, false, fold);
    encoder_options.AddConfigEntry("session.disable_prepacking", "1");  // runs once per input: packing costs more
    const std::string encoder_path = model.graph(contract::kEncoder);
    encoder_ = detail::open(env, encoder_path, encoder_options);
    detail::check_names(encoder_, encoder_path, true, contract::kEncoderInputs);
    std::vector<std::string> encoder_outputs = contract::encoder_cache_outputs(model.layers());
    encoder_outputs.insert(encoder_outputs.begin(), contract::kEncoderHidden);
    detail::check_names(encoder_, encoder_path, false, encoder_outputs);
    // the fused twin (ONNX Runtime's attention kernels) where the directory has it and this runtime computes it
    // right (1.20 ignores its source padding mask), as tfm-run chooses
    const bool fused = settings.fused && model.has_graph(contract::kSearchFused) && detail::runtime_version() >= 1021;
    const std::string path = model.graph(fused ? contract::kSearchFused : contract::kSearch);
    decoder_ = detail::open(env, path, detail::session_options(settings, false, fold));
    fused_ = fused;
    const std::vector<std::string> inputs = contract::search_inputs(model.layers(), fused_);
    detail::check_names(decoder_, path, true, inputs);
    detail::check_names(decoder_, path, false, contract::search_outputs(model.layers()));
    for (size_t i = first_cache(); i < decoder_.GetInputCount(); ++i) {  // the cache buffers this code owns: float32
      auto type = decoder_.GetInputTypeInfo(i).GetTensorTypeAndShapeInfo().GetElementType();
      if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT)
        throw Error(path + ": input '" + inputs[i] +
                    "' is not float32 (an fp16 directory?); give an fp32, int8 or fp16 --keep-io-types directory");
    }
    top_k_ = static_cast<int>(detail::output_shape(decoder_, 2).at(1));  // K: a constant of the graph
    if (top_k_ < 2) throw Error(path + ": its top_ids output has no fixed K; export the model again");
  }

  // The widest beam the graph's own candidates serve (2 x beam per row).
  int widest_beam() const { return top_k_ / 2; }

  // Sources (ids as the encoder takes them), decoded together as rows of one Run per step: each one's best
  // hypotheses, best first (n_best of them; greedy: one). An input whose search is done leaves the batch (its rows,
  // its source mask and its encoder keys and values), as in tfm-run.
  std::vector<std::vector<Hypothesis>> search(const std::vector<std::vector<int64_t>>& sources,
                                              const SearchOptions& options) {
    const SearchOptions o = resolved(model_, options, widest_beam());
    for (const auto& source : sources) check_source(model_, source);
    const int k = o.beam_size;
    const bool generate_rule = k > 1 && rules_.transformers_rule;
    encode(sources);
    begin(static_cast<int>(sources.size()) * k);
    std::vector<Input> inputs(sources.size());
    std::vector<int> active;  // the inputs still searching: active[j] owns rows j * k .. j * k + k - 1
    for (size_t i = 0; i < sources.size(); ++i) {
      inputs[i].b = start(k, generate_rule ? -1e9f : -std::numeric_limits<float>::infinity());  // generate()'s -1e9
      active.push_back(static_cast<int>(i));
    }
    for (int t = 0; t < o.max_length && !active.empty(); ++t) {
      std::vector<int64_t> tokens;
      for (int i : active) tokens.insert(tokens.end(), inputs[i].b.tokens.begin(), inputs[i].b.tokens.end());
      step(tokens, t, o);
      std::vector<int> rows, kept, still;  // the next step's rows (this step's indices), sources and inputs
      for (size_t j = 0; j < active.size(); ++j) {
        Input& in = inputs[active[j]];
        const int first = static_cast<int>(j) * k;
        const Next next = k == 1 ? greedy(in, first, t, o) : generate_rule ? transformers_beam(in, first, t, o)
                                                                           : beam(in, first, t, o);
        if (in.done) continue;
        follow(in.b, next);
        for (int r : next.rows) rows.push_back(first + r);
        kept.push_back(static_cast<int>(j)), still.push_back(active[j]);
      }
      gather(rows, kept);
      active.swap(still);
    }
    std::vector<std::vector<Hypothesis>> found;
    for (auto& in : inputs) {
      if (k > 1 && !generate_rule) in.finished = best(in.finished, o.length_penalty, o.n_best);
      if (static_cast<int>(in.finished.size()) > o.n_best) in.finished.resize(o.n_best);
      found.push_back(in.finished);
    }
    return found;
  }

  // One source -> its best hypotheses.
  std::vector<Hypothesis> search(const std::vector<int64_t>& source, const SearchOptions& options) {
    return search(std::vector<std::vector<int64_t>>{source}, options).front();
  }

 private:
  struct Candidate {
    int beam;
    int64_t token;
    float value;  // beam score + log-probability, in float32 as tfm-run sums it
  };

  // Beam search's rows of one input: each one's tokens so far, its next input and its score.
  struct Beams {
    std::vector<std::vector<int64_t>> history;
    std::vector<int64_t> tokens;
    std::vector<float> scores;
  };

  // One input's search: its rows, what it has finished, and whether it is done.
  struct Input {
    Beams b;
    std::vector<Hypothesis> finished;
    bool done = false;
  };

  // What an input's rows go on with: row i from its row rows[i], with tokens[i] at scores[i].
  struct Next {
    std::vector<int> rows;
    std::vector<int64_t> tokens;
    std::vector<float> scores;
  };

  const ModelDir& model_;
  const TokenRules rules_;
  Ort::Session encoder_, decoder_;
  Ort::MemoryInfo memory_ = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
  int top_k_ = 0;

  // One batch's state: everything bound to the decoder session, and the buffers behind it.
  std::vector<int64_t> mask_;                 // (sources, S): the source mask
  std::vector<std::vector<float>> cross_;     // per layer the encoder's key, value (sources, H, S, d)
  std::vector<std::vector<float>> cache_;     // per layer decoder key, value (rows, H, capacity, d)
  std::vector<int64_t> ids_, top_ids_;        // (rows, 1) the step's tokens; (rows, K)
  std::vector<float> bias_, logits_, top_logprobs_;  // (V,) the decoding rules' bias; (rows, 1, V); (rows, K)
  int64_t cache_length_ = 0, forced_ = -1;    // scalars: filled positions, the forced token (-1: none)
  int32_t total_length_ = 1;                  // the fused step's: positions after this step (cache_length_ + 1)
  bool fused_ = false;
  int rows_ = 0, sources_ = 0, source_length_ = 0, capacity_ = 0;
  std::unique_ptr<Ort::IoBinding> binding_;
  std::vector<Ort::Value> bound_;             // what is bound: the session reads and writes their memory

  // The encoder over the sources, padded to the longest; its keys and values kept in buffers this code owns.
  void encode(const std::vector<std::vector<int64_t>>& sources) {
    sources_ = static_cast<int>(sources.size()), source_length_ = 0;
    for (const auto& source : sources) source_length_ = std::max(source_length_, static_cast<int>(source.size()));
    std::vector<int64_t> ids(static_cast<size_t>(sources_) * source_length_, rules_.pad);
    for (int i = 0; i < sources_; ++i) std::copy(sources[i].begin(), sources[i].end(), ids.begin() + i * source_length_);
    mask_.assign(ids.size(), 0);
    for (size_t i = 0; i < ids.size(); ++i) mask_[i] = ids[i] != rules_.pad;
    const int64_t shape[] = {sources_, source_length_};
    Ort::Value inputs[] = {Ort::Value::CreateTensor<int64_t>(memory_, ids.data(), ids.size(), shape, 2),
                           Ort::Value::CreateTensor<int64_t>(memory_, mask_.data(), mask_.size(), shape, 2)};
    const char* input_names[] = {contract::kEncoderInputs[0].c_str(), contract::kEncoderInputs[1].c_str()};
    const std::vector<std::string> outputs = contract::encoder_cache_outputs(model_.layers());
    std::vector<const char*> output_names;
    for (const auto& name : outputs) output_names.push_back(name.c_str());
    auto values = encoder_.Run(Ort::RunOptions{nullptr}, input_names, inputs, 2, output_names.data(), outputs.size());
    cross_.clear();
    for (auto& value : values) {
      const float* data = value.GetTensorData<float>();
      cross_.emplace_back(data, data + value.GetTensorTypeAndShapeInfo().GetElementCount());
    }
  }
  // Fresh buffers for `rows` rows (every source's beams before the first step).
  void begin(int rows) {
    rows_ = rows, capacity_ = 0, cache_length_ = 0;
    cache_.assign(2 * model_.layers(), {});
    ids_.assign(rows, 0);
    bias_.assign(model_.target_vocab(), 0.0f);
    for (int64_t id : rules_.banned) bias_.at(id) = -std::numeric_limits<float>::infinity();
    logits_.assign(static_cast<size_t>(rows) * model_.target_vocab(), 0.0f);
    top_logprobs_.assign(static_cast<size_t>(rows) * top_k_, 0.0f);
    top_ids_.assign(static_cast<size_t>(rows) * top_k_, 0);
    grow();
  }

  int head_size(size_t tensor) const { return tensor % 2 == 0 ? model_.d_k() : model_.d_v(); }
  size_t first_cache() const { return fused_ ? 6 : 5; }  // the index of the first cache input

  // Room for kCapacityStep more positions: each buffer copied into a wider one, then everything bound again.
  void grow() {
    const int capacity = std::min(static_cast<int>(cache_length_) + kCapacityStep, model_.positions());
    for (size_t t = 0; t < cache_.size(); ++t) {
      const size_t d = head_size(t), lines = static_cast<size_t>(rows_) * model_.heads();
      std::vector<float> wider(lines * capacity * d, 0.0f);  // unused positions are read: they must be finite
      for (size_t line = 0; line < lines && capacity_ > 0; ++line)
        std::copy_n(cache_[t].begin() + line * capacity_ * d, capacity_ * d, wider.begin() + line * capacity * d);
      cache_[t].swap(wider);
    }
    capacity_ = capacity;
    bind();
  }

  void bind() {
    binding_ = std::make_unique<Ort::IoBinding>(decoder_);
    bound_.clear();
    const int64_t rows = rows_, sources = sources_, source_length = source_length_;
    const int64_t vocab = model_.target_vocab(), k = top_k_;
    const std::vector<std::string> inputs = contract::search_inputs(model_.layers(), fused_);
    const std::vector<std::string> outputs = contract::search_outputs(model_.layers());
    auto input = [&](const std::string& name, Ort::Value value) {
      binding_->BindInput(name.c_str(), value);
      bound_.push_back(std::move(value));
    };
    const int64_t ids_shape[] = {rows, 1}, mask_shape[] = {sources, source_length}, bias_shape[] = {vocab};
    input(inputs[0], Ort::Value::CreateTensor<int64_t>(memory_, ids_.data(), ids_.size(), ids_shape, 2));
    input(inputs[1], Ort::Value::CreateTensor<int64_t>(memory_, mask_.data(), mask_.size(), mask_shape, 2));
    input(inputs[2], Ort::Value::CreateTensor<int64_t>(memory_, &cache_length_, 1, nullptr, 0));
    input(inputs[3], Ort::Value::CreateTensor<float>(memory_, bias_.data(), bias_.size(), bias_shape, 1));
    input(inputs[4], Ort::Value::CreateTensor<int64_t>(memory_, &forced_, 1, nullptr, 0));
    if (fused_) input(inputs[5], Ort::Value::CreateTensor<int32_t>(memory_, &total_length_, 1, nullptr, 0));
    const size_t past = first_cache();
    for (int layer = 0; layer < model_.layers(); ++layer) {
      for (int role = 0; role < 2; ++role) {  // the buffer is the past input and the present output: in place
        auto& buffer = cache_[2 * layer + role];
        const int64_t shape[] = {rows, model_.heads(), capacity_, head_size(role)};
        Ort::Value value = Ort::Value::CreateTensor<float>(memory_, buffer.data(), buffer.size(), shape, 4);
        binding_->BindOutput(outputs[3 + 2 * layer + role].c_str(), value);
        input(inputs[past + 4 * layer + role], std::move(value));
        auto& cross = cross_[2 * layer + role];
        const int64_t cross_shape[] = {sources, model_.heads(), source_length, head_size(role)};
        input(inputs[past + 4 * layer + 2 + role],
              Ort::Value::CreateTensor<float>(memory_, cross.data(), cross.size(), cross_shape, 4));
      }
    }
    const int64_t top_shape[] = {rows, k};
    bound_.push_back(Ort::Value::CreateTensor<float>(memory_, top_logprobs_.data(), top_logprobs_.size(), top_shape, 2));
    binding_->BindOutput(contract::kTopLogprobs.c_str(), bound_.back());
    bound_.push_back(Ort::Value::CreateTensor<int64_t>(memory_, top_ids_.data(), top_ids_.size(), top_shape, 2));
    binding_->BindOutput(contract::kTopIds.c_str(), bound_.back());
    const int64_t logits_shape[] = {rows, 1, vocab};
    bound_.push_back(Ort::Value::CreateTensor<float>(memory_, logits_.data(), logits_.size(), logits_shape, 3));
    binding_->BindOutput(contract::kLogits.c_str(), bound_.back());  // unread (wider beams would read it)
  }

  // One decoder step for every row: `tokens` in, each row's K best (log-probability, id) in top_*_. The rules:
  // the first step may force a token (forced_bos), the last a length limit allows may force </s>, and </s> is
  // barred before min_length.
  void step(const std::vector<int64_t>& tokens, int step, const SearchOptions& o) {
    if (cache_length_ == capacity_) grow();
    std::copy(tokens.begin(), tokens.end(), ids_.begin());
    forced_ = step == 0 ? rules_.forced_bos : -1;
    if (step + 1 == o.max_length && rules_.forced_eos >= 0) forced_ = rules_.forced_eos;
    total_length_ = static_cast<int32_t>(cache_length_ + 1);
    const bool eos_banned = std::find(rules_.banned.begin(), rules_.banned.end(), rules_.eos) != rules_.banned.end();
    bias_[rules_.eos] = step + 1 > o.min_length && !eos_banned ? 0.0f : -std::numeric_limits<float>::infinity();
    decoder_.Run(Ort::RunOptions{nullptr}, *binding_);
    ++cache_length_;
  }

  // Cache buffer t with its row i taken from row rows[i]: the filled positions (the others zero: unused positions
  // are read, so they must be finite).
  std::vector<float> cache_rows(size_t t, const std::vector<int>& rows) const {
    const size_t line = static_cast<size_t>(capacity_) * head_size(t), row = model_.heads() * line;
    const size_t filled = static_cast<size_t>(cache_length_) * head_size(t);
    std::vector<float> out(rows.size() * row, 0.0f);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int h = 0; h < model_.heads(); ++h)
        std::copy_n(cache_[t].begin() + rows[i] * row + h * line, filled, out.begin() + i * row + h * line);
    return out;
  }

  // Blocks of `block` elements: block i taken from block index[i].
  template <typename T>
  static std::vector<T> blocks(const std::vector<T>& from, size_t block, const std::vector<int>& index) {
    std::vector<T> out(index.size() * block);
    for (size_t i = 0; i < index.size(); ++i) std::copy_n(from.begin() + index[i] * block, block, out.begin() + i * block);
    return out;
  }

  // Row i of every cache buffer becomes row rows[i] (beams reordered), in the bound buffers.
  void reorder(const std::vector<int>& rows) {
    bool moved = false;
    for (int i = 0; i < rows_; ++i) moved |= rows[i] != i;
    if (!moved) return;
    for (size_t t = 0; t < cache_.size(); ++t) {
      const std::vector<float> reordered = cache_rows(t, rows);
      std::copy(reordered.begin(), reordered.end(), cache_[t].begin());
    }
  }

  // The next step's rows (rows[i]: this step's index of new row i) and sources (kept: the inputs still
  // searching, by this step's index). Where inputs left, every buffer is gathered into a smaller one and bound again.
  void gather(const std::vector<int>& rows, const std::vector<int>& kept) {
    if (static_cast<int>(rows.size()) == rows_) return reorder(rows);  // no input left: each kept its k rows
    for (size_t t = 0; t < cache_.size(); ++t) cache_[t] = cache_rows(t, rows);
    mask_ = blocks(mask_, source_length_, kept);
    for (auto& buffer : cross_) buffer = blocks(buffer, buffer.size() / sources_, kept);
    rows_ = static_cast<int>(rows.size()), sources_ = static_cast<int>(kept.size());
    ids_.assign(rows_, 0);
    logits_.assign(static_cast<size_t>(rows_) * model_.target_vocab(), 0.0f);
    top_logprobs_.assign(static_cast<size_t>(rows_) * top_k_, 0.0f);
    top_ids_.assign(static_cast<size_t>(rows_) * top_k_, 0);
    if (rows_ > 0) bind();
  }

  // Greedy: an input's one row goes on with its best token until </s> or the length limit.
  Next greedy(Input& in, int first, int t, const SearchOptions& o) {
    const int64_t token = top_ids_[first * top_k_];  // the first of equal maxima
    const float score = in.b.scores[0] + top_logprobs_[first * top_k_];  // summed in float32, as tfm-run sums it
    if (token == rules_.eos || t + 1 == o.max_length) {
      Hypothesis h{in.b.history[0], score, token == rules_.eos};
      if (!h.finished) h.tokens.push_back(token);
      in.finished = {h}, in.done = true;
      return {};
    }
    return {{0}, {token}, {score}};
  }

  // The `count` best candidates score + log-probability over an input's beams (its rows from `first`), best first,
  // ties to the lower (beam, token): an input's count best are among its rows' count best.
  std::vector<Candidate> merged(int first, const std::vector<float>& scores, int count) const {
    const int each = std::min(count, top_k_);
    std::vector<Candidate> all;
    for (int b = 0; b < static_cast<int>(scores.size()); ++b)
      for (int j = 0; j < each; ++j)
        all.push_back({b, top_ids_[(first + b) * top_k_ + j], scores[b] + top_logprobs_[(first + b) * top_k_ + j]});
    std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
      if (a.value != b.value) return a.value > b.value;
      return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
    });
    all.resize(std::min<size_t>(count, all.size()));
    return all;
  }

  // k rows with one live beam, so the first step picks no duplicates: the others score `others`.
  Beams start(int k, float others) const {
    Beams b{std::vector<std::vector<int64_t>>(k), std::vector<int64_t>(k, rules_.start), std::vector<float>(k, others)};
    b.scores[0] = 0.0f;
    return b;
  }

  // The rows go on as `next` says: the token histories follow (the cache rows follow in gather).
  static void follow(Beams& b, const Next& next) {
    std::vector<std::vector<int64_t>> history(next.rows.size());
    for (size_t i = 0; i < next.rows.size(); ++i) {
      history[i] = b.history[next.rows[i]];
      history[i].push_back(next.tokens[i]);
    }
    b.history.swap(history), b.tokens = next.tokens, b.scores = next.scores;
  }

  // tfm-run's beam search (the reference decoders' rule): of the 2k best candidates, a </s> among the k best is a
  // finished hypothesis; the first k others go on. The input is done when its best candidate is </s> (no live
  // beam can score higher), or at the length limit, where its live beams become hypotheses too.
  Next beam(Input& in, int first, int t, const SearchOptions& o) {
    const int k = o.beam_size;
    const float none = -std::numeric_limits<float>::infinity();
    const Beams& b = in.b;
    const std::vector<Candidate> c = merged(first, b.scores, 2 * k);
    std::vector<int> picked;  // ranks of the continuations: the first k non-</s> candidates above -inf
    for (size_t r = 0; r < c.size() && static_cast<int>(picked.size()) < k; ++r) {
      if (c[r].value == none) break;
      if (c[r].token != rules_.eos) picked.push_back(static_cast<int>(r));
      else if (static_cast<int>(r) < k) in.finished.push_back({b.history[c[r].beam], c[r].value, true});
    }
    const bool done = c[0].token == rules_.eos && c[0].value != none, last = t + 1 == o.max_length;
    if (last && !done)
      for (int r : picked) {
        Hypothesis cut{b.history[c[r].beam], c[r].value, false};
        cut.tokens.push_back(c[r].token);
        in.finished.push_back(cut);
      }
    if (done || picked.empty() || last) {
      in.done = true;
      return {};
    }
    Next next{std::vector<int>(k), std::vector<int64_t>(k), std::vector<float>(k)};
    for (int i = 0; i < k; ++i) {  // fewer than k continuations: copies of the first at -inf fill the rows
      const bool real = i < static_cast<int>(picked.size());
      const Candidate& from = c[picked[real ? i : 0]];
      next.rows[i] = from.beam, next.tokens[i] = real ? from.token : rules_.pad, next.scores[i] = real ? from.value : none;
    }
    return next;
  }

  // Beam search as transformers' generate() runs it, for pretrained models whose outputs must match it: a </s>
  // among the k best of the 2k candidates is kept as finished (the k best finished by normalized score); the k
  // best others go on; when the input is done follows the model's early_stopping; at the length limit the k best
  // candidates end as they are.
  Next transformers_beam(Input& in, int first, int t, const SearchOptions& o) {
    const int k = o.beam_size;
    const Beams& b = in.b;
    const std::vector<Candidate> c = merged(first, b.scores, 2 * k);
    const bool last = t + 1 == o.max_length;
    std::vector<double> key(c.size());  // ended candidates sink by 1e9 (in float64, as NumPy computes it)
    for (size_t r = 0; r < c.size(); ++r) {
      const bool ends = c[r].token == rules_.eos || last;
      key[r] = static_cast<double>(c[r].value) - (ends ? 1e9 : 0.0);
      if (!ends || static_cast<int>(r) >= k) continue;
      const bool done = c[r].token == rules_.eos;
      Hypothesis h{b.history[c[r].beam], c[r].value, done};
      if (!done) h.tokens.push_back(c[r].token);
      in.finished.push_back(h);
      in.finished = best(in.finished, o.length_penalty, k);
    }
    std::vector<int> going(c.size());
    for (size_t r = 0; r < c.size(); ++r) going[r] = static_cast<int>(r);
    std::stable_sort(going.begin(), going.end(), [&](int x, int y) { return key[x] > key[y]; });
    Next next{std::vector<int>(k), std::vector<int64_t>(k), std::vector<float>(k)};
    for (int i = 0; i < k; ++i)
      next.rows[i] = c[going[i]].beam, next.tokens[i] = c[going[i]].token, next.scores[i] = static_cast<float>(key[going[i]]);
    if (last || !may_improve(in.finished, next.scores[0], k, t + 1, o)) {
      in.done = true;
      return {};
    }
    return next;
  }

  // Whether generate() searches on: fewer than k finished, or (unless early_stopping is true) the best live score,
  // at the current length or, with "never" and a positive penalty, at the length limit, beats the worst finished
  // one. In float32, as NumPy compares a float32 score with a Python float.
  bool may_improve(const std::vector<Hypothesis>& finished, float best_live, int k, int length,
                   const SearchOptions& o) const {
    using ES = TokenRules::EarlyStopping;
    if (static_cast<int>(finished.size()) < k) return true;
    if (rules_.early_stopping == ES::True) return false;
    if (rules_.early_stopping == ES::Never && o.length_penalty > 0) length = o.max_length;
    const float live = best_live / static_cast<float>(std::pow(static_cast<double>(length), o.length_penalty));
    return live > static_cast<float>(finished.back().normalized(o.length_penalty));
  }
};

// generate.onnx: ONNX Runtime's BeamSearch op runs the whole greedy or beam search in one Run.
class GenerateSearch {
 public:
  GenerateSearch(Ort::Env& env, const ModelDir& model, const SessionSettings& settings = {})
      : model_(model), session_(nullptr) {
    const auto& m = model.manifest();
    if (!m.contains(contract::kGenerate))
      throw Error(model.path() + ": has no generate.onnx; make one with `tfm-export generate --model " + model.path() +
                  " --output DIR` and give that directory");
    if (!model.rules().seed_layout) throw Error(model.path() + ": generate.onnx is made for the seed's token layout");
    if (detail::runtime_version() < 1022)
      throw Error("generate.onnx needs ONNX Runtime 1.22 or later (this is " + Ort::GetVersionString() + ")");
    const auto& entry = m[contract::kGenerate];
    const std::string path = model.graph_file(entry);
    session_ = detail::open(env, path, detail::session_options(settings, true, model.int8_static()));
    detail::check_names(session_, path, true, contract::kGenerateInputs);
    detail::check_names(session_, path, false, contract::kGenerateOutputs);
  }

  int widest_beam() const { return 64; }

  std::vector<Hypothesis> search(const std::vector<int64_t>& source, const SearchOptions& options) {
    const SearchOptions o = resolved(model_, options, widest_beam());
    check_source(model_, source);
    if (o.max_length + 1 > kOpMaxLength)
      throw Error("--max-length " + std::to_string(o.max_length) + " is beyond what BeamSearch takes");
    const float penalty = o.beam_size > 1 ? static_cast<float>(o.length_penalty) : 0.0f;  // greedy: summed log-p
    std::vector<int32_t> ids(source.begin(), source.end());
    int32_t scalars[] = {o.max_length + 1, o.min_length + 1, o.beam_size, o.n_best};  // the op counts <s>
    const int64_t shape[] = {1, static_cast<int64_t>(ids.size())}, one[] = {1};
    std::vector<Ort::Value> inputs;
    inputs.push_back(Ort::Value::CreateTensor<int32_t>(memory_, ids.data(), ids.size(), shape, 2));
    for (int32_t& value : scalars) inputs.push_back(Ort::Value::CreateTensor<int32_t>(memory_, &value, 1, one, 1));
    float penalty_value = penalty;
    inputs.push_back(Ort::Value::CreateTensor<float>(memory_, &penalty_value, 1, one, 1));
    std::vector<const char*> in_names, out_names;
    for (const auto& n : contract::kGenerateInputs) in_names.push_back(n.c_str());
    for (const auto& n : contract::kGenerateOutputs) out_names.push_back(n.c_str());
    auto out = session_.Run(Ort::RunOptions{nullptr}, in_names.data(), inputs.data(), inputs.size(),
                            out_names.data(), out_names.size());
    const int64_t length = out[0].GetTensorTypeAndShapeInfo().GetShape().at(2);
    const int32_t* sequences = out[0].GetTensorData<int32_t>();
    const float* scores = out[1].GetTensorData<float>();
    std::vector<Hypothesis> found;
    for (int n = 0; n < o.n_best; ++n) {  // <s>, the generated ids, then <blank> (</s> is not written)
      Hypothesis h;
      for (int64_t i = 1; i < length; ++i)
        if (sequences[n * length + i] != model_.rules().pad) h.tokens.push_back(sequences[n * length + i]);
      h.finished = static_cast<int>(h.tokens.size()) < o.max_length;
      // the op's score is log-p / (length with <s>) ** penalty: back to the summed log-probability
      h.score = static_cast<double>(scores[n]) * std::pow(static_cast<double>(h.tokens.size() + 1), penalty);
      found.push_back(h);
    }
    return found;
  }

 private:
  const ModelDir& model_;
  Ort::Session session_;
  Ort::MemoryInfo memory_ = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
};

}  // namespace tfm
