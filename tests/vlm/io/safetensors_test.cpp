// safetensors reader/writer: round trips, an independent hand-built reference file, the
// malformed-file table, zero-copy views, and truncation/mutation robustness.
#include "vlm/io/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <random>

#include "tests/testing.h"
#include "vlm/runtime/check.h"

namespace {

using json = nlohmann::json;

// An independent, straightforward encoder: 8-byte LE length + header text + data.
std::string raw_file(const std::string& header, const std::string& data, std::optional<uint64_t> len = {}) {
  uint64_t n = len ? *len : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  torch::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Random tensor with arbitrary bit patterns (NaN payloads included) for every dtype.
torch::Tensor random_bits(torch::ScalarType dt, std::vector<int64_t> shape, int64_t seed) {
  torch::manual_seed(seed);
  if (dt == torch::kBool) return torch::randint(0, 2, shape).to(torch::kBool);
  int64_t n = 1;
  for (auto d : shape) n *= d;
  torch::Tensor bytes = torch::randint(0, 256, {n * int64_t(vlm::st_dtype_size(dt))}, torch::kByte);
  return bytes.view(dt).reshape(shape);
}

void expect_error(const std::function<void()>& f, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": expected vlm::Error containing \"" << needle << "\", nothing thrown";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

TEST(SafetensorsDtype, NamesSizesAndRejection) {
  const std::vector<std::tuple<const char*, torch::ScalarType, size_t>> table = {
      {"F64", torch::kDouble, 8}, {"F32", torch::kFloat, 4}, {"F16", torch::kHalf, 2},
      {"BF16", torch::kBFloat16, 2}, {"I64", torch::kLong, 8}, {"I32", torch::kInt, 4},
      {"I16", torch::kShort, 2}, {"I8", torch::kChar, 1}, {"U8", torch::kByte, 1}, {"BOOL", torch::kBool, 1}};
  for (const auto& [name, dt, size] : table) {
    EXPECT_EQ(vlm::st_dtype_from_name(name), dt) << name;
    EXPECT_EQ(vlm::st_dtype_name(dt), name);
    EXPECT_EQ(vlm::st_dtype_size(dt), size) << name;
    EXPECT_EQ(vlm::st_dtype_size(dt), torch::elementSize(dt)) << name;
  }
  expect_error([] { vlm::st_dtype_from_name("F8_E4M3"); }, "expected one of F64", "unknown dtype");
  expect_error([] { vlm::st_dtype_name(torch::kComplexFloat); }, "cannot be stored", "complex dtype");
}

// A file built byte by byte (independent of the writer) reads back the intended values.
TEST(SafetensorsRead, HandBuiltReferenceFile) {
  // F32 [2] = {1.0, -2.0} (0x3F800000, 0xC0000000), I16 [] = 0x1234 = 4660, U8 [3] = {1,2,255}.
  std::string data;
  const unsigned char f32[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0};
  const unsigned char i16[] = {0x34, 0x12};
  const unsigned char u8[] = {1, 2, 255};
  data.append(reinterpret_cast<const char*>(f32), 8);
  data.append(reinterpret_cast<const char*>(i16), 2);
  data.append(reinterpret_cast<const char*>(u8), 3);
  std::string header = R"({"b":{"dtype":"I16","shape":[],"data_offsets":[8,10]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("c":{"dtype":"U8","shape":[3],"data_offsets":[10,13]},)"
                       R"("__metadata__":{"format":"pt"}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // aligned data start
  auto f = vlm::SafetensorsFile::from_bytes(raw_file(header, data), "hand.safetensors");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c"}));  // data order
  EXPECT_EQ(f.metadata().at("format"), "pt");
  torch::Tensor a = f.get("a");
  ASSERT_EQ(a.scalar_type(), torch::kFloat);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(a[0].item<float>(), 1.0f);
  EXPECT_EQ(a[1].item<float>(), -2.0f);
  torch::Tensor b = f.get("b");
  EXPECT_EQ(b.dim(), 0);
  EXPECT_EQ(b.item<int16_t>(), 4660);
  torch::Tensor c = f.get("c");
  EXPECT_EQ(c[2].item<uint8_t>(), 255);
  EXPECT_EQ(f.get("a", torch::kDouble)[1].item<double>(), -2.0);
  expect_error([&] { f.info("zzz"); }, "no tensor named \"zzz\"", "absent name");
}

// Every dtype, shapes 0-d / zero-size / n-d, through a file and through a buffer.
TEST(SafetensorsRoundTrip, EveryDtypeBitIdentical) {
  const std::vector<torch::ScalarType> dtypes = {torch::kDouble, torch::kFloat, torch::kHalf, torch::kBFloat16,
                                                 torch::kLong,   torch::kInt,   torch::kShort, torch::kChar,
                                                 torch::kByte,   torch::kBool};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3, 0, 2}, {5}, {2, 3, 4}, {7, 1}};
  vlm::NamedTensors tensors;
  int64_t seed = 1;
  for (auto dt : dtypes)
    for (const auto& s : shapes) tensors.emplace_back(vlm::str(vlm::st_dtype_name(dt), "/", s.size(), "/", seed), random_bits(dt, s, seed++));
  // A non-contiguous input is written contiguous.
  torch::Tensor base = torch::arange(12, torch::kFloat).reshape({3, 4});
  tensors.emplace_back("transposed", base.t());

  vlm::test::TempDir tmp("st");
  const std::string path = tmp / "all.safetensors";
  vlm::SafetensorsWriteOptions opts;
  opts.metadata = {{"format", "pt"}, {"note", "round trip"}};
  vlm::save_safetensors(path, tensors, opts);
  std::string on_disk = vlm::test::read_file(path);
  EXPECT_EQ(on_disk, vlm::serialize_safetensors(tensors, opts));

  for (int via = 0; via < 2; ++via) {
    auto f = via == 0 ? vlm::SafetensorsFile::open(path) : vlm::SafetensorsFile::from_bytes(on_disk);
    ASSERT_EQ(f.tensors().size(), tensors.size());
    EXPECT_EQ(f.metadata(), opts.metadata);
    for (const auto& [name, t] : tensors) {
      torch::Tensor r = f.get(name);
      EXPECT_TRUE(same_bytes(r, t)) << name << " via " << via;
      EXPECT_EQ(r.sizes(), t.sizes()) << name;
    }
  }

  // Independent check of the layout: hand-parse the header, verify padding and alignment.
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(on_disk[i])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "header padded to 8 bytes";
  std::string text = on_disk.substr(8, n);
  EXPECT_EQ(text.find_last_not_of(' ') + 1, text.find_last_of('}') + 1) << "padding is spaces";
  json h = json::parse(text);
  uint64_t total = 0;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    size_t es = vlm::st_dtype_size(vlm::st_dtype_from_name(it.value()["dtype"]));
    EXPECT_EQ(b % es, 0u) << it.key() << " aligned to its element size";
    total += e - b;
  }
  EXPECT_EQ(8 + n + total, on_disk.size());
}

