// Drover's dashboard: plain JavaScript, no build step, no dependencies.
// Every page reads /api/v1 (the session cookie stands in for the operator
// token) and fetches again when the server's event stream says that what it
// shows changed. Times are shown in the viewer's time zone.
"use strict";

const PAGE_SIZE = 50;
let csrf = null;
// Who is signed in and with which role: a page shows only what it may do.
let me = { operator: "", role: "viewer" };
const ROLES = ["viewer", "operator", "admin"];
function may(role) {
  return ROLES.indexOf(me.role) >= ROLES.indexOf(role);
}
let current = null; // { topics: [...], render: async () => {} }
let refreshTimer = null;
let alertTimer = null;

// --- small helpers ---------------------------------------------------------

// Text a device or an old record supplied, with control and bidirectional
// characters escaped as the CLI escapes them (\u{202e}), so that nothing
// reorders what the page shows around it.
const UNPRINTABLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;
function printable(text) {
  return text.replace(UNPRINTABLE, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(printable(String(child))));
  }
  return el;
}

function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return String(iso);
  return date.toLocaleString();
}

// A length of time in words, its two largest adjacent units: the same
// rule as drover_rules::reasons::duration.
function duration(seconds) {
  const units = [[86400, "day"], [3600, "hour"], [60, "minute"], [1, "second"]];
  let left = Math.max(0, Math.floor(seconds));
  const parts = [];
  for (const [size, name] of units) {
    const count = Math.floor(left / size);
    left %= size;
    if (count > 0 && parts.length < 2) parts.push(`${count} ${name}${count === 1 ? "" : "s"}`);
    else if (parts.length > 0) break;
  }
  return parts.length ? parts.join(" ") : "0 seconds";
}

function ago(iso) {
  if (!iso) return "never";
  const seconds = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 120) return `${Math.round(seconds)} s ago`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

function badge(state, label) {
  const text = state || "–";
  const attrs = { class: `badge state-${String(text).replace(/\s+/g, "_")}` };
  if (label) attrs.title = label;
  return h("span", attrs, text);
}

// Why a run or deployment ended: the API's sentence, the code beside it.
function reason(s) {
  if (!s.reason) return "–";
  return s.reasonText ? `${s.reasonText} (${s.reason})` : s.reason;
}

// A job's state as the API names it (the CLI and the metrics show the same
// name), its words as the tooltip.
function jobState(j) {
  return h("span", {}, badge(j.state, j.stateLabel), j.afterRunEnded ? " after the run ended" : "");
}

function progress(done, failed, total) {
  const bar = h("span", { class: "progress", title: `${done} succeeded, ${failed} failed of ${total}` });
  const ok = h("span", { class: "done" });
  const bad = h("span", { class: "failed" });
  const share = (n) => (total > 0 ? `${Math.round((100 * n) / total)}%` : "0");
  ok.style.width = share(done);
  bad.style.width = share(failed);
  bar.append(ok, bad);
  return bar;
}

