#!/usr/bin/env python3
"""HF transformers references for tests/vlm/model/hf_parity_test.cpp, produced at test time.

For each family (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_vl_moe, qwen3_5_moe) it builds a tiny random model with transformers,
with every weight re-drawn at a scale that keeps activations O(1) (so attention is far
from uniform and rotary or mask bugs change the result) and with random norms and biases
(so ones / zeros cannot hide a bug), and saves it. Then, for each pass in PASSES (float32
with eager attention; float64 with sdpa) and each batch in BATCHES, it runs the forward on
CPU with HF computing its own M-RoPE position ids (from input_ids, mm_token_type_ids,
image_grid_thw and attention_mask), takes the summed shifted cross-entropy of the logits
(upcast to fp32) and back-propagates it. Written under --out:

  <family>/config.json, <family>/model.safetensors   model.save_pretrained (fp32; HF's
      own config layout and tensor names)
  <family>.<dtype>.<batch>.io.safetensors
      input_ids, attention_mask, labels [B, L] int64; pixel_values [P, 3*2*p*p] f32 and
      image_grid_thw [N, 3] int64 (absent without images; the model casts the pixels to
      its dtype); position_ids [3, B, L] int64 (what HF's rotary embedding was given);
      logits [B, L, V] f32; loss_sum [1] f32; n_tokens [1] int64
  <family>.<dtype>.<batch>.grads.safetensors
      d loss_sum / d parameter in <dtype> for every parameter, under
      model.named_parameters() names (model.visual.*, model.language_model.*, lm_head.weight
      unless tied); zeros where HF leaves the gradient None (the vision tower on a
      text-only batch)
  <family>.<dtype>.<batch>.aux.{io,grads}.safetensors   (MOE_AUX: the MoE families) the same
      with output_router_logits: io adds aux_loss [1] and aux_coef [1], grads are of
      loss_sum + aux_coef * aux_loss
  <family>.generate.<batch>.safetensors   (GENERATE: Qwen3.5 and the MoE families) the batch's inputs and
      generated [B, 12] int64: HF's greedy `generate` (fp32, eager, no eos)
  manifest.json   {"transformers", "torch", "families", "dtypes", "batches", ...}

Usage: python scripts/hf_reference.py --out DIR   (needs torch, transformers, safetensors)
"""
import argparse
import contextlib
import json
import os
import sys

import torch

# Tiny shapes: vision head_dim 32 (2D rotary, 8 + 8 frequencies), text head_dim 32
# (mrope_section 4 + 6 + 6 = 16 frequencies), GQA 2 query heads on 1 kv head.
# Qwen2.5: window_size 56 px = 2x2 merged tokens, block 1 of 3 full attention, so the
# images below span several windows, partial ones included (6x10 patches = 3x5 merged).
TEXT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=512, hidden_act="silu",
    rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
    image_token_id=250, video_token_id=251, vision_start_token_id=248, vision_end_token_id=249,
    bos_token_id=0, eos_token_id=1, pad_token_id=3, attention_dropout=0.0,
    use_sliding_window=False,
)

FAMILIES = {
    "qwen2_vl": dict(
        TEXT, tie_word_embeddings=False,
        vision_config=dict(depth=2, embed_dim=64, hidden_size=64, mlp_ratio=2, num_heads=2,
                           in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, hidden_act="quick_gelu")),
    "qwen2_5_vl": dict(
        TEXT, tie_word_embeddings=True,
        vision_config=dict(depth=3, hidden_size=64, out_hidden_size=64, intermediate_size=96,
                           num_heads=2, in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, hidden_act="silu", window_size=56,
                           fullatt_block_indexes=[1], tokens_per_second=2)),
}

