#pragma once

// The command line the Python-SDPA benchmark programs share
// (bench_sdpa_gqa.cpp, bench_sdpa_bands.cpp): `--threads 1,2`, a list of the
// cases to run, and Google Benchmark's own flags, run with the instruction
// set, LibTorch's version and the load average in the report's context.

#include <benchmark/benchmark.h>
#include <d2l/backend.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace d2l::bench {

/// The items of a comma-separated list.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

struct CommandLine {
  std::vector<int> threads = {1, 2};
  std::vector<std::string> wanted;  // empty: every case
  std::vector<char*> rest;          // Google Benchmark's, the program's name first

  bool wants(const std::string& name) const {
    return wanted.empty() || std::find(wanted.begin(), wanted.end(), name) != wanted.end();
  }
};

/// `--threads` and `list_flag` (`--shapes`, `--cases`) read; the rest kept.
inline CommandLine parse_command_line(int argc, char** argv, const std::string& list_flag) {
  CommandLine c;
  c.rest.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      c.threads.clear();
      for (const auto& t : split_list(argv[++i])) c.threads.push_back(std::stoi(t));
    } else if (arg == list_flag && i + 1 < argc) {
      c.wanted = split_list(argv[++i]);
    } else {
      c.rest.push_back(argv[i]);
    }
  }
  return c;
}

/// Runs what was registered, with the context the table scripts print.
inline int run_registered(CommandLine c) {
  benchmark::AddCustomContext("d2l_cpu_isa", d2l::to_string(d2l::cpu_isa()));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  std::ifstream loadavg("/proc/loadavg");
  std::string one, five, fifteen;
  loadavg >> one >> five >> fifteen;
  benchmark::AddCustomContext("load_average", one + " " + five + " " + fifteen);
  int count = static_cast<int>(c.rest.size());
  benchmark::Initialize(&count, c.rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace d2l::bench