// The API's answer as JSON (as text with `text: true`: a job's output).
async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (options.body !== undefined) headers["content-type"] = "application/json";
  if (options.method && options.method !== "GET" && csrf) headers["x-drover-csrf"] = csrf;
  const response = await fetch(`/api/v1${path}`, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    credentials: "same-origin",
  });
  if (response.status === 401) {
    location.href = "/ui/login";
    throw new Error("logged out");
  }
  if (options.text && response.ok) return response.text();
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${response.status}`);
  return body;
}

function table(headers, rows, empty) {
  if (rows.length === 0) return h("p", { class: "muted" }, empty);
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, headers.map((title) => h("th", {}, title)))),
    h("tbody", {}, rows),
  );
}

// Buttons waiting for their second click, by id: a live update redraws
// the page, and the button must still be waiting after it.
const armed = new Set();

// A button that asks once more before it acts.
function confirmButton(label, confirmLabel, id, action) {
  const button = h("button", { type: "button", id }, label);
  const arm = () => {
    button.textContent = confirmLabel;
    button.className = "danger";
  };
  if (armed.has(id)) arm();
  button.addEventListener("click", async () => {
    if (!armed.has(id)) {
      armed.add(id);
      arm();
      return;
    }
    armed.delete(id);
    button.disabled = true;
    try {
      await action();
    } catch (e) {
      button.after(h("span", { class: "error" }, ` ${e.message}`));
    }
    await refresh();
  });
  return button;
}

// --- pages -------------------------------------------------------------------

const fleetQuery = { q: "", state: "", patch: "", offset: 0 };

const PATCH_STATES = [
  ["", "every patch state"],
  ["up_to_date", "up to date"],
  ["updates", "updates pending"],
  ["security", "security updates pending"],
  ["reboot", "reboot pending"],
  ["not_assessed", "not assessed lately"],
];

// The fleet's patch status at a glance: one bar, a segment per state, each
// as wide as its share of the devices; a click filters the list by it.
function patchBar(fleet) {
  const segments = [
    ["up_to_date", "up to date", fleet.upToDate, "ok"],
    ["updates", "updates pending", fleet.withUpdates - fleet.withSecurityUpdates, "updates"],
    ["security", "security updates pending", fleet.withSecurityUpdates, "security"],
    ["not_assessed", "never assessed", fleet.neverAssessed, "unassessed"],
  ];
  const bar = h("div", { class: "patch-bar", id: "patch-bar" });
  const legend = h("div", { class: "patch-legend" });
  for (const [filter, label, count, kind] of segments) {
    const pick = () => {
      fleetQuery.patch = filter;
      fleetQuery.offset = 0;
      refresh();
    };
    if (count > 0) {
      const segment = h("span", { class: `seg seg-${kind}`, title: `${count} ${label}`, "data-count": count, "data-patch": filter, onclick: pick });
      // CSSOM, not a style attribute: allowed under the page's CSP.
      segment.style.flexGrow = String(count);
      bar.append(segment);
    }
    legend.append(h("button", { type: "button", class: `link seg-${kind}-text`, "data-patch": filter, onclick: pick }, `${count} ${label}`), " ");
  }
  const security = fleet.withSecurityUpdates > 0
    ? ` (the oldest waiting under 1 day: ${fleet.securityUnder1Day}, 1–7 days: ${fleet.security1To7Days}, over 7 days: ${fleet.securityOver7Days})`
    : "";
  return h(
    "section",
    { class: "patch", id: "patch-status", "data-devices": fleet.devices },
    bar,
    legend,
    h("p", { class: "muted" }, `${fleet.rebootPending} reboot pending · ${fleet.stale} not assessed for ${fleet.staleAfterHours} hours${security}`),
  );
}

function patchCell(p) {
  if (!p) return h("span", { class: "muted" }, "not assessed");
  return h("span", { title: `assessed ${when(p.assessedAt)}` }, p.summary);
}

async function fleetPage(main) {
  const params = new URLSearchParams({ offset: fleetQuery.offset, limit: PAGE_SIZE, q: fleetQuery.q });
  if (fleetQuery.state) params.set("state", fleetQuery.state);
  if (fleetQuery.patch) params.set("patch", fleetQuery.patch);
  const [page, fleet, pending] = await Promise.all([
    api(`/devices/page?${params}`),
    api("/patch-status"),
    api("/device-keys?state=pending"),
  ]);
  const search = h("input", { type: "search", id: "fleet-search", placeholder: "Search id, group, label, OS, version", value: fleetQuery.q });
  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      fleetQuery.q = search.value;
      fleetQuery.offset = 0;
      refresh();
    }, 300);
  });
  const state = h(
    "select",
    { id: "fleet-state" },
    ["", "online", "offline", "never_connected", "decommissioned"].map((s) =>
      h("option", { value: s, selected: s === fleetQuery.state }, s ? s.replace("_", " ") : "every state"),
    ),
  );
  state.addEventListener("change", () => {
    fleetQuery.state = state.value;
    fleetQuery.offset = 0;
    refresh();
  });
  const patch = h(
    "select",
    { id: "fleet-patch" },
    PATCH_STATES.map(([value, label]) => h("option", { value, selected: value === fleetQuery.patch }, label)),
  );
  patch.addEventListener("change", () => {
    fleetQuery.patch = patch.value;
    fleetQuery.offset = 0;
    refresh();
  });
  const first = page.total === 0 ? 0 : fleetQuery.offset + 1;
  const last = Math.min(fleetQuery.offset + PAGE_SIZE, page.total);
  const pager = h(
    "span",
    { class: "muted", id: "fleet-count" },
    `${first}–${last} of ${page.total} devices `,
    h("button", { type: "button", disabled: fleetQuery.offset === 0, onclick: () => { fleetQuery.offset = Math.max(0, fleetQuery.offset - PAGE_SIZE); refresh(); } }, "‹ Previous"),
    " ",
    h("button", { type: "button", disabled: last >= page.total, onclick: () => { fleetQuery.offset += PAGE_SIZE; refresh(); } }, "Next ›"),
  );
  const rows = page.items.map((d) => {
    const job = d.currentJob;
    return h(
      "tr",
      { "data-device": d.id },
      h("td", {}, deviceLink(d.id)),
      h("td", {}, badge(d.state)),
      h("td", { title: when(d.lastSeen) }, ago(d.lastSeen)),
      h("td", {}, d.agentVersion || "–"),
      h("td", {}, d.osRelease || "–"),
      h("td", {}, (d.groups || []).join(", ")),
      h("td", {}, Object.entries(d.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ")),
      h("td", { class: "patch-cell" }, patchCell(d.patch)),
      h("td", {}, job ? [jobLink(job.run), " ", jobState(job), job.step ? ` ${job.step}` : ""] : "–"),
    );
  });
  main.replaceChildren(
    h("h2", {}, "Fleet"),
    ...joining(pending),
    patchBar(fleet),
    h("div", { class: "toolbar" }, search, state, patch, pager),
    table(["Device", "State", "Last seen", "Agent", "OS", "Groups", "Labels", "Updates", "Current job"], rows, "No device matches."),
  );
}

// Devices that enrolled their own key and wait for an operator (issue 55):
// an admin accepts or rejects each here, as with `drover devices accept`.
function joining(pending) {
  if (!pending.length) return [];
  const rows = pending.map((k) => {
    const id = encodeURIComponent(k.device);
    const actions = may("admin")
      ? [
          confirmButton("Accept", "Confirm: accept", `accept-${k.device}`, () => api(`/devices/${id}/accept`, { method: "POST" })),
          " ",
          confirmButton("Reject", "Confirm: reject", `reject-${k.device}`, () => api(`/devices/${id}/reject`, { method: "POST" })),
        ]
      : "–";
    const notes = [k.existingDevice ? "a device of this id existed" : "", k.conflict ? "another key asked for this id" : ""].filter(Boolean);
    return h(
      "tr",
      { "data-pending": k.device },
      h("td", {}, printable(k.device)),
      h("td", { title: k.publicKey }, `${k.publicKey.slice(0, 12)}…`),
      h("td", {}, printable(k.token || "–")),
      h("td", {}, printable(k.hostname || "–")),
      h("td", {}, printable(k.architecture || "–")),
      h("td", {}, printable(k.peer || "–")),
      h("td", { title: when(k.requestedAt) }, ago(k.requestedAt)),
      h("td", {}, notes.join("; ") || "–"),
      h("td", {}, actions),
    );
  });
  return [
    h("h3", { id: "pending-devices" }, `Waiting to join (${pending.length})`),
    table(["Device", "Key", "Token", "Host name", "Arch", "From", "Asked", "Note", ""], rows, ""),
  ];
}

// A job's run, deployment or schedule-made run, linked; one deleted since
// (the device's history kept the job) is named, not linked.
function jobLink(run, deleted) {
  if (!run) return "a job";
  if (deleted) return h("span", { class: "deleted", title: "deleted since; the device's history kept this job" }, `${run} (deleted)`);
  if (run.startsWith("deployment/")) return h("a", { href: `#/deployments/${encodeURIComponent(run.slice(11))}` }, run);
  return h("a", { href: `#/runs/${encodeURIComponent(run)}` }, run);
}

