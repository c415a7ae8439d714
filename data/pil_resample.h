// Pillow's bicubic resample (Resample.c, ImagingResample for 8-bit RGB), bit-identical:
// kernel a = -0.5 widened by the scale factor when shrinking (antialiased), weights in 22-bit
// fixed point, a horizontal pass then a vertical pass, each rounded and clipped to 8 bits;
// an axis whose size does not change is copied. (OpenCV's INTER_CUBIC does not antialias.)
//
// Two implementations with the same integer arithmetic (so the same bytes):
//   resize_bicubic_aa            AVX2 when the CPU has it (runtime check), else the reference.
//                                Vertical pass: 32 bytes of a row at a time, the taps'
//                                int32 sums in registers. Horizontal pass: 16 rows at a time,
//                                transposed into a column buffer [w_in, 16 rows x 3 ch] so an
//                                output pixel's 48 sums are 6 vector accumulators.
//   resize_bicubic_aa_reference  the scalar transcription of Pillow's loops.
// tests/data/pixel_pipeline_test.cpp holds the two equal; the HF parity tests hold the
// result equal to Pillow's.
#pragma once
#include <opencv2/core.hpp>

#include <cstdint>

namespace vlm::data {

// rgb: CV_8UC3 [H, W] -> CV_8UC3 [height, width] (always a new Mat).
cv::Mat resize_bicubic_aa(const cv::Mat& rgb, int64_t height, int64_t width);
cv::Mat resize_bicubic_aa_reference(const cv::Mat& rgb, int64_t height, int64_t width);

// Whether resize_bicubic_aa takes the AVX2 path on this machine.
bool resize_uses_avx2();

}  // namespace vlm::data
