// The jobs submitted from this browser, kept in localStorage, with their latest known states.

import { ApiError, getJSON } from "./api.js";
import { FINAL } from "./job.js";
import { jobHref } from "./route.js";

const STORE = "fibermill.recent";
const MAX_JOBS = 25;
const POLL_MS = 3000;
const $ = (sel) => document.querySelector(sel);

function load() {
  try {
    const jobs = JSON.parse(localStorage.getItem(STORE) || "[]");
    return Array.isArray(jobs) ? jobs : [];
  } catch {
    return [];
  }
}

function summary(job) {
  const { id, model, task, status, progress, created_at: createdAt } = job;
  return Object.fromEntries(Object.entries({ id, model, task, status, progress, createdAt })
    .filter(([, v]) => v !== undefined));
}

export class RecentJobs {
  // onOpen(id) shows a job; onCancel(id) cancels one; watching() is the id shown now, which
  // its own event stream keeps up to date.
  constructor({ onOpen, onCancel, watching }) {
    this.jobs = load();
    this.onOpen = onOpen;
    this.onCancel = onCancel;
    this.watching = watching;
    this.body = $("#recent tbody");
    $("#recent-clear").addEventListener("click", () => {
      this.jobs = this.jobs.filter((j) => j.id === this.watching());
      this.save();
    });
    this.body.addEventListener("click", (e) => this.clicked(e));
  }

  add(job) {
    this.jobs = [summary(job), ...this.jobs.filter((j) => j.id !== job.id)].slice(0, MAX_JOBS);
    this.save();
  }

  update(job) {
    const known = this.jobs.find((j) => j.id === job.id);
    if (!known) return;
    Object.assign(known, summary(job));
    this.save();
  }

  save() {
    localStorage.setItem(STORE, JSON.stringify(this.jobs));
    this.render();
  }

  // Unfinished jobs are polled; the page refreshes all of them once it has connected.
  start() {
    this.render();
    setInterval(() => this.refresh((j) => !FINAL.has(j.status) && j.status !== "expired"
      && j.id !== this.watching()), POLL_MS);
  }

  async refresh(which) {
    for (const job of this.jobs.filter(which)) {
      try {
        this.update(await getJSON(`/v1/jobs/${job.id}`));
      } catch (err) {
        // Finished jobs expire after a while (410); a job of another key reads as unknown
        // (404), and so does a job kept by a server that has since lost it.
        if (err instanceof ApiError && (err.status === 410 || err.status === 404)) {
          this.update({ id: job.id, status: "expired" });
        }
      }
    }
  }

  clicked(e) {
    const button = e.target.closest("[data-action]");
    if (!button) return;
    const id = button.closest("tr").dataset.id;
    if (button.dataset.action === "open") {
      // A plain click opens the job here; with a modifier the browser opens a new tab or window.
      if (e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      this.onOpen(id);
    } else if (button.dataset.action === "cancel") {
      button.disabled = true;
      this.onCancel(id).catch((err) => {
        button.disabled = false;
        button.title = err.message;
      });
    }
  }

  render() {
    $("#recent-empty").hidden = this.jobs.length > 0;
    $("#recent").hidden = this.jobs.length === 0;
    const current = this.watching();
    this.body.replaceChildren(...this.jobs.map((job) => {
      const tr = document.createElement("tr");
      tr.dataset.id = job.id;
      tr.classList.toggle("current", job.id === current);
      const open = cell(link(job.id));
      const status = cell(span(`badge ${job.status || ""}`, job.status || "?"));
      const p = job.progress;
      const created = job.createdAt ? new Date(job.createdAt).toLocaleString() : "";
      const live = !FINAL.has(job.status) && job.status !== "expired";
      const actions = cell(live ? button("cancel", "Cancel", "danger small", "Cancel this job")
        : "");
      tr.append(open, cell(job.model || "", "model"), status,
        cell(p ? `${p.done}/${p.total}` : "", "outputs"), cell(created, "when"), actions);
      return tr;
    }));
  }
}

function cell(content, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  td.append(content);
  return td;
}

function link(id) {
  const a = document.createElement("a");
  a.href = jobHref(id);
  a.dataset.action = "open";
  a.className = "mono";
  a.textContent = id.slice(0, 12);
  a.title = `Show job ${id}`;
  return a;
}

function span(className, text) {
  const s = document.createElement("span");
  s.className = className;
  s.textContent = text;
  return s;
}

function button(action, text, className, title) {
  const b = document.createElement("button");
  b.type = "button";
  b.dataset.action = action;
  b.className = className;
  b.textContent = text;
  b.title = title;
  return b;
}
