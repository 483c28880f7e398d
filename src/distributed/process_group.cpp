// d2l::distributed: the group, its rendezvous and the collectives, with
// errors that name the rank (include/d2l/distributed.h).

#include <d2l/distributed.h>

#include "collectives.h"
#include "store.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef D2L_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

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

GroupPtr init_process_group(const LaunchOptions& options, torch::Device device) {
  const int64_t world = options.world_size(), rank = options.rank();
  TORCH_CHECK(world >= 1 && world <= (1 << 20),
              fmt::format("{}: world_size must be in [1, 2^20], got {}", kInit, world));
  TORCH_CHECK(rank >= 0 && rank < world,
              fmt::format("{}: rank must be in [0, {}), got {}", kInit, world, rank));
  TORCH_CHECK(options.timeout().count() > 0 && options.timeout().count() <= detail::kMaxTimeoutMs,
              fmt::format("{}: timeout must be from 1 ms to a year ({} ms), got {} ms", kInit,
                          detail::kMaxTimeoutMs, options.timeout().count()));
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
  const std::string& tcp_store = options.tcp_store();
  detail::check_tcp_store(tcp_store, kInit);

  const auto ms = options.timeout();
  const std::string where =
      options.master().empty() ? "file store " + options.file_store() : options.master();
  std::string host;
  c10::intrusive_ptr<c10d::Store> store;
  const auto start = std::chrono::steady_clock::now();
  const bool hosts = !options.master().empty() && rank == 0 && !options.agent_store();
  const auto store_failed = [&](const std::exception& e) {
    TORCH_CHECK(false, kInit, " (rank ", rank, " of ", world, "): the rendezvous at ", where,
                " did not complete within ", ms.count(), " ms: ",
                hosts ? "this rank could not start the store" : "the store could not be reached",
                " (", detail::reason(e), ")");
  };
  try {
    if (!options.master().empty()) {
      uint16_t port = 0;
      std::tie(host, port) = detail::split_master(options.master(), kInit);
      store = detail::make_tcp_store(host, port, hosts, world, ms, tcp_store);
    } else {
      store = c10::make_intrusive<c10d::FileStore>(options.file_store(), static_cast<int>(world));
      store->setTimeout(ms);
    }
  } catch (const c10::Error& e) {
    // Our own checks (split_master) already name the function.
    if (std::string(e.what_without_backtrace()).rfind(kInit, 0) == 0) throw;
    store_failed(e);
  } catch (const std::exception& e) {
    store_failed(e);
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

}  // namespace d2l::distributed
