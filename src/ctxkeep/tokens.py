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
import binascii
import functools
import gzip
import hashlib
import importlib.util
import json
import logging
import math
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from ctxkeep.config import setting_str
from ctxkeep.errors import (
    ConfigError,
    InvalidTypeError,
    TokenizerError,
    UnknownEncodingError,
    describe,
    install_command,
)
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
            f"reinstall ctxkeep ({install_command()})"
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
    return tiktoken.Encoding(
        name=name,
        pat_str=spec["pat_str"],
        mergeable_ranks=_mergeable_ranks(name),
        special_tokens=dict(spec["special_tokens"]),
    )


@_built_once
def _mergeable_ranks(name: str) -> dict[bytes, int]:
    """The encoding's token bytes and ranks from bpe-openai's ``.tiktoken.gz``.

    The file has one ``<base64 token> <rank>`` line per token, ranks 0, 1, 2... in order (a
    test checks this for both files, and the hash pins them), so the ranks are the positions:
    one ``split`` and a ``dict(zip(...))`` over ``binascii.a2b_base64`` parse o200k_base in
    half the time of a loop over the lines with ``base64.b64decode`` and ``int``
    (``bench/count_startup.py``). Read once per process.
    """
    tokens = _token_lines(name)
    return dict(zip(map(binascii.a2b_base64, tokens), range(len(tokens)), strict=True))


