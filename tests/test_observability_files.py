"""The Prometheus alerts and the Grafana dashboard shipped with crawld.

* ``etc/prometheus/crawld-alerts.yml`` passes ``promtool check rules`` and
  the unit tests of ``tests/promtool/crawld-alerts.test.yml`` pass
  (``promtool test rules``);
* every alert has a case where it fires and one where it stays quiet;
* ``etc/grafana/crawld-dashboard.json`` is valid and every panel queries
  something;
* every metric named in a PromQL expression (alert or panel) is one crawld
  exports (crawld/metrics.py): a renamed or misspelt metric fails here
  instead of silently never alerting.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "etc" / "prometheus" / "crawld-alerts.yml"
RULE_TESTS = ROOT / "tests" / "promtool" / "crawld-alerts.test.yml"
DASHBOARD = ROOT / "etc" / "grafana" / "crawld-dashboard.json"
METRICS_SRC = ROOT / "crawld" / "metrics.py"


def _yaml(path: Path):
    try:
        import yaml
    except ImportError:  # pragma: no cover - a setup problem, not a test result
        pytest.fail("PyYAML is missing from the virtualenv: add it to requirements-dev.txt")
    return yaml.safe_load(path.read_text())


def _promtool() -> str:
    exe = shutil.which("promtool")
    if not exe:
        pytest.fail("promtool not found: install Debian package prometheus (make sysdeps)")
    return exe


# -- promtool ----------------------------------------------------------------------

@pytest.mark.parametrize("args", [["check", "rules", str(RULES.relative_to(ROOT))],
                                  ["test", "rules", str(RULE_TESTS.relative_to(ROOT))]],
                         ids=["check-rules", "test-rules"])
def test_promtool(args):
    res = subprocess.run([_promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"promtool {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"


def _alerts() -> dict[str, dict]:
    alerts = {}
    for group in _yaml(RULES)["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["alert"] not in alerts, f"alert {rule['alert']} defined twice"
                alerts[rule["alert"]] = rule
    return alerts


def test_every_alert_has_a_firing_and_a_quiet_case():
    alerts = _alerts()
    assert alerts, "no alert in the rules file"
    firing, quiet = set(), set()
    for case in _yaml(RULE_TESTS)["tests"]:
        for t in case.get("alert_rule_test") or []:
            (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    assert set(alerts) - firing == set(), "alerts never tested firing"
    assert set(alerts) - quiet == set(), "alerts never tested quiet (exp_alerts: [])"
    assert (firing | quiet) - set(alerts) == set(), "tests of alerts that do not exist"


def test_alerts_are_complete():
    for name, rule in _alerts().items():
        assert "for" in rule, f"{name}: no 'for:'"
        assert rule.get("labels", {}).get("severity") in ("page", "ticket"), f"{name}: severity page|ticket"
        ann = rule.get("annotations", {})
        assert ann.get("summary") and ann.get("description"), f"{name}: summary and description"


# -- the dashboard -----------------------------------------------------------------

def _panels(panels):
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])  # panels of a (collapsed) row


def test_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "label_values(crawld_shard_queued, crawl_id)" in json.dumps(variables["crawl_id"])
    panels = list(_panels(dash["panels"]))
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in panels:
        targets = [t for t in p.get("targets") or [] if t.get("expr", "").strip()]
        assert targets, f"panel {p.get('title')!r} has no target"


# -- metric names --------------------------------------------------------------------

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
             "enum": ("",)}


def exported_metrics() -> set[str]:
    """Every series name crawld's /metrics can show: the module's metric
    objects, plus the families its scrape-time collectors build."""
    from prometheus_client.metrics import MetricWrapperBase

    import crawld.metrics as m

    names = set()
    for obj in vars(m).values():
        if isinstance(obj, MetricWrapperBase):
            names.update(obj._name + s for s in _SUFFIXES[obj._type])
    fams = re.findall(r'\b(Gauge|Counter|Histogram|Summary|Info)MetricFamily\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"',
                      METRICS_SRC.read_text())
    assert fams, "no collector metric family found in crawld/metrics.py"
    for kind, name in fams:
        kind = kind.lower()
        if kind == "counter":
            name = name.removesuffix("_total")
        names.update(name + s for s in _SUFFIXES[kind] if not (kind == "counter" and s == "_created"))
    return names


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan", "atan2", "start", "end"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (Grafana's $variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    e = re.sub(r"#[^\n]*", " ", e)                                              # comments
    e = re.sub(r"\{[^}]*\}", " ", e)                                            # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                                           # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)                                          # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in _KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.add(ident)
    return names


def test_metric_names_parser():
    assert metric_names('sum by (crawl_id, le) (rate(foo_bucket{a="b",c=~"$x"}[$__rate_interval])) '
                        '/ on (crawl_id) group_left bar > 0.5 and baz offset 5m or max without (x) (q) > 1e9') \
        == {"foo_bucket", "bar", "baz", "q"}
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m]))) > bool 2') == {"x_bucket"}


def _dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [(f"panel {p.get('title')!r}", t["expr"])
             for p in _panels(dash["panels"]) for t in p.get("targets") or [] if t.get("expr")]
    for v in dash["templating"]["list"]:  # label_values(metric, label): the metric
        for metric in re.findall(r"label_values\(\s*([^,)]+)", json.dumps(v)):
            exprs.append((f"variable {v['name']!r}", metric))
    return exprs


def test_every_metric_in_alerts_and_dashboard_is_exported():
    exported = exported_metrics()
    assert {"crawld_fetches_total", "crawld_fetch_duration_seconds_bucket", "crawld_shard_queued",
            "crawld_worker_restarts_total", "crawld_redis_up"} <= exported
    exprs = [(f"alert {name}", rule["expr"]) for name, rule in _alerts().items()] + _dashboard_exprs()
    assert exprs
    unknown = []
    for where, expr in exprs:
        names = metric_names(expr)
        if not names:
            unknown.append(f"{where}: selects no metric: {expr}")
        unknown += [f"{where}: {n}" for n in sorted(names - exported)]
    assert not unknown, "metrics crawld does not export:\n" + "\n".join(unknown)
