#include "sharding/dist/fingerprint.h"

#include <cstdio>
#include <map>

#include "sharding/dist/comm.h"
#include "vlm/runtime/check.h"
#include "vlm/runtime/runtime_info.h"

namespace vlm::sharding {

Fingerprint& Fingerprint::add(const std::string& name, const std::string& value) {
  for (const auto& f : fields)
    VLM_CHECK(f.first != name, "fingerprint: field '", name, "' added twice");
  fields.emplace_back(name, value);
  return *this;
}

Fingerprint Fingerprint::standard(const std::string& recipe_hash, const std::string& model_config,
                                  const std::string& unit_table, int64_t dataset_size) {
  Fingerprint fp;
  fp.add("recipe hash", recipe_hash)
      .add("model config", model_config)
      .add("unit table", unit_table)
      .add("dataset size", std::to_string(dataset_size))
      .add("libtorch version", torch_version());
  return fp;
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// One all-gather of `local` [K] int64 -> [N, K].
torch::Tensor gather_rows(Comm& comm, const std::vector<uint64_t>& local, const std::string& ctx) {
  const int64_t k = static_cast<int64_t>(local.size());
  torch::Tensor in = torch::empty({k}, torch::kInt64);
  for (int64_t i = 0; i < k; ++i) in[i] = static_cast<int64_t>(local[i]);
  torch::Tensor out = torch::empty({comm.world_size() * k}, torch::kInt64);
  comm.all_gather(out, in, ctx);
  return out.view({comm.world_size(), k});
}

// "ranks 0,2 = aaaa, rank 1 = bbbb" for column `col` of `rows` [N, K].
std::string who_has_what(const torch::Tensor& rows, int64_t col) {
  std::map<uint64_t, std::vector<int>> groups;  // value -> ranks
  std::vector<uint64_t> order;
  for (int64_t r = 0; r < rows.size(0); ++r) {
    uint64_t v = static_cast<uint64_t>(rows[r][col].item<int64_t>());
    if (!groups.count(v)) order.push_back(v);
    groups[v].push_back(static_cast<int>(r));
  }
  std::string s;
  for (uint64_t v : order) {
    const auto& ranks = groups[v];
    if (!s.empty()) s += ", ";
    s += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
    s += " = " + hex(v);
  }
  return s;
}

std::string preview(const std::string& v) {
  return v.size() <= 120 ? v : v.substr(0, 117) + "...";
}

}  // namespace

void check_fingerprint(Comm& comm, const Fingerprint& fp) {
  // Step 1: the field list (count and names) must agree, or step 2 would mismatch in size.
  std::string names;
  for (const auto& f : fp.fields) names += f.first + '\n';
  torch::Tensor head = gather_rows(
      comm, {static_cast<uint64_t>(fp.fields.size()), fnv1a64(names)}, "fingerprint field list");
  bool same_list = true;
  for (int64_t r = 1; r < head.size(0); ++r)
    same_list = same_list && head[r][0].item<int64_t>() == head[0][0].item<int64_t>() &&
                head[r][1].item<int64_t>() == head[0][1].item<int64_t>();
  VLM_CHECK(same_list, "start-up consistency check failed on rank ", comm.rank(),
            ": the fingerprint field lists differ (", who_has_what(head, 1),
            "); this rank has ", fp.fields.size(), " fields: ", names.empty() ? "none" : "",
            preview(names), " (hint: all ranks must run the same vlmtrain build)");

  // Step 2: one hash per field.
  std::vector<uint64_t> hashes;
  for (const auto& f : fp.fields) hashes.push_back(fnv1a64(f.second));
  if (hashes.empty()) return;
  torch::Tensor rows = gather_rows(comm, hashes, "fingerprint values");
  std::string msg;
  for (int64_t c = 0; c < rows.size(1); ++c) {
    bool same = true;
    for (int64_t r = 1; r < rows.size(0); ++r) same = same && rows[r][c].item<int64_t>() == rows[0][c].item<int64_t>();
    if (same) continue;
    msg += str("\n  ", fp.fields[c].first, " differs: ", who_has_what(rows, c),
               "; this rank's value: '", preview(fp.fields[c].second), "'");
  }
  VLM_CHECK(msg.empty(), "start-up consistency check failed on rank ", comm.rank(), " of ",
            comm.world_size(), ":", msg,
            "\n  hint: every rank must get the same recipe, model, data and vlmtrain build");
}

}  // namespace vlm::sharding
