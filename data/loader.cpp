#include "data/loader.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "data/image.h"
#include "data/image_source.h"

namespace vlm::data {

void use_one_intra_op_thread() {
  // ATen's first parallel op on a thread sets that thread's OpenMP team size to the process's
  // intra-op thread count; get_num_threads() runs that initialisation now, so it cannot undo
  // the setting below later. omp_set_num_threads changes only the calling thread's value
  // (an OpenMP ICV); it is looked up in the OpenMP runtime libtorch loaded, not linked, so that
  // no second runtime enters the process. Without OpenMP (or without the symbol) ATen has no
  // per-thread teams and nothing needs doing.
  (void)at::get_num_threads();
  using SetFn = void (*)(int);
  static const auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  if (set) set(1);
}

RecordImages load_record_images(const Record& record, const PixelConfig& cfg,
                                const std::vector<vlm::ImageSize>& targets) {
  VLM_CHECK(targets.empty() || targets.size() == record.images.size(), record.location(),
            ": expected ", record.images.size(), " target sizes, got ", targets.size());
  RecordImages out;
  std::vector<torch::Tensor> pv;
  std::vector<int64_t> thw;
  for (size_t i = 0; i < record.images.size(); ++i) {
    const ImageRef& ref = record.images[i];
    PixelImage img;
    try {
      cv::Mat rgb = decode_image_rgb(read_image_bytes(ref), ref.path);
      if (ref.width > 0 && (rgb.cols != ref.width || rgb.rows != ref.height))
        throw vlm::Error(vlm::str("decoded size ", rgb.cols, "x", rgb.rows,
                                  " differs from the indexed size ", ref.width, "x", ref.height,
                                  " (hint: the image changed; delete the .index.json cache)"));
      img = targets.empty() ? process_image(rgb, cfg)
                            : process_image_to_size(rgb, targets[i].height, targets[i].width, cfg);
    } catch (const std::exception& e) {
      throw vlm::Error(vlm::str(record.location(), ": image ", i, " (", ref.path, "): ", e.what()));
    }
    pv.push_back(img.pixel_values);
    thw.insert(thw.end(), img.grid_thw.begin(), img.grid_thw.end());
    out.images.push_back(std::move(img));
  }
  if (!pv.empty()) {
    out.pixel_values = torch::cat(pv, 0);
    out.grid_thw = torch::tensor(thw, torch::kInt64).view({int64_t(pv.size()), 3});
  } else {
    const auto& g = cfg.geometry;
    out.pixel_values = torch::empty({0, 3 * g.temporal_patch_size * g.patch_size * g.patch_size}, torch::kFloat32);
    out.grid_thw = torch::empty({0, 3}, torch::kInt64);
  }
  return out;
}

}  // namespace vlm::data
