// The headrace dashboard: lays out the view model from dashboard/events (server-sent
// events) or, failing that, dashboard/view.json (polled). Every decision about what is
// healthy is made on the server (headrace.dashboard.views); this file only draws.
// Text is set with textContent, never parsed as HTML.
"use strict";
(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2f5fd0", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285", "#5c940d"];
  const W = 360, H = 130, LEFT = 34, RIGHT = 6, TOP = 8, BOTTOM = 18;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c));
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }
  const dash = (v) => (v === null || v === undefined ? "—" : String(v));
  const num = (v) => el("td", { class: "num" }, dash(v));
  const ids = (list) => (list && list.length ? list.join(", ") : "—");
  function ago(ms) {
    if (ms === null || ms === undefined) return "never";
    return ms < 1000 ? "just now" : (ms / 1000).toFixed(1) + " s ago";
  }
  function fill(tbody, rows) { tbody.replaceChildren(...rows); }

  function renderSummary(view) {
    const s = view.summary;
    const card = (label, value, level) =>
      el("div", { class: "card " + (level || "") }, el("div", { class: "value" }, String(value)),
        el("div", { class: "label" }, label));
    document.getElementById("summary").replaceChildren(
      card("brokers up", s.brokersUp + " / " + s.brokers, s.brokersDown ? "bad" : ""),
      card("topics", s.topics),
      card("partitions", s.partitions),
      card("offline partitions", s.offline, s.offline ? "bad" : ""),
      card("under-replicated", s.underReplicated, s.underReplicated ? "warn" : ""),
      card("topology generation", view.cluster.generation));
    const pill = document.getElementById("health-pill");
    pill.textContent = s.healthy ? "healthy" : s.problems + (s.problems === 1 ? " problem" : " problems");
    pill.className = "pill " + (s.healthy ? "healthy" : "unhealthy");
    document.getElementById("cluster-id").textContent = view.cluster.id;
  }

  function renderProblems(view) {
    const list = document.getElementById("problems");
    if (!view.problems.length) {
      list.replaceChildren(el("li", { class: "none" }, "No problems."));
      return;
    }
    list.replaceChildren(...view.problems.map((line) => el("li", {}, line)));
  }

  function renderBrokers(view) {
    fill(document.querySelector("#brokers tbody"), view.brokers.map((b) =>
      el("tr", { "data-broker": b.id, class: b.health === "down" ? "down" : "" },
        num(b.id), el("td", {}, b.address),
        el("td", { class: "health " + b.health }, b.health),
        el("td", {}, ago(b.lastHeartbeatAgoMs)), num(b.leaderOf), num(b.replicaOf),
        num(b.generation), num(b.connections))));
  }

  function renderPartitions(view) {
    fill(document.querySelector("#partitions tbody"), view.partitions.map((p) => {
      const cls = p.offline ? "offline" : p.underReplicated ? "under-replicated" : "";
      let state = p.state + (p.sealed ? " (sealed)" : "");
      if (p.underReplicated) state += " · under-replicated";
      const offset = (v) => el("td", { class: "num" + (p.offsetsStale ? " stale" : "") }, dash(v));
      return el("tr", { "data-partition": p.topic + "/" + p.partition, class: cls,
                        title: p.offsetsStale ? "offsets last reported by a broker that is not live" : null },
        el("td", {}, p.topic), num(p.partition),
        el("td", {}, p.leader === null ? (p.candidate === null ? "none" : "electing " + p.candidate) : String(p.leader)),
        el("td", {}, ids(p.replicas)), el("td", {}, ids(p.lrs)), num(p.epoch),
        offset(p.highWatermark), offset(p.logStartOffset),
        offset(p.storedThrough === null ? null : p.storedThrough < 0 ? "nothing yet" : p.storedThrough),
        el("td", { class: "state" }, state));
    }));
  }

  function renderCohorts(view) {
    const box = document.getElementById("cohorts");
    if (!view.cohorts.length) {
      box.replaceChildren(el("p", { class: "muted" }, "No cohorts yet."));
      return;
    }
    box.replaceChildren(...view.cohorts.map((c) => el("div", { class: "cohort", "data-cohort": c.topic + " " + c.cohort },
      el("h3", {}, c.cohort + " on " + c.topic + " — lag " + dash(c.lag) + " · members: " +
        (c.members.length ? c.members.join(", ") : "none connected")),
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "partition"), el("th", {}, "member"),
          el("th", {}, "cursor"), el("th", {}, "HW"), el("th", {}, "lag"))),
        el("tbody", {}, ...c.partitions.map((p) => el("tr", {},
          num(p.partition), el("td", {}, dash(p.member)), num(p.cursor), num(p.highWatermark),
          num(p.lag))))))));
  }

  function renderTransitions(view) {
    const t = view.transitions;
    const parts = [];
    const unloadTable = (unloads) => el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "unload"), el("th", {}, "topic / partition"),
        el("th", {}, "phase"), el("th", {}, "from → to"), el("th", {}, "sealed offset"),
        el("th", {}, "verified"), el("th", {}, "recovery"), el("th", {}, "message"))),
      el("tbody", {}, ...unloads.flatMap((u) => [
        el("tr", { "data-unload": u.name }, el("td", {}, u.name + (u.deleting ? " (deleting)" : "")),
          el("td", {}, u.topic), el("td", {}, u.phase), el("td"), el("td"), el("td"), el("td"),
          el("td", {}, u.message)),
        ...u.moves.map((m) => el("tr", {}, el("td"), el("td", {}, "partition " + m.partition),
          el("td", {}, dash(m.phase)), el("td", {}, dash(m.from) + " → " + dash(m.to)),
          num(m.sealedOffset), el("td", {}, dash(m.verification)), el("td", {}, dash(m.recovery)),
          el("td", {}, m.message)))])));
    parts.push(el("h3", {}, "Unloads"));
    parts.push(t.unloads.length ? unloadTable(t.unloads) : el("p", { class: "muted" }, "No unload in flight."));
    parts.push(el("h3", {}, "Repartitions"));
    parts.push(t.repartitions.length
      ? el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "topic"), el("th", {}, "request"),
          el("th", {}, "phase"), el("th", {}, "partitions"), el("th", {}, "version"),
          el("th", {}, "adoption generation"), el("th", {}, "cutover offsets"),
          el("th", {}, "cohorts released"))),
        el("tbody", {}, ...t.repartitions.map((r) => el("tr", { "data-repartition": r.topic },
          el("td", {}, r.topic), el("td", {}, dash(r.request)), el("td", {}, r.phase),
          el("td", {}, r.fromPartitions + " → " + r.toPartitions),
          el("td", {}, r.fromVersion + " → " + r.toVersion), num(r.adoptionGeneration),
          el("td", {}, r.cutoverOffsetsKnown + "/" + r.fromPartitions),
          el("td", {}, Object.entries(r.cohortsReleased).map(([c, n]) => c + " " + n).join(", ")
            || "-")))))
      : el("p", { class: "muted" }, "No repartition in flight."));
    if (t.finishedRepartitions && t.finishedRepartitions.length) {
      parts.push(el("h3", {}, "Finished repartitions"));
      parts.push(el("ul", {}, ...t.finishedRepartitions.map((r) => el("li", {},
        r.name + " (" + r.topic + " → " + r.partitions + "): " + r.phase
        + (r.finalizedBy ? " by " + r.finalizedBy : "") + (r.message ? " — " + r.message : "")))));
    }
    if (t.finishedUnloads.length) {
      parts.push(el("h3", {}, "Finished unloads"));
      parts.push(unloadTable(t.finishedUnloads));
    }
    document.getElementById("transitions").replaceChildren(...parts);
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }
  function short(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e3) return (v / 1e3).toFixed(v >= 1e4 ? 0 : 1) + "k";
    return String(Math.round(v * 10) / 10);
  }

  function renderChart(name, chart, windowMs) {
    const box = document.getElementById("chart-" + name);
    const legend = document.getElementById("legend-" + name);
    const series = (chart && chart.series) || [];
    let max = 0, points = 0, nonzero = 0;
    for (const s of series) for (const [, v] of s.points) { max = Math.max(max, v); points++; if (v > 0) nonzero++; }
    const top = niceMax(max);
    const x = (age) => LEFT + (W - LEFT - RIGHT) * (1 - Math.min(age, windowMs) / windowMs);
    const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / top);
    const nodes = [
      svg("line", { class: "axis", x1: LEFT, y1: y(0), x2: W - RIGHT, y2: y(0) }),
      svg("line", { class: "axis", x1: LEFT, y1: y(top), x2: W - RIGHT, y2: y(top) }),
      svg("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: y(0) }),
    ];
    const label = (text, attrs) => { const t = svg("text", attrs); t.textContent = text; return t; };
    nodes.push(label(short(top), { x: LEFT - 4, y: y(top) + 4, "text-anchor": "end" }));
    nodes.push(label("0", { x: LEFT - 4, y: y(0) + 4, "text-anchor": "end" }));
    nodes.push(label("-" + Math.round(windowMs / 60000) + " min", { x: LEFT, y: H - 4 }));
    nodes.push(label("now", { x: W - RIGHT, y: H - 4, "text-anchor": "end" }));
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const coords = s.points.map(([age, v]) => x(age).toFixed(1) + "," + y(v).toFixed(1));
      if (coords.length === 1) coords.push(coords[0]);
      nodes.push(svg("polyline", { points: coords.join(" "), stroke: color, "data-series": s.name }));
    });
    if (!series.length) nodes.push(label("no data yet", { x: W / 2, y: H / 2, "text-anchor": "middle" }));
    box.replaceChildren(...nodes);
    box.dataset.points = String(points);
    box.dataset.nonzero = String(nonzero);
    box.dataset.max = String(max);
    legend.replaceChildren(...series.map((s, i) => {
      const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
      return el("span", {}, el("i", { style: "background:" + COLORS[i % COLORS.length] }),
        s.name + " " + short(last));
    }));
  }

  let lastView = 0;
  function render(view) {
    lastView = Date.now();
    renderSummary(view);
    renderProblems(view);
    renderBrokers(view);
    renderPartitions(view);
    renderCohorts(view);
    renderTransitions(view);
    const charts = view.charts || {};
    for (const name of ["produce", "consume", "lag"]) renderChart(name, charts[name], charts.windowMs || 300000);
    document.getElementById("footer").textContent = "generation " + view.cluster.generation +
      " · controller step " + view.cluster.steps + " · adoption floor " + dash(view.cluster.adoptionFloor) +
      " · updated " + new Date(view.cluster.nowMs).toLocaleTimeString();
    document.body.dataset.steps = String(view.cluster.steps);
  }

  function status(text, cls) {
    const c = document.getElementById("connection");
    c.textContent = text;
    c.className = "connection " + cls;
  }

  function poll() {
    fetch("dashboard/view.json", { cache: "no-store" })
      .then((r) => r.json()).then((v) => { render(v); status("live (polling)", "live"); })
      .catch(() => status("controller unreachable", "lost"))
      .finally(() => setTimeout(poll, 2000));
  }

  function connect() {
    if (!window.EventSource) { poll(); return; }
    const source = new EventSource("dashboard/events");
    source.onmessage = (e) => { render(JSON.parse(e.data)); status("live", "live"); };
    // EventSource reconnects by itself; say so meanwhile.
    source.onerror = () => status("reconnecting…", "lost");
  }

  setInterval(() => {
    if (lastView && Date.now() - lastView > 5000) status("no update for " + Math.round((Date.now() - lastView) / 1000) + " s", "lost");
  }, 1000);
  connect();
})();
