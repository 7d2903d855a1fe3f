#!/usr/bin/env python3
"""Packs oracle answers for the repository.

Usage: pack.py CURATED_ANSWERS RANDOM_ANSWERS KEEP_EVERY_NTH_RANDOM_VALIDATOR_CASE

The long messages that recur go to a dictionary on the first line ({"t": "msgs", "msgs": [...]})
and each occurrence inside an answer is written as "#{<index>}" (tests/upstream_cases.rs expands
them). Inputs ("in") are never packed. Only every Nth random validator case is kept: they are
the bulkiest.
"""
import collections
import json
import sys

curated = [json.loads(l) for l in open(sys.argv[1])]
randoms = [json.loads(l) for l in open(sys.argv[2])]
keep_v = int(sys.argv[3])

nv = 0
cases = list(curated)
for c in randoms:
    if c["t"] == "v":
        nv += 1
        if nv % keep_v:
            continue
    cases.append(c)

LISTS = ["dns1123_label", "dns1123_subdomain", "dns1035_label", "qualified_name", "label_value",
         "c_identifier", "config_map_key", "env_var_name", "port_name", "percent",
         "http_header_name", "wildcard_dns1123_subdomain", "name_subdomain_prefix",
         "name_label_prefix", "name_1035_prefix"]
count = collections.Counter()
for c in cases:
    if c["t"] == "v":
        for k in LISTS:
            for m in c[k]:
                count[m] += 1
msgs = sorted((m for m, n in count.items() if n >= 2 and len(m) > 40), key=lambda m: (-len(m), m))


def pack(s):
    for i, m in enumerate(msgs):
        if m in s:
            s = s.replace(m, "#{%d}" % i)
    return s


def walk(v):
    if isinstance(v, str):
        return pack(v)
    if isinstance(v, list):
        return [walk(x) for x in v]
    if isinstance(v, dict):
        return {k: (x if k in ("in", "t") else walk(x)) for k, x in v.items()}
    return v


out = sys.stdout
out.write(json.dumps({"t": "msgs", "msgs": msgs}, ensure_ascii=False) + "\n")
for c in cases:
    out.write(json.dumps(walk(c), ensure_ascii=False, sort_keys=True) + "\n")
