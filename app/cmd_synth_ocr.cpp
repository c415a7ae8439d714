// `vlmtrain synth-ocr`: render a synthetic OCR dataset (+ a small sentencepiece model).
#include <cstdio>

#include "app/commands.h"
#include "app/progress.h"
#include "data/synth_ocr.h"
#include "vlm/check.h"

namespace vlmtrain {

const char* help_synth_ocr() {
  return R"(usage: vlmtrain synth-ocr --out DIR [--train N] [--val M] [--seed S]
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

options:
  --out DIR          output folder (created)
  --train N          training images (default 2000)
  --val M            validation images (default 200)
  --seed S           seed (default 0)
  --threads T        rendering threads (default 2)
  --vocab-size V     sentencepiece vocabulary target (default 2048; may end smaller)
  --no-tokenizer     skip training the sentencepiece model
  --min-height H     smallest rendered line height in pixels (default 28)
  --max-height H     largest rendered line height in pixels (default 56)
  --layout L         proportional (default): the line as the font lays it out, on a canvas
                     as wide as the text; grid: one character per cell on a fixed canvas
                     of 17 cells x max-height px, so character i always sits in cell i
  --cell-width PX    grid cell width (default 28 = one merged image token)
  --tokenizer-type T unigram (default) or char (one piece per character)
  --style S          varied (default): four fonts, some italic, some light-on-dark, small
                     rotation, blur, noise; clean: Simplex/Duplex upright, dark on light,
                     light noise only
)";
}

int cmd_synth_ocr(Args& args) {
  vlm::data::SynthOcrOptions o;
  o.train_tokenizer = !args.flag("no-tokenizer");
  auto out = args.value("out");
  VLM_CHECK(out.has_value(), "vlmtrain synth-ocr: --out DIR is required");
  o.out_dir = *out;
  if (auto v = args.integer("train")) o.train = *v;
  if (auto v = args.integer("val")) o.val = *v;
  if (auto v = args.integer("seed")) {
    VLM_CHECK(*v >= 0, "vlmtrain synth-ocr: --seed must be >= 0, got ", *v);
    o.seed = uint64_t(*v);
  }
  if (auto v = args.integer("threads")) o.threads = std::max<long long>(1, *v);
  if (auto v = args.integer("vocab-size")) o.vocab_size = *v;
  if (auto v = args.integer("min-height")) o.min_height = *v;
  if (auto v = args.integer("max-height")) o.max_height = *v;
  if (auto v = args.value("layout")) o.layout = *v;
  if (auto v = args.value("style")) o.style = *v;
  if (auto v = args.integer("cell-width")) o.cell_width = *v;
  if (auto v = args.value("tokenizer-type")) o.tokenizer_type = *v;
  VLM_CHECK(o.min_height >= 8 && o.min_height <= o.max_height && o.max_height <= 1024,
            "vlmtrain synth-ocr: expected 8 <= --min-height <= --max-height <= 1024, got ",
            o.min_height, " and ", o.max_height);
  VLM_CHECK(args.positionals().empty(), "vlmtrain synth-ocr: unexpected argument '",
            args.positionals().front(), "'");
  args.finish();
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

}  // namespace vlmtrain
