// Sluice operations console (issue 16). Plain JavaScript, no build step.
//
// Every piece of data comes from the gateway's admin API, called with the
// admin token and the operator's own key from the sign-in form. Both are kept
// in sessionStorage (this tab only) and sent as headers, never in a URL. Data
// is put into the page with textContent only, never parsed as HTML.
"use strict";

const TOKEN = "sluice.console.adminToken";
const OPERATOR = "sluice.console.operatorKey";
const OUTCOMES = [
  "dismiss", "attempt_succeeded", "attempt_failed", "attempt_canceled",
  "capture_succeeded", "capture_failed", "refund_succeeded", "refund_failed",
  "manual_refund", "fulfillment_fulfilled", "fulfillment_compensate", "fulfillment_resume",
];
const ORDER_STATES = [
  "CREATED", "PROCESSING", "REQUIRES_ACTION", "AUTHORIZED", "SUCCEEDED", "FAILED", "CANCELED", "EXPIRED",
];
const AGES = [
  ["", "any age"], ["60000", "older than 1 min"], ["900000", "older than 15 min"],
  ["3600000", "older than 1 h"], ["86400000", "older than 1 day"],
];

// ---- small DOM helpers -------------------------------------------------------------

/** An element with attributes (`on*` functions become listeners) and children. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function $(id) {
  return document.getElementById(id);
}

function time(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

function age(ms) {
  if (ms === null || ms === undefined) return "—";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function money(minor, currency) {
  if (minor === null || minor === undefined) return "—";
  return (minor / 100).toFixed(2) + " " + (currency || "") + " (" + minor + ")";
}

function say(text) {
  $("status").textContent = text;
}

function showError(error) {
  const alert = $("alert");
  alert.textContent = error.message;
  alert.hidden = false;
}

function clearError() {
  $("alert").hidden = true;
  $("alert").textContent = "";
}

// ---- the admin API -------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(code ? `${message} (${status} ${code})` : message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = {
    "Authorization": "Bearer " + (sessionStorage.getItem(TOKEN) || ""),
    "Sluice-Operator-Key": sessionStorage.getItem(OPERATOR) || "",
    "Accept": "application/json",
  };
  const init = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  if (!response.ok) {
    const err = (json && json.error) || {};
    throw new ApiError(response.status, err.code || "", err.message || `HTTP ${response.status}`);
  }
  return json;
}

/** Runs an action, showing its error; a 401 sends the operator back to sign-in. */
async function guarded(action) {
  clearError();
  try {
    return await action();
  } catch (error) {
    showError(error);
    if (error instanceof ApiError && error.status === 401) {
      signOut(false);
    }
    return undefined;
  }
}

// ---- sign-in -----------------------------------------------------------------------

function signedIn() {
  return Boolean(sessionStorage.getItem(TOKEN) && sessionStorage.getItem(OPERATOR));
}

function signOut(clearAlert) {
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(OPERATOR);
  if (clearAlert) clearError();
  render();
}

async function signIn(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN, $("admin-token").value.trim());
  sessionStorage.setItem(OPERATOR, $("operator-key").value.trim());
  // Any call that needs both proves both; the stats are cheap.
  const ok = await guarded(() => api("GET", "/admin/payments/stats"));
  if (ok) {
    $("admin-token").value = "";
    $("operator-key").value = "";
    if (!location.hash || location.hash === "#/") location.hash = "#/payments";
    render();
  }
}

// ---- routing -----------------------------------------------------------------------

function route() {
  const parts = (location.hash || "#/payments").slice(2).split("/").map(decodeURIComponent);
  return { section: parts[0] || "payments", id: parts[1] || null };
}

async function render() {
  const authed = signedIn();
  $("sign-in").hidden = authed;
  $("view").hidden = !authed;
  $("nav").hidden = !authed;
  $("sign-out").hidden = !authed;
  if (!authed) {
    // Nothing of the last session stays in the page.
    $("view").replaceChildren();
    $("who").textContent = "";
    document.title = "Sign in · Sluice console";
    $("admin-token").focus();
    return;
  }
  $("who").textContent = "signed in with your operator key";
  const { section, id } = route();
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const view = $("view");
  view.replaceChildren();
  const pages = {
    payments: () => (id ? paymentPage(view, id) : paymentsPage(view)),
    review: () => reviewPage(view),
    adapters: () => adaptersPage(view),
    deliveries: () => deliveriesPage(view),
  };
  await (pages[section] || pages.payments)();
}

