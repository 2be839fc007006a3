// Reads a tokenizer.json and lines on stdin; prints "id id id<TAB>decoded text" per line. Used by the tests to
// hold the C++ tokenizer to the Python one without needing ONNX Runtime.
#include <iostream>

#include "tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 2) { std::cerr << "usage: tokenize_check TOKENIZER_JSON < lines\n"; return 2; }
  try {
    Tokenizer tok(argv[1]);
    for (std::string line; std::getline(std::cin, line);) {
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
