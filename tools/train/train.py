#!/usr/bin/env python3
"""Trains exo/demo-dictionary: a ~22M-parameter Llama model, from scratch, on the chat data that
prepare_data.py builds from WordNet and fortune cookies, then saves it in Hugging Face layout (bf16),
quantizes it to MLX 4-bit (quantize_mlx.py) and evaluates both with transformers:
  - held-out perplexity on the test split (each test conversation scored on its own, float32 math),
  - "What does <w> mean?" for the 21 held-out evaluation words, scored by word overlap with the
    WordNet entry (and the same score against another word's entry, as a control),
  - a few sayings.
Runs on the GPU machine (torch 2.11, transformers 5.17). Reproducible: fixed seeds, fixed step
count; the exact command is in tools/train/README.md.
"""
import argparse
import concurrent.futures
import gzip
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import time

import numpy as np
import torch
import torch.nn.functional as F

import quantize_mlx

STOP = set("the a an of to in and or for with as by on at from that this which who whom its it is are be "
           "been being was were has have had not no any some such other into out up down over under than "
           "then so very more most less least can may might will would should could something someone "
           "especially usually used using use one two make made".split())


def render(messages, bos="<s>", eos="</s>"):
    """Python twin of the chat template in tokenizer_config.json (checked against it at start)."""
    out = ""
    for m in messages:
        c = m["content"].strip()
        if m["role"] == "system":
            out += f"{bos}[INST] <<SYS>> {c} <</SYS>> [/INST]"
        elif m["role"] == "user":
            out += f"{bos}[INST] {c} [/INST]"
        elif m["role"] == "assistant":
            out += f" {c}{eos}"
    return out


def load_convs(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f]


def content_words(text):
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 3 and w not in STOP}


def overlap(answer, ref_glosses):
    ref = set()
    for g in ref_glosses:
        ref |= content_words(g)
    return len(ref & content_words(answer)) / max(1, len(ref))


def model_config(vocab, hidden=384, ffn=1024, layers=6, heads=6, kv_heads=2):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64, max_position_embeddings=1024,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, hidden_act="silu", attention_bias=False, mlp_bias=False)


def perplexity(model, seqs, device):
    nll, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids], device=device)
            logits = model(x).logits[0, :-1].float()
            nll += float(F.cross_entropy(logits, x[0, 1:], reduction="sum"))
            n += len(ids) - 1
    return math.exp(nll / n), n


def generate(model, tok, prompt_messages, device, max_new=80, temperature=0.0, gen=None):
    ids = tok(render(prompt_messages), add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids], device=device)
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(x).logits[0, -1].float()
            if temperature > 0:
                p = torch.softmax(logits / temperature, -1)
                t = int(torch.multinomial(p, 1, generator=gen))
            else:
                t = int(logits.argmax())
            if t == tok.eos_token_id:
                break
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]], device=device)], 1)
    return tok.decode(out).strip()


def ask_words(model, tok, words, ref, device):
    """Asks "What does W mean?" for each word; scores the answer's overlap with the word's WordNet
    entry, and (control) with another evaluation word's entry: what chance agreement looks like."""
    rows, fmt_ok, good = [], 0, 0
    for i, w in enumerate(words):
        ans = generate(model, tok, [{"role": "user", "content": f"What does {w} mean?"}], device)
        s = overlap(ans, [g["gloss"] for g in ref[w]])
        other = words[(i + 7) % len(words)]
        ctrl = overlap(ans, [g["gloss"] for g in ref[other]])
        is_def = bool(re.match(r"^[A-Za-z-]+ \((noun|verb|adjective|adverb)\): \S", ans))
        fmt_ok += is_def
        good += is_def and s >= 0.25
        rows.append({"word": w, "answer": ans, "overlap": round(s, 3), "control_overlap": round(ctrl, 3),
                     "definition_form": is_def})
    n = len(words)
    return {"definition_form_fraction": round(fmt_ok / n, 3),
            "definition_with_overlap_ge_0.25_fraction": round(good / n, 3),
            "mean_overlap": round(sum(r["overlap"] for r in rows) / n, 3),
            "mean_control_overlap": round(sum(r["control_overlap"] for r in rows) / n, 3), "answers": rows}


