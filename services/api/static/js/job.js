// One job on screen: live status and progress from the event stream, then its results.

import { ApiError, getJSON, postJSON } from "./api.js";
import { renderResults } from "./results.js";
import { jobHref } from "./route.js";
import { streamEvents } from "./sse.js";
import { showTimeline } from "./timeline.js";

export const FINAL = new Set(["succeeded", "failed", "canceled"]);
// A queued job's place in line is read this often: its event stream says nothing of it.
const QUEUE_POLL_MS = 2000;
const $ = (sel) => document.querySelector(sel);

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

export class JobView {
  // onUpdate(job or {id, progress}) keeps the recent-jobs list in step with what is shown.
  constructor(onUpdate) {
    this.onUpdate = onUpdate;
    this.job = null;
    this.controller = null;
    this.shownFinal = null;
    this.steps = new Map(); // output index -> the last step it reported
    this.doneSeen = null; // the done count the steps are of
    $("#job-cancel").addEventListener("click", () => this.cancel(this.job.id));
  }

  get id() {
    return this.job && this.job.id;
  }

  async open(idOrJob) {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    const id = typeof idOrJob === "string" ? idOrJob : idOrJob.id;
    this.job = { id };
    this.shownFinal = null;
    this.steps = new Map();
    this.doneSeen = null;
    $("#job-card").hidden = false;
    $("#job-id").textContent = id;
    $("#job-link").href = jobHref(id);
    // Nothing of the job shown before stays beside this one, which may turn out not to
    // exist: its badge, its line, its bars are this job's once its record is read.
    const badge = $("#job-status");
    badge.textContent = "";
    badge.className = "badge";
    badge.hidden = true;
    $("#job-cancel").hidden = true;
    $("#job-meta").textContent = "";
    $("#done-text").textContent = "";
    $("#done-fill").style.width = "0%";
    $("#done-meter").hidden = false;
    $("#job-error").textContent = "";
    $("#results").replaceChildren();
    $("#step-meter").hidden = true;
    $("#job-timeline").hidden = true;
    $("#job-queue").hidden = true;
    $("#job-queue").textContent = "";
    for (const m of document.querySelectorAll("#job-card .meter")) delete m.dataset.state;
    if (typeof idOrJob !== "string") this.render(idOrJob);
    reveal($("#job-card"));
    this.watchQueue(id, controller.signal);
    try {
      await this.follow(id, controller.signal);
    } catch (err) {
      if (err.name !== "AbortError") throw err;
    }
  }

