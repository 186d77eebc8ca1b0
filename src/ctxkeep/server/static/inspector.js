// ctxkeep inspector: reads the /v1 JSON API with the tab's API key, draws with inline SVG.
// No framework, nothing loaded from elsewhere; all text goes in through textContent.
(() => {
  "use strict";

  const KEY = "ctxkeep.apiKey";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const SECTIONS = ["system", "fabric", "prior_context", "history", "tools", "summary", "priming"];
  const LABELS = {
    system: "system",
    fabric: "fabric view",
    prior_context: "prior context",
    history: "history",
    tools: "tool outputs",
    summary: "summary",
    priming: "reply priming",
    reserve: "reserve for the reply",
    free: "unused",
  };
  const SHORT = { prior_context: "prior", priming: "priming", reserve: "reserve", tools: "tools" };
  const ACTIONS = ["kept", "compressed", "dropped", "summarised"];

  const $ = (id) => document.getElementById(id);
  const state = {
    key: null,
    sessions: [],
    session: null,
    messages: [],
    steps: null,
    composition: null,
    window: null, // the window the session's prompts were built with, and where it was found
    artifacts: new Map(), // ref -> full text, fetched on demand
    open: new Set(), // refs whose full text is shown
  };

  // -- DOM helpers ------------------------------------------------------------------------------

  function fill(node, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.setAttribute("class", v);
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : String(c));
    }
    return node;
  }
  const el = (tag, attrs, ...children) => fill(document.createElement(tag), attrs, children);
  const svg = (tag, attrs, ...children) =>
    fill(document.createElementNS(SVG_NS, tag), attrs, children);

  // Text is measured with the page's own font, so labels can be laid out before they are
  // drawn: a label that would overlap another goes to the next row, or is left out.
  let measurer = null;
  function textWidth(text, px = 11) {
    if (!measurer) measurer = document.createElement("canvas").getContext("2d");
    measurer.font = `${px}px ${getComputedStyle(document.documentElement).fontFamily}`;
    return measurer.measureText(text).width;
  }
  // The horizontal extent of a label drawn at x with an SVG text-anchor, kept inside [lo, hi].
  function extent(label, lo, hi) {
    const w = textWidth(label.text);
    let left = label.anchor === "end" ? label.x - w : label.anchor === "middle" ? label.x - w / 2 : label.x;
    left = Math.max(lo, Math.min(left, hi - w));
    return { left, right: left + w };
  }
  // Labels in rows, in priority order: each takes the first row where it overlaps nothing
  // (a gap of `gap` pixels kept), at most `rows` rows; one that fits no row is left out.
  function placeLabels(labels, lo, hi, rows = 1, gap = 6) {
    const taken = Array.from({ length: rows }, () => []);
    const placed = [];
    for (const label of labels) {
      const box = extent(label, lo, hi);
      const row = taken.findIndex((spans) =>
        spans.every((s) => box.right + gap <= s.left || box.left >= s.right + gap),
      );
      if (row < 0) continue;
      taken[row].push(box);
      placed.push({ ...label, row, x: box.left, anchor: "start" });
    }
    return placed;
  }
  const widthOf = (node, fallback) => Math.max(240, Math.floor(node.clientWidth || fallback));

  const fmt = (n) => Number(n).toLocaleString("en-US");
  function short(n) {
    if (n >= 1e6) return `${+(n / 1e6).toFixed(1)}M`;
    if (n >= 1e4) return `${Math.round(n / 1e3)}k`;
    if (n >= 1e3) return `${+(n / 1e3).toFixed(1)}k`;
    return String(n);
  }
  function niceStep(raw) {
    const mag = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
    return [1, 2, 2.5, 5, 10].map((f) => f * mag).find((x) => x >= raw);
  }
  function ago(unix) {
    const s = Math.max(0, Date.now() / 1000 - unix);
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return when(unix);
  }
  function when(t) {
    const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
    return Number.isNaN(d.getTime()) ? String(t) : d.toISOString().slice(0, 16).replace("T", " ");
  }
  const plural = (n, word) => `${fmt(n)} ${word}${n === 1 ? "" : "s"}`;
  function textOf(content) {
    if (content === null || content === undefined) return "";
    if (typeof content === "string") return content;
    return content
      .filter((p) => p && (p.type === "text" || p.type === "input_text"))
      .map((p) => String(p.text || ""))
      .join("\n");
  }
  function prettyArgs(args) {
    try {
      return JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      return args;
    }
  }

  // -- the API ----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail, problem) {
      super(detail);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.key}`, Accept: "application/json" };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try {
      data = await r.json();
    } catch {
      data = null;
    }
    if (!r.ok) {
      const detail = (data && (data.detail || data.title)) || `${r.status} ${r.statusText}`;
      if (r.status === 401) signOut(detail);
      throw new ApiError(r.status, detail, data);
    }
    return data;
  }

  const enc = encodeURIComponent;

  function buildQuery(extra) {
    const q = new URLSearchParams({
      max_prompt_tokens: $("max-prompt-tokens").value,
      reserve_output_tokens: $("reserve-output-tokens").value,
      preserve_last_n: $("preserve-last-n").value,
    });
    for (const [k, v] of Object.entries(extra || {})) if (v !== null && v !== undefined) q.set(k, v);
    return q.toString();
  }

  function showError(err) {
    const box = $("error");
    if (!err) {
      box.hidden = true;
      box.textContent = "";
      return;
    }
    box.textContent = err.message || String(err);
    box.hidden = false;
  }

  // -- sign in ----------------------------------------------------------------------------------

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    state.key = null;
    $("app").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    document.title = "ctxkeep inspector";
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("api-key").value = "";
    $("api-key").focus();
  }

  async function signIn(key) {
    state.key = key;
    const who = await api("GET", "/v1/inspect/tenant");
    sessionStorage.setItem(KEY, key);
    $("login").hidden = true;
    $("app").hidden = false;
    $("signout").hidden = false;
    $("who").replaceChildren(
      "tenant ",
      el("strong", { id: "tenant", text: who.tenant }),
      ` · ${plural(who.sessions, "session")} stored`,
    );
    document.title = `ctxkeep inspector · ${who.tenant}`;
    await loadSessions();
    const wanted = new URLSearchParams(location.hash.slice(1)).get("session");
    if (wanted) await openSession(wanted);
  }

  // -- sessions ---------------------------------------------------------------------------------

  async function loadSessions() {
    const page = await api("GET", "/v1/sessions?limit=200");
    state.sessions = page.sessions;
    renderSessions();
  }

  function renderSessions() {
    const list = $("sessions");
    list.replaceChildren(
      ...state.sessions.map((s) =>
        el(
          "li",
          {},
          el(
            "button",
            {
              type: "button",
              class: state.session && state.session.session_id === s.session_id ? "current" : "",
              "data-session-id": s.session_id,
              onclick: () => openSession(s.session_id),
            },
            el("span", { class: "agent", text: s.agent_id }),
            el("span", { class: "sid mono", text: s.session_id }),
            el("span", {
              class: "stat",
              text: `${plural(s.message_count, "message")} · ${ago(s.accessed_at)}`,
            }),
          ),
        ),
      ),
    );
    $("sessions-empty").hidden = state.sessions.length > 0;
  }

  async function openSession(id) {
    showError(null);
    try {
      const [one, page, win] = await Promise.all([
        api("GET", `/v1/sessions/${enc(id)}`),
        api("GET", `/v1/sessions/${enc(id)}/messages`),
        api("GET", `/v1/inspect/sessions/${enc(id)}/window`),
      ]);
      state.session = one.session;
      state.messages = page.messages;
      state.window = win;
      $("max-prompt-tokens").value = win.max_prompt_tokens;
      $("reserve-output-tokens").value = win.reserve_output_tokens;
      state.steps = null;
      state.composition = null;
      state.open.clear();
      history.replaceState(null, "", `#session=${enc(id)}`);
      $("empty").hidden = true;
      $("session").hidden = false;
      $("composition").hidden = true;
      renderSessions();
      renderHead();
      renderTimeline();
      await rebuild(null);
    } catch (err) {
      showError(err);
    }
  }

  function renderHead() {
    const s = state.session;
    $("session-title").textContent = `${s.agent_id} · ${s.session_id}`;
    const items = [
      ["task", s.task_id || "none"],
      ["messages", fmt(state.messages.length)],
      ["created", ago(s.created_at)],
      ["last used", ago(s.accessed_at)],
      ["waiting calls", s.pending.length ? s.pending.join(", ") : "none"],
    ];
    $("session-meta").replaceChildren(
      ...items.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v }))),
    );
  }

  // -- steps and composition --------------------------------------------------------------------

  function renderWindowSource() {
    const w = state.window;
    const line = $("window-source");
    if (!w) {
      line.textContent = "";
      return;
    }
    const asked = Number($("max-prompt-tokens").value);
    const reserve = Number($("reserve-output-tokens").value);
    const same = asked === w.max_prompt_tokens && reserve === w.reserve_output_tokens;
    line.setAttribute("data-source", same ? w.source : "set here");
    line.textContent = same
      ? w.explanation
      : `The window set here, not the session's own: ${fmt(w.max_prompt_tokens)} ` +
        `tokens, ${fmt(w.reserve_output_tokens)} kept for the reply (${w.explanation})`;
  }

  async function rebuild(at) {
    renderWindowSource();
    const id = state.session.session_id;
    state.steps = await api("GET", `/v1/inspect/sessions/${enc(id)}/steps?${buildQuery()}`);
    renderSteps();
    await openComposition(at);
  }

  async function openComposition(at, reveal = false) {
    showError(null);
    const id = state.session.session_id;
    try {
      state.composition = await api(
        "GET",
        `/v1/inspect/sessions/${enc(id)}/composition?${buildQuery({ at })}`,
      );
    } catch (err) {
      state.composition = null;
      $("composition").hidden = true;
      renderTimeline();
      showError(err);
      return;
    }
    renderComposition();
    renderTimeline();
    markStep();
    if (reveal) $("composition").scrollIntoView({ block: "start" });
  }

  function stepOf(at) {
    return state.steps ? state.steps.steps.find((s) => s.at === at) : undefined;
  }

  // The y axis of the steps chart: linear, or logarithmic when the history grows so far past
  // the prompt budget that the prompts' bars would be a few pixels high (a 300k history beside
  // 7k prompts); then each prompt's bar is split among its sections by their shares.
  function stepsScale(data, top, base, ph) {
    const prompts = data.steps.map((s) => s.prompt_tokens || 0);
    const promptTop = Math.max(data.prompt_budget, ...prompts);
    if (promptTop / top >= 0.2) {
      const tick = niceStep(top / 4);
      const yMax = Math.ceil((top * 1.02) / tick) * tick;
      const ticks = [];
      for (let v = 0; v <= yMax; v += tick) ticks.push(v);
      return { log: false, ticks, y: (v) => base - (ph * v) / yMax };
    }
    const positive = [...data.steps.map((s) => s.history_tokens), ...prompts].filter((v) => v > 0);
    const lo = 10 ** Math.floor(Math.log10(Math.max(1, Math.min(data.prompt_budget, ...positive))));
    const hi = 10 ** Math.ceil(Math.log10(top * 1.02));
    const span = Math.log10(hi / lo);
    const ticks = [];
    for (let v = lo; v <= hi; v *= 10) ticks.push(v);
    return {
      log: true,
      ticks,
      y: (v) => base - (ph * Math.log10(Math.max(v, lo) / lo)) / span,
    };
  }

  function renderSteps() {
    const data = state.steps;
    const box = $("steps-chart");
    if (!data || !data.steps.length) {
      box.replaceChildren(el("p", { class: "muted", text: "No steps yet." }));
      return;
    }
    const W = widthOf(box, 1000);
    const H = 260;
    const m = { l: 46, r: 10, t: 26, b: 42 };
    const pw = W - m.l - m.r;
    const ph = H - m.t - m.b;
    const base = m.t + ph;
    const steps = data.steps;
    const top = Math.max(
      data.prompt_budget,
      ...steps.map((s) => s.history_tokens),
      ...steps.map((s) => s.prompt_tokens || 0),
      1,
    );
    const scale = stepsScale(data, top, base, ph);
    const y = scale.y;
    const band = pw / steps.length;
    const bw = Math.max(2, Math.min(34, band * 0.72));
    const g = svg("svg", {
      width: W,
      height: H,
      viewBox: `0 0 ${W} ${H}`,
      role: "img",
      "aria-label": "Tokens per step",
      "data-scale": scale.log ? "log" : "linear",
    });
    for (const v of scale.ticks) {
      g.append(
        svg("line", { class: "axis", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }),
        svg("text", { class: "tick-y", x: m.l - 6, y: y(v) + 4, "text-anchor": "end", text: short(v) }),
      );
    }
    // Step numbers under the bars: every `every` step (a round number), the first and the
    // last first; one that would touch a neighbour is left out.
    const widest = textWidth(String(steps[steps.length - 1].step)) + 8;
    const every = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000].find((k) => k * band >= widest) || 1000;
    const cx = (i) => m.l + band * i + band / 2;
    const wanted = [steps.length - 1, 0, ...steps.map((_, i) => i).filter((i) => steps[i].step % every === 0)];
    const ticks = placeLabels(
      [...new Set(wanted)].map((i) => ({ x: cx(i), anchor: "middle", text: String(steps[i].step), i })),
      0,
      W,
    );
    const tickAt = new Map(ticks.map((t) => [t.i, t]));
    steps.forEach((s, i) => {
      const group = svg(
        "g",
        {
          class: "step",
          "data-step": s.step,
          "data-at": s.at,
          onclick: () => openComposition(s.at),
        },
        svg("title", {
          text:
            `step ${s.step} (turn ${s.turn}, before message #${s.at}): history ${fmt(s.history_tokens)} tokens, ` +
            (s.prompt_tokens === null
              ? `no prompt fits: ${s.error}`
              : `prompt ${fmt(s.prompt_tokens)} tokens (${s.compressed} compressed, ${s.dropped} dropped)`),
        }),
        svg("rect", { class: "hit", x: m.l + band * i, y: m.t, width: band, height: ph }),
        svg("rect", {
          class: "raw",
          x: cx(i) - bw / 2,
          y: y(s.history_tokens),
          width: bw,
          height: base - y(s.history_tokens),
        }),
      );
      if (s.prompt_tokens === null) {
        group.append(svg("rect", { class: "failed", x: cx(i) - bw / 4, y: base - 6, width: bw / 2, height: 6 }));
      } else {
        const height = base - y(s.prompt_tokens);
        let acc = 0;
        for (const sec of SECTIONS) {
          const v = s.sections[sec] || 0;
          if (!v) continue;
          const h = (height * v) / s.prompt_tokens;
          group.append(
            svg("rect", {
              class: `seg sec-${sec}`,
              x: cx(i) - bw / 4,
              y: base - acc - h,
              width: bw / 2,
              height: h,
            }),
          );
          acc += h;
        }
      }
      const t = tickAt.get(i);
      if (t) group.append(svg("text", { class: "tick-x", x: t.x, y: base + 15, text: t.text }));
      g.append(group);
    });
    const title = scale.log ? "tokens (log scale)" : "tokens";
    const by = y(data.prompt_budget);
    const budgetText = `prompt budget ${fmt(data.prompt_budget)}`;
    // Above the line, unless that would run into the axis title: then below it.
    const titleRight = 4 + textWidth(title);
    const budgetLeft = W - m.r - textWidth(budgetText);
    const above = by - 5 - 11 > 16 || budgetLeft > titleRight + 6;
    g.append(
      svg("line", { class: "budget-line", x1: m.l, x2: W - m.r, y1: by, y2: by }),
      svg("text", {
        class: "budget-label",
        x: W - m.r,
        y: above ? by - 5 : by + 14,
        "text-anchor": "end",
        text: budgetText,
      }),
      svg("text", { class: "axis-title", x: 4, y: 14, text: title }),
      svg("text", { class: "axis-title", x: m.l, y: H - 6, text: "step (model call)" }),
      svg("line", { class: "axis", x1: m.l, x2: W - m.r, y1: base, y2: base }),
    );
    const notes = [];
    if (scale.log) {
      notes.push(
        el("p", {
          class: "muted scale-note",
          text:
            `Log scale: the history (up to ${fmt(top)} tokens) is ${Math.round(top / data.prompt_budget)}× ` +
            "the prompt budget; each prompt's bar is split among its sections by their shares.",
        }),
      );
    }
    if (data.first_step) {
      notes.push(el("p", { class: "muted", text: `${data.first_step} older steps not shown.` }));
    }
    box.replaceChildren(g, ...notes);
  }

  function markStep() {
    const at = state.composition ? state.composition.at : null;
    for (const node of document.querySelectorAll("#steps-chart .step")) {
      node.classList.toggle("selected", Number(node.getAttribute("data-at")) === at);
    }
  }

  function renderComposition() {
    const c = state.composition;
    const r = c.report;
    const step = stepOf(c.at);
    const turnOf = c.at < state.messages.length ? turnIndex(c.at) : null;
    const budget = r.max_prompt_tokens - r.reserve_output_tokens;
    $("composition").hidden = false; // drawn to its width: shown first
    $("composition-title").textContent =
      c.at === c.total
        ? "Prompt composition: the next model call"
        : `Prompt composition: the call before message #${c.at}`;
    $("composition-sub").textContent =
      `${fmt(r.prompt_tokens)} of ${fmt(budget)} prompt tokens` +
      ` · window ${fmt(r.max_prompt_tokens)}, ${fmt(r.reserve_output_tokens)} kept for the reply` +
      ` · built from ${fmt(c.at)} of ${fmt(c.total)} messages` +
      (step ? ` · step ${step.step}` : "") +
      (turnOf !== null ? ` · turn ${turnOf}` : "");
    const parts = SECTIONS.filter((s) => (r.sections[s] || 0) > 0).map((s) => [s, r.sections[s]]);
    // The window as laid out: the prompt, the budget it left unused, then the reply's reserve.
    const free = Math.max(0, r.max_prompt_tokens - r.prompt_tokens - r.reserve_output_tokens);
    if (free) parts.push(["free", free]);
    parts.push(["reserve", r.reserve_output_tokens]);

    const W = widthOf($("composition-bar"), 1000);
    const barY = 6;
    const barH = 46;
    const scale = W / r.max_prompt_tokens;
    const bx = budget * scale;
    // The axis labels in as many rows as they need: the budget and the window's labels sit
    // close together when the reserve is a small part of the window.
    const labels = placeLabels(
      [
        { key: "budget", x: bx, anchor: "middle", text: `budget ${fmt(budget)}` },
        { key: "window", x: W, anchor: "end", text: `window ${fmt(r.max_prompt_tokens)}` },
        { key: "zero", x: 0, anchor: "start", text: "0" },
      ],
      0,
      W,
      3,
    );
    const rows = Math.max(...labels.map((l) => l.row)) + 1;
    const H = barY + barH + 6 + rows * 15;
    const g = svg("svg", {
      width: W,
      height: H,
      viewBox: `0 0 ${W} ${H}`,
      role: "img",
      "aria-label": "Prompt composition by section",
    });
    let x = 0;
    for (const [sec, tokens] of parts) {
      const w = tokens * scale;
      const label = `${LABELS[sec]}: ${fmt(tokens)} tokens`;
      g.append(
        svg(
          "rect",
          {
            class: `seg sec-${sec}`,
            x,
            y: barY,
            width: Math.max(w, 0),
            height: barH,
            "data-section": sec,
            "data-tokens": tokens,
          },
          svg("title", { text: label }),
        ),
      );
      const room = (text) => textWidth(text) * 1.1 + 12; // the labels inside are bold
      const name = w >= room(LABELS[sec]) ? LABELS[sec] : SHORT[sec] || LABELS[sec];
      if (sec !== "free" && w >= Math.max(room(name), room(short(tokens)))) {
        g.append(svg("text", { class: "inside", x: x + 6, y: barY + 19, text: name }));
        g.append(svg("text", { class: "inside", x: x + 6, y: barY + 36, text: short(tokens) }));
      }
      x += w;
    }
    g.append(
      svg("rect", { class: "frame", x: 0.5, y: barY, width: W - 1, height: barH }),
      svg("line", { class: "budget-mark", x1: bx, x2: bx, y1: barY - 4, y2: barY + barH + 4 }),
      ...labels.map((l) =>
        svg("text", {
          class: "axis-label",
          "data-label": l.key,
          x: l.x,
          y: barY + barH + 17 + l.row * 15,
          text: l.text,
        }),
      ),
    );
    $("composition-bar").replaceChildren(g);

    $("composition-legend").replaceChildren(
      ...parts.map(([sec, tokens]) =>
        el(
          "li",
          { "data-section": sec, "data-tokens": tokens },
          el("span", { class: `swatch sec-${sec}` }),
          el("span", { text: LABELS[sec] }),
          el("span", { class: "tokens", text: fmt(tokens) }),
          el("span", {
            class: "muted",
            text: `${((100 * tokens) / r.max_prompt_tokens).toFixed(1)}%`,
          }),
        ),
      ),
    );
    const p = r.prune;
    $("composition-counts").replaceChildren(
      ...ACTIONS.filter((a) => p[a] > 0 || a !== "summarised").map((a) =>
        el("li", { "data-action": a }, el("span", { class: `badge act-${a}`, text: a }), ` ${plural(p[a], "message")}`),
      ),
      el("li", { text: `history ${fmt(p.tokens_before)} tokens as stored → ${fmt(p.tokens_after)} pruned` }),
    );
    $("composition-why").replaceChildren(...c.explanation.map((t) => el("p", { text: t })));
    $("composition-why").hidden = c.explanation.length === 0;
    $("composition-notes").replaceChildren(
      ...c.notes.map((n) =>
        el("li", { "data-count": n.count, text: n.count > 1 ? `${n.text} (×${n.count})` : n.text }),
      ),
    );
  }

  // -- timeline ---------------------------------------------------------------------------------

  function turnIndex(i) {
    let n = 0;
    for (let j = 0; j <= i && j < state.messages.length; j++) if (state.messages[j].role === "user") n++;
    return n;
  }

  function groupTurns(messages) {
    const turns = [];
    let cur = null;
    messages.forEach((m, i) => {
      if (!cur || m.role === "user") {
        cur = { n: m.role === "user" ? turns.filter((t) => t.n > 0).length + 1 : 0, start: i, items: [] };
        turns.push(cur);
      }
      const last = cur.items[cur.items.length - 1];
      if (
        m.role === "tool" &&
        last &&
        last.kind === "group" &&
        last.calls.has(m.tool_call_id)
      ) {
        last.indexes.push(i);
      } else if (m.role === "assistant" && m.tool_calls && m.tool_calls.length) {
        cur.items.push({ kind: "group", indexes: [i], calls: new Set(m.tool_calls.map((c) => c.id)) });
      } else {
        cur.items.push({ kind: "one", indexes: [i] });
      }
      cur.end = i + 1;
    });
    return turns;
  }

  function renderTimeline() {
    const msgs = state.messages;
    const c = state.composition;
    const decisions = new Map();
    if (c) for (const d of c.decisions) decisions.set(d.index, d);
    const tokens = new Map();
    if (state.steps) for (const t of state.steps.messages) tokens.set(t.index, t.tokens);
    $("timeline-sub").textContent = c
      ? `Badges: what pruning did with each message in the prompt shown above (${c.at === c.total ? "the next call" : `before message #${c.at}`}).`
      : "";
    const turns = groupTurns(msgs);
    $("timeline").replaceChildren(
      ...turns.map((t) => {
        const firstCall = t.items.flatMap((it) => it.indexes).find((i) => msgs[i].role === "assistant");
        const at = firstCall ?? t.end; // a turn with no model call yet: the prompt after it
        return el(
          "li",
          { class: "turn", "data-turn": t.n },
          el(
            "div",
            { class: "turn-head" },
            el("h4", { text: t.n ? `Turn ${t.n}` : "Before the first user message" }),
            el("span", {
              class: "muted",
              text: t.end - t.start === 1 ? `message #${t.start}` : `messages #${t.start}–#${t.end - 1}`,
            }),
            el("button", {
              type: "button",
              class: "quiet turn-prompt",
              "data-at": at,
              text: "Prompt composition",
              title: "The prompt of this turn's first model call",
              onclick: () => openComposition(at, true),
            }),
          ),
          el(
            "ol",
            { class: "msgs" },
            ...t.items.map((it) =>
              it.kind === "group"
                ? el(
                    "li",
                    { class: "tool-group" },
                    el("ol", { class: "msgs" }, ...it.indexes.map((i) => messageCard(i, decisions, tokens))),
                  )
                : messageCard(it.indexes[0], decisions, tokens),
            ),
          ),
        );
      }),
    );
  }

  function messageCard(i, decisions, tokens) {
    const m = state.messages[i];
    const c = state.composition;
    const d = decisions.get(i);
    const later = c && i >= c.at;
    const head = el(
      "div",
      { class: "msg-head" },
      el("span", { class: "role", text: m.role }),
      el("span", { class: "muted mono", text: `#${i}` }),
      m.name ? el("span", { class: "mono", text: m.name }) : null,
      m.tool_call_id ? el("span", { class: "muted mono", text: `result of ${m.tool_call_id}` }) : null,
      tokens.has(i) ? el("span", { class: "tok", text: `${fmt(tokens.get(i))} tokens` }) : null,
      d
        ? el("span", {
            class: `badge act-${d.action}`,
            title: d.reason,
            text: d.action === "compressed" ? `compressed ${fmt(d.tokens_before)} → ${fmt(d.tokens_after)}` : d.action,
          })
        : null,
      later ? el("span", { class: "badge", text: "after this prompt" }) : null,
      d && d.action !== "compressed" ? el("span", { class: "muted", text: d.reason }) : null,
      el(
        "span",
        { class: "msg-actions" },
        m.role === "assistant"
          ? el("button", {
              type: "button",
              class: "link call-prompt",
              "data-at": i,
              text: "prompt of this call",
              onclick: () => openComposition(i, true),
            })
          : null,
      ),
    );
    const card = el(
      "li",
      {
        class: `msg role-${m.role}${d ? ` act-${d.action}` : ""}`,
        "data-index": i,
        "data-message-id": m.id || "",
      },
      head,
    );
    const text = textOf(m.content);
    if (d && d.action === "compressed") {
      card.append(
        el("div", { class: "excerpt-label", text: "In the prompt, compressed to:" }),
        el("pre", { class: "body excerpt", text: d.excerpt || "" }),
      );
      card.append(artifactBlock(d.artifact_ref));
    } else if (text) {
      card.append(el("pre", { class: "body", text }));
    }
    for (const call of m.tool_calls || []) {
      card.append(
        el(
          "div",
          { class: "call" },
          el("span", { class: "fn mono", text: `${call.name}()` }),
          el("span", { class: "muted mono", text: ` ${call.id}` }),
          el("pre", { text: prettyArgs(call.arguments) }),
        ),
      );
    }
    for (const ref of m.artifact_refs || []) {
      if (!(d && d.artifact_ref === ref)) card.append(artifactBlock(ref));
    }
    return card;
  }

  function artifactBlock(ref) {
    const box = el("div", { class: "artifact", "data-ref": ref });
    const shown = state.open.has(ref) && state.artifacts.has(ref);
    const button = el("button", {
      type: "button",
      class: "link expand-artifact",
      "data-ref": ref,
      text: shown ? "Hide the full output" : "Show the full output (from its artifact)",
      onclick: async () => {
        if (state.open.has(ref)) {
          state.open.delete(ref);
        } else {
          try {
            if (!state.artifacts.has(ref)) {
              const a = await api("GET", `/v1/artifacts/${enc(ref)}`);
              state.artifacts.set(ref, a.text);
            }
            state.open.add(ref);
          } catch (err) {
            showError(err);
            return;
          }
        }
        box.replaceWith(artifactBlock(ref));
      },
    });
    box.append(button);
    if (shown) {
      const full = state.artifacts.get(ref);
      box.append(
        el("div", { class: "artifact-label mono", text: `${ref} · ${fmt(full.length)} characters` }),
        el("pre", { class: "body full artifact-text", text: full }),
      );
    }
    return box;
  }

  // -- episodic search --------------------------------------------------------------------------

  async function search(query) {
    const status = $("search-status");
    status.textContent = "Searching…";
    $("hits").replaceChildren();
    try {
      // The inspector's search shows what `ctxkeep memory search` shows: relevant hits only.
      const res = await api("POST", "/v1/inspect/episodes/search", { query, top_k: 5 });
      const left = res.not_relevant
        ? ` (${plural(res.not_relevant, "less relevant episode")} not shown, as in ctxkeep memory search)`
        : "";
      status.textContent =
        (res.hits.length ? plural(res.hits.length, "relevant episode") : "No relevant episode.") + left;
      const known = new Set(state.sessions.map((s) => s.session_id));
      $("hits").replaceChildren(
        ...res.hits.map((h) => {
          const e = h.episode;
          const summary = e.summary.length > 280 ? `${e.summary.slice(0, 280)}…` : e.summary;
          return el(
            "li",
            { class: "hit", "data-episode-id": e.id },
            el("span", {
              class: "score",
              title: "fused score: the z-scores of the word (BM25) and meaning (cosine) scores, summed",
              text: `score ${h.score.toFixed(2)}`,
            }),
            el("div", { class: "goal", text: e.task_goal }),
            el("div", { class: "summary", text: summary }),
            el(
              "div",
              { class: "from" },
              "from ",
              known.has(e.session_id)
                ? el("button", {
                    type: "button",
                    class: "link mono",
                    text: e.session_id,
                    onclick: () => openSession(e.session_id),
                  })
                : el("span", { class: "mono", text: e.session_id }),
              ` · ${when(e.created_at)}`,
            ),
            typeof h.lexical === "number"
              ? el("div", {
                  class: "from",
                  text: `words ${h.lexical.toFixed(2)} · meaning ${h.dense.toFixed(2)}`,
                })
              : null,
          );
        }),
      );
    } catch (err) {
      status.textContent = err.message;
    }
  }

  // -- wiring -----------------------------------------------------------------------------------

  function start() {
    $("login-form").addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const key = $("api-key").value.trim();
      $("login-error").textContent = "";
      try {
        await signIn(key);
      } catch (err) {
        if (state.key) signOut(err.message);
        else $("login-error").textContent = err.message;
      }
    });
    $("signout").addEventListener("click", () => signOut(""));
    $("refresh").addEventListener("click", () => loadSessions().catch(showError));
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = $("search-q").value.trim();
      if (q) search(q);
    });
    $("budget-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (!state.session) return;
      const at = state.composition && state.composition.at < state.messages.length ? state.composition.at : null;
      rebuild(at).catch(showError);
    });
    // The charts are drawn at the width they have (their text stays readable): again on resize.
    let redraw = null;
    window.addEventListener("resize", () => {
      clearTimeout(redraw);
      redraw = setTimeout(() => {
        if (state.steps && !$("session").hidden) {
          renderSteps();
          markStep();
        }
        if (state.composition && !$("composition").hidden) renderComposition();
      }, 80);
    });
    $("max-prompt-tokens").addEventListener("input", renderWindowSource);
    $("reserve-output-tokens").addEventListener("input", renderWindowSource);
    const saved = sessionStorage.getItem(KEY);
    if (saved) signIn(saved).catch((err) => signOut(err.message));
    else signOut("");
  }

  start();
})();
