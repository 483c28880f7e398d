// What d2l::load_state_dict and read_state_dict refuse: state dicts that do
// not fit the module (one error listing every key, the module unchanged) and
// bytes that are not a well-formed torch.save file (a c10::Error naming the
// function, the path and the problem; never a crash).

#include <d2l/attention.h>
#include <d2l/state_dict.h>

#include <gmock/gmock.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fifo_watchdog.h"
#include "serialization_helpers.h"
#include "serialize/pickle.h"
#include "serialize/zip.h"
#include "state_dict_helpers.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::fixture_path;
using d2l::testing::read_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// Every tensor of the module, as raw bytes: "unchanged" means bit for bit.
std::map<std::string, std::string> bits(const torch::nn::Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& [key, t] : d2l::testing::snapshot(m)) {
    const auto c = t.contiguous();
    out[key + " " + c10::toString(c.scalar_type())] =
        std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
  }
  return out;
}

std::string written(const StateDict& sd) {
  std::ostringstream out;
  d2l::write_state_dict(sd, out);
  return out.str();
}

StateDict state_of(const torch::nn::Module& m) {
  StateDict sd;
  for (const auto& p : m.named_parameters()) sd.emplace_back(p.key(), p.value().detach().clone());
  return sd;
}

// Loads `sd` into a fresh AdditiveAttention(2, 20, 8) and returns the error;
// asserts the module did not change.
std::string load_error(const StateDict& sd, bool strict = true) {
  d2l::AdditiveAttention model(2, 20, 8, 0.0);
  const auto before = bits(*model);
  std::istringstream in(written(sd));
  auto message = error_message([&] { d2l::load_state_dict(*model, in, strict); });
  EXPECT_EQ(bits(*model), before) << "the module changed on a failed load";
  return message;
}

StateDict additive_state() {
  torch::manual_seed(7);
  return state_of(*d2l::AdditiveAttention(2, 20, 8, 0.0));
}

TEST(StateDictErrors, MissingKeysAreListed) {
  auto sd = additive_state();
  sd.erase(sd.begin());  // W_k.weight
  sd.pop_back();         // w_v.weight
  EXPECT_THAT(load_error(sd), AllOf(StartsWith("d2l::load_state_dict: <stream>: "),
                                    HasSubstr("missing keys (2): W_k.weight, w_v.weight")));
}

TEST(StateDictErrors, UnexpectedKeysAreListed) {
  auto sd = additive_state();
  sd.emplace_back("W_o.weight", torch::ones({2}));
  sd.emplace_back("extra", torch::ones({1}));
  EXPECT_THAT(load_error(sd), HasSubstr("unexpected keys (2): W_o.weight, extra"));
}

TEST(StateDictErrors, ShapeMismatchesNameBothShapes) {
  auto sd = additive_state();
  sd[1].second = torch::ones({8, 21});
  EXPECT_THAT(load_error(sd), HasSubstr("W_q.weight (file Float [8, 21], module Float [8, 20])"));
}

TEST(StateDictErrors, DtypeMismatchesNameBothDtypes) {
  auto sd = additive_state();
  sd[2].second = sd[2].second.to(torch::kDouble);
  EXPECT_THAT(load_error(sd), HasSubstr("w_v.weight (file Double [1, 8], module Float [1, 8])"));
}

TEST(StateDictErrors, EveryProblemIsInOneMessage) {
  auto sd = additive_state();
  sd[0].second = torch::ones({8, 3});
  sd[1].second = sd[1].second.to(torch::kHalf);
  sd.pop_back();
  sd.emplace_back("bogus", torch::ones({1}));
  const auto message = load_error(sd);
  EXPECT_THAT(message, AllOf(HasSubstr("W_k.weight (file Float [8, 3], module Float [8, 2])"),
                             HasSubstr("W_q.weight (file Half [8, 20], module Float [8, 20])"),
                             HasSubstr("missing keys (1): w_v.weight"),
                             HasSubstr("unexpected keys (1): bogus")));
}

