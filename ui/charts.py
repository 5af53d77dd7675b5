"""Per-run plotly charts (built once after a run; plotly figures are resent whole on every
update, so they are never used for the 5 Hz gauges)."""

from __future__ import annotations

import plotly.graph_objects as go

from .trajectory import Trajectory

_LAYOUT = dict(margin=dict(l=50, r=20, t=40, b=40), height=300, template="plotly_white",
               font=dict(size=12))


def commits_per_step(traj: Trajectory) -> go.Figure:
    """Bar chart: how many positions each step committed (the unmask schedule in action);
    with token editing, the tokens a step replaced stacked on the masks it filled."""
    steps = [r.step for r in traj.steps]
    edits = [len(r.edited) for r in traj.steps]
    fig = go.Figure(go.Bar(x=steps, y=[len(r.committed) - e for r, e in zip(traj.steps, edits)],
                           marker_color="#6366f1", name="committed"))
    if any(edits):
        fig.add_trace(go.Bar(x=steps, y=edits, marker_color="#e11d48", name="edited"))
        fig.update_layout(barmode="stack")
    fig.update_layout(title="Tokens committed per step", xaxis_title="step",
                      yaxis_title="tokens", **_LAYOUT)
    return fig


def confidence_chart(traj: Trajectory) -> go.Figure:
    """Every commit's confidence (dots) and the per-step mean (line)."""
    xs, ys, means = [], [], []
    for r in traj.steps:
        xs += [r.step] * len(r.confidences)
        ys += r.confidences
        if r.confidences:
            means.append((r.step, sum(r.confidences) / len(r.confidences)))
    fig = go.Figure([
        go.Scatter(x=xs, y=ys, mode="markers", name="commit", opacity=0.5,
                   marker=dict(size=5, color="#f59e0b")),
        go.Scatter(x=[m[0] for m in means], y=[m[1] for m in means], mode="lines",
                   name="mean", line=dict(color="#1e293b", width=2)),
    ])
    fig.update_layout(title="Confidence of committed tokens", xaxis_title="step",
                      yaxis_title="confidence", **_LAYOUT)
    return fig


def unmask_heatmap(traj: Trajectory) -> go.Figure:
    """Position x step: a cell is filled where that position was committed at that step,
    coloured by its confidence; dashed lines mark block boundaries."""
    steps = [r.step for r in traj.steps]
    row = {s: i for i, s in enumerate(steps)}
    z: list[list[float | None]] = [[None] * traj.gen_length for _ in steps]
    for r in traj.steps:
        for pos, conf in zip(r.committed, r.confidences):
            z[row[r.step]][pos] = conf
    fig = go.Figure(go.Heatmap(z=z, x=list(range(traj.gen_length)), y=steps,
                               colorscale="Viridis", colorbar=dict(title="conf"),
                               hovertemplate="position %{x}<br>step %{y}<br>"
                                             "confidence %{z:.3f}<extra></extra>"))
    for edge in range(1, traj.gen_length):
        if traj.starts_block(edge):
            fig.add_vline(x=edge - 0.5, line_dash="dash", line_color="#94a3b8")
    layout = dict(_LAYOUT, height=360)
    fig.update_layout(title="Unmask order (position x step)", xaxis_title="position",
                      yaxis_title="step", **layout)
    fig.update_yaxes(autorange="reversed")
    return fig
