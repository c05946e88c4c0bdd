// The one place that talks to the API: it adds the key and turns error bodies into messages a
// person can act on.

const KEY_STORE = "fibermill.apiKey";
const TASK_TAGS = new Set(["image-generation", "text-generation"]);
export const FIX_FIELDS = "Some fields need fixing: see the messages beside them.";

export function apiKey() {
  return localStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
}

export function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

export class ApiError extends Error {
  constructor(status, message, { fields = {}, retryAfter = null, code = null } = {}) {
    super(message);
    this.status = status;
    this.fields = fields; // "input.width" -> [messages]
    this.retryAfter = retryAfter;
    this.code = code;
  }
}

export async function request(method, path, { body, signal, headers = {} } = {}) {
  const init = { method, signal, headers: authHeaders(headers) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "Cannot reach the API. Check that it is running and try again.");
  }
  if (!res.ok) throw await toError(res);
  return res;
}

export async function getJSON(path, opts) {
  return (await request("GET", path, opts)).json();
}

export async function postJSON(path, body, opts = {}) {
  return (await request("POST", path, { ...opts, body })).json();
}

// A 422 names fields by location: ["body", <task tag>?, "input", "width"] -> "input.width".
export function fieldOf(loc) {
  const parts = [...(loc || [])];
  if (parts[0] === "body") parts.shift();
  if (TASK_TAGS.has(parts[0])) parts.shift();
  return parts.join(".");
}

function cleanMessage(msg) {
  // Pydantic prefixes custom validator messages; the prefix means nothing to a person.
  return String(msg || "invalid").replace(/^(Value|Assertion) error, /, "");
}

function waitText(seconds) {
  if (!seconds) return "a moment";
  return seconds === 1 ? "1 second" : `${seconds} seconds`;
}

async function toError(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    // Not JSON (a proxy's page, say): the status line is all there is.
  }
  const detail = body && body.detail;
  const code = body && body.code;
  const retryAfter = Number(res.headers.get("Retry-After")) || null;
  if (res.status === 422 && Array.isArray(detail)) {
    const fields = {};
    for (const d of detail) {
      const field = fieldOf(d.loc);
      (fields[field] ||= []).push(cleanMessage(d.msg));
    }
    return new ApiError(422, FIX_FIELDS, { fields, code });
  }
  const text = typeof detail === "string" ? detail : `${res.status} ${res.statusText}`;
  const opts = { retryAfter, code };
  switch (res.status) {
    case 401:
      return new ApiError(401, "This API needs a valid key: enter it at the top of the page.",
        opts);
    case 404:
      return new ApiError(404, `Not found: ${text}`, opts);
    case 413:
      return new ApiError(413, "The request is too large: use fewer or shorter prompts.", opts);
    case 429:
      return new ApiError(429,
        `Too many jobs submitted in a short time. Try again in ${waitText(retryAfter)}.`, opts);
    case 503:
      return new ApiError(503,
        `The service is busy right now (${text}). Try again in ${waitText(retryAfter)}.`, opts);
    default:
      return new ApiError(res.status, text, opts);
  }
}
