"""Bar chart of a causal-LM benchmark report (the JSON `bench_causal_lm.py` writes): prefill and decode tokens/s
of each engine, and the decode floor that memory bandwidth sets. Written as SVG with the standard library only,
so drawing it needs no plotting package; GitHub renders it in the README.

    python benchmarks/chart.py benchmarks/results/causal_lm.json -o docs/images/speed.svg
    python benchmarks/bench_causal_lm.py --plot docs/images/speed.svg      # measure, then draw
"""

import argparse
import json
from pathlib import Path
from xml.sax.saxutils import escape

ENGINES = (("eager", "eager fp32 (transformers)", "#9e9e9e"), ("pte", ".pte, Python engine", "#1f77b4"),
           ("runner", ".pte, C++ runner", "#ff7f0e"))  # fmt: skip
METRICS = (("prefill_tokens_per_s", "prefill tok/s"), ("decode_tokens_per_s", "decode tok/s"))
WIDTH, PANEL_HEIGHT, TOP, LEFT = 640, 220, 48, 170


def _floor(report: dict):
    """Decode tokens/s that the copy bandwidth allows for the bytes read per token, or None."""
    bandwidth, files = report.get("bandwidth") or {}, report.get("files") or {}
    if "copy_gb_per_s" not in bandwidth or not files.get("read_per_token_mb"):
        return None
    return bandwidth["copy_gb_per_s"] * 1e3 / files["read_per_token_mb"]


def _panel(y0: float, label: str, values, floor=None) -> list:
    """One metric: a horizontal bar per engine, scaled to the largest value (or the floor)."""
    largest = max([v for _, _, _, v in values] + ([floor] if floor else []))
    span = WIDTH - LEFT - 90
    parts = [f'<text x="10" y="{y0 + 14}" font-weight="bold">{escape(label)}</text>']
    for index, (_, name, color, value) in enumerate(values):
        y = y0 + 26 + index * 34
        width = span * value / largest
        parts += [
            f'<text x="10" y="{y + 17}">{escape(name)}</text>',
            f'<rect x="{LEFT}" y="{y}" width="{width:.1f}" height="24" fill="{color}"/>',
            f'<text x="{LEFT + width + 6:.1f}" y="{y + 17}">{value:,.1f}</text>',
        ]
    if floor:
        x = LEFT + span * floor / largest
        bottom = y0 + 26 + len(values) * 34
        parts += [
            f'<line x1="{x:.1f}" y1="{y0 + 20}" x2="{x:.1f}" y2="{bottom}" stroke="#d62728" stroke-dasharray="4 3"/>',
            f'<text x="{x - 4:.1f}" y="{bottom + 14}" text-anchor="end" fill="#d62728">bandwidth floor {floor:,.0f}</text>',
        ]
    return parts


def speed_chart_svg(report: dict) -> str:
    """The chart of `report` as an SVG document."""
    quantization = report.get("qlinear") or "fp32"
    if report.get("qembedding"):
        quantization += f" + {report['qembedding']} embeddings"
    title = f"{Path(str(report.get('model', 'model'))).name}: {quantization}, {report.get('cpu_count', '?')} CPU cores"
    parts = [f'<text x="10" y="24" font-size="15" font-weight="bold">{escape(title)}</text>']
    for index, (key, label) in enumerate(METRICS):
        values = [(engine, name, color, report[engine][key]) for engine, name, color in ENGINES if engine in report]
        floor = _floor(report) if key == "decode_tokens_per_s" else None
        parts += _panel(TOP + index * PANEL_HEIGHT * 0.75, label, values, floor)
    height = TOP + len(METRICS) * PANEL_HEIGHT * 0.75 + 20
    body = "\n  ".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
        f'font-family="sans-serif" font-size="13">\n  <rect width="100%" height="100%" fill="white"/>\n  {body}\n</svg>\n'
    )


def write_chart(report: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(speed_chart_svg(report))
    return path


def main():
    parser = argparse.ArgumentParser(description="Draw a bench_causal_lm.py JSON report as an SVG bar chart.")
    parser.add_argument("report", help="the JSON report")
    parser.add_argument("-o", "--output", default="docs/images/speed.svg")
    args = parser.parse_args()
    print(f"Chart written to {write_chart(json.loads(Path(args.report).read_text()), args.output)}")


if __name__ == "__main__":
    main()
