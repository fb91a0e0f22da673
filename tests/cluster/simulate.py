#!/usr/bin/env python3
"""Routing workspaces over many replicas, on paper (docs/scale-out.md, "At scale").

usage: simulate.py [--replicas 100] [--workspaces 10000] [--requests 200000] [--load 4]
                   [--cache 60] [--zipf 1.0] [--seed 1] [--json]

A discrete-event simulation with only the Python standard library. Requests arrive as a Poisson
process, each of one workspace drawn by Zipf popularity; a request is in flight for an
exponential time (mean 1), and on average --load requests are in flight per replica. Each
replica keeps the prefixes of its --cache most recently used workspaces (an LRU). A request is a
hit when its replica holds its workspace's prefix; otherwise, with a shared disk tier, a disk
restore when any replica has served that workspace before (its prefix is in the shared
directory), else a cold prefill.

Policies: random, round robin, consistent hashing alone, and bounded-load consistent hashing as
HAProxy 2.6 computes it (lb_chash.c, chash_server_is_eligible: a server may take a request while
the requests it serves are fewer than its share of ceil((in flight + 1) * factor / 100), counted
in whole requests; else the next server on the ring), on a ring of 1,600 points per replica
(weight 100, as deploy/haproxy/warmctx.cfg sets it).

Load imbalance: at every arrival, the busiest replica's requests in flight over the mean; the
table gives its mean and 99th percentile over the run. Failure: after half the requests one
replica (the busiest by then) stops; the hit rate of the next 10% of requests, and the
workspaces whose replica changed, are reported against the run without the failure.
"""
import argparse
import bisect
import hashlib
import heapq
import json
import random
from collections import OrderedDict


def h64(s):
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class Ring:
    def __init__(self, n, points=1600):
        pts = sorted((h64(f"server{s}#{p}"), s) for s in range(n) for p in range(points))
        self.keys = [k for k, _ in pts]
        self.owner = [s for _, s in pts]

    def walk(self, key, alive):
        """Servers in ring order from the key's point, each once, alive only."""
        i = bisect.bisect(self.keys, key) % len(self.keys)
        seen = set()
        for j in range(len(self.keys)):
            s = self.owner[(i + j) % len(self.keys)]
            if s not in seen:
                seen.add(s)
                if alive[s]:
                    yield s


