// A model's default and bounds for each number field of the form, and the check of what the
// person typed against them, so every problem shows before anything is sent.

// {default, minimum, maximum, multipleOf} of an input parameter of `spec` (from /v1/models,
// served by the same API as this page), or null when the model does not take it.
export function paramOf(spec, name) {
  return (spec.parameters || {})[name] || null;
}

export function takes(spec, name) {
  return name in (spec.parameters || {});
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
