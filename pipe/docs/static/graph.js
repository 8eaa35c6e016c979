// The lineage graph of pipe docs: draws window.PIPE_GRAPH (nodes already laid out by
// `pipe docs generate`) as SVG, with pan, zoom, search, and the upstream and downstream of the
// node under the pointer (or found by search) highlighted. No library; works from file://.
(function () {
  "use strict";
  var G = window.PIPE_GRAPH;
  var svg = document.getElementById("graph");
  var W = G.node[0], H = G.node[1];
  var nodes = G.nodes, edges = G.edges;  // node: [id, name, kind, category, x, y, table type, href]; edge: [from, to]
  function href(n) { return n[7] || "nodes/" + n[0] + ".html"; }
  var inEdges = nodes.map(function () { return []; });
  var outEdges = nodes.map(function () { return []; });
  edges.forEach(function (e, i) { outEdges[e[0]].push(i); inEdges[e[1]].push(i); });
  var byId = {};
  nodes.forEach(function (n, i) { byId[n[0]] = i; });

  // --- drawing: one string of markup set at once (fast for thousands of elements) ---
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
  }
  function label(name) { return name.length > 24 ? name.slice(0, 23) + "\u2026" : name; }
  var out = ['<g id="viewport"><g class="edges">'];
  edges.forEach(function (e) {
    var a = nodes[e[0]], b = nodes[e[1]];
    var x1 = a[4] + W, y1 = a[5] + H / 2, x2 = b[4], y2 = b[5] + H / 2, dx = Math.max(40, (x2 - x1) / 2);
    out.push('<path d="M' + x1 + "," + y1 + "C" + (x1 + dx) + "," + y1 + " " + (x2 - dx) + "," + y2 + " " + x2 + "," + y2 + '"/>');
  });
  out.push('</g><g class="nodes">');
  nodes.forEach(function (n, i) {
    var mor = n[6] === "merge_on_read";
    out.push('<a class="node ' + n[2] + " c-" + esc(n[3]) + (n[6] ? " t-" + esc(n[6]) : "") + '" data-i="' + i + '" href="' + esc(href(n)) + '" transform="translate(' + n[4] + "," + n[5] + ')">' +
      '<rect width="' + W + '" height="' + H + '" rx="' + (n[2] === "source" ? H / 2 : 4) + '"/>' +
      '<text x="' + (n[2] === "source" ? 14 : 10) + '" y="' + (H / 2 + 4) + '">' + esc(label(n[1])) + "</text>" +
      (mor ? '<text class="badge" x="' + (W - 8) + '" y="' + (H / 2 + 4) + '">MOR</text>' : "") + "</a>");
  });
  out.push("</g></g>");
  svg.innerHTML = out.join("");
  var viewport = svg.firstChild;
  var nodeEls = svg.querySelectorAll(".node");
  var edgeEls = svg.querySelectorAll(".edges path");

  // --- pan and zoom: one transform on the viewport ---
  var view = { k: 1, x: 0, y: 0 };
  function apply() {
    viewport.setAttribute("transform", "translate(" + view.x + "," + view.y + ") scale(" + view.k + ")");
    svg.classList.toggle("far", view.k < 0.45);  // labels too small to read are not drawn
  }
  function zoomAt(k, px, py) {
    k = Math.max(0.02, Math.min(4, k));
    view.x = px - (px - view.x) * k / view.k;
    view.y = py - (py - view.y) * k / view.k;
    view.k = k;
    apply();
  }
  function fit() {
    var r = svg.getBoundingClientRect(), minX = Infinity, minY = Infinity, maxX = -Infinity, maxY = -Infinity;
    nodes.forEach(function (n) {
      minX = Math.min(minX, n[4]); maxX = Math.max(maxX, n[4] + W);
      minY = Math.min(minY, n[5]); maxY = Math.max(maxY, n[5] + H);
    });
    if (!nodes.length) return;
    var k = Math.min(1.5, (r.width - 40) / (maxX - minX), (r.height - 40) / (maxY - minY));
    view.k = Math.max(0.02, k);
    view.x = (r.width - (maxX - minX) * view.k) / 2 - minX * view.k;
    view.y = (r.height - (maxY - minY) * view.k) / 2 - minY * view.k;
    apply();
  }
  function centre(i) {
    var r = svg.getBoundingClientRect(), n = nodes[i];
    view.k = Math.max(view.k, 1);
    view.x = r.width / 2 - (n[4] + W / 2) * view.k;
    view.y = r.height / 2 - (n[5] + H / 2) * view.k;
    apply();
  }
  svg.addEventListener("wheel", function (ev) {
    ev.preventDefault();
    var r = svg.getBoundingClientRect();
    zoomAt(view.k * Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
  }, { passive: false });
  var drag = null, dragged = false;
  svg.addEventListener("pointerdown", function (ev) {
    if (ev.button !== 0) return;
    drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y };
    dragged = false;
  });
  window.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!dragged && Math.abs(dx) + Math.abs(dy) < 4) return;  // a click that trembled is still a click
    dragged = true;
    svg.classList.add("panning");
    view.x = drag.vx + dx; view.y = drag.vy + dy;
    apply();
  });
  window.addEventListener("pointerup", function () { drag = null; svg.classList.remove("panning"); });
  svg.addEventListener("click", function (ev) { if (dragged) { ev.preventDefault(); dragged = false; } }, true);
  function button(id, f) { document.getElementById(id).addEventListener("click", f); }
  button("fit", fit);
  button("zoom-in", function () { var r = svg.getBoundingClientRect(); zoomAt(view.k * 1.4, r.width / 2, r.height / 2); });
  button("zoom-out", function () { var r = svg.getBoundingClientRect(); zoomAt(view.k / 1.4, r.width / 2, r.height / 2); });

  // --- upstream and downstream of a node ---
  var lit = [], selected = null;
  function walk(start, edgesOf, end, seenNodes, seenEdges) {
    var stack = [start];
    while (stack.length) {
      edgesOf[stack.pop()].forEach(function (e) {
        seenEdges[e] = true;
        var m = edges[e][end];
        if (!seenNodes[m]) { seenNodes[m] = true; stack.push(m); }
      });
    }
  }
  function highlight(i) {
    lit.forEach(function (el) { el.classList.remove("hl", "focus"); });
    lit = [];
    if (i === null) { svg.classList.remove("dim"); info(null); return; }
    var ns = {}, es = {};
    ns[i] = true;
    walk(i, inEdges, 0, ns, es);
    walk(i, outEdges, 1, ns, es);
    Object.keys(ns).forEach(function (m) { nodeEls[m].classList.add("hl"); lit.push(nodeEls[m]); });
    Object.keys(es).forEach(function (e) { edgeEls[e].classList.add("hl"); lit.push(edgeEls[e]); });
    nodeEls[i].classList.add("focus");
    svg.classList.add("dim");
    info(i, Object.keys(ns).length - 1);
  }
  function info(i, related) {
    var panel = document.getElementById("info");
    if (i === null) { panel.hidden = true; return; }
    var n = nodes[i];
    panel.innerHTML = "<h3>" + esc(n[1]) + '</h3><div class="muted">' + esc(n[2]) + ", " + esc(n[3]) + "</div>" +
      "<div>" + inEdges[i].length + " upstream, " + outEdges[i].length + " downstream; " + related + " related in all</div>" +
      (n[6] ? "<div>" + (n[6] === "merge_on_read" ? "merge-on-read" : "copy-on-write") + "</div>" : "") +
      '<a href="' + esc(href(n)) + '">open its page</a>';
    panel.hidden = false;
  }
  svg.addEventListener("pointerover", function (ev) {
    var el = ev.target.closest && ev.target.closest(".node");
    if (el && !drag) highlight(+el.getAttribute("data-i"));
  });
  svg.addEventListener("pointerout", function (ev) {
    var el = ev.target.closest && ev.target.closest(".node");
    if (el && !(ev.relatedTarget && el.contains(ev.relatedTarget))) highlight(selected);
  });

  // --- search: by name (exact, then a part of it), or by step id ---
  function find(text) {
    var t = text.trim().toLowerCase();
    if (!t) return null;
    if (byId[text.trim()] !== undefined) return byId[text.trim()];
    var exact = null, part = null;
    nodes.forEach(function (n, i) {
      var name = n[1].toLowerCase();
      if (exact === null && name === t) exact = i;
      if (part === null && name.indexOf(t) >= 0) part = i;
    });
    return exact !== null ? exact : part;
  }
  function go(text) {
    var i = find(text), note = document.getElementById("search-note");
    note.textContent = i === null && text.trim() ? "no table or source matches" : "";
    selected = i;
    if (i !== null) {
      centre(i);
      history.replaceState(null, "", "#" + nodes[i][0]);
    }
    highlight(selected);
  }
  document.getElementById("search").addEventListener("submit", function (ev) {
    ev.preventDefault();
    go(document.getElementById("search-box").value);
  });
  document.getElementById("search-box").addEventListener("change", function (ev) { go(ev.target.value); });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") {  // let go of the node found
      selected = null;
      highlight(null);
      history.replaceState(null, "", location.pathname);
    } else if (ev.key === "/" && document.activeElement.id !== "search-box") {
      ev.preventDefault();
      document.getElementById("search-box").focus();
    }
  });

  // --- the list beside the graph: filtered by a part of the name ---
  var filter = document.getElementById("list-filter");
  if (filter) {
    var items = document.querySelectorAll("#node-list li");
    filter.addEventListener("input", function () {
      var t = filter.value.trim().toLowerCase();
      items.forEach(function (li) { li.hidden = t !== "" && li.getAttribute("data-name").indexOf(t) < 0; });
    });
  }

  // --- first view: the node named in the URL (#table.orders), else the whole graph ---
  fit();
  var wanted = decodeURIComponent(location.hash.slice(1));
  if (wanted && byId[wanted] !== undefined) {
    selected = byId[wanted];
    centre(selected);
    highlight(selected);
  }
  // drawn and laid out: mark the time since navigation began (tests and bench/docs_bench.py read it)
  requestAnimationFrame(function () {
    setTimeout(function () {
      document.body.setAttribute("data-graph-ready-ms", performance.now().toFixed(1));
      document.body.setAttribute("data-graph-nodes", String(nodes.length));
    }, 0);
  });
})();
