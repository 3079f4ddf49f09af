#!/usr/bin/env python3
"""Regenerates the built-in model cards (resources/cards/*.toml) from the facts table below.

Facts: layers / hidden size / KV heads / context come from each model's published config.json
(num_hidden_layers, hidden_size, num_key_value_heads, max_position_embeddings); sizes are the
byte totals of the published MLX weight files as recorded in exo's catalog. Rows marked
'estimate' have no recorded size: storage = parameters x bits/8 x 1.125 (MLX group-64 scales
and biases), rounded; treat them as +-10%. Run: python3 resources/cards/gen.py
"""
import os

LLAMA = dict(family="llama", caps=["text"], sampling={"temperature": 0.6, "top_p": 0.9})
Q3_THINK = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
Q3_NOTHINK = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0}
QWEN3 = dict(family="qwen", caps=["text", "thinking", "thinking_toggle"], sampling=Q3_THINK,
             non_thinking=Q3_NOTHINK)
Q35_CAPS = ["text", "thinking", "thinking_toggle", "vision"]
Q35_BIG = dict(family="qwen", caps=Q35_CAPS,
               sampling=dict(Q3_THINK, repetition_penalty=1.0, presence_penalty=0.0),
               non_thinking=dict(Q3_NOTHINK, repetition_penalty=1.0, presence_penalty=1.5))
Q35_SMALL = dict(Q35_BIG, sampling=dict(Q3_THINK, temperature=1.0, repetition_penalty=1.0,
                                        presence_penalty=1.5))


EST = "storage size is an estimate (parameters x bits x 1.125), +-10%; no recorded size"


def est(params_b, bits):
    return int(params_b * 1e9 * bits / 8 * 1.125)


GPT_OSS = dict(family="gpt-oss", caps=["text", "thinking"], sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0})
GPT_OSS_NOTE = ("OpenAI's own checkpoint (MXFP4 experts, bf16 rest); storage size computed from the shapes "
                "(expert weights x 4.25 bits + the rest x 16), not recorded; loaded, the experts take 9 bits "
                "a weight (read as MLX 8-bit); no tensor parallel yet")


def gpt_oss_bytes(params, layers, experts, hidden=2880, expert_inter=2880):
    """Published gpt-oss checkpoint size: MXFP4 experts (4 bits + a byte per 32), bf16 the rest."""
    expert_params = layers * experts * (hidden * 2 * expert_inter + expert_inter * hidden)
    return int(expert_params * 4.25 / 8 + (params - expert_params) * 2)

