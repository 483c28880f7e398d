// d2l::distributed::GradientReducer (bucketed all-reduce launched from
// autograd hooks) and the data-parallel train_seq2seq built on it.

#include <d2l/distributed.h>

#include "collectives.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <map>
#include <mutex>

namespace d2l::distributed {

namespace {
constexpr const char* kReducer = "d2l::distributed::GradientReducer";
}  // namespace

struct GradientReducer::State {
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;
  };
  struct Bucket {
    torch::Tensor flat;
    std::vector<size_t> params;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    bool launched = false;
  };

  GroupPtr group;
  GradientReducerOptions options;
  std::vector<torch::Tensor> params;
  std::vector<Slot> slots;
  std::vector<char> seen;
  std::vector<Bucket> buckets;
  std::vector<unsigned> hooks;
  size_t next_to_launch = 0;
  bool armed = false;
  int64_t launched_in_backward = 0;
  std::mutex mutex;

  // Launches, in bucket order, every bucket that is complete and whose
  // predecessors are launched: every rank issues the same collectives in the
  // same order whatever order its hooks ran in.
  void launch_ready() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      auto& bucket = buckets[next_to_launch];
      std::vector<torch::Tensor> tensors{bucket.flat};
      try {
        bucket.work = group->allreduce(tensors);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, detail::who(kReducer, *group),
                    ": starting the all-reduce of gradient "
                    "bucket ",
                    next_to_launch + 1, " of ", buckets.size(), " failed: ", detail::reason(e));
      }
      bucket.launched = true;
      ++next_to_launch;
    }
  }

  void on_gradient(size_t index, const torch::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed || !grad.defined()) return;
    TORCH_CHECK(!seen[index],
                fmt::format("{}: parameter {} (shape {}) received a second gradient before "
                            "finalize(): run one backward pass between prepare_for_backward() "
                            "and finalize()",
                            detail::who(kReducer, *group), index, c10::str(params[index].sizes())));
    TORCH_CHECK(grad.layout() == torch::kStrided,
                fmt::format("{}: parameter {} has a sparse gradient; only dense gradients are "
                            "all-reduced",
                            detail::who(kReducer, *group), index));
    seen[index] = 1;
    const auto& slot = slots[index];
    auto& bucket = buckets[slot.bucket];
    torch::NoGradGuard no_grad;
    bucket.flat.narrow(0, slot.offset, grad.numel()).view(grad.sizes()).copy_(grad);
    if (--bucket.pending == 0) {
      const size_t before = next_to_launch;
      launch_ready();
      launched_in_backward += static_cast<int64_t>(next_to_launch - before);
    }
  }
};

GradientReducer::GradientReducer(std::vector<torch::Tensor> parameters, GroupPtr group,
                                 GradientReducerOptions options)
    : state_(std::make_shared<State>()) {
  TORCH_CHECK(group, kReducer, ": group is null");
  TORCH_CHECK(options.bucket_cap_bytes() > 0,
              fmt::format("{}: bucket_cap_bytes must be positive, got {}", kReducer,
                          options.bucket_cap_bytes()));
  auto& s = *state_;
  s.group = std::move(group);
  s.options = options;
  for (auto& p : parameters) {
    TORCH_CHECK(p.defined(), kReducer, ": a parameter is undefined");
    if (p.requires_grad()) s.params.push_back(p);
  }
  TORCH_CHECK(!s.params.empty(), kReducer, ": no parameter requires a gradient");
  s.slots.resize(s.params.size());
  s.seen.assign(s.params.size(), 0);
  // Backward computes the last layers first: fill buckets from the end.
  int64_t bucket_bytes = 0;
  for (size_t k = s.params.size(); k-- > 0;) {
    const auto& p = s.params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool fits = false;
    if (!s.buckets.empty()) {
      const auto& q = s.params[s.buckets.back().params.front()];
      fits = q.device() == p.device() && q.scalar_type() == p.scalar_type() &&
             bucket_bytes + bytes <= options.bucket_cap_bytes();
    }
    if (!fits) {
      s.buckets.emplace_back();
      bucket_bytes = 0;
    }
    s.buckets.back().params.push_back(k);
    bucket_bytes += bytes;
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    auto& bucket = s.buckets[b];
    int64_t numel = 0;
    for (size_t i : bucket.params) {
      s.slots[i] = {b, numel};
      numel += s.params[i].numel();
    }
    const auto& first = s.params[bucket.params.front()];
    bucket.flat = torch::zeros({numel}, first.options().requires_grad(false));
  }
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.hooks.push_back(s.params[i].register_hook([weak, i](torch::Tensor grad) {
      if (auto state = weak.lock()) state->on_gradient(i, grad);
    }));
  }
}