TEST(StateDictErrors, NonStrictStillRefusesShapeAndDtype) {
  auto sd = additive_state();
  sd.pop_back();
  sd[1].second = torch::ones({8, 21});
  const auto message = load_error(sd, /*strict=*/false);
  EXPECT_THAT(message, HasSubstr("W_q.weight (file Float [8, 21], module Float [8, 20])"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("missing")));
}

TEST(StateDictErrors, FileErrorsNameThePath) {
  d2l::AdditiveAttention model(2, 20, 8, 0.0);
  const std::string missing = ::testing::TempDir() + "d2l_no_such_state_dict.pt";
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, missing); }),
              StartsWith("d2l::load_state_dict: " + missing + ": cannot open the file"));
  EXPECT_THAT(error_message([&] { d2l::read_state_dict(missing); }),
              StartsWith("d2l::read_state_dict: " + missing + ": cannot open"));
  // A file from another module: the path and the keys are in the message.
  const auto path = fixture_path("state_mha_torch113.pt");
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, path); }),
              AllOf(StartsWith("d2l::load_state_dict: " + path + ": the state dict does not fit"),
                    HasSubstr("W_o.weight")));
}

std::string read_error(const std::string& bytes) {
  std::istringstream in(bytes);
  return error_message([&] { d2l::read_state_dict(in); });
}

TEST(StateDictErrors, LegacyFormatAsksForAResave) {
  EXPECT_THAT(read_error(read_bytes(fixture_path("state_legacy_torch113.pt"))),
              AllOf(StartsWith("d2l::read_state_dict: <stream>: "), HasSubstr("legacy"),
                    HasSubstr("_use_new_zipfile_serialization=True")));
}

TEST(StateDictErrors, NotAZip) {
  EXPECT_THAT(read_error(""), HasSubstr("not a zip archive"));
  EXPECT_THAT(read_error("hello, world"), HasSubstr("not a zip archive"));
  EXPECT_THAT(read_error("PK\x03\x04 and then nothing that ends a zip archive"), HasSubstr("no end of central directory"));
}

// A zip holding `pkl` as archive/data.pkl and `records` as archive/data/<i>.
std::string archive(const std::string& pkl, const std::vector<std::string>& records = {},
                    const std::string& byteorder = "little") {
  std::ostringstream out;
  const d2l::serialize::Source source{"test", "<bytes>"};
  d2l::serialize::ZipWriter zip(out, source);
  zip.add("archive/data.pkl", pkl);
  zip.add("archive/byteorder", byteorder);
  for (size_t i = 0; i < records.size(); ++i)
    zip.add("archive/data/" + std::to_string(i), records[i]);
  zip.finish();
  return out.str();
}

// BINUNICODE of `s`.
std::string binunicode(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xFF));
  return out + s;
}

TEST(StateDictErrors, BadPicklesAreNamed) {
  EXPECT_THAT(read_error(archive(std::string("\x80\x02\xff", 3))),
              HasSubstr("data.pkl: unsupported opcode 0xff (opcode at offset 2)"));
  EXPECT_THAT(read_error(archive("\x80\x02"
                                 "cbuiltins\neval\n.")),
              HasSubstr("global 'builtins.eval' is not allowed"));
  EXPECT_THAT(read_error(archive("\x80\x02"
                                 "cos\nsystem\n.")),
              HasSubstr("global 'os.system' is not allowed"));
  EXPECT_THAT(read_error(archive("\x80\x02K\x05.")),
              HasSubstr("data.pkl holds a value of type int, not a dict"));
  EXPECT_THAT(read_error(archive("\x80\x02}K\x01K\x02s.")),
              HasSubstr("a state_dict key has type int"));
  EXPECT_THAT(read_error(archive("\x80\x02}" + binunicode("a") + "K\x02s.")),
              HasSubstr("the value of 'a' has type int, not tensor"));
  EXPECT_THAT(read_error(archive("\x80\x02}")), HasSubstr("truncated"));
  EXPECT_THAT(read_error(archive("\x80\x02X\xff\xff\xff\x7f")), HasSubstr("truncated"));
  EXPECT_THAT(read_error(archive("\x80\x02h\x09.")), HasSubstr("memo key 9 was never stored"));
  EXPECT_THAT(read_error(archive("\x80\x02t.")), HasSubstr("no MARK"));
  EXPECT_THAT(read_error(archive("\x80\x02" "ctorch\nFloatStorage\n)R.")),
              HasSubstr("cannot be called"));
}

