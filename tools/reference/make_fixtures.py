#!/usr/bin/env python3
"""Reference fixtures from Hugging Face transformers for the tiny models of tools/mkmodel.

For each model named in tools/mkmodel/tiny-models.json this script
  1. generates it with build/tools/mkmodel (same arguments and seed as the tests use) and checks
     that model.safetensors has the sha256 the development machine got (--expected-sha),
  2. loads it with transformers in float32 on the CPU (eager attention): dense checkpoints as they
     are (bf16 upcast), MLX affine-quantized ones dequantized here (w = scale * q + bias, in
     float32) into a plain Hugging Face checkpoint first, so the reference is "transformers on the
     dequantized weights"; it checks that no weight is missing or left at its random init,
  3. writes tests/fixtures/reference/<model>.json: tokenization of tricky strings, prompts (raw text
     and chat-rendered with tokenizer.apply_chat_template), prompt token ids, teacher-forced top-10
     logits per prompt position, a strided sample of the last position's full logits, and a greedy
     continuation with top-5 logprobs per step. Format: tests/fixtures/reference/README.md.

Runs where torch 2.11 + transformers 5.17 are installed (the GPU machine); no network needed.
`--sha-only` needs neither: it generates the models and prints their sha256 as JSON (run it on the
development machine to make --expected-sha). Exact command: tools/reference/README.md.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys

GREEDY_STEPS = 32
TOP_TEACHER = 10
TOP_GREEDY = 5
LAST_LOGITS_SAMPLES = 1024

TOKENIZATION_STRINGS = [
    "Hello, world!",
    " leading space and trailing space ",
    "multiple   spaces\tand\ttabs\n\nnewlines\r\n",
    "Ünïcödé façade naïve café Ångström",
    "日本語のテキストと中文文本",
    "emoji 😀👍🏽 and a ZWJ family 👨‍👩‍👧",
    "numbers 1234567890 3.14159 1,000,000",
    "code: def f(x):\n    return x**2  # comment",
    "'s 't 're 've 'm 'll 'd I'M YOU'RE",
    "<|im_start|>user <s> </s> <|begin_of_text|> special-looking text",
]

PROMPTS = [
    {"name": "raw-capital", "kind": "raw", "text": "The capital of France is"},
    {"name": "raw-story", "kind": "raw", "text": "Once upon a time, in a land far away,"},
    {"name": "raw-tricky", "kind": "raw", "text": "Héllo wörld 😀 12345\n\tdef f(x): return x**2"},
    {"name": "chat-single", "kind": "chat",
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "chat-multi", "kind": "chat",
     "messages": [{"role": "system", "content": "You are a terse assistant."},
                  {"role": "user", "content": "Name a prime number."},
                  {"role": "assistant", "content": "Seven."},
                  {"role": "user", "content": "And another one?"}]},
]

# gpt-oss (Harmony) prompts: tool definitions, reasoning effort, an earlier tool call and its
# result, rendered by the publisher's chat_template.jinja that mkmodel copies into the model.
# The template prints the current date; it is fixed through strftime_now's format argument no
# more than the others, so the rendered text is recorded and the engine's render is compared
# with today's date replaced (see tests/fixtures/reference/README.md).
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
GPT_OSS_PROMPTS = [
    {"name": "chat-tools", "kind": "chat", "tools": [WEATHER_TOOL], "template_kwargs": {"reasoning_effort": "low"},
     "messages": [{"role": "system", "content": "You are a weather bot."},
                  {"role": "user", "content": "What is the weather in Paris?"}]},
    {"name": "chat-tool-result", "kind": "chat", "tools": [WEATHER_TOOL], "template_kwargs": {"reasoning_effort": "high"},
     "messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "thinking": "I should call the tool.",
                   "tool_calls": [{"id": "call_1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}]},
]

# The date chat templates print (gpt-oss: "Current date: ..."), pinned so that prompts are the
# same on every machine and every day: the C engine reads SOURCE_DATE_EPOCH for strftime_now.
TEMPLATE_EPOCH = 1768435200  # 2026-01-15 00:00:00 UTC
TEMPLATE_DATE = "2026-01-15"


def pin_template_date():
    """Makes transformers' strftime_now (datetime.now() in chat_template_utils) return TEMPLATE_EPOCH."""
    import datetime as dt
    import types
    import transformers.utils.chat_template_utils as ctu

    class FixedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime.fromtimestamp(TEMPLATE_EPOCH, tz or dt.timezone.utc).replace(
                tzinfo=None if tz is None else tz)

    current = getattr(ctu, "datetime", None)
    if isinstance(current, types.ModuleType):
        ctu.datetime = types.SimpleNamespace(datetime=FixedDatetime, **{k: getattr(dt, k) for k in ("date", "timezone", "timedelta")})
    else:
        ctu.datetime = FixedDatetime


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_specs(path):
    specs = json.load(open(path))
    specs.pop("_comment", None)
    return specs


