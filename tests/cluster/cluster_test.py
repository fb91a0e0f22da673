#!/usr/bin/env python3
"""Replicas behind HAProxy on loopback (scripts/cluster.sh, deploy/haproxy/warmctx.cfg).

usage: cluster_test.py WARMCTX_BIN MODEL CHECK [--seconds S]
  routing    (a) a multi-workspace agent trace with plain OpenAI messages through HAProxy to 3
             replicas: >= 95% of the turns land on their workspace's replica, and the tokens
             prefilled are <= 1.1x those of one server with the three replicas' memory
  failover   (b) the same kind of trace; one replica is SIGKILLed mid-trace: every request is
             answered (a client retries only what was in flight), and each moved workspace's
             first turn on another replica reuses >= 80% of its prompt from the shared disk tier
  shared-dir (c) two replicas, hit directly, PUT segments and chat (writing and evicting
             snapshots) in one shared directory for S seconds (default 20): no torn, lost or
             quarantined snapshot, every 2xx'd segment PUT is there on both, the budget holds
Exits 0 with "cluster checks passed: CHECK"; exits 77 with "SKIPPED" when haproxy is missing.
Only the Python standard library: a fresh Debian machine has it.
"""
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Without drafts: they shorten each answer's decode, which moves how the eight clients'
# turns interleave on one server, and with them its evictions (routing's measure, tokens
# prefilled, moved by ~3% between runs with and without them).
# Without resident streams: routing's measure compares replicas and one server by their work
# streams and RAM pools (the device tier would hold each replica's workspaces in place, each
# replica's share of them unequal), and failover's by what reached the shared disk tier, where
# a resident stream's turns stay in place and defer their writes (up to
# --write-through-max-delay-ms while busy).
SERVE = ["-c", "8192", "--chunk", "64", "-t", "1", "--draft-max", "0", "-q", "--disk-min-class", "low", "--no-prewarm",
         "--resident-streams", "0"]
PARALLEL = 2            # per replica
REPLICA_POOL = 6 << 20  # --budget-bytes per replica: about its share of the trace's prefixes


ERRORS = []  # failures in client threads, failed on by the main thread once they are joined


def fail(msg):
    if threading.current_thread() is not threading.main_thread():
        ERRORS.append(msg)
        sys.exit(1)  # ends this thread
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def join_all(threads):
    for t in threads:
        t.join()
    if ERRORS:
        fail(f"{len(ERRORS)} client failures; the first: {ERRORS[0]}")


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def request(port, method, path, body=None, timeout=120):
    """(status, headers, parsed JSON or text); raises on a connection failure."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"content-type": "application/json"} if data else {})
        r = c.getresponse()
        raw = r.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed
    finally:
        c.close()


class Cluster:
    """scripts/cluster.sh in its own process group; stopped (SIGTERM) by stop()."""

    def __init__(self, bin_, model, n, tmp, extra=()):
        self.port, self.stats_port = free_ports(2)
        self.dir = os.path.join(tmp, "cluster")
        args = ["bash", os.path.join(ROOT, "scripts/cluster.sh"), "-n", str(n), "--port", str(self.port),
                "--stats-port", str(self.stats_port), "--dir", self.dir, "--bin", bin_]
        # cluster.sh numbers replica ports from --first-port: find a free run of n.
        base = self._free_run(n)
        if os.environ.get("WARMCTX_CLUSTER_BALANCE_FACTOR"):  # to measure another factor
            args += ["--balance-factor", os.environ["WARMCTX_CLUSTER_BALANCE_FACTOR"]]
        args += ["--first-port", str(base), "--", "-m", model, *SERVE, "--parallel", str(PARALLEL),
                 "--budget-bytes", str(REPLICA_POOL), *extra]
        self.log = open(os.path.join(tmp, "cluster.out"), "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     start_new_session=True)
        t0 = time.time()
        line = ""
        while time.time() - t0 < 120:
            line = self.proc.stdout.readline()
            if not line or line.startswith("cluster: ready"):
                break
        if not line.startswith("cluster: ready"):
            self.stop()
            fail("the cluster did not start: " + open(os.path.join(tmp, "cluster.out")).read()[-2000:])
        self.pids = {}
        for row in open(os.path.join(self.dir, "pids")):
            name, pid, port = row.split()
            self.pids[name] = (int(pid), int(port))

    @staticmethod
    def _free_run(n):
        for _ in range(50):
            base = random.Random(os.getpid() + time.time_ns()).randrange(20000, 60000)
            ok = True
            for p in range(base, base + n):
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                finally:
                    s.close()
            if ok:
                return base
        fail("no free run of ports")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        # HAProxy's server state changes (a replica taken out by its health check), for the report.
        try:
            text = open(os.path.join(self.dir, "logs", "haproxy.err")).read()
            self.events = [l.strip() for l in text.splitlines() if l.startswith("[WARNING]") and (" is DOWN" in l or " is UP" in l)]
        except OSError:
            self.events = []


# ---- an agent trace of plain OpenAI messages ----------------------------------------------------

def words(rng, n):
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
                    for _ in range(n))


class Agent:
    """One workspace: a large system prompt (its stable context), then turns that append the
    answer and a new user message, as a coding agent's conversation grows."""

    def __init__(self, seed, i, turns):
        rng = random.Random(seed * 1000 + i)
        self.name = f"agent{i}"
        self.messages = [{"role": "system", "content": f"You are agent {i}. Repository notes:\n" + words(rng, 700)},
                         {"role": "user", "content": "Task: " + words(rng, 30)}]
        self.rng = rng
        self.turns = turns
        self.results = []  # per turn: dict(replica, prompt, reused, prefilled, tier, retries)

    def turn(self, port, on_retry=None):
        # 24 tokens to generate: the request spends most of its time in the server, as an
        # agent's does (in flight, counted by HAProxy's bounded load), not in this client.
        body = {"messages": self.messages, "max_tokens": 24, "temperature": 0}
        retries = 0
        while True:
            try:
                status, headers, out = request(port, "POST", "/v1/chat/completions", body)
            except (OSError, http.client.HTTPException) as e:
                status, headers, out = 0, {}, str(e)
            if status == 200:
                break
            if status not in (0, 502, 503, 504) or retries >= 30:
                fail(f"{self.name}: {status} {str(out)[:300]}")
            retries += 1
            if on_retry:
                on_retry(self)
            time.sleep(0.3)
        w = out["warmctx"]
        self.results.append({"replica": headers.get("x-warmctx-replica", "?"), "prompt": out["usage"]["prompt_tokens"],
                             "reused": w["tokens_reused"], "prefilled": w["tokens_prefilled"], "tier": w["tier"],
                             "retries": retries})
        self.messages = self.messages + [{"role": "assistant", "content": out["choices"][0]["message"]["content"]},
                                         {"role": "user", "content": words(self.rng, 30)}]