// A pickle of {"w": _rebuild_tensor_v2(storage "0" of `numel` floats, offset, sizes, strides)}.
std::string tensor_pickle(int numel, int offset, const std::string& sizes,
                          const std::string& strides) {
  const std::string ordered_dict = "ccollections\nOrderedDict\n)R";
  return "\x80\x02" + ordered_dict + "(" + binunicode("w") +
         "ctorch._utils\n_rebuild_tensor_v2\n((" + binunicode("storage") +
         "ctorch\nFloatStorage\n" + binunicode("0") + binunicode("cpu") + "K" +
         static_cast<char>(numel) + "tQK" + static_cast<char>(offset) + "(" + sizes + "t(" +
         strides + "t\x89" + ordered_dict + "tRu.";
}

TEST(StateDictErrors, StoragesAreCheckedBeforeAnyView) {
  const std::string four_floats(16, '\0');
  // The well-formed case reads, so the failures below are the checks' doing.
  const auto good = d2l::read_state_dict(*std::make_unique<std::istringstream>(
      archive(tensor_pickle(4, 0, "K\x02K\x02", "K\x02K\x01"), {four_floats})));
  ASSERT_EQ(good.size(), 1u);
  EXPECT_EQ(good[0].second.sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 0, "K\x02K\x03", "K\x03K\x01"), {four_floats})),
              HasSubstr("does not fit in storage '0' of 4 elements"));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 1, "K\x04", "K\x01"), {four_floats})),
              HasSubstr("does not fit in storage"));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 5, "K\x01", "K\x01"), {four_floats})),
              HasSubstr("storage offset 5 is outside storage '0' of 4 elements"));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 0, "K\x02", "K\x01K\x01"), {four_floats})),
              HasSubstr("1 sizes and 2 strides"));
  EXPECT_THAT(
      read_error(archive(tensor_pickle(5, 0, "K\x02", "K\x01"), {four_floats})),
      HasSubstr("storage record 'archive/data/0' holds 16 bytes, too few for 5 elements of Float"));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 0, "K\x02", "K\x01"))),
              HasSubstr("storage record 'archive/data/0' is missing"));
  EXPECT_THAT(read_error(archive(tensor_pickle(4, 0, "K\x02", "K\x01"), {four_floats}, "big")),
              HasSubstr("byteorder 'big' is not supported"));
}

// Offsets of the first central directory header of `bytes`.
size_t central_header(const std::string& bytes) { return bytes.find("PK\x01\x02"); }

TEST(StateDictErrors, ZipStructureIsChecked) {
  const auto good = read_bytes(fixture_path("state_additive_torch211.pt"));
  auto compressed = good;
  compressed[central_header(good) + 10] = 8;  // method: deflate
  EXPECT_THAT(read_error(compressed), HasSubstr("is compressed (method 8)"));
  auto huge = good;
  for (int i = 20; i < 28; ++i) huge[central_header(good) + i] = '\x7f';  // sizes
  EXPECT_THAT(read_error(huge), HasSubstr("out of bounds"));
  auto far = good;
  for (int i = 42; i < 46; ++i) far[central_header(good) + i] = '\x7e';  // local header offset
  EXPECT_THAT(read_error(far), HasSubstr("no local header"));
  const d2l::serialize::Source source{"test", "<bytes>"};
  const d2l::serialize::ZipReader zip(good, source);
  auto corrupt = good;
  corrupt[zip.find("state_additive_torch211/data/0")->data_offset + 3] ^= 0x40;
  EXPECT_THAT(read_error(corrupt),
              HasSubstr("entry 'state_additive_torch211/data/0' is corrupt: CRC-32"));
}

