// State dicts of modules with buffers (a BatchNorm's running statistics),
// loaded from what Python's torch.save wrote (state_buffers_torch113.pt,
// tests/fixtures/generate_state_dicts.py) and saved from C++; and
// write_state_dict's path form with its errors.

#include <d2l/state_dict.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fixture.h"
#include "state_dict_helpers.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::fixture_path;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Python's nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)): the same keys.
torch::nn::Sequential linear_batch_norm() {
  return torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
}

std::vector<std::string> state_dict_keys(
    const std::vector<std::pair<std::string, torch::Tensor>>& sd) {
  std::vector<std::string> keys;
  for (const auto& [key, t] : sd) keys.push_back(key);
  return keys;
}

const std::vector<std::string> kBufferModelKeys = {"0.weight",
                                                   "0.bias",
                                                   "1.weight",
                                                   "1.bias",
                                                   "1.running_mean",
                                                   "1.running_var",
                                                   "1.num_batches_tracked"};

TEST(StateDictBuffers, PythonsRunningStatisticsLoadAndGiveItsOutput) {
  const auto path = fixture_path("state_buffers_torch113.pt");
  const auto f = d2l::testing::load_fixture("state_buffers_torch113");
  const auto file = d2l::read_state_dict(path);
  ASSERT_EQ(state_dict_keys(file), kBufferModelKeys);
  auto model = linear_batch_norm();
  d2l::load_state_dict(*model, path);
  const auto bn = model[1]->as<torch::nn::BatchNorm1d>();
  // Python trained the statistics away from their initial 0, 1 and 0.
  EXPECT_TRUE(torch::equal(bn->running_mean, file[4].second));
  EXPECT_TRUE(torch::equal(bn->running_var, file[5].second));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 3);
  EXPECT_GT(bn->running_mean.abs().max().item<float>(), 0.05);
  model->eval();
  torch::NoGradGuard no_grad;
  EXPECT_LT(d2l::testing::max_rel_error(model->forward(f.tensor("X")), f.tensor("output")), 1e-6);
}

TEST(StateDictBuffers, SavedWithTheBuffersAndLoadedBack) {
  auto trained = linear_batch_norm();
  d2l::load_state_dict(*trained, fixture_path("state_buffers_torch113.pt"));
  std::stringstream bytes;
  d2l::save_state_dict(*trained, bytes);
  const auto saved = d2l::read_state_dict(bytes);
  ASSERT_EQ(state_dict_keys(saved), kBufferModelKeys);
  const auto original = d2l::read_state_dict(fixture_path("state_buffers_torch113.pt"));
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_TRUE(torch::equal(saved[i].second, original[i].second)) << saved[i].first;
  }
  auto fresh = linear_batch_norm();
  bytes.clear();
  bytes.seekg(0);
  d2l::load_state_dict(*fresh, bytes);
  const auto bn = fresh[1]->as<torch::nn::BatchNorm1d>();
  EXPECT_TRUE(torch::equal(bn->running_var, original[5].second));
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 3);
}

// A file without the buffers does not fit the module (strict), and says
// which keys are missing.
TEST(StateDictBuffers, BuffersAreRequiredKeys) {
  auto model = linear_batch_norm();
  std::vector<std::pair<std::string, torch::Tensor>> parameters_only;
  for (const auto& p : model->named_parameters()) parameters_only.emplace_back(p.key(), p.value());
  std::stringstream bytes;
  d2l::write_state_dict(parameters_only, bytes);
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, bytes); }),
              HasSubstr("missing keys (3): 1.running_mean, 1.running_var, "
                        "1.num_batches_tracked"));
}

TEST(WriteStateDict, ToAPathReadsBackInOrder) {
  const std::string path = ::testing::TempDir() + "d2l_write_state_dict.pt";
  const std::vector<std::pair<std::string, torch::Tensor>> entries = {
      {"z", torch::arange(6, torch::kDouble).view({2, 3}).t()},
      {"a", torch::tensor({true, false})},
      {"m", torch::tensor(7, torch::kLong)}};
  d2l::write_state_dict(entries, path);
  const auto back = d2l::read_state_dict(path);
  ASSERT_EQ(state_dict_keys(back), (std::vector<std::string>{"z", "a", "m"}));
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(back[i].second.scalar_type(), entries[i].second.scalar_type()) << back[i].first;
    EXPECT_TRUE(torch::equal(back[i].second, entries[i].second)) << back[i].first;
  }
  // The same entries give the same bytes through a path and a stream.
  std::ostringstream stream;
  d2l::write_state_dict(entries, stream);
  EXPECT_TRUE(stream.str() == d2l::testing::read_bytes(path));
  std::remove(path.c_str());
}

TEST(WriteStateDict, PathErrorsNameThePath) {
  const std::string dir = ::testing::TempDir() + "d2l_no_such_dir/";
  EXPECT_THAT(
      error_message([&] {
        d2l::write_state_dict({{"a", torch::ones(1)}}, dir + "x.pt");
      }),
      StartsWith("d2l::write_state_dict: " + dir + "x.pt: cannot open the file for writing"));
  const std::string path = ::testing::TempDir() + "d2l_write_state_dict_bad.pt";
  EXPECT_THAT(error_message([&] {
                d2l::write_state_dict({{"a", torch::ones(1)}, {"a", torch::ones(2)}}, path);
              }),
              HasSubstr("d2l::write_state_dict: " + path + ": key 'a' appears twice"));
  EXPECT_THAT(error_message([&] {
                d2l::write_state_dict({{"s", torch::ones({2, 2}).to_sparse()}}, path);
              }),
              HasSubstr("d2l::write_state_dict: " + path + ": tensor 's' is Float"));
  std::remove(path.c_str());
}

}  // namespace
