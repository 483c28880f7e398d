// d2l::distributed's launcher: LaunchOptions from flags and torchrun's
// environment, spawn_local with the store it hosts and with rank 0 hosting
// it (several launchers, as on several machines), the TCPStore backends this
// LibTorch offers, and the errors of a rendezvous that cannot start.

#include <d2l/distributed.h>
#include <d2l/torch_version.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "distributed_helpers.h"
#include "test_utils.h"

namespace {

using namespace d2l::testing::distributed;
using d2l::testing::error_message;
using ::testing::AllOf;
using ::testing::HasSubstr;

// What rank R of an "allreduce" run wrote: "sum last world tcp_store agent".
std::string launch_sum_of(const std::filesystem::path& dir, int64_t rank) {
  return read_text(dir / fmt::format("sum-{}.txt", rank));
}

TEST(DistributedLaunch, LaunchOptionsFromFlags) {
  std::vector<std::string> args{"--epochs",       "3",   "--world-size", "4",
                                "--rank",         "2",   "--master",     "10.0.0.1:29500",
                                "--dist-timeout", "2.5", "--out",        "x"};
  const auto options = dist::LaunchOptions::parse(args);
  EXPECT_EQ(args, (std::vector<std::string>{"--epochs", "3", "--out", "x"}));
  EXPECT_EQ(options.world_size(), 4);
  EXPECT_EQ(options.rank(), 2);
  EXPECT_EQ(options.master(), "10.0.0.1:29500");
  EXPECT_EQ(options.timeout(), std::chrono::milliseconds(2500));
  EXPECT_TRUE(options.distributed());
  auto again = options.to_args();
  const auto round_trip = dist::LaunchOptions::parse(again);
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(round_trip.rank(), 2);
  EXPECT_EQ(round_trip.master(), "10.0.0.1:29500");
  EXPECT_EQ(round_trip.timeout(), std::chrono::milliseconds(2500));

  const auto fails = [](std::vector<std::string> a) {
    return error_message([&] { dist::LaunchOptions::parse(a); });
  };
  EXPECT_THAT(fails({"--rank"}), HasSubstr("--rank needs a value"));
  EXPECT_THAT(fails({"--world-size", "two"}),
              HasSubstr("--world-size must be an integer, got \"two\""));
  EXPECT_THAT(fails({"--world-size", "2", "--rank", "2"}),
              HasSubstr("the rank must be in [0, 2), got 2"));
  EXPECT_THAT(fails({"--master", "10.0.0.1"}),
              HasSubstr("master must be ADDR:PORT, got \"10.0.0.1\""));
  EXPECT_THAT(fails({"--master", "h:70000"}),
              HasSubstr("the port of master must be in [1, 65535], got 70000"));
  // Timeouts that would mean "never" or "now": refused, not turned into a
  // negative or a zero timeout.
  for (const char* never_or_now :
       {"0", "-1", "inf", "-inf", "nan", "1e300", "0.0001", "1e-9", "31536001", "2.5s"}) {
    EXPECT_THAT(fails({"--dist-timeout", never_or_now}),
                AllOf(HasSubstr("--dist-timeout must be"),
                      HasSubstr(std::string("got \"") + never_or_now + "\"")));
  }
  std::vector<std::string> edges{"--dist-timeout", "0.0015"};
  EXPECT_EQ(dist::LaunchOptions::parse(edges).timeout(), std::chrono::milliseconds(2));
  edges = {"--dist-timeout", "31536000"};  // a year
  EXPECT_EQ(dist::LaunchOptions::parse(edges).timeout(), std::chrono::hours(24 * 365));
  EXPECT_THAT(fails({"--spawn", "0"}), HasSubstr("--spawn must be positive, got 0"));
  EXPECT_THAT(fails({"--tcp-store", "bogus"}),
              HasSubstr("--tcp-store takes auto, libuv, classic, got \"bogus\""));
  EXPECT_THAT(fails({"--backend", "mpi"}),
              HasSubstr("--backend takes auto, gloo, nccl, got \"mpi\""));

  // --spawn and --tcp-store, and the defaults of what is not given.
  std::vector<std::string> more{"--spawn", "3", "--tcp-store", "classic", "--backend", "gloo"};
  const auto spawned = dist::LaunchOptions::parse(more);
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(spawned.spawn(), 3);
  EXPECT_EQ(spawned.tcp_store(), "classic");
  EXPECT_EQ(spawned.backend(), "gloo");
  EXPECT_EQ(spawned.world_size(), 1);
  EXPECT_FALSE(spawned.distributed());
  EXPECT_FALSE(spawned.agent_store());
  auto spawned_args = spawned.to_args();
  EXPECT_EQ(dist::LaunchOptions::parse(spawned_args).tcp_store(), "classic");
  EXPECT_EQ(dist::LaunchOptions().tcp_store(), "auto");
}

TEST(DistributedLaunch, LaunchOptionsFromTorchrunsEnvironment) {
  ::setenv("WORLD_SIZE", "3", 1);
  ::setenv("RANK", "1", 1);
  ::setenv("MASTER_ADDR", "node0", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  const auto options = dist::LaunchOptions::from_environment();
  EXPECT_EQ(options.world_size(), 3);
  EXPECT_EQ(options.rank(), 1);
  EXPECT_EQ(options.master(), "node0:1234");
  ::unsetenv("MASTER_PORT");
  EXPECT_THAT(error_message([] { dist::LaunchOptions::from_environment(); }),
              HasSubstr("MASTER_ADDR and MASTER_PORT must be set together"));
  ::setenv("MASTER_PORT", "x", 1);
  EXPECT_THAT(error_message([] { dist::LaunchOptions::from_environment(); }),
              HasSubstr("MASTER_PORT must be an integer, got \"x\""));
  ::setenv("MASTER_PORT", "1234", 1);
  // torchrun's agent hosts the store and says so; PyTorch's USE_LIBUV picks
  // the store's backend.
  EXPECT_FALSE(dist::LaunchOptions::from_environment().agent_store());
  ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  ::setenv("USE_LIBUV", "0", 1);
  const auto agent = dist::LaunchOptions::from_environment();
  EXPECT_TRUE(agent.agent_store());
  EXPECT_EQ(agent.tcp_store(), "classic");
  ::setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
  ::setenv("USE_LIBUV", "1", 1);
  const auto own = dist::LaunchOptions::from_environment();
  EXPECT_FALSE(own.agent_store());
  EXPECT_EQ(own.tcp_store(), "libuv");
  ::setenv("USE_LIBUV", "yes", 1);
  EXPECT_THAT(error_message([] { dist::LaunchOptions::from_environment(); }),
              HasSubstr("USE_LIBUV must be 0 or 1, got \"yes\""));
  ::unsetenv("USE_LIBUV");
  // A port out of range is refused where it is read, naming the variables.
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_THAT(error_message([] { dist::LaunchOptions::from_environment(); }),
              AllOf(HasSubstr("MASTER_PORT"), HasSubstr("[1, 65535], got 70000")));
  ::setenv("MASTER_PORT", "1234", 1);
  for (const char* bad : {"-5", "0", "31536000001", "1e3", "x"}) {
    ::setenv("D2L_DIST_TIMEOUT_MS", bad, 1);
    EXPECT_THAT(error_message([] { dist::LaunchOptions::from_environment(); }),
                AllOf(HasSubstr("D2L_DIST_TIMEOUT_MS must be"), HasSubstr(bad)));
  }
  ::setenv("D2L_DIST_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(dist::LaunchOptions::from_environment().timeout(), std::chrono::milliseconds(1500));
  for (const char* name : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT",
                           "TORCHELASTIC_USE_AGENT_STORE", "USE_LIBUV", "D2L_DIST_TIMEOUT_MS"}) {
    ::unsetenv(name);
  }
}

TEST(DistributedLaunch, ShardsCoverEveryRowOnce) {
  for (int64_t world : {1, 2, 3, 7}) {
    for (int64_t batch : {0, 1, 2, 5, 16, 17}) {
      int64_t next = 0;
      for (int64_t rank = 0; rank < world; ++rank) {
        const auto [begin, end] = dist::shard_range(batch, rank, world);
        EXPECT_EQ(begin, next);
        EXPECT_LE(end - begin, batch / world + 1);
        EXPECT_GE(end - begin, batch / world);
        next = end;
      }
      EXPECT_EQ(next, batch);
    }
  }
  EXPECT_THAT(error_message([] { dist::shard_range(4, 2, 2); }),
              HasSubstr("d2l::distributed::shard_range: need 0 <= rank < world_size"));
}

TEST(DistributedLaunch, InitProcessGroupChecksItsOptions) {
  const auto fails = [](const dist::LaunchOptions& o) {
    return error_message([&] { dist::init_process_group(o); });
  };
  EXPECT_THAT(fails(dist::LaunchOptions().world_size(2).rank(5).master("127.0.0.1:1")),
              HasSubstr("d2l::distributed::init_process_group: rank must be in [0, 2), got 5"));
  EXPECT_THAT(fails(dist::LaunchOptions().world_size(2)),
              HasSubstr("(rank 0 of 2): give exactly one of master (ADDR:PORT) and file_store, "
                        "got master \"\" and file_store \"\""));
  EXPECT_THAT(fails(dist::LaunchOptions().master("127.0.0.1:1").file_store("/tmp/x")),
              HasSubstr("give exactly one of master"));
  EXPECT_THAT(fails(dist::LaunchOptions().master("127.0.0.1:1").backend("mpi")),
              HasSubstr("backend must be \"gloo\", \"nccl\" or \"auto\", got \"mpi\""));
  if (!dist::nccl_available()) {
    EXPECT_THAT(fails(dist::LaunchOptions().master("127.0.0.1:1").backend("nccl")),
                HasSubstr("this build of d2l::distributed has no NCCL"));
  }
  EXPECT_THAT(fails(dist::LaunchOptions().master("127.0.0.1:1").tcp_store("uv")),
              HasSubstr("d2l::distributed::init_process_group: tcp_store must be \"libuv\", "
                        "\"classic\" or \"auto\", got \"uv\""));
  if (dist::tcp_store_backends().front() != "libuv") {
    EXPECT_THAT(fails(dist::LaunchOptions().master("127.0.0.1:1").tcp_store("libuv")),
                HasSubstr("tcp_store \"libuv\" was asked for, but this LibTorch (" +
                          d2l::torch_version() + ") cannot start it"));
  }
}


// Every backend this LibTorch offers hosts the ranks' store in spawn_local,
// with the ranks as its clients (torchrun's agent store); the sum of rank + 1
// over two ranks is 3 on both.
TEST(DistributedLaunch, EveryTcpStoreBackendHostsTheRanks) {
  const auto backends = dist::tcp_store_backends();
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(backends.back(), "classic");
#if D2L_TORCH_VERSION_AT_LEAST(2, 3)
  if (backends.size() == 1) {
    std::printf("[   NOTE   ] this LibTorch has no libuv TCPStore: only classic tested\n");
  }
#else
  EXPECT_EQ(backends.size(), 1u) << "LibTorch before 2.3 has no libuv TCPStore";
#endif
  for (const std::string backend : {std::string("auto"), std::string("classic"),
                                    std::string("libuv")}) {
    if (backend == "libuv" && backends.front() != "libuv") continue;
    SCOPED_TRACE("tcp_store " + backend);
    const auto run = run_ranks("allreduce", 2, 2, {}, std::chrono::seconds(60), backend);
    ASSERT_EQ(run.result.exit_code, 0) << run.log(0) << run.log(1);
    // tcp_store is the ranks' (their default, auto): the store is this
    // process's; agent_store 1: they were told so.
    EXPECT_EQ(launch_sum_of(run.dir, 0), "3 3 2 auto 1");
    EXPECT_EQ(launch_sum_of(run.dir, 1), "3 3 2 auto 1");
    std::filesystem::remove_all(run.dir);
  }
  if (backends.front() != "libuv") {
    const auto dir = run_directory("nolibuv");
    EXPECT_THAT(error_message([&] {
                  spawn_workers(worker_spawn_options("allreduce", dir, {}, std::chrono::seconds(5))
                                    .tcp_store("libuv"));
                }),
                HasSubstr("d2l::distributed::spawn_local: tcp_store \"libuv\" was asked for"));
    std::filesystem::remove_all(dir);
  }
}

// A loopback socket bound to a port the kernel picked (port 0); `listening`
// makes it hold the port as a server would.
struct LaunchSocket {
  int fd = -1;
  uint16_t port = 0;
  explicit LaunchSocket(bool listening) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    if (listening) EXPECT_EQ(::listen(fd, 1), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
  }
  ~LaunchSocket() { ::close(fd); }
};

// A port nothing listens on just now.
uint16_t launch_unused_port() { return LaunchSocket(false).port; }

// As on two machines: one launcher starts rank 0, which hosts the store at
// `master`, another starts rank 1 (first_rank 1), both with the same master;
// rank 0 hosts on every backend (USE_LIBUV in the ranks' environment).
TEST(DistributedLaunch, RankZeroHostsTheStoreForLaunchersElsewhere) {
  for (const std::string backend : dist::tcp_store_backends()) {
    SCOPED_TRACE("rank 0's store " + backend);
    const std::vector<std::string> env{backend == "libuv" ? "USE_LIBUV=1" : "USE_LIBUV=0"};
    RankRun run;
    // The port was free a moment ago; another program may take it between
    // here and rank 0's bind, so a rank 0 that could not bind is retried on
    // a new port (and said so).
    for (int attempt = 0; attempt < 3; ++attempt) {
      run.dir = run_directory("hosts");
      const auto master = fmt::format("127.0.0.1:{}", launch_unused_port());
      const auto options = worker_spawn_options("allreduce", run.dir, env, std::chrono::seconds(60))
                               .world_size(2)
                               .num_local(1)
                               .master(master);
      dist::SpawnResult other;
      std::thread elsewhere([&] { other = spawn_workers(dist::SpawnOptions(options).first_rank(1)); });
      run.result = spawn_workers(dist::SpawnOptions(options).first_rank(0));
      elsewhere.join();
      if (run.result.exit_code != 0 &&
          run.log(0).find("this rank could not start the store") != std::string::npos) {
        std::printf("[   NOTE   ] %s was taken before rank 0 bound it; retrying\n",
                    master.c_str());
        std::filesystem::remove_all(run.dir);
        continue;
      }
      ASSERT_EQ(run.result.exit_code, 0) << run.log(0);
      ASSERT_EQ(other.exit_code, 0) << run.log(1);
      ASSERT_EQ(other.exit_codes.size(), 1u);
      break;
    }
    EXPECT_EQ(launch_sum_of(run.dir, 0), "3 3 2 " + backend + " 0");
    EXPECT_EQ(launch_sum_of(run.dir, 1), "3 3 2 " + backend + " 0");
    std::filesystem::remove_all(run.dir);
  }
}

// Rank 0 cannot host the store on a port another socket holds: the error
// says where, what the rank tried and why on each backend it tried, and
// comes at once rather than after the timeout.
TEST(DistributedLaunch, AStoreThatCannotStartSaysWhyOnEveryBackend) {
  std::optional<LaunchSocket> taken(std::in_place, true);
  const auto master = fmt::format("127.0.0.1:{}", taken->port);
  const auto start = std::chrono::steady_clock::now();
  const auto message = error_message([&] {
    dist::init_process_group(
        dist::LaunchOptions().world_size(2).master(master).timeout(std::chrono::seconds(20)));
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  taken.reset();
  EXPECT_THAT(message, HasSubstr("d2l::distributed::init_process_group (rank 0 of 2): the "
                                 "rendezvous at " + master + " did not complete within 20000 ms: "
                                 "this rank could not start the store ("));
  if (dist::tcp_store_backends().front() == "libuv") {
    EXPECT_THAT(message, HasSubstr("(the libuv TCPStore: "));
    EXPECT_THAT(message, HasSubstr("; the classic TCPStore: "));
  } else {
    EXPECT_THAT(message, HasSubstr("(the classic TCPStore: "));
  }
  EXPECT_LT(seconds, 20.0) << message;
}

}  // namespace
