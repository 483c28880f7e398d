// d2l::distributed's launcher side: LaunchOptions from flags and torchrun's
// environment, and spawn_local, which hosts the store and starts the ranks
// (include/d2l/distributed.h).

#include <d2l/distributed.h>

#include "store.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

extern char** environ;

namespace d2l::distributed {

using detail::parse_integer;
using detail::split_master;

LaunchOptions LaunchOptions::from_environment() {
  LaunchOptions options;
  const auto get = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? value : "";
  };
  if (auto v = get("WORLD_SIZE"); !v.empty()) options.world_size(parse_integer("WORLD_SIZE", v));
  if (auto v = get("RANK"); !v.empty()) options.rank(parse_integer("RANK", v));
  const auto addr = get("MASTER_ADDR"), port = get("MASTER_PORT");
  TORCH_CHECK(addr.empty() == port.empty(),
              fmt::format("d2l::distributed::LaunchOptions: MASTER_ADDR and MASTER_PORT must be "
                          "set together, got MASTER_ADDR \"{}\" and MASTER_PORT \"{}\"",
                          addr, port));
  if (!addr.empty()) {
    parse_integer("MASTER_PORT", port);
    options.master(addr + ":" + port);
    split_master(options.master(), "d2l::distributed::LaunchOptions (MASTER_ADDR, MASTER_PORT)");
  }
  // torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT and says so.
  options.agent_store(get("TORCHELASTIC_USE_AGENT_STORE") == "True");
  if (auto v = get("USE_LIBUV"); !v.empty()) {
    TORCH_CHECK(v == "0" || v == "1",
                fmt::format("d2l::distributed::LaunchOptions: USE_LIBUV must be 0 or 1, got \"{}\"",
                            v));
    options.tcp_store(v == "1" ? "libuv" : "classic");
  }
  if (auto v = get("D2L_DIST_TIMEOUT_MS"); !v.empty()) {
    options.timeout(detail::checked_timeout(
        "D2L_DIST_TIMEOUT_MS", static_cast<double>(parse_integer("D2L_DIST_TIMEOUT_MS", v)), v));
  }
  return options;
}

namespace {

// `value` if it is one of `allowed`, else a c10::Error naming the flag, the
// value and the choices.
const std::string& one_of(const char* flag, const std::string& value,
                          std::initializer_list<const char*> allowed) {
  std::string choices;
  for (const char* choice : allowed) {
    if (value == choice) return value;
    choices += (choices.empty() ? "" : ", ") + std::string(choice);
  }
  TORCH_CHECK(false, fmt::format("d2l::distributed::LaunchOptions: {} takes {}, got \"{}\"", flag,
                                 choices, value));
  return value;
}

}  // namespace

LaunchOptions LaunchOptions::parse(std::vector<std::string>& args) {
  LaunchOptions options = from_environment();
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const bool ours = flag == "--world-size" || flag == "--rank" || flag == "--master" ||
                      flag == "--file-store" || flag == "--dist-timeout" ||
                      flag == "--backend" || flag == "--tcp-store" || flag == "--spawn";
    if (!ours) {
      rest.push_back(flag);
      continue;
    }
    TORCH_CHECK(i + 1 < args.size(),
                fmt::format("d2l::distributed::LaunchOptions: {} needs a value", flag));
    const std::string value = args[++i];
    if (flag == "--world-size") {
      options.world_size(parse_integer("--world-size", value));
    } else if (flag == "--rank") {
      options.rank(parse_integer("--rank", value));
    } else if (flag == "--master") {
      split_master(value, "d2l::distributed::LaunchOptions");
      options.master(value);
    } else if (flag == "--file-store") {
      options.file_store(value);
    } else if (flag == "--dist-timeout") {
      char* end = nullptr;
      const double seconds = std::strtod(value.c_str(), &end);
      TORCH_CHECK(!value.empty() && end == value.c_str() + value.size(),
                  fmt::format("d2l::distributed::LaunchOptions: --dist-timeout must be a "
                              "number of seconds, got \"{}\"",
                              value));
      options.timeout(detail::checked_timeout("--dist-timeout", seconds * 1000, value));
    } else if (flag == "--backend") {
      options.backend(one_of("--backend", value, {"auto", "gloo", "nccl"}));
    } else if (flag == "--tcp-store") {
      options.tcp_store(one_of("--tcp-store", value, {"auto", "libuv", "classic"}));
    } else {
      options.spawn(parse_integer("--spawn", value));
      TORCH_CHECK(options.spawn() > 0,
                  fmt::format("d2l::distributed::LaunchOptions: --spawn must be positive, got {}",
                              options.spawn()));
    }
  }
  TORCH_CHECK(options.world_size() >= 1,
              fmt::format("d2l::distributed::LaunchOptions: the world size must be positive, got {}",
                          options.world_size()));
  TORCH_CHECK(options.rank() >= 0 && options.rank() < options.world_size(),
              fmt::format("d2l::distributed::LaunchOptions: the rank must be in [0, {}), got {}",
                          options.world_size(), options.rank()));
  args = std::move(rest);
  return options;
}

