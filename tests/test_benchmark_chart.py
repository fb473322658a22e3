"""benchmarks/chart.py: the README's chart is drawn from a benchmark report, bar lengths proportional to speed."""

import json
import re
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_chart_bars_are_proportional_to_the_report(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from chart import write_chart
    finally:
        sys.path.remove(str(BENCHMARKS))
    report = json.loads((BENCHMARKS / "current.json").read_text())
    svg = write_chart(report, tmp_path / "speed.svg").read_text()
    widths = [float(w) for w in re.findall(r'<rect x="170" y="[\d.]+" width="([\d.]+)"', svg)]
    prefill = [report[e]["prefill_tokens_per_s"] for e in ("eager", "pte", "runner")]
    decode = [report[e]["decode_tokens_per_s"] for e in ("eager", "pte", "runner")]
    assert len(widths) == 6
    for drawn, values in ((widths[:3], prefill), (widths[3:], decode)):
        assert all(abs(w / drawn[-1] - v / values[-1]) < 0.01 for w, v in zip(drawn, values))
    floor = report["bandwidth"]["copy_gb_per_s"] * 1e3 / report["files"]["read_per_token_mb"]
    assert f"bandwidth floor {floor:,.0f}" in svg
    # The committed chart is the one the current numbers draw.
    assert (BENCHMARKS.parent / "docs" / "images" / "speed.svg").read_text() == svg
