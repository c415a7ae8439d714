#!/usr/bin/env python3
"""Reference prompts from HF transformers' Qwen2VLProcessor (or Qwen3VLProcessor): chat
template + tokenizer + image-pad expansion, for tests/vlm/text/chat_template_test.cpp,
tests/vlm/text/chat_template_qwen3_test.cpp, tests/vlm/text/chat_template_qwen3_5_test.cpp
(and generate_reference.py).

    .venv/bin/python scripts/chat_template_reference.py \\
        --tokenizer "$(.venv/bin/python scripts/qwen_tokenizer_path.py)" --cases cases.json --out out.jsonl \\
        [--family qwen2_vl|qwen3_vl|qwen3_5]

--tokenizer  a directory with tokenizer.json + tokenizer_config.json (AutoTokenizer).
--cases      a JSON list; each case {"messages": [...], "add_generation_prompt": bool} and, when
             given, "enable_thinking": bool (passed to the template as is). A
             message is {"role", "content"}: content a string, or a list of items
             {"type": "text", "text": ...} | {"type": "image", "size": [height, width]}.
             An image item becomes a black RGB PNG of that size (written next to --out), so
             the processor's own image loading and smart_resize decide the grid.
--out        one JSON object per case, in order:
             {"text": apply_chat_template(tokenize=False) (one <|image_pad|> per image),
              "input_ids": [...] (apply_chat_template(tokenize=True): pads expanded),
              "mm_token_type_ids": [...], "image_grid_thw": [[t, h, w], ...]},
             or {"error": message} when the template raises (raise_exception).

--family qwen2_vl (default): Qwen2VLProcessor with HF's default Qwen2VLImageProcessor and
Qwen2-VL-Instruct's chat template (chat_template.json of the hub repos
Qwen/Qwen2-VL-2B-Instruct and -7B-Instruct), kept verbatim in
scripts/qwen2_vl_chat_template.jinja: the reference tokenizer directory holds Qwen3's
(text) template, which differs (no default system prompt, thinking blocks).
--family qwen3_vl: Qwen3VLProcessor with Qwen3-VL's image processor settings (patch 16,
merge 2, mean/std 0.5, size 65536 .. 16777216) and Qwen3-VL-Instruct's chat template as
transcribed in scripts/qwen3_vl_chat_template.jinja (no default system prompt).
--family qwen3_5: the same processor and image settings (Qwen3.5 uses Qwen3-VL's) with
Qwen3.5's chat template as transcribed in scripts/qwen3_5_chat_template.jinja; --tokenizer
is then a directory holding the Qwen3.5 tokenizer.json that
scripts/qwen3_5_tokenizer_reference.py --write-tokenizer-json writes.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_FILES = {"qwen2_vl": os.path.join(HERE, "qwen2_vl_chat_template.jinja"),
                  "qwen3_vl": os.path.join(HERE, "qwen3_vl_chat_template.jinja"),
                  "qwen3_5": os.path.join(HERE, "qwen3_5_chat_template.jinja")}


def make_processor(tokenizer_dir, family="qwen2_vl"):
    """The family's processor with its image processor settings and chat template."""
    try:
        from transformers import (AutoTokenizer, Qwen2VLImageProcessor, Qwen2VLProcessor,
                                  Qwen2VLVideoProcessor, Qwen3VLProcessor)
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    except ImportError as e:
        sys.exit(f"chat_template_reference: cannot import transformers with {sys.executable} "
                 f"({e}); run scripts/install-deps.sh (scripts/requirements.txt)")
    if not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        sys.exit(f"chat_template_reference: no tokenizer.json in {tokenizer_dir}")
    with open(TEMPLATE_FILES[family], encoding="utf-8") as f:
        template = f.read()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if family in ("qwen3_vl", "qwen3_5"):
        image = Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2,
                                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                      size={"shortest_edge": 65536, "longest_edge": 16777216})
        return Qwen3VLProcessor(image_processor=image, tokenizer=tok,
                                video_processor=Qwen3VLVideoProcessor(), chat_template=template)
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tok,
                            video_processor=Qwen2VLVideoProcessor(), chat_template=template)


def materialize_images(messages, image_dir, counter):
    """Replaces {"type": "image", "size": [h, w]} items by PNG files the processor loads."""
    import numpy as np
    from PIL import Image
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            items = []
            for it in content:
                if it.get("type") == "image":
                    h, w = it["size"]
                    path = os.path.join(image_dir, f"img{counter[0]}.png")
                    counter[0] += 1
                    Image.fromarray(np.full((h, w, 3), 17 * counter[0] % 256, np.uint8)).save(path)
                    items.append({"type": "image", "image": path})
                else:
                    items.append(it)
            content = items
        out.append({"role": m["role"], "content": content})
    return out


def render(proc, messages, add_generation_prompt, **template_vars):
    """What the processor gives for one conversation (images already materialized)."""
    text = proc.apply_chat_template(messages, tokenize=False,
                                    add_generation_prompt=add_generation_prompt, **template_vars)
    enc = proc.apply_chat_template(messages, tokenize=True, return_dict=True,
                                   add_generation_prompt=add_generation_prompt, **template_vars)
    row = {"text": text, "input_ids": list(enc["input_ids"][0]),
           "mm_token_type_ids": list(enc["mm_token_type_ids"][0]), "image_grid_thw": []}
    if "image_grid_thw" in enc:
        row["image_grid_thw"] = enc["image_grid_thw"].tolist()
    return row, enc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", choices=sorted(TEMPLATE_FILES), default="qwen2_vl")
    args = ap.parse_args()
    import jinja2
    import transformers
    proc = make_processor(args.tokenizer, args.family)
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    image_dir = os.path.dirname(os.path.abspath(args.out))
    counter = [0]
    with open(args.out, "w", encoding="utf-8") as f:
        for case in cases:
            messages = materialize_images(case["messages"], image_dir, counter)
            template_vars = {}
            if "enable_thinking" in case:
                template_vars["enable_thinking"] = bool(case["enable_thinking"])
            try:
                row, _ = render(proc, messages, bool(case.get("add_generation_prompt", False)),
                                **template_vars)
            except jinja2.exceptions.TemplateError as e:  # raise_exception in the template
                row = {"error": str(e)}
            f.write(json.dumps(row) + "\n")
    print(f"chat_template_reference ({args.family}): transformers {transformers.__version__}, "
          f"{len(cases)} cases, {counter[0]} images")


if __name__ == "__main__":
    main()