def _token_lines(name: str) -> list[bytes]:
    """The base64 tokens of the encoding's data, in rank order, checked against the published
    SHA-256.

    Raises:
        TokenizerError: the data is missing or does not match its published hash.

    """
    spec = _ENCODINGS[name]
    raw = gzip.decompress(_data_file(name).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != spec["sha256"]:
        raise TokenizerError(
            f"{name} data does not match its published SHA-256 ({digest} != {spec['sha256']})"
        )
    return raw.split()[0::2]


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

    def cached_count(self, message: Message) -> int | None:
        """The count :meth:`count_message` keeps on ``message``, if it has counted it."""
        cache: dict[Any, int] | None = message.__dict__.get("_tokens")
        return None if cache is None else cache.get(self._cache_key)

    def seed_count(self, message: Message, tokens: int) -> None:
        """Give ``message`` the count this counter made of the same message earlier and that
        was kept elsewhere (a fold snapshot), so it is not counted again.
        """
        _message_cache(message)[self._cache_key] = tokens

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
    """Exact counts for an OpenAI encoding (tiktoken, data from the bpe-openai wheel).

    Args:
        encoding: ``o200k_base`` or ``cl100k_base``.
        overhead: the per-message accounting.
        texts: the texts this counter is made to count (a short file in ``ctxkeep count``):
            they are counted with a vocabulary cut to them (:func:`_cut_encoding`: the same
            counts, built in milliseconds where the full encoding takes 0.2-0.3 s), and the
            full encoding is loaded only when another text is counted. ``None``: load it now.

    """

    exact = True

    def __init__(
        self,
        encoding: str = DEFAULT_ENCODING,
        overhead: Overhead | None = None,
        *,
        texts: Iterable[str] | None = None,
    ) -> None:
        if not isinstance(encoding, str):
            raise InvalidTypeError(f"encoding must be a string, got {type(encoding).__name__}")
        self.name = encoding
        self._full: Any = None
        self._cut: Any = None
        self._cut_texts: frozenset[str] = frozenset()
        if texts is None:
            self._full = load_encoding(encoding)
        else:
            self._cut_texts = frozenset(texts)
            self._cut = _cut_encoding(encoding, self._cut_texts)
        super().__init__(overhead)

    @property
    def encoding(self) -> Any:
        """The tiktoken ``Encoding`` (the full one: loaded now if it was not yet)."""
        if self._full is None:
            self._full = load_encoding(self.name)
        return self._full

    def _encoder(self, text: str) -> Any:
        try:
            if self._cut is not None and text in self._cut_texts:
                return self._cut
        except TypeError:  # unhashable: not a string
            raise _not_text(text) from None
        return self.encoding

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text``; special-token strings count as ordinary text."""
        try:
            return len(self._encoder(text).encode_ordinary(text))
        except TypeError:  # tiktoken's own refusal of a non-string
            raise _not_text(text) from None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings as ordinary text)."""
        try:
            return list(self._encoder(text).encode_ordinary(text))
        except TypeError:  # tiktoken's own refusal of a non-string
            raise _not_text(text) from None

    def decode(self, tokens: list[int]) -> str:
        """Text of token ids."""
        return str(self.encoding.decode(tokens))


LONGEST_TOKEN = 128
"""Bytes of the longest token of o200k_base and cl100k_base (a test checks both)."""

SHORT_INPUT = 4096
"""Bytes of text up to which :func:`counter_for` cuts the vocabulary to the input: cutting
looks up every substring of up to :data:`LONGEST_TOKEN` bytes, so past a few kB loading the
full encoding is faster."""


def _utf8(text: str) -> bytes:
    """The bytes tiktoken encodes for ``text`` (a lone surrogate becomes U+FFFD, as tiktoken's
    ``encode_ordinary`` makes it).
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _cut_encoding(name: str, texts: Iterable[str]) -> Any:
    """A tiktoken ``Encoding`` of ``name`` whose vocabulary is cut to ``texts``: the single
    bytes and every token that occurs in one of them.

    It encodes each of ``texts`` exactly as the full encoding does: tiktoken looks up only
    substrings of the piece it encodes (the piece itself, then the pairs its byte-pair merge
    forms), every token has at most :data:`LONGEST_TOKEN` bytes, so each lookup finds in the
    cut vocabulary what it finds in the full one; the split into pieces is the same pattern.
    Building it skips decoding the 200,000 tokens of the data and tiktoken's ``CoreBPE`` build
    over them, most of loading o200k_base (``bench/count_startup.py``); it costs a base64
    spelling of every substring of up to :data:`LONGEST_TOKEN` bytes, hence
    :data:`SHORT_INPUT`.
    """
    import tiktoken

    if name not in _ENCODINGS:
        raise UnknownEncodingError(f"unknown encoding {name!r}; use one of {', '.join(ENCODINGS)}")
    data = b"\n".join(_utf8(t) for t in texts)
    # The tokens that may occur, as the data file spells them (standard base64, a test checks
    # that every token is spelled so): the file's 200,000 tokens are then filtered, not decoded.
    wanted = {binascii.b2a_base64(bytes([b]), newline=False) for b in range(256)}
    for size in range(2, min(LONGEST_TOKEN, len(data)) + 1):
        wanted.update(
            binascii.b2a_base64(data[i : i + size], newline=False)
            for i in range(len(data) - size + 1)
        )
    ranks = {
        binascii.a2b_base64(token): rank
        for rank, token in enumerate(_token_lines(name))
        if token in wanted
    }
    spec = _ENCODINGS[name]
    return tiktoken.Encoding(
        name=name,
        pat_str=spec["pat_str"],
        mergeable_ranks=ranks,
        special_tokens=dict(spec["special_tokens"]),
    )


class _TextRecorder(_CachingCounter):
    """Counts nothing: records the texts a counter would count for messages or a text (what
    it returns for a message is then the tokens that are not text: overheads and images).
    """

    name = "recorder"
    exact = True

    def __init__(self, overhead: Overhead | None = None) -> None:
        self.texts: list[str] = []
        super().__init__(overhead)

    def count_text(self, text: str) -> int:
        self.texts.append(text)
        return 0

    def count_message(self, message: Any) -> int:
        return self._uncached_message(coerce_message(message))


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


PLAUSIBLE_RATIOS = (0.5, 3.0)
"""The ratios of a reported prompt count to its o200k_base count a calibration accepts.

o200k_base is among the most compact tokenizers there are: other vocabularies give about as
many tokens on English and code and more on other scripts (cl100k_base, measured: 0.98-1.02
times o200k_base on the 116 trajectories of ``../shared/data`` over 2,000 tokens, 1.35 on
Japanese and Chinese), and a chat template adds a few tokens per message. Half of o200k_base's
count or three times it is then no tokenizer's count but a server reporting something else (a
constant, a cached part only, a sum over a batch): such a report is ignored, with a warning.
"""

OUTLIER_FACTOR = 1.5
"""Once calibrated (:data:`SETTLED` accepted reports), a report whose ratio is more than this
factor above or below the running ratio is an outlier, ignored with a warning; as many
outliers in a row on the same side recalibrate from them (the server or the content changed)."""

SETTLED = 3
"""Accepted reports before the outlier check applies (before it, a ratio rests on too little)."""

EVIDENCE = 1000
"""Tokens (o200k_base) of believed reports before a calibration is trusted, and the smallest
estimate whose error counts towards the error seen. On a small prompt a chat template's fixed
tokens (a default system line, a BOS) are a large share of the count: measured with a
version of the ``tests/_usage_server.py`` model (one chunk in three mostly CJK), a 91-token
first prompt gave a ratio of 1.01 and the next prompt, 4,500 tokens, was 28% over its estimate
at that ratio."""

UNCALIBRATED_ERROR = 0.15
"""The error a margin covers until a calibration is trusted: the starting ratio is a guess, and
a 15% margin (16% with :data:`MARGIN_CUSHION`) keeps a prompt inside the window for a
tokenizer up to 1/0.85 = 1.18 times it (1.35 times o200k_base from the default 1.15:
cl100k_base on Japanese and Chinese)."""

MARGIN_FLOOR = 0.05
"""The least share of a limit kept free when the count is an estimate.

