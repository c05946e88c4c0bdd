// A model's default and bounds for each number field of the form, shown beside it as a guide:
// the server checks what is sent against the same bounds, every field at once.

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
