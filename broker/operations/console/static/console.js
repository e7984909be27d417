/* broker console: the managing pages' forms and the charts, on the management API (/api/).
   A form with data-api="<path with {field}>" and data-method is sent as JSON with the session's
   CSRF token (meta csrf-token) in X-CSRF-Token; its <output> shows the answer. No inline scripts
   (the Content-Security-Policy allows scripts from 'self' only); text is set with textContent. */
(function () {
  "use strict";
  const csrf = () => (document.querySelector("meta[name=csrf-token]") || {}).content || "";

  async function call(method, path, body) {
    const headers = { Accept: "application/json", "X-CSRF-Token": csrf() };
    const init = { method: method, headers: headers, credentials: "same-origin" };
    if (body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
    const answer = await fetch(path, init);
    const text = await answer.text();
    let data = text;
    try { data = text ? JSON.parse(text) : null; } catch (e) { /* not JSON: shown as text */ }
    return { ok: answer.ok, status: answer.status, data: data };
  }

  function fields(form) {
    const body = {};
    for (const el of form.elements) {
      if (!el.name || el.type === "submit" || el.type === "file") continue;
      if (el.type === "checkbox") { body[el.name] = el.checked; continue; }
      if (el.value === "" && !el.required) continue;
      if (el.dataset.json !== undefined) body[el.name] = JSON.parse(el.value);
      else if (el.dataset.list !== undefined) body[el.name] = el.value.split(",").map(function (v) { return v.trim(); }).filter(Boolean);
      else if (el.type === "number") body[el.name] = Number(el.value);
      else body[el.name] = el.value;
    }
    return body;
  }

  function cell(row, text, cls) {
    const td = row.insertCell();
    if (cls) td.className = cls;
    const pre = document.createElement("pre");
    pre.textContent = text === null || text === undefined ? "" : String(text);
    td.appendChild(pre);
  }

  function showMessages(target, messages) {
    target.textContent = "";
    if (!messages.length) { target.textContent = "No message waiting."; return; }
    const table = document.createElement("table");
    table.className = "grid messages";
    const head = table.createTHead().insertRow();
    for (const name of ["#", "Message id", "Topic", "Priority", "Properties", "Body"]) {
      const th = document.createElement("th"); th.textContent = name; head.appendChild(th);
    }
    const tbody = table.createTBody();
    messages.forEach(function (m, i) {
      const row = tbody.insertRow();
      row.dataset.msgid = m.msgid;
      cell(row, i + 1, "num");
      cell(row, m.msgid, "wrap-any");
      cell(row, m.topic, "wrap-any");
      cell(row, m.priority, "num");
      cell(row, JSON.stringify(m.properties || {}), "wrap-any");
      cell(row, m.body_encoding === "utf-8" ? m.body : "(base64) " + m.body, "wrap-any message-body");
    });
    target.appendChild(table);
  }

  async function submit(event) {
    const form = event.target;
    if (!form.dataset.api) return;
    event.preventDefault();
    const out = form.querySelector("output") || document.createElement("output");
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    let body;
    try { body = form.dataset.body ? JSON.parse(form.elements[form.dataset.body].value) : fields(form); }
    catch (e) { out.className = "failed"; out.textContent = "Not JSON: " + e.message; return; }
    const path = form.dataset.api.replace(/\{(\w+)\}/g, function (_, name) {
      const value = form.dataset.body ? form.elements[name].value : body[name];
      if (!form.dataset.body) delete body[name];
      return encodeURIComponent(value === undefined ? "" : value);
    });
    let query = "";  // data-query: checkboxes sent as ?name=true
    for (const name of (form.dataset.query || "").split(" ").filter(Boolean)) {
      if (form.elements[name].checked) query += (query ? "&" : "?") + name + "=true";
    }
    const method = (form.dataset.method || "POST").toUpperCase();
    out.className = ""; out.textContent = "…";
    const answer = await call(method, path + query, method === "GET" || method === "DELETE" ? undefined : body);
    out.className = answer.ok ? "ok" : "failed";
    if (!answer.ok) {
      out.textContent = answer.status + ": " + ((answer.data && answer.data.error) || answer.data);
      return;
    }
    if (form.dataset.render === "messages") {
      out.textContent = answer.data.length + " message(s), left in the queue";
      showMessages(document.getElementById(form.dataset.target), answer.data);
      return;
    }
    out.textContent = answer.status + ": " + (answer.data === null ? "done" : JSON.stringify(answer.data));
    if (answer.data && answer.data.notes && answer.data.notes.length) return;  // read them before leaving
    const then = form.dataset.then;
    if (then === "reload") window.location.reload();
    else if (then) window.location.assign(then);
  }

  document.addEventListener("submit", submit);

  document.addEventListener("change", function (event) {  // a definitions file read into its textarea
    const input = event.target;
    if (input.type !== "file" || !input.dataset.into || !input.files.length) return;
    input.files[0].text().then(function (text) { document.getElementById(input.dataset.into).value = text; });
  });

  // --- charts (uPlot, vendored in /static) ---
  const CHARTS = [
    ["published_per_s", "Publications/s", "#2456c7"],
    ["handled_per_s", "Publications handled/s", "#1e7b3a"],
    ["depth", "Depth (messages waiting)", "#8a5cc7"],
    ["dead_letters", "Dead letters", "#b3261e"],
  ];
  const plots = {};

  async function drawCharts(box) {
    const answer = await call("GET", "/api/samples");
    if (!answer.ok) { box.dataset.problem = String(answer.status); return; }
    const s = answer.data;
    box.dataset.samples = String(s.t.length);
    const note = document.getElementById("charts-note");
    if (note) note.textContent = s.problem ? "Sampling failed: " + s.problem
      : s.t.length + " sample(s), one every " + s.interval_s + " s, the last hour (kept by this console process).";
    for (const [name, label, colour] of CHARTS) {
      const data = [s.t, s[name]];
      if (plots[name]) { plots[name].setData(data); continue; }
      const holder = box.querySelector("[data-chart=" + name + "]");
      if (!holder || typeof uPlot === "undefined") continue;
      const width = Math.max(240, holder.clientWidth - 8);
      plots[name] = new uPlot({
        width: width, height: 150, legend: { show: false },
        scales: { x: { time: true, range: function () { const end = Date.now() / 1000; return [end - 3600, end]; } } },
        series: [{}, { label: label, stroke: colour, width: 1.5, spanGaps: false }],
        axes: [{}, { size: 50 }],
      }, data, holder);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    const box = document.getElementById("charts");
    if (!box) return;
    drawCharts(box);
    window.setInterval(function () { drawCharts(box); }, 10000);
  });
})();