A calibrated ratio is an average over the prompts seen; the next prompt's mix of prose, code
and JSON moves the true ratio (cl100k_base over o200k_base: 0.98 to 1.02 from one trajectory
to another of ``../shared/data``, a 4% spread) before any error has been observed, and a
chat template's tokens are not proportional to the text."""

MARGIN_CUSHION = 0.01
"""Added to the largest error seen: the next prompt may be a little worse than any seen yet."""

RATIO_STEP = 1.02
"""The grid a :class:`CalibratedCounter` counts on: its counting ratio is the learnt ratio
rounded up to the starting ratio times a power of this step (at most 2% above it, never below
it), so it changes only
when the learnt ratio crosses a grid line, not at every report. Between two changes every
count is the same number (cached per message, and a pruner's cache-stable fold holds), and a
change is announced by :attr:`CalibratedCounter.version`: a fold that kept sums from the old
counts would otherwise overrun its budget as the ratio rises (a 3,000-token budget was
exceeded by 94 tokens after 21 reports rising 1% each)."""

_log = logging.getLogger(__name__)


class CalibratedCounter(_CachingCounter):
    """An estimate for models with no exact offline tokenizer (Claude, local models).

    It starts from a documented estimate, o200k_base tokens times ``ratio`` (1.15: Anthropic's
    tokenizer yields more tokens than OpenAI's on English and code), and learns the ratio from
    the input tokens the provider reports, with :meth:`observe`: the ratio is the reported
    tokens over the o200k_base tokens of the prompts seen, each prompt weighing its size and the
    older ones fading by ``smoothing`` per report, so a 50-token greeting does not outweigh a
    full window. Until the believed reports hold :data:`EVIDENCE` tokens the learnt ratio may
    raise the estimate but not lower it below the starting ratio. A report is believed only
    when it is plausible (see :data:`PLAUSIBLE_RATIOS` and :data:`OUTLIER_FACTOR`); an ignored
    one is logged as a warning on the ``ctxkeep.tokens`` logger.

    Counts are not exact: ``exact`` is False, and gates and budgets on it keep a margin
    (:func:`estimate_margin`) of at least :attr:`max_relative_error`.
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
        self._counting = 0.0
        self._version = 0
        self._start = 1.0  # the grid's anchor: the starting ratio, once it is checked
        self.ratio = ratio
        self._start = self._ratio
        self._counting, self._version = 0.0, 0
        self.ratio = ratio
        self.smoothing = smoothing
        self.observations = 0
        """Reports believed."""
        self.ignored = 0
        """Reports ignored as implausible or outliers."""
        self.observed_error = 0.0
        """The largest underestimate seen once the calibration was trusted, relative to the
        estimate: ``(reported - estimate) / estimate`` over believed reports of at least
        :data:`EVIDENCE` tokens; 0 while none was an underestimate."""
        self._evidence = 0
        self._highest = 0.0  # the highest ratio of a believed report of EVIDENCE tokens or more
        self._reported = 0.0  # fading sums: the learnt ratio is _reported / _base_sum
        self._base_sum = 0.0
        self._outliers: list[tuple[int, int]] = []  # (base, reported) of outliers in a row
        self._base = TiktokenCounter(base)
        super().__init__(overhead or Overhead(per_message=3, per_name=0, reply_priming=0))
        self._parts_key = ("calibrated parts", base, self.overhead)

    @property
    def calibrated(self) -> bool:
        """True once the believed reports hold :data:`EVIDENCE` tokens."""
        return self._evidence >= EVIDENCE

    @property
    def ratio(self) -> float:
        """The estimate's tokens per o200k_base token, as learnt (counts use
        :attr:`counting_ratio`, this rounded up to the :data:`RATIO_STEP` grid).
        """
        return self._ratio

    @ratio.setter
    def ratio(self, value: float) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not value > 0
        ):
            raise ConfigError(f"ratio must be a positive finite number, got {describe(value)}")
        self._ratio = float(value)
        self._set_counting()

    @property
    def counting_ratio(self) -> float:
        """The ratio counts use: :attr:`ratio` rounded up to the :data:`RATIO_STEP` grid (the
        starting ratio times a power of the step).
        """
        return self._counting

    @property
    def version(self) -> int:
        """Changes whenever :attr:`counting_ratio` does (counts made before are not those the
        counter makes now: a cache of counts or of sums of them is keyed by it).
        """
        return self._version

    def _set_counting(self) -> None:
        """Put the counting ratio on the grid above :attr:`ratio` (lock held)."""
        step = math.ceil(round(math.log(self._ratio / self._start, RATIO_STEP), 9))
        counting = self._start * RATIO_STEP**step
        if counting != self._counting:
            self._counting = counting
            self._version += 1

    @property
    def max_relative_error(self) -> float:
        """The underestimate a margin must cover: :data:`UNCALIBRATED_ERROR` until the
        calibration is trusted, then the larger of the largest seen (:attr:`observed_error`)
        and what the highest ratio a report showed is above the ratio counted with now.
        """
        if not self.calibrated:
            return UNCALIBRATED_ERROR
        # The next prompt may be like the one with the highest ratio seen: a ratio learnt
        # since from other prompts (CJK-heavy ones count 1.35x o200k_base in cl100k_base,
        # prose 1.0x) would then underestimate it by that much.
        return max(self.observed_error, self._highest / self._counting - 1.0)

    def count_text(self, text: str) -> int:
        """Estimated tokens of ``text``."""
        return math.ceil(self._base.count_text(text) * self._counting)

    def cached_count(self, message: Message) -> int | None:
        """None: this counter's counts change as it learns, so none is kept for elsewhere."""
        return None

    def seed_count(self, message: Message, tokens: int) -> None:
        """Nothing: a count made earlier may not be this counter's count now."""

    def count_message(self, message: Any) -> int:
        """Estimated tokens of a message, cached on it for the current :attr:`version`; the
        o200k_base counts of its texts are cached too, so a new counting ratio costs a few
        multiplications per message, not its encoding again.
        """
        m = coerce_message(message)
        cache: dict[Any, Any] = _message_cache(m)
        counting = self._counting
        key = (self._cache_key, counting)
        hit = cache.get(key)
        if hit is not None:
            return int(hit)
        parts = cache.get(self._parts_key)
        if parts is None:
            recorder = _TextRecorder(self.overhead)
            fixed = recorder._uncached_message(m)
            parts = (fixed, tuple(self._base.count_text(t) for t in recorder.texts))
            cache[self._parts_key] = parts
        fixed, counts = parts
        n = fixed + sum(math.ceil(b * counting) for b in counts)
        cache[key] = n
        return n

    def observe(self, messages: Iterable[Any], reported_input_tokens: int) -> float:
        """Learn from the input tokens the provider reported for ``messages``.

        A report is ignored, with a warning on the ``ctxkeep.tokens`` logger, when its ratio
        to the prompt's o200k_base count is outside :data:`PLAUSIBLE_RATIOS`, or, once
        :data:`SETTLED` reports were believed, more than :data:`OUTLIER_FACTOR` from the
        running ratio (unless it is the :data:`SETTLED`-th such report in a row on the same
        side: then the ratio starts again from those reports).

        Returns:
            The ratio after the report.

        """
        msgs = [coerce_message(m) for m in messages]
        base = sum(self._base.count_message(m) for m in msgs)
        if base <= 0 or reported_input_tokens <= 0:
            return self.ratio
        observed = reported_input_tokens / base
        low, high = PLAUSIBLE_RATIOS
        with self._lock:
            if not low <= observed <= high:
                self._ignore(
                    reported_input_tokens,
                    base,
                    f"{observed:.3g} times its {self._base.name} count is no tokenizer's "
                    f"(plausible: {low}-{high})",
                )
                return self.ratio
            if self.observations >= SETTLED and not (
                1 / OUTLIER_FACTOR <= observed / self.ratio <= OUTLIER_FACTOR
            ):
                return self._outlier(base, reported_input_tokens, observed)
            self._outliers.clear()
            estimate = self.count_messages(msgs)
            if self.calibrated and estimate >= EVIDENCE:
                error = (reported_input_tokens - estimate) / estimate
                self.observed_error = max(self.observed_error, error)
            if base >= EVIDENCE:
                self._highest = max(self._highest, observed)
            keep = 1.0 - self.smoothing
            self._learn(self._reported * keep + reported_input_tokens, self._base_sum * keep + base)
            self._evidence += base
            self.observations += 1
        return self.ratio

    def _learn(self, reported: float, base: float) -> None:
        """Set the fading sums and the ratio from them (lock held)."""
        self._reported, self._base_sum = reported, base
        learnt = reported / base
        self.ratio = learnt if self.calibrated else max(learnt, self._start)
        self._set_counting()

    def _outlier(self, base: int, reported: int, observed: float) -> float:
        """An outlier report: ignored, unless it completes a run on one side (lock held)."""
        above = observed > self.ratio
        if self._outliers and (self._outliers[0][1] / self._outliers[0][0] > self.ratio) != above:
            self._outliers.clear()
        self._outliers.append((base, reported))
        if len(self._outliers) < SETTLED:
            self._ignore(
                reported,
                base,
                f"{observed:.3g} times its {self._base.name} count is more than "
                f"{OUTLIER_FACTOR}x from the calibrated {self.ratio:.3g}",
            )
            return self.ratio
        old = self.ratio
        self._learn(
            float(sum(r for _, r in self._outliers)), float(sum(b for b, _ in self._outliers))
        )
        self._outliers.clear()
        self.observations += 1
        _log.warning(
            "%s: %d reports in a row were more than %sx from the calibrated ratio %.3g: "
            "recalibrated to %.3g from them",
            self.name,
            SETTLED,
            OUTLIER_FACTOR,
            old,
            self.ratio,
        )
        return self.ratio

    def _ignore(self, reported: int, base: int, why: str) -> None:
        self.ignored += 1
        _log.warning(
            "%s: ignored a report of %d prompt tokens for a prompt of %d %s tokens: %s",
            self.name,
            reported,
            base,
            self._base.name,
            why,
        )


