#!/usr/bin/env python3
"""A pipeline instance over a GPU node and a CPU node, through the HTTP API (issue 18 item 4):
exo nodes on this host's loopback, placed as exo's integration tests place them.

For each model: one node alone with --device cpu (the reference tokens), one node alone with
--device GPU_DEVICE, then two nodes of one cluster, one --device GPU_DEVICE and one --device cpu,
with a Pipeline instance placed through POST /place_instance (min_nodes 2) and polled in /state
until every runner is Ready. Each setup gets the same greedy chat (tokens and logprobs compared
with the CPU node's, token for token) and the decode rate of /bench/chat/completions (EOS banned,
exactly TG tokens; generation_tps as the runner of rank 0 measures it), one stream and then B
streams at once. The cluster's view is printed too: each node's device, memory bandwidth and GPU
memory (nodeSystem, nodeMemory) and the layers placement gave each node.

    python3 mixed_pipeline.py EXO MODELS_PATH MODEL_ID... [--tg 128] [--streams 4]
        [--gpu-device cuda] [--gpu-env K=V,...]...   (GPU_DEVICE=cpu: a dry run without a GPU)
    exit 0: every pipeline's tokens equal the CPU node's

EXO_LIBS=dir:dir gives exo (only exo) those libraries (a carried build).
"""
import argparse, json, os, shutil, socket, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("exo")
ap.add_argument("models_path")
ap.add_argument("models", nargs="+")
ap.add_argument("--tg", type=int, default=128)
ap.add_argument("--streams", type=int, default=4)
ap.add_argument("--gpu-device", default="cuda")
ap.add_argument("--gpu-env", action="append", default=None,
                help="K=V,... for the GPU node of the pipeline; repeated: one pipeline run each "
                     "(default: one run, no extra variables)")
ap.add_argument("--logs", default=tempfile.gettempdir())
args = ap.parse_args()

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
env = dict(os.environ)
if os.environ.get("EXO_LIBS"):
    env["LD_LIBRARY_PATH"] = os.environ["EXO_LIBS"]
env.setdefault("EXO_CLUSTER_SYNC_MS", "100")
env.setdefault("EXO_DIST_HOST", "127.0.0.1")  # the ranks' data plane on loopback
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f} s]", *a, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def http(url, body=None, method=None, timeout=300):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Node:
    def __init__(self, name, device, namespace, disc, peer=None, extra_env=None):
        self.name, self.device = name, device
        self.port, self.listen = free_port(), free_port()
        self.data, self.mdir = tempfile.mkdtemp(prefix="exo-data-"), tempfile.mkdtemp(prefix="exo-m-")
        self.logf = os.path.join(args.logs, f"mixed-{name}.log")
        cmd = [args.exo, "--api-port", str(self.port), "--listen-port", str(self.listen),
               "--discovery-port", str(disc), "--data-dir", self.data, "--models-dir", self.mdir,
               "--namespace", namespace, "--models-path", args.models_path, "--device", device]
        if peer:
            cmd += ["--peer", f"127.0.0.1:{peer.listen}"]
        self.proc = subprocess.Popen(cmd, stdout=open(self.logf, "a"), stderr=subprocess.STDOUT,
                                     env={**env, **(extra_env or {})})
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(300):
            try:
                self.id = urllib.request.urlopen(self.url + "/node_id", timeout=1).read().decode().strip('"\n ')
                return
            except Exception:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"node {name} exited early (log {self.logf})")
                time.sleep(0.1)
        raise RuntimeError(f"node {name} did not answer")

    def state(self):
        return http(self.url + "/state")[1]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.data, ignore_errors=True)
        shutil.rmtree(self.mdir, ignore_errors=True)


