"""The dashboard at ``/``: per model, a batch × length grid coloured by status, misses, progress and failures.

Server-rendered HTML from the registry view; a few lines of script re-fetch the panels
fragment (``/dashboard/panels``, rendered by the same code) every couple of seconds,
so there is one renderer and no front-end build.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from html import escape

from warmcache.errors import first_line
from warmcache.registry import ShapeRecord
from warmcache.registry.statuses import DONE_STATUSES, PLAN_STATUSES, Status
from warmcache.registry.usability import effective_status
from warmcache.service.reader_text import reader_error
from warmcache.service.view import RegistryState

#: When several rows share a cell (families, toolchains), the cell shows the most useful status.
_CELL_PRIORITY = (Status.VERIFIED, Status.COMPILED, Status.COMPILING, Status.PENDING, Status.FAILED, Status.STALE)
COLOURS = {
    Status.VERIFIED: "#1b7f3b",
    Status.COMPILED: "#4caf50",
    Status.COMPILING: "#2196f3",
    Status.PENDING: "#bdbdbd",
    Status.FAILED: "#e53935",
    Status.STALE: "#ff9800",
    Status.MISSING: "#ffffff",
}
REFRESH_MS = 2000


@dataclass(slots=True)
class Grid:
    """One model's workload: cell statuses by ``(batch, length)`` and requests padded onto each cell."""

    model: str
    workload: str
    cells: dict[tuple[int, int], Status] = field(default_factory=dict)
    padded: Counter[tuple[int, int]] = field(default_factory=Counter)
    refused: Counter[tuple[int, int]] = field(default_factory=Counter)

    @property
    def batches(self) -> list[int]:
        return sorted({b for b, _ in self.cells})

    @property
    def lengths(self) -> list[int]:
        return sorted({s for _, s in self.cells})


@dataclass(slots=True)
class Panel:
    model: str
    grids: list[Grid]
    counts: Counter[str]
    failures: list[ShapeRecord]

    @property
    def done(self) -> int:
        return sum(self.counts[s] for s in DONE_STATUSES)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def panels(state: RegistryState) -> list[Panel]:
    """What the dashboard shows, per model, from one registry state."""
    grids: dict[tuple[str, str], Grid] = {}
    out: dict[str, Panel] = {}
    for record in state.records:
        status = Status(effective_status(record))
        grid = grids.setdefault((record.model_name, record.workload), Grid(record.model_name, record.workload))
        cell = (record.batch_size, record.seq_len)
        current = grid.cells.get(cell)
        if current is None or _CELL_PRIORITY.index(status) < _CELL_PRIORITY.index(current):
            grid.cells[cell] = status
        panel = out.setdefault(record.model_name, Panel(record.model_name, [], Counter(), []))
        panel.counts[status] += 1
        if status == Status.FAILED:
            panel.failures.append(record)
    for miss in state.misses:
        missed = grids.get((miss["model"], miss["workload"]))
        if missed is None:
            continue
        if miss["padded_batch"] is not None and miss["padded_seq"] is not None:
            missed.padded[(miss["padded_batch"], miss["padded_seq"])] += miss["count"]
        else:
            missed.refused[(miss["batch_size"], miss["seq_len"])] += miss["count"]
    for (model, _), grid in sorted(grids.items()):
        out[model].grids.append(grid)
    return [out[model] for model in sorted(out)]


def render_panels(state: RegistryState) -> str:
    """The HTML fragment the page shows and its script re-fetches."""
    stamp = state.loaded_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    parts = [f'<p class="stamp">registry read at <span id="loaded-at">{stamp}</span></p>']
    shown = panels(state)
    if not shown:
        parts.append("<p>The registry has no shapes yet: run <code>warmcache warmup MANIFEST</code>.</p>")
    parts.extend(_panel(p) for p in shown)
    return "\n".join(parts)


