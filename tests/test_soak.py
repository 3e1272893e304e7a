"""The CI soak: scripts/soak.py against a live `tallow serve` on smollm2-135m, a short run of the
full mix (every kind of request at least once, disconnects and invalid bodies included). The long
run (10,000 requests) is by hand; its figures are in docs/reliability.md."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from server_utils import require_model

ROOT = Path(__file__).resolve().parent.parent


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_plan_sends_every_kind_in_its_proportion():
    soak = _soak_module()
    kinds = [k for client in soak.plan(10_000, 4, 0) for k in client]
    assert len(kinds) == 10_000 and sum(soak.MIX.values()) == 100
    assert {k: kinds.count(k) for k in soak.MIX} == {k: 100 * pct for k, pct in soak.MIX.items()}
    assert set(k for client in soak.plan(12, 2, 0) for k in client) == set(soak.MIX)


def test_ci_soak_meets_every_target(tmp_path):
    require_model("smollm2-135m")
    soak = _soak_module()
    out = tmp_path / "soak.json"
    rc = soak.main(["--model", "smollm2-135m", "--requests", "12", "--clients", "2", "--max-tokens", "3",
                    "--probes", "1", "--sample-s", "0.5", "--json", str(out)])
    summary = json.loads(out.read_text())
    failed = {k: v for k, v in summary["targets"].items() if not v}
    assert rc == 0, f"targets missed: {failed}; unexpected: {summary['unexpected']}; metrics: {summary['metric_checks']}"
    assert summary["five_xx"] == 0 and summary["hangs"] == 0
    assert len(summary["samples"]) >= 2 and summary["rss_mb"]["growth_after_warmup"] is not None
    assert set(summary["by_kind_status"]) >= {"invalid:400", "past_context:400", "chat_stream:200", "tool_required:200"}
