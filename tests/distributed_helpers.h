#pragma once

// Shared by the d2l::distributed test files: the ranks are copies of the test
// binary (DistributedWorker.Run, in test_distributed.cpp), started by
// spawn_local with a scenario in their environment; each writes its log to
// rank-R.log in a fresh directory.

#include <d2l/attention.h>
#include <d2l/distributed.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace d2l::testing::distributed {

namespace dist = d2l::distributed;

// LibTorch 2.x's c10d flight recorder (a process-wide ring of collectives,
// on by default) registers a group in a std::map outside its mutex on the
// group's first collective (FlightRecorder::recordWithResetEnabled in 2.11).
// Two ranks as two threads of one process race there; ASan saw a lost map
// node (56 bytes) in about one run in fifteen of
// GradientReducerSumsOrAveragesEveryRanksGradients. One group per process,
// the library's own use, does not race. The recorder reads its size once, at
// its first use, after main() starts; a value already in the environment wins.
inline const bool kFlightRecorderOff = [] {
  return ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0) == 0;
}();

inline const std::string kFraEngSample = D2L_NMT_DATA_DIR "/fra-eng-sample";
constexpr int64_t kBatch = 16, kSteps = 10, kExamples = 100, kEpochs = 2;

/// The Bahdanau model of the book, dropout off, initialised from `seed`.
/// The Bahdanau model of the book's recipe, or with `model` "transformer" the
/// Transformer section's (32 hidden, FFN 64, 4 heads, 2 layers), dropout off.
inline d2l::EncoderDecoder make_model(const d2l::NmtData& data, uint64_t seed,
                                      torch::Dtype dtype, const std::string& model = "bahdanau") {
  torch::manual_seed(seed);
  if (model == "transformer") {
    const int64_t h = 32;
    d2l::EncoderDecoder net(
        d2l::TransformerEncoder(data.src_vocab.size(), h, h, h, h, {h}, h, 64, 4, 2, 0.0),
        d2l::TransformerDecoder(data.tgt_vocab.size(), h, h, h, h, {h}, h, 64, 4, 2, 0.0));
    net->to(dtype);
    return net;
  }
  d2l::Seq2SeqEncoder encoder(data.src_vocab.size(), 32, 32, 2, 0.0);
  d2l::Seq2SeqAttentionDecoder decoder(
      d2l::Seq2SeqOptions(data.tgt_vocab.size(), 32, 32, 2).dropout(0.0));
  d2l::EncoderDecoder net(encoder, decoder);
  net->to(dtype);
  return net;
}

inline torch::Dtype dtype_named(const std::string& name) {
  return name == "double" ? torch::kDouble : torch::kFloat;
}

inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct RankRun {
  dist::SpawnResult result;
  std::filesystem::path dir;
  std::string log(int64_t rank) const {
    return read_text(dir / fmt::format("rank-{}.log", rank));
  }
  /// The milliseconds a rank's "worker error in PHASE after N ms" line
  /// reports: how long the library took to give up, measured in the rank
  /// (so that starting the processes, slow under sanitizers, is not part of
  /// it).
  std::optional<int64_t> error_after_ms(int64_t rank) const {
    std::smatch m;
    const std::string text = log(rank);
    if (!std::regex_search(text, m, std::regex("worker error in [a-z0-9 ]+ after ([0-9]+) ms"))) {
      return std::nullopt;
    }
    return std::stoll(m[1]);
  }
};

/// A fresh directory for one run's logs and outputs.
inline std::filesystem::path run_directory(const std::string& scenario) {
  const auto dir = std::filesystem::temp_directory_path() /
                   fmt::format("d2l_dist_{}_{}_{}", scenario, ::getpid(),
                               std::chrono::steady_clock::now().time_since_epoch().count());
  std::filesystem::create_directories(dir);
  return dir;
}

/// The spawn options every run uses: the ranks run DistributedWorker.Run
/// with `scenario`, write into `dir`, and give up after `timeout`.
inline dist::SpawnOptions worker_spawn_options(const std::string& scenario,
                                               const std::filesystem::path& dir,
                                               std::vector<std::string> env,
                                               std::chrono::milliseconds timeout) {
  env.push_back("D2L_TEST_DIST_SCENARIO=" + scenario);
  env.push_back("D2L_TEST_DIST_OUT=" + dir.string());
  env.push_back(fmt::format("D2L_DIST_TIMEOUT_MS={}", timeout.count()));
  return dist::SpawnOptions()
      .log_dir(dir.string())
      .grace(timeout + std::chrono::seconds(5))
      .env(std::move(env));
}

inline dist::SpawnResult spawn_workers(const dist::SpawnOptions& options) {
  return dist::spawn_local("", {"--gtest_filter=DistributedWorker.Run"}, options);
}

/// `local` of `world` ranks of `scenario`, here, on a store this process
/// hosts.
inline RankRun run_ranks(const std::string& scenario, int64_t world, int64_t local,
                         std::vector<std::string> env = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(60),
                         const std::string& tcp_store = "auto") {
  RankRun run;
  run.dir = run_directory(scenario);
  run.result = spawn_workers(worker_spawn_options(scenario, run.dir, std::move(env), timeout)
                                 .world_size(world)
                                 .num_local(local)
                                 .tcp_store(tcp_store));
  return run;
}

}  // namespace d2l::testing::distributed
