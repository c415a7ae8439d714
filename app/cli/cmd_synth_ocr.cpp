// `vlmtrain synth-ocr`: render a synthetic OCR dataset (+ a small sentencepiece model).
#include <cstdio>

#include "app/cli/commands.h"
#include "app/report/progress.h"
#include "data/synth_ocr.h"
#include "vlm/runtime/check.h"

namespace vlm::app {

namespace {

struct SynthOcrArgs {
  std::optional<std::string> out;  // --out DIR (required)
  std::optional<long long> train, val, seed, threads, vocab_size, min_height, max_height, cell_width;
  std::optional<std::string> layout, style, tokenizer_type;
  bool no_tokenizer = false;
};

int synth_ocr(const SynthOcrArgs& a) {
  vlm::data::SynthOcrOptions o;
  o.train_tokenizer = !a.no_tokenizer;
  VLM_CHECK(a.out.has_value(), "vlmtrain synth-ocr: --out DIR is required");
  o.out_dir = *a.out;
  if (a.train) o.train = *a.train;
  if (a.val) o.val = *a.val;
  if (a.seed) {
    VLM_CHECK(*a.seed >= 0, "vlmtrain synth-ocr: --seed must be >= 0, got ", *a.seed);
    o.seed = uint64_t(*a.seed);
  }
  if (a.threads) o.threads = std::max<long long>(1, *a.threads);
  if (a.vocab_size) o.vocab_size = *a.vocab_size;
  if (a.min_height) o.min_height = *a.min_height;
  if (a.max_height) o.max_height = *a.max_height;
  if (a.layout) o.layout = *a.layout;
  if (a.style) o.style = *a.style;
  if (a.cell_width) o.cell_width = *a.cell_width;
  if (a.tokenizer_type) o.tokenizer_type = *a.tokenizer_type;
  VLM_CHECK(o.min_height >= 8 && o.min_height <= o.max_height && o.max_height <= 1024,
            "vlmtrain synth-ocr: expected 8 <= --min-height <= --max-height <= 1024, got ",
            o.min_height, " and ", o.max_height);
  o.on_progress = part_progress("synth-ocr", "images");
  vlm::data::SynthOcrResult r = vlm::data::write_synth_ocr(o);
  std::printf("synth-ocr: wrote %lld train + %lld val images to %s in %.1f s\n",
              static_cast<long long>(r.train), static_cast<long long>(r.val), o.out_dir.c_str(),
              r.seconds);
  if (!r.tokenizer_model.empty())
    std::printf("synth-ocr: sentencepiece model %s with %lld pieces (target %lld)\n",
                r.tokenizer_model.c_str(), static_cast<long long>(r.vocab_size),
                static_cast<long long>(o.vocab_size));
  return 0;
}

}  // namespace

CommandRun declare_synth_ocr(CLI::App& app) {
  auto a = std::make_shared<SynthOcrArgs>();
  app.description(R"(usage: vlmtrain synth-ocr --out DIR [--train N] [--val M] [--seed S]
                          [--threads T] [--vocab-size V] [--no-tokenizer]
                          [--min-height H] [--max-height H] [--layout proportional|grid]
                          [--cell-width PX] [--tokenizer-type unigram|char]
                          [--style varied|clean]

Renders short text lines (words, numbers, dates, codes, prices; 4-16 characters) with
OpenCV's Hershey fonts into PNGs of height 28-56 px, and writes
  DIR/images/{train,val}/NNNNNN.png
  DIR/train.jsonl, DIR/val.jsonl     plain OCR format: {"image": ..., "text": ...}
  DIR/tokenizer.model, .vocab        unigram sentencepiece (ChatML specials, byte fallback)
  DIR/tokenizer_corpus.txt, DIR/synth_ocr.json
The output is identical for the same seed (whatever --threads).
)");
  add_value(app, "--out", a->out, "DIR", "output folder (created)");
  add_value(app, "--train", a->train, "N", "training images (default 2000)");
  add_value(app, "--val", a->val, "M", "validation images (default 200)");
  add_value(app, "--seed", a->seed, "S", "seed (default 0)");
  add_value(app, "--threads", a->threads, "T", "rendering threads (default 2)");
  add_value(app, "--vocab-size", a->vocab_size, "V", "sentencepiece vocabulary target (default 2048; may end smaller)");
  add_flag(app, "--no-tokenizer", a->no_tokenizer, "skip training the sentencepiece model");
  add_value(app, "--min-height", a->min_height, "H", "smallest rendered line height in pixels (default 28)");
  add_value(app, "--max-height", a->max_height, "H", "largest rendered line height in pixels (default 56)");
  add_value(app, "--layout", a->layout, "L",
            "proportional (default): the line as the font lays it out, on a canvas\n"
            "as wide as the text; grid: one character per cell on a fixed canvas\n"
            "of 17 cells x max-height px, so character i always sits in cell i");
  add_value(app, "--cell-width", a->cell_width, "PX", "grid cell width (default 28 = one merged image token)");
  add_value(app, "--tokenizer-type", a->tokenizer_type, "T", "unigram (default) or char (one piece per character)");
  add_value(app, "--style", a->style, "S",
            "varied (default): four fonts, some italic, some light-on-dark, small\n"
            "rotation, blur, noise; clean: Simplex/Duplex upright, dark on light,\n"
            "light noise only");
  return [a] { return synth_ocr(*a); };
}

}  // namespace vlm::app
