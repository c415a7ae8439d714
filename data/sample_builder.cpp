#include "data/sample_builder.h"

#include <algorithm>

namespace vlm::data {
namespace {

// Merged tokens of each image: t*gh*gw/m^2 (m: the merge size it was patchified with).
std::vector<int64_t> image_token_counts(const RecordImages& images, size_t n) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i) {
    const PixelImage& im = images.images[i];
    const auto& g = im.grid_thw;
    out.push_back(vlm::merged_image_tokens(g[0], g[1], g[2], im.merge_size));
  }
  return out;
}

// Fills pixel_values/grid_thw from the first n images.
void attach_images(vlm::TokenizedSample& s, const RecordImages& images, size_t n) {
  std::vector<torch::Tensor> parts;
  for (size_t i = 0; i < n; ++i) {
    const PixelImage& im = images.images[i];
    const auto& g = im.grid_thw;
    VLM_CHECK(im.pixel_values.defined() && im.pixel_values.dim() == 2 &&
                  im.pixel_values.size(0) == g[0] * g[1] * g[2],
              "image ", i, ": pixel_values rows must equal t*gh*gw = ", g[0] * g[1] * g[2],
              ", got ", im.pixel_values.defined() ? im.pixel_values.sizes() : c10::IntArrayRef{},
              " (hint: build images with process_image / load_record_images)");
    parts.push_back(im.pixel_values);
    s.grid_thw.push_back(g);
  }
  if (!parts.empty()) s.pixel_values = parts.size() == 1 ? parts[0] : torch::cat(parts, 0);
}

}  // namespace

std::string chatml_role(const std::string& role) {
  if (role == "human") return "user";
  if (role == "gpt" || role == "model") return "assistant";
  return role;
}

std::vector<vlm::ChatTurn> record_chat_turns(const Record& r, int64_t n_turns) {
  const size_t n = n_turns < 0 ? r.turns.size() : std::min(r.turns.size(), size_t(n_turns));
  const std::string marker = kImageMarker;
  std::vector<vlm::ChatTurn> out;
  for (size_t t = 0; t < n; ++t) {
    vlm::ChatTurn ct;
    ct.role = chatml_role(r.turns[t].role);
    const std::string& c = r.turns[t].content;
    size_t at = 0;
    for (size_t pos = c.find(marker); pos != std::string::npos; pos = c.find(marker, at)) {
      if (pos > at) ct.content.push_back(vlm::ChatItem::Text(c.substr(at, pos - at)));
      ct.content.push_back(vlm::ChatItem::Image());
      at = pos + marker.size();
    }
    if (at < c.size()) ct.content.push_back(vlm::ChatItem::Text(c.substr(at)));
    out.push_back(std::move(ct));
  }
  return out;
}

vlm::ChatOptions chat_options(const SampleOptions& opts, bool generation) {
  vlm::ChatOptions co;
  co.default_system = opts.default_system;
  co.chat_template = opts.chat_template;
  if (opts.system_prompt == kNoSystemTurn) co.default_system.clear();
  else if (!opts.system_prompt.empty()) co.default_system = opts.system_prompt;
  co.add_generation_prompt = generation;
  co.supervise_assistant = !generation;
  return co;
}

