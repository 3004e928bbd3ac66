// The status page is rendered on the server with its data (dlog_tools/ui.py, render_page): it shows
// without this script. The script only keeps it fresh: every 2 s it fetches the same URL (with the
// stream filter in it) and swaps in the new header and main part, keeping the filter box the user
// may be typing in; typing in the box filters after a short pause, as submitting the form does.
"use strict";

const POLL_INTERVAL_MS = 2000;
const FETCH_TIMEOUT_MS = 25000;
const TYPING_PAUSE_MS = 300;

function filterBox() {
  return document.querySelector("#filter input[name=q]");
}

function pageUrl() {
  const query = filterBox() ? filterBox().value.trim() : "";
  return query ? `/?q=${encodeURIComponent(query)}` : "/";
}

function swap(fresh) {
  const header = fresh.getElementById("header");
  const main = fresh.getElementById("main");
  if (!header || !main) return;
  const box = filterBox();
  const typing = box !== null && document.activeElement === box;
  const freshForm = fresh.getElementById("filter");
  if (typing && freshForm) freshForm.replaceWith(document.getElementById("filter"));  // keep the caret
  document.getElementById("header").replaceWith(document.adoptNode(header));
  document.getElementById("main").replaceWith(document.adoptNode(main));
  document.title = fresh.title;
  if (typing) filterBox().focus();
}

let timer = null;

async function refresh() {
  clearTimeout(timer);
  try {
    const response = await fetch(pageUrl(), {cache: "no-store", signal: AbortSignal.timeout(FETCH_TIMEOUT_MS)});
    swap(new DOMParser().parseFromString(await response.text(), "text/html"));
  } catch (error) {
    const status = document.getElementById("status");
    status.className = "status bad";
    status.textContent = `UI server unreachable (${error})`;
  } finally {
    timer = setTimeout(refresh, POLL_INTERVAL_MS);
  }
}

let typingTimer = null;
document.addEventListener("input", (event) => {
  if (event.target !== filterBox()) return;
  clearTimeout(typingTimer);
  typingTimer = setTimeout(() => {
    history.replaceState(null, "", pageUrl());
    refresh();
  }, TYPING_PAUSE_MS);
});

timer = setTimeout(refresh, POLL_INTERVAL_MS);
