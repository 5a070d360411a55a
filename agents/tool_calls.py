"""OpenAI tool calling for a local chat model: tool messages in, tool calls out.

An agent framework that calls tools (ldp's ``SimpleAgent``, anything on litellm or the OpenAI SDK)
sends the assistant's earlier calls as ``tool_calls`` (content often null) and each result as a
``tool`` message. A chat template may render both, only some, or refuse them; ``TemplateSupport``
finds out once per tokenizer by rendering marked probes, and ``template_messages`` writes what the
template cannot render as text it can: a call as a ``<tool_call>`` block in the assistant's turn,
a result as a user turn that says it is one. ``parse_tool_calls`` reads the model's reply back into
OpenAI's shape when it is one or more ``<tool_call>`` blocks (the format of Hermes, Qwen and
SmolLM2) or a bare JSON call, naming a tool the request offered.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of OpenAI tool calling."""

    tool_calls: bool  # an assistant turn's tool_calls
    tool_role: bool  # a ``tool`` message


def _renders(tokenizer: Any, messages: list[Message], marker: str) -> bool:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses the probe (raise_exception, a type error) does not support it
        return False
    return isinstance(text, str) and marker in text


def template_support(tokenizer: Any) -> TemplateSupport:
    """Render marked probes: a feature is supported when its marker shows up in the text.

    A template that ignores a key renders without it (no marker), and one that refuses a role
    raises; both count as unsupported, and ``template_messages`` writes that part as text."""
    name, result = "treegym_probe_fn", "treegym-probe-result"
    call = {"id": "call_probe", "type": "function", "function": {"name": name, "arguments": {"x": 1}}}
    user = {"role": "user", "content": "q"}
    calls = _renders(tokenizer, [user, {"role": "assistant", "content": "", "tool_calls": [call]}], name)
    assistant = {"role": "assistant", "content": "a", **({"tool_calls": [call]} if calls else {})}
    tool = {"role": "tool", "tool_call_id": "call_probe", "name": name, "content": result}
    return TemplateSupport(tool_calls=calls, tool_role=_renders(tokenizer, [user, assistant, tool], result))


def call_text(name: str, arguments: Any) -> str:
    """One call as a ``<tool_call>`` block: how a model that does not know OpenAI's fields sees it."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _arguments(raw: Any) -> Any:
    """OpenAI sends arguments as a JSON string; chat templates expect the object."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _call_names(messages: Sequence[Message]) -> dict[str, str]:
    return {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or () if c.get("id")}


def template_messages(messages: Sequence[Message], support: TemplateSupport) -> list[Message]:
    """``messages`` (validated OpenAI ones) as the template can render them.

    Calls go in the template's own ``tool_calls`` field when it renders them, else as
    ``<tool_call>`` text after the assistant's content. Results go as ``tool`` messages when the
    template renders that role, else as a user turn labelled with the tool's name (adjacent
    results merge into one turn, so that user and assistant still alternate)."""
    names = _call_names(messages)
    out: list[Message] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                     for c in m["tool_calls"]]
            if support.tool_calls:
                out.append({"role": "assistant", "content": content, "tool_calls": calls})
            else:
                text = "".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls)
                out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            name = m.get("name") or names.get(m["tool_call_id"], "tool")
            if support.tool_role:
                out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "name": name, "content": content})
                continue
            label = f"[Result of tool call {name} ({m['tool_call_id']})]\n{content}"
            if out and out[-1].get("tool_result"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n\n" + label}
            else:
                out.append({"role": "user", "content": label, "tool_result": True})
        else:
            out.append({"role": role, "content": content})
    return [{k: v for k, v in m.items() if k != "tool_result"} for m in out]


def _json_calls(text: str) -> list[dict[str, Any]] | None:
    """The calls in one JSON text: an object or a list of objects with a name and arguments."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = _arguments(item.get("arguments", item.get("parameters", {})))
        if not isinstance(args, dict):
            return None
        calls.append({"name": item["name"], "arguments": args})
    return calls or None


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of a model's reply; ``(text, [])`` when it is not a call.

    A reply is a call when every ``<tool_call>`` block in it (the last may be cut before its
    closing tag) holds JSON calls, or when the whole reply is one; each call must name one of
    ``tool_names``. The content is what is left outside the blocks, or None, as OpenAI sends it."""
    blocks = TOOL_CALL_BLOCK.findall(text)
    if blocks:
        found = [_json_calls(b.strip()) for b in blocks]
        content = TOOL_CALL_BLOCK.sub("", text).strip()
    else:
        found, content = [_json_calls(text.strip())], ""
    if any(calls is None for calls in found):
        return text, []
    calls = [c for group in found for c in group]  # type: ignore[union-attr]
    if not calls or any(c["name"] not in tool_names for c in calls):
        return text, []
    return content or None, [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
        for c in calls
    ]
