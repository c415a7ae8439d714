// Writes the seed corpora of the fuzz targets: small valid inputs of each kind, made with
// our own writers so they track the formats. Run by the build (target fuzz_corpus) or by
// scripts/fuzz.sh:
//   fuzz_seeds <out_dir> <source_dir>   ->  <out_dir>/<kind>/<name> for every target kind
// Nothing here is committed: the corpora are generated into the build tree.
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "app/config/recipe.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/vlm/text/tokenizer_tiny_bpe.h"
#include "vlm/model/config.h"
#include "vlm/io/safetensors.h"

namespace fs = std::filesystem;

namespace {

std::string g_out;

void seed(const std::string& kind, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_out + "/" + kind);
  std::ofstream out(g_out + "/" + kind + "/" + name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) throw std::runtime_error("cannot write seed " + kind + "/" + name);
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void safetensors_seeds() {
  seed("safetensors", "empty", vlm::serialize_safetensors({}));
  seed("safetensors", "f32_bf16_i64",
       vlm::serialize_safetensors({{"a", torch::arange(6, torch::kFloat).view({2, 3})},
                                   {"b", torch::ones({3}, torch::kBFloat16)},
                                   {"c", torch::tensor({int64_t(7)})}},
                                  {std::nullopt, {{"format", "pt"}}}));
  seed("safetensors", "all_dtypes",
       vlm::serialize_safetensors({{"f64", torch::ones({1}, torch::kDouble)},
                                   {"f16", torch::ones({2}, torch::kHalf)},
                                   {"i32", torch::ones({1}, torch::kInt)},
                                   {"i16", torch::ones({1}, torch::kShort)},
                                   {"i8", torch::ones({1}, torch::kChar)},
                                   {"u8", torch::ones({2, 0}, torch::kByte)},
                                   {"bool", torch::ones({1}, torch::kBool)},
                                   {"scalar", torch::tensor(3.0f)}}));
  // Misaligned data (a foreign writer without padding): header length 1 + 8 not aligned.
  std::string h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string img(8, '\0');
  uint64_t n = h.size();
  std::memcpy(img.data(), &n, 8);
  seed("safetensors", "misaligned", img + h + std::string("\0\0\x80?\0\0\0@", 8));
}

void hf_index_seeds() {
  seed("hf_index", "ok",
       R"({"metadata": {"total_size": 112}, "weight_map": {)"
       R"("model.embed_tokens.weight": "model-00001-of-00002.safetensors", )"
       R"("visual.patch_embed.proj.weight": "model-00001-of-00002.safetensors", )"
       R"("lm_head.weight": "model-00002-of-00002.safetensors"}})");
  seed("hf_index", "nested_names",
       R"({"weight_map": {"model.language_model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})");
  seed("hf_index", "float_size",
       R"({"metadata": {"total_size": 1.5e2}, "weight_map": {"lm_head.weight": "sub/../model-00002-of-00002.safetensors"}})");
}

void config_seeds() {
  for (const auto& name : vlm::preset_names())
    seed("config_json", name + ".json", vlm::to_hf_json(vlm::preset(name)).dump(2));
  // Newer layout: text fields under text_config, rope_parameters.
  nlohmann::json j = vlm::to_hf_json(vlm::preset("tiny-qwen2.5"));
  nlohmann::json text = nlohmann::json::object();
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "rms_norm_eps"}) {
    text[k] = j[k];
    j.erase(k);
  }
  text["rope_parameters"] = j["rope_scaling"];
  j.erase("rope_scaling");
  j["text_config"] = text;
  seed("config_json", "text_config.json", j.dump(2));
}

void tokenizer_seeds() {
  const std::string json = vlm::test::make_tiny_model(true).j.dump();
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"hello", "hello world"},
           {"chat", "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"},
           {"unicode", "안녕 12 aaaaaaaa Ġ \n\n  ing\xc3\xa9"},
           {"empty", ""}})
    seed("tokenizer_json", name, vlm::fuzz::join2(text, json));
  seed("tokenizer_json", "no_vision", vlm::fuzz::join2("abab the", vlm::test::make_tiny_model(false).j.dump()));
}

void recipe_seeds(const std::string& src) {
  for (const auto& e : fs::directory_iterator(src + "/recipes"))
    if (e.path().extension() == ".toml") seed("recipe_toml", e.path().filename().string(), read(e.path()));
  seed("recipe_toml", "minimal.toml", "[model]\npreset = \"tiny\"\n[data]\ntrain = [\"a.jsonl\"]\n");
}