async function runsPage(main) {
  const runs = await api("/taskruns");
  runs.sort((a, b) => String(b.metadata.creationTimestamp || "").localeCompare(String(a.metadata.creationTimestamp || "")));
  const rows = runs.map((run) => {
    const s = run.status || {};
    return h(
      "tr",
      { "data-run": run.metadata.name },
      h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(run.metadata.name)}` }, run.metadata.name)),
      h("td", { class: "phase" }, badge(s.phase)),
      h("td", {}, progress(s.succeeded || 0, s.failed || 0, s.targets || 0), ` ${s.succeeded || 0}/${s.targets || 0}`),
      h("td", { class: "num" }, s.released ?? "–"),
      h("td", { class: "num" }, s.failed ?? "–"),
      h("td", { title: s.reasonText || "" }, s.reason || ""),
      h("td", {}, when(s.startTime)),
      h("td", {}, when(s.completionTime)),
    );
  });
  main.replaceChildren(
    h("h2", {}, "Task runs"),
    table(["Run", "Phase", "Progress", "Released", "Failed", "Reason", "Started", "Ended"], rows, "No task run yet."),
  );
}

// A failed job's reason in apt's (or the failing program's) own words,
// one line each, as the device said them.
function reasonBlock(lines) {
  if (!lines || lines.length === 0) return "";
  return h("pre", { class: "reason" }, lines.join("\n"));
}

function stepList(status) {
  const steps = (status && status.steps) || [];
  if (steps.length === 0) return "–";
  return h(
    "ul",
    { class: "steps" },
    steps
      .filter((step) => step.state !== "Pending")
      // A step's error that the job's error already says ("step preflight
      // failed: …") is shown once, in the row's error column.
      .map((step) => h("li", {}, `${step.name}: `, badge(step.state), step.error && !(status.error || "").includes(step.error) ? h("span", { class: "error" }, ` ${step.error}`) : "")),
  );
}

async function runPage(main, name) {
  const [run, targets] = await Promise.all([
    api(`/taskruns/${encodeURIComponent(name)}`),
    api(`/taskruns/${encodeURIComponent(name)}/targets?limit=500`),
  ]);
  const s = run.status || {};
  const terminal = s.phase === "Complete" || s.phase === "Failed";
  const actions = terminal
    ? []
    : !may("operator") ? []
    : [confirmButton("Cancel run", "Confirm: cancel this run", "cancel-run", () => api(`/taskruns/${encodeURIComponent(name)}/cancel`, { method: "POST" }))];
  const rows = targets.items.map((t) => {
    const status = t.status || {};
    return h(
      "tr",
      { "data-device": t.device },
      h("td", {}, t.device),
      h("td", {}, t.canary ? "canary" : ""),
      h("td", { class: "state" }, jobState(t)),
      h("td", {}, stepList(status)),
      h("td", { class: "result" }, t.resultText || ""),
      h("td", { class: "error" }, status.error || "", reasonBlock(status.reason)),
      h("td", {}, when(status.finishedAt || status.startedAt || status.acceptedAt)),
      h("td", { class: "waiting", title: t.waiting ? t.waiting.code : "" }, t.waiting ? t.waiting.text : ""),
    );
  });
  main.replaceChildren(
    h("h2", {}, "Task run ", name, " ", h("span", { id: "run-phase" }, badge(s.phase))),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Progress"), h("dd", { id: "run-progress" }, progress(s.succeeded || 0, s.failed || 0, s.targets || 0), ` ${s.succeeded || 0} of ${s.targets || 0} succeeded, ${s.failed || 0} failed, ${s.released || 0} released`),
      h("dt", {}, "Reason"), h("dd", { id: "run-reason" }, reason(s)),
      h("dt", {}, "Latest error"), h("dd", { class: "error" }, s.latestError || "–"),
      h("dt", {}, "Deadline"), h("dd", { id: "run-deadline" }, `${duration(run.spec.deadlineSeconds)} after the start`),
      h("dt", {}, "Started"), h("dd", {}, when(s.startTime)),
      h("dt", {}, "Ended"), h("dd", {}, when(s.completionTime)),
    ),
    h("div", { class: "toolbar" }, actions),
    table(["Device", "", "State", "Steps", "Result", "Error", "Updated", "Why it waits"], rows, "No target yet (planning)."),
    targets.total > targets.items.length ? h("p", { class: "muted" }, `The first ${targets.items.length} of ${targets.total} targets.`) : "",
  );
}

async function deploymentsPage(main) {
  const deployments = await api("/deployments");
  const rows = deployments.map((d) => {
    const s = d.status || {};
    return h(
      "tr",
      { "data-deployment": d.metadata.name },
      h("td", {}, h("a", { href: `#/deployments/${encodeURIComponent(d.metadata.name)}` }, d.metadata.name)),
      h("td", {}, badge(s.phase)),
      h("td", {}, progress(s.succeeded || 0, (s.failed || 0) + (s.expired || 0), s.targets || 0)),
      ["pending", "queued", "running", "succeeded", "failed", "expired", "canceled"].map((k) => h("td", { class: "num" }, s[k] ?? 0)),
      h("td", { title: s.reasonText || "" }, s.reason || ""),
    );
  });
  main.replaceChildren(
    h("h2", {}, "Deployments"),
    table(["Deployment", "Phase", "Progress", "Pending", "Queued", "Running", "Succeeded", "Failed", "Expired", "Canceled", "Reason"], rows, "No deployment yet."),
  );
}