def _panel(panel: Panel) -> str:
    percent = 100 * panel.done / panel.total if panel.total else 0.0
    counts = ", ".join(f"{panel.counts[s]} {s}" for s in PLAN_STATUSES if panel.counts[s])
    html = [
        f'<section class="model" data-model="{escape(panel.model)}">',
        f"<h2>{escape(panel.model)}</h2>",
        f'<div class="progress" title="{panel.done} of {panel.total} usable"><div '
        f'style="width:{percent:.1f}%"></div></div>',
        f'<p class="counts">{panel.done} of {panel.total} shapes usable ({percent:.0f}%): {escape(counts)}</p>',
    ]
    html.extend(_grid(g) for g in panel.grids)
    if panel.failures:
        html.append("<h3>failures</h3>")
        headers = "".join(f"<th>{name}</th>" for name in ("workload", "batch", "length", "attempts", "error"))
        html.append(f'<table class="failures"><tr>{headers}</tr>')
        for r in panel.failures:
            error = escape(first_line(reader_error(r.error, r.model_path, r.cache_root)) or "(no error text recorded)")
            html.append(
                f"<tr><td>{escape(r.workload)}</td><td>{r.batch_size}</td><td>{r.seq_len}</td><td>{r.attempts}</td><td>{error}</td></tr>"
            )
        html.append("</table>")
    html.append("</section>")
    return "\n".join(html)


def _grid(grid: Grid) -> str:
    html = [
        f'<table class="grid" data-workload="{escape(grid.workload)}">',
        f"<caption>{escape(grid.workload)}: batch × length</caption>",
        "<tr><th>batch \\ length</th>" + "".join(f"<th>{s}</th>" for s in grid.lengths) + "</tr>",
    ]
    for b in grid.batches:
        row = [f"<tr><th>{b}</th>"]
        for s in grid.lengths:
            status = grid.cells.get((b, s), Status.MISSING)
            padded = grid.padded[(b, s)]
            label = f"{status}" + (f"<br><b>{padded} padded</b>" if padded else "")
            row.append(
                f'<td class="cell" style="background:{COLOURS[status]}" data-batch="{b}" data-seq="{s}" '
                f'data-status="{status}" data-padded="{padded}" title="batch={b} length={s}: {status}">{label}</td>'
            )
        html.append("".join(row) + "</tr>")
    html.append("</table>")
    if grid.refused:
        refused = ", ".join(f"{b}×{s}: {n}" for (b, s), n in sorted(grid.refused.items()))
        html.append(
            f'<p class="refused" data-workload="{escape(grid.workload)}">refused (no bucket fits): {refused}</p>'
        )
    return "\n".join(html)


def render_down(message: str) -> str:
    """What the panels show while the registry cannot be read."""
    return f'<p class="down">{escape(message)}</p>'


def render_page(body: str) -> str:
    """The whole page around ``body`` (:func:`render_panels` or :func:`render_down`)."""
    legend = "".join(f'<span style="background:{c}">{s}</span>' for s, c in COLOURS.items())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>warmcache</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: .5em 0 1em; }}
th, td {{ border: 1px solid #999; padding: 4px 8px; text-align: center; }}
td.cell {{ min-width: 5em; font-size: 12px; }}
caption {{ text-align: left; font-weight: bold; }}
.progress {{ width: 20em; height: .8em; background: #eee; border: 1px solid #999; }}
.progress div {{ height: 100%; background: #4caf50; }}
.legend span {{ padding: 2px 6px; margin-right: 4px; border: 1px solid #999; }}
.failures td {{ text-align: left; }} .down {{ color: #b00; font-weight: bold; }} .stamp {{ color: #666; }}
</style></head>
<body><h1>warmcache</h1>
<p class="legend">{legend}</p>
<div id="panels">{body}</div>
<script>
async function refreshPanels() {{
  try {{
    const response = await fetch("/dashboard/panels", {{cache: "no-store"}});
    const text = await response.text();
    const panels = document.getElementById("panels");
    if (response.ok) {{ panels.innerHTML = text; return; }}
    const down = document.createElement("p");
    down.className = "down";
    down.textContent = text;
    panels.replaceChildren(down);
  }} catch (e) {{ /* the server is restarting: keep the last view */ }}
}}
setInterval(refreshPanels, {REFRESH_MS});
</script></body></html>
"""