def run_trace(port, agents, after_each=None):
    """Every agent is a client of its own, sending its turns one after another; all at once."""
    def client(a):
        # Agents start one after another (50 ms apart), not all in the same millisecond:
        # at a start, with nothing in flight yet, bounded load allows one request per replica.
        time.sleep(0.05 * agents.index(a))
        for _ in range(a.turns):
            a.turn(port)
            if after_each:
                after_each(a)
    threads = [threading.Thread(target=client, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    join_all(threads)


def stickiness(agents):
    on_main = total = 0
    per = {}
    for a in agents:
        reps = [r["replica"] for r in a.results]
        main = max(set(reps), key=reps.count)
        per[a.name] = (main, reps.count(main), len(reps), [k for k, r in enumerate(reps) if r != main])
        on_main += reps.count(main)
        total += len(reps)
    return on_main / total, per


# ---- (a) routing ----------------------------------------------------------------------------------

def check_routing(bin_, model, tmp):
    n_agents, turns = 24, 8
    cl = Cluster(bin_, model, 3, tmp)
    try:
        agents = [Agent(1, i, turns) for i in range(n_agents)]
        t0 = time.time()
        run_trace(cl.port, agents)
        t_cluster = time.time() - t0
    finally:
        cl.stop()
    share, per = stickiness(agents)
    prefilled_cluster = sum(r["prefilled"] for a in agents for r in a.results)

    # One server with the three replicas' memory and streams, the same trace.
    port = free_ports(1)[0]
    log = open(os.path.join(tmp, "single.err"), "w")
    single = subprocess.Popen([bin_, "serve", "--port", str(port), "-m", model, *SERVE, "--parallel", str(3 * PARALLEL),
                               "--budget-bytes", str(3 * REPLICA_POOL), "--cache-dir", os.path.join(tmp, "single-kv")],
                              stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        if not single.stdout.readline().startswith("warmctx: listening"):
            fail("the single server did not start")
        ref = [Agent(1, i, turns) for i in range(n_agents)]
        run_trace(port, ref)
    finally:
        single.send_signal(signal.SIGTERM)
        single.wait(60)
    prefilled_single = sum(r["prefilled"] for a in ref for r in a.results)
    ratio = prefilled_cluster / max(prefilled_single, 1)
    counts = {}
    for main, _, _, _ in per.values():
        counts[main] = counts.get(main, 0) + 1
    print(f"routing: {n_agents} workspaces x {turns} turns through HAProxy in {t_cluster:.1f} s; "
          f"{share:.1%} of turns on their workspace's replica; workspaces per replica {dict(sorted(counts.items()))}")
    print(f"routing: HAProxy's server state changes: {len(cl.events)} (3 replicas DOWN while loading, then UP: 6)")
    print("routing: per workspace (replica, turns there, turns, the others' indices): " + json.dumps(per, sort_keys=True))
    print(f"routing: tokens prefilled: cluster {prefilled_cluster}, one server with 3x memory {prefilled_single}, "
          f"ratio {ratio:.3f}")
    if share < 0.95:
        fail(f"only {share:.1%} of turns landed on their workspace's replica (want >= 95%)")
    if len(counts) < 3:
        fail(f"the workspaces went to {len(counts)} replicas, not spread over 3")
    if ratio > 1.1:
        fail(f"the cluster prefilled {ratio:.2f}x the tokens of one server with its memory (want <= 1.1)")


# ---- (b) failover ---------------------------------------------------------------------------------

def check_failover(bin_, model, tmp):
    n_agents, turns = 12, 10
    cl = Cluster(bin_, model, 3, tmp)
    agents = [Agent(2, i, turns) for i in range(n_agents)]
    lock = threading.Lock()
    state = {"done": 0, "killed_at": None, "victim": None, "in_flight_at_kill": 0}
    total = n_agents * turns

    def after_each(a):
        with lock:
            state["done"] += 1
            if state["killed_at"] is None and state["done"] >= total * 4 // 10:
                # The replica that serves the most workspaces so far.
                mains = {}
                for b in agents:
                    if b.results:
                        mains[b.results[-1]["replica"]] = mains.get(b.results[-1]["replica"], 0) + 1
                victim = max(sorted(mains), key=lambda r: mains[r])
                os.kill(cl.pids[victim][0], signal.SIGKILL)
                state.update(killed_at=state["done"], victim=victim,
                             in_flight_at_kill=sum(1 for b in agents if len(b.results) < b.turns) - 1)
    try:
        run_trace(cl.port, agents, after_each)
    finally:
        cl.stop()
    victim = state["victim"]
    if victim is None:
        fail("no replica was killed")
    answered = sum(len(a.results) for a in agents)
    retried = sum(1 for a in agents for r in a.results if r["retries"] > 0)
    moved, bad = [], []
    for a in agents:
        before = [r for r in a.results[:turns] if r["replica"] == victim]
        if not before:
            continue
        seen = {victim}
        for k, r in enumerate(a.results):
            if k > 0 and a.results[k - 1]["replica"] == victim and r["replica"] not in seen:
                share = r["reused"] / r["prompt"]
                moved.append((a.name, r["replica"], share, r["tier"]))
                if share < 0.8 or r["tier"] != "disk":
                    bad.append((a.name, k, r))
            seen.add(r["replica"])
    print(f"failover: killed {victim} (SIGKILL) after {state['killed_at']} of {total} turns; "
          f"{answered} of {total} answered; {retried} retried by the client "
          f"({state['in_flight_at_kill']} were in flight at the kill)")
    for name, rep, share, tier in moved:
        print(f"failover: {name} moved to {rep}: its first turn there reused {share:.1%} of its prompt, from {tier}")
    if answered != total:
        fail(f"{total - answered} requests unanswered")
    if retried > state["in_flight_at_kill"]:
        fail(f"the client retried {retried} requests, more than the {state['in_flight_at_kill']} in flight")
    if not moved:
        fail(f"no workspace moved off {victim}")
    if bad:
        fail("moved workspaces whose first turn reused < 80% from disk: " + json.dumps(bad))


# ---- (c) shared directory -------------------------------------------------------------------------

def metric(port, name):
    _, _, text = request(port, "GET", "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def check_shared_dir(bin_, model, tmp, seconds):
    budget = 3 << 20  # the directory's, on both: far less than the trace writes
    cl = Cluster(bin_, model, 2, tmp, extra=("--disk-budget-bytes", str(budget)))
    ports = [cl.pids["r1"][1], cl.pids["r2"][1]]
    acked = {}    # (ws, seg) -> content of its last 2xx'd PUT (each segment has one writer thread)
    counts = {"put": 0, "chat": 0}
    lock = threading.Lock()
    stop_at = time.time() + seconds

    def worker(t):
        rng = random.Random(300 + t)
        version = 0
        while time.time() < stop_at:
            ws = f"ws{rng.randrange(6)}"
            port = ports[rng.randrange(2)]
            if rng.random() < 0.5:
                seg = f"t{t}-{rng.randrange(2)}"
                version += 1
                content = f"{seg} v{version} " + words(rng, rng.randint(20, 150))
                status, _, out = request(port, "PUT", f"/v1/workspaces/{ws}/segments/{seg}",
                                         {"kind": "repo_map", "content": content})
                if status not in (200, 201):
                    fail(f"PUT {ws}/{seg}: {status} {str(out)[:200]}")
                with lock:
                    acked[(ws, seg)] = content
                    counts["put"] += 1
            else:
                status, _, out = request(port, "POST", f"/v1/workspaces/{ws}/chat/completions",
                                         {"messages": [{"role": "user", "content": words(rng, 10)}], "max_tokens": 2})
                if status != 200:
                    fail(f"chat {ws}: {status} {str(out)[:200]}")
                with lock:
                    counts["chat"] += 1
    try:
        for w in range(6):  # every workspace has a stored segment before the chats start
            status, _, out = request(ports[w % 2], "PUT", f"/v1/workspaces/ws{w}/segments/rules",
                                     {"kind": "instructions", "content": f"rules of ws{w}: " + words(random.Random(w), 200)})
            if status not in (200, 201):
                fail(f"PUT ws{w}/rules: {status} {out}")
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        join_all(threads)
        lost = []
        for (ws, seg), content in sorted(acked.items()):
            for port in ports:
                status, _, out = request(port, "GET", f"/v1/workspaces/{ws}/segments/{seg}")
                if status != 200 or out.get("content") != content:
                    lost.append((port, ws, seg, status))
        evicted = [metric(p, "warmctx_disk_evicted_files_total") for p in ports]
        gone = [metric(p, "warmctx_disk_files_gone_total") for p in ports]
        failures = [metric(p, "warmctx_tier_restore_failures_total") for p in ports]
        quarantined = [metric(p, "warmctx_disk_quarantine_files") for p in ports]
        writes = [metric(p, "warmctx_tier_writes_total") for p in ports]
    finally:
        cl.stop()
    kv = os.path.join(cl.dir, "kv")
    verify = subprocess.run([bin_, "snapshot", "verify", "--cache-dir", kv], capture_output=True, text=True)
    files = [f for f in os.listdir(kv) if f.endswith(".wcsnap")]
    dir_bytes = sum(os.path.getsize(os.path.join(kv, f)) for f in files)
    q = os.path.join(kv, "quarantine")
    qfiles = os.listdir(q) if os.path.isdir(q) else []
    print(f"shared-dir: {seconds} s, 2 replicas, 4 clients: {counts['put']} segment PUTs, {counts['chat']} chats; "
          f"snapshot writes {writes}, evictions {evicted}, loads of files the other evicted {gone}, "
          f"restore failures {failures}; {len(files)} files, {dir_bytes} bytes of a {budget}-byte budget")
    print("shared-dir: snapshot verify: " + (verify.stdout.strip().splitlines() or ["(nothing)"])[-1])
    if lost:
        fail(f"{len(lost)} 2xx'd segment PUTs not read back as acknowledged: {lost[:5]}")
    if verify.returncode != 0:
        fail("snapshot verify found bad files:\n" + verify.stdout + verify.stderr)
    if qfiles or sum(quarantined) or sum(failures):
        fail(f"quarantined or failed files: {qfiles} {quarantined} {failures}")
    if min(writes) == 0 or min(evicted) == 0:
        fail("both replicas must write and evict snapshots for this check to mean anything")
    if dir_bytes > budget:
        fail(f"the directory holds {dir_bytes} bytes, over its budget of {budget}")


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    bin_, model, check = sys.argv[1], sys.argv[2], sys.argv[3]
    seconds = 20
    if "--seconds" in sys.argv:
        seconds = int(sys.argv[sys.argv.index("--seconds") + 1])
    if subprocess.run(["sh", "-c", "command -v haproxy"], capture_output=True).returncode != 0:
        print("SKIPPED: haproxy is not installed (apt-get install haproxy; scripts/setup.sh installs it)")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="warmctx-cluster-") as tmp:
        if check == "routing":
            check_routing(bin_, model, tmp)
        elif check == "failover":
            check_failover(bin_, model, tmp)
        elif check == "shared-dir":
            check_shared_dir(bin_, model, tmp, seconds)
        else:
            fail("unknown check " + check)
    print("cluster checks passed: " + check)


if __name__ == "__main__":
    main()