async function deploymentPage(main, name) {
  const path = `/deployments/${encodeURIComponent(name)}`;
  const [deployment, targets] = await Promise.all([api(path), api(`${path}/targets?limit=500`)]);
  const s = deployment.status || {};
  const terminal = s.phase === "Complete" || s.phase === "Failed";
  const actions = terminal
    ? []
    : !may("operator") ? []
    : [confirmButton("Cancel deployment", "Confirm: cancel this deployment", "cancel-deployment", () => api(`${path}/cancel`, { method: "POST" }))];
  const rows = targets.items.map((t) =>
    h(
      "tr",
      { "data-device": t.device },
      h("td", {}, t.device),
      h("td", {}, badge(t.state)),
      h("td", { class: "num" }, t.attempt),
      h("td", { class: "error" }, t.lastError || ""),
      h("td", {}, when(t.nextAttemptAt)),
      h("td", { class: "waiting", title: t.waiting ? t.waiting.code : "" }, t.waiting ? t.waiting.text : ""),
    ),
  );
  main.replaceChildren(
    h("h2", {}, "Deployment ", name, " ", badge(s.phase)),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Progress"), h("dd", {}, progress(s.succeeded || 0, (s.failed || 0) + (s.expired || 0), s.targets || 0), ` ${s.succeeded || 0} of ${s.targets || 0} succeeded`),
      h("dt", {}, "Counts"), h("dd", {}, ["pending", "queued", "running", "failed", "expired", "canceled"].map((k) => `${k} ${s[k] ?? 0}`).join(", ")),
      h("dt", {}, "Reason"), h("dd", {}, reason(s)),
      h("dt", {}, "Latest error"), h("dd", { class: "error" }, s.latestError || "–"),
      h("dt", {}, "Failure threshold"), h("dd", { id: "deployment-threshold" }, thresholdText(deployment.spec.failureThreshold, s.failureThresholdReachedAt)),
      h("dt", {}, "Release rate"), h("dd", {}, deployment.spec.maxReleasesPerMinute ? `at most ${deployment.spec.maxReleasesPerMinute} a minute` : "no limit"),
      h("dt", {}, "Started"), h("dd", {}, when(s.startTime)),
      h("dt", {}, "Ended"), h("dd", {}, when(s.completionTime)),
    ),
    h("div", { class: "toolbar" }, actions),
    table(["Device", "State", "Attempt", "Last error", "Next attempt", "Why it waits"], rows, "No target yet."),
  );
}