def simulate(policy, factor, a, fail=False):
    rng = random.Random(a.seed)
    n, w = a.replicas, a.workspaces
    weights = [1.0 / (i + 1) ** a.zipf for i in range(w)]
    cum, t = [], 0.0
    for x in weights:
        t += x
        cum.append(t)
    ws_keys = [h64(f"workspace{i}") for i in range(w)]
    ring = Ring(n) if policy.startswith("chash") else None
    alive = [True] * n
    n_alive = n
    caches = [OrderedDict() for _ in range(n)]
    served = [0] * n
    in_flight = 0
    done = []  # (end time, server)
    ever = set()
    home = {}  # workspace -> the replica of its last request
    rate = a.load * n
    now = 0.0
    rr = 0
    stats = {"hit": 0, "disk": 0, "cold": 0}
    after = {"hit": 0, "disk": 0, "cold": 0, "n": 0}
    imbalance = []
    moved = set()
    fail_at = a.requests // 2  # the failure (if any); moves are counted from here either way
    window = a.requests // 10
    home_at_fail = {}
    for r in range(a.requests):
        now += rng.expovariate(rate)
        while done and done[0][0] <= now:
            _, s = heapq.heappop(done)
            served[s] -= 1
            in_flight -= 1
        if r == fail_at:
            home_at_fail = dict(home)
        if r == fail_at and fail:
            victim = max(range(n), key=lambda s: len(caches[s]))
            alive[victim] = False
            n_alive -= 1
            caches[victim].clear()
        ws = bisect.bisect(cum, rng.random() * t)
        if policy == "random":
            s = rng.choice([x for x in range(n) if alive[x]]) if n_alive < n else rng.randrange(n)
        elif policy == "round-robin":
            while True:
                s = rr % n
                rr += 1
                if alive[s]:
                    break
        else:
            s = None
            if factor == 0:
                s = next(ring.walk(ws_keys[ws], alive))
            else:
                tot_slots = ((in_flight + 1) * factor + 99) // 100
                # equal weights: each server's share of the slots, the remainder spread by rank
                for cand in ring.walk(ws_keys[ws], alive):
                    rank = sum(1 for x in range(cand) if alive[x])
                    slots = tot_slots // n_alive + (1 if (rank + 1) * (tot_slots % n_alive) // n_alive
                                                    - rank * (tot_slots % n_alive) // n_alive else 0)
                    if served[cand] < max(slots, 1):
                        s = cand
                        break
                if s is None:
                    s = next(ring.walk(ws_keys[ws], alive))
        c = caches[s]
        if ws in c:
            kind = "hit"
            c.move_to_end(ws)
        else:
            kind = "disk" if ws in ever else "cold"
            c[ws] = True
            if len(c) > a.cache:
                c.popitem(last=False)
        ever.add(ws)
        if r >= fail_at and r < fail_at + window and home_at_fail.get(ws, s) != s:
            moved.add(ws)
        home[ws] = s
        stats[kind] += 1
        if r >= a.requests // 2 and r < a.requests // 2 + window:
            after[kind] += 1
            after["n"] += 1
        served[s] += 1
        in_flight += 1
        heapq.heappush(done, (now + rng.expovariate(1.0), s))
        if r % 7 == 0 and r > a.requests // 20:
            mean = in_flight / n_alive
            imbalance.append(max(served) / mean if mean else 1.0)
    imbalance.sort()
    total = a.requests
    return {
        "hit_rate": stats["hit"] / total,
        "disk_rate": stats["disk"] / total,
        "cold_rate": stats["cold"] / total,
        "imbalance_mean": sum(imbalance) / len(imbalance),
        "imbalance_p99": imbalance[int(0.99 * (len(imbalance) - 1))],
        "window_hit_rate": after["hit"] / max(after["n"], 1),
        "window_disk_rate": after["disk"] / max(after["n"], 1),
        "window_cold_rate": after["cold"] / max(after["n"], 1),
        "moved_workspaces": len(moved),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=100)
    p.add_argument("--workspaces", type=int, default=10000)
    p.add_argument("--requests", type=int, default=200000)
    p.add_argument("--load", type=float, default=4.0, help="mean requests in flight per replica")
    p.add_argument("--cache", type=int, default=60, help="workspace prefixes each replica keeps")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    policies = [("random", 0), ("round-robin", 0), ("chash", 0)] + [("chash", f) for f in (110, 125, 150, 200, 300)]
    rows = []
    for policy, factor in policies:
        base = simulate(policy, factor, a)
        failed = simulate(policy, factor, a, fail=True)
        name = policy if policy != "chash" else ("consistent hash" + (f", factor {factor}" if factor else ", unbounded"))
        rows.append({"policy": name, **base, "same_window_without_failure": {k: base[k] for k in
                     ("window_hit_rate", "window_disk_rate", "window_cold_rate", "moved_workspaces")},
                     "after_failure": {k: failed[k] for k in
                     ("window_hit_rate", "window_disk_rate", "window_cold_rate", "moved_workspaces")}})
    if a.json:
        print(json.dumps({"args": vars(a), "rows": rows}, indent=2))
        return
    print(f"{a.replicas} replicas, {a.workspaces} workspaces (Zipf s={a.zipf}), {a.requests} requests, "
          f"{a.load} in flight per replica on average, {a.cache} prefixes per replica, seed {a.seed}")
    print("| policy | hit | disk restore | cold | busiest/mean in flight (mean, p99) "
          "| next 10% of requests: hit, disk (no failure → one replica failed) | workspaces moved (same) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        f, b = r["after_failure"], r["same_window_without_failure"]
        print(f"| {r['policy']} | {r['hit_rate']:.1%} | {r['disk_rate']:.1%} | {r['cold_rate']:.1%} "
              f"| {r['imbalance_mean']:.2f}, {r['imbalance_p99']:.2f} "
              f"| {b['window_hit_rate']:.1%}, {b['window_disk_rate']:.1%} → {f['window_hit_rate']:.1%}, "
              f"{f['window_disk_rate']:.1%} | {b['moved_workspaces']} → {f['moved_workspaces']} |")


if __name__ == "__main__":
    main()
