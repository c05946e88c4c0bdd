// A finished job's outputs: an image grid with seeds and downloads, or texts beside their
// prompts. Outputs are fetched with the API key, so images become blob URLs.

import { authHeaders } from "./api.js";

const TARGET_PX = 128; // small images are scaled up by whole factors to about this size
let blobUrls = [];

export function renderResults(container, job) {
  for (const url of blobUrls) URL.revokeObjectURL(url);
  blobUrls = [];
  const outputs = job.output || [];
  if (!outputs.length) {
    container.replaceChildren();
    return;
  }
  const render = job.task === "text-generation" ? textCard : imageFigure;
  const grid = document.createElement("div");
  grid.className = job.task === "text-generation" ? "texts" : "images";
  grid.append(...outputs.map((item, i) => render(job, item, i)));
  container.replaceChildren(grid);
}

function promptOf(job, i) {
  const prompts = job.input.prompts || [];
  const per = job.task === "image-generation" ? job.input.num_images_per_prompt || 1 : 1;
  return prompts[Math.floor(i / per)] ?? "";
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text != null) e.textContent = text;
  return e;
}

function missing(job, i) {
  const reason = job.status === "canceled" ? "canceled" : "not produced";
  const box = el("div", "missing", reason);
  box.title = `Output #${i + 1} has no result: the job ${job.status} first.`;
  return box;
}

function imageFigure(job, item, i) {
  const figure = el("figure", "image");
  const caption = el("figcaption");
  caption.append(el("span", "prompt", `“${promptOf(job, i)}”`));
  if (!item) {
    figure.append(missing(job, i), caption);
    return figure;
  }
  const scale = Math.max(1, Math.floor(TARGET_PX / Math.max(item.width, item.height)));
  const img = el("img");
  img.alt = `Output #${i + 1}: ${promptOf(job, i)}, seed ${item.seed}`;
  img.style.width = `${item.width * scale}px`;
  img.style.aspectRatio = `${item.width} / ${item.height}`;
  if (scale > 1) img.classList.add("pixelated");
  img.dataset.scale = String(scale);
  const link = el("a", "download", "Download");
  link.download = `${job.id}-${i}-seed${item.seed}.png`;
  link.setAttribute("aria-disabled", "true");
  caption.append(el("span", "seed", `seed ${item.seed}`), link);
  figure.append(img, caption);
  loadImage(item.url, img, link);
  return figure;
}

async function loadImage(url, img, link) {
  try {
    const res = await fetch(url, { headers: authHeaders() });
    if (!res.ok) throw new Error(`${res.status}`);
    const blobUrl = URL.createObjectURL(await res.blob());
    blobUrls.push(blobUrl);
    img.src = blobUrl;
    link.href = blobUrl;
    link.removeAttribute("aria-disabled");
  } catch (err) {
    img.replaceWith(el("div", "missing", `could not load (${err.message})`));
  }
}

function textCard(job, item, i) {
  const card = el("article", "text");
  const body = el("p", "body");
  body.append(el("span", "prompt", promptOf(job, i)));
  if (item) body.append(el("span", "generated", item.text));
  card.append(body);
  const foot = el("footer");
  if (item) {
    foot.append(el("span", `reason ${item.finish_reason}`, item.finish_reason),
      el("span", "tokens", `${item.tokens} token${item.tokens === 1 ? "" : "s"}`));
  } else {
    foot.append(missing(job, i));
  }
  card.append(foot);
  return card;
}
