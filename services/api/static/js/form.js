// The submit form: it adapts to the chosen model's task, builds the request body, and puts the
// API's field errors next to the fields they name. The server judges every field, so that a
// refusal names every problem at once: the bounds shown beside the fields are a guide, and
// the form (novalidate) stops nothing on its way.

import { getJSON } from "./api.js";
import { paramOf, rangeText, takes } from "./limits.js";

const MODEL_STORE = "fibermill.model";
// The digits model draws 3 well; its 7 is its weakest digit.
const EXAMPLE_CLASS = 3;
// What a prompt is, for a model whose prompts are free text, by its task.
const PROMPT_PLACEHOLDER = {
  "text-generation": "Text to continue",
  "image-generation": "Describe the image to draw",
};
const $ = (sel) => document.querySelector(sel);

export class JobForm {
  constructor(onSubmit) {
    this.form = $("#job-form");
    this.select = $("#model");
    this.prompts = $("#prompts");
    this.models = [];
    // The page's own bounds, for fields a model says nothing about.
    this.pageBounds = new Map([...this.form.querySelectorAll("input[type=number]")]
      .map((el) => [el, { min: el.min, max: el.max, step: el.step,
        placeholder: el.placeholder }]));
    this.form.addEventListener("submit", (e) => {
      e.preventDefault();
      onSubmit(this.body());
    });
    this.select.addEventListener("change", () => {
      localStorage.setItem(MODEL_STORE, this.select.value);
      this.applyModel();
    });
    $("#add-prompt").addEventListener("click", () => this.addPrompt("").focus());
    // An error goes away as soon as the person edits the field it is about, and a prompt
    // they edited is theirs: a change of model leaves it alone.
    this.form.addEventListener("input", (e) => {
      this.clearFieldError(e.target);
      delete e.target.dataset.example;
    });
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
    for (const el of this.form.querySelectorAll("[data-kind]")) {
      const [head, name] = el.dataset.field.split(".");
      if (head !== "input") continue;
      el.closest(".field").hidden = !takes(spec, name);
      if (el.type === "number") this.setNumber(el, paramOf(spec, name));
    }
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
    const example = classes.length ? classes[EXAMPLE_CLASS % classes.length][0] : "";
    if (!this.prompts.children.length) this.addPrompt(example).dataset.example = "";
    for (const input of this.prompts.querySelectorAll("input")) {
      // The previous model's example, untouched, would be the wrong prompt for this one.
      if ("example" in input.dataset) input.value = example;
      input.placeholder = classes.length ? `e.g. ${example} or "a handwritten ${example}"`
        : PROMPT_PLACEHOLDER[spec.task] || "Prompt";
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
      if (el.closest("[hidden]")) continue;
      // Text a number field cannot read ("1e") reads as empty. Sent as that empty text, not
      // left out, it is refused by name with every other problem: left out, the model's
      // default would run in its place.
      const unreadable = el.type === "number" && el.validity.badInput;
      if (!unreadable && el.value.trim() === "") continue;
      const value = el.dataset.kind === "str" || unreadable ? el.value : Number(el.value);
      const [head, name] = el.dataset.field.split(".");
      if (head === "input") input[name] = value;
      else body[head] = value;
    }
    return body;
  }

  // param: {default, minimum, maximum, multipleOf} from the model, or null to restore the
  // page's own bounds.
  setNumber(el, param) {
    const own = this.pageBounds.get(el);
    const min = param ? param.minimum : own.min;
    const max = param ? param.maximum : own.max;
    el.placeholder = param && param.default != null ? param.default : own.placeholder;
    el.min = min ?? "";
    el.max = max ?? "";
    el.step = (param && param.multipleOf) || own.step;
    const hint = el.parentElement.querySelector(".range");
    if (hint) hint.textContent = rangeText(param ? min : null, param ? max : null);
  }

  setBusy(busy) {
    const button = $("#submit");
    button.disabled = busy;
    button.textContent = busy ? "Submitting…" : "Submit job";
  }

  // err.fields maps "input.width" -> messages; a field the form lacks goes to the form's
  // own message, so no error is ever dropped. Several fields can land in one slot (two
  // prompts past the list's end): each adds its messages, none replaces another's.
  showErrors(err) {
    this.clearErrors();
    const loose = [];
    const slots = new Map();
    for (const [field, messages] of Object.entries(err.fields || {})) {
      const slot = this.errorSlot(field);
      if (slot) {
        slots.set(slot, [...(slots.get(slot) || []), ...messages]);
        const input = this.form.querySelector(`[data-field="${field}"]`);
        if (input) input.setAttribute("aria-invalid", "true");
      } else {
        loose.push(`${field || "request"}: ${messages.join("; ")}`);
      }
    }
    for (const [slot, messages] of slots) slot.textContent = messages.join("; ");
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
