#!/usr/bin/env python3
"""The floor of exact reuse on a `warmctx-bench edits` workload for the best static order
chosen knowing every edit in advance: the segments sorted by how often they are edited
(the most edited last), each edited turn costing the edited segment from its edited line
on, every segment after it, and the question. A model over the workload's own numbers
(the edited segments' tokens and the edits' places from the bench's JSON; a segment never
edited counts FILE tokens, the repository map MAP), not a run.

usage: bench/edits-static-order-floor.py RESULT.json [FILE_TOKENS MAP_TOKENS QUESTION_TOKENS]
"""
import json
import statistics
import sys
from collections import Counter

d = json.load(open(sys.argv[1]))
file_tokens, map_tokens, question = (int(x) for x in (sys.argv[2:5] or (600, 2100, 30)))
w = d["workload"]
seg = w["edited_segment_of_turn"][1:]
tok = w["edited_segment_tokens_of_turn"][1:]
at = w["edited_line_at_fraction_of_turn"][1:]
size = {f"pin-{i}": file_tokens for i in range(w["files"])}
size["repo-map"] = map_tokens
size.update(dict(zip(seg, tok)))
edits = Counter(seg)
order = sorted(size, key=lambda s: edits[s])
pos = {s: i for i, s in enumerate(order)}
ratios = [((1 - f) * t + sum(size[x] for x in order[pos[s] + 1:]) + question) / t for s, t, f in zip(seg, tok, at)]
print(json.dumps({"edits_per_segment": dict(edits.most_common()), "static_order": order,
                  "floor_over_segment_tokens_median": statistics.median(ratios)}, indent=1))
