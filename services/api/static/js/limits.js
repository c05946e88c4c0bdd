// A model's default and bounds for each number field of the form, and the check of what the
// person typed against them, so every problem shows before anything is sent.

// Where a model without `parameters` (the older /v1/models) keeps a field's default and
// bounds. Either object may lack the other task's fields.
const size = (value, l) => ({ default: value, minimum: l.min_size, maximum: l.max_size,
  multipleOf: 8 });
const FALLBACK = {
  steps: (d, l) => ({ default: d.steps, minimum: 1, maximum: l.max_steps }),
  width: (d, l) => size(d.width, l),
  height: (d, l) => size(d.height, l),
  guidance_scale: (d) => ({ default: d.guidance_scale, minimum: 0, maximum: 50 }),
  num_images_per_prompt: (d, l) => ({ minimum: 1, maximum: l.max_images_per_prompt }),
  max_new_tokens: (d, l) => ({
    default: d.max_new_tokens, minimum: 1, maximum: l.max_new_tokens }),
};

// {default, minimum, maximum, multipleOf} of an input parameter of `spec`, or null when the
// model says nothing about it (the page's own bounds then stand).
export function paramOf(spec, name) {
  const listed = spec.parameters && spec.parameters[name];
  if (listed) return listed;
  const fallback = FALLBACK[name];
  return fallback ? fallback(spec.defaults || {}, spec.limits || {}) : null;
}

// Whether the model takes this input parameter; without a `parameters` list, the task's
// fields (the form's rows) decide.
export function takes(spec, name) {
  return !spec.parameters || name in spec.parameters;
}

export function rangeText(min, max) {
  if (min != null && max != null) return min === max ? `must be ${min}` : `${min}–${max}`;
  if (min != null) return `at least ${min}`;
  return max != null ? `at most ${max}` : "";
}

// The message for a number field's value, or null when it is fine (or empty: the model's
// default then applies).
export function problemOf(el) {
  if (el.validity.badInput) return "not a number"; // would read as empty and be dropped
  if (el.value.trim() === "") return null;
  const value = Number(el.value);
  const min = el.min === "" ? null : Number(el.min);
  const max = el.max === "" ? null : Number(el.max);
  if (!Number.isFinite(value)) return "not a number";
  if (el.dataset.kind === "int" && !Number.isInteger(value)) return "must be a whole number";
  // A range of one value is named whole: "at most 16" alone would invite 8, also refused.
  if (min != null && min === max && value !== min) return `must be ${min}`;
  if (max != null && value > max) return `must be at most ${max}`;
  if (min != null && value < min) return `must be at least ${min}`;
  const step = Number(el.step);
  if (el.dataset.kind === "int" && step > 1 && value % step) {
    return `must be a multiple of ${step}`;
  }
  return null;
}
