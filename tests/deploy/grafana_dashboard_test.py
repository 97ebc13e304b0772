#!/usr/bin/env python3
"""grafana_dashboard_test: deploy/grafana/tierd-dashboard.json asks only for what tierd exports.

What tierd exports is taken from a live scrape: a tierd of this build (host engine, an NVMe tier)
with metrics_listen, scraped while a client session is open and has run an offload, a reload and a
failing job. Families a host-engine tierd cannot show (the GPU lanes) come from the exposition of
tests/unit/metrics_sample.h, which sets every field of a snapshot; the test names those families,
so one that vanishes from the live scrape is noticed.

Then every PromQL expression of the dashboard (panel targets and the variable query) must
  - name only metrics in that list;
  - use, in its selectors and by (...) clauses, only labels those metrics carry (or the target
    labels Prometheus adds: instance, job), and in label="value" matchers only values seen;
  - have legends ({{label}}) that its result can fill;
  - parse and type-check as PromQL (promtool check rules, with Grafana's variables substituted),
    where promtool is installed (Debian: prometheus).
and the JSON must be a dashboard Grafana imports: uid, unique panel ids, targets with refIds and
the ${datasource} variable, panels inside the 24-column grid and not overlapping.

usage: grafana_dashboard_test.py --dashboard JSON --tierd BIN --sample BIN --python-dir DIR
                                 --build-dir DIR [--promtool BIN]
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

ARGS = None

# Families only a GPU engine has: a host-engine tierd cannot show them in a live scrape.
GPU_ONLY = {"tierd_lane_wait_seconds", "tierd_lane_queued_jobs", "tierd_lane_copies_in_flight"}
# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}
# Grafana's variables, as a query of this dashboard may use them, with a value PromQL accepts.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
                     "$instance": ".+"}

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month",
    "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters", "hour", "idelta",
    "increase", "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "max_over_time", "min_over_time", "minute", "month", "predict_linear", "present_over_time",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt",
    "stddev_over_time", "stdvar_over_time", "sum_over_time", "time", "timestamp", "vector", "year",
    "label_values",  # Grafana's, in variable queries
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}


# --- the exposition ------------------------------------------------------------------------------

SAMPLE_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+')
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """{metric name: {label: {values}}} of every sample line (histograms: _bucket, _sum, _count)."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_LINE.match(line)
        if not m:
            raise AssertionError("unparsable exposition line: %r" % line)
        labels = series.setdefault(m.group(1), {})
        for name, value in LABEL_PAIR.findall(m.group(2) or ""):
            labels.setdefault(name, set()).add(value)
    return series


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def live_exposition():
    """A scrape of a real tierd (host engine, NVMe tier) while a session is open and has run an
    offload, a reload and a reload of an object that does not exist."""
    work = tempfile.mkdtemp(prefix="tierd-dash-")
    sock = os.path.join(work, "tierd.sock")
    port = free_port()
    log = open(os.path.join(work, "tierd.log"), "w")
    proc = subprocess.Popen(
        [ARGS.tierd, "--socket=" + sock, "--session_socket=" + os.path.join(work, "s.sock"),
         "--state_dir=" + os.path.join(work, "state"), "--pool_bytes=64M", "--pool_lock=off",
         "--spill_bytes=16M", "--metrics_listen=127.0.0.1:%d" % port, "--log_level=warning"],
        stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d/metrics" % port
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError("tierd exited with %s: %s" % (
                    proc.returncode, open(os.path.join(work, "tierd.log")).read()))
            try:
                if os.path.exists(sock):
                    urllib.request.urlopen(url, timeout=5).read()
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("tierd did not serve %s within 30 s" % url)
            time.sleep(0.05)

        os.environ["TIER_BUILD_DIR"] = ARGS.build_dir
        sys.path.insert(0, ARGS.python_dir)
        import tier
        with tier.Client(socket=sock, name="dashboard") as client:
            buf = client.alloc_host_buffer(1 << 20)
            obj, job = client.offload_buffer(buf, 0, 1 << 20)
            client.wait(job)
            client.wait(client.reload_buffer(obj, buf, 0, 1 << 20))
            try:
                client.wait(client.reload_buffer(obj + 1000, buf, 0, 1 << 20))
                raise AssertionError("a reload of an unknown object succeeded")
            except tier.NotFound:
                pass
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        return text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def sample_exposition():
    return subprocess.run([ARGS.sample], check=True, capture_output=True, text=True).stdout


# --- PromQL, as far as the checks need it --------------------------------------------------------

STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
SELECTOR = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}')
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")')
GROUPING = re.compile(r'\b(by|without)\s*\(([^)]*)\)')
IDENTIFIER = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*')
DURATION = re.compile(r'\[[^\]]*\]')
LEGEND_LABEL = re.compile(r'\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}')


