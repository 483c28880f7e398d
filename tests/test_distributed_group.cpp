// d2l::distributed in one process: a group of one on a GPU, and two ranks as
// two threads of this process, each with its own Gloo group over a file
// store: the collectives, the gradient reducer, the broadcast's checks and
// checkpoints.

#include <d2l/attention.h>
#include <d2l/distributed.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "distributed_helpers.h"
#include "test_utils.h"

namespace {

using namespace d2l::testing::distributed;
using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

// CUDA tensors through a group (NCCL where the build has it, else Gloo): a
// group of one on a GPU trains as the single-process loop does. GPU
// machines here have one device, and NCCL takes one device per rank, so two
// NCCL ranks cannot be tested on them; this checks the CUDA side of the
// group, the broadcast and the reducer.
TEST(DistributedGroup, CudaTensorsTrainThroughAGroupOfOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto store =
      std::filesystem::temp_directory_path() / fmt::format("d2l_dist_cuda_store_{}", ::getpid());
  auto group = dist::init_process_group(
      dist::LaunchOptions().file_store(store.string()).timeout(std::chrono::seconds(30)),
      torch::kCUDA);
  EXPECT_EQ(group->getBackendName(), dist::nccl_available() ? "nccl" : "gloo");
  auto data = d2l::load_data_nmt(kFraEngSample, kBatch, kSteps, kExamples);
  auto grouped = make_model(data, 100, torch::kFloat);
  const auto through_group = dist::train_seq2seq(
      *grouped, data.data_iter, 0.005, kEpochs, data.tgt_vocab, torch::kCUDA, group,
      d2l::TrainSeq2SeqOptions().on_step(nullptr), /*bucket_cap_bytes=*/4096);
  auto data_again = d2l::load_data_nmt(kFraEngSample, kBatch, kSteps, kExamples);
  auto alone = make_model(data_again, 100, torch::kFloat);
  const auto single =
      d2l::train_seq2seq(*alone, data_again.data_iter, 0.005, kEpochs, data_again.tgt_vocab,
                         torch::kCUDA, d2l::TrainSeq2SeqOptions().on_step(nullptr));
  ASSERT_EQ(through_group.step_losses.size(), single.step_losses.size());
  for (size_t i = 0; i < single.step_losses.size(); ++i) {
    EXPECT_NEAR(through_group.step_losses[i], single.step_losses[i],
                1e-4 * std::abs(single.step_losses[i]))
        << "step " << i;
  }
  const auto a = grouped->parameters(), b = alone->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].is_cuda());
    EXPECT_LT(max_rel_error(a[i], b[i]), 1e-3) << "parameter " << i;
  }
  std::filesystem::remove(store);
}

