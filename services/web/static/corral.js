// corral's web UI: the few live parts of its server-rendered pages. Every page works without this file;
// with it, a batch's counts and a running job's log follow the server's event streams, and the DAG and
// the timeline are drawn in place when they arrive.
"use strict";

function followCounts(element) {
  const stream = new EventSource(element.dataset.liveCounts);
  const note = document.querySelector("[data-live-note]");
  stream.addEventListener("counts", (message) => {
    const update = JSON.parse(message.data);
    for (const [state, count] of Object.entries(update.counts)) {
      const cell = element.querySelector(`[data-count="${state}"]`);
      if (cell) cell.textContent = String(count);
    }
    const badge = document.querySelector('[data-live-field="state"]');
    if (badge) {
      badge.textContent = update.state;
      badge.className = `badge state-${update.state}`;
    }
    const cost = document.querySelector('[data-live-field="cost"]');
    if (cost) cost.textContent = update.cost;
  });
  stream.addEventListener("end", () => {
    stream.close();
    if (note) note.textContent = "This batch is complete.";
  });
  stream.addEventListener("gone", () => {
    stream.close();
    if (note) note.textContent = "The counts stopped following the batch: reload the page to follow it again.";
  });
}

async function drawInPlace(figure) {
  const response = await fetch(figure.dataset.svgSrc, { credentials: "same-origin" });
  if (!response.ok) return;
  const parsed = new DOMParser().parseFromString(await response.text(), "image/svg+xml");
  const svg = parsed.documentElement;
  if (svg.nodeName !== "svg" || parsed.querySelector("parsererror")) return;
  figure.insertBefore(document.importNode(svg, true), figure.firstChild);
  const summary = response.headers.get("X-Corral-Summary");
  const caption = document.getElementById(figure.dataset.summaryTarget);
  if (summary && caption) caption.textContent = summary;
}

const MAX_LOG_CHARS = 1 << 20;

function followLog(pre) {
  const stream = new EventSource(pre.dataset.liveLog);
  stream.addEventListener("log", (message) => {
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    let text = pre.textContent + JSON.parse(message.data).text;
    if (text.length > MAX_LOG_CHARS) text = text.slice(text.length - MAX_LOG_CHARS);
    pre.textContent = text;
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  });
  stream.addEventListener("end", (message) => {
    stream.close();
    const state = JSON.parse(message.data).state;
    const note = document.createElement("p");
    note.className = "hint";
    note.setAttribute("role", "status");
    note.textContent = state ? `The job ended: ${state}.` : "The attempt ended.";
    pre.after(note);
  });
  stream.addEventListener("gone", () => stream.close());
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live-counts]").forEach(followCounts);
  document.querySelectorAll("figure[data-svg-src]").forEach((figure) => { drawInPlace(figure); });
  document.querySelectorAll("pre[data-live-log]").forEach(followLog);
});