// Writer dtype conversion against an independent fp32 -> bf16 round-to-nearest-even.
TEST(SafetensorsWrite, FloatDtypeConversionMatchesBitFormula) {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({257}) * 100;
  torch::Tensor ids = torch::arange(5, torch::kLong);
  vlm::SafetensorsWriteOptions opts;
  opts.float_dtype = torch::kBFloat16;
  auto f = vlm::SafetensorsFile::from_bytes(vlm::serialize_safetensors({{"x", x}, {"ids", ids}}, opts));
  EXPECT_EQ(f.info("ids").dtype, torch::kLong) << "integer tensors keep their dtype";
  torch::Tensor y = f.get("x");
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  const float* xs = x.data_ptr<float>();
  const uint16_t* ys = static_cast<const uint16_t*>(y.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) {
    uint32_t u;
    std::memcpy(&u, &xs[i], 4);
    uint16_t want = uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    ASSERT_EQ(ys[i], want) << "element " << i << " value " << xs[i];
  }
}

TEST(SafetensorsWrite, RejectsBadNames) {
  torch::Tensor t = torch::zeros({1});
  expect_error([&] { vlm::serialize_safetensors({{"a", t}, {"a", t}}); }, "duplicate tensor name", "dup");
  expect_error([&] { vlm::serialize_safetensors({{"__metadata__", t}}); }, "reserved", "reserved");
  expect_error([&] { vlm::serialize_safetensors({{std::string("a\0b", 3), t}}); }, "NUL", "nul");
  expect_error([&] { vlm::serialize_safetensors({{"c", torch::zeros({1}, torch::kComplexFloat)}}); },
               "cannot be stored", "complex");
  vlm::test::TempDir tmp("stw");
  expect_error([&] { vlm::save_safetensors(tmp / "no/such/dir/x.safetensors", {{"a", t}}); }, "no/such/dir",
               "bad dir");
}

