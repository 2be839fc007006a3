// tfm_translate: the command line over tfm_translate.hpp, with tfm-run translate's options and output formats. One
// input per line (TEXT arguments, else stdin in chunks of what has arrived, each sorted by length and decoded
// --batch-size inputs at a time, as tfm-run does), one output line per input in input order (text or jsonl), or N
// lines SCORE<TAB>OUTPUT with --n-best N.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tfm_translate.hpp"
#include "tokenizer.hpp"

namespace {

const char* kUsage =
    "usage: tfm_translate MODEL_DIR [options] [TEXT ...]   (no TEXT: one input per line on stdin)\n"
    "Options are tfm-run translate's, with its defaults:\n"
    "  --beam-size N       1 = greedy (default: the model's, else 1)\n"
    "  --length-penalty A  rank hypotheses by log-probability / length ** A (default: the model's, else 1)\n"
    "  --n-best N          N best hypotheses per input, best first, scored by what ranks them (log-probability\n"
    "                      / length ** length penalty, </s> counted): text gives N lines SCORE<TAB>OUTPUT per\n"
    "                      input, jsonl an n_best list and n_best_count; entries the beams did not finish are\n"
    "                      empty, with score -inf (text) or null (jsonl). Default 1\n"
    "  --format F          text (default) or jsonl: per input source, translation, tokens, ids, score (summed\n"
    "                      log-probability), time_ms (its decode) and truncated (cut before </s>)\n"
    "  --max-length N      generated tokens at most, </s> included (default: the model's limit)\n"
    "  --min-length N      </s> barred before N tokens\n"
    "  --batch-size N      inputs decoded together, as rows of one Run (default 32); each chunk of what has\n"
    "                      arrived (at most 8 batches) is sorted by length first, and printed in input order\n"
    "  --threads N         ONNX Runtime threads (default 0: all cores)\n"
    "  --device D          cpu (default), cuda or tensorrt: ONNX Runtime's execution provider for it, which the\n"
    "                      library must have (a CPU build refuses, in one line)\n"
    "  --source-lang CODE  multilingual models: the source language's code (eng_Latn, __fr__, en_XX), framing\n"
    "                      each source in place of the model's saved one\n"
    "  --target-lang CODE  multilingual models: the language to translate into (where the model puts it: its\n"
    "                      first generated token, its decoder's start, or before the source as >>fra<<)\n"
    "Its own:\n"
    "  --generate          decode with generate.onnx in one Run (a directory from `tfm-export generate`)\n"
    "  --ids               inputs and outputs are token ids, space-separated; an input as the encoder takes it\n"
    "                      (with its framing, e.g. <s> ... </s>): any model, with the app's own tokenizer\n"
    "  --no-fused          decoder_step_search even where the directory has decoder_step_search_fused\n"
    "  --help, -h          this text\n"
    "  --version           the model format it reads and ONNX Runtime's version\n";

const size_t kShownCodes = 8;  // language codes an error lists before "..."

// A usage mistake: one line, the way to the options, exit 2.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct Args {
  std::string model;
  std::vector<std::string> texts;
  tfm::SearchOptions search;
  std::optional<int> beam;
  std::optional<double> length_penalty;
  bool jsonl = false;
  tfm::SessionSettings session;
  std::optional<std::string> source_lang, target_lang;
  int batch_size = 32;
  bool generate = false, ids = false, help = false, version = false;
};

int whole(const std::string& option, const std::string& value) {
  size_t used = 0;
  int n = -1;
  try { n = std::stoi(value, &used); } catch (const std::exception&) {}
  if (used != value.size() || n < 0) throw UsageError(option + " takes a whole number, not '" + value + "'");
  return n;
}

bool format(const std::string& value) {
  if (value != "text" && value != "jsonl") throw UsageError("--format takes text or jsonl, not '" + value + "'");
  return value == "jsonl";
}

