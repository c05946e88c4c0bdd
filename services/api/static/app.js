// Wires the page together: the key, the form, the job on screen and the recent jobs.

import { ApiError, apiKey, getJSON, postJSON, setApiKey } from "./js/api.js";
import { JobForm } from "./js/form.js";
import { JobView } from "./js/job.js";
import { RecentJobs } from "./js/recent.js";

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
const recent = new RecentJobs({
  onOpen: (id) => view.open(id).catch(reportError),
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
    view.open(job).catch(reportError);
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

showKeyState(false);
recent.start();
connect();
