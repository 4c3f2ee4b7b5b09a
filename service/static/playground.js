"use strict";
// The berth playground: lists GET /v1/models, builds the chosen model's form from the routes the listing
// gives for it (their input fields and response schemas), posts it to the route and draws the result. Only
// the public HTTP API is used. The API key, when the server asks
// for one, stays in this tab's sessionStorage (never localStorage). User text is only ever inserted as
// text nodes, never as HTML.

const $ = (id) => document.getElementById(id);
const KEY = "berth-api-key";
const TIMINGS = [["x-total-time", "total"], ["x-tokenization-time", "tokenization"],
                 ["x-queue-time", "queue"], ["x-inference-time", "inference"]];
let models = [];
let form = null; // the chosen model's form: its fields, main action and extra actions

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let data = null;
  try { data = await response.json(); } catch { /* an empty or non-JSON body */ }
  return { ok: response.ok, status: response.status, data, headers: response.headers };
}

// Offsets from the API are Python str indices (code points); JS strings index UTF-16 units.
const codePoints = (text) => Array.from(text);
const slice = (points, start, end) => points.slice(start, end).join("");
const lines = (text) => text.split("\n").map((s) => s.trim()).filter(Boolean);
const fmt = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : String(x));
const pct = (x) => (100 * x).toFixed(1) + "%";

function bar(label, fraction, text) {
  const fill = el("span", { class: "fill" });
  fill.style.width = (100 * Math.max(0, Math.min(1, fraction || 0))).toFixed(1) + "%";
  return el("div", { class: "bar-row" }, el("span", { class: "bar-label" }, label),
            el("span", { class: "bar", "aria-hidden": "true" }, fill), el("span", { class: "bar-value" }, text));
}

// A span of `text` highlighted with its visible type label and its score on hover (and in the title).
function mark(points, start, end, tag, score, colour) {
  return el("mark", { class: "c" + colour, title: `${tag} (score ${fmt(score)})`, tabindex: "0" },
            el("span", { class: "span-text" }, slice(points, start, end)), el("span", { class: "tag" }, tag));
}

function highlighted(text, spans) {
  const points = codePoints(text);
  const out = el("p", { class: "highlighted" });
  let at = 0;
  for (const s of [...spans].sort((a, b) => a.start - b.start)) {
    if (s.start < at) continue; // overlapping spans: keep the first
    out.append(slice(points, at, s.start), mark(points, s.start, s.end, s.tag, s.score, s.colour));
    at = s.end;
  }
  out.append(slice(points, at, points.length));
  return out;
}

function renderLabels(result) {
  const entries = Array.isArray(result) ? result : [result];
  const out = [];
  if (entries.length === 1 && entries[0].label == null) { // regression: one number
    out.push(el("p", { class: "big" }, "Score ", el("strong", { class: "score" }, fmt(entries[0].score))),
             bar("0 to 5", entries[0].score / 5, fmt(entries[0].score)));
  } else {
    for (const e of entries) out.push(bar(e.label, e.score, pct(e.score)));
  }
  if (entries[0].truncated) out.push(el("p", { class: "hint" }, "The input was truncated to the model's length."));
  return out;
}

function entityTypes(model) {
  return [...new Set((model.labels || []).filter((l) => l !== "O").map((l) => l.replace(/^[BIES]-/, "")))];
}

function renderEntities(result, values, model) {
  const types = entityTypes(model);
  const entities = Array.isArray(result) ? result : [];
  const spans = entities.map((e) => {
    const tag = e.entity_group || e.entity;
    return { start: e.start, end: e.end, tag, score: e.score, colour: Math.max(0, types.indexOf(tag)) % 6 };
  });
  if (!entities.length) return [el("p", {}, "No entities found.")];
  const rows = entities.map((e) => el("tr", {}, el("td", {}, e.entity_group || e.entity), el("td", {}, e.text),
                                      el("td", {}, fmt(e.score)), el("td", {}, `${e.start}–${e.end}`)));
  return [highlighted(values.text, spans),
          el("table", {}, el("caption", {}, "Entities"),
             el("thead", {}, el("tr", {}, ...["type", "text", "score", "characters"]
               .map((h) => el("th", { scope: "col" }, h)))),
             el("tbody", {}, ...rows))];
}

