#pragma once

// Internal helpers of d2l::distributed: the rendezvous address and the
// TCPStore on either of LibTorch's server backends.

#include <d2l/distributed.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

namespace d2l::distributed::detail {

/// "ADDR:PORT" (or "[v6]:PORT") split; c10::Error naming `fn` otherwise.
std::pair<std::string, uint16_t> split_master(const std::string& master, const char* fn);

/// `value` as an integer; c10::Error naming `what` otherwise.
int64_t parse_integer(const char* what, const std::string& value);

/// The longest timeout the launcher takes: a year. Longer ones would
/// overflow the deadlines the stores compute (now + timeout, in
/// nanoseconds), and "never" is not a timeout.
constexpr int64_t kMaxTimeoutMs = int64_t{365} * 24 * 3600 * 1000;

/// `ms` milliseconds, rounded to the nearest, as a timeout: c10::Error naming
/// `what` and its text `shown` unless it is a number from 1 ms to a year.
std::chrono::milliseconds checked_timeout(const char* what, double ms, const std::string& shown);

/// Throws c10::Error naming `fn` unless `backend` is "auto", "classic", or
/// "libuv" where this LibTorch can start it.
void check_tcp_store(const std::string& backend, const char* fn);

/// The store at host:port: its server here when `server` (port 0: any free
/// one, read back with getPort()), or a client of it. `backend` is "auto",
/// "libuv" or "classic" (LaunchOptions::tcp_store). "auto" asks for libuv
/// where this LibTorch offers it and, if that server fails, for the classic
/// one within what is left of `timeout`. A failure throws std::runtime_error
/// holding the reason of every attempt ("the libuv TCPStore: ...; the classic
/// TCPStore: ..."), for the caller to put behind its own context.
c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host, uint16_t port,
                                                  bool server, int64_t world_size,
                                                  std::chrono::milliseconds timeout,
                                                  const std::string& backend);

}  // namespace d2l::distributed::detail
