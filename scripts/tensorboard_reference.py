#!/usr/bin/env python3
"""Reads vlmtrain's TensorBoard event files with TensorBoard's own reader, for
tests/app/report/tensorboard_test.cpp.

Usage: python scripts/tensorboard_reference.py DIR      (needs tensorboard, scripts/requirements.txt)

Loads DIR (a run's <output_dir>/tb, every events file in it, in name order) with
tensorboard.backend.event_processing.event_accumulator.EventAccumulator (default purging of
orphaned data after a restart, every scalar kept) and prints one JSON line:
  {"tensorboard": version, "files": [names], "file_version": float,
   "scalars": {tag: [[step, value], ...]}}
The reader checks each record's masked CRC-32C; a corrupt or truncated record stops it.
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    try:
        import tensorboard
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        req = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")
        pin = next((l.strip() for l in open(req) if l.startswith("tensorboard==")), "tensorboard")
        sys.exit(f"tensorboard_reference: cannot import tensorboard with {sys.executable} ({e}); "
                 f"fix: {os.path.join(os.path.dirname(sys.executable), 'pip')} install {pin} "
                 f"(pinned in scripts/requirements.txt; scripts/install-deps.sh installs it)")
    acc = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    scalars = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    files = sorted(f for f in os.listdir(path) if "tfevents" in f)
    print(json.dumps({"tensorboard": tensorboard.__version__, "files": files,
                      "file_version": acc.file_version, "scalars": scalars}), flush=True)


if __name__ == "__main__":
    main()
