// d2l's "Machine Translation and the Dataset" section on the shipped fra-eng
// sample (tests/data/fra-eng-sample): the book's published outputs, the
// vocabulary's order, the loader, and every bad input.

#include <d2l/nmt_data.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "fifo_watchdog.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;
using Lines = std::vector<std::vector<std::string>>;

const std::string kSample = D2L_NMT_DATA_DIR "/fra-eng-sample";
const std::string kSampleZip = D2L_NMT_DATA_DIR "/fra-eng-zip/fra-eng.zip";

// A file of `bytes` in the test's temporary directory.
std::string write_temp(const std::string& name, const std::string& bytes) {
  const auto path = std::filesystem::path(::testing::TempDir()) /
                    ("d2l_nmt_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

TEST(NmtData, ReadDataNmtGivesTheBooksRawText) {
  // The book prints raw_text[:75]: 75 characters, 76 bytes of UTF-8 (one Ç).
  const auto raw = d2l::read_data_nmt(kSample);
  EXPECT_EQ(raw.substr(0, 76),
            "Go.\tVa !\nHi.\tSalut !\nRun!\tCours !\nRun!\tCourez !\nWho?\tQui ?\nWow!\t\xc3\x87"
            "a alors !\n");
}

TEST(NmtData, ReadDataNmtRefusesAFifoWithoutBlocking) {
  using d2l::testing::FifoWatchdog;
  const auto path = std::filesystem::path(::testing::TempDir()) /
                    ("d2l_nmt_fifo_" + std::to_string(::getpid()) + ".txt");
  std::filesystem::remove(path);
  d2l::testing::make_fifo(path.string());
  FifoWatchdog watchdog(path.string(), FifoWatchdog::Side::kReader);
  EXPECT_EQ(error_message([&] { d2l::read_data_nmt(path.string()); }),
            "d2l::read_data_nmt: " + path.string() + ": cannot be read: it is a FIFO (named pipe)");
  EXPECT_FALSE(watchdog.finish()) << "the FIFO's reader blocked";
  std::filesystem::remove(path);
}

TEST(NmtData, ReadDataNmtAcceptsTheFileTheDirectoryAndTheZip) {
  const auto raw = d2l::read_data_nmt(kSample);
  EXPECT_EQ(d2l::read_data_nmt(kSample + "/fra.txt"), raw);
  EXPECT_EQ(d2l::read_data_nmt(kSampleZip), raw);
  EXPECT_EQ(d2l::read_data_nmt(D2L_NMT_DATA_DIR "/fra-eng-zip"), raw);
}

TEST(NmtData, PreprocessNmtGivesTheBooksText) {
  // The book prints text[:80]: 80 characters, 81 bytes of UTF-8 (one ç).
  const auto text = d2l::preprocess_nmt(d2l::read_data_nmt(kSample));
  EXPECT_EQ(
      text.substr(0, 81),
      "go .\tva !\nhi .\tsalut !\nrun !\tcours !\nrun !\tcourez !\nwho ?\tqui ?\nwow !\t\xc3\xa7"
      "a alors !");
}

TEST(NmtData, PreprocessNmtReplacesNoBreakSpacesAndLowerCasesFrench) {
  EXPECT_EQ(d2l::preprocess_nmt("Va\xe2\x80\xaf!\tOui\xc2\xa0?"), "va !\toui ?");
  EXPECT_EQ(d2l::preprocess_nmt("\xc3\x89"
                                "coutez, \xc3\x80 BIENT\xc3\x94T\xc5\x92!"),
            "\xc3\xa9"
            "coutez , \xc3\xa0 bient\xc3\xb4t\xc5\x93 !");
  EXPECT_EQ(d2l::preprocess_nmt(".Hi"), ".hi");  // the first character gets no space
  EXPECT_EQ(d2l::preprocess_nmt(""), "");
}

TEST(NmtData, TokenizeNmtGivesTheBooksFirstPairs) {
  const auto [source, target] = d2l::tokenize_nmt(d2l::preprocess_nmt(d2l::read_data_nmt(kSample)));
  ASSERT_EQ(source.size(), 651u);
  const Lines book_source{{"go", "."},  {"hi", "."},  {"run", "!"},
                          {"run", "!"}, {"who", "?"}, {"wow", "!"}};
  const Lines book_target{{"va", "!"},
                          {"salut", "!"},
                          {"cours", "!"},
                          {"courez", "!"},
                          {"qui", "?"},
                          {"\xc3\xa7"
                           "a",
                           "alors", "!"}};
  EXPECT_EQ(Lines(source.begin(), source.begin() + 6), book_source);
  EXPECT_EQ(Lines(target.begin(), target.begin() + 6), book_target);
}

TEST(NmtData, TokenizeNmtStopsAfterLineNumExamplesAsTheBook) {
  // The book breaks when the line index exceeds num_examples: 600 gives 601.
  const auto text = d2l::preprocess_nmt(d2l::read_data_nmt(kSample));
  EXPECT_EQ(d2l::tokenize_nmt(text, 600).first.size(), 601u);
  EXPECT_EQ(d2l::tokenize_nmt(text, 2).second.size(), 3u);
  // Python's split(' ') keeps empty words.
  EXPECT_EQ(d2l::tokenize_nmt("a  b\tc\n").first, Lines({{"a", "", "b"}}));
}

TEST(NmtData, VocabOrdersUnkReservedThenFrequencyWithFirstOccurrenceTies) {
  const Lines tokens{{"b", "a", "c"}, {"a", "d", "c"}, {"e", "a"}};
  const d2l::Vocab vocab(tokens, 0, {"<pad>", "<bos>", "<eos>"});
  EXPECT_EQ(vocab.idx_to_token(), std::vector<std::string>({"<unk>", "<pad>", "<bos>", "<eos>", "a",
                                                            "c", "b", "d", "e"}));
  EXPECT_EQ(vocab["a"], 4);
  EXPECT_EQ(vocab["never seen"], 0);
  const d2l::Vocab frequent(tokens, 2, {"<pad>"});
  EXPECT_EQ(frequent.idx_to_token(), std::vector<std::string>({"<unk>", "<pad>", "a", "c"}));
  EXPECT_EQ(frequent.token_freqs().front(), std::make_pair(std::string("a"), int64_t{3}));
  EXPECT_EQ(frequent.to_tokens(std::vector<int64_t>{2, 3}), std::vector<std::string>({"a", "c"}));
  // A reserved token seen in the data keeps its reserved index.
  const d2l::Vocab reserved_seen(Lines{{"<pad>", "x"}}, 0, {"<pad>"});
  EXPECT_EQ(reserved_seen.idx_to_token(), std::vector<std::string>({"<unk>", "<pad>", "x"}));
}

TEST(NmtData, VocabsOfTheSampleAsTheBooksCode) {
  // Sizes and first tokens from the book's code (d2l.torch 0.17) run on the
  // same sample.
  const auto [source, target] = d2l::tokenize_nmt(d2l::preprocess_nmt(d2l::read_data_nmt(kSample)));
  const std::vector<std::string> reserved{"<pad>", "<bos>", "<eos>"};
  const d2l::Vocab src_vocab(source, 2, reserved), tgt_vocab(target, 2, reserved);
  EXPECT_EQ(src_vocab.size(), 197);
  EXPECT_EQ(tgt_vocab.size(), 217);
  EXPECT_EQ(std::vector<std::string>(src_vocab.idx_to_token().begin(),
                                     src_vocab.idx_to_token().begin() + 12),
            std::vector<std::string>({"<unk>", "<pad>", "<bos>", "<eos>", ".", "i", "!", "i'm",
                                      "it", "go", "tom", "?"}));
  EXPECT_EQ(std::vector<std::string>(tgt_vocab.idx_to_token().begin(),
                                     tgt_vocab.idx_to_token().begin() + 12),
            std::vector<std::string>({"<unk>", "<pad>", "<bos>", "<eos>", ".", "!", "je", "suis",
                                      "tom", "?", "j'ai",
                                      "\xc3\xa7"
                                      "a"}));
  // The book's truncate_pad(src_vocab[source[0]], 10, src_vocab['<pad>']).
  EXPECT_EQ(d2l::truncate_pad(src_vocab[source[0]], 10, src_vocab["<pad>"]),
            std::vector<int64_t>({9, 4, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(NmtData, TruncatePadTruncatesAndPads) {
  EXPECT_EQ(d2l::truncate_pad({5, 6, 7}, 2, 1), std::vector<int64_t>({5, 6}));
  EXPECT_EQ(d2l::truncate_pad({5}, 3, 1), std::vector<int64_t>({5, 1, 1}));
  EXPECT_EQ(d2l::truncate_pad({}, 0, 1), std::vector<int64_t>());
}

TEST(NmtData, BuildArrayNmtAppendsEosPadsAndCountsValidLengths) {
  const d2l::Vocab vocab(Lines{{"a", "b"}}, 0, {"<pad>", "<bos>", "<eos>"});
  const auto [array, valid_len] =
      d2l::build_array_nmt(Lines{{"a"}, {"b", "a", "a", "z"}, {}}, vocab, 3);
  EXPECT_TRUE(torch::equal(
      array, torch::tensor({4, 3, 1, 5, 4, 4, 3, 1, 1}, torch::kLong).reshape({3, 3})));
  EXPECT_EQ(valid_len.scalar_type(), torch::kInt);
  EXPECT_TRUE(torch::equal(valid_len, torch::tensor({2, 3, 1}, torch::kInt)));
}

TEST(NmtData, LoadDataNmtBatchesCoverEveryExampleOncePerEpoch) {
  auto data = d2l::load_data_nmt(kSample, 2, 8);
  EXPECT_EQ(data.data_iter.num_examples(), 601);
  const auto batch = data.data_iter.epoch().front();
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch[0].sizes(), torch::IntArrayRef({2, 8}));
  EXPECT_EQ(batch[1].sizes(), torch::IntArrayRef({2}));

  // A loader over the row numbers shows the permutation of each epoch.
  d2l::ArrayLoader loader({torch::arange(10)}, 3, /*is_train=*/true, /*seed=*/7);
  std::vector<std::vector<int64_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;
    const auto batches = loader.epoch();
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_EQ(batches.back()[0].numel(), 1);
    for (const auto& b : batches) {
      for (int64_t i = 0; i < b[0].numel(); ++i) order.push_back(b[0][i].item<int64_t>());
    }
    EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 10u);
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  d2l::ArrayLoader in_order({torch::arange(5)}, 5, /*is_train=*/false);
  EXPECT_TRUE(torch::equal(in_order.epoch()[0][0], torch::arange(5)));
}

TEST(NmtDataErrors, MissingEmptyNotUtf8AndTablessFiles) {
  const std::string missing = ::testing::TempDir() + "/d2l_no_such_fra.txt";
  auto msg = error_message([&] { d2l::read_data_nmt(missing); });
  EXPECT_THAT(msg, HasSubstr("d2l::read_data_nmt"));
  EXPECT_THAT(msg, HasSubstr(missing));

  const auto empty = write_temp("empty.txt", "");
  msg = error_message([&] { d2l::read_data_nmt(empty); });
  EXPECT_THAT(msg, HasSubstr(empty));
  EXPECT_THAT(msg, HasSubstr("empty"));

  const auto latin1 = write_temp("latin1.txt",
                                 "Go.\tVa !\nHi.\tSalut !\nWow!\t\xc7"
                                 "a alors !\n");
  msg = error_message([&] { d2l::read_data_nmt(latin1); });
  EXPECT_THAT(msg, HasSubstr("d2l::read_data_nmt: " + latin1));
  EXPECT_THAT(msg, HasSubstr("line 3 is not UTF-8"));

  const auto tabless = write_temp("tabless.txt", "Go.\tVa !\nHi. Salut !\n");
  msg = error_message([&] { d2l::read_data_nmt(tabless); });
  EXPECT_THAT(msg, HasSubstr("d2l::read_data_nmt: " + tabless));
  EXPECT_THAT(msg, HasSubstr("line 2 has no tab"));

  const auto empty_dir =
      std::filesystem::path(::testing::TempDir()) / ("d2l_nmt_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(empty_dir);
  EXPECT_THAT(error_message([&] { d2l::read_data_nmt(empty_dir.string()); }),
              HasSubstr("neither fra.txt"));
  std::filesystem::remove_all(empty_dir);
}

TEST(NmtDataErrors, ZipWithoutFraTxtOrCorrupt) {
  const auto not_zip = write_temp("not.zip", "Go.\tVa !\n");
  auto msg = error_message([&] { d2l::read_data_nmt(not_zip); });
  EXPECT_THAT(msg, HasSubstr(not_zip));
  EXPECT_THAT(msg, HasSubstr("not a zip archive"));

  std::ifstream in(kSampleZip, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bytes[100] = static_cast<char>(bytes[100] ^ 0x55);  // inside fra.txt's deflate data
  const auto corrupt = write_temp("corrupt.zip", bytes);
  msg = error_message([&] { d2l::read_data_nmt(corrupt); });
  EXPECT_THAT(msg, HasSubstr(corrupt));
  EXPECT_THAT(msg, HasSubstr("corrupt"));
}

TEST(NmtDataErrors, TokenizeNmtNamesTheLineWithoutOneTab) {
  EXPECT_THAT(error_message([] { d2l::tokenize_nmt("go .\tva !\nhi .\n"); }),
              HasSubstr("d2l::tokenize_nmt: line 2 must hold one tab"));
  EXPECT_THAT(error_message([] { d2l::tokenize_nmt("a\tb\tc"); }), HasSubstr("line 1"));
  EXPECT_THAT(error_message([] { d2l::tokenize_nmt("a\tb", -1); }), HasSubstr("got -1"));
}

TEST(NmtDataErrors, IdsOutsideTheVocabularyNameTheIdAndTheSize) {
  const d2l::Vocab vocab(Lines{{"a"}}, 0, {"<pad>"});
  EXPECT_THAT(error_message([&] { vocab.to_tokens(3); }),
              HasSubstr("d2l::Vocab::to_tokens: index 3 is outside the vocabulary of size 3"));
  EXPECT_THAT(error_message([&] {
                vocab.to_tokens(std::vector<int64_t>{0, -1});
              }),
              HasSubstr("index -1 is outside the vocabulary of size 3"));
}

TEST(NmtDataErrors, BadSizesAndLoaders) {
  const d2l::Vocab no_reserved(Lines{{"a"}});
  EXPECT_THAT(error_message([&] { d2l::build_array_nmt(Lines{{"a"}}, no_reserved, 3); }),
              HasSubstr("d2l::build_array_nmt: the vocabulary must hold"));
  EXPECT_THAT(error_message([] { d2l::truncate_pad({1}, -2, 0); }),
              HasSubstr("d2l::truncate_pad: num_steps must be >= 0, got -2"));
  EXPECT_THAT(error_message([] { d2l::ArrayLoader({torch::arange(3)}, 0); }),
              HasSubstr("d2l::ArrayLoader: batch_size must be positive, got 0"));
  EXPECT_THAT(error_message([] {
                d2l::ArrayLoader({torch::arange(3), torch::arange(4)}, 2);
              }),
              HasSubstr("got 4 in arrays[1]"));
}

}  // namespace
