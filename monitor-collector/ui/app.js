// railscope's dashboard: four views over this collector's API, kept current by polling it.
//   #/fleet        nodes x GPUs and IB ports, coloured by utilisation, marked by findings
//   #/jobs, #/job/ID  a job's GPUs and ports side by side, its stragglers marked and ranked
//   #/node/NAME    a node's time series (dygraphs: drag to zoom, double-click to reset;
//                  gauges drawn as min/mean/max bands), its findings and events
//   #/events       the event timeline: port flaps, XIDs, QP errors, findings
// Elements a test or a script checks carry data-* attributes (data-node, data-gpu,
// data-device, data-port, data-finding-rule, data-straggler, a chart's data-points).
// `?refresh=S` sets the polling interval (default 5 s).
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const REFRESH_S = Math.max(0.5, Number(params.get("refresh")) || 5);

  const GPU_UTIL = "railscope_gpu_utilization_ratio";
  // SM activity (GPM, as DCGM's): how much of the GPU works, where NVML's utilization only
  // says a kernel ran during the period; shown where the GPU reports it.
  const GPU_SM = "railscope_gpu_sm_util_ratio";
  const PORT_TX = "railscope_ib_port_xmit_bytes_total";
  const PORT_RX = "railscope_ib_port_rcv_bytes_total";
  const PORT_RATE = "railscope_ib_port_rate_gbps";
  // The fleet and job views colour each cell by its series' latest sample in this window (the
  // agent flushes every 10 s; sweeps are 1 s apart unless adaptive sampling stretches them).
  // Its cost grows with the fleet: 2 x 8 port series per node at 60 points each, which
  // reaches the collector's default points limit (1 M) at about 1,000 nodes.
  const FLEET_WINDOW = "-1m";
  const SEVERITY_ORDER = { critical: 3, warning: 2, info: 1 };

  // What the page holds: exposed for tests and for a curious operator's console.
  const state = { updates: 0, view: null, charts: {}, busy: false };
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

  // The latest value of each series of an answer, keyed by `keyOf(labels)`; counters give
  // their latest rate, gauges the mean of their latest envelope.
  function latestBy(answer, keyOf) {
    const out = new Map();
    for (const s of (answer && answer.series) || []) {
      const p = last(s.points);
      if (!p) continue;
      const value = s.kind === "counter" ? p.rate : p.mean;
      out.set(keyOf(s.labels), { value, labels: s.labels, t: p.t });
    }
    return out;
  }

  const gpuKey = (l) => `${l.node}|${l.gpu}`;

  // Each GPU's latest activity: SM activity where reported, NVML's utilization otherwise.
  async function gpuActivity(match) {
    const [sm, util] = await Promise.all(
      [GPU_SM, GPU_UTIL].map((metric) => api(`/api/v1/series?${q({ metric, match, start: FLEET_WINDOW })}`))
    );
    const out = latestBy(util, gpuKey);
    for (const v of out.values()) v.metric = "utilization";
    for (const [k, v] of latestBy(sm, gpuKey)) out.set(k, { ...v, metric: "SM activity" });
    return out;
  }
  const portKey = (l) => `${l.node}|${l.device}|${l.port}`;

  // Per port: throughput (the larger of both directions) as a share of its line rate.
  function portLoads(tx, rx, rate) {
    const out = new Map();
    const txs = latestBy(tx, portKey);
    const rxs = latestBy(rx, portKey);
    const rates = latestBy(rate, portKey);
    for (const [k, t] of txs) {
      const r = rxs.get(k);
      const bps = Math.max(t.value || 0, (r && r.value) || 0);
      const gbps = rates.get(k);
      const capacity = gbps && gbps.value ? (gbps.value * 1e9) / 8 : null;
      out.set(k, {
        labels: t.labels,
        bytesPerSecond: t.value === null ? null : bps,
        load: capacity && t.value !== null ? bps / capacity : null,
      });
    }
    // A port without byte counters (soft-RoCE has only packet counts) still gets its cell,
    // uncoloured, so its findings can be marked on it.
    for (const [k, g] of rates) {
      if (!out.has(k)) out.set(k, { labels: g.labels, bytesPerSecond: null, load: null });
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

  function gpuCell(node, gpu, activity, extra) {
    const util = activity ? activity.value : null;
    const cell = el("a", {
      class: "cell gpu",
      href: `#/node/${encodeURIComponent(node)}`,
      "data-node": node,
      "data-gpu": gpu,
      "data-util": util === null || util === undefined ? null : util.toFixed(3),
      title: `${node} GPU ${gpu}: ${activity ? activity.metric : "activity"} ${util === null || util === undefined ? "no data" : Math.round(util * 100) + "%"}`,
      text: gpu,
      ...(extra || {}),
    });
    cell.style.background = utilColour(util);
    if (util > 0.6) cell.classList.add("dark");
    return cell;
  }

  function portCell(node, device, port, load, extra) {
    const cell = el("a", {
      class: "cell port",
      href: `#/node/${encodeURIComponent(node)}`,
      "data-node": node,
      "data-device": device,
      "data-port": port,
      "data-load": load && load.load !== null ? load.load.toFixed(3) : null,
      title: `${node} ${device}/${port}: ${
        load && load.bytesPerSecond !== null ? fmt((load.bytesPerSecond * 8) / 1e9) + " Gb/s" : "no byte counters"
      }`,
      text: device.replace(/^.*?(\d+)$/, "$1"),
      ...(extra || {}),
    });
    cell.style.background = utilColour(load ? load.load : null);
    if (load && load.load > 0.6) cell.classList.add("dark");
    return cell;
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
          el("td", { text: f.gpu !== null && f.gpu !== undefined ? `GPU ${f.gpu}` : f.device ? `${f.device}/${f.port ?? "*"}` : "node" }),
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
      ...options,
    });
    g.railscopeBox = box;
    state.charts[id] = g;
  }

  // ------------------------------------------------------------------------------------
  // Fleet

  const fleetView = {
    mount(root) {
      root.append(
        el("h1", { text: "Fleet" }),
        el(
          "p",
          { class: "legend" },
          "GPU cells coloured by SM activity (NVML utilization where the GPU does not report it), IB port cells by traffic against line rate: ",
          el("span", { class: "swatch", style: `background:${utilColour(0)}` }),
          " idle … ",
          el("span", { class: "swatch", style: `background:${utilColour(1)}` }),
          " busy; outlined where a finding is active (red critical, orange warning). Click a cell for its node."
        ),
        el("div", { id: "fleet-grid" }),
        el("h2", { text: "Active findings" }),
        el("div", { id: "fleet-findings" })
      );
    },
    async update() {
      const [nodes, util, tx, rx, rate, findings] = await Promise.all([
        api("/api/v1/live/nodes"),
        gpuActivity(null),
        api(`/api/v1/series?${q({ metric: PORT_TX, start: FLEET_WINDOW })}`),
        api(`/api/v1/series?${q({ metric: PORT_RX, start: FLEET_WINDOW })}`),
        api(`/api/v1/series?${q({ metric: PORT_RATE, start: "-10m" })}`),
        optionalApi(`/api/v1/findings?${q({ active: "true" })}`),
      ]);
      const loads = portLoads(tx, rx, rate);
      const idx = findingsIndex(findings);
      const names = new Set(nodes.map((n) => n.node));
      for (const v of [...util.values(), ...loads.values()]) names.add(v.labels.node);
      for (const f of (findings && findings.findings) || []) names.add(f.node);

      const grid = el("div", { class: "grid", "data-nodes": names.size });
      for (const node of [...names].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }))) {
        const gpuIds = [...util.values()].filter((v) => v.labels.node === node).map((v) => v.labels.gpu);
        // A GPU with a finding but no series (fallen off the bus) still gets its cell.
        for (const key of idx.gpu.keys()) if (key.startsWith(node + "|")) gpuIds.push(key.slice(node.length + 1));
        const gpuCells = [...new Set(gpuIds)].sort(byNumber).map((gpu) => {
          const cell = gpuCell(node, gpu, util.get(`${node}|${gpu}`));
          markFindings(cell, idx.gpu.get(`${node}|${gpu}`));
          return cell;
        });
        const ports = [...loads.values()].filter((v) => v.labels.node === node);
        const portCells = ports
          .sort((a, b) => a.labels.device.localeCompare(b.labels.device, undefined, { numeric: true }) || byNumber(a.labels.port, b.labels.port))
          .map((p) => {
            const cell = portCell(node, p.labels.device, p.labels.port, p);
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
            el("span", { class: "cells ports", title: "IB ports" }, portCells.length ? portCells : el("span", { class: "quiet", text: "no IB ports" }))
          )
        );
      }
      if (!names.size) grid.append(el("p", { class: "quiet", text: "No node has sent anything yet." }));
      document.getElementById("fleet-grid").replaceChildren(grid);
      document
        .getElementById("fleet-findings")
        .replaceChildren(findings ? findingsTable(findings) : el("p", { class: "quiet", text: "This collector serves no findings." }));
    },
  };

  // ------------------------------------------------------------------------------------
  // Jobs

  const jobsView = {
    mount(root) {
      root.append(el("h1", { text: "Jobs" }), el("p", { class: "quiet", text: "Jobs seen over the straggler window (the last 5 minutes), with their stragglers." }), el("div", { id: "jobs-list" }));
    },
    async update() {
      const answer = await optionalApi("/api/v1/stragglers");
      const box = document.getElementById("jobs-list");
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
          { class: "legend" },
          "Its GPUs and its nodes' IB ports side by side, coloured by utilisation; stragglers (far from the job’s median over the last 5 minutes) outlined in magenta and ranked below."
        ),
        el("div", { id: "job-grid" }),
        el("h2", { text: "Stragglers" }),
        el("div", { id: "job-stragglers" })
      );
    },
    async update(route) {
      const job = route.arg;
      const [answer, util, findings] = await Promise.all([
        optionalApi(`/api/v1/stragglers?${q({ job_id: job })}`),
        gpuActivity(`job_id=${JSON.stringify(job)}`),
        optionalApi(`/api/v1/findings?${q({ start: "-10m" })}`),
      ]);
      const entry = answer && (answer.jobs || []).find((j) => j.job_id === job);
      const stragglers = (entry && entry.stragglers) || [];
      const nodes = new Set([...util.values()].map((v) => v.labels.node));
      for (const s of stragglers) nodes.add(s.node);
      let loads = new Map();
      if (nodes.size) {
        const match = `node=~${[...nodes].map(regexEscape).join("|")}`;
        const [tx, rx, rate] = await Promise.all([
          api(`/api/v1/series?${q({ metric: PORT_TX, match, start: FLEET_WINDOW })}`),
          api(`/api/v1/series?${q({ metric: PORT_RX, match, start: FLEET_WINDOW })}`),
          api(`/api/v1/series?${q({ metric: PORT_RATE, match, start: "-10m" })}`),
        ]);
        loads = portLoads(tx, rx, rate);
      }
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
      const grid = el("div", { class: "grid", "data-nodes": nodes.size });
      for (const node of [...nodes].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }))) {
        const gpuIds = [...util.values()].filter((v) => v.labels.node === node).map((v) => v.labels.gpu);
        const gpuCells = [...new Set(gpuIds)].sort(byNumber).map((gpu) => {
          const cell = gpuCell(node, gpu, util.get(`${node}|${gpu}`));
          stragglers.forEach((s, i) => {
            if (s.node === node && String(s.gpu) === String(gpu)) mark(cell, s, i + 1);
          });
          return cell;
        });
        const portCells = [...loads.values()]
          .filter((v) => v.labels.node === node)
          .sort((a, b) => a.labels.device.localeCompare(b.labels.device, undefined, { numeric: true }))
          .map((p) => {
            const cell = portCell(node, p.labels.device, p.labels.port, p);
            stragglers.forEach((s, i) => {
              if (s.node === node && s.device === p.labels.device && (s.port === null || String(s.port) === String(p.labels.port))) mark(cell, s, i + 1);
            });
            return cell;
          });
        const name = el("a", { class: "node-name", href: `#/node/${encodeURIComponent(node)}`, "data-node": node, text: node });
        stragglers.forEach((s, i) => {
          if (s.node === node && (s.gpu === null || s.gpu === undefined) && !s.device) mark(name, s, i + 1);
        });
        grid.append(el("div", { class: "row", "data-node": node }, name, el("span", { class: "cells gpus" }, gpuCells), el("span", { class: "cells ports" }, portCells)));
      }
      if (!nodes.size) grid.append(el("p", { class: "quiet", text: "No series carries this job in the last minute." }));
      document.getElementById("job-grid").replaceChildren(grid);

      const list = document.getElementById("job-stragglers");
      if (!answer) return list.replaceChildren(el("p", { class: "quiet", text: "This collector serves no straggler analysis." }));
      if (!stragglers.length) return list.replaceChildren(el("p", { class: "quiet", "data-stragglers": 0, text: "No straggler." }));
      list.replaceChildren(
        el(
          "table",
          { class: "list", "data-stragglers": stragglers.length },
          el("tr", {}, ["#", "node", "where", "metric", "value", "job median", "score", "likely cause"].map((h) => el("th", { text: h }))),
          stragglers.map((s, i) => {
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
    { metric: "railscope_gpu_power_watts", title: "GPU power (W)", scale: 1, label: (l) => `GPU ${l.gpu}` },
    { metric: "railscope_gpu_temperature_celsius", title: "GPU temperature (°C)", scale: 1, label: (l) => `GPU ${l.gpu}` },
    { metric: PORT_TX, title: "IB transmit (Gb/s)", scale: 8 / 1e9, label: (l) => `${l.device}/${l.port}` },
    { metric: PORT_RX, title: "IB receive (Gb/s)", scale: 8 / 1e9, label: (l) => `${l.device}/${l.port}` },
  ];
  const RANGES = ["-15m", "-1h", "-6h"];

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
        el("p", { class: "legend" }, buttons, " Drag across a chart to zoom, double-click to zoom out. Gauges show the min–max envelope of each sample as a band around its mean."),
        el("div", { id: "node-findings" }),
        el(
          "div",
          { class: "charts" },
          NODE_CHARTS.map((c) => el("section", { class: "chart-box" }, el("h3", { text: c.title }), el("div", { class: "chart", "data-metric": c.metric })))
        ),
        el("h2", { text: "Events" }),
        el("div", { id: "node-events" })
      );
    },
    async update(route) {
      const node = route.arg;
      const match = `node=${JSON.stringify(node)}`;
      const [answers, events, findings] = await Promise.all([
        Promise.all(NODE_CHARTS.map((c) => api(`/api/v1/series?${q({ metric: c.metric, match, start: this.range })}`))),
        api(`/api/v1/events?${q({ node, start: this.range })}`),
        optionalApi(`/api/v1/findings?${q({ node, start: this.range })}`),
      ]);
      NODE_CHARTS.forEach((c, i) => {
        const box = document.querySelector(`.chart[data-metric="${c.metric}"]`);
        chart(box, `node:${c.metric}`, chartRows(answers[i], c.label, c.scale), {});
      });
      document.getElementById("node-findings").replaceChildren(findings ? findingsTable(findings) : "");
      document.getElementById("node-events").replaceChildren(eventsTable(events.events, 200));
    },
  };

  // ------------------------------------------------------------------------------------
  // Events

  const LANES = [
    { name: "port transitions", test: (e) => e.kind === "port_transition" },
    { name: "IB port events", test: (e) => e.kind === "ib_port" },
    { name: "XID", test: (e) => e.kind === "xid" || e.kind === "gpu_lost" },
    { name: "QP errors", test: (e) => e.kind === "qp_error" || /qp|cq|async/.test(e.kind) },
    { name: "findings", test: (e) => e.kind === "finding" },
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
            class: e.kind === "finding" ? `sev-${e.severity}` : `kind-${e.kind}`,
            "data-event-kind": e.kind,
            "data-node": e.node,
            "data-device": e.labels.device,
            "data-port": e.labels.port,
            "data-gpu": e.labels.gpu,
            "data-finding-rule": e.rule,
            title: JSON.stringify(e.labels),
          },
          el("td", { text: timeText(e.t) }),
          el("td", {}, el("a", { href: `#/node/${encodeURIComponent(e.node)}`, text: e.node })),
          el("td", { text: e.kind === "finding" ? `finding ${e.rule}` : e.kind }),
          el("td", { text: whereOf(e.labels) }),
          el("td", { text: e.code ?? "" }),
          el("td", { text: e.text })
        )
      )
    );
  }

  const eventsView = {
    mount(root) {
      root.append(
        el("h1", { text: "Events" }),
        el("p", { class: "legend", text: "The last hour: one lane per kind, one dot per event or finding (point at one to see what it was, under the chart). Drag to zoom." }),
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
      const all = events.events.slice();
      for (const f of (findings && findings.findings) || []) {
        const labels = {};
        if (f.gpu !== null && f.gpu !== undefined) labels.gpu = String(f.gpu);
        if (f.device) labels.device = f.device;
        if (f.port !== null && f.port !== undefined) labels.port = String(f.port);
        all.push({ t: f.start, node: f.node, kind: "finding", labels, code: null, text: f.summary, rule: f.rule, severity: f.severity });
      }
      all.sort((a, b) => a.t - b.t);
      // One column per lane: a dot at the lane's height where an event of that lane is.
      const lanes = LANES.map(() => []);
      // What happened at each time, for the line under the chart as the pointer moves.
      const said = new Map();
      for (const e of all) {
        lanes[LANES.findIndex((l) => l.test(e))].push(e);
        const t = nsToMs(e.t);
        const what = `${e.node} ${e.kind === "finding" ? `finding ${e.rule}` : e.kind} ${whereOf(e.labels)} ${e.text}`;
        said.set(t, (said.get(t) || []).concat(what));
      }
      const hover = document.getElementById("timeline-hover");
      const byTime = new Map();
      lanes.forEach((list, i) => {
        for (const e of list) {
          const t = nsToMs(e.t);
          if (!byTime.has(t)) byTime.set(t, [new Date(t), ...LANES.map(() => null)]);
          byTime.get(t)[i + 1] = LANES.length - i;
        }
      });
      const rows = [...byTime.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
      const laneName = (y) => (LANES[LANES.length - Math.round(y)] || { name: "" }).name;
      chart(
        document.getElementById("timeline"),
        "events",
        { rows, labels: ["time", ...LANES.map((l) => l.name)], bars: false },
        {
          drawPoints: true,
          strokeWidth: 0,
          pointSize: 4,
          highlightCircleSize: 6,
          valueRange: [0.5, LANES.length + 0.5],
          legend: "never",
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
    try {
      await view.impl.update(view.route);
      if (view === state.view) {
        state.updates += 1;
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