  async follow(id, signal) {
    try {
      for await (const { event, data } of streamEvents(`/v1/jobs/${id}/events`, signal)) {
        if (signal.aborted) return; // another job is on screen now
        if (event === "status") this.render(data);
        else if (event === "progress") this.progress(data);
        else if (event === "step") this.step(data);
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      // A refusal (unknown job, bad key) will not get better by asking again.
      if (err instanceof ApiError && err.status >= 400 && err.status < 500) {
        this.fail(err.message);
        return;
      }
    }
    // The stream ends after the final status. If it ended early (a restart, a proxy's
    // timeout), polling takes over.
    let delay = 1000;
    while (!signal.aborted && !FINAL.has(this.job.status)) {
      try {
        this.render(await getJSON(`/v1/jobs/${id}`, { signal }));
        $("#job-error").textContent = "";
        delay = 1000;
      } catch (err) {
        if (err.name === "AbortError") return;
        if (err instanceof ApiError && err.status >= 400 && err.status < 500) {
          this.fail(err.message);
          return;
        }
        $("#job-error").textContent = `${err.message} Retrying…`;
        delay = Math.min(delay * 2, 10000);
      }
      await sleep(delay, signal);
    }
  }

  // While the job is queued, its place in line and estimated start, read from the job.
  async watchQueue(id, signal) {
    while (!signal.aborted && this.id === id && !FINAL.has(this.job.status)) {
      try {
        const job = await getJSON(`/v1/jobs/${id}`, { signal });
        // The event stream may have moved it on while this read was under way.
        if (signal.aborted || (this.job.status && this.job.status !== "queued")) return;
        this.render(job);
      } catch (err) {
        if (err.name === "AbortError") return;
      }
      if (this.job.status !== "queued") return;
      await sleep(QUEUE_POLL_MS, signal);
    }
  }

  close() {
    if (this.controller) this.controller.abort();
    this.job = null;
    $("#job-card").hidden = true;
  }

  render(job) {
    if (job.id !== this.id) return;
    this.job = job;
    const badge = $("#job-status");
    badge.textContent = job.status;
    badge.className = `badge ${job.status}`;
    badge.hidden = false;
    const final = FINAL.has(job.status);
    $("#job-cancel").hidden = final;
    $("#job-meta").textContent = meta(job);
    this.queue(job);
    this.progress(job.progress);
    if (final) {
      this.finishSteps(job.status === "succeeded");
      $("#job-error").textContent = job.error ? `${job.error.code}: ${job.error.message}` : "";
      if (this.shownFinal !== job.id) {
        this.shownFinal = job.id;
        renderResults($("#results"), job);
        if (this.controller) showTimeline(job.id, this.controller.signal);
      }
    }
    this.onUpdate(job);
  }

  queue(job) {
    const line = $("#job-queue");
    if (job.status !== "queued") {
      line.hidden = true;
      return;
    }
    if (!job.queue) return; // a status event carries no place in line: the last one stays
    line.textContent = queueText(job.queue);
    line.hidden = false;
  }

  progress({ done, total }) {
    // Outputs that finished step no more: the steps of those still running come again
    // within a tenth of a second.
    if (this.doneSeen != null && done > this.doneSeen) this.steps.clear();
    this.doneSeen = done;
    this.job.progress = { done, total };
    $("#done-text").textContent = `${done} of ${total} done`;
    $("#done-fill").style.width = `${total ? (100 * done) / total : 0}%`;
    if (total && done >= total) $("#done-meter").dataset.state = "done";
    this.onUpdate({ id: this.id, progress: { done, total } });
  }

  // Each running output reports its own steps. Outputs run as one batch step together, so
  // they report the same step, give or take the throttle's timing: those are named as one
  // batch, not as the output whose event came last (as if those before it were done).
  step({ index, step, steps }) {
    if (FINAL.has(this.job.status)) return;
    this.steps.set(index, step);
    const near = Math.max(2, steps / 20);
    const batch = [...this.steps.values()].filter((s) => Math.abs(s - step) <= near).length;
    const what = this.job.task === "text-generation" ? "token" : "denoise step";
    $("#step-meter").hidden = false;
    $("#step-label").textContent = batch > 1 ? `${batch} outputs in one batch: ${what}`
      : `Output #${index + 1}: ${what}`;
    $("#step-text").textContent = `${step} of ${steps}`;
    $("#step-fill").style.width = `${steps ? (100 * step) / steps : 0}%`;
  }

  // Workers report steps between steps and at most ten times a second, so the last one seen
  // is short of the end (49 of 50): a succeeded job's bar is completed here, not left there.
  finishSteps(succeeded) {
    const meter = $("#step-meter");
    if (!succeeded || meter.hidden) {
      meter.hidden = true;
      return;
    }
    const what = this.job.task === "text-generation" ? "tokens" : "denoise steps";
    $("#step-label").textContent = `Every output: ${what}`;
    $("#step-text").textContent = "done";
    $("#step-fill").style.width = "100%";
    meter.dataset.state = "done";
  }

  async cancel(id) {
    const button = $("#job-cancel");
    if (id === this.id) button.disabled = true;
    try {
      const job = await postJSON(`/v1/jobs/${id}/cancel`);
      if (job.id === this.id) this.render(job);
      else this.onUpdate(job);
    } catch (err) {
      if (id === this.id) $("#job-error").textContent = `Could not cancel: ${err.message}`;
      else throw err;
    } finally {
      button.disabled = false;
    }
  }

  // Following the job was refused. A job never shown (no such job, an expired one) leaves
  // only why on the card: no bar stands for progress it does not have.
  fail(message) {
    $("#job-error").textContent = message;
    $("#job-cancel").hidden = true;
    if (!this.job.status) {
      $("#done-meter").hidden = true;
      $("#step-meter").hidden = true;
    }
  }
}

// On a phone the job card sits below the form: bring it into view unless its head and
// outputs bar already are.
function reveal(card) {
  const top = card.getBoundingClientRect().top;
  if (top >= 0 && $("#done-meter").getBoundingClientRect().bottom <= window.innerHeight) return;
  const smooth = !window.matchMedia("(prefers-reduced-motion: reduce)").matches;
  card.scrollIntoView({ block: "start", behavior: smooth ? "smooth" : "auto" });
}

function meta(job) {
  const parts = [job.model, job.task];
  if (job.created_at) parts.push(`submitted ${new Date(job.created_at).toLocaleTimeString()}`);
  const m = job.metrics || {};
  if (m.queue_seconds != null) parts.push(`queued ${seconds(m.queue_seconds)}`);
  if (m.run_seconds != null) parts.push(`ran ${seconds(m.run_seconds)}`);
  return parts.join(" · ");
}

export function queueText(q, now = Date.now()) {
  const ahead = `${q.ahead} output${q.ahead === 1 ? "" : "s"} ahead`;
  const line = `Place in line: ${q.position} (${ahead})`;
  if (!q.estimated_start) return `${line} · no estimate yet`;
  const at = new Date(q.estimated_start);
  const wait = Math.max(0, (at.getTime() - now) / 1000);
  return `${line} · starts in about ${duration(wait)} (${at.toLocaleTimeString()})`;
}

function duration(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function seconds(s) {
  return s < 10 ? `${s.toFixed(2)} s` : `${s.toFixed(1)} s`;
}