function renderAnswers(result, values) {
  const answers = Array.isArray(result) ? result : [result];
  const best = answers[0];
  const say = (a) => (a.is_impossible ? "(no answer)" : a.answer);
  const out = [el("p", { class: "big" }, "Answer: ", el("strong", { class: "answer" }, say(best)),
                  ` (score ${fmt(best.score)})`)];
  out.push(best.is_impossible ? el("p", {}, values.context)
    : highlighted(values.context, [{ start: best.start, end: best.end, tag: "answer", score: best.score, colour: 0 }]));
  out.push(el("h2", {}, `Top ${answers.length}`),
           el("ol", { class: "top-k" },
              ...answers.map((a) => el("li", {}, el("span", {}, say(a)), ` — score ${fmt(a.score)}`))));
  return out;
}

// /v1/similarity: one score per target, as numbers, {score} objects or {scores: [...]}.
function renderSimilarity(result, values, model, data) {
  const first = data.results[0];
  const raw = typeof first === "number" || (first && !Array.isArray(first) && "score" in first) ? data.results : first;
  const list = Array.isArray(raw) ? raw : (raw && (raw.scores || raw.similarities)) || [];
  const scores = list.map((x) => (typeof x === "number" ? x : x.score));
  const targets = lines(values.targets);
  return [el("p", {}, "Cosine similarity to: ", el("q", {}, values.source)),
          ...scores.map((s, i) => bar(targets[i] ?? `target ${i + 1}`, s, fmt(s)))];
}

function renderVector(result) {
  const vector = Array.isArray(result) ? result : result.embedding || result.vector || [];
  const norm = Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0));
  return [el("p", {}, `A vector of ${vector.length} numbers, norm ${fmt(norm)}:`),
          el("pre", {}, `[${vector.slice(0, 8).map((x) => fmt(x, 4)).join(", ")}${vector.length > 8 ? ", …" : ""}]`)];
}

// /v1/fill-mask, as transformers' pipeline: one mask -> a list of candidates, several -> a list per mask.
function renderFillMask(result) {
  const perMask = Array.isArray(result) && Array.isArray(result[0]) ? result
    : [Array.isArray(result) ? result : result.candidates || result.predictions || []];
  const out = [];
  perMask.forEach((candidates, i) => {
    if (perMask.length > 1) out.push(el("h2", {}, `Mask ${i + 1}`));
    const best = candidates[0];
    if (best && best.sequence) out.push(el("p", { class: "big" }, el("strong", { class: "sequence" }, best.sequence)));
    for (const c of candidates) out.push(bar(c.token_str ?? String(c.token), c.score, pct(c.score)));
  });
  return out;
}

// /v1/choice: the choices ranked with probabilities (objects naming the choice or its index, or numbers).
function renderChoices(result, values) {
  const choices = lines(values.choices);
  const raw = Array.isArray(result) ? result : result.choices || result.ranking || result.probabilities || [];
  const ranked = raw.map((r, i) => (typeof r === "number" ? { text: choices[i], score: r }
    : { text: r.choice ?? r.text ?? r.label ?? choices[r.index], score: r.probability ?? r.score }));
  ranked.sort((a, b) => b.score - a.score);
  return ranked.map((r) => bar(r.text, r.score, pct(r.score)));
}

// /v1/rerank: the whole ranking (Cohere's shape: the results are the documents, most relevant first), each
// document with its relevance score as a bar.
function renderRanking(result, values, model, data) {
  const documents = lines(values.documents);
  const ranked = data.results || [];
  const out = [el("p", {}, "Most relevant to: ", el("q", {}, values.query))];
  for (const r of ranked) {
    const text = r.document ? r.document.text : documents[r.index];
    out.push(bar(`${r.index + 1}. ${text}`, r.relevance_score, fmt(r.relevance_score)));
  }
  if (ranked.some((r) => r.truncated)) out.push(el("p", { class: "hint" }, "A document was cut to max_tokens_per_doc."));
  return out;
}

const topAll = (model) => (model.labels && model.labels.length ? { top_k: model.labels.length } : {});

