// The submit form: it adapts to the chosen model's task, builds the request body, and puts the
// API's field errors next to the fields they name.

import { ApiError, FIX_FIELDS, getJSON } from "./api.js";

const MODEL_STORE = "fibermill.model";
const $ = (sel) => document.querySelector(sel);

export class JobForm {
  constructor(onSubmit) {
    this.form = $("#job-form");
    this.select = $("#model");
    this.prompts = $("#prompts");
    this.models = [];
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      const unreadable = this.unreadable();
      if (unreadable) this.showErrors(unreadable);
      else onSubmit(this.body());
    });
    this.select.addEventListener("change", () => {
      localStorage.setItem(MODEL_STORE, this.select.value);
      this.applyModel();
    });
    $("#add-prompt").addEventListener("click", () => this.addPrompt("").focus());
    // An error goes away as soon as the person edits the field it is about.
    this.form.addEventListener("input", (e) => this.clearFieldError(e.target));
  }

  get spec() {
    return this.models.find((m) => m.name === this.select.value);
  }

  async loadModels() {
    const { models } = await getJSON("/v1/models");
    this.models = models;
    const keep = this.select.value || localStorage.getItem(MODEL_STORE);
    this.select.replaceChildren(...models.map((m) => {
      const label = `${m.name} · ${m.task}${m.available ? "" : " · no worker"}`;
      return new Option(label, m.name);
    }));
    if (models.some((m) => m.name === keep)) this.select.value = keep;
    this.applyModel();
  }

  applyModel() {
    const spec = this.spec;
    if (!spec) return;
    const image = spec.task === "image-generation";
    for (const el of this.form.querySelectorAll(".for-image")) el.hidden = !image;
    for (const el of this.form.querySelectorAll(".for-text")) el.hidden = image;
    const { defaults: d, limits: l } = spec;
    setNumber("#steps", d.steps, 1, l.max_steps);
    setNumber("#width", d.width, l.min_size, l.max_size);
    setNumber("#height", d.height, l.min_size, l.max_size);
    setNumber("#guidance_scale", d.guidance_scale, 0, 50);
    setNumber("#num_images_per_prompt", null, 1, l.max_images_per_prompt);
    setNumber("#max_new_tokens", d.max_new_tokens, 1, l.max_new_tokens);
    const workers = spec.workers.length;
    $("#model-hint").textContent = [
      spec.description,
      workers ? `${workers} worker${workers > 1 ? "s" : ""} serving` : "no worker serving it now",
    ].filter(Boolean).join(" · ");
    $("#model-hint").classList.toggle("warn", !spec.available);
    const classes = spec.classes || [];
    $("#classes-hint").textContent = classes.length
      ? `Each prompt names one class: ${classes.map((c) => c.join("/")).join(", ")}.`
      : "";
    const example = classes.length ? classes[7 % classes.length][0] : "";
    if (!this.prompts.children.length) this.addPrompt(example);
    for (const input of this.prompts.querySelectorAll("input")) {
      input.placeholder = classes.length ? `e.g. ${example} or "a handwritten ${example}"`
        : "Describe what to generate";
    }
    this.clearErrors();
  }

  addPrompt(value) {
    const li = document.createElement("li");
    const input = document.createElement("input");
    input.type = "text";
    input.value = value;
    input.setAttribute("aria-label", "Prompt");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "icon";
    remove.title = "Remove this prompt";
    remove.setAttribute("aria-label", "Remove prompt");
    remove.textContent = "×";
    remove.addEventListener("click", () => {
      if (this.prompts.children.length > 1) li.remove();
      this.numberPrompts();
    });
    const error = document.createElement("p");
    error.className = "error";
    li.append(input, remove, error);
    this.prompts.append(li);
    this.numberPrompts();
    return input;
  }

  numberPrompts() {
    [...this.prompts.children].forEach((li, i) => {
      li.querySelector("input").dataset.field = `input.prompts.${i}`;
      li.querySelector(".error").dataset.errorFor = `input.prompts.${i}`;
    });
  }

  body() {
    const spec = this.spec;
    const task = spec ? spec.task : "image-generation";
    const input = { prompts: [...this.prompts.querySelectorAll("input")].map((i) => i.value) };
    const body = { task, model: this.select.value, input };
    // Hidden fields belong to the other task: only what the person can see is sent.
    for (const el of this.form.querySelectorAll("[data-kind]")) {
      if (el.closest("[hidden]") || el.value.trim() === "") continue;
      const value = el.dataset.kind === "str" ? el.value : Number(el.value);
      const [head, name] = el.dataset.field.split(".");
      if (head === "input") input[name] = value;
      else body[head] = value;
    }
    return body;
  }

  // A number field holding text reads as empty, which would silently drop it from the request.
  unreadable() {
    const fields = {};
    for (const el of this.form.querySelectorAll("input[type=number]")) {
      if (el.closest("[hidden]") || !el.validity.badInput) continue;
      fields[el.dataset.field] = ["not a number"];
    }
    return Object.keys(fields).length ? new ApiError(0, FIX_FIELDS, { fields }) : null;
  }

  setBusy(busy) {
    const button = $("#submit");
    button.disabled = busy;
    button.textContent = busy ? "Submitting…" : "Submit job";
  }

  // err.fields maps "input.width" -> messages; a field the form lacks goes to the form's
  // own message, so no error is ever dropped.
  showErrors(err) {
    this.clearErrors();
    const loose = [];
    for (const [field, messages] of Object.entries(err.fields || {})) {
      const slot = this.errorSlot(field);
      if (slot) {
        slot.textContent = messages.join("; ");
        const input = this.form.querySelector(`[data-field="${field}"]`);
        if (input) input.setAttribute("aria-invalid", "true");
      } else {
        loose.push(`${field || "request"}: ${messages.join("; ")}`);
      }
    }
    const form = $("#form-error");
    form.textContent = [err.message, ...loose].join(" ");
    const first = this.form.querySelector("[aria-invalid=true]");
    if (first) first.focus();
  }

  errorSlot(field) {
    let f = field;
    while (f) {
      const slot = this.form.querySelector(`[data-error-for="${f}"]`);
      if (slot && !slot.closest("[hidden]")) return slot;
      f = f.includes(".") ? f.slice(0, f.lastIndexOf(".")) : "";
    }
    return null;
  }

  clearFieldError(input) {
    const field = input.dataset && input.dataset.field;
    if (!field) return;
    input.removeAttribute("aria-invalid");
    const slot = this.form.querySelector(`[data-error-for="${field}"]`);
    if (slot) slot.textContent = "";
  }

  clearErrors() {
    for (const el of this.form.querySelectorAll(".error")) el.textContent = "";
    for (const el of this.form.querySelectorAll("[aria-invalid]")) {
      el.removeAttribute("aria-invalid");
    }
  }
}

function setNumber(sel, placeholder, min, max) {
  const el = $(sel);
  el.placeholder = placeholder ?? "";
  el.min = min ?? "";
  el.max = max ?? "";
  const hint = el.parentElement.querySelector(".range");
  const text = min === max ? `must be ${min}` : `${min}–${max}`;
  if (hint) hint.textContent = text;
}
