// The outbox-relay console: calls the admin API (/api/v1) of the relay that serves it,
// with the token signed in with (kept in sessionStorage: this tab only). Every value from
// the API reaches the page through textContent, never as markup.
"use strict";

const TOKEN_KEY = "outbox-relay-admin-token";
const PAGE_SIZE = 50;

const state = {
  token: null,
  outbox: null,
  // The filter applied to the listing (what "Requeue all matching the filter" requeues).
  filter: { key: "", event_type: "" },
  // The cursors of the pages seen so far: cursors[i] opens page i (null: the first).
  cursors: [null],
  page: 0,
  nextCursor: null,
  selected: new Set(),
  // The requeue waiting for confirmation: its request body, without dry_run.
  pending: null,
};

const $ = (id) => document.getElementById(id);

function show(element, visible) {
  element.hidden = !visible;
}

function say(id, text, kind) {
  const element = $(id);
  element.textContent = text;
  element.className = kind || "";
  show(element, text !== "");
}

function element(tag, text, className) {
  const made = document.createElement(tag);
  if (text !== undefined && text !== null) made.textContent = String(text);
  if (className) made.className = className;
  return made;
}

// An API answer: its status and its JSON body (null when it has none).
async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + state.token };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (failure) {
    return { status: 0, body: { error: "the relay did not answer: " + failure.message } };
  }
  let json = null;
  try {
    json = await response.json();
  } catch (_) {
    json = null;
  }
  return { status: response.status, body: json };
}

// What an answer other than 200 means, in words.
function refusal(answer) {
  const detail = answer.body && answer.body.error ? " (" + answer.body.error + ")" : "";
  switch (answer.status) {
    case 0:
      return answer.body.error;
    case 401:
      return "This token is not accepted" + detail + ".";
    case 403:
      return "Refused: this token is a viewer's; requeueing needs an operator token.";
    case 429:
      return "Too many failed sign-ins from this address; try again in a minute" + detail + ".";
    default:
      return "The relay answered " + answer.status + detail + ".";
  }
}

// A 401 after signing in: the token was removed from the relay's tokens file.
function signedOutBy(answer) {
  if (answer.status !== 401) return false;
  signOut("Your token is no longer accepted; sign in again.");
  return true;
}

// Signing in and out.

