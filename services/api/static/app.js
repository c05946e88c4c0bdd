// Wires the page together: the key, the form, the job on screen and the recent jobs.

import { ApiError, apiKey, getJSON, postJSON, setApiKey } from "./js/api.js";
import { JobForm } from "./js/form.js";
import { JobView } from "./js/job.js";
import { RecentJobs } from "./js/recent.js";
import { jobFromHash, onJobHash, showJobHash } from "./js/route.js";

const $ = (sel) => document.querySelector(sel);

function banner(message) {
  const el = $("#banner");
  el.textContent = message || "";
  el.hidden = !message;
}

function showKeyState(error) {
  const state = $("#key-state");
  state.textContent = error ? "key needed" : apiKey() ? "key saved" : "";
  state.className = `key-state${error ? " bad" : ""}`;
  $("#api-key").toggleAttribute("aria-invalid", Boolean(error));
}

function reportError(err) {
  if (!(err instanceof ApiError)) throw err;
  if (err.status === 401) {
    showKeyState(true);
    $("#api-key").focus();
  }
  banner(err.message);
}

const view = new JobView((job) => recent.update(job));

// Every job shown gets its address, so a reload or a shared link shows it again.
function openJob(idOrJob) {
  showJobHash(typeof idOrJob === "string" ? idOrJob : idOrJob.id);
  view.open(idOrJob).catch(reportError);
}

const recent = new RecentJobs({
  onOpen: openJob,
  onCancel: (id) => view.cancel(id),
  watching: () => view.id,
});
const form = new JobForm(submit);

async function submit(body) {
  form.clearErrors();
  form.setBusy(true);
  try {
    const job = await postJSON("/v1/jobs", body);
    banner("");
    recent.add(job);
    openJob(job);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    form.showErrors(err);
    if (err.status === 401) showKeyState(true);
  } finally {
    form.setBusy(false);
  }
}

// A key saved while an earlier attempt is still out must not be judged by that attempt.
let attempt = 0;

async function connect() {
  const mine = ++attempt;
  try {
    await form.loadModels();
    // The model list is public; listing jobs is not, so it tells whether the key works.
    await getJSON("/v1/jobs?limit=1");
    if (mine !== attempt) return;
    banner("");
    showKeyState(false);
    document.body.dataset.connected = "true";
    // Only now: before the key works, the job would read as refused.
    const linked = jobFromHash();
    if (linked && linked !== view.id) openJob(linked);
    recent.refresh(() => true);
  } catch (err) {
    if (mine !== attempt) return;
    delete document.body.dataset.connected;
    reportError(err);
  }
}

$("#api-key").value = apiKey();
$("#key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey($("#api-key").value.trim());
  connect();
});
$("#key-forget").addEventListener("click", () => {
  setApiKey("");
  $("#api-key").value = "";
  connect();
});

onJobHash((id) => {
  if (!id) view.close();
  else if (id !== view.id) view.open(id).catch(reportError);
});

showKeyState(false);
recent.start();
connect();
