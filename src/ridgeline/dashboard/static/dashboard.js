"use strict";
/* The live dashboard: loads /dashboard/state, then follows /dashboard/events (server-sent events read with
   fetch() so the API key can go in the Authorization header; EventSource cannot send headers, and the key must
   never be in a URL). The key lives in this tab's sessionStorage only. */
(function () {
  const KEY_STORAGE = "ridgeline-api-key";
  const panels = new Map(); // worker id -> {chart, root, lastStep}
  let apiKey = sessionStorage.getItem(KEY_STORAGE) || "";
  let generation = 0; // bumped to stop an old event loop when the key changes

  const $ = (selector, root = document) => root.querySelector(selector);
  const setConnection = (text, ok) => {
    const node = $("#connection");
    node.textContent = text;
    node.className = `connection ${ok ? "ok" : "bad"}`;
  };

  function headers() {
    return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  }

  class Unauthorized extends Error {}

  async function getJSON(path) {
    const response = await fetch(path, { headers: headers(), cache: "no-store" });
    if (response.status === 401) throw new Unauthorized();
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  function askForKey(message) {
    $("#key-form").hidden = false;
    $("#key-error").textContent = message || "";
    $("#key-input").focus();
    setConnection("API key needed", false);
  }

  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $("#key-input").value.trim();
    $("#key-input").value = "";
    sessionStorage.setItem(KEY_STORAGE, apiKey);
    start();
  });

  $("#forget-key").addEventListener("click", () => {
    apiKey = "";
    sessionStorage.removeItem(KEY_STORAGE);
    location.reload();
  });

  const number = (value, digits = 0) =>
    value === null || value === undefined ? "-" : Number(value).toLocaleString("en", { maximumFractionDigits: digits });

  function showOverview(frame) {
    const latency = frame.latency;
    for (const table of document.querySelectorAll("table.dist")) {
      const dist = latency[table.dataset.dist];
      table.replaceChildren(...["p50", "p90", "p99"].map((p) => {
        const row = document.createElement("tr");
        row.innerHTML = `<th>${p}</th><td data-stat="${table.dataset.dist}.${p}">${number(dist[p], 1)} ms</td>`;
        return row;
      }));
    }
    for (const node of document.querySelectorAll(".window")) node.textContent = `(last ${latency.window_s} s, ${latency.requests} requests)`;
    const counters = frame.counters;
    for (const node of document.querySelectorAll("[data-counter]")) {
      const name = node.dataset.counter;
      node.textContent = number(name in counters.requests ? counters.requests[name] : counters[name]);
    }
    showCost(counters.cost);
  }

  // This machine's live $/Mtok (serve --usd-per-hour); without a price the tile says how to give one.
  function showCost(cost) {
    for (const node of document.querySelectorAll(".cost-window")) {
      node.textContent = cost ? `(last ${cost.window_s} s)` : "(no price: serve --usd-per-hour)";
    }
    for (const node of document.querySelectorAll("[data-cost]")) {
      const value = cost ? cost[node.dataset.cost] : null;
      if (value === null || value === undefined) node.textContent = "-";
      else if (node.dataset.cost === "utilisation") node.textContent = `${(100 * value).toFixed(0)} %`;
      else node.textContent = `$${value < 10 ? value.toFixed(3) : number(value, 1)}`;
    }
  }

  function showView(panel, view) {
    const fields = {
      num_running: number(view.num_running),
      num_waiting: number(view.num_waiting),
      used_pages: number(view.used_pages),
      free_pages: number(view.free_pages),
      total_pages: number(view.total_pages),
      prefix_hit_rate: `${(100 * view.prefix_hit_rate).toFixed(1)} %`,
      preemptions: number(view.preemptions),
      mean_context: view.mean_context === null ? "-" : `${number(view.mean_context)} tokens${view.num_running ? "" : " (last decode)"}`,
      largest_batch: view.largest_batch === null ? "-"
        : `${number(view.largest_batch)} sequences (${number(view.pages_per_sequence)} pages each)`,
      last_step: panel.lastStep < 0 ? "-" : `#${panel.lastStep}`,
    };
    for (const [name, text] of Object.entries(fields)) {
      const node = $(`[data-field="${name}"]`, panel.root);
      if (node) node.textContent = text;
    }
    const groups = $(".groups", panel.root);
    groups.replaceChildren(...view.groups.map((group, i) => {
      const row = document.createElement("div");
      row.className = "group";
      const share = view.total_pages ? group.used / view.total_pages : 0;
      const name = group.window === null ? "full attention" : `window ${number(group.window)}`;
      row.innerHTML = `<span class="group-name">group ${i} (${group.layers} layers, ${name})</span>` +
        `<span class="bar"><span style="width:${(100 * share).toFixed(1)}%"></span></span>` +
        `<span class="group-used" data-group="${i}">${number(group.used)} pages</span>`;
      return row;
    }));
  }

  function addPanel(worker) {
    const root = $("#worker-template").content.firstElementChild.cloneNode(true);
    root.dataset.worker = worker.id;
    $(".worker-id", root).textContent = worker.id;
    $(".worker-role", root).textContent = worker.role;
    $(".worker-model", root).textContent = `${worker.model} on ${worker.hardware.title}`;
    $("#workers").appendChild(root);
    const chart = new RooflineChart($(".chart", root), worker.figure);
    const panel = { root, chart, lastStep: worker.last_step };
    panels.set(worker.id, panel);
    window.ridgeline.charts[worker.id] = chart;
    showView(panel, worker.view);
  }

  function applyFrame(frame) {
    for (const update of frame.workers) {
      const panel = panels.get(update.id);
      if (!panel) continue;
      panel.chart.addPoints(update.points);
      panel.lastStep = update.last_step;
      showView(panel, update.view);
    }
    showOverview(frame);
    window.ridgeline.frames += 1;
  }

  /* One server-sent-events connection read to its end; resolves when the server closes it (every few seconds). */
  async function follow(mine) {
    const after = [...panels].map(([id, panel]) => `${id}:${panel.lastStep}`).join(",");
    const response = await fetch(`/dashboard/events?after=${encodeURIComponent(after)}`, { headers: headers(), cache: "no-store" });
    if (response.status === 401) throw new Unauthorized();
    if (!response.ok || !response.body) throw new Error(`events: HTTP ${response.status}`);
    setConnection("live", true);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    while (mine === generation) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trimStart()).join("\n");
        if (data) applyFrame(JSON.parse(data));
      }
    }
    reader.cancel();
  }

  async function start() {
    const mine = ++generation;
    try {
      const state = await getJSON("/dashboard/state");
      $("#key-form").hidden = true;
      $("#forget-key").hidden = !apiKey;
      $("#overview").hidden = false;
      panels.clear();
      $("#workers").replaceChildren();
      state.workers.forEach(addPanel);
      showOverview(state);
    } catch (error) {
      if (error instanceof Unauthorized) askForKey(apiKey ? "that key was refused" : "");
      else setConnection(`cannot load: ${error.message}`, false);
      return;
    }
    while (mine === generation) {
      try {
        await follow(mine);
      } catch (error) {
        if (error instanceof Unauthorized) { askForKey("the key was refused"); return; }
        setConnection("reconnecting", false);
        await new Promise((resolve) => setTimeout(resolve, 1000));
      }
    }
  }

  window.ridgeline = { charts: {}, frames: 0 }; // for the browser test and the curious
  start();
})();
