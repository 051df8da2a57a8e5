// cli/commands.h: k3serve's subcommands (bench-serve and bench-compare are k3serve-bench's:
// cli/bench/commands.h). Each takes the arguments after its name and
// returns the process exit code; bad input throws core::Error (main prints it, exit 2).
#pragma once
#include <span>

namespace k3::cli {

int make_checkpoint_command(std::span<char* const> argv);
int logits_command(std::span<char* const> argv);
int generate_command(std::span<char* const> argv);
int serve_command(std::span<char* const> argv);
int train_tokenizer_command(std::span<char* const> argv);  // cli/corpus.cpp
int encode_corpus_command(std::span<char* const> argv);    // cli/corpus.cpp

}  // namespace k3::cli