std::string device(const std::string& value) {
  for (const auto& known : tfm::kDevices)
    if (known.first == value) return value;
  throw UsageError("--device takes cpu, cuda or tensorrt, not '" + value + "'");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--beam-size") a.beam = whole(arg, value());
    else if (arg == "--n-best") a.search.n_best = whole(arg, value());
    else if (arg == "--format") a.jsonl = format(value());
    else if (arg == "--max-length") a.search.max_length = whole(arg, value());
    else if (arg == "--min-length") a.search.min_length = whole(arg, value());
    else if (arg == "--threads") a.session.threads = whole(arg, value());
    else if (arg == "--batch-size") {
      a.batch_size = whole(arg, value());
      if (a.batch_size < 1) throw UsageError("--batch-size takes a whole number of at least 1");
    }
    else if (arg == "--device") a.session.device = device(value());
    else if (arg == "--source-lang") a.source_lang = value();
    else if (arg == "--target-lang") a.target_lang = value();
    else if (arg == "--length-penalty") {
      const std::string v = value();
      size_t used = 0;
      try { a.length_penalty = std::stod(v, &used); } catch (const std::exception&) {}
      if (used != v.size() || !a.length_penalty) throw UsageError("--length-penalty takes a number, not '" + v + "'");
    } else if (arg == "--generate") a.generate = true;
    else if (arg == "--ids") a.ids = true;
    else if (arg == "--no-fused") a.session.fused = false;
    else if (arg == "--help" || arg == "-h") a.help = true;
    else if (arg == "--version") a.version = true;
    else if (arg.rfind("--", 0) == 0) throw UsageError("unknown option " + arg);
    else if (a.model.empty()) a.model = arg;
    else a.texts.push_back(arg);
  }
  if (a.model.empty() && !a.help && !a.version) throw UsageError("no MODEL_DIR");
  if (a.ids && (a.source_lang || a.target_lang))
    throw UsageError("--source-lang/--target-lang choose codes of text input; with --ids, put the codes in the ids");
  return a;
}

std::vector<int64_t> parse_ids(const std::string& line) {
  std::vector<int64_t> ids;
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    size_t used = 0;
    long long id = -1;
    try { id = std::stoll(word, &used); } catch (const std::exception&) {}
    if (used != word.size() || id < 0) throw tfm::Error("'" + word + "' is not a token id (--ids takes ids)");
    ids.push_back(id);
  }
  return ids;
}

std::string join(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out;
}

// Text in and out through the directory's tokenizers (tokenizer.hpp), the languages chosen as tfm-run chooses them;
// ids for any model with --ids.
class Io {
 public:
  Io(tfm::ModelDir& model, const Args& args) : model_(model) {
    if (args.ids) return;
    const auto [spm, whole_text] = model.sentencepiece();
    const auto spm_file = spm.empty() ? std::nullopt : std::optional<tfm::SentencePieceFile>({spm, whole_text});
    source_ = std::make_unique<tfm::Tokenizer>(model.tokenizer("source"), spm_file);
    target_ = std::make_unique<tfm::Tokenizer>(model.tokenizer("target"), std::nullopt, false);
    choose_languages(args.source_lang, args.target_lang);
  }

  // A source as the encoder takes it: framed by the tokenizer's template, or <s> ... </s> in the seed layout (which
  // tfm-run frames so whatever the file's post-processor says).
  std::vector<int64_t> source(const std::string& line) const {
    if (!source_) return parse_ids(line);
    std::vector<int64_t> ids = source_->encode(line);
    if (!model_.rules().seed_layout) return source_->framed(ids);
    ids.insert(ids.begin(), model_.rules().start);
    ids.push_back(model_.rules().eos);
    return ids;
  }

  std::string output(const std::vector<int64_t>& tokens) const { return target_ ? target_->decode(tokens) : join(tokens); }

  // Each id's token (none with --ids: no tokenizer)
  std::vector<std::string> pieces(const std::vector<int64_t>& tokens) const {
    std::vector<std::string> out;
    if (target_)
      for (int64_t id : tokens) out.push_back(target_->token(id));
    return out;
  }

 private:
  tfm::ModelDir& model_;
  std::unique_ptr<tfm::Tokenizer> source_, target_;

  // tfm-run's rules: a code must be one of the model's; the source's replaces the framing's; the target's goes
  // where the model's language_rule says. A model that needs a target and names none is refused.
  void choose_languages(const std::optional<std::string>& source, const std::optional<std::string>& target) {
    const auto& rules = model_.rules();
    const auto& codes = rules.languages;
    if (!source && !target) {
      if (rules.language_rule == "forced_bos" && rules.forced_bos < 0)
        throw tfm::Error("this model translates into " + std::to_string(codes.size()) +
                         " languages and its generation config names none; pass --target-lang (" + sample(codes) + ")");
      return;
    }
    if (codes.empty()) throw tfm::Error("--source-lang/--target-lang: this model takes no language codes; drop them");
    for (const auto& [name, code] : {std::pair{"--source-lang", source}, std::pair{"--target-lang", target}})
      if (code && std::find(codes.begin(), codes.end(), *code) == codes.end())
        throw tfm::Error(std::string(name) + " '" + *code + "' is not one of the model's " +
                         std::to_string(codes.size()) + " language codes (" + sample(codes) + ")");
    if (source) {
      if (source_->framing_codes(codes).empty())
        throw tfm::Error("--source-lang: this model's sources carry no language code (it reads any language it "
                         "knows); drop it");
      source_->frame_with(*source, codes);
    }
    if (target) {
      if (rules.language_rule == "source_prefix") source_->frame_with(*target, {});
      const auto id = target_->id(*target);
      if (!id) throw tfm::Error(model_.path() + ": the target tokenizer has no token " + *target);
      model_.choose_target(*id);
    }
  }

