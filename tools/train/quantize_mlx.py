#!/usr/bin/env python3
"""MLX affine quantization of a Hugging Face safetensors checkpoint, as mlx-community publishes it
and as tools/mkmodel writes it: every Linear weight and the embedding become `<name>.weight`
uint32 [out, in*bits/32] (value i of a row at bit i*bits, little-endian), `<name>.scales` and
`<name>.biases` [out, in/group] in bf16, w = scale*q + bias with scale = (max-min)/(2^bits-1) and
bias = min per group, q rounded against the bf16-rounded scale and bias. Norms stay bf16.
config.json gets "quantization" and "quantization_config".

--method mse (default minmax) keeps the format and lowers the error: per group it tries ranges
narrower than [min, max] (clipping a few outliers often helps the other 63 values), then refits
scale and bias by least squares to the codes chosen, keeping whichever reconstructs the group's
weights with the smallest squared error (never worse than min/max: that is one of the candidates).

  python3 quantize_mlx.py SRC_DIR DST_DIR [--bits 4] [--group-size 64] [--method minmax|mse]

Needs numpy only (reads and writes safetensors itself). Also importable: quantize_dir().
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=e - b, offset=8 + hl + b)
        kinds = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U32": np.uint32}
        out[name] = (t["dtype"], raw.view(kinds[t["dtype"]]).reshape(t["shape"]).copy())
    return out


def write_safetensors(path, tensors, fmt):
    """tensors: {name: (dtype string, numpy array of the matching raw type)}; names sorted."""
    header, offset, blobs = {"__metadata__": {"format": fmt}}, 0, []
    for name in sorted(tensors):
        dt, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    """Round to nearest even, as torch and exo's f32_to_bf16 do (no NaNs here)."""
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def codes(g, scales, biases, qmax):
    """Round groups g [..., group] against bf16 scales/biases -> (q float32, reconstruction)."""
    s, b = bf16_to_f32(scales)[..., None], bf16_to_f32(biases)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.floor((g - b) / s + np.float32(0.5)), 0)
    q = np.clip(q, 0, qmax).astype(np.float32)
    return q, q * s + b


def mse_search(g, qmax, scales, biases):
    """Error-minimizing scales/biases (see the top of the file), starting from min/max."""
    _, rec = codes(g, scales, biases, qmax)
    best = ((rec - g) ** 2).sum(axis=-1)
    mn, mx = g.min(axis=-1), g.max(axis=-1)
    for shrink in np.linspace(0.0, 0.2, 11, dtype=np.float32):
        for lo_share in (0.0, 0.5, 1.0):  # clip the low end, both ends, or the high end
            cut = (mx - mn) * shrink
            lo, hi = mn + cut * lo_share, mx - cut * (1 - lo_share)
            s_try, b_try = f32_to_bf16((hi - lo) / np.float32(qmax)), f32_to_bf16(lo)
            for _ in range(2):  # codes for this range, then least-squares scale and bias for them
                q, rec = codes(g, s_try, b_try, qmax)
                err = ((rec - g) ** 2).sum(axis=-1)
                better = err < best
                best = np.where(better, err, best)
                scales, biases = np.where(better, s_try, scales), np.where(better, b_try, biases)
                qm, gm = q.mean(axis=-1, keepdims=True), g.mean(axis=-1, keepdims=True)
                var = ((q - qm) ** 2).sum(axis=-1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    s_fit = np.where(var > 0, ((q - qm) * (g - gm)).sum(axis=-1) / var, 0)
                s_fit = np.maximum(s_fit, 0).astype(np.float32)
                s_try = f32_to_bf16(s_fit)
                b_try = f32_to_bf16((gm[..., 0] - s_fit * qm[..., 0]).astype(np.float32))
    return scales, biases


def quantize(w, bits, group, method="minmax"):
    """w float32 [..., in] -> (packed uint32, scales bf16 bits, biases bf16 bits)."""
    qmax = (1 << bits) - 1
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group)
    mn, mx = g.min(axis=-1), g.max(axis=-1)
    scales = f32_to_bf16((mx - mn) / np.float32(qmax))
    biases = f32_to_bf16(mn)
    if method == "mse":
        scales, biases = mse_search(g, qmax, scales, biases)
    q, _ = codes(g, scales, biases, qmax)
    q = q.astype(np.uint64).reshape(*w.shape[:-1], w.shape[-1])
    # bit stream: value i at bit i*bits
    n = w.shape[-1]
    words = np.zeros((*w.shape[:-1], n * bits // 32), dtype=np.uint64)
    for i in range(n):
        bit = i * bits
        wi, sh = bit // 32, bit % 32
        words[..., wi] |= (q[..., i] << sh) & 0xFFFFFFFF
        if sh + bits > 32:
            words[..., wi + 1] |= q[..., i] >> (32 - sh)
    return words.astype(np.uint32), scales, biases


def dequantize(packed, scales, biases, bits, group):
    lead = packed.shape[:-1]
    cols = packed.shape[-1] * 32 // bits
    stream = np.unpackbits(packed.reshape(-1).view(np.uint8), bitorder="little").reshape(-1, bits)
    q = (stream.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    q = q.reshape(*lead, cols // group, group).astype(np.float32)
    w = q * bf16_to_f32(scales)[..., None] + bf16_to_f32(biases)[..., None]
    return w.reshape(*lead, cols)


def quantizable(name, arr):
    return name.endswith(".weight") and arr.ndim >= 2


def quantize_dir(src, dst, bits=4, group=64, method="minmax"):
    os.makedirs(dst, exist_ok=True)
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    out = {}
    for name, (dt, arr) in tensors.items():
        if dt != "BF16":
            raise SystemExit(f"{name}: expected a bf16 checkpoint, got {dt}")
        if quantizable(name, arr) and arr.shape[-1] % group == 0:
            packed, s, b = quantize(bf16_to_f32(arr), bits, group, method)
            base = name[: -len(".weight")]
            out[name] = ("U32", packed)
            out[base + ".scales"] = ("BF16", s)
            out[base + ".biases"] = ("BF16", b)
        else:
            out[name] = ("BF16", arr)
    write_safetensors(os.path.join(dst, "model.safetensors"), out, "mlx")
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization"] = {"group_size": group, "bits": bits}
    cfg["quantization_config"] = {"group_size": group, "bits": bits}
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def dequantized_state(dirpath):
    """{hf name: float32 array} of an MLX-quantized (or dense) checkpoint."""
    cfg = json.load(open(os.path.join(dirpath, "config.json")))
    q = cfg.get("quantization", {})
    tensors = read_safetensors(os.path.join(dirpath, "model.safetensors"))
    out = {}
    for name, (dt, arr) in tensors.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")]
        if dt == "U32":
            out[name] = dequantize(arr, tensors[base + ".scales"][1], tensors[base + ".biases"][1], q["bits"],
                                   q["group_size"])
        elif dt == "BF16":
            out[name] = bf16_to_f32(arr)
        else:
            out[name] = arr.astype(np.float32)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--method", choices=("minmax", "mse"), default="minmax")
    a = ap.parse_args()
    quantize_dir(a.src, a.dst, a.bits, a.group_size, a.method)
    sys.exit(0)
