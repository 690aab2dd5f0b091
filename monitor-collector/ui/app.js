// railscope's dashboard: four views over this collector's API, kept current by polling it.
//   #/fleet        nodes x GPUs and IB ports (labelled by device), coloured by utilisation
//                  (ports against their class's nominal rate), marked by findings, lost
//                  GPUs marked lost, each node's job(s); above 500 nodes (or `?canvas=1`) a
//                  heat map on one canvas, racks of 64 nodes by name (`?rack=N`)
//   #/fleet/rack/N a rack of the heat map, its nodes named; a click opens a node
//   #/jobs, #/job/ID  the jobs; a job's GPUs and ports side by side, its stragglers marked
//                  and ranked, its findings (on its nodes, GPUs and ports, or carrying its id)
//   #/node/NAME    a node's time series (dygraphs: drag to zoom, double-click to reset;
//                  gauges drawn as min/mean/max bands), an always-visible legend, its
//                  findings and events
//   #/events       the last hour's timeline (HH:MM axis, dots coloured by severity): port
//                  flaps, XIDs, lost GPUs, QP errors, findings
// Elements a test or a script checks carry data-* attributes (data-node, data-gpu,
// data-device, data-port, data-finding-rule, data-straggler, data-lost, data-jobs, a chart's
// data-points).
// `?refresh=S` sets the polling interval (default 5 s).
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const REFRESH_S = Math.max(0.5, Number(params.get("refresh")) || 5);

  // The metric names and event kinds, from the collector (`/ui/names.js`, built from
  // monitor_wire::names, the names the agent sends): the page holds no copy of its own.
  const METRIC = window.RAILSCOPE_NAMES.metric;
  const EVENT = window.RAILSCOPE_NAMES.event_kind;
  // The page's own kind for a finding drawn among the events (not an agent event).
  const FINDING = "finding";

  const GPU_UTIL = METRIC.GPU_UTILIZATION_RATIO;
  // SM activity (GPM, as DCGM's): how much of the GPU works, where NVML's utilization only
  // says a kernel ran during the period; shown where the GPU reports it.
  const GPU_SM = METRIC.GPU_SM_UTIL_RATIO;
  const PORT_TX = METRIC.IB_PORT_XMIT_BYTES_TOTAL;
  const PORT_RX = METRIC.IB_PORT_RCV_BYTES_TOTAL;
  const PORT_RATE = METRIC.IB_PORT_RATE_GBPS;
  // The fleet and job views colour each cell by its series' latest point, which the live
  // table holds (`/api/v1/live/latest`: a counter's rate from its sample before, a gauge's
  // latest envelope), asked once per refresh for every metric a view needs: no scan of the
  // archive, and no answer limit to stay under. The job view asks only of its nodes, past
  // CHUNK_NODES of them per chunk (`match=node=~a|b|...`), so no URL grows with the job.
  const CHUNK_NODES = 200;
  // The straggler analysis' step (stragglers.rs, StragglerSettings::step_ns) and window
  // (its default: 5 minutes). The jobs and job views ask for a window whose end is aligned to
  // the step and one step behind the clock (the agent flushes every 10 s, so the last step is
  // complete when asked): two loads within one step ask the same question and get the same
  // answer, instead of a window sliding by the second.
  const STRAGGLER_STEP_S = 10;
  const STRAGGLER_WINDOW_S = 300;
  const SEVERITY_ORDER = { critical: 3, warning: 2, info: 1 };

  // What the page holds: exposed for tests and for a curious operator's console
  // (`maxSeriesPoints`: the most points one `/api/v1/series` answer held; `maxLatestSeries`:
  // the most series one `/api/v1/live/latest` answer held; `fleet`: what the fleet view drew;
  // `updateMs`, `firstUpdateMs`: see `refresh`).
  const state = { updates: 0, view: null, charts: {}, busy: false, maxSeriesPoints: 0, maxLatestSeries: 0 };
  window.railscope = state;

  // ------------------------------------------------------------------------------------
  // Helpers

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }

  async function api(path) {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) {
      let reason = r.statusText;
      try {
        reason = (await r.json()).error || reason;
      } catch (_) {
        // not JSON: keep the status text
      }
      throw new Error(`${path.split("?")[0]}: ${r.status} ${reason}`);
    }
    return r.json();
  }

  // The findings and stragglers API: null where this collector does not serve it.
  async function optionalApi(path) {
    try {
      return await api(path);
    } catch (e) {
      if (/: 404 /.test(e.message)) return null;
      throw e;
    }
  }

  function q(params) {
    const s = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      for (const one of Array.isArray(v) ? v : [v]) if (one !== null && one !== undefined) s.append(k, one);
    }
    return s.toString();
  }

  const nsToMs = (ns) => ns / 1e6;
  const timeText = (ns) => new Date(nsToMs(ns)).toISOString().replace("T", " ").slice(0, 19) + "Z";
  const regexEscape = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const last = (points) => (points && points.length ? points[points.length - 1] : null);
  const fmt = (x, digits = 2) =>
    x === null || x === undefined ? "–" : Math.abs(x) >= 1e4 ? x.toExponential(2) : Number(x.toFixed(digits)).toString();

  // Utilisation 0..1 as a blue of growing depth (grey: no data).
  function utilColour(u) {
    if (u === null || u === undefined || Number.isNaN(u)) return "#e4e4e4";
    const v = Math.min(1, Math.max(0, u));
    return `hsl(212, 70%, ${Math.round(94 - 58 * v)}%)`;
  }

  function setProblem(text) {
    const p = document.getElementById("problem");
    p.hidden = !text;
    p.textContent = text || "";
  }

  // The latest value of each series of a `latestOf` answer's metric (its compact groups),
  // keyed by `keyOf(labels)`; counters give their latest rate, gauges the mean of their
  // latest envelope.
  function latestBy(groups, keyOf) {
    const out = new Map();
    for (const g of groups || []) {
      const names = Object.keys(g.labels);
      for (let i = 0; i < g.values.length; i++) {
        const labels = {};
        for (const n of names) {
          const at = g.labels[n][i];
          if (at !== null) labels[n] = g.dictionary[n][at];
        }
        out.set(keyOf(labels), { value: g.values[i], labels });
      }
    }
    return out;
  }

  const gpuKey = (l) => `${l.node}|${l.gpu}`;

  // `/api/v1/live/latest?format=compact` of `metrics` with `match`: the label values once in
  // a dictionary, the series as indexes into it, a number per series (`docs/http-api.md`).
  // Of the labels the views read only (`label=`): not each GPU's `uuid`.
  const LATEST_LABELS = ["gpu", "job_id", "device", "port"];
  async function compactLatest(metrics, match) {
    const a = await api(`/api/v1/live/latest?${q({ metric: metrics, match, format: "compact", label: LATEST_LABELS })}`);
    let series = 0;
    for (const m of a.metrics) series += m.values.length;
    state.maxLatestSeries = Math.max(state.maxLatestSeries, series);
    return a;
  }

  // The latest point of every live series of `metrics` (`/api/v1/live/latest`, compact), of
  // `nodes` only when given (asked per chunk of CHUNK_NODES), with `match`; per metric, its
  // groups (one per answer and kind, each with its answer's `dictionary`: what `latestBy` reads).
  async function latestOf(metrics, nodes, match) {
    const extra = match ? [match] : [];
    const chunks = [];
    if (!nodes) chunks.push(extra);
    else {
      for (let i = 0; i < nodes.length; i += CHUNK_NODES) {
        chunks.push([`node=~${nodes.slice(i, i + CHUNK_NODES).map(regexEscape).join("|")}`, ...extra]);
      }
    }
    const answers = await Promise.all(chunks.map((m) => compactLatest(metrics, m)));
    const out = new Map(metrics.map((m) => [m, []]));
    for (const a of answers) for (const g of a.metrics) out.get(g.metric).push({ ...g, dictionary: a.dictionary });
    return out;
  }

  // Each GPU's latest activity: SM activity where reported, NVML's utilization otherwise
  // (from a `latestOf` answer holding both).
  function gpuActivity(latest) {
    const out = latestBy(latest.get(GPU_UTIL), gpuKey);
    for (const v of out.values()) v.metric = "utilization";
    for (const [k, v] of latestBy(latest.get(GPU_SM), gpuKey)) out.set(k, { ...v, metric: "SM activity" });
    return out;
  }
  const portKey = (l) => `${l.node}|${l.device}|${l.port}`;

  // A port's class: its device's name without its number (`mlx5_2` -> `mlx5_`), so ports of
  // one kind of adapter are compared with each other.
  const portClass = (device) => String(device).replace(/\d+$/, "");

  // The nominal line rate of each class of port: the most common rate among the ports in
  // view (ties: the higher). A port trained down (4X -> 2X, NDR -> HDR) reports its reduced
  // rate, and its load measured against that would look like its healthy peers' while it
  // carries half their traffic; measured against its class's nominal rate, the halved
  // throughput shows. The most common rate rather than the highest: a fleet of mixed
  // adapters (200G and 400G ports of one driver) would otherwise colour its slower ports
  // half idle; a degraded port is the exception in its class, so the mode is its nominal rate.
  function nominalRates(rates) {
    const counts = new Map();
    for (const r of rates.values()) {
      if (!r.value) continue;
      const c = portClass(r.labels.device);
      if (!counts.has(c)) counts.set(c, new Map());
      const m = counts.get(c);
      m.set(r.value, (m.get(r.value) || 0) + 1);
    }
    const out = new Map();
    for (const [c, m] of counts) {
      const [rate] = [...m.entries()].sort((a, b) => b[1] - a[1] || b[0] - a[0])[0];
      out.set(c, rate);
    }
    return out;
  }

  // Per port: throughput (the larger of both directions) as a share of its class's nominal
  // line rate (never less than its own rate); `degraded` where its own rate is below it.
  function portLoads(tx, rx, rate) {
    const out = new Map();
    const txs = latestBy(tx, portKey);
    const rxs = latestBy(rx, portKey);
    const rates = latestBy(rate, portKey);
    const nominal = nominalRates(rates);
    const rateOf = (k, labels) => {
      const own = rates.get(k);
      const ownGbps = own && own.value ? own.value : null;
      const classGbps = nominal.get(portClass(labels.device)) || null;
      const gbps = ownGbps && classGbps ? Math.max(ownGbps, classGbps) : ownGbps || classGbps;
      return { ownGbps, gbps, degraded: !!(ownGbps && classGbps && ownGbps < classGbps) };
    };
    for (const [k, t] of txs) {
      const r = rxs.get(k);
      const bps = Math.max(t.value || 0, (r && r.value) || 0);
      const { ownGbps, gbps, degraded } = rateOf(k, t.labels);
      const capacity = gbps ? (gbps * 1e9) / 8 : null;
      out.set(k, {
        labels: t.labels,
        bytesPerSecond: t.value === null ? null : bps,
        load: capacity && t.value !== null ? bps / capacity : null,
        ownGbps,
        nominalGbps: gbps,
        degraded,
      });
    }
    // A port without byte counters (soft-RoCE has only packet counts) still gets its cell,
    // uncoloured, so its findings can be marked on it.
    for (const [k, g] of rates) {
      if (out.has(k)) continue;
      const { ownGbps, gbps, degraded } = rateOf(k, g.labels);
      out.set(k, { labels: g.labels, bytesPerSecond: null, load: null, ownGbps, nominalGbps: gbps, degraded });
    }
    return out;
  }

  // Active findings attached to what they are about: GPU, port, or the node itself.
  function findingsIndex(findings) {
    const idx = { gpu: new Map(), port: new Map(), node: new Map() };
    for (const f of (findings && findings.findings) || []) {
      let map, key;
      if (f.gpu !== null && f.gpu !== undefined) {
        map = idx.gpu;
        key = `${f.node}|${f.gpu}`;
      } else if (f.device) {
        map = idx.port;
        key = `${f.node}|${f.device}|${f.port === null || f.port === undefined ? "*" : f.port}`;
      } else {
        map = idx.node;
        key = f.node;
      }
      if (!map.has(key)) map.set(key, []);
      map.get(key).push(f);
    }
    idx.forPort = (node, device, port) =>
      (idx.port.get(`${node}|${device}|${port}`) || []).concat(idx.port.get(`${node}|${device}|*`) || []);
    return idx;
  }

  // Marks a cell with its findings: rules in data-finding-rule, the worst severity as a class.
  function markFindings(cell, list) {
    if (!list || !list.length) return;
    const worst = list.reduce((a, f) => ((SEVERITY_ORDER[f.severity] || 0) > (SEVERITY_ORDER[a] || 0) ? f.severity : a), "info");
    cell.classList.add("finding", `sev-${worst}`);
    cell.setAttribute("data-finding-rule", [...new Set(list.map((f) => f.rule))].join(" "));
    cell.setAttribute("data-severity", worst);
    cell.title += "\n" + list.map((f) => `${f.severity}: ${f.rule}: ${f.summary}`).join("\n");
  }

  // A GPU's cell: coloured by its activity; a GPU with an active `gpu_lost` finding (fallen
  // off the bus: its series stopped, so it would look idle) is drawn lost instead, hatched
  // and labelled so, whatever its last sample said.
  function gpuCell(node, gpu, activity, findings) {
    const lost = (findings || []).some((f) => f.rule === "gpu_lost" && (f.end === null || f.end === undefined));
    const util = activity && !lost ? activity.value : null;
    const cell = el("a", {
      class: lost ? "cell gpu lost" : "cell gpu",
      href: `#/node/${encodeURIComponent(node)}`,
      "data-node": node,
      "data-gpu": gpu,
      "data-lost": lost ? "true" : null,
      "aria-label": lost ? `GPU ${gpu} lost` : `GPU ${gpu}`,
      "data-util": util === null || util === undefined ? null : util.toFixed(3),
      title: lost
        ? `${node} GPU ${gpu}: LOST (fallen off the bus, no data since)`
        : `${node} GPU ${gpu}: ${activity ? activity.metric : "activity"} ${util === null || util === undefined ? "no data" : Math.round(util * 100) + "%"}`,
      text: gpu,
    });
    if (!lost) cell.style.background = utilColour(util);
    if (util > 0.6) cell.classList.add("dark");
    markFindings(cell, findings);
    return cell;
  }

  // A port's cell, labelled by its device (and port, where the device has several).
  function portCell(node, device, port, load, severalPorts) {
    const degraded = !!(load && load.degraded);
    const cell = el("a", {
      class: degraded ? "cell port degraded" : "cell port",
      href: `#/node/${encodeURIComponent(node)}`,
      "data-node": node,
      "data-device": device,
      "data-port": port,
      "data-load": load && load.load !== null ? load.load.toFixed(3) : null,
      "data-rate-gbps": load && load.ownGbps ? load.ownGbps : null,
      "data-nominal-gbps": load && load.nominalGbps ? load.nominalGbps : null,
      title:
        `${node} ${device}/${port}: ${
          load && load.bytesPerSecond !== null ? fmt((load.bytesPerSecond * 8) / 1e9) + " Gb/s" : "no byte counters"
        }` +
        (load && load.nominalGbps ? ` of ${fmt(load.nominalGbps)} Gb/s nominal` : "") +
        (degraded ? ` (link trained down to ${fmt(load.ownGbps)} Gb/s)` : ""),
      text: severalPorts ? `${device}/${port}` : device,
    });
    cell.style.background = utilColour(load ? load.load : null);
    if (load && load.load > 0.6) cell.classList.add("dark");
    return cell;
  }

  // The jobs whose GPUs a node runs (its GPU series' `job_id`), as links.
  function jobLinks(node, jobs) {
    const list = [...(jobs.get(node) || [])].sort();
    return el(
      "span",
      { class: "jobs", "data-node": node, "data-jobs": list.join(" ") },
      list.length ? list.map((j) => el("a", { href: `#/job/${encodeURIComponent(j)}`, class: "mono", text: j })) : el("span", { class: "quiet", text: "–" })
    );
  }

  function jobsByNode(util) {
    const out = new Map();
    for (const v of util.values()) {
      if (!v.labels.job_id) continue;
      if (!out.has(v.labels.node)) out.set(v.labels.node, new Set());
      out.get(v.labels.node).add(v.labels.job_id);
    }
    return out;
  }

  // The heading row of a grid of nodes.
  const gridHead = (withJobs) =>
    el(
      "div",
      { class: "row head" },
      el("span", { class: "node-name", text: "node" }),
      el("span", { class: "cells-head", text: "GPUs" }),
      el("span", { class: "cells-head ports", text: "IB ports" }),
      withJobs ? el("span", { class: "cells-head", text: "job" }) : el("span")
    );

  // A node's port cells, sorted by device and port.
  function portCells(node, loads, decorate) {
    const ports = [...loads.values()]
      .filter((v) => v.labels.node === node)
      .sort((a, b) => a.labels.device.localeCompare(b.labels.device, undefined, { numeric: true }) || byNumber(a.labels.port, b.labels.port));
    const perDevice = new Map();
    for (const p of ports) perDevice.set(p.labels.device, (perDevice.get(p.labels.device) || 0) + 1);
    return ports.map((p) => decorate(portCell(node, p.labels.device, p.labels.port, p, perDevice.get(p.labels.device) > 1), p));
  }

  const byNumber = (a, b) => (Number(a) - Number(b)) || String(a).localeCompare(String(b));

  function findingsTable(findings) {
    const list = ((findings && findings.findings) || [])
      .slice()
      .sort((a, b) => (SEVERITY_ORDER[b.severity] || 0) - (SEVERITY_ORDER[a.severity] || 0) || b.start - a.start);
    if (!list.length) return el("p", { class: "quiet", "data-findings": 0, text: "No findings." });
    return el(
      "table",
      { class: "list", "data-findings": list.length },
      el("tr", {}, ["severity", "rule", "node", "where", "job", "since", "until", "summary"].map((h) => el("th", { text: h }))),
      list.map((f) =>
        el(
          "tr",
          {
            class: `sev-${f.severity}`,
            "data-finding-id": f.id,
            "data-finding-rule": f.rule,
            "data-node": f.node,
            "data-device": f.device,
            "data-port": f.port,
            "data-gpu": f.gpu,
            title: JSON.stringify(f.evidence || {}),
          },
          el("td", { text: f.severity }),
          el("td", { text: f.rule }),
          el("td", {}, el("a", { href: `#/node/${encodeURIComponent(f.node)}`, text: f.node })),
          el("td", { text: f.gpu !== null && f.gpu !== undefined ? `GPU ${f.gpu}` : f.device ? (f.port === null || f.port === undefined ? f.device : `${f.device}/${f.port}`) : "node" }),
          el("td", {}, f.job_id ? el("a", { href: `#/job/${encodeURIComponent(f.job_id)}`, text: f.job_id }) : "–"),
          el("td", { text: timeText(f.start) }),
          el("td", { text: f.end === null || f.end === undefined ? "active" : timeText(f.end) }),
          el("td", { text: f.summary })
        )
      )
    );
  }

  // ------------------------------------------------------------------------------------
  // Charts (dygraphs)

  // Series of one metric as dygraphs rows: [Date, v1, v2, ...]; gauges as [min, mean, max]
  // (drawn as bands), counters as their rate times `scale`.
  function chartRows(answer, labelOf, scale) {
    const series = (answer.series || []).slice().sort((a, b) => labelOf(a.labels).localeCompare(labelOf(b.labels), undefined, { numeric: true }));
    const bars = series.some((s) => s.kind === "gauge");
    const byTime = new Map();
    series.forEach((s, i) => {
      for (const p of s.points) {
        let row = byTime.get(p.t);
        if (!row) {
          row = new Array(series.length + 1).fill(null);
          row[0] = new Date(nsToMs(p.t));
          byTime.set(p.t, row);
        }
        if (s.kind === "gauge") row[i + 1] = [p.min * scale, p.mean * scale, p.max * scale];
        else row[i + 1] = p.rate === null ? null : bars ? [p.rate * scale, p.rate * scale, p.rate * scale] : p.rate * scale;
      }
    });
    const rows = [...byTime.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
    return { rows, labels: ["time", ...series.map((s) => labelOf(s.labels))], bars };
  }

  // Series colours, far enough apart to tell 8 GPUs or 8 ports apart (Tableau 10).
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

  // Time of day on an x axis, UTC: HH:MM, with seconds only where a tick is not on a minute
  // (zoomed in to less than a few minutes).
  function timeOfDay(d) {
    const iso = new Date(d).toISOString();
    return iso.slice(17, 19) === "00" ? iso.slice(11, 16) : iso.slice(11, 19);
  }
  // Wide enough for HH:MM:SS at 12 px: a narrower label box cuts its last digit off.
  const X_AXIS = { axisLabelFormatter: timeOfDay, axisLabelWidth: 72, axisLabelFontSize: 12, pixelsPerLabel: 90 };

  // Creates or updates the chart `id` inside `box`, keeping the operator's zoom.
  function chart(box, id, data, options) {
    box.setAttribute("data-points", data.rows.length);
    box.setAttribute("data-series", data.labels.length - 1);
    const existing = state.charts[id];
    if (!data.rows.length) {
      if (existing) existing.destroy();
      delete state.charts[id];
      box.replaceChildren(el("p", { class: "quiet", text: "no data in this range" }));
      return;
    }
    if (existing && existing.railscopeBox === box && existing.getLabels().join("\u0000") === data.labels.join("\u0000")) {
      existing.updateOptions({ file: data.rows });
      return;
    }
    if (existing) existing.destroy();
    box.replaceChildren();
    const g = new Dygraph(box, data.rows, {
      labels: data.labels,
      customBars: data.bars,
      legend: "follow",
      labelsUTC: true,
      connectSeparatedPoints: true,
      height: 220,
      colors: PALETTE.slice(0, Math.max(1, data.labels.length - 1)).concat(
        data.labels.slice(PALETTE.length + 1).map((_, i) => `hsl(${(i * 137) % 360}, 55%, 45%)`)
      ),
      xAxisHeight: 22,
      ...options,
      axes: { ...(options.axes || {}), x: { ...X_AXIS, ...((options.axes || {}).x || {}) } },
    });
    g.railscopeBox = box;
    state.charts[id] = g;
  }

  // ------------------------------------------------------------------------------------
  // Fleet

  // The fleet as DOM cells (a row per node) up to GRID_MAX_NODES nodes; above, as a heat map
  // on one <canvas> (200,000 elements redrawn every 5 s would take seconds and grow the
  // page). `?canvas=1` draws the heat map whatever the size, `?canvas=0` the grid.
  const GRID_MAX_NODES = 500;
  const CANVAS = params.get("canvas");
  // Nodes per group (a rack, by name order) in the heat map; `?rack=N` for another size.
  const RACK_NODES = Math.max(1, Math.floor(Number(params.get("rack"))) || 64);
  const byName = new Intl.Collator(undefined, { numeric: true }).compare;
  const SEVERITY_STROKE = { critical: "#d7263d", warning: "#f29e02", info: "#8a94a6" };

  const worstOf = (list) => list.reduce((a, f) => ((SEVERITY_ORDER[f.severity] || 0) > (SEVERITY_ORDER[a] || 0) ? f.severity : a), "info");

  // A typed array of at least `n` elements kept in `bufs` under `name` across updates:
  // grown (by a quarter more) when too small, never shrunk, so an update of 200,000 cells
  // allocates nothing per cell and the page's heap stays flat.
  function buffer(bufs, name, Type, n) {
    let b = bufs[name];
    if (!b || b.length < n) bufs[name] = b = new Type(Math.max(16, Math.ceil(n * 1.25)));
    return b;
  }

  // What the heat map shows, from one compact answer of the fleet view's metrics and the
  // active findings: per node of `names` (name order) a column per GPU id (by number) and per
  // port (device by name, then port), in typed arrays of node x column (see `buffer`):
  // `gpuAt` (0 no cell, 1 NVML's utilization, 2 SM activity, 3 a cell for its findings
  // only), `gpuVal` (NaN: no data), `gpuLost`; `portAt`, `portTx`, `portRx` (bytes/s),
  // `portOwn` (its own rate, Gb/s), `portGbps` (what its load is measured against: its
  // class's nominal rate, never less than its own), `portLoad`, `portDegraded`; `findings`
  // keyed by "gpu CELL", "port CELL", "node NODE" (only where one is active).
  function heatData(names, pos, answer, findings, bufs) {
    const dict = answer.dictionary;
    const N = names.length;
    const nodeDict = dict.node || [];
    const nodePos = buffer(bufs, "nodePos", Int32Array, nodeDict.length);
    for (let i = 0; i < nodeDict.length; i++) nodePos[i] = pos.get(nodeDict[i]);
    const byMetric = (name) => answer.metrics.filter((m) => m.metric === name);
    const active = ((findings && findings.findings) || []).filter((f) => f.end === null || f.end === undefined);
    const atGpu = (f) => f.gpu !== null && f.gpu !== undefined;

    // GPU columns: every GPU id in the answer or in an active finding (a lost GPU has no series).
    const gpuDict = dict.gpu || [];
    const gpuIds = [...new Set(gpuDict.concat(active.filter(atGpu).map((f) => String(f.gpu))))].sort(byNumber);
    const G = Math.max(1, gpuIds.length);
    const gpuColOf = new Map(gpuIds.map((g, i) => [g, i]));
    const gpuCol = gpuDict.map((g) => gpuColOf.get(g));
    const gpuAt = buffer(bufs, "gpuAt", Uint8Array, N * G).fill(0, 0, N * G);
    const gpuVal = buffer(bufs, "gpuVal", Float32Array, N * G).fill(NaN, 0, N * G);
    const gpuLost = buffer(bufs, "gpuLost", Uint8Array, N * G).fill(0, 0, N * G);
    // A node's jobs (its GPU series' `job_id`): the first in `nodeJob`, any other in `moreJobs`.
    const jobDict = dict.job_id || [];
    const nodeJob = buffer(bufs, "nodeJob", Int32Array, N).fill(-1, 0, N);
    const moreJobs = new Map();
    // NVML's utilization first, SM activity over it where the GPU reports it.
    for (const [metric, source] of [[GPU_UTIL, 1], [GPU_SM, 2]]) {
      for (const m of byMetric(metric)) {
        const nodes = m.labels.node;
        const gpus = m.labels.gpu;
        const jobs = m.labels.job_id;
        if (!gpus) continue;
        for (let i = 0; i < m.values.length; i++) {
          if (gpus[i] === null) continue;
          const p = nodePos[nodes[i]];
          const cell = p * G + gpuCol[gpus[i]];
          gpuAt[cell] = source;
          gpuVal[cell] = m.values[i] === null ? NaN : m.values[i];
          const j = jobs ? jobs[i] : null;
          if (j === null || j === nodeJob[p]) continue;
          if (nodeJob[p] < 0) nodeJob[p] = j;
          else {
            if (!moreJobs.has(p)) moreJobs.set(p, new Set());
            moreJobs.get(p).add(j);
          }
        }
      }
    }

    // Port columns: every device and port of a byte counter or a link rate (a port without
    // byte counters, as soft-RoCE's, still gets its cell, uncoloured).
    const devDict = dict.device || [];
    const portDict = dict.port || [];
    const tx = byMetric(PORT_TX);
    const rx = byMetric(PORT_RX);
    const rate = byMetric(PORT_RATE);
    const comboOf = new Int32Array(devDict.length * portDict.length).fill(-1);
    const combos = [];
    for (const m of tx.concat(rate)) {
      const devs = m.labels.device;
      const ports = m.labels.port;
      if (!devs || !ports) continue;
      for (let i = 0; i < devs.length; i++) {
        if (devs[i] === null || ports[i] === null) continue;
        const k = devs[i] * portDict.length + ports[i];
        if (comboOf[k] < 0) {
          comboOf[k] = 0;
          combos.push({ k, device: devDict[devs[i]], port: portDict[ports[i]] });
        }
      }
    }
    combos.sort((a, b) => byName(a.device, b.device) || byNumber(a.port, b.port));
    combos.forEach((c, i) => (comboOf[c.k] = i));
    const C = Math.max(1, combos.length);
    const perDevice = new Map();
    for (const c of combos) perDevice.set(c.device, (perDevice.get(c.device) || 0) + 1);
    for (const c of combos) c.label = perDevice.get(c.device) > 1 ? `${c.device}/${c.port}` : c.device;
    const portAt = buffer(bufs, "portAt", Uint8Array, N * C).fill(0, 0, N * C);
    const portTx = buffer(bufs, "portTx", Float32Array, N * C).fill(NaN, 0, N * C);
    const portRx = buffer(bufs, "portRx", Float32Array, N * C).fill(NaN, 0, N * C);
    const portOwn = buffer(bufs, "portOwn", Float32Array, N * C).fill(NaN, 0, N * C);
    const fillPorts = (groups, into, present) => {
      for (const m of groups) {
        const nodes = m.labels.node;
        const devs = m.labels.device;
        const ports = m.labels.port;
        if (!devs || !ports) continue;
        for (let i = 0; i < m.values.length; i++) {
          if (devs[i] === null || ports[i] === null) continue;
          const col = comboOf[devs[i] * portDict.length + ports[i]];
          if (col < 0) continue;
          const cell = nodePos[nodes[i]] * C + col;
          if (present) portAt[cell] = 1;
          // A link rate of 0 (a port down) says nothing of its nominal rate.
          const v = m.values[i];
          into[cell] = v === null || (into === portOwn && !v) ? NaN : v;
        }
      }
    };
    fillPorts(tx, portTx, true);
    fillPorts(rx, portRx, false);
    fillPorts(rate, portOwn, true);

    // The nominal rate of each class of port (see `nominalRates`): the most common own rate
    // among the ports in view (ties: the higher).
    const classOf = combos.map((c) => portClass(c.device));
    const counts = new Map();
    for (let p = 0; p < N; p++) {
      for (let c = 0; c < combos.length; c++) {
        const own = portOwn[p * C + c];
        if (!(own > 0)) continue;
        if (!counts.has(classOf[c])) counts.set(classOf[c], new Map());
        const m = counts.get(classOf[c]);
        m.set(own, (m.get(own) || 0) + 1);
      }
    }
    const nominal = new Map();
    for (const [cls, m] of counts) nominal.set(cls, [...m.entries()].sort((a, b) => b[1] - a[1] || b[0] - a[0])[0][0]);
    const nominalOf = classOf.map((cls) => nominal.get(cls) || NaN);
    // Per port: throughput (the larger direction) against its class's nominal rate.
    const portGbps = buffer(bufs, "portGbps", Float32Array, N * C);
    const portLoad = buffer(bufs, "portLoad", Float32Array, N * C);
    const portDegraded = buffer(bufs, "portDegraded", Uint8Array, N * C);
    for (let p = 0; p < N; p++) {
      for (let c = 0; c < C; c++) {
        const cell = p * C + c;
        const own = portOwn[cell];
        const nom = nominalOf[c];
        const gbps = own > 0 && nom > 0 ? Math.max(own, nom) : own > 0 ? own : nom;
        portGbps[cell] = gbps;
        portDegraded[cell] = own > 0 && nom > 0 && own < nom ? 1 : 0;
        const t = portTx[cell];
        const r = portRx[cell];
        const bps = Math.max(t > 0 ? t : 0, r > 0 ? r : 0);
        portLoad[cell] = gbps > 0 && !Number.isNaN(t) ? bps / ((gbps * 1e9) / 8) : NaN;
      }
    }

    // The active findings on what they are about: a GPU (its cell made if it has none: a
    // lost GPU), every port of a device or one port, or the node.
    const found = new Map();
    const attach = (key, f) => {
      if (!found.has(key)) found.set(key, []);
      found.get(key).push(f);
    };
    for (const f of active) {
      const p = pos.get(f.node);
      if (p === undefined) continue;
      if (atGpu(f)) {
        const cell = p * G + gpuColOf.get(String(f.gpu));
        if (!gpuAt[cell]) gpuAt[cell] = 3;
        if (f.rule === "gpu_lost") gpuLost[cell] = 1;
        attach(`gpu ${cell}`, f);
      } else if (f.device) {
        combos.forEach((c, col) => {
          const onIt = c.device === f.device && (f.port === null || f.port === undefined || c.port === String(f.port));
          if (onIt && portAt[p * C + col]) attach(`port ${p * C + col}`, f);
        });
      } else attach(`node ${p}`, f);
    }
    const jobsOf = (p) => {
      const list = nodeJob[p] < 0 ? [] : [nodeJob[p], ...(moreJobs.get(p) || [])];
      return list.map((j) => jobDict[j]).sort();
    };
    return { names, pos, N, G, C, gpuIds, combos, gpuAt, gpuVal, gpuLost, portAt, portTx, portRx, portOwn, portGbps, portLoad, portDegraded, findings: found, jobsOf };
  }

  // A cell of the heat map as an object (for its hover text and a test's `cellOf`), made only
  // when asked: `kind` "gpu" or "port", `col` its column.
  function heatCell(H, p, kind, col) {
    const node = H.names[p];
    if (kind === "gpu") {
      const cell = p * H.G + col;
      if (!H.gpuAt[cell]) return null;
      const v = H.gpuVal[cell];
      const lost = !!H.gpuLost[cell];
      const metric = H.gpuAt[cell] === 2 ? "SM activity" : H.gpuAt[cell] === 1 ? "utilization" : null;
      return { kind, node, gpu: H.gpuIds[col], activity: metric && { metric }, lost, value: lost || Number.isNaN(v) ? null : v, findings: H.findings.get(`gpu ${cell}`) || [] };
    }
    const cell = p * H.C + col;
    if (!H.portAt[cell]) return null;
    const c = H.combos[col];
    const num = (x) => (Number.isNaN(x) ? null : x);
    const t = H.portTx[cell];
    const r = H.portRx[cell];
    const load = {
      bytesPerSecond: Number.isNaN(t) ? null : Math.max(t, r > 0 ? r : 0),
      ownGbps: num(H.portOwn[cell]),
      nominalGbps: num(H.portGbps[cell]),
    };
    return { kind, node, device: c.device, port: c.port, label: c.label, load, value: num(H.portLoad[cell]), degraded: !!H.portDegraded[cell], findings: H.findings.get(`port ${cell}`) || [] };
  }

  // A rack's nodes, first to last (positions `first`..`end` of the heat map's).
  const rackText = (H, first, end) => (end > first ? `${end - first} nodes, ${H.names[first]} … ${H.names[end - 1]}` : "no nodes");

  // A cell's text for the heat map's hover line and title.
  function cellText(node, c) {
    if (!c) return node;
    let text;
    if (c.kind === "gpu") {
      const u = c.value;
      text = c.lost
        ? `${node} GPU ${c.gpu}: LOST (fallen off the bus, no data since)`
        : `${node} GPU ${c.gpu}: ${c.activity ? c.activity.metric : "activity"} ${u === null || u === undefined ? "no data" : Math.round(u * 100) + "%"}`;
    } else {
      const l = c.load;
      text =
        `${node} ${c.device}/${c.port}: ${l.bytesPerSecond !== null ? fmt((l.bytesPerSecond * 8) / 1e9) + " Gb/s" : "no byte counters"}` +
        (l.nominalGbps ? ` of ${fmt(l.nominalGbps)} Gb/s nominal` : "") +
        (c.degraded ? ` (link trained down to ${fmt(l.ownGbps)} Gb/s)` : "");
    }
    return c.findings.length ? `${text}; ${c.findings.map((f) => `${f.severity}: ${f.rule}: ${f.summary}`).join("; ")}` : text;
  }

  // The heat map's geometry: at the fleet's zoom every node as a strip of small cells (its
  // GPUs, then its ports, a column each), a rack of RACK_NODES nodes as a column of strips,
  // racks side by side and wrapped to the page's width; zoomed into a rack, its nodes'
  // strips with large cells, named, with their jobs. `hit(x, y)` finds what is under the
  // pointer.
  function heatLayout(H, rack, width) {
    const gpuCols = H.G;
    const portCols = H.C;
    const zoomed = rack !== null;
    const size = zoomed ? 18 : 3;
    const gap = zoomed ? 2 : 0;
    const nameW = zoomed ? 160 : 0;
    const split = zoomed ? 12 : 2;
    const stripW = nameW + gpuCols * (size + gap) + split + portCols * (size + gap);
    const first = zoomed ? Math.min(rack * RACK_NODES, H.N) : 0;
    const end = zoomed ? Math.min(first + RACK_NODES, H.N) : H.N;
    const count = end - first;
    const racks = zoomed ? 1 : Math.ceil(count / RACK_NODES);
    const rackW = zoomed ? stripW + 200 : stripW + 8;
    const head = 14;
    const rackH = head + Math.min(RACK_NODES, count) * (size + gap) + 8;
    const perRow = Math.max(1, Math.floor(width / rackW));
    const L = { H, zoomed, size, gap, nameW, split, stripW, first, end, count, racks, rackW, rackH, head, perRow, gpuCols };
    L.width = zoomed ? rackW : Math.max(1, Math.min(racks, perRow) * rackW);
    L.height = Math.max(1, Math.ceil(racks / perRow) * rackH);
    // The top left of the i-th node drawn (position first + i), and of its column k (GPUs
    // first, then ports).
    L.nodeAt = (i) => {
      const r = Math.floor(i / RACK_NODES);
      return [(r % perRow) * rackW, Math.floor(r / perRow) * rackH + head + (i % RACK_NODES) * (size + gap)];
    };
    L.cellX = (k) => nameW + (k < gpuCols ? k * (size + gap) : gpuCols * (size + gap) + split + (k - gpuCols) * (size + gap));
    L.hit = (x, y) => {
      const col = Math.floor(x / rackW);
      const row = Math.floor(y / rackH);
      if (col >= perRow) return null;
      const r = row * perRow + col;
      const inRack = Math.floor((y - row * rackH - head) / (size + gap));
      if (r >= racks || inRack < 0 || inRack >= RACK_NODES) return { rack: r < racks ? r : null };
      const i = r * RACK_NODES + inRack;
      if (i >= count) return { rack: r };
      const p = first + i;
      const dx = x - col * rackW;
      let cell = null;
      if (dx >= nameW && dx < nameW + gpuCols * (size + gap)) cell = heatCell(H, p, "gpu", Math.floor((dx - nameW) / (size + gap)));
      const px = dx - nameW - gpuCols * (size + gap) - split;
      if (px >= 0 && px < portCols * (size + gap)) cell = heatCell(H, p, "port", Math.floor(px / (size + gap)));
      return { rack: zoomed ? rack : r, node: H.names[p], cell };
    };
    return L;
  }

  // The heat map's colours as levels: utilColour's lightness is a whole percent, so
  // utilisation 0..1 takes one of 59 colours (level 0..58), grey (no data) is level 59.
  const GREY_LEVEL = 59;
  const levelOf = (u) => (u === null || u === undefined || Number.isNaN(u) ? GREY_LEVEL : Math.round(58 * Math.min(1, Math.max(0, u))));
  const LEVEL_COLOURS = Array.from({ length: GREY_LEVEL + 1 }, (_, l) => utilColour(l === GREY_LEVEL ? null : l / 58));
  // The same as RGB, for writing the fleet's zoom as pixels (hsl(212, 70%, L%) converted).
  const LEVEL_RGB = LEVEL_COLOURS.map((_, l) => {
    if (l === GREY_LEVEL) return [0xe4, 0xe4, 0xe4];
    const light = Math.round(94 - l) / 100;
    const chroma = (1 - Math.abs(2 * light - 1)) * 0.7;
    const x = chroma * (1 - Math.abs(((212 / 60) % 2) - 1));
    const m = light - chroma / 2;
    return [0, x, chroma].map((v) => Math.round((v + m) * 255));
  });

  // Draws the heat map on `canvas`: every cell filled in its colour (at the fleet's zoom as
  // pixels written at once; zoomed, a rectangle each), lost GPUs dark (hatched when large),
  // degraded ports marked (dashed when large), then the findings on top, outlined by
  // severity. What it drew goes to `state.fleet`.
  function drawHeatMap(canvas, L, rack, bufs) {
    if (canvas.width !== L.width) canvas.width = L.width;
    if (canvas.height !== L.height) canvas.height = L.height;
    const ctx = canvas.getContext("2d");
    const { H, size, first, end, gpuCols } = L;
    const { G, C } = H;
    let gpuCells = 0;
    let portCells = 0;
    let colouredGpus = 0;
    let colouredPorts = 0;
    let nodesColoured = 0;
    const lost = [];
    const degraded = [];
    // Each cell's colour level, then drawn: pixels at the fleet's zoom, rectangles zoomed.
    let image = null;
    if (!L.zoomed) {
      if (!bufs.image || bufs.image.width !== L.width || bufs.image.height !== L.height) bufs.image = ctx.createImageData(L.width, L.height);
      image = bufs.image;
      image.data.fill(0);
    } else ctx.clearRect(0, 0, canvas.width, canvas.height);
    const px = image && image.data;
    const paint = (level, x, y) => {
      if (!px) {
        ctx.fillStyle = LEVEL_COLOURS[level];
        ctx.fillRect(x, y, size, size);
        return;
      }
      const [r, g, b] = LEVEL_RGB[level];
      for (let dy = 0; dy < size; dy++) {
        let o = ((y + dy) * L.width + x) * 4;
        for (let dx = 0; dx < size; dx++, o += 4) {
          px[o] = r;
          px[o + 1] = g;
          px[o + 2] = b;
          px[o + 3] = 255;
        }
      }
    };
    for (let p = first; p < end; p++) {
      const [x0, y0] = L.nodeAt(p - first);
      let cells = 0;
      let grey = 0;
      for (let k = 0; k < G; k++) {
        const cell = p * G + k;
        if (!H.gpuAt[cell]) continue;
        cells += 1;
        gpuCells += 1;
        const x = x0 + L.cellX(k);
        if (H.gpuLost[cell]) {
          lost.push(x, y0, `${H.names[p]} gpu ${H.gpuIds[k]}`);
          grey += 1;
          continue;
        }
        const v = H.gpuVal[cell];
        if (Number.isNaN(v)) grey += 1;
        else colouredGpus += 1;
        paint(levelOf(v), x, y0);
      }
      const gpusHere = cells;
      for (let k = 0; k < C; k++) {
        const cell = p * C + k;
        if (!H.portAt[cell]) continue;
        cells += 1;
        portCells += 1;
        const x = x0 + L.cellX(gpuCols + k);
        const v = H.portLoad[cell];
        if (Number.isNaN(v)) grey += 1;
        else colouredPorts += 1;
        paint(levelOf(v), x, y0);
        if (H.portDegraded[cell]) degraded.push(x, y0, `${H.names[p]} port ${H.combos[k].device}/${H.combos[k].port}`);
      }
      if (gpusHere && cells > gpusHere && !grey) nodesColoured += 1;
    }
    if (image) ctx.putImageData(image, 0, 0);
    for (let j = 0; j < lost.length; j += 3) {
      ctx.fillStyle = "#3a3f4b";
      ctx.fillRect(lost[j], lost[j + 1], size, size);
      if (L.zoomed) {
        ctx.strokeStyle = "#6b7280";
        ctx.lineWidth = 2;
        ctx.beginPath();
        for (let d = -size; d < size; d += 6) {
          ctx.moveTo(lost[j] + Math.max(0, d), lost[j + 1] + Math.max(0, -d));
          ctx.lineTo(lost[j] + Math.min(size, d + size), lost[j + 1] + Math.min(size, size - d));
        }
        ctx.stroke();
      }
    }
    ctx.strokeStyle = "#7a4b00";
    ctx.fillStyle = "#7a4b00";
    for (let j = 0; j < degraded.length; j += 3) {
      if (L.zoomed) {
        ctx.setLineDash([3, 2]);
        ctx.lineWidth = 2;
        ctx.strokeRect(degraded[j] + 1, degraded[j + 1] + 1, size - 2, size - 2);
        ctx.setLineDash([]);
      } else ctx.fillRect(degraded[j], degraded[j + 1] + size - 1, size, 1);
    }
    // Findings on top: a ring around the cell (or the node's strip), in its severity's colour.
    const where = [];
    ctx.lineWidth = L.zoomed ? 3 : 1;
    const pad = L.zoomed ? 1 : 0;
    for (const [key, list] of H.findings) {
      const [kind, at] = key.split(" ");
      const n = Number(at);
      const p = kind === "gpu" ? Math.floor(n / G) : kind === "port" ? Math.floor(n / C) : n;
      if (p < first || p >= end) continue;
      const [x0, y0] = L.nodeAt(p - first);
      let x = x0;
      let w = L.stripW;
      if (kind === "gpu") {
        x += L.cellX(n % G);
        w = size;
        where.push(`${H.names[p]} gpu ${H.gpuIds[n % G]}`);
      } else if (kind === "port") {
        const c = H.combos[n % C];
        x += L.cellX(gpuCols + (n % C));
        w = size;
        where.push(`${H.names[p]} port ${c.device}/${c.port}`);
      } else where.push(`${H.names[p]} node`);
      ctx.strokeStyle = SEVERITY_STROKE[worstOf(list)] || SEVERITY_STROKE.info;
      ctx.strokeRect(x - 0.5 - pad, y0 - 0.5 - pad, w + 1 + 2 * pad, size + 1 + 2 * pad);
    }
    // Labels: each rack's first node at the fleet's zoom; each node's name and jobs in a rack.
    ctx.fillStyle = "#1d2330";
    ctx.font = L.zoomed ? "12px ui-monospace, monospace" : "10px ui-monospace, monospace";
    ctx.textBaseline = "top";
    if (!L.zoomed) {
      for (let r = 0; r < L.racks; r++) {
        const [x, y] = L.nodeAt(r * RACK_NODES);
        ctx.fillText(String(r + 1), x, y - L.head + 2, L.rackW - 4);
      }
    } else {
      for (let p = first; p < end; p++) {
        const [x, y] = L.nodeAt(p - first);
        const nodeFindings = H.findings.get(`node ${p}`);
        ctx.fillStyle = nodeFindings ? SEVERITY_STROKE[worstOf(nodeFindings)] : "#1d2330";
        ctx.fillText(H.names[p], x + 2, y + 3, L.nameW - 6);
        ctx.fillStyle = "#6b7280";
        ctx.fillText(H.jobsOf(p).join(" "), x + L.stripW + 8, y + 3, 190);
      }
    }
    // Where a cell (`gpu` id, `port` as "DEVICE/PORT") of a drawn node is: its position and column.
    const locate = (node, kind, id) => {
      const p = H.pos.get(node);
      if (p === undefined || p < first || p >= end) return null;
      const col = kind === "gpu" ? H.gpuIds.indexOf(String(id)) : H.combos.findIndex((c) => `${c.device}/${c.port}` === id);
      return col < 0 || !heatCell(H, p, kind, col) ? null : { p, col };
    };
    const centreOf = (node, kind, id) => {
      const at = locate(node, kind, id);
      if (!at) return null;
      const [x0, y0] = L.nodeAt(at.p - first);
      return [x0 + L.cellX(kind === "gpu" ? at.col : gpuCols + at.col) + Math.floor(size / 2), y0 + Math.floor(size / 2)];
    };
    state.fleet = {
      mode: "canvas",
      zoom: rack === null ? "fleet" : `rack ${rack + 1}`,
      racks: L.racks,
      nodes: L.count,
      gpuCells,
      portCells,
      colouredGpus,
      colouredPorts,
      // Nodes whose every GPU and port cell is coloured (not grey: a value, not lost).
      nodesColoured,
      // "NODE gpu G", "NODE port DEVICE/PORT", "NODE node": what the findings outline.
      marked: where.sort(),
      lost: lost.filter((_, j) => j % 3 === 2).sort(),
      degraded: degraded.filter((_, j) => j % 3 === 2).sort(),
      // The middle of a cell on the canvas, [x, y] from its top left; the pixel drawn there
      // as [r, g, b, a]: for a test to see what is drawn and to point at it.
      centreOf,
      pixelOf: (node, kind, id) => {
        const at = centreOf(node, kind, id);
        return at && [...ctx.getImageData(at[0], at[1], 1, 1).data];
      },
      cellOf: (node, kind, id) => {
        const at = locate(node, kind, id);
        const c = at && heatCell(H, at.p, kind, at.col);
        return c ? { value: c.value, colour: utilColour(c.value), lost: !!c.lost, degraded: !!c.degraded, rules: c.findings.map((f) => f.rule) } : null;
      },
    };
  }

  const fleetView = {
    // The heat map's typed arrays and pixels, kept across updates and visits (see `buffer`).
    bufs: {},
    // The last update's node names in name order and their positions, kept while the fleet's
    // nodes stay the same (sorting 12,500 names by number takes a while).
    order: { names: [], pos: new Map() },
    mount(root, route) {
      const m = /^rack\/(\d+)$/.exec(route.arg || "");
      this.rack = m ? Number(m[1]) - 1 : null;
      this.layout = null;
      root.append(
        el("h1", {}, "Fleet", this.rack === null ? "" : [" · ", el("a", { href: "#/fleet", text: "all racks" }), ` · rack ${this.rack + 1}`]),
        el(
          "p",
          { class: "legend" },
          "GPU cells coloured by SM activity (NVML utilization where the GPU does not report it), IB port cells (by device) by traffic against their class's nominal line rate: ",
          el("span", { class: "swatch", style: `background:${utilColour(0)}` }),
          " idle … ",
          el("span", { class: "swatch", style: `background:${utilColour(1)}` }),
          " busy; ",
          el("span", { class: "swatch lost" }),
          " GPU lost; dashed (a dark underline when small): port trained below its nominal rate; outlined where a finding is active (red critical, orange warning). Click a cell for its node, a job for its view.",
          el("span", { id: "fleet-zoom-help" })
        ),
        el("div", { id: "fleet-hover", class: "quiet mono" }, "\u00a0"),
        el("div", { id: "fleet-grid" }),
        el("h2", { text: "Active findings" }),
        el("div", { id: "fleet-findings" })
      );
    },
    // `names` (a Set) in name order, with each one's position.
    inOrder(names) {
      const o = this.order;
      if (names.size === o.names.length && [...names].every((n) => o.pos.has(n))) return o;
      const sorted = [...names].sort(byName);
      this.order = { names: sorted, pos: new Map(sorted.map((n, i) => [n, i])) };
      return this.order;
    },
    async update() {
      const began = performance.now();
      const metrics = [GPU_SM, GPU_UTIL, PORT_TX, PORT_RX, PORT_RATE];
      // The three questions at once; each one's time (ms) for `timings`.
      const took = {};
      const timed = (name, promise) => promise.then((v) => ((took[name] = Math.round(performance.now() - began)), v));
      const [live, findings, answer] = await Promise.all([
        timed("nodesMs", api("/api/v1/live/nodes")),
        timed("findingsMs", optionalApi(`/api/v1/findings?${q({ active: "true" })}`)),
        timed("latestMs", compactLatest(metrics, null)),
      ]);
      const answered = performance.now();
      const names = new Set(live.map((n) => n.node));
      for (const n of answer.dictionary.node || []) names.add(n);
      for (const f of (findings && findings.findings) || []) names.add(f.node);
      const order = this.inOrder(names);
      const canvas = CANVAS === "1" || (CANVAS !== "0" && (order.names.length > GRID_MAX_NODES || this.rack !== null));
      if (canvas) {
        // Straight from the answer's arrays into the heat map's: no object per series or cell.
        this.heat = heatData(order.names, order.pos, answer, findings, this.bufs);
        const modelled = performance.now();
        this.drawCanvas();
        // Where an update's time went (ms): each answer since the update began (asked, sent,
        // parsed; asked at once), turning them into cells, drawing.
        state.fleet.timings = { ...took, modelMs: Math.round(modelled - answered), drawMs: Math.round(performance.now() - modelled) };
      } else {
        const latest = new Map(metrics.map((m) => [m, answer.metrics.filter((g) => g.metric === m).map((g) => ({ ...g, dictionary: answer.dictionary }))]));
        const util = gpuActivity(latest);
        const loads = portLoads(latest.get(PORT_TX), latest.get(PORT_RX), latest.get(PORT_RATE));
        this.drawGrid(order.names, util, loads, findingsIndex(findings), jobsByNode(util));
      }
      document
        .getElementById("fleet-findings")
        .replaceChildren(findings ? findingsTable(findings) : el("p", { class: "quiet", text: "This collector serves no findings." }));
    },
    // The heat map, on the one canvas this view keeps (redrawn, not replaced, every update).
    drawCanvas() {
      const H = this.heat;
      const box = document.getElementById("fleet-grid");
      let canvas = box.querySelector("canvas.heat-map");
      if (!canvas) {
        canvas = el("canvas", { class: "heat-map", "data-view": "heat-map" });
        const hover = document.getElementById("fleet-hover");
        const at = (e) => {
          const r = canvas.getBoundingClientRect();
          return this.layout ? this.layout.hit(e.clientX - r.left, e.clientY - r.top) : null;
        };
        canvas.addEventListener("mousemove", (e) => {
          const h = at(e);
          const onRack = h && this.rack === null && h.rack !== null && h.rack !== undefined;
          const first = onRack ? h.rack * RACK_NODES : 0;
          const text = !h ? "\u00a0" : h.node ? cellText(h.node, h.cell) : onRack ? `rack ${h.rack + 1}: ${rackText(this.heat, first, Math.min(first + RACK_NODES, this.heat.N))}` : "\u00a0";
          hover.textContent = text;
          canvas.title = text;
          canvas.style.cursor = h && (h.node || h.rack !== null) ? "pointer" : "default";
        });
        canvas.addEventListener("click", (e) => {
          const h = at(e);
          if (!h) return;
          // From the fleet to a rack, from a rack to a node.
          if (this.rack === null && h.rack !== null && h.rack !== undefined) location.hash = `#/fleet/rack/${h.rack + 1}`;
          else if (this.rack !== null && h.node) location.hash = `#/node/${encodeURIComponent(h.node)}`;
        });
        box.replaceChildren(canvas);
      }
      const width = Math.max(400, box.clientWidth || document.documentElement.clientWidth - 40);
      this.layout = heatLayout(H, this.rack, width);
      drawHeatMap(canvas, this.layout, this.rack, this.bufs);
      canvas.setAttribute("data-nodes", this.layout.count);
      document.getElementById("fleet-zoom-help").textContent =
        this.rack === null
          ? ` ${H.N} nodes in ${this.layout.racks} racks of ${RACK_NODES} (by name); click a rack to zoom in, point at a cell to name it.`
          : ` Rack ${this.rack + 1} of ${Math.ceil(H.N / RACK_NODES)}: ${rackText(H, this.layout.first, this.layout.end)}.`;
    },
    // The DOM grid: a row per node, a cell per GPU and port.
    drawGrid(sorted, util, loads, idx, jobs) {
      this.layout = null;
      const grid = el("div", { class: "grid", "data-nodes": sorted.length }, gridHead(true));
      for (const node of sorted) {
        const gpuIds = [...util.values()].filter((v) => v.labels.node === node).map((v) => v.labels.gpu);
        // A GPU with a finding but no series (fallen off the bus) still gets its cell.
        for (const key of idx.gpu.keys()) if (key.startsWith(node + "|")) gpuIds.push(key.slice(node.length + 1));
        const gpuCells = [...new Set(gpuIds)].sort(byNumber).map((gpu) => gpuCell(node, gpu, util.get(`${node}|${gpu}`), idx.gpu.get(`${node}|${gpu}`)));
        const ports = portCells(node, loads, (cell, p) => {
          markFindings(cell, idx.forPort(node, p.labels.device, p.labels.port));
          return cell;
        });
        const name = el("a", { class: "node-name", href: `#/node/${encodeURIComponent(node)}`, "data-node": node, text: node, title: node });
        markFindings(name, idx.node.get(node));
        grid.append(
          el(
            "div",
            { class: "row", "data-node": node },
            name,
            el("span", { class: "cells gpus", title: "GPUs" }, gpuCells.length ? gpuCells : el("span", { class: "quiet", text: "no GPUs" })),
            el("span", { class: "cells ports", title: "IB ports" }, ports.length ? ports : el("span", { class: "quiet", text: "no IB ports" })),
            jobLinks(node, jobs)
          )
        );
      }
      if (!sorted.length) grid.append(el("p", { class: "quiet", text: "No node has sent anything yet." }));
      document.getElementById("fleet-grid").replaceChildren(grid);
      state.fleet = { mode: "grid", nodes: sorted.length };
    },
  };

  // ------------------------------------------------------------------------------------
  // Jobs

  // The straggler window the jobs and job views ask for: its end aligned to the analysis'
  // step, one step behind the clock (see STRAGGLER_STEP_S); unix seconds.
  function stragglerWindow() {
    const end = Math.floor(Date.now() / 1000 / STRAGGLER_STEP_S) * STRAGGLER_STEP_S - STRAGGLER_STEP_S;
    return { start: end - STRAGGLER_WINDOW_S, end };
  }
  const clock = (s) => new Date(s * 1000).toISOString().slice(11, 19);
  const windowText = (w) => `${clock(w.start)}–${clock(w.end)} UTC`;

  // The stragglers of the window `w` (of one job, or of all); the question asked is kept in
  // `state.stragglerQuery`.
  function stragglers(w, job) {
    const query = `/api/v1/stragglers?${q({ job_id: job, start: w.start, end: w.end })}`;
    state.stragglerQuery = query;
    return optionalApi(query);
  }

  const jobsView = {
    mount(root) {
      root.append(
        el("h1", { text: "Jobs" }),
        el("p", { class: "quiet", id: "jobs-window", text: "Jobs seen over the straggler window (5 minutes, ending on a 10 s step), with their stragglers." }),
        el("div", { id: "jobs-list" })
      );
    },
    async update() {
      const w = stragglerWindow();
      const answer = await stragglers(w, null);
      document.getElementById("jobs-window").textContent = `Jobs seen over the straggler window ${windowText(w)} (5 minutes, ending on a 10 s step, so the answer holds until the next step), with their stragglers.`;
      const box = document.getElementById("jobs-list");
      box.setAttribute("data-window", `${w.start}-${w.end}`);
      if (!answer) return box.replaceChildren(el("p", { class: "quiet", text: "This collector serves no straggler analysis." }));
      const jobs = answer.jobs || [];
      if (!jobs.length) return box.replaceChildren(el("p", { class: "quiet", text: "No job labels in this range." }));
      box.replaceChildren(
        el(
          "table",
          { class: "list" },
          el("tr", {}, ["job", "nodes", "GPUs", "stragglers"].map((h) => el("th", { text: h }))),
          jobs.map((j) =>
            el(
              "tr",
              { "data-job": j.job_id, "data-stragglers": j.stragglers.length },
              el("td", {}, el("a", { href: `#/job/${encodeURIComponent(j.job_id)}`, text: j.job_id })),
              el("td", { text: j.nodes }),
              el("td", { text: j.gpus }),
              el("td", { class: j.stragglers.length ? "warn" : "", text: j.stragglers.length })
            )
          )
        )
      );
    },
  };

  const jobView = {
    mount(root, route) {
      root.append(
        el("h1", {}, "Job ", el("span", { class: "mono", text: route.arg })),
        el(
          "p",
          { class: "legend", id: "job-legend" },
          "Its GPUs and its nodes' IB ports side by side, coloured by utilisation (ports against their class's nominal rate); findings outlined (red critical, orange warning), lost GPUs hatched, stragglers (far from the job’s median over the straggler window) outlined in magenta and ranked below."
        ),
        el("div", { id: "job-grid" }),
        el("h2", { text: "Findings" }),
        el("p", { class: "quiet", text: "On the job's nodes, GPUs and ports, or carrying its id, over the straggler window and still active." }),
        el("div", { id: "job-findings" }),
        el("h2", { text: "Stragglers" }),
        el("div", { id: "job-stragglers" })
      );
    },
    async update(route) {
      const job = route.arg;
      const w = stragglerWindow();
      const [answer, jobGpus, findings] = await Promise.all([
        stragglers(w, job),
        latestOf([GPU_SM, GPU_UTIL], null, `job_id=${JSON.stringify(job)}`),
        optionalApi(`/api/v1/findings?${q({ start: w.start })}`),
      ]);
      const util = gpuActivity(jobGpus);
      const entry = answer && (answer.jobs || []).find((j) => j.job_id === job);
      const stragglerList = (entry && entry.stragglers) || [];
      const nodes = new Set([...util.values()].map((v) => v.labels.node));
      for (const s of stragglerList) nodes.add(s.node);
      let loads = new Map();
      if (nodes.size) {
        const ports = await latestOf([PORT_TX, PORT_RX, PORT_RATE], [...nodes], null);
        loads = portLoads(ports.get(PORT_TX), ports.get(PORT_RX), ports.get(PORT_RATE));
      }
      // The job's findings: those carrying its id, and those on its nodes (their GPUs and
      // ports too); ended ones only where they overlap the window.
      const jobFindings = ((findings && findings.findings) || []).filter((f) => f.job_id === job || nodes.has(f.node));
      const active = jobFindings.filter((f) => f.end === null || f.end === undefined);
      const idx = findingsIndex({ findings: active });
      const findingById = new Map(((findings && findings.findings) || []).map((f) => [f.id, f]));
      // A cell is marked by its best-ranked straggler entry (one per metric it stands out in).
      const mark = (cell, s, rank) => {
        if (cell.hasAttribute("data-straggler")) return;
        cell.classList.add("straggler");
        cell.setAttribute("data-straggler", "true");
        cell.setAttribute("data-straggler-rank", rank);
        cell.setAttribute("data-straggler-metric", s.metric);
        cell.title += `\nstraggler #${rank}: ${s.metric} ${fmt(s.value)} (job median ${fmt(s.median)}, score ${fmt(s.score, 1)})`;
      };
      const grid = el("div", { class: "grid", "data-nodes": nodes.size }, gridHead(false));
      for (const node of [...nodes].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }))) {
        const gpuIds = [...util.values()].filter((v) => v.labels.node === node).map((v) => v.labels.gpu);
        // A GPU of the node with an active finding (a lost one has no series) keeps its cell.
        for (const key of idx.gpu.keys()) if (key.startsWith(node + "|")) gpuIds.push(key.slice(node.length + 1));
        const gpuCells = [...new Set(gpuIds)].sort(byNumber).map((gpu) => {
          const cell = gpuCell(node, gpu, util.get(`${node}|${gpu}`), idx.gpu.get(`${node}|${gpu}`));
          stragglerList.forEach((s, i) => {
            if (s.node === node && String(s.gpu) === String(gpu)) mark(cell, s, i + 1);
          });
          return cell;
        });
        const ports = portCells(node, loads, (cell, p) => {
          markFindings(cell, idx.forPort(node, p.labels.device, p.labels.port));
          stragglerList.forEach((s, i) => {
            if (s.node === node && s.device === p.labels.device && (s.port === null || String(s.port) === String(p.labels.port))) mark(cell, s, i + 1);
          });
          return cell;
        });
        const name = el("a", { class: "node-name", href: `#/node/${encodeURIComponent(node)}`, "data-node": node, text: node });
        markFindings(name, idx.node.get(node));
        stragglerList.forEach((s, i) => {
          if (s.node === node && (s.gpu === null || s.gpu === undefined) && !s.device) mark(name, s, i + 1);
        });
        grid.append(el("div", { class: "row", "data-node": node }, name, el("span", { class: "cells gpus" }, gpuCells), el("span", { class: "cells ports" }, ports), el("span")));
      }
      if (!nodes.size) grid.append(el("p", { class: "quiet", text: "No series carries this job in the last minute." }));
      document.getElementById("job-grid").replaceChildren(grid);
      document
        .getElementById("job-findings")
        .replaceChildren(findings ? findingsTable({ findings: jobFindings }) : el("p", { class: "quiet", text: "This collector serves no findings." }));

      const list = document.getElementById("job-stragglers");
      if (!answer) return list.replaceChildren(el("p", { class: "quiet", text: "This collector serves no straggler analysis." }));
      if (!stragglerList.length) return list.replaceChildren(el("p", { class: "quiet", "data-stragglers": 0, text: `No straggler over ${windowText(w)}.` }));
      list.replaceChildren(
        el("p", { class: "quiet", text: `Over ${windowText(w)}.` }),
        el(
          "table",
          { class: "list", "data-stragglers": stragglerList.length },
          el("tr", {}, ["#", "node", "where", "metric", "value", "job median", "score", "likely cause"].map((h) => el("th", { text: h }))),
          stragglerList.map((s, i) => {
            const cause = s.cause ? findingById.get(s.cause) : null;
            return el(
              "tr",
              { "data-straggler-row": i + 1, "data-node": s.node, "data-gpu": s.gpu, "data-device": s.device, "data-port": s.port },
              el("td", { text: i + 1 }),
              el("td", {}, el("a", { href: `#/node/${encodeURIComponent(s.node)}`, text: s.node })),
              el("td", { text: s.gpu !== null && s.gpu !== undefined ? `GPU ${s.gpu}` : s.device ? `${s.device}/${s.port ?? "*"}` : "node" }),
              el("td", { class: "mono", text: s.metric }),
              el("td", { text: fmt(s.value) }),
              el("td", { text: fmt(s.median) }),
              el("td", { text: fmt(s.score, 1) }),
              el("td", { "data-cause": s.cause, text: cause ? `${cause.rule}: ${cause.summary}` : s.cause || "–" })
            );
          })
        )
      );
    },
  };

  // ------------------------------------------------------------------------------------
  // Node

  const NODE_CHARTS = [
    { metric: GPU_UTIL, title: "GPU utilization (%)", scale: 100, label: (l) => `GPU ${l.gpu}` },
    { metric: GPU_SM, title: "GPU SM activity (%)", scale: 100, label: (l) => `GPU ${l.gpu}` },
    { metric: METRIC.GPU_POWER_WATTS, title: "GPU power (W)", scale: 1, label: (l) => `GPU ${l.gpu}` },
    { metric: METRIC.GPU_TEMPERATURE_CELSIUS, title: "GPU temperature (°C)", scale: 1, label: (l) => `GPU ${l.gpu}` },
    // A port without byte counters (soft-RoCE's rxe has only hw_counters' packet counts) is
    // charted by its packets, in the first of `fallbacks` the node has.
    {
      metric: PORT_TX,
      title: "IB transmit (Gb/s)",
      scale: 8 / 1e9,
      label: (l) => `${l.device}/${l.port}`,
      fallbacks: [
        { metric: METRIC.IB_PORT_XMIT_PACKETS_TOTAL, title: "IB transmit (packets/s; no byte counters)", scale: 1 },
        { metric: METRIC.IB_SENT_PKTS_TOTAL, title: "IB transmit (packets/s; no byte counters)", scale: 1 },
      ],
    },
    {
      metric: PORT_RX,
      title: "IB receive (Gb/s)",
      scale: 8 / 1e9,
      label: (l) => `${l.device}/${l.port}`,
      fallbacks: [
        { metric: METRIC.IB_PORT_RCV_PACKETS_TOTAL, title: "IB receive (packets/s; no byte counters)", scale: 1 },
        { metric: METRIC.IB_RCVD_PKTS_TOTAL, title: "IB receive (packets/s; no byte counters)", scale: 1 },
      ],
    },
  ];

  // The answer of chart `c` over `range` on `match`: its metric's, or where that has no
  // series, the first fallback's that has; with the title and scale of what was answered.
  async function chartAnswer(c, match, range) {
    const answer = await api(`/api/v1/series?${q({ metric: c.metric, match, start: range })}`);
    if ((answer.series || []).length) return { answer, shown: c };
    for (const f of c.fallbacks || []) {
      const other = await api(`/api/v1/series?${q({ metric: f.metric, match, start: range })}`);
      if ((other.series || []).length) return { answer: other, shown: f };
    }
    return { answer, shown: c };
  }
  const RANGES = ["-15m", "-1h", "-6h"];

  // The golden profile's rules (docs/findings.md): marked on the hardware path.
  const PROFILE_RULES = ["pcie_downtrained", "firmware_drift", "device_missing", "topology_drift"];

  // `Gen5 x16`, with ` of Gen5 x16` where the link trained below what it can.
  function linkText(l) {
    const now = `Gen${l.generation ?? "?"} x${l.width ?? "?"}`;
    const max = `Gen${l.max_generation ?? "?"} x${l.max_width ?? "?"}`;
    return now === max ? now : `${now} of ${max}`;
  }

  // A cell whose value is unlike its class's majority: marked, the class's value in its title.
  function classCell(text, classValue) {
    const drift = classValue !== null && classValue !== undefined && String(classValue) !== String(text);
    return el("td", {
      class: drift ? "drift mono" : "mono",
      "data-drift": drift ? "true" : null,
      "data-class-value": drift ? classValue : null,
      title: drift ? `class: ${classValue}` : null,
      text: text === "" || text === null || text === undefined ? "–" : text,
    });
  }

  // The node's hardware path (GET /api/v1/nodes/NAME/hardware): its GPUs and RDMA devices, the
  // GPU×NIC distance matrix against its class's, the golden profile's active findings marked.
  function hardwareSection(node, hw, findings) {
    if (!hw || (!hw.gpus.length && !hw.rdma.length)) return el("p", { class: "quiet", text: "No hardware path sent." });
    const active = ((findings && findings.findings) || []).filter(
      (f) => PROFILE_RULES.includes(f.rule) && (f.end === null || f.end === undefined)
    );
    const of = (test) => active.filter(test);
    const cp = hw.class_profile || {};
    const value = (m) => (m ? m.value : null);
    const counts = hw.counts || {};
    const info = hw.info || {};
    const summary = el(
      "p",
      { "data-hw-class": hw.class ? `${hw.class.gpu_model} + ${hw.class.nic_model}` : null },
      `Class ${hw.class ? `${hw.class.gpu_model || "no GPU"} + ${hw.class.nic_model || "no NIC"}` : "not sent"}` +
        (cp.nodes ? ` (${cp.nodes} nodes)` : "") +
        `; kernel ${info.kernel || "–"}, driver ${info.driver || "–"}; ` +
        [
          ["GPUs", counts.gpus, cp.gpus],
          ["RDMA devices", counts.rdma_devices, cp.rdma_devices],
          ["active ports", counts.active_ports, cp.active_ports],
        ]
          .map(([what, n, m]) => `${n ?? "–"} ${what}` + (m && m.value !== n ? ` (class ${m.value})` : ""))
          .join(", ")
    );
    markFindings(summary, of((f) => !f.gpu && !f.device && f.rule !== "topology_drift"));
    const head = ["device", "PCI", "NUMA", "switch", "root port", "link", "firmware", "model"];
    const rows = [];
    for (const g of hw.gpus) {
      const row = el(
        "tr",
        { "data-hw-gpu": g.gpu },
        el("td", { text: `GPU ${g.gpu}` }),
        el("td", { class: "mono", text: g.pci || "–" }),
        el("td", { text: g.place.numa_node ?? "–" }),
        el("td", { class: "mono", text: g.place.switch || "–" }),
        el("td", { class: "mono", text: g.place.root_port || "–" }),
        classCell(linkText(g.link), null),
        classCell(g.vbios, value(cp.vbios)),
        el("td", { text: g.model || "–" })
      );
      markFindings(row, of((f) => f.gpu === g.gpu));
      rows.push(row);
    }
    for (const r of hw.rdma) {
      const row = el(
        "tr",
        { "data-hw-device": r.device },
        el("td", { text: r.device }),
        el("td", { class: "mono", text: r.pci || "–" }),
        el("td", { text: r.place.numa_node ?? "–" }),
        el("td", { class: "mono", text: r.place.switch || "–" }),
        el("td", { class: "mono", text: r.place.root_port || "–" }),
        classCell(linkText(r.link), null),
        classCell(r.fw_ver, value(cp.fw_ver)),
        el("td", { text: r.hca_type || "–" })
      );
      markFindings(row, of((f) => f.device === r.device && (f.gpu === null || f.gpu === undefined)));
      rows.push(row);
    }
    const table = el("table", { class: "list", "data-hardware": "devices" }, el("tr", {}, head.map((h) => el("th", { text: h }))), rows);
    const d = hw.distances;
    const matrix = el(
      "table",
      { class: "list matrix", "data-hardware": "distances" },
      el("tr", {}, el("th", { text: "GPU \\ NIC" }), d.nics.map((n) => el("th", { class: "mono", text: n }))),
      d.gpus.map((g, i) =>
        el(
          "tr",
          {},
          el("th", { text: `GPU ${g}` }),
          d.node[i].map((dist, j) => {
            const cell = classCell(dist, d.class ? d.class[i][j] : null);
            cell.setAttribute("data-gpu", g);
            cell.setAttribute("data-nic", d.nics[j]);
            return cell;
          })
        )
      )
    );
    const caption = el("h3", { text: "GPU–NIC distance (PIX: one PCIe switch, PXB: one root port, NODE: through the CPU, SYS: across sockets); cells unlike the class show the class's in their title" });
    markFindings(caption, of((f) => f.rule === "topology_drift"));
    return el("div", {}, summary, table, caption, matrix);
  }

  const nodeView = {
    range: "-15m",
    mount(root, route) {
      const buttons = RANGES.map((r) =>
        el("button", {
          "data-range": r,
          class: r === this.range ? "on" : "",
          text: `last ${r.slice(1)}`,
          onclick: () => {
            this.range = r;
            for (const b of root.querySelectorAll("button[data-range]")) b.classList.toggle("on", b.dataset.range === r);
            refresh();
          },
        })
      );
      root.append(
        el("h1", {}, "Node ", el("span", { class: "mono", text: route.arg })),
        el(
          "p",
          { class: "legend" },
          buttons,
          " Times in UTC. Drag across a chart to zoom, double-click to zoom out. Gauges show the min–max envelope of each sample as a light band around its mean; point at a line to see its values and bring it forward."
        ),
        el("div", { id: "node-findings" }),
        el("h2", { text: "Hardware path" }),
        el("div", { id: "node-hardware" }),
        el(
          "div",
          { class: "charts" },
          NODE_CHARTS.map((c) =>
            el(
              "section",
              { class: "chart-box" },
              el("h3", { text: c.title, "data-title-for": c.metric }),
              el("div", { class: "chart-legend", "data-legend-for": c.metric }),
              el("div", { class: "chart", "data-metric": c.metric })
            )
          )
        ),
        el("h2", { text: "Events" }),
        el("div", { id: "node-events" })
      );
    },
    async update(route) {
      const node = route.arg;
      const match = `node=${JSON.stringify(node)}`;
      const [answers, events, findings, hardware] = await Promise.all([
        Promise.all(NODE_CHARTS.map((c) => chartAnswer(c, match, this.range))),
        api(`/api/v1/events?${q({ node, start: this.range })}`),
        optionalApi(`/api/v1/findings?${q({ node, start: this.range })}`),
        optionalApi(`/api/v1/nodes/${encodeURIComponent(node)}/hardware`),
      ]);
      NODE_CHARTS.forEach((c, i) => {
        const box = document.querySelector(`.chart[data-metric="${c.metric}"]`);
        const legend = document.querySelector(`.chart-legend[data-legend-for="${c.metric}"]`);
        const { answer, shown } = answers[i];
        const title = document.querySelector(`h3[data-title-for="${c.metric}"]`);
        title.textContent = shown.title;
        box.dataset.shows = shown.metric;
        chart(box, `node:${c.metric}`, chartRows(answer, c.label, shown.scale), {
          // Always shown, above the chart: which colour is which GPU or port, without pointing.
          legend: "always",
          labelsDiv: legend,
          // 8 bands on one chart: light enough that the lines inside stay readable.
          fillAlpha: 0.07,
          strokeWidth: 1.5,
          highlightSeriesOpts: { strokeWidth: 3 },
          highlightSeriesBackgroundAlpha: 0.6,
        });
      });
      document.getElementById("node-findings").replaceChildren(findings ? findingsTable(findings) : "");
      document.getElementById("node-hardware").replaceChildren(hardwareSection(node, hardware, findings));
      document.getElementById("node-events").replaceChildren(eventsTable(events.events, 200));
    },
  };

  // ------------------------------------------------------------------------------------
  // Events

  const LANES = [
    { name: "port transitions", test: (e) => e.kind === EVENT.PORT_TRANSITION },
    { name: "IB port events", test: (e) => e.kind === EVENT.IB_PORT },
    { name: "XID", test: (e) => e.kind === EVENT.XID || e.kind === EVENT.GPU_LOST },
    { name: "QP errors", test: (e) => /qp|cq|async/.test(e.kind) },
    { name: "findings", test: (e) => e.kind === FINDING },
    { name: "other", test: () => true },
  ];

  function whereOf(labels) {
    if (labels.gpu !== undefined) return `GPU ${labels.gpu}`;
    if (labels.device !== undefined) return labels.port !== undefined ? `${labels.device}/${labels.port}` : labels.device;
    return "";
  }

  function eventsTable(events, limit) {
    const list = events.slice(-limit).reverse();
    if (!list.length) return el("p", { class: "quiet", "data-events": 0, text: "No event in this range." });
    return el(
      "table",
      { class: "list", "data-events": list.length },
      el("tr", {}, ["time", "node", "kind", "where", "code", "text"].map((h) => el("th", { text: h }))),
      list.map((e) =>
        el(
          "tr",
          {
            class: `sev-${eventSeverity(e)} kind-${e.kind}`,
            "data-event-kind": e.kind,
            "data-severity": eventSeverity(e),
            "data-node": e.node,
            "data-device": e.labels.device,
            "data-port": e.labels.port,
            "data-gpu": e.labels.gpu,
            "data-finding-rule": e.rule,
            title: JSON.stringify(e.labels),
          },
          el("td", { text: timeText(e.t) }),
          el("td", {}, el("a", { href: `#/node/${encodeURIComponent(e.node)}`, text: e.node })),
          el("td", { text: e.kind === FINDING ? `finding ${e.rule}` : e.kind }),
          el("td", { text: whereOf(e.labels) }),
          el("td", { text: e.code ?? "" }),
          el("td", { text: e.text })
        )
      )
    );
  }

  // How bad an event is, for its dot's colour: a finding's own severity; a lost GPU or an
  // XID critical; a port going down, a port error, a QP or CQ error a warning; the rest
  // (a port coming back up, ...) information.
  function eventSeverity(e) {
    if (e.kind === FINDING) return SEVERITY_ORDER[e.severity] ? e.severity : "info";
    if (e.kind === EVENT.GPU_LOST || e.kind === EVENT.XID) return "critical";
    if (e.kind === EVENT.PORT_TRANSITION) return e.text === "DOWN" ? "warning" : "info";
    if (e.kind === EVENT.IB_PORT) return /ERR|DOWN|FAIL/i.test(e.text || "") ? "warning" : "info";
    if (/qp|cq|async|err/i.test(e.kind)) return "warning";
    return "info";
  }
  const SEVERITY_COLOUR = { critical: "#d7263d", warning: "#f29e02", info: "#8a94a6" };
  const EVENTS_RANGE_S = 3600;

  const eventsView = {
    // The operator's zoom ([from, to] ms), kept across updates; null: the whole last hour.
    zoom: null,
    mount(root) {
      this.zoom = null;
      root.append(
        el("h1", { text: "Events" }),
        el(
          "p",
          { class: "legend" },
          "The last hour (UTC): one lane per kind, one dot per event or finding, coloured by severity: ",
          ["critical", "warning", "info"].flatMap((sev) => [
            el("span", { class: "swatch dot", "data-severity": sev, style: `background:${SEVERITY_COLOUR[sev]}` }),
            ` ${sev} `,
          ]),
          "(point at one to see what it was, under the chart). Drag to zoom, double-click for the whole hour."
        ),
        el(
          "section",
          { class: "chart-box wide" },
          el("div", { class: "chart", id: "timeline", "data-metric": "events" }),
          el("div", { id: "timeline-hover", class: "quiet mono" }, "\u00a0")
        ),
        el("div", { id: "events-list" })
      );
    },
    async update() {
      const [events, findings] = await Promise.all([api(`/api/v1/events?${q({ start: "-1h" })}`), optionalApi(`/api/v1/findings?${q({ start: "-1h" })}`)]);
      const now = Date.now();
      const hour = [now - EVENTS_RANGE_S * 1000, now];
      const all = events.events.slice();
      for (const f of (findings && findings.findings) || []) {
        const labels = {};
        if (f.gpu !== null && f.gpu !== undefined) labels.gpu = String(f.gpu);
        if (f.device) labels.device = f.device;
        if (f.port !== null && f.port !== undefined) labels.port = String(f.port);
        all.push({ t: f.start, node: f.node, kind: FINDING, labels, code: null, text: f.summary, rule: f.rule, severity: f.severity });
      }
      all.sort((a, b) => a.t - b.t);
      // One column per lane: a dot at the lane's height where an event of that lane is.
      const lanes = LANES.map(() => []);
      // What happened at each time, for the line under the chart as the pointer moves.
      // A finding that began before the hour (still active) is drawn at the hour's start.
      const at = (e) => Math.max(nsToMs(e.t), hour[0]);
      const said = new Map();
      for (const e of all) {
        lanes[LANES.findIndex((l) => l.test(e))].push(e);
        const t = at(e);
        const what = `${e.node} ${e.kind === FINDING ? `finding ${e.rule}` : e.kind} ${whereOf(e.labels)} ${e.text}`;
        said.set(t, (said.get(t) || []).concat(what));
      }
      const hover = document.getElementById("timeline-hover");
      const byTime = new Map();
      // The worst severity of the events at each row and lane: the colour of that dot.
      const worst = new Map();
      lanes.forEach((list, i) => {
        for (const e of list) {
          const t = at(e);
          if (!byTime.has(t)) byTime.set(t, [new Date(t), ...LANES.map(() => null)]);
          byTime.get(t)[i + 1] = LANES.length - i;
          const key = `${t}|${LANES[i].name}`;
          const sev = eventSeverity(e);
          if ((SEVERITY_ORDER[sev] || 0) > (SEVERITY_ORDER[worst.get(key)] || 0)) worst.set(key, sev);
        }
      });
      const rows = [...byTime.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
      const laneName = (y) => (LANES[LANES.length - Math.round(y)] || { name: "" }).name;
      // Each dot drawn, with its severity and colour: for a test, or an operator's console.
      const dot = (highlight) => (g, seriesName, ctx, cx, cy, _colour, size, idx) => {
        const row = rows[idx];
        const sev = (row && worst.get(`${row[0].getTime()}|${seriesName}`)) || "info";
        const colour = SEVERITY_COLOUR[sev];
        if (!highlight) state.timelineDots.push({ lane: seriesName, severity: sev, colour, t: row ? row[0].getTime() : null });
        ctx.beginPath();
        ctx.fillStyle = colour;
        // Over an hour, dots seconds apart overlap: the worse ones are drawn larger, so a
        // port's going down (warning) is not hidden by its coming back up (information).
        const radius = size + (sev === "critical" ? 1 : sev === "warning" ? 0 : -1.5) + (highlight ? 2 : 0);
        ctx.arc(cx, cy, radius, 0, 2 * Math.PI);
        ctx.fill();
        if (sev === "critical") {
          ctx.strokeStyle = "#5c0a16";
          ctx.lineWidth = 1;
          ctx.stroke();
        }
      };
      const self = this;
      chart(
        document.getElementById("timeline"),
        "events",
        { rows, labels: ["time", ...LANES.map((l) => l.name)], bars: false },
        {
          drawPoints: true,
          strokeWidth: 0,
          pointSize: 4,
          highlightCircleSize: 5,
          drawPointCallback: dot(false),
          drawHighlightPointCallback: dot(true),
          // Every drawing starts the list of dots afresh.
          underlayCallback: () => {
            state.timelineDots = [];
          },
          valueRange: [0.5, LANES.length + 0.5],
          dateWindow: this.zoom || hour,
          legend: "never",
          zoomCallback: (from, to) => {
            self.zoom = [from, to];
          },
          interactionModel: {
            ...Dygraph.defaultInteractionModel,
            dblclick: (_event, g) => {
              self.zoom = null;
              g.updateOptions({ dateWindow: [Date.now() - EVENTS_RANGE_S * 1000, Date.now()] });
            },
          },
          highlightCallback: (_event, x) => {
            hover.textContent = `${timeText(x * 1e6)}: ${(said.get(x) || []).join("; ")}`;
          },
          unhighlightCallback: () => {
            hover.textContent = "\u00a0";
          },
          axes: { y: { axisLabelWidth: 120, ticker: () => LANES.map((l, i) => ({ v: LANES.length - i, label: l.name })), valueFormatter: laneName } },
          height: 200,
        }
      );
      // An update keeps the chart and gives it new rows: the hour slides with the clock
      // unless the operator zoomed in. The dots are drawn again with the new rows' colours.
      const g = state.charts.events;
      if (g) {
        g.updateOptions({ dateWindow: this.zoom || hour, drawPointCallback: dot(false), drawHighlightPointCallback: dot(true) });
      }
      const box = document.getElementById("timeline");
      box.setAttribute("data-events", all.length);
      box.title = `${all.length} events and findings`;
      document.getElementById("events-list").replaceChildren(eventsTable(all, 500));
    },
  };

  // ------------------------------------------------------------------------------------
  // Routing and the polling loop

  const VIEWS = { fleet: fleetView, jobs: jobsView, job: jobView, node: nodeView, events: eventsView };

  function parseRoute() {
    const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
    const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
    if (VIEWS[name] && ((name !== "job" && name !== "node") || arg)) return { name, arg, key: location.hash };
    return { name: "fleet", arg: null, key: "#/fleet" };
  }

  function mount() {
    for (const g of Object.values(state.charts)) g.destroy();
    state.charts = {};
    const route = parseRoute();
    const root = document.getElementById("view");
    root.replaceChildren();
    root.setAttribute("data-view", route.name);
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("on", a.dataset.nav === route.name || (route.name === "job" && a.dataset.nav === "jobs"));
    state.view = { route, impl: VIEWS[route.name] };
    state.view.impl.mount(root, route);
    refresh();
  }

  async function refresh() {
    if (state.busy) {
      state.again = true;
      return;
    }
    state.busy = true;
    const view = state.view;
    const began = performance.now();
    try {
      await view.impl.update(view.route);
      if (view === state.view) {
        state.updates += 1;
        // How long the last update took (asking and drawing), and when the first ended
        // (ms since the page began loading).
        state.updateMs = performance.now() - began;
        if (state.firstUpdateMs === undefined) state.firstUpdateMs = performance.now();
        const status = document.getElementById("status");
        status.setAttribute("data-updates", state.updates);
        status.textContent = `live · updated ${new Date().toISOString().slice(11, 19)}Z · every ${REFRESH_S} s`;
        setProblem(null);
      }
    } catch (e) {
      // An update of a view the operator already left wrote into elements that are gone.
      if (view !== state.view) return;
      setProblem(`Could not update: ${e.message}`);
      console.warn("railscope: update failed:", e);
    } finally {
      state.busy = false;
      if (state.again) {
        state.again = false;
        refresh();
      }
    }
  }

  window.addEventListener("hashchange", mount);
  mount();
  setInterval(refresh, REFRESH_S * 1000);
})();
