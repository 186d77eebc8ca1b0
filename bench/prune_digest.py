"""One hash of every prompt and report the pruner makes on the real trajectories: a check that a
refactor of the pruner changed no output (run it before and after; the hashes must be equal).

Every step of every trajectory in ``../shared/data/trajectories`` is pruned with
``TokenPruner(budget, last_n)`` in both modes (cache-stable and ``cache_stable=False``) at three
budgets (6,000/6, 2,500/2, 900/4), o200k_base; the hash covers each prompt's OpenAI messages and
its report's tokens, sections, notes and every message's decision (a refused prompt: its error).

Usage:
    python bench/prune_digest.py
    git worktree add /tmp/old <commit> && PYTHONPATH=/tmp/old/src python bench/prune_digest.py
"""

from __future__ import annotations

import hashlib
import json

from _common import load_runs, require_shared_data
from ctxkeep.errors import BudgetExceededError, MessageError
from ctxkeep.messages import coerce_messages
from ctxkeep.prune import TokenPruner
from ctxkeep.replay import step_prompts
from ctxkeep.tokens import get_counter

SETTINGS = ((6000, 6), (2500, 2), (900, 4))


def main() -> None:
    counter = get_counter("o200k_base")
    digest = hashlib.sha256()
    prunes = 0
    for _, raw in load_runs(require_shared_data(), "*.json"):
        msgs = coerce_messages(raw)
        for stable in (True, False):
            for budget, last_n in SETTINGS:
                pruner = TokenPruner(budget, last_n, counter=counter, cache_stable=stable)
                for i in step_prompts(msgs):
                    try:
                        out, report = pruner.prune_with_report(msgs[:i])
                    except (BudgetExceededError, MessageError) as exc:
                        digest.update(repr(exc).encode())
                        continue
                    prompt = [m.to_openai() for m in out]
                    digest.update(json.dumps(prompt, sort_keys=True, default=str).encode())
                    decisions = [(d.action, d.reason) for d in report.decisions]
                    fates = [report.tokens_after, report.sections, report.notes, decisions]
                    digest.update(json.dumps(fates, default=str).encode())
                    prunes += 1
    print(f"{prunes} prunes, sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
