// Reads a tokenizer.json (and the SentencePiece model a manifest names for it) and lines on stdin; prints
// "id id id<TAB>decoded text" per line, ids unframed. Used by the tests to hold the C++ tokenizer to the Python one
// without needing ONNX Runtime.
#include <iostream>
#include <optional>

#include "tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::cerr << "usage: tokenize_check TOKENIZER_JSON [SENTENCEPIECE_MODEL text|words] < lines\n";
    return 2;
  }
  try {
    std::optional<tfm::SentencePieceFile> spm;
    if (argc == 4) spm = tfm::SentencePieceFile{argv[2], std::string(argv[3]) == "text"};
    const tfm::Tokenizer tok(argv[1], spm);
    for (std::string line; std::getline(std::cin, line);) {
      if (tfm::text::invalid_utf8(line) != std::string::npos) throw std::runtime_error("not UTF-8: " + line);
      auto ids = tok.encode(line);
      for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << '\t' << tok.decode(ids) << '\n';
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