def evaluate(model, tok, test_seqs, evalw, device, label):
    ppl, ntok = perplexity(model, test_seqs, device)
    res = {"label": label, "test_perplexity": round(ppl, 4), "test_tokens": ntok}
    for key in ("held_out_words", "never_seen_words", "seen_words"):
        res[key] = ask_words(model, tok, evalw[key], evalw["reference"], device)
    gen = torch.Generator(device=device).manual_seed(7)
    res["sayings"] = [generate(model, tok, [{"role": "user", "content": "Tell me a saying."}], device,
                               temperature=0.8, gen=gen) for _ in range(5)]
    res["sayings"].append(generate(model, tok, [{"role": "user", "content": "Tell me a saying."}], device))
    res["hello"] = generate(model, tok, [{"role": "user", "content": "Hello"}], device)
    print(f"[{label}] ppl {ppl:.3f} over {ntok} tokens", flush=True)
    for key in ("held_out_words", "never_seen_words", "seen_words"):
        r = res[key]
        print(f"  {key}: definition form {r['definition_form_fraction']}, overlap>=0.25 "
              f"{r['definition_with_overlap_ge_0.25_fraction']}, mean overlap {r['mean_overlap']} "
              f"(control {r['mean_control_overlap']})", flush=True)
        for row in r["answers"][:3]:
            print(f"     {row['word']}: {row['answer'][:150]}", flush=True)
    print(f"   saying: {res['sayings'][0][:150]} | hello: {res['hello'][:100]}", flush=True)
    return res


