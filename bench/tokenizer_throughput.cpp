// bench/tokenizer_throughput.cpp: tokenizer speed, one thread: encode (MB of text per second),
// decode (MB of text produced per second) and the streaming detokenizer (tokens per second),
// for the bundled tiny K3-format tokenizer and, when scripts/fetch_test_data.sh has fetched them,
// OpenAI's cl100k_base / o200k_base ranks (real-size vocabularies), including o200k ranks under
// the Kimi split pattern as a stand-in for K3's 163k vocabulary. Prints a table and writes a
// JSON result bundle.
//
//   k3bench_tokenizer_throughput [--text FILE] [--mb 4] [--repeats 5] [--out FILE]
// Without --text the corpus is this repository's sources and docs (code + English), plus a
// multilingual paragraph (CJK, Cyrillic, accents, emoji) for one part in ten, repeated to --mb.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench/bundle.h"
#include "cli/args.h"
#include "core/error.h"
#include "evidence/environment.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/split_patterns.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string default_corpus(size_t bytes) {
  std::vector<fs::path> files;
  for (const char* dir : {"src", "docs", "bench"})
    if (fs::exists(fs::path(K3_SOURCE_DIR) / dir))
      for (const auto& e : fs::recursive_directory_iterator(fs::path(K3_SOURCE_DIR) / dir)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".md" || ext == ".cu"))
          files.push_back(e.path());
      }
  std::sort(files.begin(), files.end());
  std::string repo;
  for (const fs::path& f : files) repo += read_file(f);
  const std::string multilingual =
      "今天天气很好，我们去公园散步吧。人工智能正在改变世界。Привет, мир! Как дела? "
      "Ça va très bien, merci. Grüße aus München — naïve café déjà vu. こんにちは世界！ "
      "안녕하세요 🌍👋🚀 The end.\n";
  std::string corpus;
  while (corpus.size() < bytes) {
    corpus += repo.empty() ? std::string("int main() { return 0; }\n")
                           : repo.substr(0, std::min(repo.size(), bytes - corpus.size()));
    for (int i = 0; i < 9 && corpus.size() < bytes; ++i) corpus += multilingual;  // ~1/10 of a repo pass
  }
  corpus.resize(bytes);
  // Do not cut a character in half at the end.
  while (!corpus.empty() && (static_cast<unsigned char>(corpus.back()) & 0xC0) == 0x80) corpus.pop_back();
  if (!corpus.empty() && static_cast<unsigned char>(corpus.back()) >= 0xC0) corpus.pop_back();
  return corpus;
}

