"""The web inspector end to end: a live server, a session made through the API, and Debian's
Chromium (headless, driven by Playwright's Python package; no browser download) reading it the
way a person would: key, session, messages, a turn's prompt composition, a compressed output
expanded from its artifact, an episodic search. A screenshot is saved under the test's
``tmp_path`` and, if ``CTXKEEP_SCREENSHOT_DIR`` is set, there too.

The layout is held at a desktop's width (1440 px) and a phone's (390 px) by the bounding boxes
of what is drawn (:func:`_assert_clean_layout`): no label over another (the budget and window
labels of the composition bar, the step numbers, the axis titles, the header's parts), the
header naming the tenant, the main column inside the viewport. A 300k-token history beside
prompts of a few thousand tokens still shows every prompt's bar.

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


def big_history() -> list[dict[str, Any]]:
    """About 387k tokens: twelve 25k-token outputs and long answers, each reply recording the
    window its prompt was built in (12,000 tokens, 1,000 for the reply), as a client may.
    """
    window = {"max_prompt_tokens": 12_000, "reserve_output_tokens": 1_000}
    out: list[dict[str, Any]] = [{"role": "system", "content": "You read large tables."}]
    for t in range(12):
        rows = "\n".join(f"row {i} value {i * t} alpha beta gamma delta" for i in range(2500))
        out += [
            {"role": "user", "content": f"read table {t}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"t{t}",
                        "type": "function",
                        "function": {"name": "read_table", "arguments": "{}"},
                    }
                ],
                "metadata": window,
            },
            {"role": "tool", "tool_call_id": f"t{t}", "content": rows},
            {"role": "assistant", "content": f"table {t}: " + "detail " * 1200, "metadata": window},
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
            r = api.post(
                "/v1/episodes",
                json={
                    "session_id": "other-run",
                    "task_goal": "Translate the onboarding emails",
                    "summary": "french and german drafts sent for review",
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
                page = browser.new_page(viewport={"width": 1440, "height": 1000})
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

                _sign_in(page, server.url, key)
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
                # The window: nothing in this session records one, and the page says so.
                expect(page.locator("#window-source")).to_have_attribute("data-source", "default")
                expect(page.locator("#window-source")).to_contain_text("Nothing in this session")

                # Why history was cut although the prompt is far under its budget, and the
                # notes once each (the pruner gave one of them twice).
                given = [*next_prompt["notes"], *next_prompt["prune"]["notes"]]
                assert len(set(given)) < len(given)
                notes = page.locator("#composition-notes li")
                expect(notes).to_have_count(len(set(given)))
                assert len(set(notes.all_text_contents())) == len(set(given))
                repeated = next(n for n in given if given.count(n) > 1)
                expect(notes.first).to_have_text(f"{repeated} (×{given.count(repeated)})")
                why = page.locator("#composition-why p")
                expect(why).to_have_count(3)
                expect(why.first).to_contain_text("kept cache-stable")
                expect(why.nth(2)).to_contain_text("from the provider's cache")

                _assert_clean_layout(page, 1440, tenant="acme")

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

                # Episodic search: the relevant episode, not the unrelated one.
                page.fill("#search-q", "billing rounding")
                page.click("#search-form button[type=submit]")
                expect(page.locator("#hits li")).to_have_count(1)
                expect(page.locator("#hits li").first).to_contain_text(GOAL)
                expect(page.locator("#search-status")).to_contain_text(
                    "1 less relevant episode not shown"
                )

                # A phone's width: the same page redrawn, nothing cut off or overlapping.
                page.set_viewport_size({"width": 390, "height": 900})
                _wait_for_redraw(page, 390)
                _assert_clean_layout(page, 390, tenant="acme")

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


def test_prompts_stay_visible_beside_a_300k_history_in_the_window_they_were_built_in(
    tmp_path: Path,
) -> None:
    chromium = _require_browser()
    from playwright.sync_api import expect, sync_playwright

    app = create_app(f"sqlite:///{tmp_path}/srv.db", embedder="hash")
    key = str(app.state.ctxkeep.keys.create("globex")[1])
    server = ThreadedServer(app).start()
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as api:
            r = api.post("/v1/sessions", json={"agent_id": "reader"})
            sid = r.json()["session"]["session_id"]
            api.post(
                f"/v1/sessions/{sid}/messages", json={"messages": big_history()}
            ).raise_for_status()
            steps = api.get(
                f"/v1/inspect/sessions/{sid}/steps",
                params={"max_prompt_tokens": 12_000, "reserve_output_tokens": 1_000},
            ).json()
        assert max(s["history_tokens"] for s in steps["steps"]) > 300_000
        assert 7_000 < steps["steps"][-1]["prompt_tokens"] <= 11_000

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            errors: list[str] = []
            try:
                for width in (1440, 390):
                    page = browser.new_page(viewport={"width": width, "height": 1000})
                    page.set_default_timeout(30_000)
                    expect.set_options(timeout=30_000)
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    _sign_in(page, server.url, key)
                    page.click(f"#sessions button[data-session-id='{sid}']")
                    expect(page.locator("#steps-chart .step")).to_have_count(len(steps["steps"]))
                    expect(page.locator("#composition-title")).to_contain_text("next model call")

                    # The window the replies record, not the prompt route's 8,192.
                    expect(page.locator("#max-prompt-tokens")).to_have_value("12000")
                    expect(page.locator("#reserve-output-tokens")).to_have_value("1000")
                    expect(page.locator("#window-source")).to_have_attribute(
                        "data-source", "recorded"
                    )
                    label = page.locator("#composition-bar text[data-label='window']")
                    expect(label).to_have_text("window 12,000")
                    expect(page.locator("#composition-sub")).to_contain_text(
                        "of 11,000 prompt tokens · window 12,000, 1,000 kept for the reply"
                    )

                    # Every prompt's bar is drawn tall enough to see beside the history's (on
                    # a linear axis, 8k beside 387k would be 2% of it: 4 pixels).
                    expect(page.locator("#steps-chart svg")).to_have_attribute("data-scale", "log")
                    for step in page.locator("#steps-chart .step").all():
                        box = _boxes(step, "rect.raw")[0]
                        history_px = box[3] - box[1]
                        prompt_px = sum(b[3] - b[1] for b in _boxes(step, "rect.seg"))
                        seen = (width, step.get_attribute("data-step"), prompt_px, history_px)
                        assert min(12, history_px) <= prompt_px <= history_px + 0.5, seen
                        assert prompt_px >= history_px / 4, seen

                    expect(page.locator("#composition-why p")).to_have_count(3)
                    _assert_clean_layout(page, width, tenant="globex")
                    shot = tmp_path / f"inspector-300k-{width}.png"
                    page.screenshot(path=str(shot))
                    if os.environ.get("CTXKEEP_SCREENSHOT_DIR"):
                        shutil.copy(shot, Path(os.environ["CTXKEEP_SCREENSHOT_DIR"]) / shot.name)
                    page.close()
                assert errors == []
            finally:
                browser.close()
    finally:
        server.stop()


# -- helpers ------------------------------------------------------------------------------------

Box = tuple[float, float, float, float]
"""left, top, right, bottom, in CSS pixels of the viewport."""


def _sign_in(page: Any, url: str, key: str) -> None:
    page.goto(url + "/")
    page.fill("#api-key", key)
    page.click("#login-form button[type=submit]")


def _boxes(scope: Any, selector: str) -> list[Box]:
    """The bounding boxes of what ``selector`` finds in ``scope`` (a page or a locator)."""
    found = scope.locator(selector).evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect();"
        " return [r.left, r.top, r.right, r.bottom]; })"
    )
    return [tuple(b) for b in found]


def _overlapping(boxes: list[Box]) -> list[tuple[Box, Box]]:
    """The pairs of boxes that share more than a hair (0.5 px) of area."""
    return [
        (a, b)
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5
    ]


def _inside(box: Box, outer: Box) -> bool:
    return (
        box[0] >= outer[0] - 0.5
        and box[1] >= outer[1] - 0.5
        and box[2] <= outer[2] + 0.5
        and box[3] <= outer[3] + 0.5
    )


def _wait_for_redraw(page: Any, width: int) -> None:
    """Until the charts are drawn again for a viewport ``width`` wide."""
    page.wait_for_function(
        "w => [...document.querySelectorAll('#steps-chart svg, #composition-bar svg')]"
        ".every(s => Number(s.getAttribute('width')) < w)",
        arg=width,
    )


def _assert_clean_layout(page: Any, width: int, *, tenant: str) -> None:
    """Nothing cut off at ``width``, no label over another, the header naming ``tenant``."""
    from playwright.sync_api import expect

    assert page.evaluate("document.documentElement.scrollWidth") <= width
    (main,) = _boxes(page, ".main")
    assert main[0] >= 0 and main[2] <= width, (width, main)

    # The header names the tenant; its title, tenant line and button are apart and in view.
    expect(page.locator("header.top #who")).to_contain_text(f"tenant {tenant}")
    head = [b for sel in ("header.top h1", "#who", "#signout") for b in _boxes(page, sel)]
    assert len(head) == 3 and _overlapping(head) == [], (width, head)
    assert all(b[0] >= 0 and b[2] <= width for b in head), (width, head)

    # The composition bar's labels: 0, the budget and the window, apart, under the bar.
    (bar,) = _boxes(page, "#composition-bar svg")
    labels = _boxes(page, "#composition-bar text.axis-label")
    assert len(labels) == 3 and _overlapping(labels) == [], (width, labels)
    assert all(_inside(b, bar) for b in labels), (width, bar, labels)
    inside = _boxes(page, "#composition-bar text.inside")
    assert _overlapping(inside) == [], (width, inside)

    # The steps chart: step numbers, axis titles, the budget's label and the y axis apart.
    (chart,) = _boxes(page, "#steps-chart svg")
    assert chart[2] <= width
    ticks = _boxes(page, "#steps-chart text.tick-x")
    assert len(ticks) >= 2, (width, ticks)
    texts = [
        *ticks,
        *_boxes(page, "#steps-chart text.tick-y"),
        *_boxes(page, "#steps-chart text.axis-title"),
        *_boxes(page, "#steps-chart text.budget-label"),
    ]
    assert _overlapping(texts) == [], (width, _overlapping(texts))
    assert all(_inside(b, chart) for b in texts), (width, chart)


def _bar(page: Any) -> dict[str, int]:
    """The composition bar's segments as drawn: section -> tokens."""
    rects = page.locator("#composition-bar rect[data-section]")
    return {
        str(r.get_attribute("data-section")): int(str(r.get_attribute("data-tokens")))
        for r in rects.all()
    }