def generate(mkmodel, name, args, work, tokenizers):
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if tokenizers:
        env["EXO_TOKENIZERS_DIR"] = tokenizers
    subprocess.run([mkmodel, "--out", out] + args, check=True, env=env)
    return out


# ---- safetensors reading (numpy only; bf16 and packed uint32 need no torch) ----

def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    base = 8 + hl
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=e - b, offset=base + b)
        dt = t["dtype"]
        if dt == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            arr = raw.view(np.float16).astype(np.float32)
        elif dt == "F32":
            arr = raw.view(np.float32).copy()
        elif dt == "U32":
            arr = raw.view(np.uint32).copy()
        elif dt == "U8":
            arr = raw.copy()
        else:
            raise SystemExit(f"{path}: unexpected dtype {dt} for {name}")
        out[name] = arr.reshape(t["shape"])
    return out


def dequantize(packed, scales, biases, bits, group):
    """MLX affine: value i of a row at bit i*bits of the little-endian uint32 stream."""
    import numpy as np
    lead = packed.shape[:-1]
    cols = packed.shape[-1] * 32 // bits
    stream = np.unpackbits(packed.reshape(-1).view(np.uint8), bitorder="little")
    stream = stream.reshape(-1, bits).astype(np.uint32)
    q = (stream << np.arange(bits, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    q = q.reshape(*lead, cols // group, group).astype(np.float32)
    w = q * scales[..., None] + biases[..., None]
    return w.reshape(*lead, cols).astype(np.float32)


# OCP MXFP4 (E2M1 values, one power-of-two scale per 32): what transformers' mxfp4 integration
# does to gpt-oss `<name>_blocks` [E, out, in/32, 16] + `<name>_scales` [E, out, in/32] (low nibble
# first, scale byte - 127 the exponent), giving [E, out, in].
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantize_mxfp4(blocks, scales):
    import numpy as np
    lut = np.array(FP4_VALUES, dtype=np.float32)
    vals = np.empty(blocks.shape[:-1] + (32,), dtype=np.float32)
    vals[..., 0::2] = lut[blocks & 0x0F]
    vals[..., 1::2] = lut[blocks >> 4]
    vals = np.ldexp(vals, (scales.astype(np.int32) - 127)[..., None])
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1)


def gpt_oss_checkpoint(src, dst, experts_out_in=False):
    """A float32 gpt-oss checkpoint in the layout of transformers' GptOssExperts ([E, in, out]
    gate_up_proj / down_proj), MXFP4 experts dequantized; experts_out_in stores [E, out, in]."""
    import numpy as np
    import torch
    from safetensors.torch import save_file
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    out = {}
    for name, arr in tensors.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            arr = dequantize_mxfp4(arr, tensors[base + "_scales"])  # [E, out, in]
            out[base] = arr if experts_out_in else np.swapaxes(arr, 1, 2)
            continue
        if experts_out_in and name.endswith(("gate_up_proj", "down_proj")):
            arr = np.swapaxes(arr, 1, 2)
        out[name] = arr
    out = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in out.items()}
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return {k: v.numpy() for k, v in out.items()}


def dequantized_checkpoint(src, dst):
    """Writes a float32 Hugging Face checkpoint of an MLX-quantized model directory."""
    import numpy as np
    import torch
    from safetensors.torch import save_file
    cfg = json.load(open(os.path.join(src, "config.json")))
    quant = cfg.pop("quantization")
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "float32"
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    out = {}
    for name, arr in tensors.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base and base + ".scales" in tensors:
            q = quant.get(base, quant)
            arr = dequantize(arr, tensors[base + ".scales"], tensors[base + ".biases"], q["bits"], q["group_size"])
        if ".mlp.switch_mlp." in name:  # stacked experts -> per-expert HF names
            prefix, proj = name.split(".mlp.switch_mlp.")
            for e in range(arr.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}"] = torch.from_numpy(np.ascontiguousarray(arr[e]))
            continue
        out[name] = torch.from_numpy(np.ascontiguousarray(arr))
    os.makedirs(dst, exist_ok=True)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    return {k: v.numpy() for k, v in out.items()}


def hf_checkpoint(model_dir, tensors):
    """Dense checkpoint with stacked (mlx layout) experts split into HF names."""
    import numpy as np
    out = {}
    for name, arr in tensors.items():
        if ".mlp.switch_mlp." in name:
            prefix, proj = name.split(".mlp.switch_mlp.")
            for e in range(arr.shape[0]):
                out[f"{prefix}.mlp.experts.{e}.{proj}"] = np.ascontiguousarray(arr[e])
        else:
            out[name] = arr
    return out


# The hybrids (GatedDeltaNet + gated attention). transformers 5 fuses MoE experts into
# mlp.experts.gate_up_proj / down_proj, and not every hybrid model type has a registered checkpoint
# conversion for per-expert names, so these are built from their config and filled here by name
# (each parameter from the tensor of the same name, fused experts stacked from per-expert ones),
# with every shape checked and every checkpoint tensor accounted for.
HYBRID_TYPES = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}