// A deployment's failure threshold in words, and when it was reached.
function thresholdText(threshold, reachedAt) {
  if (!threshold) return "none";
  const limit = threshold.failed ? `${threshold.failed} targets ended failed` : `${threshold.percent}% of the ended targets failed`;
  const min = threshold.minEnded ? `, once ${threshold.minEnded} have ended` : "";
  const reached = reachedAt ? h("span", { class: "error" }, " — reached ", when(reachedAt)) : "";
  return h("span", {}, `stops when ${limit}${min}`, reached);
}

function deviceLink(id) {
  return h("a", { href: `#/devices/${encodeURIComponent(id)}` }, id);
}

// The packages an upgrade changed, one a line (as `drover describe device`).
function upgradeReport(output) {
  const upgrade = (output && output.upgrade) || {};
  const lines = [];
  for (const [key, label] of [["upgraded", "upgraded"], ["installed", "new"]]) {
    for (const c of upgrade[key] || []) lines.push(`${label} ${c.name} ${c.from || "–"} → ${c.to}`);
  }
  for (const name of upgrade.removed || []) lines.push(`removed ${name}`);
  for (const name of upgrade.keptBack || []) lines.push(`kept back ${name}`);
  if (upgrade.rebootRequired) lines.push("the device rebooted for it");
  return lines.length ? h("ul", { class: "steps", id: "upgrade-packages" }, lines.map((l) => h("li", {}, l))) : "";
}

// A job's output shown on a device page, by device: fetched from the
// device when asked (`drover logs`), and kept shown when a live update
// redraws the page.
const shownOutput = new Map();

function outputSection(device) {
  const shown = shownOutput.get(device);
  if (!shown) return h("div", { id: "job-output" });
  const body = shown.error
    ? h("p", { class: "error", id: "job-output-error" }, shown.error)
    : h("pre", { class: "output", id: "job-output-text" }, shown.text === undefined ? "Asking the device…" : shown.text);
  return h("div", { id: "job-output" }, h("h3", {}, `Output of job ${shown.job.slice(0, 8)}, from the device`), body);
}

function outputButton(device, job) {
  const button = h("button", { type: "button", "data-output": job }, "Output");
  button.addEventListener("click", async () => {
    const show = (shown) => {
      shownOutput.set(device, shown);
      const section = document.getElementById("job-output");
      if (section) section.replaceWith(outputSection(device));
    };
    show({ job });
    try {
      const path = `/devices/${encodeURIComponent(device)}/logs?job=${encodeURIComponent(job)}`;
      show({ job, text: await api(path, { text: true }) });
    } catch (e) {
      show({ job, error: e.message });
    }
  });
  return button;
}

