// Server-sent events read through fetch(): EventSource cannot send an Authorization header.

import { request } from "./api.js";

// Split a growing buffer into complete lines. A trailing "\r" stays in the buffer: it may be
// the first half of a "\r\n" whose "\n" arrives in the next chunk.
function takeLines(state) {
  const lines = [];
  const re = /\r\n|\n|\r/g;
  let start = 0;
  let m;
  while ((m = re.exec(state.buf))) {
    if (m[0] === "\r" && m.index === state.buf.length - 1) break;
    lines.push(state.buf.slice(start, m.index));
    start = re.lastIndex;
  }
  state.buf = state.buf.slice(start);
  return lines;
}

// Yields {event, data} with data parsed as JSON, until the server ends the stream.
export async function* streamEvents(path, signal) {
  const res = await request("GET", path, { signal, headers: { Accept: "text/event-stream" } });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const state = { buf: "" };
  let event = "message";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      state.buf += decoder.decode(value, { stream: true });
      for (const line of takeLines(state)) {
        if (line === "") {
          if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
          event = "message";
          data = [];
        } else if (line.startsWith(":")) {
          // A keep-alive comment.
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