  static std::string sample(const std::vector<std::string>& codes) {
    std::string out;
    for (size_t i = 0; i < codes.size() && i < kShownCodes; ++i) out += (i ? ", " : "") + codes[i];
    return out + (codes.size() > kShownCodes ? ", ..." : "");
  }
};

// Lines of stdin, split at \n as tfm-run splits them, in chunks of what has arrived (at most `most` lines each):
// lines are decoded as soon as the input has no more for the moment, so a pipe fed a line at a time gets each
// answer at once (tfm-run waits 50 ms for more), and a file or a busy pipe is read in full chunks.
class LineChunks {
 public:
  explicit LineChunks(size_t most) : most_(most) {}

  // The next chunk of raw lines; empty at the end of the input.
  std::vector<std::string> next() {
    for (;;) {
      if (lines_.size() >= most_ || (ended_ && !lines_.empty())) return take();
      if (ended_) return {};
      pollfd stdin_fd{0, POLLIN, 0};
      const int ready = poll(&stdin_fd, 1, lines_.empty() ? -1 : 0);  // with lines waiting, only what is there
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) throw tfm::Error(std::string("<stdin>: cannot read input (") + std::strerror(errno) + ")");
      if (ready == 0) return take();
      char buffer[1 << 16];
      const ssize_t got = read(0, buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw tfm::Error(std::string("<stdin>: cannot read input (") + std::strerror(errno) + ")");
      if (got == 0) {
        ended_ = true;
        if (!partial_.empty()) lines_.push_back(partial_);
        continue;
      }
      for (ssize_t i = 0; i < got; ++i) {
        if (buffer[i] != '\n') partial_ += buffer[i];
        else lines_.push_back(partial_), partial_.clear();
      }
    }
  }

 private:
  size_t most_;
  std::vector<std::string> lines_;
  std::string partial_;
  bool ended_ = false;

  std::vector<std::string> take() {
    const size_t count = std::min(most_, lines_.size());
    std::vector<std::string> chunk(lines_.begin(), lines_.begin() + count);
    lines_.erase(lines_.begin(), lines_.begin() + count);
    return chunk;
  }
};

const size_t kChunkBatches = 8;  // tfm-run's CHUNK_BATCHES: a chunk is sorted by length over this many batches

// Scores as tfm-run prints them: text with six decimals, JSON rounded to six (null where there is no hypothesis)
std::string text_score(double value) {
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.6f", value);
  return text;
}

nlohmann::ordered_json json_score(double value) {
  return std::isfinite(value) ? nlohmann::ordered_json(std::round(value * 1e6) / 1e6) : nlohmann::ordered_json(nullptr);
}

