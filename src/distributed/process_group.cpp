// d2l::distributed: the group, its rendezvous, the launcher and the
// collectives with errors that name the rank (include/d2l/distributed.h).

#include <d2l/distributed.h>

#include "collectives.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef D2L_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

extern char** environ;

namespace d2l::distributed {

namespace detail {

std::string reason(const std::exception& e) {
  if (const auto* error = dynamic_cast<const c10::Error*>(&e)) {
    return error->what_without_backtrace();
  }
  return e.what();
}

std::string who(const char* fn, const Group& group) {
  return fmt::format("{} (rank {} of {})", fn, group.getRank(), group.getSize());
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, const Group& group, const char* fn,
          const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, who(fn, group), ": ", what, " failed: ", reason(e),
                ". Another rank has probably exited or stalled (every rank must run the same "
                "steps); this rank gives up");
  }
}

}  // namespace detail

namespace {

constexpr const char* kInit = "d2l::distributed::init_process_group";

int64_t parse_integer(const char* what, const std::string& value) {
  size_t used = 0;
  int64_t parsed = 0;
  try {
    parsed = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(!value.empty() && used == value.size(),
              fmt::format("d2l::distributed::LaunchOptions: {} must be an integer, got \"{}\"", what,
                          value));
  return parsed;
}

std::pair<std::string, uint16_t> split_master(const std::string& master) {
  const auto colon = master.rfind(':');
  TORCH_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < master.size(),
              fmt::format("{}: master must be ADDR:PORT, got \"{}\"", kInit, master));
  std::string host = master.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:29500
  }
  const int64_t port = parse_integer("the port of master", master.substr(colon + 1));
  TORCH_CHECK(port > 0 && port < 65536,
              fmt::format("{}: the port of master must be in [1, 65535], got {} (\"{}\")", kInit,
                          port, master));
  return {host, static_cast<uint16_t>(port)};
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_host) {
  if (!master_host.empty() && is_loopback(master_host)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    std::string first = ifname;
    first = first.substr(0, first.find(','));
    return c10d::ProcessGroupGloo::createDeviceForInterface(first);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

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
  }
  if (auto v = get("D2L_DIST_TIMEOUT_MS"); !v.empty()) {
    options.timeout(std::chrono::milliseconds(parse_integer("D2L_DIST_TIMEOUT_MS", v)));
  }
  return options;
}

LaunchOptions LaunchOptions::parse(std::vector<std::string>& args) {
  LaunchOptions options = from_environment();
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const bool ours = flag == "--world-size" || flag == "--rank" || flag == "--master" ||
                      flag == "--file-store" || flag == "--dist-timeout" ||
                      flag == "--backend" || flag == "--spawn";
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
      split_master(value);
      options.master(value);
    } else if (flag == "--file-store") {
      options.file_store(value);
    } else if (flag == "--dist-timeout") {
      char* end = nullptr;
      const double seconds = std::strtod(value.c_str(), &end);
      TORCH_CHECK(!value.empty() && end == value.c_str() + value.size() && seconds > 0,
                  fmt::format("d2l::distributed::LaunchOptions: --dist-timeout must be a "
                              "positive number of seconds, got \"{}\"",
                              value));
      options.timeout(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    } else if (flag == "--backend") {
      options.backend(value);
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
                           "--backend", backend_});
  return args;
}