async function signIn(token) {
  state.token = token;
  const answer = await api("GET", "/api/v1/outboxes");
  if (answer.status !== 200) {
    state.token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    say("sign-in-error", "Sign-in refused. " + refusal(answer), "error");
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  say("sign-in-error", "");
  $("token").value = "";
  show($("sign-in"), false);
  show($("console"), true);
  show($("sign-out"), true);
  show($("refresh"), true);
  renderOutboxes(answer.body.outboxes);
}

function signOut(why) {
  state.token = null;
  state.outbox = null;
  sessionStorage.removeItem(TOKEN_KEY);
  show($("console"), false);
  show($("dead"), false);
  show($("event"), false);
  show($("sign-out"), false);
  show($("refresh"), false);
  show($("sign-in"), true);
  $("outboxes").replaceChildren();
  $("dead-rows").replaceChildren();
  say("sign-in-error", why || "", "error");
}

// The outboxes at a glance.

function age(seconds) {
  if (seconds === null || seconds === undefined) return "none";
  if (seconds < 60) return Math.round(seconds) + " s";
  if (seconds < 3600) return Math.round(seconds / 60) + " min";
  if (seconds < 86400) return (seconds / 3600).toFixed(1) + " h";
  return (seconds / 86400).toFixed(1) + " d";
}

async function loadOutboxes() {
  const answer = await api("GET", "/api/v1/outboxes");
  if (signedOutBy(answer)) return;
  if (answer.status !== 200) {
    say("notice", refusal(answer), "error");
    return;
  }
  renderOutboxes(answer.body.outboxes);
}

function renderOutboxes(outboxes) {
  const cards = outboxes.map((outbox) => {
    const card = element("article", null, "card");
    card.dataset.outbox = outbox.name;
    card.append(element("h3", outbox.name));
    if (outbox.table !== outbox.name) card.append(element("p", "table " + outbox.table, "muted"));
    const figures = element("dl", null, "figures");
    for (const [label, value, className] of [
      ["Pending", outbox.pending, "pending"],
      ["Dead", outbox.dead, outbox.dead > 0 ? "dead alarm" : "dead"],
      ["Oldest pending", age(outbox.oldest_pending_age_seconds), "oldest"],
    ]) {
      const item = element("div", null, className);
      item.append(element("dt", label), element("dd", value));
      figures.append(item);
    }
    card.append(figures);
    if (outbox.failing.length > 0) {
      card.append(element("h4", "Failing pending events"));
      const list = element("ul", null, "failing");
      for (const group of outbox.failing) {
        const item = element("li");
        item.append(element("span", group.count, "count"), element("span", group.error, "reason"));
        list.append(item);
      }
      card.append(list);
    }
    const open = element("button", "Dead events (" + outbox.dead + ")", "open-dead");
    open.type = "button";
    open.addEventListener("click", () => openOutbox(outbox.name));
    card.append(open);
    return card;
  });
  $("outboxes").replaceChildren(...cards);
  if (outboxes.length === 0) $("outboxes").append(element("p", "This relay has no outboxes."));
}

// Dead events, a page at a time.

function openOutbox(name) {
  state.outbox = name;
  state.filter = { key: "", event_type: "" };
  $("filter-key").value = "";
  $("filter-type").value = "";
  $("dead-outbox").textContent = name;
  show($("dead"), true);
  show($("event"), false);
  cancelRequeue();
  say("action-result", "");
  loadPage(0, null);
  $("dead").scrollIntoView();
}

function listingPath(cursor) {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (state.filter.key) query.set("key", state.filter.key);
  if (state.filter.event_type) query.set("event_type", state.filter.event_type);
  if (cursor !== null) query.set("cursor", cursor);
  return "/api/v1/outboxes/" + encodeURIComponent(state.outbox) + "/dead?" + query;
}

async function loadPage(page, cursor) {
  const table = $("dead-table");
  table.setAttribute("aria-busy", "true");
  const answer = await api("GET", listingPath(cursor));
  table.setAttribute("aria-busy", "false");
  if (signedOutBy(answer)) return;
  if (answer.status !== 200) {
    say("action-result", refusal(answer), "error");
    return;
  }
  state.page = page;
  state.cursors.length = page + 1;
  state.cursors[page] = cursor;
  state.nextCursor = answer.body.next_cursor;
  state.selected.clear();
  renderRows(answer.body.items);
  table.dataset.loaded = String(Date.now());
}

function renderRows(items) {
  const rows = items.map((item) => {
    const row = element("tr");
    row.dataset.id = String(item.id);
    const pick = element("input");
    pick.type = "checkbox";
    pick.className = "pick";
    pick.setAttribute("aria-label", "Select event " + item.id);
    pick.addEventListener("click", (click) => click.stopPropagation());
    pick.addEventListener("change", () => {
      if (pick.checked) state.selected.add(item.id);
      else state.selected.delete(item.id);
      updateActions();
    });
    const pickCell = element("td");
    pickCell.append(pick);
    row.append(
      pickCell,
      element("td", item.id, "id"),
      element("td", item.key, "key"),
      element("td", item.event_type, "type"),
      element("td", item.attempts, "attempts"),
      element("td", item.last_error, "error"),
      element("td", new Date(item.created_at).toLocaleString(), "created")
    );
    row.addEventListener("click", () => openEvent(item.id));
    return row;
  });
  $("dead-rows").replaceChildren(...rows);
  show($("dead-empty"), items.length === 0);
  $("select-page").checked = false;
  $("page-number").textContent = "Page " + (state.page + 1);
  $("page-previous").disabled = state.page === 0;
  $("page-next").disabled = state.nextCursor === null;
  updateActions();
}

function updateActions() {
  const count = state.selected.size;
  $("requeue-selected").disabled = count === 0;
  $("requeue-selected").textContent = count === 0 ? "Requeue selected" : "Requeue selected (" + count + ")";
  $("requeue-filter").disabled = !(state.filter.key || state.filter.event_type);
}

// One event in full.

function pretty(text) {
  if (text === null || text === undefined) return "(none)";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (_) {
    return text;
  }
}

async function openEvent(id) {
  const path = "/api/v1/outboxes/" + encodeURIComponent(state.outbox) + "/events/" + id;
  const answer = await api("GET", path);
  if (signedOutBy(answer)) return;
  if (answer.status !== 200) {
    say("action-result", refusal(answer), "error");
    return;
  }
  const event = answer.body;
  $("event-title").textContent = event.id + " (" + event.event_id + ")";
  const fields = [
    ["Event id", event.event_id],
    ["Key", event.key],
    ["Event type", event.event_type],
    ["Status", event.status],
    ["Attempts", event.attempts],
    ["Last error", event.last_error === null ? "(none)" : event.last_error],
    ["Created", event.created_at],
    ["Available", event.available_at],
    ["Published", event.published_at === null ? "(not published)" : event.published_at],
  ].flatMap(([label, value]) => [element("dt", label), element("dd", value)]);
  $("event-fields").replaceChildren(...fields);
  $("event-envelope").textContent = pretty(event.envelope);
  $("event-headers").textContent = pretty(event.headers);
  show($("event"), true);
  $("event").scrollIntoView();
}

// Requeueing: a dry run counts, the user confirms, then the requeue.

// The requeue of `selection` (a dry run when `dryRun`): how many events it selects, or null
// once a refusal was shown (or the token no longer signs in).
async function requeue(selection, dryRun) {
  const path = "/api/v1/outboxes/" + encodeURIComponent(state.outbox) + "/requeue";
  const answer = await api("POST", path, Object.assign({ dry_run: dryRun }, selection));
  if (signedOutBy(answer)) return null;
  if (answer.status !== 200) {
    say("action-result", refusal(answer), "error");
    return null;
  }
  return answer.body.count;
}

async function askRequeue(selection) {
  cancelRequeue();
  say("action-result", "");
  const count = await requeue(selection, true);
  if (count === null) return;
  if (count === 0) {
    say("action-result", "No dead events match: nothing to requeue.");
    return;
  }
  state.pending = selection;
  $("confirm-text").textContent = "Requeue " + count + (count === 1 ? " event?" : " events?");
  show($("confirm"), true);
  $("confirm-yes").focus();
}

function cancelRequeue() {
  state.pending = null;
  show($("confirm"), false);
}

async function confirmRequeue() {
  const selection = state.pending;
  cancelRequeue();
  if (selection === null) return;
  const count = await requeue(selection, false);
  if (count === null) return;
  say("action-result", "Requeued " + count + (count === 1 ? " event." : " events."), "ok");
  loadPage(0, null);
  loadOutboxes();
}

// Wiring.

function wire() {
  $("sign-in-form").addEventListener("submit", (submit) => {
    submit.preventDefault();
    const token = $("token").value.trim();
    if (token) signIn(token);
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("refresh").addEventListener("click", () => {
    loadOutboxes();
    if (state.outbox !== null) loadPage(state.page, state.cursors[state.page]);
  });
  $("filter-form").addEventListener("submit", (submit) => {
    submit.preventDefault();
    state.filter = { key: $("filter-key").value.trim(), event_type: $("filter-type").value.trim() };
    cancelRequeue();
    loadPage(0, null);
  });
  $("filter-clear").addEventListener("click", () => {
    $("filter-key").value = "";
    $("filter-type").value = "";
    state.filter = { key: "", event_type: "" };
    cancelRequeue();
    loadPage(0, null);
  });
  $("page-next").addEventListener("click", () => {
    if (state.nextCursor !== null) loadPage(state.page + 1, state.nextCursor);
  });
  $("page-previous").addEventListener("click", () => {
    if (state.page > 0) loadPage(state.page - 1, state.cursors[state.page - 1]);
  });
  $("select-page").addEventListener("change", () => {
    const all = $("select-page").checked;
    for (const pick of document.querySelectorAll("#dead-rows .pick")) {
      pick.checked = all;
      const id = Number(pick.closest("tr").dataset.id);
      if (all) state.selected.add(id);
      else state.selected.delete(id);
    }
    updateActions();
  });
  $("requeue-selected").addEventListener("click", () => askRequeue({ ids: Array.from(state.selected) }));
  $("requeue-filter").addEventListener("click", () => {
    const selection = {};
    if (state.filter.key) selection.key = state.filter.key;
    if (state.filter.event_type) selection.event_type = state.filter.event_type;
    askRequeue(selection);
  });
  $("confirm-yes").addEventListener("click", confirmRequeue);
  $("confirm-no").addEventListener("click", cancelRequeue);
  $("event-close").addEventListener("click", () => show($("event"), false));

  const kept = sessionStorage.getItem(TOKEN_KEY);
  if (kept) signIn(kept);
}

document.addEventListener("DOMContentLoaded", wire);