void jsonl_seeds() {
  seed("jsonl_record", "messages.jsonl",
       R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "Read it."}]}, {"role": "assistant", "content": "hello"}]})"
       "\n"
       R"({"messages": [{"role": "user", "content": "<image>What?"}, {"role": "assistant", "content": "x"}], "images": ["b.jpg"]})"
       "\n");
  seed("jsonl_record", "llava.jsonl",
       R"({"image": "c.png", "conversations": [{"from": "human", "value": "<image>\nRead"}, {"from": "gpt", "value": "text"}]})"
       "\r\n\n"
       R"({"images": ["d.png", "e.png"], "conversations": [{"from": "human", "value": "<image><image>two"}, {"from": "gpt", "value": "ok"}]})"
       "\n");
  seed("jsonl_record", "plain.jsonl",
       R"({"image": "f.png", "text": "line of text"})" "\n" R"({"images": ["g.png"], "answers": ["a", "b"]})" "\n");
  seed("jsonl_record", "bad.jsonl", "{not json}\n[1,2]\n{\"messages\": []}\n");
  // JSON arrays (data/record_reader.h): LLaMA-Factory sharegpt / alpaca, ms-swift base64.
  seed("jsonl_record", "lf_array.json",
       R"([{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "<image>q"}, {"from": "gpt", "value": "a"}], "images": ["h.png"]},)"
       "\n"
       R"( {"instruction": "<image>Read.", "input": "more", "output": "x", "history": [["q", "a"]], "images": ["i.png"]}])");
  seed("jsonl_record", "swift_array.json",
       R"([{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}, {"type": "text", "text": "Read."}]}, {"role": "assistant", "content": "x"}]},)"
       R"( {"messages": [{"role": "user", "content": "<image>q"}, {"role": "assistant", "content": "a"}], "images": ["data:image/png;base64,@@"]}, 42, "s]"])");
}

void image_seeds() {
  cv::Mat bgr(37, 53, CV_8UC3);
  cv::randu(bgr, 0, 255);
  cv::Mat gray, bgra, small(5, 7, CV_8UC3, cv::Scalar(10, 200, 30));
  cv::cvtColor(bgr, gray, cv::COLOR_BGR2GRAY);
  cv::cvtColor(bgr, bgra, cv::COLOR_BGR2BGRA);
  cv::Mat u16;
  bgr.convertTo(u16, CV_16UC3, 257.0);
  auto enc = [](const std::string& ext, const cv::Mat& m, std::vector<int> params = {}) {
    std::vector<uint8_t> buf;
    if (!cv::imencode(ext, m, buf, params)) throw std::runtime_error("imencode " + ext);
    return std::string(buf.begin(), buf.end());
  };
  seed("image_decode", "rgb.png", enc(".png", bgr));
  seed("image_decode", "gray.png", enc(".png", gray));
  seed("image_decode", "rgba.png", enc(".png", bgra));
  seed("image_decode", "u16.png", enc(".png", u16));
  seed("image_decode", "small.jpg", enc(".jpg", small, {cv::IMWRITE_JPEG_QUALITY, 50}));
  seed("image_decode", "rgb.jpg", enc(".jpg", bgr, {cv::IMWRITE_JPEG_QUALITY, 50}));
  seed("image_decode", "rgb.webp", enc(".webp", bgr, {cv::IMWRITE_WEBP_QUALITY, 50}));
  seed("image_decode", "lossless.webp", enc(".webp", small, {cv::IMWRITE_WEBP_QUALITY, 101}));
  seed("image_decode", "rgb.bmp", enc(".bmp", small));
  seed("image_decode", "rgb.tiff", enc(".tiff", small));
  seed("image_decode", "gray.pgm", enc(".pgm", gray));
  // A JPEG with an Exif APP1 segment (orientation 6) spliced in after SOI.
  std::string jpg = enc(".jpg", small);
  const std::string tiff("MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0", 26);
  std::string app1 = "Exif" + std::string(2, '\0') + tiff;
  std::string seg = "\xff\xe1";
  seg += char((app1.size() + 2) >> 8);
  seg += char((app1.size() + 2) & 0xff);
  seed("image_decode", "exif6.jpg", jpg.substr(0, 2) + seg + app1 + jpg.substr(2));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_seeds <out_dir> <source_dir>\n";
    return 2;
  }
  g_out = argv[1];
  try {
    safetensors_seeds();
    hf_index_seeds();
    config_seeds();
    tokenizer_seeds();
    recipe_seeds(argv[2]);
    jsonl_seeds();
    image_seeds();
  } catch (const std::exception& e) {
    std::cerr << "fuzz_seeds: " << e.what() << "\n";
    return 1;
  }
  std::cout << "fuzz_seeds: wrote seed corpora under " << g_out << "\n";
  return 0;
}