std::vector<std::string> LaunchOptions::to_args() const {
  std::vector<std::string> args{"--world-size", std::to_string(world_size_), "--rank",
                                std::to_string(rank_)};
  if (!master_.empty()) args.insert(args.end(), {"--master", master_});
  if (!file_store_.empty()) args.insert(args.end(), {"--file-store", file_store_});
  args.insert(args.end(), {"--dist-timeout", fmt::format("{}", timeout_.count() / 1000.0),
                           "--backend", backend_, "--tcp-store", tcp_store_});
  return args;
}

namespace {

std::string this_executable() {
  std::error_code error;
  auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  TORCH_CHECK(!error, "d2l::distributed::spawn_local: cannot find this executable: ",
              error.message());
  return path.string();
}

int status_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

}  // namespace

SpawnResult spawn_local(const std::string& program, const std::vector<std::string>& args,
                        const SpawnOptions& options) {
  constexpr const char* fn = "d2l::distributed::spawn_local";
  const int64_t world = options.world_size(), first = options.first_rank();
  const int64_t local = options.num_local() == 0 ? world - first : options.num_local();
  TORCH_CHECK(world >= 1 && first >= 0 && local >= 1 && first + local <= world,
              fmt::format("{}: need world_size >= 1 and ranks first_rank.. first_rank + "
                          "num_local - 1 within it, got world_size {}, first_rank {}, num_local {}",
                          fn, world, first, options.num_local()));
  detail::check_tcp_store(options.tcp_store(), fn);
  // Without a master, this process hosts the store on a port the server
  // itself picks (no window in which another program can take it), for as
  // long as the ranks run; rank 0 is then a client like the others.
  c10::intrusive_ptr<c10d::TCPStore> hosted;
  std::string master = options.master();
  if (master.empty()) {
    try {
      hosted = detail::make_tcp_store("127.0.0.1", 0, true, world, std::chrono::seconds(60),
                                      options.tcp_store());
    } catch (const std::exception& e) {
      TORCH_CHECK(false, fmt::format("{}: could not host the ranks' store on loopback: {}", fn,
                                     e.what()));
    }
    master = fmt::format("127.0.0.1:{}", hosted->getPort());
  }
  const auto [host, port] = split_master(master, fn);
  const std::string exe = program.empty() ? this_executable() : program;
  if (!options.log_dir().empty()) std::filesystem::create_directories(options.log_dir());

  std::vector<std::string> base_env;
  const std::vector<std::string> ours{"RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",
                                      "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                                      "TORCHELASTIC_USE_AGENT_STORE="};
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const bool replaced = std::any_of(ours.begin(), ours.end(), [&](const std::string& prefix) {
      return entry.rfind(prefix, 0) == 0;
    });
    if (!replaced) base_env.push_back(entry);
  }
  for (const auto& e : options.env()) base_env.push_back(e);

  std::vector<pid_t> pids;
  const auto kill_all = [&]() {
    for (pid_t pid : pids) ::kill(pid, SIGKILL);
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  };
  for (int64_t i = 0; i < local; ++i) {
    const int64_t rank = first + i;
    std::vector<std::string> argv_s{exe};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    argv_s.insert(argv_s.end(), {"--world-size", std::to_string(world), "--rank",
                                 std::to_string(rank), "--master", master});
    std::vector<std::string> env_s = base_env;
    env_s.insert(env_s.end(), {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
                               "LOCAL_RANK=" + std::to_string(i),
                               "LOCAL_WORLD_SIZE=" + std::to_string(local),
                               "MASTER_ADDR=" + host, "MASTER_PORT=" + std::to_string(port)});
    if (hosted) env_s.push_back("TORCHELASTIC_USE_AGENT_STORE=True");
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    std::string log;
    if (!options.log_dir().empty()) {
      log = (std::filesystem::path(options.log_dir()) / fmt::format("rank-{}.log", rank)).string();
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    }
    pid_t pid = 0;
    const int error = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) {
      kill_all();
      TORCH_CHECK(false, fmt::format("{}: starting rank {} ({}) failed: {}", fn, rank, exe,
                                     std::strerror(error)));
    }
    pids.push_back(pid);
  }

  using Clock = std::chrono::steady_clock;
  SpawnResult result;
  result.exit_codes.assign(pids.size(), -1);
  size_t running = pids.size();
  std::optional<Clock::time_point> deadline;
  while (running > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (result.exit_codes[i] != -1) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[i], &status, WNOHANG);
      if (done != pids[i]) continue;
      result.exit_codes[i] = status_code(status);
      --running;
      if (result.exit_codes[i] != 0 && result.exit_code == 0) {
        result.exit_code = result.exit_codes[i];
        deadline = Clock::now() + options.grace();
      }
    }
    if (running > 0 && deadline && Clock::now() > *deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (result.exit_codes[i] != -1) continue;
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        result.exit_codes[i] = status_code(status);
        result.killed_ranks.push_back(first + static_cast<int64_t>(i));
        --running;
      }
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return result;
}

}  // namespace d2l::distributed