# id, layers, hidden, kv heads, tensor, quant, base, context, bytes, template, note
CARDS = [
    ("mlx-community/Llama-3.2-1B-Instruct-4bit", 16, 2048, 8, True, "4bit", "Llama 3.2 1B", 131072, 729808896, LLAMA, ""),
    ("mlx-community/Llama-3.2-3B-Instruct-4bit", 28, 3072, 8, True, "4bit", "Llama 3.2 3B", 131072, 1863319552, LLAMA, ""),
    ("mlx-community/Llama-3.2-3B-Instruct-8bit", 28, 3072, 8, True, "8bit", "Llama 3.2 3B", 131072, 3501195264, LLAMA, ""),
    ("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", 32, 4096, 8, True, "4bit", "Llama 3.1 8B", 131072, 4637851648, LLAMA, ""),
    ("mlx-community/Meta-Llama-3.1-8B-Instruct-8bit", 32, 4096, 8, True, "8bit", "Llama 3.1 8B", 131072, 8954839040, LLAMA, ""),
    ("mlx-community/Meta-Llama-3.1-8B-Instruct-bf16", 32, 4096, 8, True, "bf16", "Llama 3.1 8B", 131072, 16882073600, LLAMA, ""),
    ("mlx-community/Meta-Llama-3.1-70B-Instruct-4bit", 80, 8192, 8, True, "4bit", "Llama 3.1 70B", 131072, 40652242944, LLAMA, ""),
    ("mlx-community/Qwen3-0.6B-4bit", 28, 1024, 8, False, "4bit", "Qwen3 0.6B", 32768, 342884352, QWEN3, ""),
    ("mlx-community/Qwen3-0.6B-8bit", 28, 1024, 8, False, "8bit", "Qwen3 0.6B", 32768, 698351616, QWEN3, ""),
    ("mlx-community/Qwen3-1.7B-4bit", 28, 2048, 8, True, "4bit", "Qwen3 1.7B", 32768, est(2.03, 4), QWEN3, EST),
    ("mlx-community/Qwen3-4B-4bit", 36, 2560, 8, True, "4bit", "Qwen3 4B", 32768, est(4.02, 4), QWEN3, EST),
    ("mlx-community/Qwen3-8B-4bit", 36, 4096, 8, True, "4bit", "Qwen3 8B", 32768, est(8.19, 4), QWEN3, EST),
    ("mlx-community/Qwen3-14B-4bit", 40, 5120, 8, True, "4bit", "Qwen3 14B", 32768, est(14.77, 4), QWEN3, EST),
    ("mlx-community/Qwen3-32B-4bit", 64, 5120, 8, True, "4bit", "Qwen3 32B", 32768, est(32.76, 4), QWEN3, EST),
    ("mlx-community/Qwen3-30B-A3B-4bit", 48, 2048, 4, True, "4bit", "Qwen3 30B", 32768, 17612931072, QWEN3, ""),
    ("mlx-community/Qwen3-30B-A3B-8bit", 48, 2048, 4, True, "8bit", "Qwen3 30B", 32768, 33279705088, QWEN3, ""),
    ("mlx-community/Qwen3-235B-A22B-Instruct-2507-4bit", 94, 4096, 4, True, "4bit", "Qwen3 235B", 262144, 141733920768,
     dict(QWEN3, caps=["text"], sampling=Q3_NOTHINK, non_thinking=None), "instruct-only 2507 release: no thinking mode"),
    ("mlx-community/Qwen3.5-2B-MLX-8bit", 24, 2048, 2, True, "8bit", "Qwen3.5 2B", 262144, 2662787264, Q35_SMALL, ""),
    ("mlx-community/Qwen3.5-9B-4bit", 32, 4096, 4, True, "4bit", "Qwen3.5 9B", 262144, 5950062560, Q35_SMALL, ""),
    ("mlx-community/Qwen3.5-27B-4bit", 64, 5120, 4, True, "4bit", "Qwen3.5 27B", 262144, 16054266848, Q35_BIG, ""),
    ("mlx-community/Qwen3.5-35B-A3B-4bit", 40, 2048, 2, True, "4bit", "Qwen3.5 35B A3B", 262144, 20391405152, Q35_SMALL, ""),
    ("mlx-community/Qwen3.5-122B-A10B-4bit", 48, 3072, 2, True, "4bit", "Qwen3.5 122B A10B", 262144, 69593314272, Q35_BIG, ""),
    ("mlx-community/Qwen3.5-397B-A17B-4bit", 60, 4096, 2, True, "4bit", "Qwen3.5 397B A17B", 262144, 223860768352, Q35_BIG, ""),
    ("mlx-community/gpt-oss-20b-MXFP4-Q8", 24, 2880, 8, True, "MXFP4-Q8", "GPT-OSS 20B", 131072, 12025908224,
     dict(family="gpt-oss", caps=["text", "thinking"], sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0}), ""),
    ("mlx-community/gpt-oss-120b-MXFP4-Q8", 36, 2880, 8, True, "MXFP4-Q8", "GPT-OSS 120B", 131072, 70652212224,
     dict(family="gpt-oss", caps=["text", "thinking"], sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0}), ""),
    ("openai/gpt-oss-20b", 24, 2880, 8, False, "MXFP4", "GPT-OSS 20B", 131072, gpt_oss_bytes(20.91e9, 24, 32), GPT_OSS, GPT_OSS_NOTE),
    ("openai/gpt-oss-120b", 36, 2880, 8, False, "MXFP4", "GPT-OSS 120B", 131072, gpt_oss_bytes(116.83e9, 36, 128), GPT_OSS, GPT_OSS_NOTE),
    ("mlx-community/DeepSeek-V3.1-4bit", 61, 7168, 128, True, "4bit", "DeepSeek V3.1", 131072, 405874409472,
     dict(family="deepseek", caps=["text", "thinking", "thinking_toggle"], sampling={"temperature": 0.6, "top_p": 0.95}),
     "MLA: num_key_value_heads equals the query heads"),
    ("mlx-community/DeepSeek-V3.1-8bit", 61, 7168, 128, True, "8bit", "DeepSeek V3.1", 131072, 765577920512,
     dict(family="deepseek", caps=["text", "thinking", "thinking_toggle"], sampling={"temperature": 0.6, "top_p": 0.95}),
     "MLA: num_key_value_heads equals the query heads"),
]


def fmt(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def table(name, d):
    out = [f"\n[{name}]"]
    for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty"):
        if k in d:
            out.append(f"{k} = {fmt(d[k])}")
    return out


here = os.path.dirname(os.path.abspath(__file__))
for (mid, layers, hidden, kv, tensor, quant, base, ctx, size, tpl, note) in CARDS:
    lines = [f"# {base} ({quant}) - generated by gen.py; edit the table there."]
    if note:
        lines.append(f"# note: {note}")
    lines += [
        f"model_id = {fmt(mid)}", f"n_layers = {layers}", f"hidden_size = {hidden}",
        f"num_key_value_heads = {kv}", f"supports_tensor = {fmt(tensor)}",
        'tasks = ["TextGeneration"]', f"family = {fmt(tpl['family'])}",
        f"quantization = {fmt(quant)}", f"base_model = {fmt(base)}",
        f"capabilities = {fmt(tpl['caps'])}", f"context_length = {ctx}",
        "", "[storage_size]", f"in_bytes = {size}",
    ]
    lines += table("sampling_defaults", tpl["sampling"])
    if tpl.get("non_thinking"):
        lines += table("sampling_defaults.non_thinking", tpl["non_thinking"])
    with open(os.path.join(here, mid.replace("/", "--") + ".toml"), "w") as f:
        f.write("\n".join(lines) + "\n")
print(f"wrote {len(CARDS)} cards")