struct Bad {
  std::string what;
  std::string bytes;
  std::string needle;
};

std::vector<Bad> malformed_table() {
  const std::string ok_header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string d8(8, '\x01');
  const std::string d12(12, '\x01');
  auto one = [](const std::string& entry) { return "{\"a\":" + entry + "}"; };
  std::string bad_utf8 = R"({"a)" + std::string("\xff\xfe") + R"(":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  return {
      {"truncated below 8 bytes", std::string("\x10\x00\x00", 3), "truncated file"},
      {"empty file", "", "truncated file"},
      {"header length past EOF", raw_file(ok_header, d8, 1000), "runs past the end of the file"},
      {"huge header length", raw_file(ok_header, d8, uint64_t(1) << 40), "exceeds the limit"},
      {"header length just above limit", raw_file(ok_header, d8, vlm::kStMaxHeaderLen + 1), "exceeds the limit"},
      {"overlapping offsets",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d12),
       "overlaps the previous tensor"},
      {"gapped offsets",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", d12),
       "leaves a gap"},
      {"offsets not starting at 0", raw_file(one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), d8),
       "expected it to begin at 0"},
      {"shape x dtype size mismatch", raw_file(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), d8),
       "size mismatch"},
      {"trailing bytes after data", raw_file(ok_header, d8 + "xyzw"), "trailing bytes"},
      {"data shorter than offsets", raw_file(ok_header, "abc"), "the file is truncated"},
      {"duplicate names",
       raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8),
       "duplicate tensor name \"a\""},
      {"duplicate key inside an entry",
       raw_file(one(R"({"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]})"), d8), "duplicate key \"dtype\""},
      {"NUL in a name", raw_file(R"({"a\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
       "contains a NUL"},
      {"invalid JSON", raw_file(R"({"a":{"dtype":"F32",)", d8), "not valid UTF-8 JSON"},
      {"invalid UTF-8 in header", raw_file(bad_utf8, d8), "not valid UTF-8 JSON"},
      {"non-object header", raw_file("[1,2,3]", ""), "must be a JSON object"},
      {"entry not an object", raw_file(one("42"), ""), "entry must be an object"},
      {"bad dtype", raw_file(one(R"({"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]})"), "ab"),
       "unsupported safetensors dtype \"F8_E5M2\""},
      {"dtype not a string", raw_file(one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"), d8),
       "\"dtype\" must be a string"},
      {"missing data_offsets", raw_file(one(R"({"dtype":"F32","shape":[2]})"), d8), "missing \"data_offsets\""},
      {"negative shape dim", raw_file(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), d8),
       "must be a non-negative integer, found -2"},
      {"fractional shape dim", raw_file(one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"), d8),
       "must be a non-negative integer"},
      {"shape dim beyond int64", raw_file(one(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]})"), d8),
       "overflows int64"},
      {"shape product overflows u64",
       raw_file(one(R"({"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,8]})"), d8),
       "does not fit in 64 bits"},
      {"shape x dtype overflows bytes",
       raw_file(one(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]})"), d8),
       "overflows 64-bit byte count"},
      {"negative offset", raw_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"), d8),
       "data_offsets[0] must be a non-negative integer"},
      {"offsets not a pair", raw_file(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"), d8),
       "must be [begin, end]"},
      {"begin after end", raw_file(one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), d8), "begin > end"},
      {"metadata value not a string",
       raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
       "must be a string"},
      {"empty name", raw_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8), "empty tensor name"},
  };
}

TEST(SafetensorsRead, MalformedTableFromBuffer) {
  for (const auto& bad : malformed_table()) {
    expect_error([&] { vlm::SafetensorsFile::from_bytes(bad.bytes, "buf:" + bad.what); }, bad.needle, bad.what);
    expect_error([&] { vlm::parse_safetensors(bad.bytes.data(), bad.bytes.size(), "x"); }, bad.needle, bad.what);
  }
}

TEST(SafetensorsRead, MalformedTableFromFileNamesTheFile) {
  vlm::test::TempDir tmp("stbad");
  int i = 0;
  for (const auto& bad : malformed_table()) {
    const std::string path = tmp / vlm::str("bad", i++, ".safetensors");
    vlm::test::write_file(path, bad.bytes);
    expect_error([&] { vlm::SafetensorsFile::open(path); }, bad.needle, bad.what);
    expect_error([&] { vlm::SafetensorsFile::open(path); }, path, bad.what + " (file name)");
  }
  expect_error([&] { vlm::SafetensorsFile::open(tmp / "absent.safetensors"); }, "cannot open", "absent");
  expect_error([&] { vlm::SafetensorsFile::open(tmp.path()); }, "not a regular file", "directory");
}

