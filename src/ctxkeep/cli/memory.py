"""``ctxkeep memory``: add, search, forget and import episodes of episodic memory."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ctxkeep.cli import memory_import
from ctxkeep.cli._args import Option, add_action, add_shared_options, finite_float, positive_int
from ctxkeep.cli._io import console as make_console
from ctxkeep.cli._stores import TENANT_OPTION, episodic_url
from ctxkeep.episodic.base import DEFAULT_MIN_SCORE
from ctxkeep.errors import ConfigError, EpisodeNotFoundError, InvalidMessageError

if TYPE_CHECKING:
    from ctxkeep.episodic import EpisodicMemoryStore, Hit

MIN_ID_PREFIX = 4

HELP = """Add, search, forget and import episodes of episodic memory.

--db takes a URL (memory://, sqlite:///path.db, postgresql://...); the default is the
embedded SQLite file. search and forget never create a store: one that does not exist is an
error. --tenant NAME works on that tenant's episodes as `ctxkeep serve --db <the same URL>`
keeps them (what /v1/episodes and the inspector's search show for that tenant's keys).
--embedder: local (the default local model, wordllama; the extra ctxkeep[static], which
ctxkeep[server] includes), wordllama, e5-small (slower, half a point more recall; the extra
ctxkeep[embeddings]), openai, or hash (tests). A store made with another local model keeps it.
--db, --tenant, --embedder and --json go before or after the action.

examples:
  ctxkeep memory add --session s1 --goal "fix CI" "The flaky test was a timezone bug."
  ctxkeep memory search "why did CI fail?" --top-k 5
  ctxkeep memory search "timezone" --format prompt
  ctxkeep memory search "timezone" --tenant acme --db sqlite:///srv/ctxkeep.db
  ctxkeep memory forget --id 3f2a9c1b
  ctxkeep memory forget --session s1
  ctxkeep memory import episodes.jsonl --embedder wordllama
"""

SEARCH_HELP = f"""Find the episodes most relevant to a query; only relevant ones are shown.

A hit's score is the store's fused score: the z-scores of its lexical (BM25) and dense
(embedding) similarity over the searched episodes, added; 0 is the average episode. The
embedding similarity alone does not show that anything matched (every episode has one, and
with nothing relevant in the store the least unrelated still stands out), so a hit is shown
only when it is relevant:

  * the episode, or its neighbours in the same session, share a word with the query
    (a stemmed, non-stopword term: lexical evidence), and
  * its score is at least --min-score (default {DEFAULT_MIN_SCORE:g}: no less relevant than
    the average searched episode).

--all shows the top --top-k hits as ranked, relevant or not (meaning-only matches, such as a
paraphrase or another language, show up there; each says whether it is relevant). With no
relevant hit, --format prompt prints nothing.

examples:
  ctxkeep memory search "why did CI fail?" --top-k 5
  ctxkeep memory search "timezone" --format prompt
  ctxkeep memory search "timezone" --min-score 1.5 --json
  ctxkeep memory search "rounding error" --all
"""

OPTIONS = (
    Option(("--db",), {"help": "episodic store URL (default: the embedded SQLite file)"}),
    TENANT_OPTION,
    Option(
        ("--embedder",),
        {
            "default": "local",
            "help": "local (default: wordllama), e5-small, wordllama, openai or hash",
        },
    ),
    Option(("--json",), {"action": "store_true", "help": "print JSON"}),
)


def register(sub: Any) -> None:
    """Add the ``memory`` command group."""
    p = sub.add_parser(
        "memory",
        help="add, search and forget episodic memories",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ss = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = add_action(
        ss,
        "add",
        "save an episode (text, or - for standard input)",
        'ctxkeep memory add --session s1 --goal "fix CI" "The flaky test was a timezone bug."',
        "git log -1 --format=%B | ctxkeep memory add --session s1 -",
    )
    add.add_argument("text", help="what to remember (not empty), or - for standard input")
    add.add_argument("--session", required=True, help="the session it came from")
    add.add_argument("--goal", default="", help="what the run was trying to do")
    add.add_argument("--agent")
    add.add_argument("--task")
    add.add_argument("--meta", help='metadata as a JSON object, e.g. \'{"lang": "en"}\'')
    search = ss.add_parser(
        "search",
        help="find the episodes relevant to a query",
        description=SEARCH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    search.add_argument("query")
    search.add_argument("--top-k", type=positive_int, default=5, help="at most N hits (default 5)")
    search.add_argument(
        "--min-score",
        type=finite_float,
        default=DEFAULT_MIN_SCORE,
        help=f"lowest fused score shown (default {DEFAULT_MIN_SCORE:g}; see above)",
    )
    search.add_argument(
        "--all", action="store_true", help="show the top hits even when not relevant"
    )
    search.add_argument("--agent")
    search.add_argument("--session")
    search.add_argument("--task")
    search.add_argument(
        "--format",
        choices=["table", "prompt"],
        default="table",
        help="prompt: the '### Prior Historical Context' block",
    )
    forget = add_action(
        ss,
        "forget",
        "delete episodes by id (or a unique prefix of one), session or agent",
        "ctxkeep memory forget --id 3f2a9c1b",
        "ctxkeep memory forget --session s1 --agent a1",
    )
    forget.add_argument(
        "--id", help=f"an episode id, or a unique prefix of one ({MIN_ID_PREFIX}+ characters)"
    )
    forget.add_argument("--session")
    forget.add_argument("--agent")
    memory_import.register(ss)
    add_shared_options(p, ss, OPTIONS)
    p.set_defaults(func=run)


def parse_metadata(text: str | None) -> dict[str, Any] | None:
    """``--meta``: a JSON object, or ``None`` when not given.

    Raises:
        InvalidMessageError: not JSON, or JSON that is not an object.

    """
    if text is None:
        return None

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON value")

    try:
        meta = json.loads(text, parse_constant=refuse_constant)
    except ValueError as exc:
        raise InvalidMessageError(f"--meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise InvalidMessageError(
            f'--meta must be a JSON object such as \'{{"lang": "en"}}\', '
            f"got {type(meta).__name__ if meta is not None else 'null'}: {text}"
        )
    return meta


def resolve_episode_id(store: EpisodicMemoryStore, given: str, **scope: str) -> str:
    """The full id of the one episode whose id is ``given`` or starts with it (as git does).

    Args:
        store: the store.
        given: an id, or a prefix of at least ``MIN_ID_PREFIX`` characters.
        scope: filters (``session_id``, ``agent_id``) that narrow the episodes looked at.

    Raises:
        ConfigError: an empty or too short prefix, or one that more than one id starts with.
        EpisodeNotFoundError: no id starts with it.

    """
    from ctxkeep.episodic import EpisodeFilter

    prefix = given.strip()
    if not prefix:
        raise ConfigError("--id is empty: give an episode id or a prefix of one")
    if store.count({"episode_id": prefix, **scope}):
        return prefix
    if len(prefix) < MIN_ID_PREFIX:
        raise ConfigError(
            f"--id {prefix!r} is too short: give at least {MIN_ID_PREFIX} characters of the id"
        )
    # The store has no lookup by prefix; its primitives list the episodes in scope (one
    # decode per episode, fine for a command run by hand).
    rows = store._rows(EpisodeFilter.parse(scope))
    ids = sorted(e.episode_id for e in store._episodes(rows) if e.episode_id.startswith(prefix))
    if not ids:
        where = "".join(f" in {k.removesuffix('_id')} {v!r}" for k, v in scope.items())
        raise EpisodeNotFoundError(f"no episode id starts with {prefix!r}{where}")
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise ConfigError(
            f"--id {prefix!r} is ambiguous: {len(ids)} episode ids start with it ({shown}); "
            "give more characters"
        )
    return ids[0]


def run(args: argparse.Namespace) -> int:
    """Run the chosen action."""
    if args.action == "add":
        return _add(args)
    if args.action == "import":
        return memory_import.run(args)
    from ctxkeep.episodic import open_episodic

    url = episodic_url(args.db, args.tenant, create=False)  # search and forget only read
    with open_episodic(url, embedder=args.embedder) as store:
        if args.action == "search":
            return _search(store, args)
        scope = {k: v for k, v in (("session_id", args.session), ("agent_id", args.agent)) if v}
        eid = resolve_episode_id(store, args.id, **scope) if args.id is not None else None
        n = store.forget(episode_id=eid, session_id=args.session, agent_id=args.agent)
        print(json.dumps({"forgotten": n}) if args.json else f"forgot {n} episode(s)")
        return 0


def _add(args: argparse.Namespace) -> int:
    from ctxkeep.episodic import open_episodic

    # Checked before the store is opened (loading an embedder takes seconds).
    text = sys.stdin.read() if args.text == "-" else args.text
    if not text.strip():
        source = "standard input" if args.text == "-" else "the text"
        raise InvalidMessageError(f"nothing to remember: {source} is empty")
    if not args.session.strip():
        raise InvalidMessageError("--session is empty: name the session the episode came from")
    meta = parse_metadata(args.meta)
    url = episodic_url(args.db, args.tenant, create=True)
    with open_episodic(url, embedder=args.embedder) as store:
        eid = store.save_episode(
            args.session, args.goal, text, metadata=meta, agent_id=args.agent, task_id=args.task
        )
    print(json.dumps({"episode_id": eid}) if args.json else eid)
    return 0


def _search(store: EpisodicMemoryStore, args: argparse.Namespace) -> int:
    filters = {
        k: v
        for k, v in (("agent_id", args.agent), ("session_id", args.session), ("task_id", args.task))
        if v
    }
    ranked = store.search(args.query, args.top_k, filters=filters)
    hits = ranked if args.all else [h for h in ranked if h.is_relevant(args.min_score)]
    if args.json:
        rows = [
            {
                "episode_id": h.episode.episode_id,
                "session_id": h.episode.session_id,
                "score": h.score,
                "lexical": h.lexical,
                "dense": h.dense,
                "relevant": h.is_relevant(args.min_score),
                "text": h.episode.text,
            }
            for h in hits
        ]
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    elif args.format == "prompt":
        from ctxkeep.episodic import format_prior_context

        print(format_prior_context(hits), end="")
    else:
        _print_table(hits, args.query, ranked_all=args.all, min_score=args.min_score)
        if len(hits) < len(ranked):
            make_console(stderr=True).print(
                f"[dim]{len(ranked) - len(hits)} less relevant hit(s) not shown; "
                "see them with --all[/dim]"
            )
    return 0


def preview(text: str, limit: int = 100) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters (an
    ellipsis marks the cut; a single word longer than that is cut inside).
    """
    one = " ".join(text.split())
    if len(one) <= limit:
        return one
    cut = one[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…"


def _print_table(
    hits: Sequence[Hit], query: str, *, ranked_all: bool, min_score: float = DEFAULT_MIN_SCORE
) -> None:
    if not hits:
        print(f"no {'' if ranked_all else 'relevant '}episode for {query!r}")
        return
    if ranked_all:
        shown = sum(h.is_relevant(min_score) for h in hits)
        title = f"top {len(hits)} episode(s) for {query!r}, {shown} of them relevant"
    else:
        title = f"{len(hits)} relevant episode(s) for {query!r}"
    table = Table(title=title)
    columns = (
        ("score", "relevant", "session", "episode", "text")
        if ranked_all
        else ("score", "session", "episode", "text")
    )
    for col in columns:
        table.add_column(col)
    for h in hits:
        e = h.episode
        cells = [f"{h.score:.3f}", e.session_id, e.episode_id[:12], preview(e.text)]
        if ranked_all:
            cells.insert(1, "yes" if h.is_relevant(min_score) else "no")
        table.add_row(*cells)
    make_console().print(table)
