"""``ctxkeep memory import``: bulk import of episodes, batched, with progress, resumable.

Three sources, one pipeline:

* a JSON lines file of episodes, one object a line (``session_id``, ``summary``, and
  optionally ``task_goal``, ``metadata``, ``agent_id``, ``task_id``, ``created_at``: a unix
  time or an ISO 8601 date-time);
* ``--messages``: a file of one conversation's messages (a JSON list, ``{"messages": [...]}``
  or JSON lines, as ``ctxkeep count`` reads), turned into episodes;
* ``--from-session ID``: the messages of a session stored in ctxkeep (``--sessions-db``).

A conversation becomes one episode per exchange, as the LangChain middleware saves a run: the
user message is the goal, and the summary is what followed up to the next user message (the
tools called and the final answer).

Every line is checked before anything is stored: a bad line stops the import with an error
naming it, with nothing imported (``--skip-invalid`` leaves bad lines out instead and lists
them). Episodes are then saved in batches of ``--batch-size`` (embedded together, each batch
one transaction). An interrupted import is resumed by running it again: the store keys each
episode by the hash of its session, goal and summary (its dedup key, kept in the store), so
what is already stored is skipped without being embedded again, and repeated lines are
stored once.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxkeep.cli._args import positive_int
from ctxkeep.cli._io import console as make_console
from ctxkeep.errors import ConfigError, InvalidMessageError

if TYPE_CHECKING:
    from ctxkeep.episodic import EpisodicMemoryStore
    from ctxkeep.messages import Message

DEFAULT_BATCH = 256
EXIT_INTERRUPTED = 130  # what a shell reports for a process stopped by Ctrl-C (128 + SIGINT)
FIELDS = ("session_id", "task_goal", "summary", "metadata", "agent_id", "task_id", "created_at")
REQUIRED = ("session_id", "summary")
"""The fields a line must have (task_goal defaults to "", the others to none or now)."""
MAX_ANSWER = 2000

HELP = f"""Import episodes in bulk: from a JSON lines file, or a conversation's messages.

FILE holds one episode a line, a JSON object:
  {{"session_id": "s1", "task_goal": "fix CI", "summary": "The flaky test was a timezone bug.",
   "metadata": {{"lang": "en"}}, "created_at": "2026-01-01T09:30:00Z"}}
(session_id and summary are required; task_goal defaults to ""; created_at is a unix time
or an ISO 8601 date-time, UTC unless it names a zone, and defaults to now; also agent_id
and task_id).

