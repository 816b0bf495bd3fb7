// Module 8's widgets and the model finder's filter. Plain JavaScript, served locally: the site loads
// nothing from the network. Each result is also written to a data-value attribute (full
// precision), which the browser tests compare with atlas.measure.theory.
(function () {
  "use strict";

  // ---- the formulas (the same closed forms as atlas/measure/theory.py) ----------------------
  function tokensPerPass(conditional) {
    var total = 1, reach = 1;
    conditional.forEach(function (a) { reach *= a; total += reach; });
    return total;
  }
  function tokensPerPassIid(alpha, k) {
    return alpha === 1 ? k + 1 : (1 - Math.pow(alpha, k + 1)) / (1 - alpha);
  }
  function idealSpeedup(tokens, k, draftCost, verifyCost) {
    return tokens / (verifyCost + k * draftCost);
  }
  function normalise(xs) {
    var s = xs.reduce(function (a, b) { return a + b; }, 0);
    return s > 0 ? xs.map(function (v) { return v / s; }) : null;
  }
  // The accept/resample rule's output law at one position: min(p, q) + (1 - Σmin) · norm(max(0, p - q)).
  function acceptResample(p, q) {
    var accepted = p.map(function (pv, i) { return Math.min(pv, q[i]); });
    var over = p.map(function (pv, i) { return Math.max(0, pv - q[i]); });
    var acc = accepted.reduce(function (a, b) { return a + b; }, 0);
    var z = over.reduce(function (a, b) { return a + b; }, 0);
    var residual = over.map(function (v) { return z > 0 ? v / z : 0; });
    var output = accepted.map(function (a, i) { return a + (1 - acc) * residual[i]; });
    return { acceptance: acc, residual: residual, output: output };
  }

  function fmt(x, digits) { return isFinite(x) ? x.toFixed(digits) : "–"; }
  function put(el, value, digits, suffix) {
    if (!el) return;
    el.setAttribute("data-value", String(value));
    el.textContent = fmt(value, digits) + (suffix || "");
  }
  function numbers(text) {
    var parts = text.split(/[\s,;]+/).filter(function (s) { return s.length; });
    var xs = parts.map(Number);
    return xs.some(function (v) { return !isFinite(v); }) ? null : xs;
  }
  function showError(root, message) {
    var err = root.querySelector('[data-out="error"]');
    if (!err) return;
    err.hidden = !message;
    err.textContent = message || "";
  }

  // ---- calculator ------------------------------------------------------------------------------
  function calculator(root) {
    function val(name) { return root.querySelector('[data-in="' + name + '"]'); }
    function update() {
      var mode = val("mode").value;
      var draft = Number(val("draft").value), verify = Number(val("verify").value);
      var conditional, k, tokens, formula;
      if (!(draft >= 0) || !(verify > 0)) {
        return showError(root, "Costs must be numbers: draft ≥ 0, verify > 0.");
      }
      if (mode === "alpha") {
        var alpha = Number(val("alpha").value);
        k = Math.round(Number(val("k").value));
        if (!(alpha >= 0 && alpha <= 1) || !(k >= 0)) {
          return showError(root, "α must lie in [0, 1] and k be a whole number ≥ 0.");
        }
        tokens = tokensPerPassIid(alpha, k);
        formula = "E = (1 − α^(k+1)) / (1 − α) = (1 − " + fmt(alpha, 3) + "^" + (k + 1) + ") / (1 − " +
          fmt(alpha, 3) + ") = " + fmt(tokens, 3);
      } else {
        conditional = numbers(val("conditional").value);
        if (!conditional || conditional.some(function (a) { return a < 0 || a > 1; })) {
          return showError(root, "List acceptance probabilities between 0 and 1, separated by commas.");
        }
        k = conditional.length;
        tokens = tokensPerPass(conditional);
        var terms = ["1"], prod = [];
        conditional.forEach(function (a) { prod.push(fmt(a, 3)); terms.push(prod.join("·")); });
        formula = "E = " + terms.join(" + ") + " = " + fmt(tokens, 3);
      }
      showError(root, "");
      var speedup = idealSpeedup(tokens, k, draft, verify);
      put(root.querySelector('[data-out="tokens"]'), tokens, 3);
      put(root.querySelector('[data-out="speedup"]'), speedup, 3, "×");
      root.querySelector('[data-out="formula"]').textContent = formula +
        ";  speed-up = E / (v + k·c) = " + fmt(tokens, 3) + " / (" + fmt(verify, 3) + " + " + k +
        "·" + fmt(draft, 3) + ") = " + fmt(speedup, 3) + "×";
    }
    root.addEventListener("input", update);
    root.addEventListener("change", update);
    update();
  }

  // ---- accept / resample -----------------------------------------------------------------------
  function mulberry32(seed) {
    return function () {
      seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
      var t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }
  function pick(dist, u) {
    var c = 0;
    for (var i = 0; i < dist.length; i++) { c += dist[i]; if (u < c) return i; }
    return dist.length - 1;
  }

  function acceptWidget(root) {
    var rows = Array.prototype.slice.call(root.querySelectorAll("tbody tr"));
    var tokens = rows.map(function (r) { return r.getAttribute("data-token"); });
    var counts = rows.map(function () { return 0; });
    var draws = 0, rand = mulberry32(20261130), state = null;

    function read(name) {
      var xs = rows.map(function (r) { return Number(r.querySelector('[data-in="' + name + '"]').value); });
      return xs.some(function (v) { return !(v >= 0); }) ? null : normalise(xs);
    }
    function update() {
      var p = read("p"), q = read("q");
      if (!p || !q) { state = null; return showError(root, "p and q need non-negative numbers, not all zero."); }
      showError(root, "");
      var law = acceptResample(p, q);
      state = { p: p, q: q, law: law };
      var maxdiff = 0;
      rows.forEach(function (r, i) {
        put(r.querySelector('[data-out="accept"]'), q[i] > 0 ? Math.min(1, p[i] / q[i]) : 1, 3);
        put(r.querySelector('[data-out="residual"]'), law.residual[i], 3);
        put(r.querySelector('[data-out="output"]'), law.output[i], 3);
        maxdiff = Math.max(maxdiff, Math.abs(law.output[i] - p[i]));
      });
      put(root.querySelector('[data-out="acceptance"]'), law.acceptance, 3);
      var diff = root.querySelector('[data-out="maxdiff"]');
      diff.setAttribute("data-value", String(maxdiff));
      diff.textContent = maxdiff < 1e-12 ? "0 (below 10⁻¹², rounding only)" : maxdiff.toExponential(2);
      showCounts();
    }
    function showCounts() {
      rows.forEach(function (r, i) {
        var cell = r.querySelector('[data-out="empirical"]');
        if (draws) put(cell, counts[i] / draws, 3); else { cell.textContent = "–"; cell.removeAttribute("data-value"); }
      });
    }
    function round() {
      var x = pick(state.q, rand()), u = rand();
      var a = state.q[x] > 0 ? Math.min(1, state.p[x] / state.q[x]) : 1;
      var out = x, text;
      if (u < a) {
        text = "drafted " + tokens[x] + ", u = " + fmt(u, 2) + " < " + fmt(a, 2) + ": accepted";
      } else {
        out = pick(state.law.residual, rand());
        text = "drafted " + tokens[x] + ", u = " + fmt(u, 2) + " ≥ " + fmt(a, 2) +
          ": rejected, resampled " + tokens[out] + " from the residual";
      }
      counts[out] += 1; draws += 1;
      return text;
    }
    root.addEventListener("input", function () { counts = counts.map(function () { return 0; }); draws = 0; update(); });
    root.addEventListener("click", function (ev) {
      var action = ev.target && ev.target.getAttribute && ev.target.getAttribute("data-action");
      if (!action || !state) return;
      var log = root.querySelector('[data-out="log"]');
      if (action === "step") log.textContent = "Round " + (draws + 1) + ": " + round() + ".";
      if (action === "many") { for (var i = 0; i < 10000; i++) round(); log.textContent = draws + " rounds drawn; compare the drawn column with p."; }
      if (action === "reset") { counts = counts.map(function () { return 0; }); draws = 0; log.textContent = "No draws yet."; }
      showCounts();
    });
    update();
  }

  // ---- model finder ----------------------------------------------------------------------------
  function finder(input) {
    var table = document.querySelector("table[data-atlas-finder-table]");
    if (!table) return;
    var count = document.querySelector("[data-atlas-finder-count]");
    function apply() {
      var words = input.value.toLowerCase().split(/\s+/).filter(function (w) { return w.length; });
      var shown = 0;
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var text = row.textContent.toLowerCase();
        var hit = words.every(function (w) { return text.indexOf(w) !== -1; });
        row.hidden = !hit;
        if (hit) shown += 1;
      });
      if (count) count.textContent = shown + " of " + table.tBodies[0].rows.length + " models shown";
    }
    // ?find= (not ?q=, which the theme's search box claims), or ?h=, which a search hit's link carries
    var params = new URLSearchParams(window.location.search);
    var initial = params.get("find") || params.get("h");
    if (initial) input.value = initial;
    input.addEventListener("input", apply);
    apply();
  }

  function enable(doc) {
    Array.prototype.forEach.call(doc.querySelectorAll('[data-atlas-widget="calculator"]'), function (el) {
      if (!el.hasAttribute("data-atlas-live")) { el.setAttribute("data-atlas-live", "1"); calculator(el); }
    });
    Array.prototype.forEach.call(doc.querySelectorAll('[data-atlas-widget="accept-resample"]'), function (el) {
      if (!el.hasAttribute("data-atlas-live")) { el.setAttribute("data-atlas-live", "1"); acceptWidget(el); }
    });
    Array.prototype.forEach.call(doc.querySelectorAll("input[data-atlas-finder]"), function (el) {
      if (!el.hasAttribute("data-atlas-live")) { el.setAttribute("data-atlas-live", "1"); finder(el); }
    });
  }

  if (typeof document$ !== "undefined" && document$.subscribe) {
    document$.subscribe(function () { enable(document); });
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { enable(document); });
  } else {
    enable(document);
  }
})();