// Two ranks as two threads of this process, each with its own Gloo group
// over a file store.
template <typename Body>
void on_two_ranks(Body body) {
  EXPECT_TRUE(kFlightRecorderOff);
  const auto store = std::filesystem::temp_directory_path() /
                     fmt::format("d2l_dist_store_{}_{}", ::getpid(),
                                 std::chrono::steady_clock::now().time_since_epoch().count());
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto group = dist::init_process_group(dist::LaunchOptions()
                                                  .world_size(2)
                                                  .rank(rank)
                                                  .file_store(store.string())
                                                  .timeout(std::chrono::seconds(30)));
        body(rank, group);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove(store);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

struct TwoLayers : torch::nn::Module {
  TwoLayers() {
    first = register_module("first", torch::nn::Linear(6, 5));
    second = register_module("second", torch::nn::Linear(5, 3));
    unused = register_parameter("unused", torch::ones({2}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::tanh(first(x))); }
  torch::nn::Linear first{nullptr}, second{nullptr};
  torch::Tensor unused;
};

TEST(DistributedGroup, GradientReducerSumsOrAveragesEveryRanksGradients) {
  torch::manual_seed(3);
  const auto inputs = torch::randn({2, 4, 6});
  // Each rank's own gradients, and their sum, computed plainly.
  TwoLayers reference;
  std::map<std::string, torch::Tensor> sum;
  for (int64_t rank = 0; rank < 2; ++rank) {
    reference.zero_grad();
    reference.forward(inputs[rank]).pow(2).sum().backward();
    for (const auto& p : reference.named_parameters()) {
      if (p.key() == "unused") continue;
      const auto g = p.value().grad().clone();
      sum[p.key()] = rank == 0 ? g : sum[p.key()] + g;
    }
  }
  for (bool average : {false, true}) {
    std::vector<std::map<std::string, torch::Tensor>> grads(2);
    std::vector<int64_t> buckets(2), overlapped(2);
    on_two_ranks([&](int64_t rank, const dist::GroupPtr& group) {
      TwoLayers model;
      {
        torch::NoGradGuard no_grad;
        for (const auto& p : reference.named_parameters()) {
          // Rank 1 starts elsewhere; the broadcast brings rank 0's weights.
          model.named_parameters()[p.key()].copy_(p.value() + (rank == 1 ? 1.0 : 0.0));
        }
      }
      dist::broadcast_parameters(model, group);
      // 60 bytes a bucket; from the last parameter back: second.bias,
      // second.weight, first.bias, first.weight, unused: five buckets. The
      // last one (unused, which no backward reaches) is sent by finalize().
      dist::GradientReducer reducer(
          model.parameters(), group,
          dist::GradientReducerOptions().bucket_cap_bytes(5 * 3 * 4).average(average));
      for (int step = 0; step < 2; ++step) {  // the second pass reuses the buckets
        model.zero_grad();
        reducer.prepare_for_backward();
        model.forward(inputs[rank]).pow(2).sum().backward();
        reducer.finalize();
      }
      buckets[rank] = reducer.num_buckets();
      overlapped[rank] = reducer.launched_during_backward();
      for (const auto& p : model.named_parameters())
        grads[rank][p.key()] = p.value().grad().clone();
    });
    for (int64_t rank = 0; rank < 2; ++rank) {
      ASSERT_EQ(grads[rank].size(), 5u);
      for (const auto& [name, total] : sum) {
        const auto expected = average ? total / 2 : total;
        EXPECT_TRUE(torch::allclose(grads[rank][name], expected, 1e-5, 1e-6))
            << "rank " << rank << " " << name << " average " << average;
      }
      // The parameter no backward reaches gets zeros, not a stale gradient.
      EXPECT_TRUE(grads[rank]["unused"].equal(torch::zeros({2})));
      EXPECT_EQ(buckets[rank], 5);
      EXPECT_EQ(overlapped[rank], 4);
    }
  }
}

TEST(DistributedGroup, GradientReducerMisuseIsAClearError) {
  on_two_ranks([&](int64_t rank, const dist::GroupPtr& group) {
    torch::nn::Linear model(3, 2);
    dist::GradientReducer reducer(model->parameters(), group);
    if (rank == 0) {
      EXPECT_THAT(error_message([&] { reducer.finalize(); }),
                  HasSubstr("d2l::distributed::GradientReducer (rank 0 of 2): finalize() without "
                            "prepare_for_backward()"));
    }
    reducer.prepare_for_backward();
    const auto x = torch::randn({4, 3});
    model(x).sum().backward();
    if (rank == 0) {
      EXPECT_THAT(error_message([&] { model(x).sum().backward(); }),
                  HasSubstr("received a second gradient before finalize()"));
    }
    reducer.finalize();
  });
  EXPECT_THAT(error_message([] {
                dist::GradientReducer(std::vector<torch::Tensor>{torch::zeros({2})},
                                      dist::GroupPtr());
              }),
              HasSubstr("d2l::distributed::GradientReducer: group is null"));
}

TEST(DistributedGroup, AllReduceSumAddsEveryRanksValuesInPlace) {
  std::vector<torch::Tensor> results(2);
  on_two_ranks([&](int64_t rank, const dist::GroupPtr& group) {
    auto values = torch::arange(4, torch::kDouble) * (rank + 1) + rank;
    const auto storage = values.data_ptr();
    dist::all_reduce_sum(group, values, "the test's values");
    EXPECT_EQ(values.data_ptr(), storage) << "not in place";
    results[rank] = values;
  });
  // rank 0: 0 1 2 3; rank 1: 1 3 5 7.
  const auto expected = torch::tensor({1.0, 4.0, 7.0, 10.0}, torch::kDouble);
  EXPECT_TRUE(results[0].equal(expected)) << results[0];
  EXPECT_TRUE(results[1].equal(expected)) << results[1];
  auto values = torch::ones({2});
  EXPECT_THAT(error_message([&] { dist::all_reduce_sum(dist::GroupPtr(), values, "x"); }),
              HasSubstr("d2l::distributed::all_reduce_sum: group is null"));
}

TEST(DistributedGroup, BroadcastRefusesModelsOfDifferentSizes) {
  std::vector<std::string> messages(2);
  on_two_ranks([&](int64_t rank, const dist::GroupPtr& group) {
    torch::nn::Linear model(3, rank == 0 ? 2 : 4);
    messages[rank] = error_message([&] { dist::broadcast_parameters(*model, group); });
  });
  EXPECT_THAT(messages[0],
              HasSubstr("d2l::distributed::broadcast_parameters (rank 0 of 2): 1 rank(s) hold a "
                        "model of another size than rank 0's (8 elements in 2 tensors)"));
  EXPECT_THAT(messages[1],
              HasSubstr("d2l::distributed::broadcast_parameters (rank 1 of 2): this rank's model "
                        "has 16 elements in 2 tensors, rank 0's has 8 in 2"));
}

TEST(DistributedGroup, CheckpointsAreWrittenWhole) {
  const auto path =
      std::filesystem::temp_directory_path() / fmt::format("d2l_dist_checkpoint_{}.pt", ::getpid());
  torch::nn::Linear model(3, 2);
  dist::save_checkpoint(*model, path.string());
  torch::nn::Linear loaded(3, 2);
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  loaded->load(archive);
  EXPECT_TRUE(loaded->weight.equal(model->weight));
  // No temporary left behind.
  size_t files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    files += entry.path().filename().string().rfind(path.filename().string(), 0) == 0;
  }
  EXPECT_EQ(files, 1u);
  std::filesystem::remove(path);
  EXPECT_THAT(error_message([&] { dist::save_checkpoint(*model, "/nonexistent-dir/x.pt"); }),
              HasSubstr("d2l::distributed::save_checkpoint: writing /nonexistent-dir/x.pt failed"));
  EXPECT_FALSE(
      std::filesystem::exists("/nonexistent-dir/x.pt.partial-" + std::to_string(::getpid())));
}

}  // namespace