// One device: what it is, its patch status with the pending packages, the
// last upgrade's report, its alerts, its job history and a job's output.
async function devicePage(main, id) {
  const path = `/devices/${encodeURIComponent(id)}`;
  const [device, jobs, alerts, assessment] = await Promise.all([
    api(path),
    api(`${path}/jobs`),
    api("/alerts"),
    api(`${path}/assessment`).catch(() => null),
  ]);
  showAlertCount(alerts);
  const labels = { ...(device.labels || {}), ...(device.maintainedLabels || {}) };
  const state = device.decommissioned ? "decommissioned" : device.online ? "online" : device.agentPresent ? "offline" : "never connected";
  const a = assessment;
  const patch = a
    ? [
        h("dt", {}, "Patch status"), h("dd", { id: "device-patch" }, a.summary, h("span", { class: "muted" }, ` (assessed ${ago(a.assessedAt)})`)),
        h("dt", {}, "Reboot"), h("dd", { id: "device-reboot" }, a.rebootPending ? h("span", { class: "error" }, `pending: ${a.rebootPending}`) : "not pending"),
        h("dt", {}, "Kernel"), h("dd", {}, `${a.runningKernel || "–"} running`, a.newestKernel ? `, ${a.newestKernel} installed` : ""),
        h("dt", {}, "Security archive"), h("dd", {}, a.securityArchive ? "in the device's sources" : "none in the device's sources"),
      ]
    : [h("dt", {}, "Patch status"), h("dd", { id: "device-patch" }, h("span", { class: "muted" }, "not assessed yet"))];
  const pending = a
    ? table(
        ["Package", "From", "To", "Security", "Waiting"],
        (a.pending || []).map((p) =>
          h(
            "tr",
            { "data-package": p.name },
            h("td", {}, p.name),
            h("td", {}, p.from || "(new)"),
            h("td", {}, p.to),
            h("td", {}, p.security ? badge("security") : ""),
            h("td", {}, p.since ? duration((Date.now() - new Date(p.since).getTime()) / 1000) : "–"),
          ),
        ),
        "Nothing pending.",
      )
    : "";
  const last = jobs.lastUpgrade;
  const lastUpgrade = last
    ? h(
        "div",
        { id: "last-upgrade" },
        h("p", {}, `${when(last.finishedAt)}, `, jobLink(last.run, last.runDeleted), `: ${last.resultText || "succeeded"}`),
        upgradeReport(last.output),
      )
    : h("p", { class: "muted", id: "last-upgrade" }, "No upgrade has succeeded on this device yet.");
  const mine = alerts.items.filter((x) => x.resource === `device/${id}`);
  const history = jobs.items.map((j) =>
    h(
      "tr",
      { "data-job": j.job },
      h("td", { title: j.job }, j.job.slice(0, 8)),
      h("td", {}, j.kind),
      h("td", {}, jobLink(j.run, j.runDeleted)),
      h("td", {}, jobState(j)),
      h("td", {}, when(j.finishedAt)),
      h("td", { class: "result" }, j.resultText || ""),
      h("td", { class: "error" }, j.error || "", reasonBlock(j.reason)),
      h("td", {}, outputButton(id, j.job)),
    ),
  );
  main.replaceChildren(
    h("h2", {}, "Device ", id, " ", h("span", { id: "device-state" }, badge(state.replace(" ", "_")))),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Last seen"), h("dd", {}, device.lastSeen ? `${ago(device.lastSeen)} (${when(device.lastSeen)})` : "never"),
      h("dt", {}, "Agent"), h("dd", {}, device.agentVersion || "–", device.transport ? ` over ${device.transport}` : ""),
      h("dt", {}, "OS"), h("dd", {}, device.osRelease || "–", device.architecture ? ` (${device.architecture})` : ""),
      h("dt", {}, "Groups"), h("dd", {}, (device.groups || []).join(", ") || "–"),
      h("dt", {}, "Labels"), h("dd", { id: "device-labels" }, Object.entries(labels).map(([k, v]) => `${k}=${v}`).join(", ") || "–"),
      h("dt", {}, "Time zone"), h("dd", {}, device.timeZone || "the tenant's default"),
      patch,
    ),
    h("h3", {}, "Alerts"),
    h("div", { id: "device-alerts" }, table(ALERT_HEADERS, mine.map(alertRow), "Nothing needs attention.")),
    h("h3", {}, "Pending updates"),
    h("div", { id: "device-pending" }, a ? pending : h("p", { class: "muted" }, "Not assessed yet.")),
    a && a.omitted > 0 ? h("p", { class: "muted" }, `${a.omitted} more not listed.`) : "",
    h("h3", {}, "Last upgrade"),
    lastUpgrade,
    h("h3", {}, "Job history"),
    h("div", { id: "device-jobs" }, table(["Job", "Kind", "Run", "State", "Finished", "Result", "Error", ""], history, "No job yet.")),
    jobs.total > jobs.items.length ? h("p", { class: "muted" }, `The latest ${jobs.items.length} of ${jobs.total} jobs.`) : "",
    outputSection(id),
  );
}