def estimate_margin(counter: TokenCounter, limit: int) -> int:
    """The tokens a gate or budget of ``limit`` tokens keeps free when ``counter`` estimates.

    0 for an exact counter (``counter.exact``; a counter without the attribute is taken as
    exact). For an estimate, ``ceil(limit * rel)`` with ``rel`` the larger of
    :data:`MARGIN_FLOOR` (5%) and the counter's ``max_relative_error`` plus
    :data:`MARGIN_CUSHION` (1%); at most ``limit``. A :class:`CalibratedCounter`'s
    ``max_relative_error`` is 15% until its calibration is trusted, then the largest
    underestimate seen; a counter without the attribute (the chars/4 heuristic) gets the floor.

    The margin follows the calibration: read it when a prompt is built or checked, not once.
    """
    if limit <= 0 or getattr(counter, "exact", True):
        return 0
    seen = getattr(counter, "max_relative_error", 0.0)
    seen = seen if isinstance(seen, int | float) and math.isfinite(seen) and seen > 0 else 0.0
    rel = max(MARGIN_FLOOR, seen + MARGIN_CUSHION)
    # round() first: 15000 * 0.05 is 750.0000000000001 in floating point.
    return min(limit, math.ceil(round(limit * rel, 6)))


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


def counter_for(name: str | None, sample: str | Iterable[Any]) -> TokenCounter:
    """:func:`get_counter`'s counter for ``name``, made to count ``sample`` (a text or
    messages) first: for a short sample (under :data:`SHORT_INPUT` bytes) and an exact
    encoding, a :class:`TiktokenCounter` that counts the sample's texts with a vocabulary cut
    to them, so a new process's first count does not wait for the full encoding (0.2-0.3 s of
    tiktoken's build); other texts load it. Counts are the same as :func:`get_counter`'s.

    Raises:
        UnknownEncodingError: a name ctxkeep does not know.

    """
    encoding = _exact_encoding(name)
    if encoding is not None:
        recorder = _TextRecorder()
        if isinstance(sample, str):
            recorder.count_text(sample)
        else:
            recorder.count_messages(sample)
        if sum(len(_utf8(t)) for t in recorder.texts) <= SHORT_INPUT:
            return TiktokenCounter(encoding, texts=recorder.texts)
    return get_counter(name)


def _exact_encoding(name: str | None) -> str | None:
    """The encoding :func:`get_counter` counts ``name`` with exactly, or None (the heuristic,
    a calibrated estimate, or a name it refuses).
    """
    if name is not None and not isinstance(name, str):
        return None
    key = setting_str("encoding", name, DEFAULT_ENCODING)
    if key in _ENCODINGS:
        return key
    if key == "heuristic" or key.lower().startswith(("claude", "anthropic")):
        return None
    try:
        return encoding_for_model(key)
    except UnknownEncodingError:
        return None


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
    "counter_for",
    "encoding_for_model",
    "estimate_margin",
    "get_counter",
    "image_size",
    "image_tokens",
    "load_encoding",
]