// One input's output, as tfm-run translate formats it (its JSON keys in its order; only the spacing differs).
// `found` holds the hypotheses best first; `n_best` entries are shown above 1, the missing ones as -inf/null.
std::string formatted(const std::string& source, const std::vector<tfm::Hypothesis>& found, const Io& io,
                      const tfm::SearchOptions& options, bool jsonl, double milliseconds) {
  const tfm::Hypothesis best = found.empty() ? tfm::Hypothesis{} : found[0];
  const double lost = -std::numeric_limits<double>::infinity();
  auto score = [&](int n) { return n < static_cast<int>(found.size()) ? found[n].normalized(options.length_penalty) : lost; };
  auto output = [&](int n) { return n < static_cast<int>(found.size()) ? io.output(found[n].tokens) : std::string(); };
  if (!jsonl) {
    if (options.n_best == 1) return io.output(best.tokens);
    std::string lines;
    for (int n = 0; n < options.n_best; ++n) lines += (n ? "\n" : "") + text_score(score(n)) + "\t" + output(n);
    return lines;
  }
  nlohmann::ordered_json row = {{"source", source}, {"translation", io.output(best.tokens)},
                        {"tokens", io.pieces(best.tokens)}, {"ids", best.tokens}, {"score", json_score(best.score)},
                        {"time_ms", std::round(milliseconds * 1e3) / 1e3}, {"truncated", !best.finished}};
  if (options.n_best > 1) {
    row["n_best"] = nlohmann::ordered_json::array();
    for (int n = 0; n < options.n_best; ++n)
      row["n_best"].push_back({{"translation", output(n)}, {"score", json_score(score(n))},
                               {"log_prob", json_score(n < static_cast<int>(found.size()) ? found[n].score : lost)}});
    row["n_best_count"] = found.size();
  }
  return row.dump();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "error: " << e.what() << " (tfm_translate --help lists the options)\n";
    return 2;
  }
  if (args.help) {
    std::cout << kUsage;
    return 0;
  }
  if (args.version) {
    std::cout << "tfm_translate: reads " << tfm::contract::kFormat << " version " << tfm::contract::kFormatVersion
              << " directories; ONNX Runtime " << Ort::GetVersionString() << "\n";
    return 0;
  }
  try {
    tfm::check_device(args.session.device);  // before the model is read
    tfm::ModelDir model(args.model);
    const Io io(model, args);  // the languages first: a target language changes the model's rules
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "tfm_translate");
    std::unique_ptr<tfm::StepSearch> loop;
    std::unique_ptr<tfm::GenerateSearch> generate;
    if (args.generate) generate = std::make_unique<tfm::GenerateSearch>(env, model, args.session);
    else loop = std::make_unique<tfm::StepSearch>(env, model, args.session);
    tfm::SearchOptions options = args.search;
    options.beam_size = args.beam.value_or(model.rules().num_beams);
    options.length_penalty = args.length_penalty.value_or(model.rules().length_penalty);
    const int widest = generate ? generate->widest_beam() : loop->widest_beam();
    options = tfm::resolved(model, options, widest);  // options out of range fail before any input is read

    // One chunk of lines (the first is line `first` of the whole input): every source read and checked first,
    // then decoded in batches of sources of similar length, each line printed once it and all before it are done.
    auto translate = [&](const std::vector<std::string>& lines, size_t first) {
      std::vector<std::vector<int64_t>> sources(lines.size());
      std::vector<size_t> order;  // the lines to decode, shortest first
      for (size_t i = 0; i < lines.size(); ++i) {
        if (tfm::text::blank(lines[i])) continue;
        try {
          sources[i] = io.source(lines[i]);
          tfm::check_source(model, sources[i]);
        } catch (const tfm::Error& e) {  // named as tfm-run names it: the input's line, counted from 1
          throw tfm::Error("line " + std::to_string(first + i) + ": " + e.what());
        }
        order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sources[a].size() < sources[b].size(); });
      std::vector<std::optional<std::vector<tfm::Hypothesis>>> found(lines.size());
      std::vector<double> milliseconds(lines.size(), 0.0);
      for (size_t i = 0; i < lines.size(); ++i)
        if (sources[i].empty()) found[i] = std::vector<tfm::Hypothesis>{{}};  // blank: one empty hypothesis
      size_t printed = 0;
      auto print_ready = [&]() {
        for (; printed < lines.size() && found[printed]; ++printed)
          std::cout << formatted(lines[printed], *found[printed], io, options, args.jsonl, milliseconds[printed]) << std::endl;
      };
      print_ready();
      for (size_t start = 0; start < order.size(); start += args.batch_size) {
        const std::vector<size_t> batch(order.begin() + start, order.begin() + std::min(order.size(), start + args.batch_size));
        std::vector<std::vector<int64_t>> rows;
        for (size_t i : batch) rows.push_back(sources[i]);
        const auto started = std::chrono::steady_clock::now();
        std::vector<std::vector<tfm::Hypothesis>> results;
        if (generate)  // generate.onnx takes one source per Run here
          for (const auto& source : rows) results.push_back(generate->search(source, options));
        else
          results = loop->search(rows, options);
        const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - started;
        for (size_t j = 0; j < batch.size(); ++j)
          found[batch[j]] = results[j], milliseconds[batch[j]] = took.count() / batch.size();
        print_ready();
      }
    };
    for (size_t i = 0; i < args.texts.size(); ++i)
      if (tfm::text::invalid_utf8(args.texts[i]) != std::string::npos)
        throw tfm::Error("TEXT argument " + std::to_string(i + 1) + " is not valid UTF-8");
    if (!args.texts.empty()) {
      translate(args.texts, 1);
      return 0;
    }
    size_t count = 0;  // lines read so far
    LineChunks chunks(static_cast<size_t>(args.batch_size) * kChunkBatches);
    for (auto lines = chunks.next(); !lines.empty(); lines = chunks.next()) {
      for (auto& line : lines) {  // as tfm-run reads lines: a \r before the \n is dropped, and so is a first BOM
        ++count;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (count == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
        if (tfm::text::invalid_utf8(line) != std::string::npos)
          throw tfm::Error("<stdin>: line " + std::to_string(count) + " is not valid UTF-8; convert the file to UTF-8");
      }
      translate(lines, count - lines.size() + 1);
    }
    if (count == 0) throw tfm::Error("empty input: no TEXT arguments and no lines on stdin");
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