--messages: FILE holds one conversation's messages instead (a JSON list, {{"messages": [...]}}
or JSON lines of OpenAI-style messages); --from-session ID reads a session stored in ctxkeep
(in --sessions-db; with --tenant, in that tenant's store, as for the episodes).
Each exchange becomes an episode: the user message is its goal, the tools called and the
final answer until the next user message its summary.

Every line is checked first: a bad one stops the import, naming its line, before anything is
stored (--skip-invalid leaves bad lines out and lists them). Episodes are embedded and saved
in batches of --batch-size (default {DEFAULT_BATCH}). An interrupted import resumes when run
again: episodes already stored (same session, goal and summary) are skipped, not embedded
again, and a repeated line is stored once.

examples:
  ctxkeep memory import episodes.jsonl
  ctxkeep memory import episodes.jsonl --db sqlite:///agents.db --embedder wordllama
  ctxkeep memory import chat.json --messages --session support-42
  ctxkeep memory import --from-session 3f2a9c1b --sessions-db sqlite:///agents.db
  ctxkeep memory import --from-session 3f2a9c1b --tenant acme --db sqlite:///srv/ctxkeep.db
"""


def register(actions: Any) -> None:
    """Add the ``import`` action to the ``memory`` group."""
    p = actions.add_parser(
        "import",
        help="import episodes in bulk (JSON lines, or a conversation's messages)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", nargs="?", help="JSON lines of episodes (or messages); - for stdin")
    p.add_argument("--messages", action="store_true", help="FILE holds one conversation's messages")
    p.add_argument("--from-session", metavar="ID", help="import a stored session's messages")
    p.add_argument(
        "--sessions-db",
        help="the session store for --from-session (default: the embedded file; with --tenant, "
        "--db)",
    )
    p.add_argument("--session", help="the episodes' session with --messages (default: FILE's name)")
    p.add_argument("--agent", help="agent_id of episodes that name none")
    p.add_argument("--task", help="task_id of episodes that name none")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH,
        help=f"episodes embedded and saved together (default {DEFAULT_BATCH})",
    )
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave bad lines out (listed) instead of stopping",
    )


# -- reading --------------------------------------------------------------------------------


@dataclass
class Source:
    """Where episodes come from: a name for messages and a way to read them (more than once)."""

    name: str
    """The file name, ``<stdin>``, or ``session ID``."""
    episodes: Callable[[], Iterator[tuple[int, Any]]]
    """``(line number, episode or error)``: each item an episode dict, or the
    :class:`InvalidMessageError` of a bad line."""


@dataclass
class Plan:
    """What a source holds, found by reading it once before anything is stored."""

    lines: int = 0
    """Episodes read (blank lines not counted)."""
    distinct: int = 0
    """Of them, distinct episodes (by the store's key: session, goal and summary)."""
    invalid: list[tuple[int, str]] = field(default_factory=list)
    """``(line, error)`` of each bad line left out (``--skip-invalid``)."""


def _jsonl_lines(path: str) -> tuple[str, Callable[[], Iterator[tuple[int, str]]]]:
    """The name of ``path`` and a function that yields its non-blank lines with their numbers.

    Standard input is read into memory (it cannot be read twice); a file is streamed.
    """
    if path == "-":
        cached = sys.stdin.read().splitlines()

        def stdin_lines() -> Iterator[tuple[int, str]]:
            yield from ((n, t) for n, t in enumerate(cached, 1) if t.strip())

        return "<stdin>", stdin_lines
    p = Path(path)
    if not p.is_file():
        raise InvalidMessageError(f"no such file: {path}")

    def file_lines() -> Iterator[tuple[int, str]]:
        try:
            with p.open(encoding="utf-8") as f:
                for n, text in enumerate(f, 1):
                    if text.strip():
                        yield n, text
        except UnicodeDecodeError as exc:
            raise InvalidMessageError(f"{path} is not UTF-8 text: {exc}") from exc
        except OSError as exc:
            raise InvalidMessageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    return p.name, file_lines


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_episode(
    text: str, *, now: float, defaults: dict[str, str]
) -> dict[str, Any] | InvalidMessageError:
    """The episode one JSON line describes, checked as the store checks it, or the error
    (its message says what is wrong; the caller adds where).
    """
    from ctxkeep.episodic.base import _new_episode

    try:
        item = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        return InvalidMessageError(f"invalid JSON: {exc}")
    if not isinstance(item, dict):
        return InvalidMessageError(f"expected a JSON object, got {type(item).__name__}")
    unknown = sorted(set(item) - set(FIELDS))
    if unknown:
        return InvalidMessageError(
            f"unknown field(s) {', '.join(map(repr, unknown))}; an episode has {', '.join(FIELDS)}"
        )
    missing = [name for name in REQUIRED if name not in item]
    if missing:
        return InvalidMessageError(
            f"no {' and no '.join(missing)}: a line needs {' and '.join(REQUIRED)} "
            "(task_goal and the other fields are optional)"
        )
    item.setdefault("task_goal", "")
    created = item.get("created_at")
    if isinstance(created, str):  # JSON has no dates: ISO 8601 text, UTC unless it says
        try:
            when = datetime.fromisoformat(created)
        except ValueError:
            return InvalidMessageError(
                f"created_at must be a unix time or an ISO 8601 date-time, got {created!r:.40}"
            )
        item["created_at"] = when if when.tzinfo else when.replace(tzinfo=UTC)
    for k, v in defaults.items():
        if item.get(k) is None:
            item[k] = v
    try:
        _new_episode(0, item, now)
    except InvalidMessageError as exc:
        detail = str(exc).removeprefix("message 0: ").removeprefix("episode 0")
        return InvalidMessageError(detail.removeprefix(":").strip())
    if isinstance(item["summary"], str) and not item["summary"].strip():
        return InvalidMessageError("summary is empty: nothing to remember")
    return item


def exchanges(
    messages: Sequence[Message], session_id: str, *, defaults: dict[str, str], source: str
) -> list[dict[str, Any]]:
    """One episode per exchange of a conversation: the user message is the goal; the summary
    the tools called (with how often) and the final answer, up to the next user message.
    Exchanges with no text on either side (a user message left unanswered) are left out.
    """
    out: list[dict[str, Any]] = []
    starts = [i for i, m in enumerate(messages) if m.role == "user"] + [len(messages)]
    for turn, (a, b) in enumerate(itertools.pairwise(starts)):
        goal = messages[a].text.strip()
        calls: Counter[str] = Counter()
        answer = ""
        for m in messages[a + 1 : b]:
            if m.role == "assistant":
                calls.update(tc.name for tc in m.tool_calls)
                if m.text.strip():
                    answer = m.text.strip()
        lines = []
        if calls:
            lines.append("Tools used: " + ", ".join(f"{n} x{k}" for n, k in calls.most_common()))
        if answer:
            cut = answer if len(answer) <= MAX_ANSWER else answer[:MAX_ANSWER] + " [...]"
            lines.append("Answer: " + cut)
        if not goal or not lines:
            continue
        created = messages[a].created_at
        out.append(
            {
                **defaults,
                "session_id": session_id,
                "task_goal": goal,
                "summary": "\n".join(lines),
                "metadata": {"source": source, "exchange": turn},
                **({"created_at": created} if created is not None else {}),
            }
        )
    return out


def source_of(args: argparse.Namespace) -> Source:
    """The episodes the command line names.

    Raises:
        ConfigError: no source, or more than one.
        InvalidMessageError: a file that cannot be read, or messages that are malformed.

    """
    defaults = {k: v for k, v in (("agent_id", args.agent), ("task_id", args.task)) if v}
    if (args.file is None) == (args.from_session is None):
        raise ConfigError("give FILE or --from-session ID (one of them)")
    if args.from_session is not None:
        if args.messages or args.session:
            raise ConfigError("--messages and --session go with FILE, not --from-session")
        from ctxkeep.cli._stores import open_sessions

        # With --tenant, the session comes from that tenant's store under --sessions-db (or
        # else --db): a tenant's records all live at one URL.
        db = args.sessions_db or (args.db if args.tenant else None)
        with open_sessions(db, args.tenant, create=False) as mem:
            msgs = mem.get_messages(args.from_session)
        eps = exchanges(msgs, args.from_session, defaults=defaults, source="session")
        return Source(f"session {args.from_session}", lambda: iter(enumerate(eps, 1)))
    if args.messages:
        from ctxkeep.cli._io import parse_messages, read_source

        session = args.session or (Path(args.file).stem if args.file != "-" else None)
        if not session or not session.strip():
            raise ConfigError("--session is needed with --messages from standard input")
        name, text = read_source(args.file)
        loaded = parse_messages(name, text, allow_text=False)
        eps = exchanges(loaded.messages or [], session, defaults=defaults, source=name)
        return Source(name, lambda: iter(enumerate(eps, 1)))
    if args.session:
        raise ConfigError("--session goes with --messages; each JSON line names its session")
    name, lines = _jsonl_lines(args.file)
    now = time.time()

    def episodes() -> Iterator[tuple[int, Any]]:
        for n, text in lines():
            yield n, parse_episode(text, now=now, defaults=defaults)

    return Source(name, episodes)


def plan(source: Source, *, skip_invalid: bool) -> Plan:
    """Read ``source`` once: count its episodes and check every one.

    Raises:
        InvalidMessageError: a bad line (unless ``skip_invalid``), named by its number.

    """
    from ctxkeep.episodic.base import content_key

    out = Plan()
    keys: set[str] = set()
    for n, item in source.episodes():
        if isinstance(item, InvalidMessageError):
            if not skip_invalid:
                raise InvalidMessageError(
                    f"{source.name}, line {n}: {item}; nothing was imported "
                    "(fix the line, or leave bad lines out with --skip-invalid)"
                )
            out.invalid.append((n, str(item)))
            continue
        out.lines += 1
        keys.add(content_key(item["session_id"], item["task_goal"], item["summary"]))
    out.distinct = len(keys)
    return out


# -- storing --------------------------------------------------------------------------------


@dataclass
class Tally:
    """What an import did, so far."""

    done: int = 0
    """Episodes (lines) processed."""
    added: int = 0
    """Distinct episodes stored by this run."""
    present: int = 0
    """Distinct episodes that were already stored (an earlier, interrupted run)."""


def store_all(
    store: EpisodicMemoryStore,
    source: Source,
    batch_size: int,
    on_batch: Callable[[Tally], None],
) -> Tally:
    """Save every valid episode of ``source`` in batches, skipping those already stored."""
    from ctxkeep.episodic.base import content_key

    tally = Tally()
    seen: set[str] = set()
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        keys = [content_key(e["session_id"], e["task_goal"], e["summary"]) for e in batch]
        # one look-up for the batch: a resumed import skips stored batches without embedding
        stored = store.find_stored(keys)
        fresh = {k for k in keys if k not in stored and k not in seen}
        tally.present += len({k for k in keys if k in stored and k not in seen})
        if fresh:
            store.save_episodes(batch)
        seen.update(keys)
        tally.added += len(fresh)
        tally.done += len(batch)
        batch.clear()
        on_batch(tally)

    for _, item in source.episodes():
        if isinstance(item, InvalidMessageError):
            continue  # listed by plan()
        batch.append(item)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    return tally


class _Progress:
    """A rich progress bar on a terminal; otherwise a plain line on stderr every tenth."""

    def __init__(self, total: int, name: str) -> None:
        self.total = total
        self.name = name
        self.console = make_console(stderr=True)
        self.bar: Any = None
        self.next_line = 0
        if self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn(f"importing {name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[added]} new"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.bar.add_task("import", total=total, added=0)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, t: Tally) -> None:
        """Show a batch's progress (not the last: the command's result line says it)."""
        if self.bar is not None:
            self.bar.update(self.task, completed=t.done, added=t.added)
        elif self.next_line <= t.done < self.total:
            print(
                f"importing {self.name}: {t.done:,} of {self.total:,} lines done ({t.added:,} new)",
                file=sys.stderr,
            )
            self.next_line = t.done + max(1, self.total // 10)


def run(args: argparse.Namespace) -> int:
    """Run ``ctxkeep memory import``."""
    from ctxkeep.cli._stores import episodic_url
    from ctxkeep.episodic import open_episodic

    source = source_of(args)
    found = plan(source, skip_invalid=args.skip_invalid)  # before the store (and model) load
    result: dict[str, Any] = {
        "source": source.name,
        "episodes": found.lines,
        "distinct": found.distinct,
        "invalid": [{"line": n, "error": e} for n, e in found.invalid],
    }
    tally = Tally()
    with open_episodic(
        episodic_url(args.db, args.tenant, create=True), embedder=args.embedder
    ) as store:
        try:
            with _Progress(found.lines, source.name) as progress:

                def on_batch(t: Tally) -> None:
                    nonlocal tally
                    tally = t
                    progress.update(t)

                tally = store_all(store, source, args.batch_size, on_batch)
        except KeyboardInterrupt:
            print(
                f"ctxkeep: interrupted after storing {tally.added:,} new episode(s) of "
                f"{found.distinct:,}; run the same command again to resume "
                "(stored episodes are skipped)",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
    result |= {"added": tally.added, "already_stored": tally.present}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        dupes = found.lines - found.distinct
        print(
            f"imported {tally.added:,} new episode(s) from {source.name}; "
            f"{tally.present:,} were already stored"
            + (f", {dupes:,} repeated line(s) stored once" if dupes else "")
            + (f", {len(found.invalid):,} invalid line(s) left out" if found.invalid else "")
        )
        for n, e in found.invalid[:20]:
            print(f"  line {n}: {e}", file=sys.stderr)
    return 0
