// Tokenizer encode throughput on the parity corpus, single thread, plus the pathological
// inputs (1 MiB of one repeated character, long whitespace runs) at growing sizes to show
// near-linear time, and parallel encoding of one long document. bench/tokenizer_bench_hf.py
// measures HF tokenizers on the same inputs; docs/perf.md records both.
// Usage: tokenizer_bench --tokenizer DIR [--corpus tests/fixtures/tokenizer/corpus.jsonl]
//                        [--reps 5] [--json OUT] [--dump-ids OUT.jsonl]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "tokenizer/tokenizer.h"

using namespace deepinfer;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best of `reps` timings of fn().
template <typename Fn>
double best_seconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

std::string repeat(const std::string& unit, size_t n_bytes) {
  std::string s;
  while (s.size() + unit.size() <= n_bytes) s += unit;
  return s;
}

int fail(const Status& s) {
  std::fprintf(stderr, "tokenizer_bench: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer tokenizer benchmark"};
  std::string dir, corpus_path = std::string(DEEPINFER_SOURCE_DIR) + "/tests/fixtures/tokenizer/corpus.jsonl";
  std::string json_out, dump_ids;
  int reps = 5;
  app.add_option("--tokenizer", dir, "Directory with tokenizer.json")->required();
  app.add_option("--corpus", corpus_path, "Corpus JSONL (header line, then {\"t\": text} lines)");
  app.add_option("--reps", reps, "Timed repetitions (best is reported)");
  app.add_option("--json", json_out, "Write results as JSON here");
  app.add_option("--dump-ids", dump_ids, "Write the ids of every corpus text (JSONL) and exit");
  CLI11_PARSE(app, argc, argv);

  const auto t_load = Clock::now();
  auto tok = Tokenizer::load(dir);
  if (!tok) return fail(tok.status());
  const double load_seconds = seconds_since(t_load);

  std::vector<std::string> texts;
  {
    std::ifstream in(corpus_path);
    std::string line;
    bool header = true;
    while (std::getline(in, line)) {
      if (header) {
        header = false;
        continue;
      }
      texts.push_back(nlohmann::json::parse(line).at("t").get<std::string>());
    }
  }
  if (texts.empty()) return fail(Status(StatusCode::kNotFound, "empty corpus " + corpus_path));

  if (!dump_ids.empty()) {
    std::ofstream out(dump_ids);
    for (const std::string& t : texts) {
      auto ids = (*tok)->encode(t);
      if (!ids) return fail(ids.status());
      out << nlohmann::json(*ids).dump() << "\n";
    }
    return 0;
  }

  nlohmann::json result;
  result["load_seconds"] = load_seconds;
  size_t corpus_bytes = 0, corpus_tokens = 0;
  for (const std::string& t : texts) corpus_bytes += t.size();

  // 1. Every corpus text encoded separately (the parity corpus: many short, mixed strings).
  (void)(*tok)->encode(texts[0]);  // warm the per-thread scratch
  const double per_text = best_seconds(reps, [&] {
    corpus_tokens = 0;
    for (const std::string& t : texts) corpus_tokens += (*tok)->encode(t)->size();
  });
  result["corpus_per_text"] = {{"n_texts", texts.size()}, {"bytes", corpus_bytes}, {"tokens", corpus_tokens},
                               {"seconds", per_text}, {"mb_per_s", corpus_bytes / per_text / 1e6}};

  // 2. The corpus joined by newlines, as one document.
  std::string doc;
  for (const std::string& t : texts) (doc += t) += '\n';
  size_t doc_tokens = 0;
  const double doc_s = best_seconds(reps, [&] { doc_tokens = (*tok)->encode(doc)->size(); });
  result["corpus_document"] = {{"bytes", doc.size()}, {"tokens", doc_tokens}, {"seconds", doc_s},
                               {"mb_per_s", doc.size() / doc_s / 1e6}};

  // 3. Pathological inputs: time at 128 KiB .. 1 MiB; linear time gives ratio 8 for 8x bytes.
  nlohmann::json patho = nlohmann::json::array();
  for (const std::string unit : {"a", " ", "\n", "\t", "1", "!", "中", "😀", " a", "\r\n", "ab1 "}) {
    nlohmann::json row;
    row["unit"] = unit;
    std::vector<double> times;
    for (size_t kib : {128, 256, 512, 1024}) {
      const std::string s = repeat(unit, kib << 10);
      size_t n = 0;
      const double t = best_seconds(std::max(1, reps / 2), [&] {
        auto ids = (*tok)->encode(s);
        if (!ids) {
          std::fprintf(stderr, "%s\n", ids.status().to_string().c_str());
          std::exit(1);
        }
        n = ids->size();
      });
      times.push_back(t);
      row["seconds_" + std::to_string(kib) + "k"] = t;
      row["tokens_" + std::to_string(kib) + "k"] = n;
    }
    row["ratio_1m_over_128k"] = times.back() / times.front();
    row["mb_per_s_1m"] = (1 << 20) / times.back() / 1e6;
    patho.push_back(row);
  }
  result["pathological"] = patho;

  // 4. A long document (the corpus document, 8 times, with special tokens between copies):
  // serial versus encode_parallel.
  std::string big;
  for (int k = 0; k < 8; ++k) (big += doc) += "<｜end▁of▁sentence｜>";
  std::vector<int32_t> serial_ids;
  const double big_serial = best_seconds(std::max(1, reps / 2), [&] { serial_ids = *(*tok)->encode(big); });
  nlohmann::json par = nlohmann::json::array();
  const int max_threads = static_cast<int>(std::thread::hardware_concurrency());
  for (int n : {2, 4, 8, 16, 32}) {
    if (n > max_threads) break;
    ThreadPool pool(n);
    std::vector<int32_t> ids;
    const double t = best_seconds(std::max(1, reps / 2), [&] { ids = *(*tok)->encode_parallel(big, pool); });
    par.push_back({{"threads", n}, {"seconds", t}, {"mb_per_s", big.size() / t / 1e6}, {"speedup", big_serial / t},
                   {"identical", ids == serial_ids}});
  }
  result["long_document"] = {{"bytes", big.size()}, {"tokens", serial_ids.size()}, {"serial_seconds", big_serial},
                             {"serial_mb_per_s", big.size() / big_serial / 1e6}, {"parallel", par}};

  // 5. Decode of the corpus ids.
  std::vector<std::vector<int32_t>> all_ids;
  for (const std::string& t : texts) all_ids.push_back(*(*tok)->encode(t));
  size_t decoded_bytes = 0;
  const double dec = best_seconds(reps, [&] {
    decoded_bytes = 0;
    for (const auto& ids : all_ids) decoded_bytes += (*tok)->decode(ids).size();
  });
  result["decode"] = {{"bytes", decoded_bytes}, {"seconds", dec}, {"mb_per_s", decoded_bytes / dec / 1e6}};

  const std::string text = result.dump(2);
  std::printf("%s\n", text.c_str());
  if (!json_out.empty()) std::ofstream(json_out) << text << "\n";
  return 0;
}