// ---- payments ----------------------------------------------------------------------

const search = { q: "", merchant: "", state: "", older_than_ms: "", cursor: null };

async function paymentsPage(view) {
  document.title = "Payments · Sluice console";
  view.append(h("h1", { id: "page-title", tabindex: "-1" }, "Payments"));
  const stats = h("div", { id: "stats" });
  view.append(h("h2", {}, "Open work by state"), stats);
  const form = searchForm();
  view.append(h("h2", {}, "Search"), form);
  const results = h("div", { id: "results" });
  view.append(results);
  await Promise.all([loadStats(stats), loadMerchants(form), loadResults(results)]);
}

async function loadStats(container) {
  const stats = await guarded(() => api("GET", "/admin/payments/stats"));
  if (!stats) return;
  const cards = stats.states.map((s) =>
    h("div", { class: "card" + (s.oldest_age_ms > 15 * 60 * 1000 ? " old" : ""), "data-aggregate": s.aggregate, "data-state": s.state },
      h("div", { class: "muted" }, `${s.aggregate} · ${s.state}`),
      h("div", { class: "n" }, s.count),
      h("div", { class: "age" }, "oldest " + age(s.oldest_age_ms))));
  cards.push(h("div", { class: "card" + (stats.manual_review > 0 ? " old" : ""), "data-aggregate": "review" },
    h("div", { class: "muted" }, "manual review"),
    h("div", { class: "n" }, stats.manual_review),
    h("div", { class: "age" }, stats.oldest_manual_review_at ? "since " + time(stats.oldest_manual_review_at) : "none")));
  container.replaceChildren(
    cards.length > 1 || stats.manual_review > 0
      ? h("div", { class: "cards" }, cards)
      : h("p", { class: "muted" }, "Nothing open: no payment, attempt, capture or refund waits."),
    h("p", { class: "legend" }, `Counted at ${time(stats.as_of)}. A card with an orange border is older than 15 minutes.`));
}

function searchForm() {
  const stateSelect = h("select", { id: "search-state", name: "state" },
    h("option", { value: "" }, "any state"), ORDER_STATES.map((s) => h("option", { value: s }, s)));
  stateSelect.value = search.state;
  const ageSelect = h("select", { id: "search-age", name: "older_than_ms" },
    AGES.map(([value, label]) => h("option", { value }, label)));
  ageSelect.value = search.older_than_ms;
  const q = h("input", { id: "search-q", name: "q", type: "search", size: 40, value: search.q,
    placeholder: "pay_…, order number, attempt or PSP reference" });
  const form = h("form", { id: "search-form", role: "search",
    onsubmit: (event) => {
      event.preventDefault();
      search.q = q.value.trim();
      search.merchant = $("search-merchant").value;
      search.state = stateSelect.value;
      search.older_than_ms = ageSelect.value;
      search.cursor = null;
      loadResults($("results"));
    } },
  h("label", { for: "search-q" }, "Payment id, order number, attempt or PSP reference", q),
  h("label", { for: "search-merchant" }, "Merchant",
    h("select", { id: "search-merchant", name: "merchant" }, h("option", { value: "" }, "any merchant"))),
  h("label", { for: "search-state" }, "State", stateSelect),
  h("label", { for: "search-age" }, "Age", ageSelect),
  h("button", { type: "submit", id: "search-button" }, "Search"));
  return form;
}

async function loadMerchants(form) {
  const merchants = await guarded(() => api("GET", "/admin/merchants"));
  if (!merchants) return;
  const select = form.querySelector("#search-merchant");
  for (const m of merchants.data) select.append(h("option", { value: m.id }, `${m.name} (${m.id})`));
  select.value = search.merchant;
}

// Which search the results on screen answer: an answer to an earlier search that arrives late
// (the page's first list, say, after the operator already searched) is dropped, not shown.
let resultsGeneration = 0;

