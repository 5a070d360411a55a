"""A self-contained HTML view of rollout trees: every turn, its reward, and where branches split.

One file, no scripts or external assets: nested ``<details>`` elements, one per node, open by
default. A node with several children is marked as a split point; leaves show their reward,
and whether the sampler kept them.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treegym.agents.rollout.types import Node, Tree

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} h2{font-size:1.1em;margin-top:2em}
details{margin-left:1.2em;border-left:2px solid #ccd;padding-left:.6em;margin-top:.3em}
summary{cursor:pointer}
.split>summary{font-weight:bold}
.badge{display:inline-block;padding:0 .4em;border-radius:.3em;font-size:.8em;margin-left:.4em}
.split-badge{background:#fde68a}.leaf{background:#e5e7eb}.kept{background:#bbf7d0}
.good{background:#86efac}.bad{background:#fecaca}.invalid{background:#fca5a5}
pre{white-space:pre-wrap;margin:.2em 0;padding:.3em;font-size:.85em}
.action{background:#eef6ff}.obs{background:#f6f6f6;color:#555}
.prompt{background:#fffbe6}
"""


def tree_html(trees: Sequence[Tree], tokenizer: Any = None, title: str = "rollout trees") -> str:
    """The HTML page for ``trees`` (``tokenizer`` only adds token counts, it may be None)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    for tree in trees:
        leaves = tree.leaves()
        rewards = [tree.nodes[i].reward or 0.0 for i in leaves]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        parts.append(
            f"<h2>prompt {tree.prompt_index}, tree {tree.tree_index}: {len(tree.nodes) - 1} turns, "
            f"{len(leaves)} leaves ({len(tree.kept_leaves)} kept), mean leaf reward {mean:.3f}"
            + (f", expanded nodes {tree.expanded}" if tree.expanded else "") + "</h2>"
        )
        parts.append(f"<pre class='prompt'>{html.escape(tree.prompt_text)}</pre>")
        parts.append(f"<div class='meta'>{len(tree.prompt_ids)} prompt tokens</div>")
        for child in tree.nodes[0].children:
            parts.append(_node_html(tree, tree.nodes[child]))
    parts.append("</body></html>")
    return "\n".join(parts)


def _node_html(tree: Tree, node: Node) -> str:
    turn = node.turn
    assert turn is not None
    badges = [f"turn {node.depth}", f"node {node.node_id}"]
    if node.round:
        badges.append(f"round {node.round}")
    classes = []
    extra = ""
    if len(node.children) > 1:
        classes.append("split")
        extra += f"<span class='badge split-badge'>splits into {len(node.children)}</span>"
    if turn.invalid:
        extra += "<span class='badge invalid'>invalid</span>"
    if turn.finish_reason == "length":
        extra += "<span class='badge invalid'>cut at max tokens</span>"
    if node.terminal:
        kind = "good" if (node.reward or 0.0) > 0 else "bad"
        extra += f"<span class='badge {kind}'>reward {node.reward or 0.0:.3f}</span>"
        extra += "<span class='badge kept'>kept</span>" if node.node_id in tree.kept_leaves else "<span class='badge leaf'>leaf</span>"
    head = " · ".join(badges) + f" · {len(turn.action_ids)} tokens, {turn.tool_calls} tool calls"
    body = [f"<pre class='action'>{html.escape(turn.action_text)}</pre>"]
    if turn.obs_text:
        body.append(f"<pre class='obs'>{html.escape(turn.obs_text)}</pre>")
    body += [_node_html(tree, tree.nodes[c]) for c in node.children]
    cls = f" class='{' '.join(classes)}'" if classes else ""
    return f"<details open{cls}><summary>{head}{extra}</summary>{''.join(body)}</details>"


def write_tree_html(path: str | Path, trees: Sequence[Tree], tokenizer: Any = None, title: str = "rollout trees") -> Path:
    """Write ``tree_html(...)`` to ``path`` (atomically) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(tree_html(trees, tokenizer, title), encoding="utf-8")
    tmp.replace(path)
    return path
