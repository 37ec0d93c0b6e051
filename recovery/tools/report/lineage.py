"""The lineage as a graph: the audit's links as nodes and edges, as Graphviz or a picture.

:func:`graph` merges one or more :class:`~recovery.tools.audit.Report` walks (a run's
newest checkpoint, each abandoned branch's, its best, its exports) into one graph,
nodes keyed by digest, so a checkpoint two walks reach is one node. Edges point from
the older artifact to the newer one and carry the relation the audit found (previous,
resume, warm_start; start for a run's fresh start) and the drift on it; an edge into a
link that failed verification is marked failed (red, in both renderings). Every node
keeps its :class:`~recovery.tools.audit.Link`: signer and trust, code revision, dataset
version, world size, branch, import. :func:`dot` writes the graph for Graphviz (``recovery
audit --format dot``); :func:`picture` draws it with matplotlib for the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery.tools import audit

START = "start"
COLOURS = {
    audit.OK: ("#1b7f3b", "#e8f5e9"),
    audit.PRUNED: ("#9e9e9e", "#f5f5f5"),
    audit.FAILED: ("#c62828", "#fde4e4"),
    START: ("#37474f", "#eceff1"),
}
"""Status -> (line, fill) of a node, in both renderings."""


@dataclass
class Node:
    """One artifact (or a run's fresh start) in the graph."""

    key: str
    link: audit.Link | None
    """``None`` for a run's start."""
    lane: str
    """The row it is drawn in: its run, its abandoned branch, or ``exports``."""
    title: str


@dataclass
class Edge:
    older: str
    newer: str
    relation: str
    drift: list[str] = field(default_factory=list)
    failed: bool = False
    detail: str = ""
    """Resharding on a resume (``2->1 ranks``)."""
    via: bool = False
    """The newer end could not be followed (deleted by retention, or failed): the walk
    jumped to the start of its run segment, past checkpoints it could not read."""


@dataclass
class Graph:
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)

    @property
    def failed(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.link and n.link.status == audit.FAILED]


def _key(link: audit.Link) -> str:
    return link.sha256 or f"path:{link.path}"


def _lane(link: audit.Link) -> str:
    if link.purpose == "inference":
        return "exports"
    run = f"run {str(link.run_id)[:8]}" if link.run_id else "no run"
    if link.abandoned:
        return f"{run}, abandoned branch {link.abandoned['branch']}"
    return "imported weights" if link.imported else run


def _add(g: Graph, link: audit.Link) -> str:
    key = _key(link)
    known = g.nodes.get(key)
    # a node found on disk by one walk beats the same digest only recorded (pruned) by another
    if known is None or (known.link and known.link.status != audit.OK == link.status):
        g.nodes[key] = Node(key, link, _lane(link), link.name)
    return key


def graph(reports: Sequence[audit.Report]) -> Graph:
    """The merged graph of the walks in ``reports`` (first: the main one)."""
    g = Graph()
    seen: set[tuple[str, str, str]] = set()

    def edge(e: Edge) -> None:
        if (e.older, e.newer, e.relation) not in seen and e.older != e.newer:
            seen.add((e.older, e.newer, e.relation))
            g.edges.append(e)

    for report in reports:
        keys = [_add(g, link) for link in report.links]
        for i in range(1, len(keys)):
            older = report.links[i]
            resharded = older.resharded or {}
            detail = f"{resharded.get('from')}->{resharded.get('to')} ranks" if resharded else ""
            newer = report.links[i - 1]
            failed = audit.FAILED in (older.status, newer.status)
            via = newer.status != audit.OK
            drift = list(older.drift)
            edge(Edge(keys[i], keys[i - 1], older.relation, drift, failed, detail, via))
        first = report.lineage[0] if report.lineage else None
        if first and first.get("kind") == START and report.links:
            run = str(first.get("run_id"))
            key = f"start:{run}"
            if key not in g.nodes:
                g.nodes[key] = Node(key, None, f"run {run[:8]}", f"start of run {run[:8]}")
            edge(Edge(key, keys[-1], START))
    return g


def describe(node: Node) -> list[str]:
    """A node's lines: name, step and purpose, status, signer, code, dataset, where."""
    link = node.link
    if link is None:
        return [node.title, "fresh start"]
    lines = [link.name, f"step {link.step} {link.purpose or ''}".rstrip(), link.status]
    if link.status == audit.OK:
        signer = link.signer or {}
        trust = "trusted" if signer.get("trusted") else "UNTRUSTED"
        dev = ", dev key" if signer.get("dev") else ""
        lines.append(f"signer {str(signer.get('key_id'))[:12]} ({trust}{dev})")
        if link.imported:
            lines.append(f"imported from {link.imported.get('kind')}, origin unverified")
        else:
            code = link.code or {}
            commit = str(code.get("commit"))[:10] if code.get("commit") else "not-git"
            lines.append(f"code {commit}{' dirty' if code.get('dirty') else ''}")
            lines.append(f"data {_short(str(link.dataset), 24)}")
        if link.world_size and link.world_size > 1:
            lines.append(f"world {link.world_size} ranks")
    elif link.status == audit.PRUNED:
        lines.append("deleted by retention")
    else:
        lines.append(_short(str(link.error), 60))
    return lines


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _dot_text(text: str) -> str:
    """A string for a double-quoted DOT attribute: quotes, backslashes, newlines escaped."""
    clean = "".join(c if c.isprintable() else " " for c in text)
    return clean.replace("\\", "\\\\").replace('"', '\\"')


