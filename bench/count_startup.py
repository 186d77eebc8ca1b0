"""The first token count of a new process: ``ctxkeep count`` on a short file, whole process.

Side by side in one run, rounds interleaved so a busy machine slows every column alike:

- whole processes: ``python -c pass`` (the interpreter alone), ``import ctxkeep``, and
  ``ctxkeep count FILE`` with this checkout's code and with the code of ``--anchor`` (a commit,
  by default the one before the count was made fast; its ``src`` is exported with
  ``git archive`` into a temporary directory, nothing in the checkout changes), and with this
  checkout's code under an empty ``ctxkeep`` package (what a lazy ``__init__`` would give);
- the tokenizer load alone, in this process: reading ``.tiktoken.gz`` the old way (a loop over
  the lines with ``base64.b64decode`` and ``int``) and the new way
  (``ctxkeep.tokens._mergeable_ranks``); tiktoken's full ``Encoding`` (its Rust ``CoreBPE``)
  built from the ranks, which the old ``ctxkeep count`` waited for; and the vocabulary cut to
  the file (``ctxkeep.tokens._cut_encoding``, the ranks already parsed), which it waits for now.

Usage::

    python bench/count_startup.py [--rounds 9] [--anchor d27e54a] [--file PATH]

Prints a table of medians and ranges (milliseconds).
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN_CLI = "import sys; from ctxkeep.cli import main; sys.exit(main())"
# The same, with the package's ``__init__`` (which imports the builder, the stores, asyncio...)
# replaced by an empty package: what ``ctxkeep count`` would take if that ``__init__`` were lazy.
RUN_CLI_LAZY_PACKAGE = (
    "import sys, types, os; p = types.ModuleType('ctxkeep'); "
    "p.__path__ = [os.path.join(os.environ['PYTHONPATH'], 'ctxkeep')]; sys.modules['ctxkeep'] = p; "
    + RUN_CLI.split("; ", 1)[1]
)


def old_ranks(name: str) -> dict[bytes, int]:
    """The anchor: ``load_encoding``'s parse before this change, copied."""
    from ctxkeep import tokens

    raw = gzip.decompress(tokens._data_file(name).read_bytes())
    assert hashlib.sha256(raw).hexdigest() == tokens._ENCODINGS[name]["sha256"]
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def export(commit: str, into: Path) -> Path:
    """``src`` of ``commit``, exported with ``git archive`` (the checkout is not touched)."""
    tar = into / "src.tar"
    with tar.open("wb") as f:
        subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return into / "src"


def timed_process(args: list[str], src: Path | None) -> float:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tokenizer_load(name: str, ranks: dict[bytes, int], text: str) -> dict[str, Callable[[], Any]]:
    """The steps of loading ``name``, each a function to time."""
    import tiktoken

    from ctxkeep import tokens

    spec = tokens._ENCODINGS[name]
    parse = tokens._mergeable_ranks.__wrapped__  # type: ignore[attr-defined]

    def build() -> Any:
        return tiktoken.Encoding(
            name="bench",
            pat_str=spec["pat_str"],
            mergeable_ranks=ranks,
            special_tokens=dict(spec["special_tokens"]),
        )

    return {
        f"{name}: parse, before": lambda: old_ranks(name),
        f"{name}: parse, now": lambda: parse(name),
        f"{name}: full `Encoding` (tiktoken's CoreBPE) build, parsed ranks": build,
        f"{name}: vocabulary cut to the file (data read included)": lambda: tokens._cut_encoding(
            name, [text]
        ),
    }


def row(label: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"| {label} | {statistics.median(ms):,.0f} | {min(ms):,.0f}-{max(ms):,.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--anchor", default="d27e54a", help="the commit to compare with")
    parser.add_argument("--file", help="the file to count (default: a one-line text file)")
    opts = parser.parse_args()

    from ctxkeep import tokens

    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(opts.file) if opts.file else Path(tmp) / "short.txt"
        if not opts.file:
            path.write_text("Count the tokens of this short file, please.\n")
        old_src = export(opts.anchor, Path(tmp))
        new_src = ROOT / "src"
        py = sys.executable
        processes = {
            "`python -c pass`": ([py, "-c", "pass"], None),
            "`import ctxkeep`": ([py, "-c", "import ctxkeep"], new_src),
            f"`ctxkeep count` ({opts.anchor})": ([py, "-c", RUN_CLI, "count", str(path)], old_src),
            "`ctxkeep count` (now)": ([py, "-c", RUN_CLI, "count", str(path)], new_src),
            "`ctxkeep count` (now, with an empty package `__init__`)": (
                [py, "-c", RUN_CLI_LAZY_PACKAGE, "count", str(path)],
                new_src,
            ),
        }
        load: dict[str, Callable[[], Any]] = {}
        text = path.read_text()
        for name in ("o200k_base", "cl100k_base"):
            ranks = tokens._mergeable_ranks(name)
            assert ranks == old_ranks(name)
            load.update(tokenizer_load(name, ranks, text))
        load_avg = os.getloadavg()
        for _ in range(opts.rounds):
            for label, (args, src) in processes.items():
                samples.setdefault(label, []).append(timed_process(args, src))
            for label, fn in load.items():
                samples.setdefault(label, []).append(timed(fn))
    print(
        f"{opts.rounds} rounds, {os.cpu_count()} CPUs, load average "
        f"{load_avg[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| what | median ms | range ms |\n|---|---:|---:|")
    for label, values in samples.items():
        print(row(label, values))


if __name__ == "__main__":
    main()
