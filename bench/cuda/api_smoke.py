#!/usr/bin/env python3
"""The HTTP API on the GPU, where the node.js e2e suite cannot travel (its packages are 740 MB):
starts `exo` (a one-node cluster) with --device cuda and again with --device cpu on the same tiny
model, sends each the same requests through the OpenAI chat (plain, streamed, logprobs), Claude
messages and Ollama chat endpoints plus a seeded sampled request, and checks that every answer is
well formed and that the GPU node's greedy text and sampled text equal the CPU node's.

    python3 api_smoke.py EXO_BINARY MODELS_PATH MODEL_ID   (exit 0: all checks passed)
"""
import json, os, shutil, socket, subprocess, sys, tempfile, time, urllib.request

exo, models_path, model = sys.argv[1], sys.argv[2], sys.argv[3]
HI = [{"role": "user", "content": "Hello there, how are you?"}]
# exo's carried libraries for exo alone (python keeps the image's): EXO_LIBS=dir:dir
child_env = dict(os.environ)
if os.environ.get("EXO_LIBS"):
    child_env["LD_LIBRARY_PATH"] = os.environ["EXO_LIBS"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(url, body, stream=False):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = r.read().decode()
    return data if stream else json.loads(data)


def sse_text(data):
    out = []
    for line in data.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            ch = json.loads(line[6:])["choices"]
            if ch and ch[0].get("delta", {}).get("content"):
                out.append(ch[0]["delta"]["content"])
    return "".join(out)


def run_node(device):
    port, data = free_port(), tempfile.mkdtemp(prefix="exo-data-")
    mdir = tempfile.mkdtemp(prefix="exo-models-")
    log = open(f"/tmp/api-smoke-{device}.log", "w")
    proc = subprocess.Popen([exo, "--api-port", str(port), "--models-dir", mdir, "--data-dir", data,
                             "--namespace", f"smoke-{device}-{port}", "--listen-port", "0",
                             "--models-path", models_path, "--device", device],
                            stdout=log, stderr=subprocess.STDOUT, env=child_env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/node_id", timeout=1).read()
                break
            except Exception:
                if proc.poll() is not None:
                    raise RuntimeError(f"exo --device {device} exited early")
                time.sleep(0.1)
        t0 = time.time()
        res = {}
        r = post(url + "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 16,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 3})
        res["chat"] = r["choices"][0]["message"]["content"]
        lp = r["choices"][0]["logprobs"]["content"]
        res["logprobs"] = [round(t["logprob"], 3) for t in lp]
        res["top_ok"] = all(len(t["top_logprobs"]) == 3 for t in lp)
        res["first_s"] = round(time.time() - t0, 2)
        res["stream"] = sse_text(post(url + "/v1/chat/completions", {"model": model, "messages": HI,
                                      "max_tokens": 16, "temperature": 0, "stream": True}, stream=True))
        r = post(url + "/v1/messages", {"model": model, "messages": HI, "max_tokens": 16, "temperature": 0})
        res["claude"] = "".join(b.get("text", "") for b in r["content"])
        r = post(url + "/ollama/api/chat", {"model": model, "messages": HI, "stream": False,
                                     "options": {"temperature": 0, "num_predict": 16}})
        res["ollama"] = r["message"]["content"]
        r = post(url + "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 16,
                                                "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 7})
        res["sampled"] = r["choices"][0]["message"]["content"]
        return res
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(mdir, ignore_errors=True)


ok = True
first, second = os.environ.get("SMOKE_DEVICES", "cuda cpu").split()  # "cpu cpu": a dry run
gpu = run_node(first)
cpu = run_node(second)
for k in ["chat", "stream", "claude", "ollama", "sampled", "logprobs", "top_ok", "first_s"]:
    same = gpu[k] == cpu[k] or k == "first_s"
    if k == "logprobs":
        same = len(gpu[k]) == len(cpu[k]) and all(abs(a - b) < 2e-2 for a, b in zip(gpu[k], cpu[k]))
    print(f"api {k:9s} gpu={gpu[k]!r:.90} cpu={cpu[k]!r:.60} {'ok' if same else 'DIFFERS'}")
    ok &= same
ok &= gpu["chat"] == gpu["stream"] and bool(gpu["chat"]) and gpu["top_ok"]
print("api smoke:", "PASSED" if ok else "FAILED")
sys.exit(0 if ok else 1)