# Real-shaped single layers: the released models' widths, heads, head dims, MLP sizes,
# rotary sections and merger, with one vision block and one decoder layer (and a 512-token
# vocabulary) so that the bookkeeping at real shapes (vision head_dim 80, text head_dim 128,
# M-RoPE 16 + 24 + 24, GQA 12:2 / 16:2, the 5120-wide merger, Qwen2.5's 112-px windows)
# is checked without the full models. fp32, two batch kinds (REAL_PASSES, REAL_BATCHES).
REAL_TEXT = dict(TEXT, vocab_size=512, rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                 num_hidden_layers=1, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
REAL = {
    "qwen2_vl_2b_layer": dict(  # Qwen2-VL-2B
        REAL_TEXT, hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
        tie_word_embeddings=True,
        vision_config=dict(depth=1, embed_dim=1280, hidden_size=1536, mlp_ratio=4, num_heads=16, in_channels=3,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu")),
    "qwen2_5_vl_3b_layer": dict(  # Qwen2.5-VL-3B
        REAL_TEXT, hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2,
        tie_word_embeddings=True,
        vision_config=dict(depth=1, hidden_size=1280, out_hidden_size=2048, intermediate_size=3420, num_heads=16,
                           in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           hidden_act="silu", window_size=112, fullatt_block_indexes=[7, 15, 23, 31],  # block 0: windowed
                           tokens_per_second=2)),
}

# Qwen3-VL: its own nested config (text_config / vision_config). Tiny: 16-px patches, a
# 6 x 6 position table (bilinear resampling to grids of 2..10 patches, up- and down-scaled),
# DeepStack from vision blocks 0 and 2 (list order [2, 0]: merger 0 reads block 2) into LLM
# layers 0 and 1, text head_dim 32 given explicitly (2 x 32 != hidden 64), interleaved
# M-RoPE with sections 4 + 6 + 6, q/k norms, no attention bias.
QWEN3_TINY = dict(
    image_token_id=250, video_token_id=251, vision_start_token_id=248, vision_end_token_id=249,
    tie_word_embeddings=False,
    text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6,
                     max_position_embeddings=512, hidden_act="silu", attention_bias=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                      "mrope_section": [4, 6, 6], "mrope_interleaved": True},
                     bos_token_id=0, eos_token_id=1, pad_token_id=3, attention_dropout=0.0),
    vision_config=dict(depth=3, hidden_size=64, intermediate_size=96, num_heads=2, in_channels=3,
                       patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                       num_position_embeddings=36, deepstack_visual_indexes=[2, 0],
                       hidden_act="gelu_pytorch_tanh"))
FAMILIES["qwen3_vl"] = QWEN3_TINY
# Qwen3-VL-2B widths: ViT 1024 (16 heads of 64, MLP 4096, 48 x 48 positions, merger and one
# DeepStack merger 4096 -> 2048), text 2048 with 16 x 128 query heads on 8 kv heads, MLP 6144,
# M-RoPE 24 + 20 + 20 interleaved, theta 5e6.
REAL["qwen3_vl_2b_layer"] = dict(
    QWEN3_TINY, tie_word_embeddings=True,
    text_config=dict(QWEN3_TINY["text_config"], vocab_size=512, hidden_size=2048, intermediate_size=6144,
                     num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=262144,
                     rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                      "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
    vision_config=dict(QWEN3_TINY["vision_config"], depth=1, hidden_size=1024, intermediate_size=4096,
                       num_heads=16, out_hidden_size=2048, num_position_embeddings=2304,
                       deepstack_visual_indexes=[0]))
# vlmtrain's `small` preset (the benchmark model): 8 layers of 512, vocab 8192, tied head,
# M-RoPE 2 + 2 + 28 with theta 100, a 6-block ViT of 384.
REAL["qwen2_vl_small_preset"] = dict(
    REAL_TEXT, vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, rope_theta=100.0, max_position_embeddings=4096,
    rope_scaling={"type": "mrope", "mrope_section": [2, 2, 28]}, tie_word_embeddings=True,
    vision_config=dict(depth=6, embed_dim=384, hidden_size=512, mlp_ratio=4, num_heads=6, in_channels=3,
                       patch_size=14, spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu"))
REAL_BATCHES = ["images_left", "multi_image_right"]

# Qwen3.5: a hybrid decoder (Gated DeltaNet `linear_attn` and gated `self_attn` layers) on the
# Qwen3-VL tower without DeepStack. Tiny: head_dim 64 of which a quarter rotates (M-RoPE
# 3 + 3 + 2 interleaved), 2 key heads serving 4 value heads of 16 in the linear layers.
# Two layer-type patterns: three linear then one full, untied ("qwen3_5"); full first, then
# two linear, tied ("qwen3_5_tied").
QWEN35_TINY = dict(
    image_token_id=250, video_token_id=251, vision_start_token_id=248, vision_end_token_id=249,
    tie_word_embeddings=False,
    text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6,
                     max_position_embeddings=512, hidden_act="silu", attention_bias=False,
                     linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                     linear_value_head_dim=16, linear_conv_kernel_dim=4,
                     layer_types=["linear_attention"] * 3 + ["full_attention"],
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                      "mrope_section": [3, 3, 2], "mrope_interleaved": True},
                     bos_token_id=0, eos_token_id=1, pad_token_id=3, attention_dropout=0.0),
    vision_config=dict(depth=2, hidden_size=64, intermediate_size=96, num_heads=2, in_channels=3,
                       patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                       num_position_embeddings=36, hidden_act="gelu_pytorch_tanh"))
FAMILIES["qwen3_5"] = QWEN35_TINY
FAMILIES["qwen3_5_tied"] = dict(
    QWEN35_TINY, tie_word_embeddings=True,
    text_config=dict(QWEN35_TINY["text_config"], num_hidden_layers=3,
                     layer_types=["full_attention", "linear_attention", "linear_attention"]))
# Qwen3.5-9B widths: one linear layer (16 key heads of 128 serving 32 value heads of 128,
# conv over 8192 channels) and one full layer (16 x 256 query heads with their gates on 4 kv
# heads, 64 rotated dims, M-RoPE 11 + 11 + 10, theta 1e7), a 512-wide MLP (the mixers are what
# is checked) and one 1152-wide vision block with 48 x 48 positions.
REAL["qwen3_5_9b_layer"] = dict(
    QWEN35_TINY,
    text_config=dict(QWEN35_TINY["text_config"], vocab_size=512, hidden_size=4096, intermediate_size=512,
                     num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                     linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                     linear_value_head_dim=128, layer_types=["linear_attention", "full_attention"],
                     max_position_embeddings=262144,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                      "mrope_section": [11, 11, 10], "mrope_interleaved": True}),
    vision_config=dict(QWEN35_TINY["vision_config"], depth=1, hidden_size=1152, intermediate_size=4304,
                       num_heads=16, out_hidden_size=4096, num_position_embeddings=2304))
# The mixture-of-experts families (Qwen3-VL-MoE, Qwen3.5-MoE): the tiny models above with
# 6 experts of width 48, top-2; Qwen3-VL-MoE with layer 1 dense (mlp_only_layers), Qwen3.5-MoE
# sparse everywhere with a 40-wide shared expert. Besides the plain passes, MOE_AUX writes
# "<family>.<dtype>.<batch>.aux.*": the forward with output_router_logits and the gradient of
# loss_sum + AUX_COEF * aux_loss (HF's load_balancing_loss_func with the attention mask).
FAMILIES["qwen3_vl_moe"] = dict(
    QWEN3_TINY, text_config=dict(QWEN3_TINY["text_config"], num_hidden_layers=3, num_experts=6,
                                 num_experts_per_tok=2, moe_intermediate_size=48, decoder_sparse_step=1,
                                 mlp_only_layers=[1]))
_q35_moe_text = dict(QWEN35_TINY["text_config"], num_experts=6, num_experts_per_tok=2, moe_intermediate_size=48,
                     shared_expert_intermediate_size=40)
del _q35_moe_text["intermediate_size"]
FAMILIES["qwen3_5_moe"] = dict(QWEN35_TINY, text_config=_q35_moe_text)
MOE_AUX = {"qwen3_vl_moe": ["images_left", "text_right"], "qwen3_5_moe": ["mixed_left", "text_left"]}
AUX_COEF = 0.5  # large, so that a wrong aux gradient cannot hide under the cross-entropy's

# Longer batches for the families whose mixer is chunked (Qwen3.5's Gated DeltaNet, chunks of
# 64 tokens): sequences of 2-3 chunks, the state carried across chunk boundaries.
LONG_BATCHES = ["long_left", "long_right"]
FAMILY_BATCHES = {"qwen3_5": LONG_BATCHES, "qwen3_5_tied": LONG_BATCHES, "qwen3_5_9b_layer": ["long_right"]}

IMG, VS, VE, PAD = TEXT["image_token_id"], TEXT["vision_start_token_id"], TEXT["vision_end_token_id"], 3

# A sequence is a list of items: an int n = n random text tokens, or (gh, gw) = an image of
# gh x gw patches wrapped in <|vision_start|> ... <|vision_end|>. `answer` = how many final
# real tokens are supervised. Sizes (merged tokens): 4x4 -> 4, 4x8 -> 8, 8x4 -> 8,
# 6x10 -> 15, 2x2 -> 1.
BATCHES = {
    # one image per sequence, different sizes, left padding
    "images_left": dict(pad="left", seqs=[([3, (4, 4), 6], 6), ([1, (4, 8), 8], 8)]),
    # several images of different sizes in one sequence, right padding
    "multi_image_right": dict(pad="right", seqs=[([2, (6, 10), 3, (2, 2), 5], 7),
                                                 ([4, (8, 4), 2, (4, 4), 9], 5)]),
    # one sequence with an image, one without, left padding
    "mixed_left": dict(pad="left", seqs=[([9], 5), ([2, (6, 10), 4], 4)]),
    # text only (no pixel_values at all), left and right padding
    "text_left": dict(pad="left", seqs=[([14], 9), ([8], 5)]),
    "text_right": dict(pad="right", seqs=[([7], 4), ([15], 10)]),
    # 2-3 chunks of 64 per sequence (FAMILY_BATCHES)
    "long_left": dict(pad="left", seqs=[([60, (4, 8), 50], 20), ([140], 40)]),
    "long_right": dict(pad="right", seqs=[([30, (6, 10), 70], 30), ([100], 50)]),
}


# Qwen3.5's float64 pass computes the gated delta rule in float64 (Float64DeltaRule: HF's own
# torch path would round it to fp32).
# Passes: dtype name -> (dtype, HF attention implementation). float32 is the parity the
# model promises; float64 (the same fp32 weights and pixels, cast) takes rounding out of
# the comparison so that small systematic differences (an eps, a cast at the wrong place)
# cannot hide under fp32 noise. transformers 5.23's eager attention gives NaN on every row
# of a left-padded sequence in float64, hence sdpa there.
PASSES = {"float32": (torch.float32, "eager"), "float64": (torch.float64, "sdpa")}


def gated_delta_rule_float64(query, key, value, g, beta, initial_state=None, output_final_state=False,
                             use_qk_l2norm_in_kernel=False, **_):
    """The gated delta rule token by token (its definition) in the inputs' dtype. transformers'
    torch_chunk_gated_delta_rule computes in fp32 whatever the model's dtype; the float64
    pass swaps this in for it so that the float64 reference is float64 throughout."""
    dt = value.dtype
    hk, hv = key.shape[2], value.shape[2]
    if hk != hv:
        query = query.repeat_interleave(hv // hk, dim=2)
        key = key.repeat_interleave(hv // hk, dim=2)
    q, k, v, b, d = [x.transpose(1, 2).to(dt) for x in (query, key, value, beta, g)]
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    B, H, L, Dk = k.shape
    s = torch.zeros(B, H, Dk, v.shape[-1], dtype=dt) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(L):
        s = s * d[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (s * k[:, :, t, :, None]).sum(-2)) * b[:, :, t, None]
        s = s + k[:, :, t, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, 2).transpose(1, 2).contiguous(), (s if output_final_state else None)


class Float64DeltaRule:
    """Within: Qwen3.5's (and Qwen3.5-MoE's) chunked rule computes in float64
    (gated_delta_rule_float64)."""
    def __enter__(self):
        import transformers.models.qwen3_5.modeling_qwen3_5 as m
        import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as m_moe
        self.saved = [(x, x.torch_chunk_gated_delta_rule) for x in (m, m_moe)]
        for x, _ in self.saved:
            x.torch_chunk_gated_delta_rule = gated_delta_rule_float64

    def __exit__(self, *exc):
        for x, fn in self.saved:
            x.torch_chunk_gated_delta_rule = fn


def patch_size(cfg_dict):
    return cfg_dict["vision_config"]["patch_size"]


def build(family, cfg_dict, embed_std=0.25):
    if family == "qwen3_vl_moe":
        from transformers import Qwen3VLMoeConfig as C, Qwen3VLMoeForConditionalGeneration as M
    elif family == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig as C, Qwen3_5MoeForConditionalGeneration as M
    elif family.startswith("qwen3_5"):
        from transformers import Qwen3_5Config as C, Qwen3_5ForConditionalGeneration as M
    elif family.startswith("qwen3_vl"):
        from transformers import Qwen3VLConfig as C, Qwen3VLForConditionalGeneration as M
    elif family.startswith("qwen2_5_vl"):
        from transformers import Qwen2_5_VLConfig as C, Qwen2_5_VLForConditionalGeneration as M
    else:
        from transformers import Qwen2VLConfig as C, Qwen2VLForConditionalGeneration as M
    # MoE: HF's per-expert loop (the eager experts), not its grouped_mm kernel (no float64).
    extra = dict(experts_implementation="eager") if family.endswith("_moe") else {}
    model = M._from_config(C(**cfg_dict), attn_implementation="eager", dtype=torch.float32, **extra)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif family.startswith("qwen3_5") and "language_model" in n and "norm" in n \
                    and "linear_attn.norm" not in n:  # Qwen3.5's zero-centred RMSNorms: scale 1 + w
                p.normal_(0.0, 0.2)
            elif "norm" in n or "ln_q" in n:  # (Qwen3: also q_norm, k_norm, merger norms)
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in n:
                p.normal_(0.0, embed_std)
            elif "pos_embed" in n:  # Qwen3's learned position table: O(1) like the patches
                p.normal_(0.0, 0.5)
            elif p.dim() == 3:  # fused experts [E, out, in]: fan-in = in
                p.normal_(0.0, p.shape[-1] ** -0.5)
            else:  # matrices (and the conv3d patch embedding): fan-in scaling
                p.normal_(0.0, (p.numel() // p.shape[0]) ** -0.5)
    return model.eval()


def make_batch(spec, gen, patch=14):
    seqs, images, answers = [], [], []
    for items, answer in spec["seqs"]:
        ids = []
        for it in items:
            if isinstance(it, int):
                ids += torch.randint(4, VS, (it,), generator=gen).tolist()
            else:
                gh, gw = it
                ids += [VS] + [IMG] * (gh * gw // 4) + [VE]
                images.append(it)
        seqs.append(ids)
        answers.append(answer)
    L = max(len(s) for s in seqs)
    B = len(seqs)
    input_ids = torch.full((B, L), PAD, dtype=torch.int64)
    mask = torch.zeros((B, L), dtype=torch.int64)
    labels = torch.full((B, L), -100, dtype=torch.int64)
    for i, (s, a) in enumerate(zip(seqs, answers)):
        off = L - len(s) if spec["pad"] == "left" else 0
        input_ids[i, off:off + len(s)] = torch.tensor(s)
        mask[i, off:off + len(s)] = 1
        labels[i, off + len(s) - a:off + len(s)] = torch.tensor(s[len(s) - a:])
    out = dict(input_ids=input_ids, attention_mask=mask, labels=labels)
    if images:
        out["image_grid_thw"] = torch.tensor([[1, gh, gw] for gh, gw in images], dtype=torch.int64)
        rows = sum(gh * gw for gh, gw in images)
        out["pixel_values"] = torch.randn(rows, 3 * 2 * patch * patch, generator=gen)
    return out


def run_batch(model, io, dtype, aux_coef=None):
    captured = {}

    def grab(_module, args):
        captured["position_ids"] = args[1].detach().clone()

    hook = model.model.language_model.rotary_emb.register_forward_pre_hook(grab)
    model.zero_grad(set_to_none=True)
    kwargs = dict(input_ids=io["input_ids"], attention_mask=io["attention_mask"])
    if "pixel_values" in io:
        img = model.config.image_token_id  # the model's own id (tests may bring other configs)
        kwargs.update(pixel_values=io["pixel_values"].to(dtype), image_grid_thw=io["image_grid_thw"],
                      mm_token_type_ids=(io["input_ids"] == img).to(torch.int32))
    if aux_coef is not None:
        kwargs["output_router_logits"] = True
    out = model(**kwargs)
    hook.remove()
    logits = out.logits.float()  # as HF's own causal-LM loss (and vlmtrain) do
    V = logits.shape[-1]
    lb = io["labels"][:, 1:].reshape(-1)
    loss_sum = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), lb,
                                                 ignore_index=-100, reduction="sum")
    if aux_coef is not None:  # the objective: summed cross-entropy + coef x load-balancing loss
        (loss_sum + aux_coef * out.aux_loss).backward()
    else:
        loss_sum.backward()
    pos = captured["position_ids"]
    if pos.dim() == 2:
        pos = pos[None]
    pos = pos.expand(3, *io["input_ids"].shape).contiguous()
    res = dict(io, position_ids=pos, logits=logits.detach().contiguous(),
               loss_sum=loss_sum.detach().reshape(1),
               n_tokens=torch.tensor([int((lb != -100).sum())], dtype=torch.int64))
    if aux_coef is not None:
        res.update(aux_loss=out.aux_loss.detach().float().reshape(1), aux_coef=torch.tensor([aux_coef]))
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().contiguous()
             for n, p in model.named_parameters()}
    return res, grads


# Greedy `generate` references (families whose decoding keeps more than a KV cache: Qwen3.5's
# conv and recurrent states): GENERATE_TOKENS new tokens per row, no eos (every row runs to
# the end), pad id PAD; fp32, after the forward passes.
GENERATE = {"qwen3_5": ["images_left", "mixed_left", "text_left"],
            "qwen3_vl_moe": ["images_left", "text_left"], "qwen3_5_moe": ["mixed_left", "text_left"]}
GENERATE_TOKENS = 12


def run_generate(model, io):
    kwargs = dict(input_ids=io["input_ids"], attention_mask=io["attention_mask"], max_new_tokens=GENERATE_TOKENS,
                  do_sample=False, eos_token_id=None, pad_token_id=PAD)
    if "pixel_values" in io:
        img = model.config.image_token_id
        kwargs.update(pixel_values=io["pixel_values"], image_grid_thw=io["image_grid_thw"],
                      mm_token_type_ids=(io["input_ids"] == img).to(torch.int32))
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(**kwargs)
    return out[:, io["input_ids"].shape[1]:].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers
    from safetensors.torch import save_file
    torch.set_num_threads(1)  # tiny tensors: threads only cost time (20x on a loaded 2-core box)
    os.makedirs(args.out, exist_ok=True)
    short = [b for b in BATCHES if b not in LONG_BATCHES]
    plan = [(f, c, PASSES, short + FAMILY_BATCHES.get(f, [])) for f, c in FAMILIES.items()]
    plan += [(f, c, {"float32": PASSES["float32"]}, REAL_BATCHES + FAMILY_BATCHES.get(f, []))
             for f, c in REAL.items()]
    # Qwen3.5 last, then the MoE families, so that the other families keep their seeds (1000 +
    # their index).
    plan.sort(key=lambda entry: (entry[0] in MOE_AUX, entry[0].startswith("qwen3_5")))
    for fi, (family, cfg_dict, passes, batches) in enumerate(plan):
        torch.manual_seed(1000 + fi)
        model = build(family, cfg_dict)
        model.save_pretrained(os.path.join(args.out, family))
        for dtype_name, (dtype, attn) in passes.items():
            model.to(dtype).set_attn_implementation(attn)
            for bi, bname in enumerate(batches):
                spec = BATCHES[bname]
                gen = torch.Generator().manual_seed(100 * fi + bi)
                exact = family.startswith("qwen3_5") and dtype == torch.float64
                with Float64DeltaRule() if exact else contextlib.nullcontext():
                    res, grads = run_batch(model, make_batch(spec, gen, patch_size(cfg_dict)), dtype)
                base = os.path.join(args.out, f"{family}.{dtype_name}.{bname}")
                save_file(res, base + ".io.safetensors")
                save_file(grads, base + ".grads.safetensors")
                if bname in MOE_AUX.get(family, []):
                    gen = torch.Generator().manual_seed(100 * fi + bi)  # the same batch
                    with Float64DeltaRule() if exact else contextlib.nullcontext():
                        res, grads = run_batch(model, make_batch(spec, gen, patch_size(cfg_dict)), dtype, AUX_COEF)
                    save_file(res, base + ".aux.io.safetensors")
                    save_file(grads, base + ".aux.grads.safetensors")
                print(f"{family}.{dtype_name}.{bname}: loss_sum {res['loss_sum'].item():.6f} over "
                      f"{res['n_tokens'].item()} tokens, logits {tuple(res['logits'].shape)}, "
                      f"max |logit| {res['logits'].abs().max().item():.3f}", file=sys.stderr)
        if family in GENERATE:
            model.to(torch.float32).set_attn_implementation("eager")
            for bname in GENERATE[family]:
                bi = batches.index(bname)
                gen = torch.Generator().manual_seed(100 * fi + bi)  # the forward pass's batch
                io = make_batch(BATCHES[bname], gen, patch_size(cfg_dict))
                io["generated"] = run_generate(model.eval(), io)
                save_file(io, os.path.join(args.out, f"{family}.generate.{bname}.safetensors"))
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "families": list(FAMILIES), "dtypes": list(PASSES), "batches": list(BATCHES),
                   "real_layers": list(REAL), "real_batches": REAL_BATCHES,
                   "family_batches": FAMILY_BATCHES, "generate": GENERATE, "moe_aux": MOE_AUX,
                   "generate_tokens": GENERATE_TOKENS}, f)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
