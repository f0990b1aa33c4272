#!/usr/bin/python3
"""Reads a Prometheus text exposition (a scrape of the coordinator's /metrics) on stdin, parses it with
python3-prometheus-client's parser (the format as Prometheus reads it) and checks the naming conventions promtool's
lint checks: every family has HELP and TYPE, counters end in _total, names are valid, units are base units, and no
series appears twice. Prints one line per problem and exits 1 when there is any; else prints a summary.

    curl -s http://127.0.0.1:8080/metrics | /usr/bin/python3 scripts/check_prometheus.py
"""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
problems = []
declared = {}
for line in text.splitlines():
    m = re.match(r"^# (HELP|TYPE) (\S+) ?(.*)$", line)
    if m:
        declared.setdefault(m.group(2), set()).add(m.group(1))
        if m.group(1) == "TYPE" and m.group(3) == "counter" and not m.group(2).endswith("_total"):
            problems.append("%s: a counter's name ends in _total" % m.group(2))
    elif line and not line.startswith("#") and "{" not in line.split(" ")[0] and len(line.split(" ")) < 2:
        problems.append("malformed line: " + line)
try:
    families = list(text_string_to_metric_families(text))
except Exception as e:  # the parser's own words name the line
    print("does not parse: %s" % e)
    sys.exit(1)
series = set()
samples = 0
name_re = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
for f in families:
    full = f.name + "_total" if f.type == "counter" else f.name
    kinds = declared.get(full, set()) | declared.get(f.name, set())
    if "HELP" not in kinds or not f.documentation:
        problems.append("%s: no HELP" % full)
    if "TYPE" not in kinds:
        problems.append("%s: no TYPE" % full)
    if f.type == "unknown":
        problems.append("%s: untyped" % full)
    for bad in ("_milliseconds", "_bits", "_megabytes", "_percent"):
        if bad in full:
            problems.append("%s: not a base unit (%s)" % (full, bad))
    for s in f.samples:
        samples += 1
        if not name_re.match(s.name):
            problems.append("bad name: " + s.name)
        if f.type == "counter" and not (s.name.endswith("_total") or s.name.endswith("_created")):
            problems.append("counter sample without _total: " + s.name)
        key = (s.name, tuple(sorted(s.labels.items())))
        if key in series:
            problems.append("series twice: %s%s" % (s.name, dict(s.labels)))
        series.add(key)
        if f.type == "counter" and s.value < 0:
            problems.append("negative counter: %s%s" % (s.name, dict(s.labels)))
for p in problems:
    print(p)
if problems:
    sys.exit(1)
print("ok: %d families, %d samples" % (len(families), samples))
