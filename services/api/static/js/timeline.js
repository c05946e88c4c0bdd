// A final job's timeline: each output's queued, leased, started and finished times (as
// offsets from the job's acceptance), its attempts and worker, and the job's trace id, read
// from GET /v1/jobs/{id}?include=timeline.

import { getJSON } from "./api.js";

const $ = (sel) => document.querySelector(sel);

export async function showTimeline(id, signal) {
  const box = $("#job-timeline");
  box.hidden = true;
  let job;
  try {
    job = await getJSON(`/v1/jobs/${id}?include=timeline`, { signal });
  } catch {
    return; // the card shows the job without it
  }
  if (signal.aborted || !job.timeline) return;
  $("#job-trace").textContent = job.trace_id ? `Trace ${job.trace_id}` : "";
  $("#job-trace").hidden = !job.trace_id;
  const rows = job.timeline.map((t) => row(t, Date.parse(job.created_at)));
  $("#timeline tbody").replaceChildren(...rows);
  box.hidden = false;
}

function row(t, from) {
  const tr = document.createElement("tr");
  const cells = [`#${t.index + 1}`, at(t.queued_at, from), at(t.leased_at, from),
    at(t.started_at, from), at(t.finished_at, from), String(t.attempts), t.worker || "–"];
  for (const text of cells) {
    const td = document.createElement("td");
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

// Seconds after the job was accepted; the worker's clock may differ from Redis's by a little.
function at(when, from) {
  if (!when) return "–";
  const s = (Date.parse(when) - from) / 1000;
  return `+${Math.max(0, s).toFixed(3)} s`;
}