// Thread CPU time: on a shared machine the wall clock also counts time spent descheduled.
double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Timer {
  std::chrono::steady_clock::time_point wall0 = std::chrono::steady_clock::now();
  double cpu0 = cpu_now();
  double wall() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(); }
  double cpu() const { return cpu_now() - cpu0; }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    cli::Args args("k3bench_tokenizer_throughput",
                   {{"text", "FILE", "UTF-8 text to encode (default: repository sources + multilingual)", ""},
                    {"mb", "N", "corpus size in MiB (default corpus only)", "4"},
                    {"repeats", "N", "timed repeats (after one warm-up)", "5"},
                    {"out", "FILE", "JSON bundle path", "tokenizer_throughput.json"}},
                   {argv + 1, static_cast<size_t>(argc - 1)});
    if (args.help_requested()) {
      std::cout << args.usage();
      return 0;
    }
    const int64_t R = args.get_int("repeats"), mb = args.get_int("mb");
    K3_CHECK(R >= 1 && mb >= 1, "--repeats and --mb must be >= 1");
    const std::string corpus = args.get("text").empty() ? default_corpus(static_cast<size_t>(mb) << 20)
                                                        : read_file(args.get("text"));

    struct Named {
      std::string name;
      std::unique_ptr<tokenizer::Tokenizer> tok;
      double load_s;
    };
    std::vector<Named> toks;
    {
      const Timer t;
      tokenizer::K3Vocab v = tokenizer::build_tiny_vocab(1024);
      auto tok = std::make_unique<tokenizer::Tokenizer>(
          std::move(v.ranks), std::move(v.specials),
          tokenizer::TokenizerOptions{std::string(tokenizer::patterns::kKimi), true});
      toks.push_back({"k3-tiny (1024, Kimi split)", std::move(tok), t.cpu()});
    }
    const fs::path data = fs::path(K3_SOURCE_DIR) / ".testdata" / "gpt-tokenizer";
    struct Ref {
      const char* name;
      const char* file;
      std::string_view pattern;
      bool kimi;
    };
    for (const Ref& r : {Ref{"cl100k_base", "cl100k_base.tiktoken", tokenizer::patterns::kCl100k, false},
                         Ref{"o200k_base", "o200k_base.tiktoken", tokenizer::patterns::kO200k, false},
                         Ref{"o200k ranks, Kimi split", "o200k_base.tiktoken", tokenizer::patterns::kKimi, true}}) {
      if (!fs::exists(data / r.file)) {
        std::cerr << "note: " << (data / r.file).string() << " absent (scripts/fetch_test_data.sh): skipping " << r.name
                  << "\n";
        continue;
      }
      const Timer t;
      auto tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::read_tiktoken_file(data / r.file),
                                                        std::vector<tokenizer::SpecialToken>{},
                                                        tokenizer::TokenizerOptions{std::string(r.pattern), r.kimi});
      toks.push_back({r.name, std::move(tok), t.cpu()});
    }

    const double corpus_mb = static_cast<double>(corpus.size()) / (1 << 20);
    std::printf("corpus: %.2f MiB, %d timed repeats (median), 1 thread, PCRE2 JIT: %s; rates from thread CPU time\n\n",
                corpus_mb, static_cast<int>(R), toks[0].tok->pretokenizer().jit() ? "yes" : "no");
    std::printf("%-26s %9s %10s %9s %12s %12s %14s\n", "tokenizer", "load ms", "tokens", "B/token", "encode MB/s",
                "decode MB/s", "stream tok/s");
    nlohmann::json results = nlohmann::json::array();
    for (const Named& t : toks) {
      std::vector<double> enc_cpu, dec_cpu, stream_cpu, enc_wall, dec_wall, stream_wall;
      std::vector<int32_t> ids;
      for (int64_t r = 0; r <= R; ++r) {
        Timer te;
        ids = t.tok->encode(corpus);
        const double ec = te.cpu(), ew = te.wall();
        Timer td;
        const std::string text = t.tok->decode(ids);
        const double dc = td.cpu(), dw = td.wall();
        K3_CHECK(text == corpus, t.name + ": decode(encode(corpus)) != corpus");
        Timer ts;
        tokenizer::IncrementalDetokenizer detok(*t.tok);
        size_t streamed = 0;
        for (int32_t id : ids) streamed += detok.push(id).size();
        streamed += detok.finish().size();
        const double sc = ts.cpu(), sw = ts.wall();
        K3_CHECK(streamed == corpus.size(), t.name + ": streamed size differs");
        if (r == 0) continue;  // warm-up
        enc_cpu.push_back(ec), dec_cpu.push_back(dc), stream_cpu.push_back(sc);
        enc_wall.push_back(ew), dec_wall.push_back(dw), stream_wall.push_back(sw);
      }
      const double em = bench::median(enc_cpu), dm = bench::median(dec_cpu), sm = bench::median(stream_cpu);
      const double n = static_cast<double>(ids.size());
      std::printf("%-26s %9.0f %10zu %9.2f %12.1f %12.1f %14.3g\n", t.name.c_str(), t.load_s * 1e3, ids.size(),
                  static_cast<double>(corpus.size()) / n, corpus_mb / em, corpus_mb / dm, n / sm);
      results.push_back({{"tokenizer", t.name},
                         {"load_cpu_s", t.load_s},
                         {"tokens", ids.size()},
                         {"samples",
                          {{"encode_cpu_s", enc_cpu},
                           {"decode_cpu_s", dec_cpu},
                           {"stream_decode_cpu_s", stream_cpu},
                           {"encode_wall_s", enc_wall},
                           {"decode_wall_s", dec_wall},
                           {"stream_decode_wall_s", stream_wall}}},
                         {"summary",
                          {{"encode_mib_per_s", corpus_mb / em},
                           {"decode_mib_per_s", corpus_mb / dm},
                           {"stream_tokens_per_s", n / sm},
                           {"encode_mib_per_s_wall", corpus_mb / bench::median(enc_wall)},
                           {"decode_mib_per_s_wall", corpus_mb / bench::median(dec_wall)},
                           {"bytes_per_token", static_cast<double>(corpus.size()) / n}}}});
    }
    const nlohmann::json bundle = {
        {"benchmark", "tokenizer_throughput"},
        {"environment", evidence::environment()},
        {"config",
         {{"corpus", args.get("text").empty() ? "repository sources + multilingual" : args.get("text")},
          {"corpus_bytes", corpus.size()},
          {"repeats", R},
          {"threads", 1},
          {"pcre2_jit", toks[0].tok->pretokenizer().jit()}}},
        {"results", results},
    };
    std::ofstream(args.get("out")) << bundle.dump(2) << "\n";
    std::cout << "\nwrote " << args.get("out") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
