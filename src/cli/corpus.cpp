// cli/corpus.cpp: `k3serve train-tokenizer` and `k3serve encode-corpus`, the tokenizer half of
// train/ (train/README.md): the model trainer reads the token stream these write, split by the
// very tokenizer and chat renderer the engine serves with.
//
// Corpus: JSON Lines, one document per line: {"text": "..."} (specials denied: "<|open|>" in a
// source file stays text) or {"messages": [...], "tools"?: [...]} (a chat, rendered by
// tokenizer/chat_format.h with thinking on and no generation prompt, as the engine renders
// earlier turns). Errors name the file and line.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/split_patterns.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/utf8.h"

namespace k3::cli {

namespace {

using nlohmann::ordered_json;

struct Document {
  std::string where;  // "FILE line N"
  ordered_json body;
};

std::vector<Document> read_corpus(const std::vector<std::string>& files) {
  std::vector<Document> docs;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    K3_CHECK(in.good(), "corpus: cannot open " + file);
    std::string line;
    for (size_t line_no = 1; std::getline(in, line); ++line_no) {
      if (line.empty()) continue;
      Document d{file + " line " + std::to_string(line_no), {}};
      try {
        d.body = ordered_json::parse(line);
      } catch (const std::exception& e) {
        throw core::Error("corpus: " + d.where + ": not JSON: " + e.what());
      }
      const bool text = d.body.is_object() && d.body.contains("text") && d.body["text"].is_string();
      const bool chat = d.body.is_object() && d.body.contains("messages") && d.body["messages"].is_array();
      K3_CHECK(text != chat, "corpus: " + d.where +
                                 ": expected an object with a string \"text\" or an array \"messages\" (one of them)");
      if (text) {
        const std::string& s = d.body["text"].get_ref<const std::string&>();
        const size_t bad = tokenizer::utf8::first_invalid(s);
        K3_CHECK(bad == tokenizer::utf8::kValid,
                 "corpus: " + d.where + ": text is not UTF-8 at byte " + std::to_string(bad));
      }
      docs.push_back(std::move(d));
    }
  }
  K3_CHECK(!docs.empty(), "corpus: no documents in the given files");
  return docs;
}

tokenizer::ChatOptions training_chat_options() {
  tokenizer::ChatOptions o;
  o.add_generation_prompt = false;
  return o;
}

const ordered_json& tools_of(const ordered_json& body) {
  static const ordered_json none;
  return body.contains("tools") ? body["tools"] : none;
}

// Runs fn(begin, end, worker) over [0, n) split into `threads` contiguous ranges.
template <class Fn>
void parallel_ranges(size_t n, int threads, Fn fn) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), n));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(workers);
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      try {
        fn(n * w / workers, n * (w + 1) / workers, w);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

int default_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace

int train_tokenizer_command(std::span<char* const> argv) {
  Args args("train-tokenizer",
            {{"corpus", "FILE", "JSON Lines corpus file(s) ({\"text\"} or {\"messages\"} per line)", "", true, true},
             {"vocab-size", "N", "ids in all: learned ranks plus K3's 256 special slots on top", "", true},
             {"out", "DIR", "writes DIR/tiktoken.model and DIR/tokenizer_config.json", "", true},
             {"threads", "N", "word-counting threads (default: all cores)", ""}},
            argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  const int64_t vocab_size = args.get_int("vocab-size");
  K3_CHECK(vocab_size >= tokenizer::kMinK3Vocab && vocab_size <= (int64_t{1} << 24),
           "train-tokenizer: --vocab-size must be in [" + std::to_string(tokenizer::kMinK3Vocab) + ", 16777216], got " +
               std::to_string(vocab_size));
  const int threads = args.has("threads") ? static_cast<int>(args.get_int("threads")) : default_threads();
  K3_CHECK(threads >= 1, "train-tokenizer: --threads must be at least 1");
  const std::vector<Document> docs = read_corpus(args.get_list("corpus"));

  std::vector<tokenizer::WordCounter> counters;
  for (int w = 0; w < threads; ++w) counters.emplace_back(tokenizer::patterns::kKimi);
  parallel_ranges(docs.size(), threads, [&](size_t begin, size_t end, size_t w) {
    for (size_t i = begin; i < end; ++i) {
      const ordered_json& body = docs[i].body;
      if (body.contains("text")) {
        counters[w].add(body["text"].get_ref<const std::string&>());
        continue;
      }
      // A chat's words are its text segments; the control markers are special tokens.
      for (const tokenizer::ChatSegment& seg :
           tokenizer::render_chat_segments(body["messages"], tools_of(body), training_chat_options()))
        if (!seg.control) counters[w].add(seg.text);
    }
  });
  for (int w = 1; w < threads; ++w) counters[0].merge(counters[static_cast<size_t>(w)]);
  const auto ranks = static_cast<int32_t>(vocab_size - tokenizer::Tokenizer::kReservedSpecialSlots);
  std::vector<std::string> tokens = tokenizer::learn_bpe(counters[0].counts(), static_cast<size_t>(ranks));
  const size_t learned = tokens.size();
  tokenizer::write_k3_tokenizer(tokenizer::k3_vocab(std::move(tokens), static_cast<int32_t>(vocab_size)),
                                args.get("out"),
                                "BPE trained by k3serve train-tokenizer (Kimi split pattern); K3 special-token layout");
  std::cerr << "train-tokenizer: " << docs.size() << " documents, " << counters[0].counts().size()
            << " distinct pre-tokens, " << learned - 256 << " merges learned";
  if (learned < static_cast<size_t>(ranks))
    std::cerr << " (the corpus ran out of pairs: " << ranks - static_cast<int32_t>(learned)
              << " ranks filled by byte extensions)";
  std::cerr << "; wrote " << args.get("out") << "\n";
  return 0;
}

int encode_corpus_command(std::span<char* const> argv) {
  Args args("encode-corpus",
            {{"tokenizer", "DIR", "tokenizer folder (tiktoken.model + tokenizer_config.json)", "", true},
             {"corpus", "FILE", "JSON Lines corpus file(s) ({\"text\"} or {\"messages\"} per line)", "", true, true},
             {"out", "FILE", "token stream: uint32 little-endian ids, each document followed by [EOS]", "", true},
             {"threads", "N", "encoding threads (default: all cores)", ""}},
            argv);
  if (args.help_requested()) {
    std::cout << args.usage();
    return 0;
  }
  const int threads = args.has("threads") ? static_cast<int>(args.get_int("threads")) : default_threads();
  K3_CHECK(threads >= 1, "encode-corpus: --threads must be at least 1");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_k3(args.get("tokenizer"));
  K3_CHECK(tok.eos_id.has_value(), "encode-corpus: the tokenizer in " + args.get("tokenizer") + " names no eos_token");
  const std::vector<Document> docs = read_corpus(args.get_list("corpus"));
  std::vector<std::vector<int32_t>> parts(static_cast<size_t>(threads));
  parallel_ranges(docs.size(), threads, [&](size_t begin, size_t end, size_t w) {
    for (size_t i = begin; i < end; ++i) {
      const ordered_json& body = docs[i].body;
      try {
        if (body.contains("text")) {
          tok.encode_append(body["text"].get_ref<const std::string&>(), tokenizer::Specials::deny, parts[w]);
        } else {
          const std::vector<int32_t> ids = tokenizer::encode_chat(tok, body["messages"], tools_of(body),
                                                                  training_chat_options());
          parts[w].insert(parts[w].end(), ids.begin(), ids.end());
        }
      } catch (const core::Error& e) {
        throw core::Error("corpus: " + docs[i].where + ": " + e.what());
      }
      parts[w].push_back(*tok.eos_id);
    }
  });
  std::ofstream out(args.get("out"), std::ios::binary | std::ios::trunc);
  K3_CHECK(out.good(), "encode-corpus: cannot create " + args.get("out"));
  size_t total = 0;
  for (const std::vector<int32_t>& p : parts) {
    std::vector<char> bytes(p.size() * 4);
    for (size_t i = 0; i < p.size(); ++i) {
      const auto v = static_cast<uint32_t>(p[i]);
      for (int b = 0; b < 4; ++b) bytes[i * 4 + static_cast<size_t>(b)] = static_cast<char>((v >> (8 * b)) & 0xff);
    }
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    total += p.size();
  }
  out.flush();
  K3_CHECK(out.good(), "encode-corpus: writing " + args.get("out") + " failed");
  std::cerr << "encode-corpus: " << docs.size() << " documents, " << total << " tokens (vocab " << tok.vocab_size()
            << ") to " << args.get("out") << "\n";
  return 0;
}

}  // namespace k3::cli