vlm::TokenizedSample build_sample(const vlm::Tokenizer& tok, const Record& record,
                                  const RecordImages& images, const SampleOptions& opts,
                                  int64_t index) {
  VLM_CHECK(images.images.size() == record.images.size(), record.location(), ": record has ",
            record.images.size(), " image(s) but ", images.images.size(),
            " processed image(s) were given (hint: load_record_images(record, ...))");
  VLM_CHECK(opts.max_length >= 0, "sample max_length must be >= 0, got ", opts.max_length);
  const auto turns = record_chat_turns(record);
  const size_t n_images = images.images.size();
  vlm::RenderedChat rc =
      vlm::render_chat(tok, turns, image_token_counts(images, n_images), chat_options(opts));

  vlm::TokenizedSample s;
  s.index = index;
  size_t keep_images = n_images;
  const int64_t len = int64_t(rc.input_ids.size());
  if (opts.max_length > 0 && len > opts.max_length) {
    const int64_t cut = opts.max_length;
    keep_images = 0;
    for (size_t i = 0; i < rc.image_spans.size(); ++i) {
      const auto& sp = rc.image_spans[i];
      if (cut > sp.begin && cut < sp.begin + sp.length)
        throw SampleSkip("cut inside image",
                         vlm::str(record.location(), ": truncating ", len, " tokens to ", cut,
                                  " would cut inside image ", i, " (tokens ", sp.begin, "..",
                                  sp.begin + sp.length, "); the sample is skipped (hint: raise "
                                  "data.max_seq_len or lower data.max_image_tokens)"));
      if (sp.begin + sp.length <= cut) keep_images = i + 1;
    }
    rc.input_ids.resize(size_t(cut));
    rc.labels.resize(size_t(cut));
  }
  const bool supervised = std::any_of(rc.labels.begin(), rc.labels.end(),
                                      [](int64_t l) { return l != vlm::kIgnoreIndex; });
  if (!supervised)
    throw SampleSkip("no supervised tokens",
                     vlm::str(record.location(), ": no assistant token is left to supervise (",
                              len, " tokens", opts.max_length > 0 && len > opts.max_length
                                  ? vlm::str(", cut to ", opts.max_length) : std::string(),
                              "); the sample is skipped (hint: the answer must fit in "
                              "data.max_seq_len)"));
  s.input_ids = std::move(rc.input_ids);
  s.labels = std::move(rc.labels);
  attach_images(s, images, keep_images);
  return s;
}

vlm::TokenizedSample load_sample(const vlm::Tokenizer& tok, const Record& record,
                                 const PixelConfig& cfg, const SampleOptions& opts,
                                 int64_t index, const std::vector<vlm::ImageSize>& targets) {
  return build_sample(tok, record, load_record_images(record, cfg, targets), opts, index);
}

int64_t generation_prompt_turns(const Record& record) {
  for (int64_t t = int64_t(record.turns.size()) - 1; t >= 0; --t)
    if (chatml_role(record.turns[size_t(t)].role) == "assistant") return t;
  return int64_t(record.turns.size());
}

GenerationPrompt build_generation_prompt(const vlm::Tokenizer& tok, const Record& record,
                                         const RecordImages& images, const SampleOptions& opts,
                                         int64_t index) {
  VLM_CHECK(images.images.size() == record.images.size(), record.location(), ": record has ",
            record.images.size(), " image(s) but ", images.images.size(),
            " processed image(s) were given (hint: load_record_images(record, ...))");
  const int64_t n_turns = generation_prompt_turns(record);
  const auto turns = record_chat_turns(record, n_turns);
  size_t n_images = 0;  // markers are in image order: the prompt uses the first ones
  for (const auto& t : turns)
    for (const auto& it : t.content) n_images += it.kind == vlm::ChatItem::Kind::kImage;
  VLM_CHECK(n_images <= images.images.size(), record.location(), ": prompt has ", n_images,
            " image marker(s) but the record has ", images.images.size(), " image(s)");
  vlm::RenderedChat rc = vlm::render_chat(tok, turns, image_token_counts(images, n_images),
                                          chat_options(opts, /*generation=*/true));
  GenerationPrompt g;
  g.sample.index = index;
  g.sample.input_ids = std::move(rc.input_ids);
  g.sample.labels.assign(g.sample.input_ids.size(), vlm::kIgnoreIndex);
  attach_images(g.sample, images, n_images);
  g.references = generation_references(record);
  return g;
}

std::vector<std::string> generation_references(const Record& record) {
  std::vector<std::string> refs;
  for (const std::string& a : record.answers)  // plain records may repeat "text" in "answers"
    if (std::find(refs.begin(), refs.end(), a) == refs.end()) refs.push_back(a);
  const int64_t n_turns = generation_prompt_turns(record);
  if (refs.empty() && n_turns < int64_t(record.turns.size()))
    refs.push_back(record.turns[size_t(n_turns)].content);
  return refs;
}

}  // namespace vlm::data
