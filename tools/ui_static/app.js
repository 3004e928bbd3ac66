// The cluster status page: polls /api/cluster every 2 s and rebuilds the view.
// Every name comes from ZooKeeper (stream, namespace, subscription and bookie names are chosen by
// users), so text is only ever set with textContent, never parsed as HTML.
"use strict";

const POLL_INTERVAL_MS = 2000;
const FETCH_TIMEOUT_MS = 15000;

function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function number(value) {
  return value === null || value === undefined ? "—" : Number(value).toLocaleString("en-US");
}

function size(bytes) {
  if (bytes === null || bytes === undefined) return null;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

function cell(...children) { return el("td", null, ...children); }

// ------------------------------------------------------------------------------ bookies

function diskBar(percent) {
  if (percent === null || percent === undefined) return el("span", "muted", "—");
  const bar = el("span", "bar");
  const fill = el("span", percent >= 90 ? "fill high" : percent >= 75 ? "fill warn" : "fill");
  fill.style.width = `${Math.min(100, Math.max(0, percent))}%`;
  bar.append(fill);
  return el("span", "disk", bar, ` ${percent.toFixed(1)}%`);
}

function renderBookies(bookies, failed) {
  const body = document.querySelector("#bookies tbody");
  body.replaceChildren();
  document.getElementById("bookie-count").textContent = failed ? "" : `(${bookies.length})`;
  if (bookies.length === 0) {
    const empty = cell(failed ? "not known: see the error above" : "no bookie is registered");
    empty.colSpan = 8;
    empty.className = "muted";
    body.append(el("tr", null, empty));
  }
  for (const bookie of bookies) {
    const state = String(bookie.state || "unknown");
    const admin = bookie.admin === "unreachable" ? el("span", "badge bad", "unreachable")
      : bookie.admin === "ok" ? el("span", "badge ok", "ok") : el("span", "muted", "—");
    const row = el("tr", "bookie",
      cell(el("code", "bookie-id", bookie.id)), cell(bookie.address),
      cell(el("span", `badge state-${state.replace(/[^a-z_]/g, "")}`, state.replace("_", "-"))),
      cell(diskBar(bookie.disk_used_percent)),
      el("td", "number", bookie.adds_per_second === null ? el("span", "muted", "—") : number(bookie.adds_per_second)),
      el("td", "number", bookie.copied_bytes_per_second ? `${size(bookie.copied_bytes_per_second)}/s`
        : el("span", "muted", "—")),
      cell(bookie.rack || el("span", "muted", "—")), cell(admin));
    body.append(row);
  }
}

// ------------------------------------------------------------------------------ auto-recovery

function progressBar(progress) {
  if (!progress || !progress.total_entries) return el("span", "muted", "—");
  const percent = Math.min(100, 100 * progress.copied_entries / progress.total_entries);
  const bar = el("span", "bar");
  const fill = el("span", "fill");
  fill.style.width = `${percent}%`;
  bar.append(fill);
  return el("span", "disk", bar, ` ${number(progress.copied_entries)} / ${number(progress.total_entries)}`);
}

function renderRecovery(recovery, failed) {
  const summary = document.getElementById("recovery-summary");
  const body = document.querySelector("#underreplicated tbody");
  body.replaceChildren();
  if (!recovery) {
    summary.textContent = failed ? "" : "(unknown)";
    return;
  }
  const facts = [recovery.enabled ? "enabled" : "DISABLED", `auditor ${recovery.auditor || "none elected"}`,
                 `${number(recovery.underreplicated)} under-replicated`];
  summary.textContent = `(${facts.join(" · ")})`;
  if (recovery.ledgers.length === 0) {
    const empty = cell(recovery.underreplicated ? "…" : "every ledger is fully replicated");
    empty.colSpan = 6;
    empty.className = "muted";
    body.append(el("tr", null, empty));
  }
  for (const ledger of recovery.ledgers) {
    const missing = ledger.missing.map((b) => `${b} (${ledger.reasons[b]})`).join(", ");
    const since = new Date(ledger.since_ms).toLocaleTimeString("en-GB");
    body.append(el("tr", "underreplicated",
      cell(el("code", "ledger-id", String(ledger.ledger))), cell(missing), cell(since),
      cell(ledger.worker ? el("code", null, ledger.worker) : el("span", "muted", "waiting")),
      cell(progressBar(ledger.progress)),
      cell(ledger.error ? el("span", "badge bad", ledger.error) : el("span", "muted", "—"))));
  }
}

// ------------------------------------------------------------------------------ streams

function segmentBox(segment, grow, stream) {
  const known = ["in_progress", "completed", "truncated"].includes(segment.state) ? segment.state : "unknown";
  const state = segment.damaged ? "damaged" : known;  // its ledger is gone: its records are lost
  const box = el("div", `segment ${state}`);
  box.dataset.ledger = String(segment.ledger);
  box.style.flexGrow = String(grow);
  const records = segment.records === null ? "? records" : `${number(segment.records)} records`;
  const bytes = size(segment.bytes);
  box.append(el("div", "seg-top", el("span", "seq", `#${segment.sequence}`), el("span", "state", state.replace("_", " "))),
             el("div", "ledger", `ledger ${segment.ledger}`),
             el("div", "records", records),
             el("div", "entries muted", segment.last_entry === null ? "entries ?" :
               `entries ${segment.first_entry}–${segment.last_entry}`),
             el("div", "entries muted", bytes || (segment.state === "in_progress" ? "writing" : "")));
  box.title = `segment ${segment.sequence}, ledger ${segment.ledger}, ${state}` +
    `, min active ${segment.min_active}${segment.note ? "\n" + segment.note : ""}`;
  const point = stream.truncation_point;
  if (point && point.sequence === segment.sequence && point.position > 0) {
    const shade = el("div", "trunc-shade");  // the records below the truncation point are gone
    shade.style.width = `${point.position * 100}%`;
    const line = el("div", "trunc-line");
    line.style.left = `${point.position * 100}%`;
    line.title = `truncated before ${point.offset}`;
    box.prepend(shade, line);  // first, so the box's text paints over them
  }
  return box;
}

// Subscription flags hang below their segment's box; flags close together go on separate rows,
// and flags in the right part of a box point left so their names stay inside the timeline.
function addFlags(box, segment, stream) {
  const placed = [];
  for (const sub of stream.subscriptions) {
    if (sub.segment !== segment.sequence || sub.position === null) continue;
    const row = placed.filter((other) => Math.abs(other - sub.position) < 0.35).length;
    placed.push(sub.position);
    const right = sub.position > 0.6;
    const flag = el("div", right ? "sub-flag right" : "sub-flag",
      right ? el("span", null, sub.name) : "▲ ", right ? " ▲" : el("span", null, sub.name));
    flag.style.left = `${sub.position * 100}%`;
    flag.style.top = `calc(100% + ${2 + row * 15}px)`;
    flag.title = `${sub.name} at ${sub.offset}`;
    box.append(flag);
  }
  return placed.length;
}

function timeline(stream) {
  const line = el("div", "timeline");
  if (stream.segments_omitted > 0) {
    line.append(el("div", "segment omitted", `+${number(stream.segments_omitted)} older`));
  }
  const live = stream.segments.filter((s) => s.state !== "truncated");
  const total = live.reduce((sum, s) => sum + (s.records || 0), 0);
  let flagRows = 1;
  for (const segment of stream.segments) {
    let grow = 0;
    if (segment.state !== "truncated") grow = total > 0 ? (segment.records || 0) / total * 100 : 1;
    const box = segmentBox(segment, grow, stream);
    flagRows = Math.max(flagRows, addFlags(box, segment, stream));
    line.append(box);
  }
  line.style.paddingBottom = `${6 + flagRows * 15}px`;
  if (stream.segments.length === 0) line.append(el("div", "empty muted", "no segments yet"));
  return line;
}

function subscriptionTable(stream) {
  if (stream.subscriptions.length === 0) return el("p", "muted small", "no subscriptions");
  const table = el("table", "grid subs",
    el("thead", null, el("tr", null, el("th", null, "subscription"), el("th", null, "committed offset"),
      el("th", null, "segment"), el("th", "number", "lag (records)"))));
  const body = el("tbody");
  for (const sub of stream.subscriptions) {
    // estimated from record counts; a lower bound when some segment's records are unknown
    const prefix = !sub.lag_known ? "≥ " : sub.lag_records > 0 ? "≈ " : "";
    const lag = `${prefix}${number(sub.lag_records)}`;
    body.append(el("tr", "subscription",
      cell(el("code", "sub-name", sub.name)), cell(el("code", null, sub.offset)),
      cell(sub.segment === null ? "—" : `#${sub.segment}`, sub.note ? el("span", "note", ` ${sub.note}`) : null),
      el("td", `number${sub.lag_records > 0 ? " lagging" : ""}`, lag)));
  }
  table.append(body);
  return table;
}

function duration(ms) {
  for (const [unit, unitMs] of [["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]]) {
    if (ms && ms % unitMs === 0) return `${ms / unitMs}${unit}`;
  }
  return `${ms}ms`;
}

function settingsLine(settings) {
  if (!settings) return "";
  const retention = settings.retention_age_ms || settings.retention_bytes
    ? [settings.retention_age_ms ? `older than ${duration(settings.retention_age_ms)}` : null,
       settings.retention_bytes ? `over ${size(settings.retention_bytes)}` : null].filter(Boolean).join(" or ") +
      (settings.retention_keeps_unconsumed ? ", keeps unread" : "")
    : "off";
  const roll = [size(settings.roll_bytes), duration(settings.roll_age_ms),
                settings.roll_records ? `${number(settings.roll_records)} records` : null].filter(Boolean).join(" / ");
  return `E${settings.ensemble} Qw${settings.write_quorum} Qa${settings.ack_quorum} · roll at ${roll} · retention ${retention}`;
}

function streamCard(stream) {
  const card = el("article", "stream");
  card.dataset.stream = stream.name;
  const point = stream.truncation_point;
  const damaged = stream.segments.filter((s) => s.damaged).length;
  const facts = stream.error ? [el("span", "badge bad", stream.error)] : [
    `${number(stream.segments.length + stream.segments_omitted)} segments`,
    ` · ${number(stream.records)} records in live segments`,
    point ? ` · truncated before ${point.offset || "everything"}` : " · never truncated"];
  if (damaged) facts.push(" ", el("span", "badge bad", `${damaged} damaged`));
  card.append(el("div", "stream-head", el("h4", "stream-name", stream.name), el("span", "muted", ...facts)));
  if (!stream.error) {
    card.append(el("p", "settings muted small", settingsLine(stream.settings)), timeline(stream),
                subscriptionTable(stream));
  }
  return card;
}

function renderNamespaces(namespaces, failed) {
  const root = document.getElementById("namespaces");
  root.replaceChildren();
  let streams = 0;
  for (const namespace of namespaces) {
    const section = el("div", "namespace");
    section.append(el("h3", null, "namespace ", el("code", "ns-name", namespace.name)));
    if (namespace.error) section.append(el("p", "badge bad", namespace.error));
    if (namespace.streams.length === 0 && !namespace.error) section.append(el("p", "muted small", "no streams"));
    for (const stream of namespace.streams) section.append(streamCard(stream));
    if (namespace.streams_omitted > 0) {
      section.append(el("p", "muted small", `${number(namespace.streams_omitted)} more streams not shown`));
    }
    streams += namespace.streams.length + namespace.streams_omitted;
    root.append(section);
  }
  if (namespaces.length === 0) root.append(el("p", "muted", failed ? "not known: see the error above" : "no namespaces"));
  document.getElementById("stream-count").textContent = failed ? "" : `(${streams})`;
}

// ------------------------------------------------------------------------------ polling

function renderErrors(errors) {
  const list = document.getElementById("errors");
  list.replaceChildren(...errors.map((message) => el("li", null, message)));
}

function setStatus(ok, text) {
  const status = document.getElementById("status");
  status.className = `status ${ok ? "ok" : "bad"}`;
  status.textContent = text;
}

function render(data) {
  document.getElementById("where").textContent =
    `ZooKeeper ${data.zk} · cluster ${data.bookkeeper_root} · namespaces ${data.namespace_root}`;
  const failed = (data.errors || []).length > 0;
  renderErrors(data.errors || []);
  renderBookies(data.bookies || [], failed);
  renderRecovery(data.autorecovery, failed);
  renderNamespaces(data.namespaces || [], failed);
  const when = new Date(data.generated_ms).toLocaleTimeString("en-GB");
  setStatus((data.errors || []).length === 0, `updated ${when}`);
  document.body.dataset.loaded = "1";
}

async function poll() {
  try {
    const response = await fetch("/api/cluster", {cache: "no-store", signal: AbortSignal.timeout(FETCH_TIMEOUT_MS)});
    const data = await response.json();
    if (response.ok) render(data);
    else renderErrors(data.errors || [`the UI server answered ${response.status}`]);
  } catch (error) {
    setStatus(false, "UI server unreachable");
    renderErrors([`cannot fetch /api/cluster: ${error}`]);
  } finally {
    setTimeout(poll, POLL_INTERVAL_MS);
  }
}

poll();