// Every truncation and many random byte flips of a valid file: a clean vlm::Error or a
// successful parse, never a crash or a foreign exception.
TEST(SafetensorsRead, TruncationsAndMutationsNeverCrash) {
  vlm::NamedTensors ts = {{"w", torch::randn({3, 5})}, {"b", torch::arange(4, torch::kLong)}, {"s", torch::tensor(1.5)}};
  const std::string good = vlm::serialize_safetensors(ts, {{}, {{"k", "v"}}});
  for (size_t len = 0; len < good.size(); ++len) {
    std::string cut = good.substr(0, len);
    EXPECT_THROW(vlm::SafetensorsFile::from_bytes(cut), vlm::Error) << "prefix of length " << len;
  }
  std::mt19937 rng(7);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = good;
    int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) m[rng() % std::min<size_t>(m.size(), 8 + 200)] = char(rng() & 0xff);
    try {
      auto f = vlm::SafetensorsFile::from_bytes(m);
      for (const auto& name : f.names()) f.get(name).sum();  // every view must be readable
      ++parsed;
    } catch (const vlm::Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(parsed + rejected, 3000);
}

TEST(SafetensorsRead, ZeroCopyViewsIntoTheMapping) {
  vlm::test::TempDir tmp("stzc");
  const std::string path = tmp / "zc.safetensors";
  torch::Tensor w = torch::randn({64, 32});
  torch::Tensor h = torch::randn({10}).to(torch::kHalf);
  vlm::save_safetensors(path, {{"w", w}, {"h", h}});
  const std::string before = vlm::test::read_file(path);
  torch::Tensor view, as_double;
  {
    auto f = vlm::SafetensorsFile::open(path);
    EXPECT_EQ(f.mapped_size(), before.size());
    view = f.get("w");
    EXPECT_TRUE(f.owns_pointer(view.data_ptr())) << "matching dtype: a view into the mapping";
    EXPECT_TRUE(f.owns_pointer(static_cast<const char*>(view.data_ptr()) + view.nbytes() - 1));
    EXPECT_TRUE(f.owns_pointer(f.get("h").data_ptr()));
    as_double = f.get("w", torch::kDouble);
    EXPECT_FALSE(f.owns_pointer(as_double.data_ptr())) << "converted: a copy";
    EXPECT_FALSE(f.owns_pointer(w.data_ptr()));
  }
  // The file object is gone; the view keeps the mapping alive.
  EXPECT_TRUE(torch::equal(view, w));
  EXPECT_TRUE(torch::allclose(as_double, w.to(torch::kDouble)));
  // Writing into a view is copy-on-write: the file on disk does not change.
  view.mul_(2);
  EXPECT_TRUE(torch::equal(view, w * 2));
  EXPECT_EQ(vlm::test::read_file(path), before);
  EXPECT_TRUE(torch::equal(vlm::SafetensorsFile::open(path).get("w"), w));
}

// A foreign file whose F32 data starts at an odd address: read by copy, values intact.
TEST(SafetensorsRead, MisalignedDataIsCopied) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8 + 1, ' ');  // 8 + N == 1 (mod 8)
  const unsigned char f32[] = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0};
  auto f = vlm::SafetensorsFile::from_bytes(raw_file(header, std::string(reinterpret_cast<const char*>(f32), 8)));
  torch::Tensor a = f.get("a");
  EXPECT_FALSE(f.owns_pointer(a.data_ptr()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data_ptr()) % 4, 0u);
  EXPECT_EQ(a[0].item<float>(), 1.0f);
  EXPECT_EQ(a[1].item<float>(), -2.0f);
}

TEST(SafetensorsWrite, AtomicLeavesNoTempFilesAndReplaces) {
  vlm::test::TempDir tmp("stat");
  const std::string path = tmp / "x.safetensors";
  vlm::save_safetensors(path, {{"a", torch::ones({2})}});
  vlm::save_safetensors(path, {{"b", torch::zeros({3})}});
  auto f = vlm::SafetensorsFile::open(path);
  EXPECT_EQ(f.names(), std::vector<std::string>{"b"});
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(tmp.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1) << "no temp file left beside the output";
}

}  // namespace