// How each response schema (a route's `response` in GET /v1/models) is drawn, what is sent beside the inputs,
// and the button of a route that is not the form's main one. A route without a view is not offered.
const VIEWS = {
  ClassifyResponse: { render: renderLabels, options: topAll },
  NERResponse: { render: renderEntities },
  QAResponse: { render: renderAnswers, options: () => ({ top_k: 5 }) },
  SimilarityResponse: { render: renderSimilarity },
  EmbedResponse: { render: renderVector, label: "Embed the sentence" },
  FillMaskResponse: { render: renderFillMask, options: () => ({ top_k: 5 }), textLabel: "Text with [MASK]" },
  ChoiceResponse: { render: renderChoices },
  RerankResponse: { render: renderRanking, options: () => ({ return_documents: true }) },
};

// What a form field is called, by the input field's name (a list field is typed one text per line).
const LABELS = { text: "Text", text_pair: "Second text", question: "Question", context: "Context",
                 source: "Sentence", targets: "Sentences to compare it with", choices: "Choices",
                 query: "Query", documents: "Documents" };
const ONE_LINE = new Set(["question", "query", "source"]);

function formField(f, i, fields) {
  const first = i === 0 && fields.length > 1 && f.name === "text"; // the first of a pair
  const label = (first ? "First text" : LABELS[f.name] || f.name) + (f.many ? ", one per line" : "");
  return { name: f.name, many: f.many, label, rows: ONE_LINE.has(f.name) ? 1 : f.many ? 5 : 3 };
}

// The body of `route` from the form's values: a text route takes the form's first field; an object route its
// fields (a list field one text per line), under `inputs`, or at the body's root for a ranking route.
function inputsOf(route, fields, values) {
  if (!route.fields.length) return { inputs: values[fields[0].name] };
  const value = (f) => (f.many ? lines(values[f.name]) : values[f.name]);
  const object = Object.fromEntries(route.fields.map((f) => [f.name, value(f)]));
  return route.kind === "ranking" ? object : { inputs: object };
}

function action(route, fields) {
  const view = VIEWS[route.response];
  const options = view.options || (() => ({}));
  return { route: route.path, label: view.label || "Run", render: view.render,
           body: (values, model) => ({ ...inputsOf(route, fields, values), ...options(model) }) };
}

// The form of a model: the fields of its drawable route with the most input fields, that route as the main
// action and its other drawable routes as extra buttons; null when none can be drawn.
function formFor(model) {
  const routes = (model.routes || []).filter((r) => VIEWS[r.response]);
  if (!routes.length) return null;
  const main = routes.reduce((best, r) => (r.fields.length > best.fields.length ? r : best));
  const textLabel = VIEWS[main.response].textLabel;
  const fields = main.fields.length ? main.fields.map(formField)
    : [{ ...formField({ name: "text", many: false }, 0, []), ...(textLabel ? { label: textLabel } : {}) }];
  const extras = routes.filter((r) => r !== main).map((r) => action(r, fields));
  return { fields, main: action(main, fields), extras };
}

// An example's values: an object names its fields; a text fills the first field, and a list field gets the
// model's other examples (a sentence compared with the rest).
function exampleValues(fields, example, all) {
  if (typeof example !== "string") return example || {};
  const values = { [fields[0].name]: example };
  for (const f of fields.slice(1)) if (f.many) values[f.name] = all.filter((o) => o !== example);
  return values;
}

function showError(res) {
  const box = $("error");
  const data = res.data || {};
  const status = res.status ? ` ${res.status}` : ""; // 0: not an HTTP answer (no form, network failure)
  box.replaceChildren(el("strong", {}, `Error${status}${data.error_type ? " (" + data.error_type + ")" : ""}: `),
                      el("span", { class: "message" }, data.error || "the server gave no message"));
  box.hidden = false;
}

function clearOutput() {
  $("error").hidden = true;
  $("timing").textContent = "";
  $("result").replaceChildren();
}

function showKeyForm(prompt) {
  $("key-prompt").textContent = prompt;
  $("key-form").hidden = false;
  $("model-picker").hidden = $("task-form").hidden = true;
  $("api-key").focus();
}

