#!/usr/bin/env python3
"""Random inputs for the oracle (grammar-aware label and field selectors with mutations,
validator strings around the length limits, metav1.LabelSelector JSON), one JSON line
{"t": kind, "in": input} each. Usage: gen.py SEED COUNT. Deterministic for a seed."""
import json
import random
import sys

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
r = random.Random(seed)

KEYS = ["a", "x", "y", "app", "in", "notin", "example.com/app", "a/b/c", "-a", "a-", "A_b.C", "1",
        "k" * 63, "k" * 64, "é", "a" * 253 + "/b", "a" * 254 + "/b", "/a", "a/", "Example.com/a",
        "ex_ample.com/a", "a.b", "tier", "!", "a b", "exists", "gt", "İ", "K"]
VALS = ["", "b", "1", "-5", "+5", "007", "99999999999999999999", "9223372036854775807",
        "-9223372036854775808", "x" * 63, "x" * 64, "in", "notin", "a.b", "a_b", "-a", "a-", "é",
        "v1", "0", "b c"]
OPS = ["=", "==", "!=", " in ", " notin ", ">", "<", "", " ", "=>", "<=", "!==", "===", "(", ")"]
SPECIAL = list("=!(),<> \t\r\n") + ["in", "notin", "\x00", "||", "~"]
ALPHA = list("abcxyzABZ019-_./") + ["é", "İ", "K", "\u0378", "\u00a0", "\u200b", "😀", "\x7f",
                                     "<", "&", '"', "\\", "%", "*", "\n", "\x01", "\u2028"]


def rstr(alpha, lo, hi):
    return "".join(r.choice(alpha) for _ in range(r.randint(lo, hi)))


GOOD_KEYS = ["a", "x", "y", "app", "in", "notin", "example.com/app", "A_b.C", "1", "k" * 63, "tier", "exists", "gt", "a.b/c-d"]
GOOD_VALS = ["", "b", "1", "007", "9223372036854775807", "x" * 63, "in", "notin", "a.b", "a_b", "v1", "0", "B"]
GOOD = [False]


def label_req():
    keys, vals = (GOOD_KEYS, GOOD_VALS) if GOOD[0] else (KEYS, VALS)
    k = r.choice(keys)
    c = r.random()
    if c < 0.15:
        return k
    if c < 0.25:
        return "!" + k
    op = r.choice(OPS)
    if op.strip() in ("in", "notin"):
        vals = [r.choice(vals) for _ in range(r.randint(0, 4))]
        sep = r.choice([",", ", ", " ,", ",,"])
        return k + op + "(" + sep.join(vals) + r.choice([")", ")", "", " )"])
    return k + op + r.choice(vals)


def label_sel():
    GOOD[0] = r.random() < 0.5
    s = r.choice([",", ",", ", ", " ,"]).join(label_req() for _ in range(r.randint(1, 4)))
    return mutate(s) if r.random() < (0.15 if GOOD[0] else 0.4) else s


def mutate(s):
    s = list(s)
    for _ in range(r.randint(1, 3)):
        c = r.random()
        i = r.randint(0, len(s))
        if c < 0.4:
            s.insert(i, r.choice(SPECIAL + ALPHA))
        elif c < 0.7 and s:
            del s[min(i, len(s) - 1)]
        elif s:
            s[min(i, len(s) - 1)] = r.choice(SPECIAL + ALPHA)
    return "".join(s)


FIELD_ALPHA = list("abz.=!,\\ ") + ["é", "==", "!=", "\\,", "\\=", "\\\\", "\\a", "metadata.name",
                                    "status.phase", "spec.nodeName", "😀"]


def field_sel():
    c = r.random()
    if c < 0.5:
        terms = []
        for _ in range(r.randint(1, 3)):
            f = r.choice(["metadata.name", "a", "", "spec.nodeName", "x y", "a!b", "f\\,g"])
            op = r.choice(["=", "==", "!=", "", "=!", "!"])
            v = rstr(FIELD_ALPHA, 0, 4)
            terms.append(f + op + v)
        return r.choice([",", ",,", ", "]).join(terms)
    return rstr(FIELD_ALPHA, 0, 12)


VALPHA = list("abcz09-._") + list("ABZ/*%") + ["é", "İ", "K", "\u0378", "\u00a0", "\u200b",
                                                "😀", "\x7f", "\n", "<", "&", '"', "\\", " ", "\u2028", "\x00", "\U000e0001"]
LOWER = list("abcz09-.")


def vstring():
    c = r.random()
    if c < 0.3:
        return rstr(VALPHA, 0, 6)
    if c < 0.55:
        return rstr(LOWER, 0, 8)
    if c < 0.7:
        n = r.choice([61, 62, 63, 64, 65, 252, 253, 254, 255])
        s = rstr(["a", "b", "0", "-", "."], n, n)
        return s if r.random() < 0.5 else "a" + s[1:-1] + "a"
    if c < 0.85:
        p = r.choice(["", "example.com", "Example.com", "a" * 254, "a" * 253, "a..b", "-a", "é.com"])
        nm = r.choice(["", "a", "A_b", "k" * 63, "k" * 64, "-x", "x.", "a/b"])
        return p + "/" + nm
    s = rstr(LOWER, 1, 8) + "-"
    if r.random() < 0.3:
        s = rstr(["é", "a"], 1, 3) + "-"
    return s


def json_sel():
    if r.random() < 0.05:
        return None
    d = {}
    if r.random() < 0.6:
        if r.random() < 0.1:
            d["matchLabels"] = None
        else:
            d["matchLabels"] = {r.choice(KEYS): r.choice(VALS + [None]) for _ in range(r.randint(0, 3))}
    if r.random() < 0.6:
        if r.random() < 0.1:
            d["matchExpressions"] = None
        else:
            exprs = []
            for _ in range(r.randint(0, 3)):
                e = {}
                if r.random() < 0.9:
                    e["key"] = r.choice(KEYS)
                if r.random() < 0.95:
                    e["operator"] = r.choice(["In", "NotIn", "Exists", "DoesNotExist", "Foo", "", "in", "<x>"])
                if r.random() < 0.7:
                    e["values"] = [r.choice(VALS) for _ in range(r.randint(0, 3))]
                elif r.random() < 0.3:
                    e["values"] = None
                exprs.append(e)
            d["matchExpressions"] = exprs
    return d


out = sys.stdout
for i in range(n):
    c = r.random()
    if c < 0.45:
        case = {"t": "label", "in": label_sel() if r.random() < 0.85 else mutate(rstr(SPECIAL + ALPHA, 0, 10))}
    elif c < 0.65:
        case = {"t": "field", "in": field_sel()}
    elif c < 0.9:
        case = {"t": "v", "in": vstring()}
    else:
        case = {"t": "json", "in": json_sel()}
    out.write(json.dumps(case, ensure_ascii=False) + "\n")
