#!/usr/bin/python3
"""Lists C++ function bodies longer than N lines (default 100), longest first: a brace-counting reader, good enough
for our style (preprocessor lines, comments, strings and raw strings are skipped). Usage:
  scripts/long_functions.py [N] [FOLDER...]   (default: the source rooms)
Issue 38 asks that no function be over ~100 lines without a reason written beside it."""
import re, sys, os
KEYWORDS = ("namespace", "class", "struct", "enum", "union", "extern", "if", "for", "while", "switch", "do", "else", "try", "catch")
def strip(line, state):
    out = []; i = 0
    while i < len(line):
        if state["block"]:
            j = line.find("*/", i)
            if j < 0: return "".join(out)
            state["block"] = False; i = j + 2; continue
        c = line[i]
        if line.startswith("//", i): break
        if line.startswith("/*", i): state["block"] = True; i += 2; continue
        if line.startswith('R"(', i):
            j = line.find(')"', i + 3)
            if j < 0: state["raw"] = True; return "".join(out)
            i = j + 2; continue
        if c in "\"'":
            j = i + 1
            while j < len(line) and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c); i = j + 1; continue
        out.append(c); i += 1
    return "".join(out)
def scan(path, limit):
    res = []; depth = 0; stack = []; state = {"block": False, "raw": False}; pending = ""
    for n, raw in enumerate(open(path, errors="replace"), 1):
        if state["raw"]:
            if ')"' in raw: state["raw"] = False; raw = raw[raw.find(')"') + 2:]
            else: continue
        line = strip(raw, state)
        if line.lstrip().startswith("#"):  # a preprocessor line is never part of a signature
            pending = ""
            continue
        for ch in line:
            if ch == "{":
                sig = pending.strip()
                head = re.sub(r"\s+", " ", sig)
                is_fn = (")" in head and not any(re.match(r"(.*\s)?%s\b" % k, head.split("(")[0] + " ") and head.split("(")[0].strip().split(" ")[0] in KEYWORDS for k in KEYWORDS)
                         and not head.endswith("=") and "=" not in head.split("(")[0] and not any(f for f in stack if f))
                m = re.search(r"([~\w:<>]+)\s*\(", head)
                stack.append((n, m.group(1) if (is_fn and m) else None) if is_fn else None)
                pending = ""; depth += 1
            elif ch == "}":
                depth -= 1
                if stack:
                    top = stack.pop()
                    if top and n - top[0] + 1 > limit: res.append((n - top[0] + 1, path, top[0], top[1]))
                pending = ""
            elif ch == ";":
                pending = ""
            else:
                pending += ch
        pending += " "
    return res
limit = int(sys.argv[1]) if len(sys.argv) > 1 else 100
roots = sys.argv[2:] or ["core", "compress", "transport", "grid", "metrics", "comm", "runtime", "plan", "web", "job", "apps"]
out = []
for root in roots:
    for d, _, fs in os.walk(root):
        if "/build" in d or "/.git" in d: continue
        for f in fs:
            if f.endswith((".cpp", ".cu", ".h", ".cuh")): out += scan(os.path.join(d, f), limit)
for r in sorted(out, reverse=True): print("%5d %s:%d %s" % r)
print("%d functions over %d lines" % (len(out), limit))
