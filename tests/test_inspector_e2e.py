"""The web inspector end to end: a live server, a session made through the API, and Debian's
Chromium (headless, driven by Playwright's Python package; no browser download) reading it the
way a person would: key, session, messages, a turn's prompt composition, a compressed output
expanded from its artifact, an episodic search. A screenshot is saved under the test's
``tmp_path`` and, if ``CTXKEEP_SCREENSHOT_DIR`` is set, there too.

The browser is found the way a user has one (:func:`_find_chromium`): ``$CTXKEEP_CHROMIUM``,
a Chromium or Chrome on the ``PATH`` (Debian's ``/usr/bin/chromium``), or Playwright's own
(``playwright install chromium``). Without one, or without the ``playwright`` package, the
test is skipped, or fails when ``CTXKEEP_REQUIRE_SERVICES=1`` (``.ci/run`` installs Debian's
Chromium with apt-get, so CI never skips it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx

from _server import ThreadedServer
from conftest_services import service_unavailable
from ctxkeep.server import create_app

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SECTIONS = ("system", "fabric", "prior_context", "history", "tools", "summary", "priming")
GOAL = "Audit the billing module for rounding errors"


def output(n: int) -> str:
    """A long tool output (about 3,600 tokens)."""
    return "\n".join(
        f"line {i} of invoice_{n}.py: total = round(subtotal * rate, 2)  # check"
        for i in range(200)
    )


def history() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You audit code for money bugs."}]
    for t in range(4):
        out += [
            {"role": "user", "content": f"Step {t}: read invoice_{t}.py"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"invoice_{t}.py"}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{t}", "content": output(t)},
            {"role": "assistant", "content": f"invoice_{t}.py rounds before summing."},
        ]
    return out


def expected_bar(report: dict[str, Any]) -> dict[str, int]:
    """The stacked bar a report should draw: its non-empty sections, the reserve, the rest."""
    bar = {s: report["sections"][s] for s in SECTIONS if report["sections"].get(s)}
    bar["reserve"] = report["reserve_output_tokens"]
    free = report["max_prompt_tokens"] - report["prompt_tokens"] - report["reserve_output_tokens"]
    if free:
        bar["free"] = free
    return bar


def _find_chromium() -> str | None:
    """A Chromium to drive: ``$CTXKEEP_CHROMIUM``, one on the PATH, or Playwright's own."""
    given = os.environ.get("CTXKEEP_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # `playwright install chromium` puts one in its cache
        own = p.chromium.executable_path
    return own if own and Path(own).exists() else None


def _require_browser() -> str:
    if importlib.util.find_spec("playwright") is None:
        service_unavailable("the playwright package is not installed: pip install -e '.[test]'")
    found = _find_chromium()
    if found is None:
        service_unavailable(
            "no Chromium found ($CTXKEEP_CHROMIUM, chromium or google-chrome on the PATH, "
            "or Playwright's own): apt-get install chromium, or playwright install chromium"
        )
    assert found is not None
    return found


def test_the_inspector_shows_a_session_its_prompts_and_episodes(tmp_path: Path) -> None:
    chromium = _require_browser()
    from playwright.sync_api import expect, sync_playwright

    app = create_app(f"sqlite:///{tmp_path}/srv.db", embedder="hash")
    key = str(app.state.ctxkeep.keys.create("acme")[1])
    server = ThreadedServer(app).start()
    try:
        messages = history()
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as api:
            api.post("/v1/sessions", json={"agent_id": "reviewer"}).raise_for_status()
            r = api.post("/v1/sessions", json={"agent_id": "auditor", "task_id": "billing"})
            sid = r.json()["session"]["session_id"]
            api.post(f"/v1/sessions/{sid}/messages", json={"messages": messages}).raise_for_status()
            r = api.post(
                "/v1/episodes",
                json={
                    "session_id": "earlier-run",
                    "task_goal": GOAL,
                    "summary": "invoice totals were rounded per line; fixed by summing first",
                    "metadata": {},
                },
            )
            r.raise_for_status()
            # What the API reports, to hold the drawing to (the page's defaults are the
            # prompt route's: an 8,192-token window, 1,024 reserved, the last 6 preferred).
            next_prompt = api.post(f"/v1/sessions/{sid}/prompt", json={}).json()["report"]
            turn3_at = 10  # turn 3's first model call: after the system message and 2 turns
            turn3 = api.get(
                f"/v1/inspect/sessions/{sid}/composition", params={"at": turn3_at}
            ).json()
        compressed = [d for d in turn3["decisions"] if d["action"] == "compressed"]
        assert compressed, "the session must be long enough for the pruner to compress"

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(20_000)  # generous: CI's 2 cores may be busy
                expect.set_options(timeout=20_000)
                elsewhere: list[str] = []
                errors: list[str] = []
                page.on(
                    "request",
                    lambda req: (
                        None
                        if req.url.startswith((server.url + "/", "data:"))
                        else elsewhere.append(req.url)
                    ),
                )
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda exc: errors.append(str(exc)))

                page.goto(server.url + "/")
                page.fill("#api-key", key)
                page.click("#login-form button[type=submit]")
                expect(page.locator("#sessions li")).to_have_count(2)
                page.click(f"#sessions button[data-session-id='{sid}']")

                # Its messages, as stored, grouped in turns.
                expect(page.locator("#timeline .msg")).to_have_count(len(messages))
                expect(page.locator("#timeline .turn")).to_have_count(5)
                expect(page.locator(".msg[data-index='5'] .body")).to_have_text(
                    "Step 1: read invoice_1.py"
                )
                expect(page.locator(".msg[data-index='2'] .call")).to_contain_text("read_file()")

                # The tokens of every step: one bar per model call, and the next call.
                calls = sum(1 for m in messages if m["role"] == "assistant")
                expect(page.locator("#steps-chart .step")).to_have_count(calls + 1)

                # The next call's composition first: the bar is the prompt route's report.
                expect(page.locator("#composition-title")).to_contain_text("next model call")
                assert _bar(page) == expected_bar(next_prompt)

                # A turn's composition chart.
                page.click(".turn[data-turn='3'] .turn-prompt")
                expect(page.locator("#composition-title")).to_contain_text(
                    f"before message #{turn3_at}"
                )
                assert _bar(page) == expected_bar(turn3["report"])
                expect(page.locator("#steps-chart .step.selected")).to_have_attribute(
                    "data-at", str(turn3_at)
                )

                # A compressed output: the excerpt the prompt carried, then its full text.
                d = compressed[0]
                card = page.locator(f".msg[data-index='{d['index']}']")
                expect(card.locator(".badge.act-compressed")).to_be_visible()
                assert card.locator(".excerpt").text_content() == d["excerpt"]
                card.locator(".expand-artifact").click()
                full = card.locator(".artifact-text")
                expect(full).to_be_visible()
                assert full.text_content() == messages[d["index"]]["content"]

                # Episodic search.
                page.fill("#search-q", "billing rounding")
                page.click("#search-form button[type=submit]")
                expect(page.locator("#hits li").first).to_contain_text(GOAL)

                page.locator("#composition").scroll_into_view_if_needed()
                shot = tmp_path / "inspector.png"
                page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                if os.environ.get("CTXKEEP_SCREENSHOT_DIR"):
                    target = Path(os.environ["CTXKEEP_SCREENSHOT_DIR"])
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy(shot, target / shot.name)

                assert errors == []
                assert elsewhere == []  # nothing loaded from anywhere but the server
            finally:
                browser.close()
    finally:
        server.stop()


def _bar(page: Any) -> dict[str, int]:
    """The composition bar's segments as drawn: section -> tokens."""
    rects = page.locator("#composition-bar rect[data-section]")
    return {
        str(r.get_attribute("data-section")): int(str(r.get_attribute("data-tokens")))
        for r in rects.all()
    }
