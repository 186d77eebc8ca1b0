"""A LangGraph graph on ctxkeep: its checkpoints in ``CtxkeepSaver``, its long-term memories
in ``CtxkeepStore`` (hybrid lexical + dense recall), both in one SQLite file.

    python examples/langgraph_app.py [--db PATH] [--embedder hash|local]

Offline: the graph's "assistant" node is plain Python (no model). Turn 1 stores a few facts a
user mentions as memories; the process then "restarts" (a new saver and store on the same
file) and turn 2, on the same thread, resumes from the checkpoint and recalls the fact that
bears on a question by its rare word ("penicillin": BM25 finds it where a dense-only store
can rank it low), with the embedder's meaning fused in (``--embedder local``: wordllama).

A store keeps the vectors of one embedder, so each embedder gets a file of its own by default
(``langgraph-<embedder>.db`` in ctxkeep's user data directory); a ``--db`` made with another
embedder is refused with one line saying how to start over.
"""

from __future__ import annotations

import argparse
import operator
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import platformdirs
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from ctxkeep.errors import ConfigError
from ctxkeep.integrations.langgraph import CtxkeepSaver, CtxkeepStore


class State(TypedDict):
    user: str
    said: Annotated[list[str], operator.add]
    recalled: list[str]


def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
    """Keep every fact the user states (sentences starting with "I")."""
    newest = state["said"][-1]
    for sentence in filter(None, (s.strip() for s in newest.split("."))):
        if sentence.startswith("I "):
            store.put((state["user"], "facts"), uuid.uuid4().hex[:8], {"text": sentence})
    return {}


def recall(state: State, *, store: BaseStore) -> dict[str, Any]:
    """Recall what the user told us that bears on their newest message."""
    hits = store.search((state["user"], "facts"), query=state["said"][-1], limit=1)
    return {"recalled": [h.value["text"] for h in hits]}


def build(saver: CtxkeepSaver, store: CtxkeepStore) -> Any:
    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    return graph.compile(checkpointer=saver, store=store)


def main(db: Path, embedder: str = "hash") -> dict[str, Any]:
    url = f"sqlite:///{db}"
    config = {"configurable": {"thread_id": "user-42-chat"}}
    first = "I live in Lisbon. I am allergic to penicillin. I run every morning."
    second = "The doctor suggests penicillin for my throat. Is that safe?"
    with CtxkeepSaver(url) as saver:
        store = CtxkeepStore(url, embedder=embedder, index={"fields": ["text"]})
        try:
            build(saver, store).invoke({"user": "user-42", "said": [first]}, config)
        finally:
            store.close()
    # A new process: the thread resumes from its checkpoint, the memories are still there.
    with CtxkeepSaver(url) as saver:
        store = CtxkeepStore(url, embedder=embedder, index={"fields": ["text"]})
        try:
            out = build(saver, store).invoke({"said": [second]}, config)
            checkpoints = len(list(saver.list(config)))
        finally:
            store.close()
    print(f"thread has said {len(out['said'])} things over {checkpoints} checkpoints")
    print("recalled:", out["recalled"])
    return {"said": out["said"], "recalled": out["recalled"], "checkpoints": checkpoints}


def default_db(embedder: str) -> Path:
    """The example's file for ``embedder``, in ctxkeep's user data directory."""
    return Path(platformdirs.user_data_dir("ctxkeep")) / "examples" / f"langgraph-{embedder}.db"


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", type=Path, default=None, help="the SQLite file (default: one per embedder)"
    )
    parser.add_argument("--embedder", default="hash", choices=["hash", "local"])
    args = parser.parse_args(argv)
    db = args.db or default_db(args.embedder)
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        main(db, args.embedder)
    except ConfigError as exc:
        print(
            f"langgraph_app: {exc}; to start over, delete {db} or give another --db",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