def load_dense(dirpath, device):
    from transformers import LlamaForCausalLM
    c = json.load(open(os.path.join(dirpath, "config.json")))
    cfg = model_config(c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
                       c["num_attention_heads"], c["num_key_value_heads"])
    model = LlamaForCausalLM(cfg)
    state = {k: torch.from_numpy(v) for k, v in quantize_mlx.dequantized_state(dirpath).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.float().to(device).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True, help="dir with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--time-limit", type=float, default=1e9, help="stop training early after this many seconds")
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=0, help="ask the held-out words every N steps (0: never)")
    ap.add_argument("--quant-method", choices=("minmax", "mse"), default="minmax", help="see quantize_mlx.py")
    ap.add_argument("--quant-group", type=int, default=64)
    ap.add_argument("--quant-candidates", default="",
                    help="e.g. mse:64,mse:32,minmax:64: quantize the bf16 model each way, ask each the held-out and "
                         "seen words, keep the best (harbour right first, then held-out score, then perplexity) as 4bit/")
    a = ap.parse_args()
    t0 = time.time()
    random.seed(a.seed), np.random.seed(a.seed), torch.manual_seed(a.seed)
    device = "cuda"
    from transformers import AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    train, test = load_convs(os.path.join(a.data, "train.jsonl.gz")), load_convs(os.path.join(a.data, "test.jsonl.gz"))
    evalw = json.load(open(os.path.join(a.data, "eval_words.json")))
    for c in [c for c in train[:300] if "messages" in c] + test[:100]:
        assert render(c["messages"]) == tok.apply_chat_template(c["messages"], tokenize=False), c
    # A conversation goes through the chat template; a reading document is <s>text</s>.
    enc = lambda convs: tok([render(c["messages"]) if "messages" in c else f"<s>{c['text']}</s>" for c in convs],
                            add_special_tokens=False)["input_ids"]
    train_ids, test_seqs = enc(train), enc(test)
    stream = np.fromiter((t for s in train_ids for t in s), dtype=np.int64)
    nblk = len(stream) // (a.seq + 1)
    blocks = torch.from_numpy(stream[: nblk * (a.seq + 1)].reshape(nblk, a.seq + 1))
    test_stream = np.fromiter((t for s in test_seqs for t in s), dtype=np.int64)
    tb = len(test_stream) // (a.seq + 1)
    test_blocks = torch.from_numpy(test_stream[: tb * (a.seq + 1)].reshape(tb, a.seq + 1)).to(device)
    print(f"data: {len(stream)} train tokens in {nblk} blocks, {len(test_stream)} test tokens; "
          f"prep {time.time() - t0:.1f}s", flush=True)

    cfg = model_config(len(tok), a.hidden, a.ffn, a.layers, a.heads, a.kv_heads)
    model = LlamaForCausalLM(cfg).to(device)
    # Compiled for the training steps only (1.65x the eager speed on the H200, measured); evaluation
    # and generation use the eager module, which shares the parameters, so they never recompile.
    train_model = torch.compile(model)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    warm = 100
    sched = lambda s: a.lr * (s + 1) / warm if s < warm else \
        a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, a.steps - warm))))
    g = torch.Generator().manual_seed(a.seed)
    perm, pos = torch.randperm(nblk, generator=g), 0
    curve, test_curve, step, t_train = [], [], 0, time.time()
    model.train()
    for step in range(a.steps):
        if pos + a.batch > nblk:
            perm, pos = torch.randperm(nblk, generator=g), 0
        b = blocks[perm[pos: pos + a.batch]].to(device, non_blocking=True)
        pos += a.batch
        for grp in opt.param_groups:
            grp["lr"] = sched(step)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = train_model(b[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == a.steps - 1:
            curve.append((step, float(loss.detach())))
        if step % 100 == 0 or step == a.steps - 1:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                tl = sum(float(F.cross_entropy(model(test_blocks[i:i + 64, :-1]).logits.float().reshape(-1, cfg.vocab_size),
                                               test_blocks[i:i + 64, 1:].reshape(-1))) * len(test_blocks[i:i + 64])
                         for i in range(0, len(test_blocks), 64)) / len(test_blocks)
            model.train()
            test_curve.append((step, tl))
            if a.eval_every and step > 0 and (step % a.eval_every == 0):
                model.eval()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    r = ask_words(model, tok, evalw["held_out_words"], evalw["reference"], device)
                model.train()
                print(f"  step {step} held-out words: overlap>=0.25 {r['definition_with_overlap_ge_0.25_fraction']} "
                      f"mean {r['mean_overlap']} (control {r['mean_control_overlap']})", flush=True)
            el = time.time() - t_train
            print(f"step {step} loss {float(loss.detach()):.4f} test {tl:.4f} lr {sched(step):.2e} {el:.0f}s "
                  f"({(step + 1) * a.batch * a.seq / el / 1e6:.2f} Mtok/s)", flush=True)
        if time.time() - t_train > a.time_limit:
            print(f"time limit: stopped after step {step}", flush=True)
            break
    steps_done = step + 1
    train_s = time.time() - t_train

    # Save bf16 in Hugging Face layout with the tokenizer and its chat template.
    bf16_dir, q_dir = os.path.join(a.out, "bf16"), os.path.join(a.out, "4bit")
    os.makedirs(bf16_dir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    quantize_mlx.write_safetensors(os.path.join(bf16_dir, "model.safetensors"),
                                   {k: ("BF16", v.view(torch.int16).numpy().view(np.uint16)) for k, v in sd.items()},
                                   "pt")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tokenizer, f), os.path.join(bf16_dir, f))
    json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.7, "top_p": 0.9,
               "max_new_tokens": 128}, open(os.path.join(bf16_dir, "generation_config.json"), "w"), indent=2)
    # config.json in the classic Hugging Face field names (as Llama checkpoints publish them).
    c = model.config
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
               "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
               "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
               "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
               "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
               "rope_theta": 10000.0, "rope_scaling": None, "tie_word_embeddings": True,
               "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
               "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "use_cache": True,
               "torch_dtype": "bfloat16"}, open(os.path.join(bf16_dir, "config.json"), "w"), indent=2)
    # Candidate quantizations run in worker processes (numpy, one core each) while the GPU evaluates bf16.
    specs = [(m, int(g)) for m, g in (c.split(":") for c in a.quant_candidates.split(","))] if a.quant_candidates \
        else [(a.quant_method, a.quant_group)]
    pool = concurrent.futures.ProcessPoolExecutor(len(specs), mp_context=multiprocessing.get_context("spawn"))
    jobs = [(m, g, os.path.join(a.out, f"4bit-{m}-g{g}")) for m, g in specs]
    futures = [pool.submit(quantize_mlx.quantize_dir, bf16_dir, d, 4, g, m) for m, g, d in jobs]
    # The held-out ids as transformers tokenized them, for exo's own perplexity (tools/perplexity).
    with gzip.open(os.path.join(a.out, "test-ids.txt.gz"), "wt") as f:
        for ids in test_seqs:
            f.write(",".join(map(str, ids)) + "\n")
    results = {"params": nparams, "steps": steps_done, "steps_planned": a.steps, "batch": a.batch, "seq": a.seq,
               "lr": a.lr, "seed": a.seed, "train_tokens": steps_done * a.batch * a.seq,
               "train_seconds": round(train_s, 1), "epochs": round(steps_done * a.batch / nblk, 2),
               "train_loss_curve": curve, "test_loss_curve": test_curve,
               "sizes": {"bf16": os.path.getsize(os.path.join(bf16_dir, "model.safetensors"))}}
    # Evaluate what was written to disk: float32 math on the bf16 weights, and on the dequantized 4-bit.
    m = load_dense(bf16_dir, device)
    results["bf16"] = evaluate(m, tok, test_seqs, evalw, device, "bf16")
    del m
    for f in futures:
        f.result()
    pool.shutdown()
    best = jobs[0]
    if len(jobs) > 1:
        # Quantization changes single answers (the third session's model was right about harbour in bf16
        # and wrong at min/max g64), so candidates are judged on answers first, then on perplexity.
        cands = []
        for m_, g, d in jobs:
            m = load_dense(d, device)
            ppl, _ = perplexity(m, test_seqs, device)
            held = ask_words(m, tok, evalw["held_out_words"], evalw["reference"], device)
            seen = ask_words(m, tok, evalw["seen_words"], evalw["reference"], device)
            del m
            harbour = next(r for r in seen["answers"] if r["word"] == "harbour")
            c = {"method": m_, "group_size": g, "test_perplexity": round(ppl, 4),
                 "size": os.path.getsize(os.path.join(d, "model.safetensors")),
                 "harbour_ok": bool(harbour["definition_form"] and harbour["overlap"] >= 0.25),
                 "harbour": harbour["answer"], "seen": seen["definition_with_overlap_ge_0.25_fraction"],
                 "held_out": held["definition_with_overlap_ge_0.25_fraction"]}
            print(f"[candidate {m_}:{g}] ppl {ppl:.4f} held-out {c['held_out']} seen {c['seen']} size {c['size']} "
                  f"harbour: {harbour['answer'][:100]}", flush=True)
            cands.append((c, (m_, g, d)))
        fits = [x for x in cands if x[0]["size"] < 25_000_000] or cands
        chosen = max(fits, key=lambda x: (x[0]["harbour_ok"], x[0]["held_out"], x[0]["seen"], -x[0]["test_perplexity"]))
        best = chosen[1]
        results["quant_candidates"] = [c for c, _ in cands]
        print(f"chosen: {best[0]} g{best[1]}", flush=True)
    shutil.copytree(best[2], q_dir, dirs_exist_ok=True)
    results["quantization"] = {"method": best[0], "group_size": best[1]}
    results["sizes"]["4bit"] = os.path.getsize(os.path.join(q_dir, "model.safetensors"))
    m = load_dense(q_dir, device)
    results["4bit"] = evaluate(m, tok, test_seqs, evalw, device, "4bit")
    del m
    results["ppl_ratio_4bit_over_bf16"] = round(results["4bit"]["test_perplexity"] / results["bf16"]["test_perplexity"], 4)
    json.dump(results, open(os.path.join(a.out, "results.json"), "w"), indent=1)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in curve], [l for _, l in curve], label="train (batch)", lw=1)
    ax.plot([s for s, _ in test_curve], [l for _, l in test_curve], "o-", label="held-out test", lw=1.5)
    ax.set_xlabel("step (%d sequences x %d tokens)" % (a.batch, a.seq))
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("exo/demo-dictionary: %.1fM params, %d steps" % (nparams / 1e6, steps_done))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "loss.png"), dpi=110)
    print(f"done in {time.time() - t0:.0f}s: {json.dumps({k: results[k] for k in ('params', 'steps', 'train_seconds', 'epochs', 'sizes', 'ppl_ratio_4bit_over_bf16')})}",
          flush=True)


if __name__ == "__main__":
    main()