def metric_names(expr):
    """The metric names an expression selects (not functions, keywords or label names)."""
    if expr.startswith("label_values("):
        return {expr[len("label_values("):].split(",")[0].strip().split("{")[0]}
    text = SELECTOR.sub(lambda m: (m.group(1) or "") + " ", expr)  # label matchers out
    text = GROUPING.sub(" ", text)                                   # by (...) lists out
    text = DURATION.sub(" ", text)                                   # [5m] out
    text = STRING.sub(" ", text)
    names = set()
    for m in IDENTIFIER.finditer(text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if word in KEYWORDS or word in AGGREGATIONS or word in PROMQL_FUNCTIONS:
            continue
        if rest.startswith("("):
            raise AssertionError("unknown function %r in %r" % (word, expr))
        names.add(word)
    return names


def selectors(expr):
    """(metric name or None, [(label, op, value)]) for each {...} in the expression."""
    out = []
    for m in SELECTOR.finditer(expr):
        matchers = [(l, op, json.loads(v)) for l, op, v in MATCHER.findall(m.group(2))]
        out.append((m.group(1), matchers))
    return out


def grouping_labels(expr):
    labels = set()
    for _, inner in GROUPING.findall(expr):
        labels.update(l.strip() for l in inner.split(",") if l.strip())
    return labels


def result_labels(expr, known):
    """The labels the result of expr can carry: the by (...) labels where it aggregates (le is
    consumed by histogram_quantile), else every label of the metrics it selects."""
    aggregates = re.search(r'\b(%s)\s*(\(|by\b|without\b)' % "|".join(AGGREGATIONS), expr)
    if aggregates:
        labels = grouping_labels(expr)
        if "histogram_quantile(" in expr:
            labels.discard("le")
        return labels
    labels = set(TARGET_LABELS)
    for name in metric_names(expr):
        labels.update(known.get(name, {}))
    return labels


# --- the dashboard -------------------------------------------------------------------------------

def load_dashboard():
    with open(ARGS.dashboard) as f:
        return json.load(f)


def all_panels(dashboard):
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # panels inside collapsed rows
    return out


def queries(dashboard):
    """(where, expr, legend) of every query: panel targets and query variables."""
    out = []
    for panel in all_panels(dashboard):
        for t in panel.get("targets", []):
            out.append(("panel %r target %s" % (panel["title"], t["refId"]), t["expr"],
                        t.get("legendFormat", "")))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append(("variable %r" % var["name"], q, ""))
    return out


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dashboard = load_dashboard()
        cls.live = parse_exposition(live_exposition())
        cls.sample = parse_exposition(sample_exposition())
        cls.known = {name: {l: set(v) for l, v in labels.items()}
                     for name, labels in cls.sample.items()}
        for name, labels in cls.live.items():
            for label, values in labels.items():
                cls.known.setdefault(name, {}).setdefault(label, set()).update(values)

    def test_the_live_scrape_shows_every_family_but_the_gpu_lanes(self):
        # The sample is the whole list only if a real tierd shows the same families (tierd's:
        # prometheus-cpp's exposer adds its own exposer_* to the scrape).
        live = {name for name in self.live if name.startswith("tierd_")}
        self.assertEqual(set(self.sample) - live, GPU_ONLY)
        self.assertEqual(live - set(self.sample), set())

    def test_it_is_a_dashboard_grafana_imports(self):
        d = self.dashboard
        self.assertEqual(d["uid"], "tierd")
        self.assertTrue(d["title"])
        self.assertIsInstance(d["schemaVersion"], int)
        variables = {v["name"]: v for v in d["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        ids = [p["id"] for p in all_panels(d)]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are not unique")
        cells = {}
        for p in all_panels(d):
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells,
                                     "%r overlaps %r" % (p["title"], cells.get((x, y))))
                    cells[(x, y)] = p["title"]
            if p["type"] == "row":
                continue
            self.assertTrue(p.get("description"), "%r has no description" % p["title"])
            self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${datasource}"})
            self.assertTrue(p["targets"], "%r has no query" % p["title"])
            refs = [t["refId"] for t in p["targets"]]
            self.assertEqual(len(refs), len(set(refs)), p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"], p["datasource"], p["title"])
                self.assertIn('instance=~"$instance"', t["expr"],
                              "%r ignores the Node variable" % p["title"])

    def test_every_metric_is_one_tierd_exports(self):
        only_in_sample = set()
        for where, expr, _ in queries(self.dashboard):
            names = metric_names(expr)
            self.assertTrue(names, "%s selects no metric: %s" % (where, expr))
            for name in names:
                self.assertTrue(name in self.known, "%s: tierd exports no %s" % (where, name))
                if name not in self.live:
                    only_in_sample.add(name)
        self.assertLessEqual(only_in_sample, GPU_ONLY)
        used = set().union(*(metric_names(e) for _, e, _ in queries(self.dashboard)))
        print("\n%d metrics used by the dashboard, all exported (%s from the GPU-lane sample only)"
              % (len(used), ", ".join(sorted(only_in_sample)) or "none"), file=sys.stderr)

    def test_every_label_and_value_exists(self):
        for where, expr, _ in queries(self.dashboard):
            names = metric_names(expr)
            labels_of_expr = set(TARGET_LABELS)
            for name in names:
                labels_of_expr.update(self.known.get(name, {}))
            for name, matchers in selectors(expr):
                self.assertIsNotNone(name, "%s: a selector without a metric name" % where)
                labels = self.known.get(name, {})
                for label, op, value in matchers:
                    if label in TARGET_LABELS:
                        continue
                    self.assertIn(label, labels, "%s: %s has no label %s" % (where, name, label))
                    if op in ("=", "!="):
                        self.assertIn(value, labels[label], "%s: %s{%s} never reads %r" % (
                            where, name, label, value))
            for label in grouping_labels(expr):
                self.assertIn(label, labels_of_expr, "%s: by (%s): no metric of it has that label"
                              % (where, label))
            if expr.startswith("label_values("):
                label = expr.rstrip(")").split(",")[-1].strip()
                self.assertIn(label, labels_of_expr, where)

    def test_every_legend_can_be_filled(self):
        for where, expr, legend in queries(self.dashboard):
            allowed = result_labels(expr, self.known)
            for label in LEGEND_LABEL.findall(legend):
                self.assertIn(label, allowed, "%s: legend %r names %s, which the result of %s "
                              "does not carry" % (where, legend, label, expr))

    def test_every_expression_is_valid_promql(self):
        if not ARGS.promtool or not os.access(ARGS.promtool, os.X_OK):
            self.skipTest("no promtool (Debian: prometheus): PromQL syntax not checked")
        rules = []
        for i, (where, expr, _) in enumerate(queries(self.dashboard)):
            if expr.startswith("label_values("):
                continue  # Grafana's, not PromQL
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            self.assertNotIn("$", expr, "%s: a Grafana variable the test does not know" % where)
            rules.append({"record": "tierd:dashboard:%d" % i, "expr": expr})
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)  # JSON is YAML
            f.flush()
            r = subprocess.run([ARGS.promtool, "check", "rules", f.name],
                               capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS: %d rules found" % len(rules), r.stdout)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--tierd", required=True)
    parser.add_argument("--sample", required=True)
    parser.add_argument("--python-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--promtool", default="")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