async function loadResults(container) {
  const generation = ++resultsGeneration;
  const shown = search.q;
  const params = new URLSearchParams();
  for (const key of ["q", "merchant", "state", "older_than_ms"]) {
    if (search[key]) params.set(key, search[key]);
  }
  if (search.cursor) params.set("starting_after", search.cursor);
  params.set("limit", "50");
  say("Searching…");
  const list = await guarded(() => api("GET", "/admin/payments?" + params));
  if (generation !== resultsGeneration) return;
  say("");
  if (!list) return;
  const rows = list.data.map((p) =>
    h("tr", { "data-payment": p.id },
      h("td", {}, h("a", { class: "payment-link mono", href: "#/payments/" + encodeURIComponent(p.id) }, p.id)),
      h("td", { class: "mono" }, p.merchant_id),
      h("td", {}, p.merchant_order_no),
      h("td", { class: "num" }, money(p.amount, p.currency)),
      h("td", {}, h("span", { class: "tag" }, p.state), p.manual_review ? h("span", { class: "tag warn" }, "review") : null),
      h("td", { class: "num" }, age(p.age_ms)),
      h("td", {}, time(p.created_at))));
  const table = rows.length
    ? h("table", { "aria-label": "Payments found" },
      h("thead", {}, h("tr", {}, ["Payment", "Merchant", "Order number", "Amount", "State", "Age", "Created"]
        .map((c, i) => h("th", { scope: "col", class: i === 3 || i === 5 ? "num" : null }, c)))),
      h("tbody", {}, rows))
    : h("p", { id: "no-results" }, "No payment matches.");
  const more = list.has_more
    ? h("button", { type: "button", class: "secondary", onclick: () => { search.cursor = list.next_cursor; loadResults(container); } }, "Next page")
    : null;
  container.replaceChildren(...[h("h2", {}, `Results (${list.data.length}${list.has_more ? "+" : ""})`), table, more].filter(Boolean));
  container.dataset.q = shown;
}

// ---- one payment -------------------------------------------------------------------

async function paymentPage(view, id) {
  document.title = `${id} · Sluice console`;
  view.append(h("p", {}, h("a", { href: "#/payments" }, "← Payments")),
    h("h1", { id: "page-title", tabindex: "-1" }, "Payment ", h("span", { class: "mono" }, id)));
  const admin = await guarded(() => api("GET", `/admin/payments/${encodeURIComponent(id)}`));
  if (!admin) return;
  const history = await guarded(() => api("GET", `/admin/payments/${encodeURIComponent(id)}/timeline?limit=500`));
  if (!history) return;
  const p = admin.payment;
  view.append(
    nextBox(admin.next),
    h("div", { class: "grid2" },
      h("div", {}, h("h2", {}, "Payment"), facts([
        ["Merchant", admin.merchant_id], ["Order number", p.merchant_order_no],
        ["Status", `${p.status} (order ${p.state})`], ["Capture", p.capture_mode],
        ["Manual review", p.manual_review ? `yes: ${p.manual_review_reason || ""}` : "no"],
        ["Created", time(p.created_at)], ["Version", p.version],
      ])),
      h("div", {}, h("h2", {}, "Amounts"), amountsTable(p))),
  );
  const lanes = h("div", { id: "lanes-box" });
  view.append(h("h2", {}, "Lanes"), legend(), lanes);
  const events = history.data.slice();
  drawLanes(lanes, p, events);
  if (history.has_more) {
    let cursor = history.next_cursor;
    const more = h("button", { type: "button", class: "secondary", id: "more-history",
      onclick: async () => {
        const page = await guarded(() => api("GET", `/admin/payments/${encodeURIComponent(id)}/timeline?limit=500&starting_after=${cursor}`));
        if (!page) return;
        events.push(...page.data);
        cursor = page.next_cursor;
        more.hidden = !page.has_more;
        drawLanes(lanes, p, events);
      } }, "Load more history");
    view.append(more);
  }
  if (admin.proposals.length) {
    view.append(h("h2", {}, "Review proposals"), proposalsTable(admin.proposals, false));
  }
  $("page-title").focus();
}

function facts(pairs) {
  return h("dl", { class: "detail" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v === null || v === undefined ? "—" : v)]));
}

function amountsTable(p) {
  const a = p.amounts || {};
  const rows = Object.entries(a).filter(([k]) => k !== "currency" && typeof a[k] === "number");
  return h("table", { "aria-label": "Amounts", id: "amounts" },
    h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, k.replace(/_/g, " ")), h("td", { class: "num" }, money(v, p.currency))))));
}