def until(what, fn, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def greedy(node, model, n=24):
    st, r = http(node.url + "/v1/chat/completions", {"model": model, "messages": PROMPT,
                                                    "max_tokens": n, "temperature": 0,
                                                    "logprobs": True, "top_logprobs": 1})
    if st != 200:
        raise RuntimeError(f"chat {model} via {node.name}: {st} {r}")
    lp = r["choices"][0]["logprobs"]["content"]
    return [t["token"] for t in lp], [t["logprob"] for t in lp]


def decode_rate(node, model, streams):
    """Sum over `streams` concurrent requests of each one's generation tok/s (rank 0's runner)."""
    out = [None] * streams

    def one(i):
        st, r = http(node.url + "/bench/chat/completions",
                     {"model": model, "messages": PROMPT, "max_tokens": args.tg, "temperature": 0})
        out[i] = (st, r)

    th = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    t = time.time()
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.time() - t
    tps = []
    for st, r in out:
        if st != 200:
            raise RuntimeError(f"bench {model} via {node.name}: {st} {r}")
        tps.append(r["generation_stats"]["generation_tps"])
    return sum(tps), streams * args.tg / wall


def measure(node, model, what):
    greedy(node, model, 4)  # loads the model (or warms the instance)
    toks, lps = greedy(node, model)
    b1 = decode_rate(node, model, 1)
    bn = decode_rate(node, model, args.streams)
    log(f"{what:28s} {model}: decode b1 {b1[0]:8.1f} tok/s, b{args.streams} {bn[0]:8.1f} tok/s "
        f"(wall {bn[1]:.1f}); first tokens {''.join(toks[:8])!r}")
    return {"tokens": toks, "logprobs": lps, "b1": b1[0], "bn": bn[0], "bn_wall": bn[1]}


def alone(device, extra_env=None):
    disc = free_port()
    node = Node(f"alone-{device}", device, f"mixed-alone-{device}-{disc}", disc, extra_env=extra_env)
    try:
        return {m: measure(node, m, f"one node --device {device}") for m in args.models}
    finally:
        node.stop()


def body(inst):
    return list(inst.values())[0]


def ready(st, iid):
    inst = (st or {}).get("instances", {}).get(iid)
    if not inst:
        return False
    runners = body(inst)["shardAssignments"]["nodeToRunner"].values()
    return all("RunnerReady" in st["runners"].get(r, {}) for r in runners)


def mixed(gpu_env):
    disc = free_port()
    ns = f"mixed-{disc}"
    g = Node("gpu", args.gpu_device, ns, disc, extra_env=gpu_env)
    # one host: the CPU rank leaves a core to the GPU rank (whose data-plane thread busy-polls),
    # else one of its threads shares a core and every parallel op waits for that one
    threads = os.environ.get("EXO_RUNNER_THREADS") or str(max(1, (os.cpu_count() or 2) - 1))
    c = Node("cpu", "cpu", ns, disc, peer=g, extra_env={"EXO_RUNNER_THREADS": threads})
    log(f"CPU node's runner threads: {threads} of {os.cpu_count()} cores")
    res = {}
    try:
        def both_known():
            st = g.state()
            sysinfo, mem = st.get("nodeSystem", {}), st.get("nodeMemory", {})
            ok = all(n.id in mem and n.id in sysinfo for n in (g, c))
            # the CPU node publishes its measured bandwidth ~0.2 s after it starts
            return st if ok and sysinfo[c.id].get("memoryBandwidthGBs") else False
        st = until("both nodes in State with their bandwidth", both_known, 60)
        for n in (g, c):
            s, m = st["nodeSystem"][n.id], st["nodeMemory"][n.id]
            gpu = m.get("gpuAvailable", {}).get("inBytes")
            log(f"node {n.name} ({n.id[:8]}): device {s.get('device')}, "
                f"{s.get('memoryBandwidthGBs')} GB/s, RAM free {m['ramAvailable']['inBytes'] / 1e9:.1f} GB"
                + (f", GPU free {gpu / 1e9:.1f} GB" if gpu else "")
                + f", gpus {[x.get('name') for x in s.get('gpus', [])]}")
        for model in args.models:
            st_, r = http(g.url + "/place_instance", {"model_id": model, "sharding": "Pipeline",
                                                     "instance_meta": "MlxRing", "min_nodes": 2})
            if st_ != 200:
                raise RuntimeError(f"place_instance {model}: {st_} {r}")
            iid = r["instance_id"]
            st = until(f"instance of {model} Ready", lambda: (lambda s: s if ready(s, iid) else False)(g.state()), 240)
            sa = body(st["instances"][iid])["shardAssignments"]
            split = []
            for nid, rid in sa["nodeToRunner"].items():
                meta = list(sa["runnerToShard"][rid].values())[0]
                who = "gpu" if nid == g.id else "cpu"
                split.append((meta["deviceRank"], who, meta["startLayer"], meta["endLayer"], meta["nLayers"]))
            split.sort()
            log(f"placed {model}: " + ", ".join(f"rank {r} on the {w} node: layers {a}-{b} of {n}" for r, w, a, b, n in split))
            res[model] = measure(g, model, f"pipeline gpu+cpu {','.join(f'{k}={v}' for k, v in (gpu_env or {}).items())}")
            res[model]["split"] = split
            http(g.url + f"/instance/{iid}", method="DELETE")
            until(f"instance {iid} gone", lambda: iid not in (g.state() or {}).get("instances", {}), 60)
    finally:
        c.stop()
        g.stop()
    return res


def env_of(spec):
    return dict(kv.split("=", 1) for kv in spec.split(",") if kv)


envs = args.gpu_env or [""]
log(f"models {args.models}; tg {args.tg}; streams {args.streams}; GPU node --device {args.gpu_device}; "
    f"pipeline runs with {envs}")
ref = alone("cpu")
gpu = alone(args.gpu_device)
pipes = [(e, mixed(env_of(e))) for e in envs]
ok = True
print("\n## summary (decode tok/s: b1 = one stream, bN = sum over N concurrent streams)")
print(f"{'model':20s} {'setup':44s} {'b1':>8s} {'b' + str(args.streams):>8s}  tokens vs one CPU node")
for m in args.models:
    rows = [("one node cpu", ref[m]), (f"one node {args.gpu_device}", gpu[m])]
    rows += [(f"pipeline {args.gpu_device}+cpu {e}", p[m]) for e, p in pipes]
    for name, r in rows:
        same = r["tokens"] == ref[m]["tokens"]
        dlp = max((abs(a - b) for a, b in zip(r["logprobs"], ref[m]["logprobs"])), default=0)
        first = next((i for i, (a, b) in enumerate(zip(r["tokens"], ref[m]["tokens"])) if a != b), None)
        verdict = (f"same {len(r['tokens'])} tokens, logprobs within {dlp:.1e}" if same else
                   f"DIFFER from token {first}")
        print(f"{m:20s} {name:44s} {r['b1']:8.1f} {r['bn']:8.1f}  {verdict}")
        if name.startswith("pipeline"):
            ok &= same
    print(f"{'':20s} split: " + "; ".join(f"rank {r} {w} layers {a}-{b}" for r, w, a, b, _ in pipes[0][1][m]["split"]))
print("mixed pipeline:", "PASSED (pipeline tokens equal one CPU node's)" if ok else "FAILED")
sys.exit(0 if ok else 1)