// Every prefix (every 97th length) of a real file, and every single-byte flip
// of it, is either read or refused with a c10::Error; nothing crashes.
TEST(StateDictErrors, CorruptedFilesNeverCrash) {
  for (const char* file : {"state_additive_torch113.pt", "state_dtypes_torch211.pt",
                           "state_dtypes_proto4_torch113.pt"}) {
    const auto good = read_bytes(fixture_path(file));
    for (size_t n = 0; n < good.size(); n += 97) {
      EXPECT_FALSE(read_error(good.substr(0, n)).empty()) << file << " cut at " << n;
    }
    const d2l::serialize::Source source{"test", "<bytes>"};
    const d2l::serialize::ZipReader zip(good, source);
    std::vector<bool> in_record(good.size(), false);
    for (const auto& e : zip.entries()) {
      // The records the reader uses; the others (version, serialization_id)
      // are never read, so their bytes cannot matter.
      const bool used = e.name.find("/data/") != std::string::npos ||
                        e.name.find("/data.pkl") != std::string::npos ||
                        e.name.find("/byteorder") != std::string::npos;
      if (!used) continue;
      for (uint64_t i = e.data_offset; i < e.data_offset + e.size; ++i) in_record[i] = true;
    }
    for (size_t i = 0; i < good.size(); ++i) {
      auto bad = good;
      bad[i] = static_cast<char>(~bad[i]);
      std::istringstream in(bad);
      bool refused = false;
      try {
        for (const auto& [key, t] : d2l::read_state_dict(in)) ASSERT_TRUE(t.defined()) << key;
      } catch (const c10::Error&) {
        refused = true;
      }
      // The CRCs refuse every flip inside a record that is read.
      if (in_record[i]) {
        EXPECT_TRUE(refused) << file << " flipped at " << i;
      }
    }
  }
}

TEST(StateDictErrors, FifosAndDirectoriesAreRefusedWithoutBlocking) {
  using d2l::testing::FifoWatchdog;
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("d2l_state_dict_fifo_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto fifo = (dir / "model.pt").string();
  d2l::testing::make_fifo(fifo);
  d2l::AdditiveAttention model(2, 20, 8, 0.0);
  {
    FifoWatchdog watchdog(fifo, FifoWatchdog::Side::kReader);
    EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, fifo); }),
                StartsWith("d2l::load_state_dict: " + fifo +
                           ": cannot read the file: it is a FIFO (named pipe)"));
    EXPECT_FALSE(watchdog.finish()) << "the FIFO's reader blocked";
  }
  {
    FifoWatchdog watchdog(fifo, FifoWatchdog::Side::kReader);
    EXPECT_THAT(
        error_message([&] { d2l::read_state_dict(fifo); }),
        StartsWith("d2l::read_state_dict: " + fifo + ": cannot read the file: it is a FIFO"));
    EXPECT_FALSE(watchdog.finish()) << "the FIFO's reader blocked";
  }
  {
    FifoWatchdog watchdog(fifo, FifoWatchdog::Side::kWriter);
    EXPECT_THAT(
        error_message([&] { d2l::save_state_dict(*model, fifo); }),
        StartsWith("d2l::save_state_dict: " + fifo +
                   ": cannot write the file: it is a FIFO (named pipe) that no process reads"));
    EXPECT_FALSE(watchdog.finish()) << "the FIFO's writer blocked";
  }
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, dir.string()); }),
              HasSubstr("cannot read the file: it is a directory"));
  EXPECT_THAT(error_message([&] { d2l::save_state_dict(*model, dir.string()); }),
              HasSubstr("cannot write the file: it is a directory"));
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*model, "/dev/zero"); }),
              HasSubstr("/dev/zero: cannot read the file: it is a character device"));
  std::filesystem::remove_all(dir);
}

TEST(StateDictErrors, WriterRefusesWhatTorchLoadCouldNotRead) {
  std::ostringstream out;
  EXPECT_THAT(error_message([&] {
                d2l::write_state_dict({{"a", torch::ones(1)}, {"a", torch::ones(1)}}, out);
              }),
              HasSubstr("d2l::write_state_dict: <stream>: key 'a' appears twice"));
  EXPECT_THAT(error_message([&] {
                d2l::write_state_dict({{"c", torch::ones(1, torch::kComplexFloat)}}, out);
              }),
              HasSubstr("tensor 'c' is ComplexFloat"));
  EXPECT_THAT(error_message([&] {
                d2l::write_state_dict({{"u", torch::Tensor()}}, out);
              }),
              HasSubstr("tensor 'u' is undefined"));
}

}  // namespace
