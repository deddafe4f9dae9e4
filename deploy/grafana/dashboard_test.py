#!/usr/bin/python3
"""Checks deploy/grafana/fitrun-dashboard.json: valid JSON Grafana imports (a `datasource` variable the
panels use, the `job` and `device` variables), every panel with at least one Prometheus expression,
and every expression valid PromQL, parsed by Debian's promtool as a rule file of recording rules.

Whether each expression also returns data from a real fitrund is tests/prometheus_test.py's job.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "fitrun"))
DASHBOARD = os.path.join(RUNFILES, "deploy/grafana/fitrun-dashboard.json")
if not os.path.exists(DASHBOARD):  # run from the checkout
    DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fitrun-dashboard.json")
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")

# What Grafana puts in place of the variables, near enough for parsing: "All" is `.*` (allValue).
VARIABLES = {"job": ".*", "device": ".*", "__rate_interval": "1m", "__interval": "1m", "__range": "1h"}


def substitute(expr):
    """`expr` with $name, ${name} and ${name:format} replaced; unknown variables are left as they are."""
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)",
                  lambda m: VARIABLES.get(m.group(1) or m.group(2), m.group(0)), expr)


def panels(dashboard):
    """Every panel, those inside rows included, rows themselves left out."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DASHBOARD) as f:
            cls.dashboard = json.load(f)  # fails the whole test on invalid JSON
        cls.variables = {v["name"]: v for v in cls.dashboard.get("templating", {}).get("list", [])}

    def test_it_is_a_dashboard_grafana_imports(self):
        self.assertEqual(self.dashboard["uid"], "fitrun")
        self.assertTrue(self.dashboard["title"])
        self.assertGreaterEqual(self.dashboard["schemaVersion"], 36)
        ids = [p["id"] for p in self.dashboard["panels"]]
        ids += [inner["id"] for p in self.dashboard["panels"] for inner in p.get("panels", [])]  # collapsed rows'
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        taken = set()
        for panel in self.dashboard["panels"]:
            g = panel["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, panel["title"])
            cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            self.assertFalse(cells & taken, f"{panel['title']!r} overlaps another panel")
            taken |= cells

    def test_the_datasource_job_and_device_variables(self):
        datasource = self.variables.get("datasource")
        self.assertIsNotNone(datasource, "no `datasource` variable")
        self.assertEqual(datasource["type"], "datasource")
        self.assertEqual(datasource["query"], "prometheus")
        for name, query in (("job", "label_values(fitrun_job_info, job_id)"),
                            ("device", "label_values(fitrun_device_memory_total_bytes, device)")):
            variable = self.variables.get(name)
            self.assertIsNotNone(variable, f"no `{name}` variable")
            self.assertEqual(variable["type"], "query")
            text = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            self.assertEqual(text, query)
            self.assertTrue(variable["multi"], name)
            self.assertTrue(variable["includeAll"], name)
            self.assertEqual(variable["datasource"]["uid"], "${datasource}", name)

    def test_every_panel_queries_prometheus_through_the_variable(self):
        count = 0
        for panel in panels(self.dashboard):
            targets = panel.get("targets", [])
            self.assertTrue(targets, f"panel {panel['title']!r} has no targets")
            self.assertEqual(panel["datasource"]["uid"], "${datasource}", panel["title"])
            ref_ids = [t["refId"] for t in targets]
            self.assertEqual(len(ref_ids), len(set(ref_ids)), f"{panel['title']!r}: refIds repeat")
            for target in targets:
                self.assertTrue(target.get("expr", "").strip(), f"{panel['title']!r} {target['refId']}: no expr")
                self.assertEqual(target["datasource"]["uid"], "${datasource}", panel["title"])
                left = re.findall(r"\$\{?\w+", substitute(target["expr"]))
                self.assertFalse(left, f"{panel['title']!r} {target['refId']}: unknown variables {left}")
                count += 1
        print(f"{count} expressions in {sum(1 for _ in panels(self.dashboard))} panels")

    def test_every_expression_is_valid_promql(self):
        # promtool parses each rule's expr; recording rules take any expression.
        lines = ["groups:", "  - name: dashboard", "    rules:"]
        for i, panel in enumerate(panels(self.dashboard)):
            for target in panel.get("targets", []):
                lines += [f"      - record: dashboard:panel_{i}_{target['refId']}",
                          f"        expr: {json.dumps(substitute(target['expr']))}"]
        with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=os.environ.get("TEST_TMPDIR")) as rules:
            rules.write("\n".join(lines) + "\n")
            rules.flush()
            checked = subprocess.run([PROMTOOL, "check", "rules", rules.name], capture_output=True, text=True)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
        print(checked.stdout.strip())


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + ["-v"])
