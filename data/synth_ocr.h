// Synthetic OCR data: short text lines (words, numbers, dates, codes, prices) rendered
// with OpenCV's Hershey fonts (random font, scale, 2-3 px stroke, colours, noise, blur, small
// rotation), written as PNGs + train.jsonl / val.jsonl in the plain OCR format, plus a
// small sentencepiece model trained on the text (for the tiny preset).
//
// Deterministic for a seed: every line and image is a function of (seed, split, index)
// only, so the thread count does not change the output.
#pragma once
#include <opencv2/core.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vlm::data {

// Bumped whenever the same options render different images (recorded in synth_ocr.json,
// so a trainer can tell a stale cached set from a current one).
// 1: original renderer; 2: strokes of 2-3 px instead of mostly 1 px.
constexpr int kSynthRendererVersion = 2;  // (style clean arrived with 2)

struct SynthOcrOptions {
  std::string out_dir;
  int64_t train = 2000;
  int64_t val = 200;
  uint64_t seed = 0;
  int64_t threads = 2;              // rendering threads
  int64_t min_chars = 4;            // text length range (characters)
  int64_t max_chars = 16;
  int64_t min_height = 28;          // image height range (pixels)
  int64_t max_height = 56;
  // proportional: the line as OpenCV lays it out, on a canvas as wide as the text.
  // grid: one character per `cell_width`-px cell on a canvas of (max_chars + 1) cells and
  //   max_height px, so the i-th character always sits in the same image column (see
  //   docs/notes/tiny_convergence.md for why that matters to a model trained from scratch).
  std::string layout = "proportional";
  int64_t cell_width = 28;          // grid: pixels per character (28 = one merged token)
  // varied: four Hershey fonts, 15% italic, 15% light-on-dark, rotation up to 2 degrees,
  //   30% blur, sensor noise up to sigma 8. clean: Simplex or Duplex upright, dark on
  //   light, no rotation or blur, noise up to sigma 4 (what the tiny preset learns to read
  //   in minutes on a CPU; docs/notes/tiny_convergence.md).
  std::string style = "varied";
  bool train_tokenizer = true;
  std::string tokenizer_type = "unigram";  // unigram | char (one piece per character)
  int64_t vocab_size = 2048;        // sentencepiece target (may end lower: hard limit off)
  int64_t extra_corpus_lines = 20000;  // extra generated lines for the tokenizer corpus
  // Progress: called from the calling thread with the images of `split` rendered so far
  // (last call: done == total). Empty: nothing.
  std::function<void(const std::string& split, int64_t done, int64_t total)> on_progress;

};

struct SynthOcrResult {
  int64_t train = 0;
  int64_t val = 0;
  std::string tokenizer_model;      // path of tokenizer.model ("" when not trained)
  int64_t vocab_size = 0;           // pieces in the trained model
  double seconds = 0;
};

// The special tokens the ChatML template needs, added as user-defined symbols.
const std::vector<std::string>& chatml_special_tokens();

// One text line for stream `stream_seed` (length within [min_chars, max_chars]).
std::string synth_text(uint64_t stream_seed, int64_t min_chars = 4, int64_t max_chars = 16);

// Renders `text` as an 8-bit BGR image of height in [min_height, max_height]; `clean`
// selects SynthOcrOptions::style clean.
cv::Mat render_text_line(const std::string& text, uint64_t stream_seed, int64_t min_height = 28,
                         int64_t max_height = 56, bool clean = false);

// Renders `text` with one character per `cell_width`-px cell (left to right, the whole
// line shifted right by a random 0..cell_width/8 px) on a `canvas_cells` x cell_width by `height` canvas.
cv::Mat render_grid_line(const std::string& text, uint64_t stream_seed, int64_t cell_width,
                         int64_t canvas_cells, int64_t height, bool clean = false);

// Writes the dataset (images/, train.jsonl, val.jsonl, tokenizer.model, synth_ocr.json).
// Throws vlm::Error on I/O or tokenizer-training failure.
SynthOcrResult write_synth_ocr(const SynthOcrOptions& opts);

// Why the set in `opts.out_dir` has to be rendered (again) for `opts`; "" when it is
// current. A folder whose train.jsonl exists but that has no synth_ocr.json was not
// written by synth-ocr (the user's own data) and is never called stale.
std::string synth_ocr_refresh_reason(const SynthOcrOptions& opts);

// Trains a unigram sentencepiece model on `corpus_file` with the ChatML specials,
// byte fallback and identity normalisation; returns the number of pieces.
// Trains in-process through vlm::train_sentencepiece() (the run-time-loaded trainer; no
// external tool) with vlm::sp_trainer_flags() (no dummy prefix, so the chat renderer's
// byte offsets are exact), unigram, one thread. The trainer paths recorded inside the
// model are rewritten to bare file names, so the model bytes depend only on the corpus.
int64_t train_sentencepiece(const std::string& corpus_file, const std::string& model_prefix,
                            int64_t vocab_size, const std::string& model_type = "unigram");

}  // namespace vlm::data