async function schedulesPage(main) {
  const schedules = await api("/taskschedules");
  const rows = schedules.map((schedule) => {
    const name = schedule.metadata.name;
    const s = schedule.status || {};
    const suspended = schedule.spec.suspend === true;
    const toggle = may("operator") ? h("button", { type: "button", "data-suspend": name }, suspended ? "Resume" : "Suspend") : "";
    if (toggle) toggle.addEventListener("click", async () => {
      toggle.disabled = true;
      await api(`/taskschedules/${encodeURIComponent(name)}/suspend`, { method: "POST", body: { suspend: !suspended } }).catch((e) => toggle.after(h("span", { class: "error" }, ` ${e.message}`)));
      await refresh();
    });
    return h(
      "tr",
      { "data-schedule": name },
      h("td", {}, name),
      h("td", {}, JSON.stringify(schedule.spec.schedule)),
      h("td", {}, suspended ? badge("suspended") : "active"),
      h("td", {}, when(s.lastTick)),
      h("td", {}, when(s.nextTick)),
      h("td", {}, s.activeRun ? jobLink(s.activeRun) : "–"),
      h("td", { class: "num" }, s.skippedTicks ?? 0),
      h("td", {}, toggle),
    );
  });
  main.replaceChildren(
    h("h2", {}, "Schedules"),
    table(["Schedule", "When (UTC)", "State", "Last tick", "Next tick", "Active run", "Skipped", ""], rows, "No schedule yet."),
  );
}

function resourceLink(resource) {
  const [kind, name] = resource.split("/");
  if (kind === "taskrun") return h("a", { href: `#/runs/${encodeURIComponent(name)}` }, resource);
  if (kind === "deployment") return h("a", { href: `#/deployments/${encodeURIComponent(name)}` }, resource);
  if (kind === "device") return h("a", { href: `#/devices/${encodeURIComponent(name)}` }, resource);
  return resource;
}

// One alert as a row, with its acknowledgement or the button that makes one.
function alertRow(a) {
  return h(
    "tr",
    { "data-alert": a.kind, "data-resource": a.resource, class: a.acknowledged ? "acknowledged" : null },
    h("td", {}, badge(a.severity)),
    h("td", {}, a.kind),
    h("td", {}, resourceLink(a.resource)),
    h("td", {}, a.message),
    h("td", {}, when(a.at)),
    h(
      "td",
      { class: "ack" },
      a.acknowledged
        ? `acknowledged by ${a.acknowledged.by}, ${ago(a.acknowledged.at)}`
        : !may("operator") ? ""
        : confirmButton("Acknowledge", "Acknowledge: sure?", `ack-${a.kind}-${a.resource}`, () =>
            api("/alerts/ack", { method: "POST", body: { kind: a.kind, resource: a.resource } }),
          ),
    ),
  );
}

const ALERT_HEADERS = ["Severity", "Alert", "About", "What", "Since", ""];

async function alertsPage(main) {
  const alerts = await api("/alerts");
  showAlertCount(alerts);
  const rows = alerts.items.map(alertRow);
  const more = alerts.offlineDevices > alerts.items.filter((a) => a.kind === "DeviceOffline").length
    ? h("p", { class: "muted" }, `${alerts.offlineDevices} devices offline for more than ${alerts.offlineAfterMinutes} minutes (the longest offline are listed).`)
    : "";
  main.replaceChildren(
    h("h2", {}, "Alerts"),
    table(ALERT_HEADERS, rows, "Nothing needs attention."),
    more,
  );
}

function showAlertCount(alerts) {
  const critical = alerts.items.filter((a) => a.severity === "critical" && !a.acknowledged).length;
  document.getElementById("alert-count").textContent = critical > 0 ? String(critical) : "";
}

// What an entry touched: its objects, or the kind and name its request named.
function auditObject(e) {
  if (e.objects && e.objects.length) {
    const listed = e.objects.map((o) => `${o.kind}/${o.name}${o.result ? ` ${o.result}` : ""}`).join(", ");
    const more = (e.objectsTotal || 0) - e.objects.length;
    return more > 0 ? `${listed} and ${more} more` : listed;
  }
  if (e.kind && e.name) return `${e.kind}/${e.name}`;
  return e.kind || "–";
}

const auditQuery = { offset: 0 };

