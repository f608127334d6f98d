// The results page's question browser (rcn_fast.eval.report.page): no library, no network.
// Data: gzip-compressed JSON in base64, in script blocks of type text/plain (rcn_fast.eval.report.page_data):
// blob-summary (per task, per question: [id, text, choices, gold, labels, answers, orders]),
// blob-passages ({id: text}), blob-chunk-N (traces: {lines, records}), opened only when needed.
"use strict";
(function () {
  const PAGE = 50;
  const $ = (id) => document.getElementById(id);
  const S = { data: null, passages: null, chunks: {}, task: 0, seed: 0, page: 0, rows: [] };

  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) node.append(kid);
    return node;
  }

  async function inflate(id) {
    const node = $(id);
    if (!node) throw new Error("the page has no data block " + id);
    const bin = atob(node.textContent.trim());
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  // ------------------------------------------------------------------ answers
  const task = () => S.data.tasks[S.task];
  const choiceTask = (t) => t.kind !== "open";
  const labelsOf = (q) => q[4] || q[2].map((_, i) => String.fromCharCode(65 + i));
  const answerOf = (q, p) => (q[5][p] || [])[S.seed] || null;

  function correct(t, q, p) {
    const a = answerOf(q, p);
    if (!a) return null;
    if (choiceTask(t)) return q[3] === null || q[3] === undefined ? null : a[0] === q[3];
    return a[1] === null ? null : a[1] === 1;
  }

  function predKey(t, a) {
    return choiceTask(t) ? String(a[0]) : String(a[0] || "").trim().toLowerCase();
  }

  function matches(t, q) {
    const f = $("filter").value;
    const np = t.pipelines.length;
    const answered = [...Array(np).keys()].filter((p) => answerOf(q, p));
    const ok = answered.map((p) => correct(t, q, p));
    const search = $("search").value.trim().toLowerCase();
    if (search && !(q[0].toLowerCase().includes(search) || q[1].toLowerCase().includes(search))) return false;
    if (f === "disagree") return new Set(answered.map((p) => predKey(t, answerOf(q, p)))).size > 1;
    if (f === "pair") {
      const a = Number($("fa").value), b = Number($("fb").value);
      return correct(t, q, a) === true && correct(t, q, b) === false;
    }
    if (f === "any-wrong") return ok.includes(false);
    if (f === "all-wrong") return ok.length > 0 && ok.every((x) => x === false);
    return true;
  }

  // ------------------------------------------------------------------ the list
  function fillControls() {
    const t = task();
    const seed = $("seed");
    seed.replaceChildren(...t.seeds.map((s, i) => el("option", { value: i, text: s })));
    S.seed = 0;
    for (const id of ["fa", "fb"]) $(id).replaceChildren(...t.pipelines.map((p, i) => el("option", { value: i, text: p })));
    const idx = (name) => t.pipelines.indexOf(name);
    $("fa").value = String(idx("reconnect") >= 0 ? idx("reconnect") : t.pipelines.length - 1);
    $("fb").value = String(idx("vanilla") >= 0 ? idx("vanilla") : 0);
    const head = ["#", "id", "question", "gold", ...t.pipelines];
    if (t.k) head.push(`picked in ${t.k} orders`);
    $("qhead").replaceChildren(el("tr", {}, ...head.map((h) => el("th", { text: h }))));
  }

  function refresh(keepPage) {
    const t = task();
    S.rows = t.questions.map((q, i) => i).filter((i) => matches(t, t.questions[i]));
    if (!keepPage) S.page = 0;
    const pages = Math.max(1, Math.ceil(S.rows.length / PAGE));
    S.page = Math.min(S.page, pages - 1);
    $("q-count").textContent = `${S.rows.length} of ${t.questions.length} questions`;
    $("q-count").dataset.n = S.rows.length;
    $("pageinfo").textContent = `page ${S.page + 1} of ${pages}`;
    $("prev").disabled = S.page === 0;
    $("next").disabled = S.page >= pages - 1;
    $("pair").style.display = $("filter").value === "pair" ? "" : "none";
    const body = $("qbody");
    body.replaceChildren();
    for (const i of S.rows.slice(S.page * PAGE, (S.page + 1) * PAGE)) body.append(row(t, i));
  }

  function row(t, i) {
    const q = t.questions[i];
    const labels = labelsOf(q);
    const gold = choiceTask(t) ? (q[3] === null ? "-" : labels[q[3]]) : (q[3] || []).join(" | ");
    const text = q[1].length > 160 ? q[1].slice(0, 157) + "..." : q[1];
    const tr = el("tr", { class: "qrow", "data-qid": q[0], "data-index": i },
      el("td", { text: i + 1 }), el("td", { text: q[0] }), el("td", { class: "qtext", text: text }),
      el("td", { class: "gold", text: gold }));
    t.pipelines.forEach((p, pi) => {
      const a = answerOf(q, pi);
      const ok = correct(t, q, pi);
      const shown = !a ? "failed" : choiceTask(t) ? labels[a[0]] : String(a[0] || "").slice(0, 60);
      tr.append(el("td", { class: "pred " + (ok === true ? "ok" : ok === false ? "bad" : "none"),
        "data-pipeline": p, "data-pred": a ? a[0] : "", text: shown }));
    });
    if (t.k) {
      const orders = q[6] ? q[6].map((per) => (per[S.seed] || []).map((o) => (o === null ? "?" : labels[o])).join("")) : [];
      tr.append(el("td", { class: "orders", text: orders.join(" / ") }));
    }
    tr.addEventListener("click", () => toggle(tr, t, q));
    return tr;
  }

  function toggle(tr, t, q) {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains("qdetail")) { next.remove(); tr.classList.remove("open"); return; }
    tr.classList.add("open");
    const cols = tr.children.length;
    const cell = el("td", { colspan: cols });
    tr.after(el("tr", { class: "qdetail", "data-qid": q[0] }, cell));
    detail(cell, t, q);
  }

  // ------------------------------------------------------------------ one question
  function detail(cell, t, q) {
    cell.append(el("p", { class: "qfull", text: q[1] }));
    const labels = labelsOf(q);
    if (choiceTask(t)) {
      const head = el("tr", {}, el("th", { text: "label" }), el("th", { text: "choice" }),
        ...t.pipelines.map((p) => el("th", { text: p })));
      const body = q[2].map((c, ci) => {
        const tr = el("tr", { class: ci === q[3] ? "gold" : "", "data-choice": ci },
          el("td", { class: "clabel", text: labels[ci] }), el("td", { text: c }));
        t.pipelines.forEach((p, pi) => {
          const a = answerOf(q, pi);
          const pr = a && a[1] ? a[1][ci] : null;
          const td = el("td", { class: "prob" + (a && a[0] === ci ? " picked" : ""), "data-pipeline": p,
            "data-choice": ci, "data-p": pr === null ? "" : pr });
          if (pr !== null) td.append(el("span", { class: "pbar", style: `width:${Math.round(pr * 80)}px` }),
            el("span", { class: "pval", text: pr.toFixed(4) }));
          else td.append(el("span", { class: "muted", text: a ? "no scores" : "failed" }));
          tr.append(td);
        });
        return tr;
      });
      cell.append(el("table", { class: "choices" }, el("thead", {}, head), el("tbody", {}, ...body)));
    } else {
      cell.append(el("p", { text: "gold: " + (q[3] || []).join(" | ") }));
      t.pipelines.forEach((p, pi) => {
        const a = answerOf(q, pi);
        cell.append(el("p", { class: "open-answer", "data-pipeline": p }, el("b", { text: p + ": " }),
          a ? String(a[0]) : "failed"));
      });
    }
    if (t.k && q[6]) {
      const head = el("tr", {}, el("th", { text: "pipeline" }),
        ...[...Array(t.k).keys()].map((s) => el("th", { text: s === 0 ? "plain order" : `shifted ${s}` })));
      const rows = t.pipelines.map((p, pi) => el("tr", {}, el("td", { text: p }),
        ...(q[6][pi][S.seed] || []).map((o) => el("td", { text: o === null ? "not answered" : `${labels[o]}: ${q[2][o]}` }))));
      cell.append(el("h4", { text: "Choice picked under each cyclic order (by its original label)" }),
        el("table", { class: "orders" }, el("thead", {}, head), el("tbody", {}, ...rows)));
    }
    t.pipelines.forEach((p, pi) => {
      const a = answerOf(q, pi);
      if (!a) return;
      const box = el("details", { class: "trace", "data-pipeline": p },
        el("summary", { text: `${p}: trace (seed ${t.seeds[S.seed]})` }));
      box.addEventListener("toggle", () => {
        if (box.open && !box.dataset.drawn) { box.dataset.drawn = "1"; drawTrace(box, a[2]); }
      });
      cell.append(box);
    });
  }

  async function drawTrace(box, ref) {
    const status = el("p", { class: "muted", text: "opening the trace..." });
    box.append(status);
    try {
      if (!S.passages) S.passages = await inflate("blob-passages");
      if (!S.chunks[ref[0]]) S.chunks[ref[0]] = await inflate("blob-chunk-" + ref[0]);
      const chunk = S.chunks[ref[0]];
      const body = decode(chunk.records[ref[1]], chunk.lines);
      status.remove();
      box.append(renderRecord(body));
    } catch (err) {
      status.textContent = "cannot open the trace: " + err;
    }
  }

  // a line of the chunk's table: its text, or [before, passage id, after] for a line quoting a passage
  function line(entry) {
    return Array.isArray(entry) ? entry[0] + (S.passages[entry[1]] || "") + entry[2] : entry;
  }

  function decode(v, lines) {
    if (Array.isArray(v)) return v.map((x) => decode(x, lines));
    if (v && typeof v === "object") {
      const keys = Object.keys(v);
      if (keys.length === 1 && keys[0] === "~" && Array.isArray(v["~"])) return v["~"].map((i) => line(lines[i])).join("\n");
      const out = {};
      for (const k of keys) if (k !== "~p") out[k] = decode(v[k], lines);
      if (v["~p"] && typeof out.id === "string") out.text = S.passages[out.id];
      return out;
    }
    return v;
  }

  // ------------------------------------------------------------------ traces
  const TRACE = window.RCN_TRACE_RENDERERS = {};
  const fmt = (x, d = 4) => (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : x === null || x === undefined ? "-" : String(x));
  const passageText = (id) => (S.passages && typeof S.passages[id] === "string" ? S.passages[id] : null);

  function renderRecord(body) {
    const out = el("div", { class: "record" });
    const trace = Array.isArray(body.trace) ? body.trace : [];
    trace.forEach((e, i) => out.append(entry(e, i)));
    if (Array.isArray(body.knowledge) && body.knowledge.length)
      out.append(el("h4", { text: "knowledge given to the answer" }), list(body.knowledge, "knowledge"));
    if (Array.isArray(body.passages) && body.passages.length)
      out.append(collapsible(`passages retrieved (${body.passages.length})`, passageTable(body.passages)));
    const rest = {};
    for (const k of Object.keys(body)) if (!["trace", "knowledge", "passages"].includes(k)) rest[k] = body[k];
    if (Object.keys(rest).length) out.append(kv(rest));
    return out;
  }

  function entry(e, i) {
    if (!e || typeof e !== "object") return el("div", { class: "stage" }, value(e));
    const box = el("div", { class: "stage", "data-type": e.type || "", "data-stage": e.stage || "" });
    const h = el("h4", { text: `${i + 1}. ${e.stage || "?"}` }, el("span", { class: "badge", text: e.type || "entry" }));
    if (e.agent !== undefined) h.append(el("span", { class: "badge", text: "agent " + e.agent }));
    box.append(h);
    const used = new Set(["stage", "type", "agent"]);
    const draw = TRACE[e.type];
    if (draw) {
      try { draw(e, box, used, h); } catch (err) { box.append(el("p", { class: "bad", text: "cannot draw: " + err })); }
    }
    const rest = {};
    for (const k of Object.keys(e)) if (!used.has(k)) rest[k] = e[k];
    if (Object.keys(rest).length) box.append(kv(rest));
    return box;
  }

  function take(e, used, ...keys) { keys.forEach((k) => used.add(k)); return keys.map((k) => e[k]); }

  function chat(prompt) {
    if (!Array.isArray(prompt)) return value(prompt);
    return collapsible(`prompt (${prompt.length} messages)`, el("div", {}, ...prompt.map((m) =>
      el("div", { class: "msg" }, el("div", { class: "role", text: m && m.role }), el("pre", { text: m && m.content })))));
  }

  function reasonBadge(h, r) {
    if (r === undefined || r === null) return;
    h.append(el("span", { class: "badge" + (r === "length" ? " cut" : ""), "data-finish": r,
      text: r === "length" ? "stopped at the token limit" : "finish: " + r }));
  }

  TRACE.generate = (e, box, used, h) => {
    const [prompt, output, reason, outputs, reasons, parsed, ptoks, gtoks, decoding] =
      take(e, used, "prompt", "output", "finish_reason", "outputs", "finish_reasons", "parsed", "prompt_tokens",
        "generated_tokens", "decoding");
    reasonBadge(h, reason);
    if (ptoks !== undefined || gtoks !== undefined) h.append(el("span", { class: "badge", text: `${fmt(ptoks)} prompt / ${fmt(gtoks)} generated tokens` }));
    if (decoding && typeof decoding === "object" && !Array.isArray(decoding))
      box.append(el("p", { class: "muted", text: "decoding: " + Object.entries(decoding).map(([k, v]) => `${k} ${fmt(v)}`).join(", ") }));
    else if (decoding !== undefined) box.append(kv({ decoding }));
    if (Array.isArray(reasons) && reasons.includes("length"))
      h.append(el("span", { class: "badge cut", "data-finish": "length",
        text: `${reasons.filter((r) => r === "length").length} of ${reasons.length} stopped at the token limit` }));
    box.append(chat(prompt));
    if (output !== undefined) box.append(el("div", { class: "muted", text: "output" }), el("pre", { class: "output", text: output }));
    if (Array.isArray(outputs)) box.append(el("ol", { class: "outputs" }, ...outputs.map((o, k) =>
      el("li", {}, el("pre", { text: o }), reasons ? el("span", { class: "badge" + (reasons[k] === "length" ? " cut" : ""), text: reasons[k] }) : null))));
    if (Array.isArray(parsed)) box.append(el("div", { class: "muted", text: "read from the output" }), list(parsed, "parsed"));
  };

  TRACE.score = (e, box, used) => {
    const [prompt, labels, lps] = take(e, used, "prompt", "labels", "logprobs");
    if (Array.isArray(labels) && Array.isArray(lps)) {
      const top = Math.max(...lps.filter((x) => typeof x === "number"));
      const ex = lps.map((x) => (typeof x === "number" ? Math.exp(x - top) : 0));
      const s = ex.reduce((a, b) => a + b, 0) || 1;
      box.append(table(["label", "log-prob", "probability"], labels.map((l, k) =>
        [l, fmt(lps[k]), fmt(ex[k] / s)]), "scores"));
    }
    box.append(chat(prompt));
  };

  // passages as rows: id, score, text (from the page's passages when the entry has none), and any other field
  function passageTable(ps) {
    const objs = ps.map((p) => (p && typeof p === "object" && !Array.isArray(p) ? p : { id: p }));
    const extra = objs.some((o) => Object.keys(o).some((k) => !["id", "score", "text"].includes(k)));
    return table(["#", "id", "score", "text", ...(extra ? ["more"] : [])], objs.map((o, k) => {
      const row = [k + 1, o.id, fmt(o.score), o.text !== undefined ? o.text : passageText(o.id) || ""];
      if (extra) {
        const rest = {};
        for (const key of Object.keys(o)) if (!["id", "score", "text"].includes(key)) rest[key] = o[key];
        row.push(Object.keys(rest).length ? rest : null);
      }
      return row;
    }), "passages");
  }

  TRACE.retrieve = (e, box, used) => {
    const [queries, passages, results, scores, pool] = take(e, used, "queries", "passages", "results", "scores", "pool");
    if (Array.isArray(queries)) box.append(el("div", { class: "muted", text: "queries" }), list(queries, "queries"));
    if (Array.isArray(passages)) box.append(el("div", { class: "muted", text: `passages kept (${passages.length})` }), passageTable(passages));
    if (Array.isArray(results)) box.append(collapsible("per query: the ids it retrieved, best first", table(
      ["query", "ids (score)"], results.map((ids, k) => [Array.isArray(queries) ? queries[k] : k,
        (ids || []).map((id, j) => `${id}` + (scores && scores[k] ? ` (${fmt(scores[k][j])})` : "")).join(", ")]), "per-query")));
    if (Array.isArray(pool)) box.append(el("p", { class: "muted", text: "pool: " + pool.join(", ") }));
  };

  TRACE.sample = (e, box, used) => {
    const [pool, rel, prob, subsets, draws] = take(e, used, "pool", "relevance", "probability", "subsets", "draw_probability");
    const params = ["strategy", "subset_size", "temperature", "tau", "score_scale", "sampler_tau", "first", "seed", "key"]
      .filter((k) => e[k] !== undefined);
    take(e, used, ...params);
    box.append(el("p", { class: "params", text: params.map((k) => `${k} = ${fmt(e[k])}`).join(", ") }));
    const subs = Array.isArray(subsets) ? subsets : [];
    if (Array.isArray(pool)) box.append(table(["pool passage", "relevance", "probability", "in subsets", "text"],
      pool.map((id, k) => [id, fmt(rel ? rel[k] : null), fmt(prob ? prob[k] : null),
        subs.map((s, j) => (Array.isArray(s) && s.includes(id) ? j + 1 : null)).filter((x) => x).join(", ") || "-",
        passageText(id) || ""]), "sampler"));
    if (subs.length) box.append(el("div", { class: "muted", text: "subsets drawn (in draw order)" }),
      el("ol", { class: "subsets" }, ...subs.map((s, j) => el("li", { text: (s || []).join(", ") +
        (draws && draws[j] ? "  (draw probabilities " + draws[j].map((x) => fmt(x, 3)).join(", ") + ")" : "") }))));
  };

  TRACE.combine = (e, box, used) => {
    const [agents] = take(e, used, "agents");
    if (Array.isArray(agents)) box.append(table(["agent", "answer", "log-probs"], agents.map((a) =>
      [a.agent, a.pred_label !== undefined ? a.pred_label : a.label, (a.choice_logprobs || []).map((x) => fmt(x, 3)).join(", ")]), "agents"));
  };

  // ------------------------------------------------------------------ generic
  function collapsible(title, body) {
    return el("details", { class: "more" }, el("summary", { text: title }), body);
  }

  function list(items, cls) {
    return el("ol", { class: cls }, ...items.map((x) => el("li", {}, value(x))));
  }

  function table(head, rows, cls) {
    return el("table", { class: cls }, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, value(c)))))));
  }

  function value(v) {
    if (v === null || v === undefined) return document.createTextNode("-");
    if (typeof v === "string") return v.length > 120 || v.includes("\n") ? el("pre", { text: v }) : document.createTextNode(v);
    if (typeof v !== "object") return document.createTextNode(fmt(v));
    if (Array.isArray(v)) {
      if (v.every((x) => x === null || typeof x !== "object") && v.join(", ").length < 160 && !v.some((x) => typeof x === "string" && x.includes("\n")))
        return document.createTextNode("[" + v.map((x) => fmt(x)).join(", ") + "]");
      return collapsible(`list of ${v.length}`, list(v, "generic"));
    }
    return kv(v);
  }

  function kv(obj) {
    const keys = Object.keys(obj);
    const t = el("table", { class: "kv generic" }, el("tbody", {}, ...keys.map((k) =>
      el("tr", { "data-key": k }, el("td", { text: k }), el("td", {}, value(obj[k]))))));
    return keys.length > 6 ? collapsible(`${keys.length} fields`, t) : t;
  }

  // ------------------------------------------------------------------ start
  async function start() {
    const status = $("status");
    if (typeof DecompressionStream === "undefined") {
      status.textContent = "This browser cannot open the page's data (it has no DecompressionStream); use a current Chromium, Firefox or Safari.";
      return;
    }
    S.data = await inflate("blob-summary");
    $("task").replaceChildren(...S.data.tasks.map((t, i) => el("option", { value: i, text: `${t.name} (${t.questions.length})` })));
    if (!S.data.tasks.length) { status.textContent = "No task."; return; }
    fillControls();
    $("task").addEventListener("change", () => { S.task = Number($("task").value); fillControls(); refresh(); });
    $("seed").addEventListener("change", () => { S.seed = Number($("seed").value); refresh(true); });
    for (const id of ["filter", "fa", "fb"]) $(id).addEventListener("change", () => refresh());
    $("search").addEventListener("input", () => refresh());
    $("swap").addEventListener("click", () => { const a = $("fa").value; $("fa").value = $("fb").value; $("fb").value = a; refresh(); });
    $("prev").addEventListener("click", () => { S.page -= 1; refresh(true); });
    $("next").addEventListener("click", () => { S.page += 1; refresh(true); });
    refresh();
    document.body.dataset.ready = "1";
  }

  start().catch((err) => { $("status").textContent = "cannot open the page's data: " + err; document.body.dataset.ready = "error"; });
})();
