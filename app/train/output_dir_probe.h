// Start-up check that run.output_dir is one directory for every rank.
//
// Every rank writes its part of each checkpoint into <output_dir> and every rank reads all
// parts on resume (checkpoint.h), so the directory must be on a filesystem that all nodes
// mount at the same path. On node-local disks the first checkpoint would fail on every rank,
// after the training time is spent; this check fails at start-up instead. Checkpoints per
// node (each node writing its ranks' files to its own disk) are not supported.
//
// Protocol (collective on the control plane; every rank calls it, with the directory as it
// sees it):
//   1. rank 0 creates the directory if it is missing and writes a probe file
//      <dir>/.vlmtrain-probe-<random 64-bit hex> (fsynced);
//   2. a broadcast from rank 0 gives every rank the name, and whether the write worked (it
//      is also the barrier after the write);
//   3. every rank looks for the file and its content (retrying for up to ~2 s when it is
//      missing, for filesystems whose directory listings lag);
//   4. an all-gather of (seen, host name) gives every rank every rank's answer, so all
//      decide the same;
//   5. rank 0 removes the probe file. Nothing else in the directory is created, read or
//      changed.
// When some rank cannot see the file, every rank throws the same vlm::Error naming the
// directory, the ranks that cannot see it with their hosts, and the fix. World size 1: no
// file, no collective.
#pragma once
#include <string>

namespace vlm::sharding {
class Comm;
}

namespace vlm::app {

void check_output_dir_shared(const std::string& dir, vlm::sharding::Comm& comm);

}  // namespace vlm::app