async function auditPage(main) {
  // Every entry of the last 7 days, newest first, a page at a time.
  const entries = (await api("/audit?since=7d")).reverse();
  const total = entries.length;
  auditQuery.offset = Math.min(auditQuery.offset, Math.max(0, total - 1));
  const first = total === 0 ? 0 : auditQuery.offset + 1;
  const last = Math.min(auditQuery.offset + PAGE_SIZE, total);
  const pager = h(
    "span",
    { class: "muted", id: "audit-count" },
    `${first}–${last} of ${total} entries `,
    h("button", { type: "button", id: "audit-newer", disabled: auditQuery.offset === 0, onclick: () => { auditQuery.offset = Math.max(0, auditQuery.offset - PAGE_SIZE); refresh(); } }, "‹ Newer"),
    " ",
    h("button", { type: "button", id: "audit-older", disabled: last >= total, onclick: () => { auditQuery.offset += PAGE_SIZE; refresh(); } }, "Older ›"),
  );
  const rows = entries.slice(auditQuery.offset, auditQuery.offset + PAGE_SIZE).map((e) =>
    h(
      "tr",
      { "data-audit": e.verb, "data-who": e.who, "data-outcome": e.outcome },
      h("td", {}, when(e.at)),
      h("td", {}, e.who),
      h("td", {}, e.via),
      h("td", {}, e.peer || "–"),
      h("td", {}, e.verb),
      h("td", {}, auditObject(e)),
      h("td", { class: e.outcome === "applied" ? "" : "error" }, `${e.outcome} ${e.status}`),
      h("td", {}, e.reason || ""),
    ),
  );
  main.replaceChildren(
    h("h2", {}, "Audit log"),
    h("p", { class: "muted" }, "Every change and every refused request of the last 7 days, newest first (`drover audit` for older ones)."),
    pager,
    table(["When", "Who", "Via", "From", "Verb", "Object", "Outcome", "Reason"], rows, "Nothing recorded yet."),
  );
}

// --- routing and live updates --------------------------------------------

function route() {
  const parts = (location.hash || "#/fleet").slice(2).split("/").map(decodeURIComponent);
  const [page, name] = parts;
  const section = page === "devices" ? "fleet" : page;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.nav === section);
  switch (page) {
    case "runs":
      return name ? { topics: ["runs", "jobs"], render: (m) => runPage(m, name) } : { topics: ["runs"], render: runsPage };
    case "deployments":
      return name ? { topics: ["deployments", "jobs"], render: (m) => deploymentPage(m, name) } : { topics: ["deployments"], render: deploymentsPage };
    case "devices":
      return { topics: ["devices", "jobs", "alerts"], render: (m) => devicePage(m, name) };
    case "schedules":
      return { topics: ["schedules", "runs"], render: schedulesPage };
    case "alerts":
      return { topics: ["runs", "deployments", "devices", "alerts"], render: alertsPage };
    case "audit":
      return { topics: ["audit"], render: auditPage };
    default:
      return { topics: ["devices", "jobs"], render: fleetPage };
  }
}

async function refresh() {
  const main = document.getElementById("main");
  try {
    await current.render(main);
    document.body.dataset.rendered = String(Date.now());
  } catch (e) {
    main.replaceChildren(h("p", { class: "error" }, `Cannot load this page: ${e.message}`));
  }
}

function changed(topics) {
  const touched = topics.includes("all") || topics.some((t) => current.topics.includes(t));
  if (touched) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, 200);
  }
  if (topics.some((t) => ["all", "runs", "deployments", "alerts"].includes(t))) {
    clearTimeout(alertTimer);
    alertTimer = setTimeout(() => api("/alerts").then(showAlertCount).catch(() => {}), 1000);
  }
}

function listen() {
  const live = document.getElementById("live");
  const source = new EventSource("/ui/events");
  source.addEventListener("open", () => live.classList.add("on"));
  source.addEventListener("error", () => live.classList.remove("on"));
  source.addEventListener("changed", (event) => changed(event.data.split(",")));
}

async function startApp() {
  const session = await fetch("/ui/session", { credentials: "same-origin" });
  if (session.status === 401) {
    location.href = "/ui/login";
    return;
  }
  const who = await session.json();
  csrf = who.csrf;
  me = { operator: who.operator, role: who.role };
  document.getElementById("whoami").textContent = `${me.operator} (${me.role})`;
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", {
      method: "POST",
      credentials: "same-origin",
      headers: csrf ? { "x-drover-csrf": csrf } : {},
    });
    location.href = "/ui/login";
  });
  window.addEventListener("hashchange", () => {
    armed.clear();
    current = route();
    refresh();
  });
  current = route();
  await refresh();
  listen();
  api("/alerts").then(showAlertCount).catch(() => {});
}

function startLogin() {
  const form = document.getElementById("login-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = document.getElementById("login-error");
    error.textContent = "";
    const response = await fetch("/ui/login", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token: document.getElementById("token").value }),
      credentials: "same-origin",
    });
    if (response.ok) {
      location.href = "/ui/";
    } else {
      const body = await response.json().catch(() => ({}));
      error.textContent = body.error || `Log in failed (${response.status})`;
    }
  });
}

if (document.body.dataset.page === "login") startLogin();
else startApp();
