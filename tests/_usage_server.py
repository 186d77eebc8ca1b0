"""A local OpenAI-compatible model that counts prompts with its own tokenizer.

:func:`usage_model` is the default reply of a :class:`~_llm_servers.ScriptedServer`: a model
that asks for ``read_chunk(n)`` for n = 1, 2, ... (n read from the newest tool result, as
``_agent_script.scripted_model`` does) and counts every request's prompt the way a local
server with a different tokenizer would: cl100k_base tokens of each message's role, text, tool
calls and tool-call id, its own chat template's 5 tokens per message and 3 for the reply, and
the tool definitions' JSON. It records that count for each request (``truths``) and reports
``report(count)`` as the usage's ``prompt_tokens``: the truth, or something absurd.

:func:`read_chunk` returns ~6 kB of mixed prose, code, JSON and numbers, different for every
n (0-30% of their lines Japanese, Chinese and Korean), so the ratio between the two
tokenizers moves from one prompt to the next.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from _llm_servers import Reply, openai_completion
from ctxkeep.tokens import load_encoding

CHUNK = 6_000
PER_MESSAGE = 5
REPLY = 3
PER_TOOL_CALL = 4

_WORDS = (
    *("the", "context", "window", "holds", "every", "message", "an", "agent", "sends"),
    *("tool", "results", "run", "long", "and", "old", "outputs", "are", "compressed"),
    *("to", "excerpt", "with", "a", "reference", "full", "text"),
)


@dataclass
class UsageModel:
    """The server's model: its replies, its own prompt counts, what it reports."""

    steps: int
    report: Callable[[int], int] = lambda truth: truth
    truths: list[int] = field(default_factory=list)

    def count(self, body: dict[str, Any]) -> int:
        """The prompt's tokens as this server counts them."""
        enc = load_encoding("cl100k_base")

        def n(text: str) -> int:
            return len(enc.encode_ordinary(text))

        total = REPLY
        for m in body.get("messages", []):
            total += PER_MESSAGE + n(m["role"])
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content)
            total += n(content or "")
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                total += PER_TOOL_CALL + n(call["id"]) + n(fn["name"]) + n(fn["arguments"])
            if m.get("tool_call_id"):
                total += n(m["tool_call_id"])
        if body.get("tools"):
            total += n(json.dumps(body["tools"]))
        return total

    def __call__(self, body: Any) -> Reply:
        truth = self.count(body)
        self.truths.append(truth)
        reported = self.report(truth)
        last_n = 0
        for m in reversed(body.get("messages", [])):
            if m.get("role") == "tool":
                found = re.search(r"chunk (\d+)", str(m.get("content")))
                last_n = int(found.group(1)) if found else 0
                break
        if last_n >= self.steps:
            return Reply(
                body=openai_completion(f"read {self.steps} chunks", prompt_tokens=reported)
            )
        call = (f"call_{last_n + 1}", "read_chunk", json.dumps({"n": last_n + 1}))
        return Reply(body=openai_completion(None, tool_calls=[call], prompt_tokens=reported))


_CJK = (
    "コンテキストウィンドウにはエージェントが送るすべてのメッセージが入ります。",
    "工具的输出很长，旧的输出被压缩成摘录，并保留对全文的引用。",
    "서버는 자체 토크나이저로 프롬프트를 셉니다.",
)


def read_chunk(n: int) -> str:
    """Read chunk ``n`` of the file."""
    rng = random.Random(n)
    lines = [f"chunk {n}"]
    size = len(lines[0])
    # A share of CJK lines, 0-30% from one chunk to the next, which the two tokenizers count
    # differently (cl100k_base gives ~1.35 times o200k_base's count; ~1.0 on the rest): the
    # ratio of a prompt moves by a few percent as chunks come and go.
    cjk = rng.uniform(0.0, 0.3)
    while size < CHUNK:
        kind = rng.randrange(4)
        if rng.random() < cjk:
            line = "".join(rng.choice(_CJK) for _ in range(3))
        elif kind == 0:
            line = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(6, 16))) + "."
        elif kind == 1:
            line = f"    def step_{rng.randrange(10**4)}(self, x: int) -> int: return x * {n}"
        elif kind == 2:
            line = json.dumps({"id": rng.randrange(10**9), "ok": rng.random() > 0.5, "n": n})
        else:
            line = " ".join(f"{rng.random():.6f}" for _ in range(6))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)
