#!/usr/bin/env python3
"""Start-up memory of `vlmtrain train` with sharded loading on and off (issue #22).

Writes once a random-init Qwen2-VL HF directory (bf16, Qwen2-VL-2B's widths with fewer
layers by default: about 0.9B parameters) with transformers, renders a small synthetic OCR
set, then runs `vlmtrain launch --nproc-per-node N` for one step per scenario with
model.sharded_load = true and false, interleaved, and reads rank 0's start-up line:

  weights: read on rank 0: ... | persistent share S | host RSS B before the model, C now, peak P

start-up growth = P - B (the process's peak RSS when the sharded model is ready, less what
it held before the model was built) is compared with S, the rank's persistent share
(parameters + gradients + optimizer state, ShardedModel::memory()). Peak RSS counts the
mmap'd safetensors pages a rank touched as well as its own allocations.

  .venv/bin/python scripts/bench_startup_memory.py --world 2 --repeats 2
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # the trainer's human_bytes


def write_model(out, layers, vision_depth, tokenizer_dir):
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    if os.path.exists(os.path.join(out, "config.json")):
        return
    text = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=layers,
                num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                rope_theta=1e6, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                tie_word_embeddings=True)
    vision = dict(depth=vision_depth, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
                        vision_start_token_id=151652, vision_end_token_id=151653, tie_word_embeddings=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = Qwen2VLForConditionalGeneration(cfg)
    n = sum(p.numel() for p in model.parameters())
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, max_shard_size="1GB")
    for f in os.listdir(tokenizer_dir):
        if f.startswith("tokenizer"):
            shutil.copy(os.path.join(tokenizer_dir, f), tmp)
    os.rename(tmp, out)
    print(f"wrote {out}: {n / 1e9:.3f}B parameters", flush=True)


RECIPE = """
[run]
output_dir = "{run}"
[model]
path = "{model}"
sharded_load = {sharded}
[data]
train = ["{data}/train.jsonl"]
format = "ocr"
prompt = "Read the text."
system_prompt = "none"
max_image_tokens = 64
max_seq_len = 128
[batch]
samples_per_rank = 1
max_tokens = 512
max_image_tokens = 256
[schedule]
steps = 1
warmup_steps = 0
[precision]
param_dtype = "bf16"
reduce_dtype = "fp32"
[checkpoint]
every = 0
save_final = false
{sharding}
"""

SCENARIOS = {
    # Everything trained, FSDP full_shard.
    "all full_shard": """[sharding]
default = "fsdp"
default_strategy = "full_shard"
""",
    # LoRA on the LLM's attention with the base frozen and sharded, vision frozen and sharded.
    "lora, frozen sharded base": """[sharding]
default = "freeze"
default_strategy = "full_shard"
[[sharding.module]]
match = "model.layers.*.self_attn.*_proj"
policy = "lora"
strategy = "full_shard"
r = 16
""",
}


def parse_bytes(text):
    return float(text[:-1]) * UNITS[text[-1]]


def run_once(vlmtrain, work, model, data, world, scenario, sharded):
    tag = re.sub(r"[^a-z]+", "_", scenario) + ("_sharded" if sharded else "_whole")
    recipe = os.path.join(work, f"{tag}.toml")
    with open(recipe, "w") as f:
        f.write(RECIPE.format(run=os.path.join(work, "runs", tag), model=model, data=data,
                              sharded="true" if sharded else "false", sharding=SCENARIOS[scenario]))
    shutil.rmtree(os.path.join(work, "runs", tag), ignore_errors=True)
    cmd = [vlmtrain, "launch", "--nproc-per-node", str(world), recipe]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{log[-4000:]}")
    num = r"([\d.]+[BKMGT])"
    m = re.search(rf"weights: .*persistent share {num} \| host RSS {num} before the model, {num} now, peak {num}", log)
    if not m:
        sys.exit(f"no 'weights:' line in the log of {' '.join(cmd)}:\n{log[-4000:]}")
    share, before, now, peak = (parse_bytes(x) for x in m.groups())
    return dict(share=share, before=before, now=now, peak=peak, growth=peak - before, seconds=time.time() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "startup_memory"))
    ap.add_argument("--vlmtrain", default=os.path.join(ROOT, "build", "vlmtrain"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "..", "shared", "reference", "qwen3_tokenizer"))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vision-depth", type=int, default=16)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    model = os.path.join(a.work, f"model_l{a.layers}_v{a.vision_depth}")
    write_model(model, a.layers, a.vision_depth, a.tokenizer)
    data = os.path.join(a.work, "data")
    if not os.path.exists(os.path.join(data, "train.jsonl")):
        subprocess.run([a.vlmtrain, "synth-ocr", "--out", data, "--train", "64", "--val", "8", "--no-tokenizer"],
                       check=True, capture_output=True)
    with open("/proc/loadavg") as f:
        print(f"world {a.world}, model {model}, load average {f.read().split()[0]}", flush=True)
    print("| scenario | loading | persistent share (rank 0) | start-up growth of peak RSS | growth / share | s |")
    print("|---|---|---|---|---|---|")
    gib = 2**30
    for _ in range(a.repeats):
        for scenario in SCENARIOS:
            for sharded in (True, False):
                r = run_once(a.vlmtrain, a.work, model, data, a.world, scenario, sharded)
                print(f"| {scenario} | {'sharded' if sharded else 'whole + broadcast'} | {r['share'] / gib:.2f} GiB "
                      f"| {r['growth'] / gib:.2f} GiB | {r['growth'] / r['share']:.2f} | {r['seconds']:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
