// A job's address in the page: /#/jobs/{id}. The fragment never reaches the server, so the
// same page serves every job, and a reload or a shared link opens the job it names.

const PATTERN = /^#\/jobs\/([\w.-]+)$/;

export function jobHref(id) {
  return `#/jobs/${encodeURIComponent(id)}`;
}

export function jobFromHash() {
  const m = PATTERN.exec(window.location.hash);
  return m ? m[1] : null;
}

// pushState, unlike assigning location.hash, fires no hashchange: the caller opens the job
// itself, once.
export function showJobHash(id) {
  if (jobFromHash() !== id) window.history.pushState(null, "", jobHref(id));
}

// Back, forward, or an address typed by hand.
export function onJobHash(callback) {
  window.addEventListener("hashchange", () => callback(jobFromHash()));
}
