"""A roofline figure as one self-contained HTML file: the dashboard's own drawing script and style inlined with
the figure's data, so a benchmark leaves the picture the live page showed (no server, no network needed)."""

import html
import json
from pathlib import Path

from ridgeline.dashboard.assets import asset
from ridgeline.napkin.plot import render_roofline_png


def render_roofline_html(figure: dict, path: str | Path) -> Path:
    script, style = asset("roofline.js"), asset("dashboard.css")
    data = json.dumps(figure).replace("</", "<\\/")  # no "</script>" can end the script early
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(figure["title"])}</title>
<style>{style}</style></head>
<body><div class="worker"><div class="chart" id="chart"></div></div>
<script>{script}</script>
<script>window.chart = new RooflineChart(document.getElementById("chart"), {data}, {{maxPoints: 100000}});</script>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path


def render_roofline(figure: dict, path: str | Path) -> Path:
    """PNG (matplotlib) or HTML (the dashboard's script), by the file's suffix."""
    if Path(path).suffix.lower() in (".html", ".htm"):
        return render_roofline_html(figure, path)
    return render_roofline_png(figure, path)