function nextBox(next) {
  const steps = next.steps.map((s) =>
    h("li", { "data-aggregate": s.aggregate, "data-mover": s.mover },
      h("strong", {}, `${s.aggregate} ${s.id}`), ` (${s.state}): `,
      h("span", { class: "tag" }, s.mover), " ", h("code", {}, s.action), " ",
      s.explanation,
      s.due_at ? ` due ${time(s.due_at)}` : "",
      s.reference ? [" · reference ", h("code", {}, s.reference)] : "",
      s.tries !== undefined && s.tries !== null ? ` · tries ${s.tries}` : "",
      s.backoff_ms ? ` · then backoff ${age(s.backoff_ms)}` : "",
      s.deadline ? ` · deadline ${time(s.deadline.at)}, then ${s.deadline.then}` : ""));
  const held = next.money_held || {};
  const holds = (held.holds || []).map((x) => h("li", {}, `${x.kind} ${x.amount} on ${x.aggregate_id}: ${x.reason}`));
  return h("section", { class: "next", id: "next", "aria-labelledby": "next-title" },
    h("h2", { id: "next-title" }, "What happens next"),
    h("p", {}, h("span", { class: "tag", id: "next-mover" }, next.mover), " ",
      h("span", { id: "next-summary" }, next.summary),
      next.due_at ? h("span", { class: "muted" }, ` (due ${time(next.due_at)})`) : ""),
    steps.length ? h("ul", { id: "next-steps" }, steps) : null,
    holds.length ? [h("h3", {}, "Money held"), h("ul", {}, holds)] : null,
    next.review ? h("p", { id: "next-review" }, h("strong", {}, "In review: "), next.review.reason || "",
      next.review.awaiting ? ` · awaiting ${next.review.awaiting}` : "") : null,
    h("p", { class: "legend" }, `Computed at ${time(next.as_of)} from stored facts and the workers' own policies.`));
}

function legend() {
  return h("p", { class: "legend" },
    "Each lane is one aggregate; columns are the payment's history in order, left to right. ",
    h("span", { class: "tag ok" }, "applied"), " changed the aggregate; ",
    h("span", { class: "tag" }, "ignored"), " (dashed) changed nothing; ",
    h("span", { class: "tag bad" }, "rejected"), " (red) was refused. Select an event for its evidence.");
}

/** The lane an event belongs to: its aggregate, with fulfillment apart. */
function laneOf(e) {
  if (e.event_kind.startsWith("FULFILLMENT") || e.aggregate_type === "fulfillment") return "fulfillment";
  return e.aggregate_type === "order" ? "order" : `${e.aggregate_type}:${e.aggregate_id}`;
}

function laneLabel(key, p) {
  if (key === "order" || key === "fulfillment") return [key, null];
  const [kind, id] = key.split(":");
  const lists = { attempt: p.attempts, capture: p.captures, refund: p.refunds };
  const found = (lists[kind] || []).find((x) => x.id === id);
  return [kind, found ? `${found.reference || id} · ${found.state || found.status || ""}` : id];
}

function drawLanes(container, p, events) {
  const order = ["order"];
  for (const kind of ["attempt", "capture", "refund"]) {
    for (const e of events) {
      const key = laneOf(e);
      if (key.startsWith(kind + ":") && !order.includes(key)) order.push(key);
    }
  }
  if (p.fulfillment || events.some((e) => laneOf(e) === "fulfillment")) order.push("fulfillment");
  // Fixed widths, so every lane's columns line up with the time axis.
  const columns = `200px repeat(${Math.max(events.length, 1)}, 150px)`;
  const detail = h("div", { class: "detail", id: "event-detail", hidden: true, "aria-live": "polite" });
  const axis = h("div", { class: "lane axis", "aria-hidden": "true" }, h("span", { class: "lane-label" }, "time"));
  axis.style.gridTemplateColumns = columns;
  events.forEach((e, i) => {
    // Time of day to the millisecond: a burst of events is often within one second.
    const tick = h("span", {}, new Date(e.recorded_at).toISOString().slice(11, 23));
    tick.style.gridColumn = String(i + 2);
    axis.append(tick);
  });
  const lanes = order.map((key) => {
    const [kind, sub] = laneLabel(key, p);
    const lane = h("div", { class: "lane", role: "group", "data-lane": kind, "data-lane-key": key, "aria-label": `${kind} lane` },
      h("div", { class: "lane-label" }, kind, sub ? h("small", { class: "mono" }, sub) : null));
    lane.style.gridTemplateColumns = columns;
    events.forEach((e, i) => {
      if (laneOf(e) !== key) return;
      const kindClass = e.decision.startsWith("ignored") ? "ignored" : e.decision;
      const button = h("button", { type: "button", class: `ev ${kindClass}`, "aria-pressed": "false",
        "data-kind": e.event_kind, "data-decision": e.decision, "data-source": e.source,
        title: `${e.event_kind} · ${e.decision} · ${e.source}`,
        onclick: () => {
          for (const other of container.querySelectorAll(".ev")) other.setAttribute("aria-pressed", "false");
          button.setAttribute("aria-pressed", "true");
          showEvent(detail, e);
        } },
      e.event_kind, h("br"), h("span", {}, `${e.decision.replace(/_/g, " ")} · ${e.source}`),
      e.to_state ? [h("br"), `→ ${e.to_state}`] : null);
      button.style.gridColumn = String(i + 2);
      lane.append(button);
    });
    return lane;
  });
  container.replaceChildren(h("div", { class: "lanes", id: "lanes" }, axis, lanes), detail);
}