GroupPtr init_process_group(const LaunchOptions& options, torch::Device device) {
  const int64_t world = options.world_size(), rank = options.rank();
  TORCH_CHECK(world >= 1 && world <= (1 << 20),
              fmt::format("{}: world_size must be in [1, 2^20], got {}", kInit, world));
  TORCH_CHECK(rank >= 0 && rank < world,
              fmt::format("{}: rank must be in [0, {}), got {}", kInit, world, rank));
  TORCH_CHECK(options.timeout().count() > 0,
              fmt::format("{}: timeout must be positive, got {} ms", kInit,
                          options.timeout().count()));
  TORCH_CHECK(options.master().empty() != options.file_store().empty(),
              fmt::format("{} (rank {} of {}): give exactly one of master (ADDR:PORT) and "
                          "file_store, got master \"{}\" and file_store \"{}\"",
                          kInit, rank, world, options.master(), options.file_store()));
  std::string backend = options.backend();
  if (backend == "auto") backend = device.is_cuda() && nccl_available() ? "nccl" : "gloo";
  TORCH_CHECK(backend == "gloo" || backend == "nccl",
              fmt::format("{}: backend must be \"gloo\", \"nccl\" or \"auto\", got \"{}\"", kInit,
                          backend));
  TORCH_CHECK(backend == "gloo" || nccl_available(),
              fmt::format("{}: backend \"nccl\" was asked for, but this build of d2l::distributed "
                          "has no NCCL (LibTorch {}); use \"gloo\", which also moves CUDA tensors",
                          kInit, torch_version()));
  TORCH_CHECK(backend == "gloo" || device.is_cuda(),
              fmt::format("{}: backend \"nccl\" needs a CUDA device, got {}", kInit, device.str()));

  const auto ms = options.timeout();
  const std::string where =
      options.master().empty() ? "file store " + options.file_store() : options.master();
  std::string host;
  c10::intrusive_ptr<c10d::Store> store;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (!options.master().empty()) {
      uint16_t port = 0;
      std::tie(host, port) = split_master(options.master());
      c10d::TCPStoreOptions store_options;
      store_options.port = port;
      store_options.isServer = rank == 0;
      store_options.numWorkers = static_cast<size_t>(world);
      store_options.waitWorkers = true;
      store_options.timeout = ms;
      store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
    } else {
      store = c10::make_intrusive<c10d::FileStore>(options.file_store(), static_cast<int>(world));
      store->setTimeout(ms);
    }
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    // Our own checks above already name the function.
    if (msg.rfind(kInit, 0) == 0) throw;
    TORCH_CHECK(false, kInit, " (rank ", rank, " of ", world, "): the rendezvous at ", where,
                " did not complete within ", ms.count(), " ms: ",
                rank == 0 ? "not every rank joined" : "rank 0's store could not be reached",
                " (", msg, ")");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kInit, " (rank ", rank, " of ", world, "): the rendezvous at ", where,
                " failed: ", e.what());
  }

  // Every rank counts itself in, and waits (within what is left of the
  // timeout) until all have: a missing rank is reported as such, and the
  // backend's own connection phase only starts once everybody is there.
  try {
    const auto deadline = start + ms;
    store->add("d2l/joined", 1);
    for (;;) {
      const int64_t joined = store->add("d2l/joined", 0);
      if (joined >= world) break;
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, kInit, " (rank ", rank, " of ",
                  world, "): the rendezvous at ", where, " did not complete within ", ms.count(),
                  " ms: not every rank joined (", joined, " of ", world, ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.rfind(kInit, 0) == 0) throw;
    TORCH_CHECK(false, kInit, " (rank ", rank, " of ", world, "): the rendezvous at ", where,
                " failed: ", msg);
  }

  try {
#ifdef D2L_HAVE_NCCL
    if (backend == "nccl") {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = ms;
      return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(rank),
                                                         static_cast<int>(world), nccl_options);
    }
#endif
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(ms);
    gloo_options->devices.push_back(gloo_device(host));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                       static_cast<int>(world), gloo_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kInit, " (rank ", rank, " of ", world, "): connecting the ranks (", backend,
                ", rendezvous at ", where, ") did not complete within ", ms.count(),
                " ms: a rank left or could not be reached (", detail::reason(e), ")");
  }
}

bool nccl_available() {
#ifdef D2L_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

void all_reduce_sum(const GroupPtr& group, torch::Tensor& values, const std::string& what) {
  TORCH_CHECK(group, "d2l::distributed::all_reduce_sum: group is null");
  std::vector<torch::Tensor> tensors{values};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = group->allreduce(tensors);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, detail::who("d2l::distributed::all_reduce_sum", *group), ": ", what,
                " could not start: ", detail::reason(e));
  }
  detail::wait(work, *group, "d2l::distributed::all_reduce_sum", what);
}