def fused_expert_value(name, ckpt, used):
    import re
    import numpy as np
    m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", name)
    if not m:
        return None
    pre, which = m.group(1), m.group(2)
    n = 0
    while f"{pre}.{n}.down_proj.weight" in ckpt:
        n += 1
    parts = []
    for e in range(n):
        keys = ([f"{pre}.{e}.gate_proj.weight", f"{pre}.{e}.up_proj.weight"] if which == "gate_up_proj"
                else [f"{pre}.{e}.down_proj.weight"])
        used.update(keys)
        parts.append(np.concatenate([ckpt[k] for k in keys], axis=0))
    return np.stack(parts) if parts else None


def load_hybrid(load_dir, ckpt, cfg):
    import torch
    import transformers
    from transformers import AutoConfig
    cls = getattr(transformers, cfg["architectures"][0])
    try:
        config = AutoConfig.from_pretrained(load_dir)
    except (ValueError, KeyError):  # a text-only model type AutoConfig does not list
        config = cls.config_class.from_pretrained(load_dir)
    config._attn_implementation = "eager"
    model = cls(config).float().eval()
    state, used, problems = {}, set(), {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    for name, p in model.named_parameters():
        arr = ckpt.get(name)
        if arr is not None:
            used.add(name)
        else:
            arr = fused_expert_value(name, ckpt, used)
        if arr is None:
            problems["missing_keys"].append(name)
            continue
        t = torch.from_numpy(arr.astype("float32"))
        if tuple(t.shape) != tuple(p.shape) and t.dim() == 3 and tuple(t.transpose(1, 2).shape) == tuple(p.shape):
            t = t.transpose(1, 2)  # experts stored [E, in, out]
        if tuple(t.shape) != tuple(p.shape):
            problems["mismatched_keys"].append(f"{name}: {tuple(t.shape)} vs {tuple(p.shape)}")
            continue
        state[name] = t.contiguous()
    problems["unexpected_keys"] = sorted(set(ckpt) - used)
    model.load_state_dict(state, strict=False)
    return model, problems


def load_model(model_dir, work):
    import torch
    from transformers import AutoModelForCausalLM
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    if cfg.get("model_type") == "gpt_oss":
        return load_gpt_oss(model_dir, cfg)
    if "quantization" in cfg:
        load_dir = model_dir + "-dequantized"
        shutil.rmtree(load_dir, ignore_errors=True)
        ckpt = dequantized_checkpoint(model_dir, load_dir)
        weights = "MLX affine dequantized in float32 (scale*q+bias), loaded as a float32 HF checkpoint"
    else:
        ckpt = hf_checkpoint(model_dir, read_safetensors(os.path.join(model_dir, "model.safetensors")))
        load_dir = model_dir
        if any(".mlp.switch_mlp." in k for k in read_safetensors(os.path.join(model_dir, "model.safetensors"))):
            load_dir = model_dir + "-hf"
            shutil.rmtree(load_dir, ignore_errors=True)
            os.makedirs(load_dir)
            from safetensors.torch import save_file
            save_file({k: torch.from_numpy(v) for k, v in ckpt.items()}, os.path.join(load_dir, "model.safetensors"),
                      metadata={"format": "pt"})
            for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                shutil.copy(os.path.join(model_dir, f), os.path.join(load_dir, f))
        weights = f"{cfg.get('torch_dtype')} weights upcast to float32"
    model, check = load_checked(load_dir, ckpt, cfg)
    if not check["ok"]:
        raise SystemExit(f"{model_dir}: weights did not load cleanly: {json.dumps(check)[:2000]}")
    return model, weights, check, load_dir


def load_gpt_oss(model_dir, cfg):
    """gpt-oss: MXFP4 experts dequantized here, like the MLX models; tries transformers' expert
    layout [E, in, out] first and [E, out, in] if that one does not load cleanly."""
    mxfp4 = cfg.get("quantization_config", {}).get("quant_method") == "mxfp4"
    weights = ("MXFP4 experts dequantized in float32 (E2M1 value * 2^(scale-127)), the rest bf16, "
               "loaded as a float32 HF checkpoint") if mxfp4 else "bfloat16 weights upcast to float32"
    tried = []
    for out_in in (False, True):
        load_dir = model_dir + ("-f32-outin" if out_in else "-f32")
        shutil.rmtree(load_dir, ignore_errors=True)
        ckpt = gpt_oss_checkpoint(model_dir, load_dir, experts_out_in=out_in)
        try:
            model, check = load_checked(load_dir, ckpt)
        except Exception as e:  # noqa: BLE001 - a shape mismatch raises; try the other layout
            tried.append({"experts_out_in": out_in, "error": f"{type(e).__name__}: {str(e)[:800]}"})
            continue
        check["experts_layout"] = "[E, out, in]" if out_in else "[E, in, out]"
        if check["ok"]:
            if mxfp4:
                check["transformers_mxfp4"] = transformers_mxfp4_check(model_dir, model)
            return model, weights, check, load_dir
        tried.append(check)
    raise SystemExit(f"{model_dir}: weights did not load cleanly: {json.dumps(tried)[:3000]}")


def transformers_mxfp4_check(model_dir, model):
    """Loads the MXFP4 directory with transformers' own mxfp4 integration (dequantize=True) and
    compares its logits with ours: proof that the dequantization above is transformers' own."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, Mxfp4Config
        theirs = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                                      quantization_config=Mxfp4Config(dequantize=True)).eval()
        ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
        with torch.no_grad():
            a = model(ids).logits.float()
            b = theirs(ids).logits.float()
        return {"max_abs_logit_diff": r((a - b).abs().max(), 7)}
    except Exception as e:  # noqa: BLE001 - recorded, not fatal: our own dequantization is the reference
        return {"error": f"{type(e).__name__}: {str(e)[:500]}"}


def load_checked(load_dir, ckpt, cfg=None):
    import torch
    from transformers import AutoModelForCausalLM
    if cfg and cfg.get("model_type") in HYBRID_TYPES:
        model, info = load_hybrid(load_dir, ckpt, cfg)
    else:
        model, info = AutoModelForCausalLM.from_pretrained(load_dir, dtype=torch.float32, attn_implementation="eager",
                                                           output_loading_info=True)
    model.eval()
    # Every checkpoint value must be in the model: compare sums of squares (robust to the fused
    # expert layouts transformers 5 converts MoE checkpoints into), and nothing may be missing.
    seen, model_sumsq = set(), 0.0
    for _, p in model.named_parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        model_sumsq += float((p.detach().double() ** 2).sum())
    ckpt_sumsq = float(sum(float((v.astype("float64") ** 2).sum()) for v in ckpt.values()))
    problems = {k: [str(x) for x in info.get(k, [])] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    ok = not any(problems.values()) and abs(model_sumsq - ckpt_sumsq) <= 1e-6 * ckpt_sumsq
    check = dict(problems, model_sum_of_squares=model_sumsq, checkpoint_sum_of_squares=ckpt_sumsq, ok=ok)
    return model, check


def r(x, nd=5):
    return round(float(x), nd)


def run_prompt(model, ids):
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lse = torch.logsumexp(logits, dim=-1)
    top = torch.topk(logits, TOP_TEACHER, dim=-1)
    teacher = {
        "top10": [[[int(i), r(v)] for i, v in zip(top.indices[p].tolist(), top.values[p].tolist())]
                  for p in range(len(ids))],
        "logsumexp": [r(x) for x in lse.tolist()],
    }
    last = logits[-1]
    stride = max(1, last.shape[0] // LAST_LOGITS_SAMPLES)
    teacher["last_logits"] = {
        "vocab": int(last.shape[0]), "start": 0, "stride": stride,
        "values": [r(x) for x in last[::stride].tolist()],
        "mean": r(last.mean()), "std": r(last.std()), "logsumexp": r(lse[-1]),
        "argmax": int(last.argmax()),
    }
    # Greedy continuation, recomputed from the whole sequence each step (no cache: the plainest
    # reference). EOS does not stop it; consumers stop where the engine would.
    seq, steps = list(ids), []
    for _ in range(GREEDY_STEPS):
        with torch.no_grad():
            lg = model(torch.tensor([seq])).logits[0, -1].float()
        lp = torch.log_softmax(lg, dim=-1)
        top = torch.topk(lg, TOP_GREEDY)
        tok = int(top.indices[0])
        steps.append({"token": tok, "logprob": r(lp[tok], 6),
                      "top5": [[int(i), r(lp[i], 6)] for i in top.indices.tolist()],
                      "gap": r(top.values[0] - top.values[1], 6)})
        seq.append(tok)
    return teacher, steps


def fixture_for(name, args, model_dir, sha, expected, tokenizer_dir_note):
    import torch
    import transformers
    from transformers import AutoTokenizer
    model, weights, check, load_dir = load_model(model_dir, None)
    tok = AutoTokenizer.from_pretrained(model_dir)
    pin_template_date()
    cfg = model.config
    fx = {
        "model": name,
        "mkmodel_args": args,
        "mkmodel_command": "build/tools/mkmodel --out DIR " + " ".join(args),
        "safetensors_sha256": sha,
        "sha256_matches_dev_machine": expected is not None and sha == expected,
        "reference": {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                      "device": "cpu", "attn_implementation": "eager", "weights": weights},
        "load_check": check,
        "config": {"model_type": cfg.model_type, "vocab_size": cfg.vocab_size,
                   "rope_parameters": getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None),
                   "eos_token_id": cfg.eos_token_id, "bos_token_id": cfg.bos_token_id},
        "tokenization": [],
        "prompts": [],
    }
    for s in TOKENIZATION_STRINGS:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        fx["tokenization"].append({"text": s, "ids": ids,
                                   "ids_with_special": tok(s, add_special_tokens=True)["input_ids"],
                                   "decoded": tok.decode(ids)})
    gaps = []
    prompts = PROMPTS + (GPT_OSS_PROMPTS if cfg.model_type == "gpt_oss" else [])
    for p in prompts:
        entry = {"name": p["name"], "kind": p["kind"]}
        if p["kind"] == "raw":
            entry["text"] = p["text"]
            entry["add_special_tokens"] = True
            ids = tok(p["text"], add_special_tokens=True)["input_ids"]
        else:
            entry["messages"] = p["messages"]
            entry["add_generation_prompt"] = True
            extra = dict(p.get("template_kwargs") or {})
            if p.get("tools"):
                entry["tools"] = p["tools"]
                extra["tools"] = p["tools"]
            if p.get("template_kwargs"):
                entry["template_kwargs"] = p["template_kwargs"]
            text = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=False, **extra)
            if "Current date:" in text:
                entry["template_date"] = TEMPLATE_DATE if TEMPLATE_DATE in text else "not pinned"
            entry["text"] = text
            entry["add_special_tokens"] = False
            ids = tok(text, add_special_tokens=False)["input_ids"]
        entry["prompt_ids"] = ids
        teacher, steps = run_prompt(model, ids)
        entry["teacher_forced"] = teacher
        entry["greedy"] = {"tokens": [s["token"] for s in steps], "text": tok.decode([s["token"] for s in steps]),
                           "steps": steps}
        gaps += [s["gap"] for s in steps]
        fx["prompts"].append(entry)
    gaps.sort()
    fx["greedy_gap_stats"] = {"min": gaps[0], "median": gaps[len(gaps) // 2],
                              "fraction_above_1e-2": r(sum(g > 1e-2 for g in gaps) / len(gaps), 4)}
    # Does rope scaling change the outputs at these lengths? (So a wrong implementation is caught.)
    rp = fx["config"]["rope_parameters"]
    long_ids = fx["prompts"][1]["prompt_ids"] + fx["prompts"][1]["greedy"]["tokens"]
    if isinstance(rp, dict) and rp.get("rope_type", "default") != "default":
        fx["rope_scaling_effect"] = config_effect(load_dir, model, long_ids, "norope", rope_scaling=None)
    if cfg.model_type == "gpt_oss":  # what the features a naive engine would skip change
        fx["sliding_window_effect"] = config_effect(load_dir, model, long_ids, "nowindow",
                                                    sliding_window=None,
                                                    layer_types=["full_attention"] * cfg.num_hidden_layers)
        fx["swiglu_limit_effect"] = config_effect(load_dir, model, long_ids, "noclamp", swiglu_limit=1e9)
    return fx


def config_effect(load_dir, model, ids, tag, **changes):
    """Logits of the same weights under a changed config.json (rope scaling off, no window...)."""
    try:
        return _config_effect(load_dir, model, ids, tag, changes)
    except Exception as e:  # noqa: BLE001 - a diagnostic, not the reference
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def _config_effect(load_dir, model, ids, tag, changes):
    import torch
    from transformers import AutoModelForCausalLM
    cfg = json.load(open(os.path.join(load_dir, "config.json")))
    plain_dir = load_dir + "-" + tag
    shutil.rmtree(plain_dir, ignore_errors=True)
    shutil.copytree(load_dir, plain_dir)
    cfg.update(changes)
    json.dump(cfg, open(os.path.join(plain_dir, "config.json"), "w"), indent=2)
    plain = AutoModelForCausalLM.from_pretrained(plain_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        a = model(torch.tensor([ids])).logits[0]
        b = plain(torch.tensor([ids])).logits[0]
    return {"positions": len(ids), "changed": changes, "max_abs_logit_diff": r((a - b).abs().max()),
            "argmax_changes": int((a.argmax(-1) != b.argmax(-1)).sum())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mkmodel", default="build/tools/mkmodel")
    ap.add_argument("--models-json", default="tools/mkmodel/tiny-models.json")
    ap.add_argument("--tokenizers", default=None, help="directory of <name>/tokenizer.json (EXO_TOKENIZERS_DIR)")
    ap.add_argument("--work", default="/tmp/exo-reference-models")
    ap.add_argument("--out", default="tests/fixtures/reference")
    ap.add_argument("--expected-sha", default=None, help="JSON {model: sha256} from the development machine")
    ap.add_argument("--sha-only", action="store_true", help="generate and print sha256 of each model.safetensors")
    ap.add_argument("--models", nargs="*", default=None, help="subset of model names")
    a = ap.parse_args()
    specs = load_specs(a.models_json)
    names = a.models or list(specs)
    os.makedirs(a.work, exist_ok=True)
    shas = {}
    for n in names:
        d = generate(a.mkmodel, n, specs[n], a.work, a.tokenizers)
        shas[n] = sha256(os.path.join(d, "model.safetensors"))
    if a.sha_only:
        print(json.dumps(shas, indent=2))
        return 0
    expected = json.load(open(a.expected_sha)) if a.expected_sha else {}
    mismatch = {n: (shas[n], expected.get(n)) for n in names if expected and expected.get(n) != shas[n]}
    if mismatch:
        print(f"sha256 differs from the development machine: {mismatch}", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for n in names:
        try:
            fx = fixture_for(n, specs[n], os.path.join(a.work, n), shas[n], expected.get(n), a.tokenizers)
        except (Exception, SystemExit) as e:  # keep going: one run should say everything
            import traceback
            traceback.print_exc()
            print(f"{n}: FAILED: {e}", flush=True)
            failed.append(n)
            continue
        path = os.path.join(a.out, f"{n}.json")
        with open(path, "w") as f:
            json.dump(fx, f, ensure_ascii=False, separators=(",", ":"))
        g = fx["prompts"][0]["greedy"]
        print(f"{n}: sha ok={fx['sha256_matches_dev_machine']} load ok={fx['load_check']['ok']} "
              f"gap {fx['greedy_gap_stats']} first greedy {g['tokens'][:8]} rope {fx.get('rope_scaling_effect')} "
              f"size {os.path.getsize(path)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