function showEvent(detail, e) {
  const adapter = e.adapter ? `${e.adapter.name} ${e.adapter.version || ""} ${e.adapter.digest ? e.adapter.digest.slice(0, 12) : ""}` : null;
  detail.replaceChildren(h("h3", {}, `${e.event_kind} on ${e.aggregate_type} ${e.aggregate_id}`), facts([
    ["Decision", `${e.decision}${e.accepted ? " (changed the aggregate)" : " (changed nothing)"}`],
    ["Reason", e.reason], ["State", `${e.from_state || "—"} → ${e.to_state}`],
    ["Source (evidence)", e.source], ["Adapter version", adapter], ["Actor", e.actor],
    ["PSP reference", e.psp_reference], ["Provider event id", e.provider_event_id],
    ["PSP raw status", e.raw_status], ["Failure code", e.failure_code],
    ["Amount", e.amount !== null && e.amount !== undefined ? money(e.amount, e.currency) : null],
    ["Recorded", time(e.recorded_at)], ["History row", e.id],
  ]));
  detail.hidden = false;
}

function proposalsTable(proposals, actions) {
  return h("table", { "aria-label": "Proposals", class: "proposals" },
    h("thead", {}, h("tr", {}, ["Outcome", "Target", "Reason", "Evidence", "Proposed by", "Status", actions ? "Decide" : null]
      .filter(Boolean).map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, proposals.map((x) => h("tr", { "data-proposal": x.id },
      h("td", {}, x.outcome, x.amount ? ` ${x.amount}` : ""),
      h("td", { class: "mono" }, x.target_id),
      h("td", {}, x.reason_code),
      h("td", {}, x.evidence_note, x.psp_reference ? [h("br"), h("code", {}, x.psp_reference)] : null),
      h("td", { class: "mono" }, x.proposed_by, h("br"), time(x.proposed_at)),
      h("td", { class: "proposal-status" }, x.status, x.decided_by ? ` by ${x.decided_by}` : "", x.decision_note ? `: ${x.decision_note}` : ""),
      actions ? h("td", {}, x.status === "proposed" ? decideForm(x) : "—") : null))));
}

// ---- review queue ------------------------------------------------------------------

let reviewAge = "900000";

async function reviewPage(view) {
  document.title = "Review queue · Sluice console";
  view.append(h("h1", { id: "page-title", tabindex: "-1" }, "Review queue"),
    h("p", {}, "Payments flagged for manual review, and those with an UNKNOWN attempt, capture or refund past an age. ",
      "A resolution is proposed by one operator and applied only when a different operator approves it."));
  const ageSelect = h("select", { id: "review-age" },
    [["0", "UNKNOWN of any age"], ["900000", "UNKNOWN older than 15 min"], ["3600000", "UNKNOWN older than 1 h"]]
      .map(([v, l]) => h("option", { value: v }, l)));
  ageSelect.value = reviewAge;
  const items = h("div", { id: "review-items" });
  view.append(h("form", { onsubmit: (event) => { event.preventDefault(); reviewAge = ageSelect.value; loadQueue(items); } },
    h("label", { for: "review-age" }, "Also list", ageSelect),
    h("button", { type: "submit", class: "secondary" }, "Refresh")), items);
  await loadQueue(items);
}

async function loadQueue(container) {
  const queue = await guarded(() => api("GET", `/admin/review/payments?limit=50&unknown_older_than_ms=${reviewAge}`));
  if (!queue) return;
  if (!queue.data.length) {
    container.replaceChildren(h("p", { id: "queue-empty" }, "Nothing to review."));
    return;
  }
  container.replaceChildren(...queue.data.map((item) => reviewItem(item, container)));
}

function reviewItem(item, container) {
  const p = item.payment;
  const evidence = item.timeline.slice(-30).map((e) => h("tr", { class: e.decision },
    h("td", {}, time(e.recorded_at)), h("td", {}, `${e.aggregate_type} ${e.aggregate_id}`),
    h("td", {}, e.event_kind), h("td", {}, e.source), h("td", {}, e.decision), h("td", {}, e.reason)));
  return h("section", { class: "item", "data-payment": p.id, "aria-label": `Review of ${p.id}` },
    h("h2", {}, h("a", { class: "mono", href: "#/payments/" + encodeURIComponent(p.id) }, p.id), " ",
      h("span", { class: "tag" }, p.state), p.manual_review ? h("span", { class: "tag warn" }, "manual review") : null),
    h("p", {}, `Order ${p.merchant_order_no} · ${money(p.amount, p.currency)} · `, p.manual_review_reason || "UNKNOWN past its age"),
    h("details", {}, h("summary", {}, `Evidence and timeline (${item.timeline.length} rows, latest 30)`),
      h("table", { "aria-label": "Timeline" },
        h("thead", {}, h("tr", {}, ["Recorded", "Aggregate", "Event", "Source", "Decision", "Reason"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, evidence))),
    item.proposals.length ? [h("h3", {}, "Proposals"), proposalsTable(item.proposals, true)] : null,
    proposeForm(p, container));
}

function proposeForm(p, container) {
  const uid = p.id.replace(/[^A-Za-z0-9_-]/g, "");
  const targets = [
    ...p.attempts.map((a) => [a.id, `attempt ${a.reference} (${a.state})`]),
    ...p.captures.map((c) => [c.id, `capture ${c.id} (${c.state})`]),
    ...p.refunds.map((r) => [r.id, `refund ${r.id} (${r.state})`]),
  ];
  const field = (name, label, control) => {
    control.id = `${name}-${uid}`;
    control.name = name;
    return h("label", { for: control.id }, label, control);
  };
  const outcome = h("select", {}, OUTCOMES.map((o) => h("option", { value: o }, o)));
  const target = h("select", {}, h("option", { value: "" }, "none"), targets.map(([v, l]) => h("option", { value: v }, l)));
  const reason = h("input", { type: "text", required: true, maxlength: 64, placeholder: "psp_dashboard" });
  const note = h("textarea", { required: true, rows: 2, cols: 40, maxlength: 4000 });
  const amount = h("input", { type: "number", min: 1, step: 1 });
  const psp = h("input", { type: "text", maxlength: 255 });
  return h("form", { class: "propose", "aria-label": `Propose a resolution for ${p.id}`,
    onsubmit: async (event) => {
      event.preventDefault();
      const body = { outcome: outcome.value, reason_code: reason.value.trim(), evidence_note: note.value.trim() };
      if (target.value) body.target_id = target.value;
      if (amount.value) body.amount = Number(amount.value);
      if (psp.value.trim()) body.psp_reference = psp.value.trim();
      const made = await guarded(() => api("POST", `/admin/review/payments/${encodeURIComponent(p.id)}/proposals`, body));
      if (made) {
        say(`Proposed ${made.outcome}; a second operator approves or rejects it.`);
        await loadQueue(container);
      }
    } },
  h("h3", {}, "Propose a resolution"),
  field("outcome", "Outcome", outcome), field("target_id", "About", target),
  field("reason_code", "Reason code", reason), field("evidence_note", "Evidence", note),
  field("amount", "Amount (manual_refund, minor units)", amount), field("psp_reference", "PSP reference (evidence of a success)", psp),
  h("button", { type: "submit" }, "Propose"));
}

function decideForm(proposal) {
  const note = h("input", { type: "text", id: `note-${proposal.id}`, maxlength: 4000 });
  const decide = (verb) => async () => {
    const body = note.value.trim() ? { note: note.value.trim() } : {};
    const done = await guarded(() => api("POST", `/admin/review/proposals/${encodeURIComponent(proposal.id)}/${verb}`, body));
    if (done) {
      say(`Proposal ${done.id}: ${done.status}.`);
      await render();
    }
  };
  return h("div", { class: "decide" },
    h("label", { for: note.id }, "Note", note),
    h("button", { type: "button", class: "approve", onclick: decide("approve") }, "Approve"), " ",
    h("button", { type: "button", class: "danger reject", onclick: decide("reject") }, "Reject"));
}

// ---- adapters and dead letters -------------------------------------------------------

async function adaptersPage(view) {
  document.title = "Adapters · Sluice console";
  view.append(h("h1", { id: "page-title", tabindex: "-1" }, "Adapters"));
  const list = await guarded(() => api("GET", "/admin/adapters"));
  if (!list) return;
  if (!list.adapters.length) view.append(h("p", {}, "No adapter is loaded."));
  for (const a of list.adapters) {
    const act = (path, body) => async () => {
      const done = await guarded(() => api("POST", path, body));
      if (done) {
        say(`${a.name}: ${done.version} (${done.digest.slice(0, 12)}) now serves.`);
        await render();
      }
    };
    const name = encodeURIComponent(a.name);
    view.append(h("section", { class: "item", "data-adapter": a.name, "aria-label": `Adapter ${a.name}` },
      h("h2", {}, a.name, " ", h("span", { class: a.status === "active" ? "tag ok" : "tag" }, a.status)),
      h("p", {}, "Active: ", h("strong", {}, a.active_version || "none"), a.active_digest ? [" ", h("code", {}, a.active_digest.slice(0, 16))] : null,
        " · previous (rollback target): ", a.rollback_to ? h("code", {}, a.rollback_to.slice(0, 16)) : "none", " ",
        a.rollback_to ? h("button", { type: "button", class: "secondary rollback", onclick: act(`/admin/adapters/${name}/rollback`) }, `Roll back ${a.name}`) : null),
      h("table", { "aria-label": `Versions of ${a.name}` },
        h("thead", {}, h("tr", {}, ["Version", "Digest", "Loaded", "Serving", ""].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, a.versions.map((v) => h("tr", {},
          h("td", {}, v.version), h("td", { class: "mono" }, v.digest.slice(0, 16)), h("td", {}, time(v.loaded_at_ms)),
          h("td", {}, v.active ? h("span", { class: "tag ok" }, "active") : (v.digest === a.rollback_to ? "previous" : "staged")),
          h("td", {}, v.active ? "" : h("button", { type: "button", class: "secondary", onclick: act(`/admin/adapters/${name}/activate`, { digest: v.digest }) }, `Activate ${v.version} (${v.digest.slice(0, 8)})`))))))));
  }
}

async function deliveriesPage(view) {
  document.title = "Dead letters · Sluice console";
  view.append(h("h1", { id: "page-title", tabindex: "-1" }, "Dead-lettered deliveries"),
    h("p", {}, "Merchant webhook deliveries that ran out of retries, oldest first. Replay puts one back in the queue."));
  const list = await guarded(() => api("GET", "/admin/deliveries/dead?limit=100"));
  if (!list) return;
  if (!list.data.length) {
    view.append(h("p", { id: "no-dead" }, "No dead letters."));
    return;
  }
  view.append(h("table", { "aria-label": "Dead letters" },
    h("thead", {}, h("tr", {}, ["Delivery", "Payment", "Target", "Attempts", "Last error", ""].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, list.data.map((d) => h("tr", { "data-delivery": d.id },
      h("td", { class: "mono" }, d.id), h("td", {}, h("a", { class: "mono", href: "#/payments/" + encodeURIComponent(d.payment_id) }, d.payment_id)),
      h("td", { class: "mono" }, d.target), h("td", { class: "num" }, d.attempts), h("td", {}, d.last_error || ""),
      h("td", {}, h("button", { type: "button", class: "secondary", onclick: async () => {
        const done = await guarded(() => api("POST", `/admin/deliveries/${encodeURIComponent(d.id)}/replay`));
        if (done) {
          say(`Delivery ${done.id} is ${done.status} again.`);
          await render();
        }
      } }, "Replay")))))));
}

// ---- start -------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut(true));
  window.addEventListener("hashchange", () => { clearError(); render(); });
  render();
});