def edge_label(e: Edge) -> str:
    """``resume``, ``resume (drift: config; 2->1 ranks)``."""
    extra = [f"drift: {', '.join(e.drift)}"] if e.drift else []
    extra += [e.detail] if e.detail else []
    extra += ["via deleted checkpoints"] if e.via and e.relation != START else []
    return f"{e.relation} ({'; '.join(extra)})" if extra else e.relation


def dot(g: Graph, title: str) -> str:
    """The graph as Graphviz DOT: one cluster per lane, edges older -> newer, failed red.

    Every name is escaped for DOT's quoted strings and nodes are named ``n0``, ``n1``, ...,
    so no name from disk can break out of its label.
    """
    ids = {key: f"n{i}" for i, key in enumerate(g.nodes)}
    out = [
        "digraph lineage {",
        f'  label="{_dot_text(title)}"; labelloc=t; rankdir=LR;',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    lanes: dict[str, list[Node]] = {}
    for node in g.nodes.values():
        lanes.setdefault(node.lane, []).append(node)
    for i, (lane, nodes) in enumerate(lanes.items()):
        out.append(f'  subgraph cluster_{i} {{ label="{_dot_text(lane)}"; style=dashed;')
        for node in nodes:
            status = node.link.status if node.link else START
            line, fill = COLOURS.get(status, COLOURS[audit.FAILED])
            shape = ", shape=ellipse" if node.link is None else ""
            style = ', style="rounded,filled,dashed"' if status == audit.PRUNED else ""
            label = "\\n".join(_dot_text(line) for line in describe(node))
            out.append(
                f'    {ids[node.key]} [label="{label}", color="{line}", '
                f'fillcolor="{fill}"{shape}{style}];'
            )
        out.append("  }")
    for e in g.edges:
        red = ', color="#c62828", fontcolor="#c62828", penwidth=2' if e.failed else ""
        red += ", style=dashed" if e.via else ""
        out.append(f'  {ids[e.older]} -> {ids[e.newer]} [label="{_dot_text(edge_label(e))}"{red}];')
    out.append("}")
    return "\n".join(out) + "\n"


def _columns(g: Graph) -> dict[str, int]:
    """Each node's column: the longest chain of edges that leads to it (time goes right)."""
    col = dict.fromkeys(g.nodes, 0)
    for _ in range(len(g.nodes)):  # relaxation: a loop in a crafted lineage cannot hang it
        changed = False
        for e in g.edges:
            if col[e.newer] < col[e.older] + 1:
                col[e.newer], changed = col[e.older] + 1, True
        if not changed:
            break
    return col


_HALF = 0.31
"""Half a node box's width, in columns (a column is 2.6 inches, a box about 1.6)."""


def picture(g: Graph) -> str:
    """The graph drawn with matplotlib as SVG: lanes as rows, edges older -> newer labelled
    with their relation and drift, failed links and nodes red, pruned ones grey and dashed."""
    from recovery.tools.report.charts import style, svg_of

    col = _columns(g)
    lanes = list(dict.fromkeys(n.lane for n in g.nodes.values()))
    row = {lane: i for i, lane in enumerate(lanes)}
    width, height = max(col.values(), default=0) + 1, len(lanes)
    with style("lineage") as plt:
        fig, ax = plt.subplots(figsize=(min(60, 0.6 + 2.6 * width), 0.5 + 1.3 * height))
        where = {k: (col[k], row[n.lane]) for k, n in g.nodes.items()}
        for e in g.edges:
            colour = "#c62828" if e.failed else "#546e7a"
            (x0, y0), (x1, y1) = where[e.older], where[e.newer]
            half = _HALF if x1 > x0 else 0.0  # from box edge to box edge, so heads show
            ax.annotate(
                "",
                xy=(x1 - half, y1),
                xytext=(x0 + half, y0),
                arrowprops={
                    "arrowstyle": "->",
                    "color": colour,
                    "lw": 2 if e.failed else 1,
                    "ls": "--" if e.via else "-",
                    "shrinkA": 2,
                    "shrinkB": 2,
                },
            )
            ax.text(
                (x0 + x1) / 2,
                (y0 + y1) / 2 - 0.2,
                edge_label(e),
                ha="center",
                fontsize=7,
                color=colour,
            )
        for key, node in g.nodes.items():
            _box(ax, where[key], node)
        for lane, y in row.items():  # above its row, not in a margin as wide as the name
            ax.text(-0.5, y - 0.45, lane, fontsize=8, color="#37474f", va="bottom")
        ax.set_xlim(-0.55, width - 0.45)
        ax.set_ylim(height - 0.55, -0.7)
        ax.set_yticks([])
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        return svg_of(plt, fig)


def _box(ax: Any, xy: tuple[int, int], node: Node) -> None:
    status = node.link.status if node.link else START
    edge, face = COLOURS.get(status, COLOURS[audit.FAILED])
    lines = describe(node)  # the picture keeps it short; the table below has every field
    text = "\n".join(lines[:3] + [ln for ln in lines[3:] if ln.startswith(("signer", "world"))])
    style = "--" if status == audit.PRUNED else "-"
    ax.text(
        *xy,
        text,
        ha="center",
        va="center",
        fontsize=7,
        color="#1d2330",
        bbox={
            "boxstyle": "round,pad=0.4",
            "fc": face,
            "ec": edge,
            "ls": style,
            "lw": 2 if status == audit.FAILED else 1,
        },
    )
