"""llama-server beside scripts/deep_pair_tallow.py (its `fill` writes DIR/tokens.json first), depth by depth:

    DEPTHS=1024,4096,16384,32768 DIR=/tmp/deep MODEL=/tmp/twins/falcon-h1-1.5b.gguf PAIR=1 \\
        python scripts/deep_pair_llama.py 3

One server process (`-t 2`, prompt batches on TB threads, default 1, so that it fills beside tallow's
one-thread fill). For each depth, ascending: it evaluates the depth's tokens but the last at nice 19 (from the
context checkpoint the previous depth left), then, holding `flock -x /tmp/cpu.lock` and at nice 0, decodes 64
tokens greedily (ignore_eos) per repetition after the full depth (the server restores its checkpoint: prompt_n 1),
reporting the server's own predicted_per_second. With PAIR=1 it waits, before taking the lock, for tallow's fill
to have saved that depth (DIR/filled.json), and inside the same hold runs `deep_pair_tallow.py time` for it
(OMP_NUM_THREADS=2), then llama.cpp again: a same-hold pair. PAUSE="pid ..." are stopped (SIGSTOP) for the
length of each hold: the fills, which would otherwise take their small share of the cores from the timing.
One process because a slot saved to disk loses the in-memory context checkpoints a recurrent or sliding-window
cache needs to be reused (server-context.cpp: full re-processing)."""
import fcntl, json, os, signal, subprocess, sys, time, urllib.request

MODEL, PORT = os.environ.get("MODEL", "/tmp/twins/gemma4-e2b.gguf"), int(os.environ.get("PORT", 8093))
DEPTHS = sorted(int(d) for d in os.environ.get("DEPTHS", os.environ.get("DEPTH", "32768")).split(","))
D = os.environ.get("DIR", "/tmp/s13deep")
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
PAIR = os.environ.get("PAIR") == "1"
env = dict(os.environ, LD_LIBRARY_PATH="/tmp/llama")
# -cms 256: a context checkpoint may be made at every depth (default: 8192 tokens apart at least);
# -ctxcp 4: each holds a whole recurrent state (130 MiB on Falcon-H1-3B), keep few.
srv = subprocess.Popen(["nice", "-n", "19", "/tmp/llama/llama-server", "-m", MODEL, "-t", "2", "-tb", os.environ.get("TB", "1"),
                        "-c", str(DEPTHS[-1] + 256), "--port", str(PORT), "-np", "1", "--no-warmup",
                        "-cms", "256", "-ctxcp", "4"],
                       env=env, stdout=open(f"{D}/server.log", "w"), stderr=subprocess.STDOUT)


def autogroup_nice(pid: int, value: int) -> None:
    """nice orders threads only within their autogroup (a session); the group's own nice is what yields the CPU."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(value))
    except OSError:
        pass


def server_nice(value: int) -> None:
    autogroup_nice(srv.pid, value)
    for tid in os.listdir(f"/proc/{srv.pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), value)


autogroup_nice(srv.pid, 19)


def post(path, body, timeout=36000):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=timeout))


def llama_reps(toks, n):
    speeds = []
    for i in range(n):
        r = post("/completion", {"prompt": toks, "n_predict": 64, "cache_prompt": True, "temperature": 0,
                                 "ignore_eos": True, "samplers": ["top_k"], "top_k": 1})
        t = r["timings"]
        speeds.append(t["predicted_per_second"])
        print("rep", i, "prompt_n", t["prompt_n"], "predicted_n", t["predicted_n"], t["predicted_per_second"], flush=True)
    return speeds


def filled(depth):
    try:
        return depth in json.load(open(D + "/filled.json"))
    except (OSError, ValueError):
        return False


try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2); break
        except Exception:
            time.sleep(1)
    all_toks = json.load(open(D + "/tokens.json"))
    assert len(all_toks) >= DEPTHS[-1]
    pause = [int(p) for p in os.environ.get("PAUSE", "").split()]
    for depth in DEPTHS:
        toks = all_toks[:depth]
        t0 = time.time()
        r = post("/completion", {"prompt": toks[:-1], "n_predict": 0, "cache_prompt": True})
        print("filled", depth, r.get("timings"), f"{time.time() - t0:.0f} s", time.strftime("%H:%M:%S"), flush=True)
        while PAIR and not filled(depth):
            time.sleep(10)
        lock = open("/tmp/cpu.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        for p in pause:
            try: os.kill(p, signal.SIGSTOP)
            except OSError: pass
        try:
            server_nice(0)
            print("timing", depth, "from", time.strftime("%H:%M:%S"), "load", os.getloadavg(), flush=True)
            before = llama_reps(toks, REPS)
            out = {"llama_server_tg64": depth, "samples": before, "mean": sum(before) / len(before)}
            if PAIR:
                tl = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "deep_pair_tallow.py"), "time", str(REPS)],
                                    env=dict(os.environ, DEPTHS=str(depth), OMP_NUM_THREADS="2"), capture_output=True, text=True)
                print(tl.stdout.strip(), tl.stderr.strip()[-2000:] if tl.returncode else "", flush=True)
                after = llama_reps(toks, REPS)
                out |= {"after": after, "mean_after": sum(after) / len(after)}
            print(json.dumps(out | {"end": time.strftime("%H:%M:%S"), "load": os.getloadavg()[0]}), flush=True)
            server_nice(19)
        finally:
            for p in pause:
                try: os.kill(p, signal.SIGCONT)
                except OSError: pass
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
finally:
    srv.terminate(); srv.wait()