GradientReducer::~GradientReducer() {
  auto& s = *state_;
  for (size_t i = 0; i < s.params.size(); ++i) {
    try {
      s.params[i].remove_hook(s.hooks[i]);
    } catch (...) {
      // The weak pointer makes a surviving hook a no-op.
    }
  }
}

void GradientReducer::prepare_for_backward() {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  std::fill(s.seen.begin(), s.seen.end(), 0);
  for (auto& bucket : s.buckets) {
    bucket.pending = bucket.params.size();
    bucket.work.reset();
    bucket.launched = false;
  }
  s.next_to_launch = 0;
  s.launched_in_backward = 0;
  s.armed = true;
}

void GradientReducer::finalize() {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  TORCH_CHECK(s.armed, detail::who(kReducer, *s.group),
              ": finalize() without prepare_for_backward()");
  s.armed = false;
  torch::NoGradGuard no_grad;
  // Parameters the backward pass did not reach contribute zeros.
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.seen[i]) continue;
    auto& bucket = s.buckets[s.slots[i].bucket];
    bucket.flat.narrow(0, s.slots[i].offset, s.params[i].numel()).zero_();
    --bucket.pending;
  }
  s.launch_ready();
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    detail::wait(
        s.buckets[b].work, *s.group, kReducer,
        fmt::format("the all-reduce of gradient bucket {} of {}", b + 1, s.buckets.size()));
  }
  const int64_t world = s.group->getSize();
  for (auto& bucket : s.buckets) {
    if (s.options.average() && world > 1) bucket.flat.div_(world);
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    auto& p = s.params[i];
    const auto reduced =
        s.buckets[s.slots[i].bucket].flat.narrow(0, s.slots[i].offset, p.numel()).view(p.sizes());
    auto& grad = p.mutable_grad();
    if (grad.defined() && grad.sizes() == p.sizes() && grad.layout() == torch::kStrided) {
      grad.copy_(reduced);
    } else {
      grad = reduced.clone();
    }
  }
}

int64_t GradientReducer::num_buckets() const {
  return static_cast<int64_t>(state_->buckets.size());
}

int64_t GradientReducer::launched_during_backward() const { return state_->launched_in_backward; }

namespace {

class GroupSync final : public TrainSeq2SeqSync {
 public:
  GroupSync(GroupPtr group, int64_t bucket_cap_bytes)
      : group_(std::move(group)), bucket_cap_bytes_(bucket_cap_bytes) {}
  const char* name() const override { return "d2l::distributed::train_seq2seq"; }
  int64_t rank() const override { return group_->getRank(); }
  int64_t world_size() const override { return group_->getSize(); }
  void after_init(torch::nn::Module& net) override {
    broadcast_parameters(net, group_);
    reducer_ = std::make_unique<GradientReducer>(
        net.parameters(), group_,
        GradientReducerOptions().bucket_cap_bytes(bucket_cap_bytes_).average(false));
  }
  void before_backward() override { reducer_->prepare_for_backward(); }
  void after_backward() override { reducer_->finalize(); }
  void sum(torch::Tensor& values) override {
    all_reduce_sum(group_, values, "the all-reduce of the step's loss and token count");
  }

 private:
  GroupPtr group_;
  int64_t bucket_cap_bytes_;
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace

TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const GroupPtr& group, const TrainSeq2SeqOptions& options,
                                 int64_t bucket_cap_bytes) {
  TORCH_CHECK(group, "d2l::distributed::train_seq2seq: group is null");
  GroupSync sync(group, bucket_cap_bytes);
  return d2l::train_seq2seq(net, data_iter, lr, num_epochs, tgt_vocab, device, sync, options);
}

TrainSeq2SeqResult train_seq2seq(const EncoderDecoder& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const GroupPtr& group, const TrainSeq2SeqOptions& options,
                                 int64_t bucket_cap_bytes) {
  TORCH_CHECK(!net.is_empty(),
              "d2l::distributed::train_seq2seq: net is an empty EncoderDecoder holder");
  return train_seq2seq(*net.ptr(), data_iter, lr, num_epochs, tgt_vocab, device, group, options,
                       bucket_cap_bytes);
}

}  // namespace d2l::distributed