void broadcast_parameters(torch::nn::Module& module, const GroupPtr& group, int64_t root) {
  constexpr const char* fn = "d2l::distributed::broadcast_parameters";
  TORCH_CHECK(group, fn, ": group is null");
  TORCH_CHECK(root >= 0 && root < group->getSize(),
              fmt::format("{}: root must be in [0, {}), got {}", detail::who(fn, *group),
                          group->getSize(), root));
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) tensors.emplace_back(b.key(), b.value());
  // Every rank must hold the same structure; a mismatch (a different
  // vocabulary, say) would otherwise be a collective of mismatched sizes.
  int64_t numel = 0;
  for (const auto& t : tensors) numel += t.second.numel();
  auto signature =
      torch::tensor({static_cast<int64_t>(tensors.size()), numel}, torch::kLong);
  auto root_signature = signature.clone();
  {
    std::vector<torch::Tensor> v{root_signature};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    detail::wait(group->broadcast(v, opts), *group, fn, "broadcasting the model's size");
  }
  // Every rank learns of a mismatch, so that none is left waiting.
  const bool same = root_signature.equal(signature);
  auto mismatches = torch::tensor({same ? int64_t{0} : int64_t{1}}, torch::kLong);
  all_reduce_sum(group, mismatches, "comparing the model's size with rank 0's");
  TORCH_CHECK(same,
              fmt::format("{}: this rank's model has {} elements in {} tensors, rank {}'s has {} "
                          "in {}: every rank must build the same model (same vocabularies and "
                          "sizes)",
                          detail::who(fn, *group), numel, tensors.size(), root,
                          root_signature[1].item<int64_t>(), root_signature[0].item<int64_t>()));
  TORCH_CHECK(mismatches.item<int64_t>() == 0,
              fmt::format("{}: {} rank(s) hold a model of another size than rank {}'s ({} "
                          "elements in {} tensors): every rank must build the same model",
                          detail::who(fn, *group), mismatches.item<int64_t>(), root, numel,
                          tensors.size()));
  // One broadcast per (device, dtype) of all tensors flattened together.
  std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{t.second.device().str(), static_cast<int>(t.second.scalar_type())}].push_back(
        t.second);
  }
  for (auto& [key, list] : groups) {
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : list) flat_parts.push_back(t.reshape(-1));
    std::vector<torch::Tensor> v{torch::cat(flat_parts)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    detail::wait(group->broadcast(v, opts), *group, fn,
                 fmt::format("broadcasting the {} {} tensors", key.first,
                             c10::toString(static_cast<c10::ScalarType>(key.second))));
    int64_t offset = 0;
    for (auto& t : list) {
      t.copy_(v[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

std::pair<int64_t, int64_t> shard_range(int64_t batch_size, int64_t rank, int64_t world_size) {
  TORCH_CHECK(world_size > 0 && rank >= 0 && rank < world_size && batch_size >= 0,
              fmt::format("d2l::distributed::shard_range: need 0 <= rank < world_size and "
                          "batch_size >= 0, got rank {}, world_size {}, batch_size {}",
                          rank, world_size, batch_size));
  return {batch_size * rank / world_size, batch_size * (rank + 1) / world_size};
}

void save_checkpoint(torch::nn::Module& module, const std::string& path) {
  constexpr const char* fn = "d2l::distributed::save_checkpoint";
  TORCH_CHECK(!path.empty(), fn, ": path is empty");
  const std::string tmp = fmt::format("{}.partial-{}", path, ::getpid());
  try {
    torch::serialize::OutputArchive archive;
    module.save(archive);
    archive.save_to(tmp);
    std::filesystem::rename(tmp, path);
  } catch (const std::exception& e) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    TORCH_CHECK(false, fn, ": writing ", path, " failed: ", detail::reason(e));
  }
}

namespace {

uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "d2l::distributed::spawn_local: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int saved = errno;
  ::close(fd);
  TORCH_CHECK(ok, "d2l::distributed::spawn_local: no free loopback port: ", std::strerror(saved));
  return ntohs(addr.sin_port);
}

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
  const std::string master = options.master().empty()
                                 ? fmt::format("127.0.0.1:{}", free_loopback_port())
                                 : options.master();
  const auto [host, port] = split_master(master);
  const std::string exe = program.empty() ? this_executable() : program;
  if (!options.log_dir().empty()) std::filesystem::create_directories(options.log_dir());

  std::vector<std::string> base_env;
  const std::vector<std::string> ours{"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                                      "MASTER_ADDR=", "MASTER_PORT="};
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
