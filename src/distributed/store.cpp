// The rendezvous store of d2l::distributed: LibTorch's TCPStore on the
// server backend the build offers (src/distributed/store.h).
//
// LibTorch 2.3 added a libuv server backend (TCPStoreOptions::useLibUV) and
// 2.4 made it the default; a LibTorch built without libuv (Debian 13's 2.6)
// refuses every store, server or client, that asks for it. 1.13 has only the
// classic backend. So the backend is chosen from what this process's
// LibTorch can actually start, found once by starting a server on a free
// loopback port, never from the version.

#include "store.h"

#include "collectives.h"

#include <d2l/torch_version.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cmath>

#include <stdexcept>
#include <type_traits>
#include <utility>

namespace d2l::distributed {

namespace {

template <typename T, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename T>
struct HasUseLibUV<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

template <typename Options>
void set_use_libuv(Options& options, bool libuv) {
  if constexpr (HasUseLibUV<Options>::value) options.useLibUV = libuv;
}

c10d::TCPStoreOptions store_options(uint16_t port, bool server, int64_t world_size,
                                    std::chrono::milliseconds timeout, bool libuv) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = server;
  if (server) options.numWorkers = static_cast<size_t>(world_size);
  // init_process_group counts the ranks in itself, with the same message on
  // every version and backend.
  options.waitWorkers = false;
  options.timeout = timeout;
  set_use_libuv(options, libuv);
  return options;
}

struct LibuvProbe {
  bool available = false;
  std::string why_not;
};

const LibuvProbe& libuv_probe() {
  static const LibuvProbe probe = [] {
    LibuvProbe p;
    if constexpr (!HasUseLibUV<c10d::TCPStoreOptions>::value) {
      p.why_not = fmt::format("LibTorch {} has no libuv TCPStore (2.3 added it)", torch_version());
    } else {
      try {
        c10d::TCPStore server("127.0.0.1",
                              store_options(0, true, 1, std::chrono::seconds(10), true));
        p.available = true;
      } catch (const std::exception& e) {
        p.why_not = detail::reason(e);
      }
    }
    return p;
  }();
  return probe;
}

}  // namespace

std::vector<std::string> tcp_store_backends() {
  if (libuv_probe().available) return {"libuv", "classic"};
  return {"classic"};
}

namespace detail {

void check_tcp_store(const std::string& backend, const char* fn) {
  TORCH_CHECK(backend == "auto" || backend == "libuv" || backend == "classic",
              fmt::format("{}: tcp_store must be \"libuv\", \"classic\" or \"auto\", got \"{}\"",
                          fn, backend));
  TORCH_CHECK(backend != "libuv" || libuv_probe().available,
              fmt::format("{}: tcp_store \"libuv\" was asked for, but this LibTorch ({}) cannot "
                          "start it ({}); \"classic\" or \"auto\" (USE_LIBUV=0 or unset) work",
                          fn, torch_version(), libuv_probe().why_not));
}

c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host, uint16_t port,
                                                  bool server, int64_t world_size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& backend) {
  TORCH_INTERNAL_ASSERT(backend == "auto" || backend == "libuv" || backend == "classic");
  const bool libuv = backend == "libuv" || (backend == "auto" && libuv_probe().available);
  const auto start = std::chrono::steady_clock::now();
  const auto open = [&](bool with_libuv, std::chrono::milliseconds within) {
    return c10::make_intrusive<c10d::TCPStore>(
        host, store_options(port, server, world_size, within, with_libuv));
  };
  const char* const name = libuv ? "the libuv TCPStore" : "the classic TCPStore";
  if (!server || !libuv || backend == "libuv") {
    // A client speaks the same protocol to either server; it only has to
    // ask for what this LibTorch has.
    try {
      return open(libuv, timeout);
    } catch (const std::exception& e) {
      throw std::runtime_error(
          fmt::format("{}{}: {}", server ? "" : "the client of ", name, reason(e)));
    }
  }
  std::string libuv_failure;
  try {
    return open(true, timeout);
  } catch (const std::exception& e) {
    libuv_failure = reason(e);
  }
  const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - start);
  if (left.count() <= 0) {
    throw std::runtime_error(fmt::format(
        "the libuv TCPStore: {}; no time was left to try the classic one", libuv_failure));
  }
  try {
    return open(false, left);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("the libuv TCPStore: {}; the classic TCPStore: {}",
                                         libuv_failure, reason(e)));
  }
}

std::pair<std::string, uint16_t> split_master(const std::string& master, const char* fn) {
  const auto colon = master.rfind(':');
  TORCH_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < master.size(),
              fmt::format("{}: master must be ADDR:PORT, got \"{}\"", fn, master));
  std::string host = master.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:29500
  }
  const int64_t port = parse_integer("the port of master", master.substr(colon + 1));
  TORCH_CHECK(port > 0 && port < 65536,
              fmt::format("{}: the port of master must be in [1, 65535], got {} (\"{}\")", fn,
                          port, master));
  return {host, static_cast<uint16_t>(port)};
}

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

std::chrono::milliseconds checked_timeout(const char* what, double ms, const std::string& shown) {
  // At least 0.5 ms: 1 ms once rounded. A NaN fails every comparison.
  const bool fits = ms >= 0.5 && ms <= static_cast<double>(kMaxTimeoutMs);
  TORCH_CHECK(fits, fmt::format("d2l::distributed::LaunchOptions: {} must be from 1 ms to a year "
                                "({} ms), got \"{}\"",
                                what, kMaxTimeoutMs, shown));
  return std::chrono::milliseconds(std::llround(ms));
}

}  // namespace detail

}  // namespace d2l::distributed
