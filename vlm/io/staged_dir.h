// Directories written whole (HF model directories, PEFT adapters): the files go into a
// temp directory beside the target, are fsynced, and replace the target in one step, so a
// failure or a crash never leaves a half-written directory where a good one was.
//
//   vlm::StagedDir out("runs/export");          // creates ".export.tmp-<pid>-<t>" beside it
//   vlm::write_file_synced(out.tmp() / "config.json", text);
//   out.commit();                                // fsync, swap in, fsync the parent
//   // destroyed without commit(): the temp directory is removed, the target untouched
//
// commit() swaps atomically (renameat2 RENAME_EXCHANGE) where the filesystem can; else it
// moves the old directory aside, renames the new one in (putting the old one back if that
// fails) and removes the old one last.
#pragma once
#include <filesystem>
#include <string>

namespace vlm {

// Writes `bytes` to `path` and fsyncs it. Throws vlm::Error naming the path (disk full, ...).
void write_file_synced(const std::string& path, const std::string& bytes);
// fsync of a directory (best effort: errors are ignored).
void fsync_dir(const std::string& dir);

class StagedDir {
 public:
  // `dir`: the target ("out/" and "out" are the same). Creates its parent and the temp
  // directory. Throws vlm::Error when the target exists and is not a directory.
  explicit StagedDir(const std::string& dir);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::filesystem::path& tmp() const { return tmp_; }
  const std::filesystem::path& target() const { return target_; }
  bool target_existed() const { return existed_; }
  void commit();

 private:
  std::string dir_;  // as given, for messages
  std::filesystem::path target_, parent_, tmp_;
  std::string suffix_;  // "<pid>-<time>": of the temp and the moved-aside directory
  bool existed_ = false;
  bool committed_ = false;
};

}  // namespace vlm