async function loadModels() {
  clearOutput();
  const res = await api("GET", "/v1/models");
  if (res.status === 401) {
    const hadKey = Boolean(sessionStorage.getItem(KEY));
    sessionStorage.removeItem(KEY);
    showKeyForm(hadKey ? "That key was refused; enter the server's API key." : "This server needs an API key.");
    if (hadKey) showError(res);
    return;
  }
  if (!res.ok) return showError(res);
  $("key-form").hidden = true;
  models = res.data.models || [];
  const select = $("model");
  select.replaceChildren(...models.map((m, i) => el("option", { value: String(i) }, `${m.name} (${m.task})`)));
  $("model-picker").hidden = false;
  if (!models.length) return showError({ status: 0, data: { error: "this server serves no model" } });
  chooseModel();
}

function currentModel() { return models[Number($("model").value)]; }

function chooseModel() {
  const model = currentModel();
  form = formFor(model);
  clearOutput();
  const routes = (model.routes || []).map((r) => r.path).join(", ") || model.route;
  const about = [`task ${model.task}`, `route ${routes}`, `precision ${model.precision}`,
                 `max ${model.max_seq_length} tokens`];
  if (model.labels && model.labels.length) about.push(`labels: ${model.labels.join(", ")}`);
  if (!model.ready) about.push("still loading");
  $("model-info").textContent = about.join(" · ");
  if (!form) {
    $("task-form").hidden = true;
    return showError({ status: 0, data: { error: `the playground has no form for task ${model.task}` } });
  }
  $("fields").replaceChildren(...form.fields.map((f) => {
    const input = f.rows > 1 ? el("textarea", { rows: String(f.rows) }) : el("input", { type: "text" });
    input.id = "field-" + f.name;
    input.name = f.name;
    return el("div", { class: "field" }, el("label", { for: input.id }, f.label), input);
  }));
  const actions = [el("button", { type: "submit", id: "run" }, "Run")];
  form.extras.forEach((extra, i) => {
    const button = el("button", { type: "button", id: i ? `run-extra-${i + 1}` : "run-extra" }, extra.label);
    button.addEventListener("click", () => run(extra));
    actions.push(button);
  });
  $("actions").replaceChildren(...actions);
  const examples = model.examples || [];
  $("examples").replaceChildren(...(examples.length ? [el("span", {}, "Examples: ")] : []), ...examples.map((ex, i) => {
    const button = el("button", { type: "button", class: "example" }, `Example ${i + 1}`);
    button.title = typeof ex === "string" ? ex : Object.values(ex).join(" | ");
    button.addEventListener("click", () => fill(ex, examples));
    return button;
  }));
  if (examples.length) fill(examples[0], examples);
  $("task-form").hidden = false;
}

function fill(example, all) {
  const values = exampleValues(form.fields, example, all);
  for (const f of form.fields) {
    const input = $("field-" + f.name);
    const value = values[f.name];
    if (!input || value === undefined || value === null) continue;
    input.value = Array.isArray(value) ? value.join("\n") : value;
  }
}

async function run(action) {
  const model = currentModel();
  const values = Object.fromEntries(form.fields.map((f) => [f.name, $("field-" + f.name).value]));
  const buttons = document.querySelectorAll("#actions button");
  buttons.forEach((b) => { b.disabled = true; });
  clearOutput();
  $("result").append(el("p", { class: "hint" }, "Running…"));
  try {
    const res = await api("POST", action.route, { ...action.body(values, model), model: model.name });
    $("result").replaceChildren();
    if (res.status === 401) return loadModels();
    if (!res.ok) return showError(res);
    $("timing").textContent = TIMINGS.filter(([h]) => res.headers.get(h) !== null)
      .map(([h, name]) => `${name} ${Number(res.headers.get(h)).toFixed(1)} ms`).join(" · ");
    $("result").append(...action.render(res.data.results[0], values, model, res.data));
  } catch (error) {
    $("result").replaceChildren();
    showError({ status: 0, data: { error: `the request failed: ${error.message}` } });
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("api-key").value.trim());
    $("api-key").value = "";
    loadModels();
  });
  $("model").addEventListener("change", chooseModel);
  $("task-form").addEventListener("submit", (event) => {
    event.preventDefault();
    run(form.main);
  });
  $("task-form").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("task-form").requestSubmit();
  });
  loadModels();
});
