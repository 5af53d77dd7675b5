"""The bench report three ways: a console table per suite, JSON, and one self-contained HTML
page (plotly.js inline, so it opens offline) with a chart per measured quantity."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Callable

CHARTS_ATTR = "data-charts"


# ---------------------------------------------------------------------- console
def _cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    try:
        return format(value, spec) if spec != "s" else str(value)
    except (TypeError, ValueError):
        return str(value)


def table(columns: list[list[str]], rows: list[dict[str, Any]]) -> str:
    heads = [c[1] for c in columns]
    body = [[_cell(r.get(key), spec) for key, _, spec in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(heads)]
    fmt = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(heads), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)])


def console(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"machine: {m['cpu']} ({m['cpu_cores']} cores), GPU: {m['gpu'] or 'none'}; "
             f"torch {m['torch']}, triton {m['triton']}"]
    for sec in report["suites"].values():
        lines.append("")
        lines.append(f"== {sec['suite']}: {sec.get('title', '')}")
        if sec["status"] != "ok":
            lines.append(f"   {sec['status'].upper()}: {sec.get('reason', '')}")
            continue
        settings = sec.get("settings", {})
        facts = [f"{k}={settings[k]}" for k in ("model", "dtype", "gen_length", "block_length",
                                                "batch") if k in settings]
        if facts:
            lines.append("   " + ", ".join(facts))
        lines.append(table(sec["columns"], sec["rows"]))
        for extra in sec.get("tables", ()):          # further tables a suite measured
            lines.append(f"   -- {extra['title']}")
            lines.append(table(extra["columns"], extra["rows"]))
        lines.extend(f"   note: {n}" for n in sec.get("notes", []) if n)
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------- charts
def _decode_chart(sec: dict[str, Any]) -> list[Any]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for cache in ("none", "prefix", "dual"):
        rows = [r for r in sec["rows"] if r.get("params", {}).get("cache") == cache]
        if rows:
            fig.add_trace(go.Scatter(
                x=[r["tokens_per_s"] for r in rows], y=[r["accuracy"] for r in rows],
                hovertext=[r["config"] for r in rows], mode="markers", name=f"cache {cache}",
                marker={"size": 11}))
    fig.update_layout(title="decode: tokens/s vs accuracy per configuration",
                      xaxis={"title": "tokens/s (to EOS)", "type": "log"},
                      yaxis={"title": "accuracy (checkable tasks)", "range": [-0.05, 1.05]})
    return [fig, _latency_chart(sec, "config", "decode: request latency distribution")]


def _latency_chart(sec: dict[str, Any], label_key: str, title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in sec["rows"]:
        if r.get("latencies_s"):
            name = " ".join(str(r.get(k)) for k in (label_key, "length") if r.get(k))
            fig.add_trace(go.Box(y=r["latencies_s"], name=name, boxpoints="all"))
    fig.update_layout(title=title, yaxis={"title": "seconds", "type": "log"}, showlegend=False)
    return fig


def _ar_chart(sec: dict[str, Any]) -> list[Any]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for system in dict.fromkeys(r["system"] for r in sec["rows"]):
        rows = [r for r in sec["rows"] if r["system"] == system]
        fig.add_trace(go.Bar(x=[f"batch {r['batch']}" for r in rows],
                             y=[r["tokens_per_s"] for r in rows], name=system,
                             text=[f"acc {r['accuracy']:.2f}" for r in rows]))
    fig.update_layout(title="ar: tokens/s, Celeris vs the AR twin", barmode="group",
                      yaxis={"title": "tokens/s (to EOS)"})
    return [fig]


def _lengths_chart(sec: dict[str, Any]) -> list[Any]:
    return [_latency_chart(sec, "system", "lengths: latency over repeats")]


def _serve_chart(sec: dict[str, Any]) -> list[Any]:
    import plotly.graph_objects as go

    rows = sec["rows"]
    x = [r["concurrency"] for r in rows]
    fig = go.Figure([go.Scatter(x=x, y=[r.get("tokens_per_s") for r in rows],
                                name="tokens/s", mode="lines+markers"),
                     go.Scatter(x=x, y=[r.get("e2e_p50_s") for r in rows],
                                name="end-to-end p50 (s)", mode="lines+markers", yaxis="y2")])
    fig.update_layout(title="serve: throughput vs concurrency",
                      xaxis={"title": "concurrent clients", "type": "log"},
                      yaxis={"title": "tokens/s"},
                      yaxis2={"title": "seconds", "overlaying": "y", "side": "right"})
    return [fig]


def _gpu_chart(sec: dict[str, Any]) -> list[Any]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for cache in dict.fromkeys(r["cache"] for r in sec["rows"]):
        for batch in dict.fromkeys(r["batch"] for r in sec["rows"]):
            rows = [r for r in sec["rows"] if r["cache"] == cache and r["batch"] == batch]
            if rows:
                fig.add_trace(go.Scatter(x=[r["tokens_per_forward"] for r in rows],
                                         y=[r["tokens_per_s"] for r in rows],
                                         name=f"{cache}, batch {batch}", mode="lines+markers"))
    fig.update_layout(title="gpu: tokens/s vs tokens per forward",
                      xaxis={"title": "tokens per forward"},
                      yaxis={"title": "tokens/s", "type": "log"})
    return [fig]


CHARTS: dict[str, Callable[[dict[str, Any]], list[Any]]] = {
    "decode": _decode_chart, "ar": _ar_chart, "lengths": _lengths_chart,
    "serve": _serve_chart, "gpu": _gpu_chart}


# ---------------------------------------------------------------------- HTML
def _html_table(columns: list[list[str]], rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(c[1])}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(k), s))}</td>"
                                    for k, _, s in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section_html(sec: dict[str, Any], chart_divs: list[str]) -> str:
    parts = [f"<h2>{html.escape(sec['suite'])}: {html.escape(sec.get('title', ''))}</h2>"]
    if sec["status"] != "ok":
        parts.append(f"<p class='skip'>{html.escape(sec['status'])}: "
                     f"{html.escape(str(sec.get('reason', '')))}</p>")
        return "\n".join(parts)
    parts.append(_html_table(sec["columns"], sec["rows"]))
    parts.extend(f"<p class='note'>{html.escape(n)}</p>" for n in sec.get("notes", []) if n)
    settings = json.dumps(sec.get("settings", {}), indent=1, default=str)
    parts.append(f"<details><summary>settings</summary><pre>{html.escape(settings)}</pre>"
                 "</details>")
    parts.extend(chart_divs)
    return "\n".join(parts)


STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
         "padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
         ".note{color:#555;font-size:13px}.skip{color:#a00}")


def write_html(report: dict[str, Any], path: str | Path) -> int:
    """Write the report page; returns the number of charts in it."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    sections, n_charts = [], 0
    for name, sec in report["suites"].items():
        figs = CHARTS[name](sec) if sec["status"] == "ok" and name in CHARTS and sec["rows"] \
            else []
        divs = [pio.to_html(f, full_html=False, include_plotlyjs=False,
                            div_id=f"chart-{name}-{i}") for i, f in enumerate(figs)]
        n_charts += len(divs)
        sections.append(_section_html(sec, divs))
    machine = html.escape(json.dumps(report["machine"], indent=1))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Celeris bench</title>"
            f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head>"
            f"<body {CHARTS_ATTR}='{n_charts}'><h1>Celeris benchmark report</h1>"
            f"<p>{html.escape(report['created'])} &middot; <code>"
            f"{html.escape(report['command'])}</code></p>"
            f"<details open><summary>machine</summary><pre>{machine}</pre></details>"
            + "\n".join(sections) + "</body></html>")
    Path(path).write_text(page, encoding="utf-8")
    return n_charts
