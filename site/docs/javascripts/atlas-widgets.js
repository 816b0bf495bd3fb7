// Module 8's widgets and the model finder's filter. Plain JavaScript, served locally: the site loads
// nothing from the network. Each result is also written to a data-value attribute (full
// precision), which the browser tests compare with atlas.records.theory.
(function () {
  "use strict";

  // ---- the formulas (the same closed forms as atlas/records/theory.py) ----------------------
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
  // An input became invalid: no result of the previous input may stay on screen.
  function clear(els) {
    els.forEach(function (el) {
      if (!el) return;
      el.removeAttribute("data-value");
      el.textContent = "–";
    });
  }

  // ---- calculator ------------------------------------------------------------------------------
  function calculator(root) {
    function val(name) { return root.querySelector('[data-in="' + name + '"]'); }
    var results = [root.querySelector('[data-out="tokens"]'), root.querySelector('[data-out="speedup"]')];
    var formulaEl = root.querySelector('[data-out="formula"]');
    var blankFormula = formulaEl.textContent;
    var note = root.querySelector('[data-out="verify-note"]');
    // The record's verify cost at each k it timed ("1:1.3 2:1.5"); the verify input follows k
    // from these until the reader types a cost of their own.
    var measuredCosts = {};
    (root.getAttribute("data-verify-costs") || "").split(/\s+/).forEach(function (pair) {
      var kv = pair.split(":");
      if (kv.length === 2 && isFinite(Number(kv[1]))) measuredCosts[Number(kv[0])] = Number(kv[1]);
    });
    var follows = Object.keys(measuredCosts).length > 0;
    function invalid(message) {
      clear(results);
      formulaEl.textContent = blankFormula;
      showError(root, message);
    }
    function showMode(mode) {
      Array.prototype.forEach.call(root.querySelectorAll("[data-mode]"), function (el) {
        el.hidden = el.getAttribute("data-mode") !== mode;
      });
    }
    function update(ev) {
      var mode = val("mode").value;
      showMode(mode);
      if (ev && ev.target === val("verify")) follows = false;
      var conditional, k, tokens, formula;
      if (mode === "alpha") {
        var alpha = Number(val("alpha").value);
        k = Math.round(Number(val("k").value));
        if (!(alpha >= 0 && alpha <= 1) || !(k >= 0)) {
          return invalid("α must lie in [0, 1] and k be a whole number ≥ 0.");
        }
        tokens = tokensPerPassIid(alpha, k);
        formula = "E = (1 − α^(k+1)) / (1 − α) = (1 − " + fmt(alpha, 3) + "^" + (k + 1) + ") / (1 − " +
          fmt(alpha, 3) + ") = " + fmt(tokens, 3);
      } else {
        conditional = numbers(val("conditional").value);
        if (!conditional || conditional.some(function (a) { return a < 0 || a > 1; })) {
          return invalid("List acceptance probabilities between 0 and 1, separated by commas.");
        }
        k = conditional.length;
        tokens = tokensPerPass(conditional);
        var terms = ["1"], prod = [];
        conditional.forEach(function (a) { prod.push(fmt(a, 3)); terms.push(prod.join("·")); });
        formula = "E = " + terms.join(" + ") + " = " + fmt(tokens, 3);
      }
      if (follows) {
        var timed = Object.keys(measuredCosts).join(", ");
        if (!(k in measuredCosts)) {
          if (note) note.textContent = "";
          return invalid("The record timed a verify pass only at k = " + timed + ", not at k = " + k +
                         ": type a verify cost for this k.");
        }
        val("verify").value = measuredCosts[k].toFixed(3);
        if (note) note.textContent = "Verify cost v at k = " + k + " from the record (it timed k = " + timed + ").";
      } else if (note) {
        note.textContent = "";
      }
      var draft = Number(val("draft").value), verify = Number(val("verify").value);
      if (!(draft >= 0) || !(verify > 0)) {
        return invalid("Costs must be numbers: draft ≥ 0, verify > 0.");
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
      if (!p || !q) {
        state = null;
        rows.forEach(function (r) {
          clear(["accept", "residual", "output", "empirical"].map(function (n) { return r.querySelector('[data-out="' + n + '"]'); }));
        });
        clear([root.querySelector('[data-out="acceptance"]'), root.querySelector('[data-out="maxdiff"]')]);
        return showError(root, "p and q need non-negative numbers, not all zero.");
      }
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
  // The page holds the first rows only; every row is in part files (models/finder/part-NNNN.js,
  // each calling atlasFinderPart(i, rows)), loaded as scripts the first time a reader filters or
  // sorts, so the page opens as fast with 10^5 models as with 10. At most LISTED matching rows are
  // put in the table at once (a DOM of 10^5 rows is what made the page slow); the count says how
  // many match. Rows are built as text nodes: no model string is ever parsed as HTML. A cell is its
  // text, or [text, slug] pieces (the MTP-drafter cell), a piece with a slug a link to that page.
  var LISTED = 200;

  function textOf(c) {
    return Array.isArray(c) ? c.map(function (p) { return p[0]; }).join("") : c;
  }

  function finder(input) {
    var box = input.closest(".atlas-finder");
    var table = box && box.querySelector("table[data-atlas-finder-table]");
    if (!table) return;
    var count = box.querySelector("[data-atlas-finder-count]");
    var total = parseInt(box.getAttribute("data-atlas-finder-total"), 10) || table.tBodies[0].rows.length;
    var nParts = parseInt(box.getAttribute("data-atlas-finder-parts"), 10) || 0;
    var src = box.getAttribute("data-atlas-finder-src");
    var names = Array.prototype.map.call(table.tHead.rows[0].cells, function (th) { return th.textContent.trim(); });
    var hint = box.querySelector("[data-atlas-finder-hint]");
    var families = [];
    try { families = JSON.parse(box.getAttribute("data-atlas-finder-families") || "[]"); } catch (e) { families = []; }
    var rows = null, waiting = [], loading = false, sortIndex = null, descending = false;

    function words() {
      return input.value.toLowerCase().split(/\s+/).filter(function (w) { return w.length; });
    }

    function load(done) {
      if (rows) { done(); return; }
      waiting.push(done);
      if (loading) return;
      loading = true;
      var parts = new Array(nParts), left = nParts;
      window.atlasFinderPart = function (i, data) {
        if (parts[i]) return;
        parts[i] = data;
        left -= 1;
        if (left === 0) {
          rows = [].concat.apply([], parts).map(function (r) { return { cells: r, text: [r[0]].concat(r.slice(2)).map(textOf).join(" ").toLowerCase() }; });
          waiting.splice(0).forEach(function (f) { f(); });
        }
      };
      if (count) count.textContent = "loading all " + total + " models …";
      for (var i = 0; i < nParts; i++) {
        var script = document.createElement("script");
        script.src = src + ("000" + i).slice(-4) + ".js";
        script.onerror = function (ev) {
          if (count) count.textContent = "could not load " + ev.target.getAttribute("src") + " (the finder's data)";
        };
        document.head.appendChild(script);
      }
    }

    function piece(td, text, slug) {
      if (slug) {
        var a = document.createElement("a");
        a.setAttribute("href", slug + "/");
        a.textContent = text;
        td.appendChild(a);
      } else {
        td.appendChild(document.createTextNode(text));
      }
    }

    function cell(c, slug, label) {
      var td = document.createElement("td");
      td.setAttribute("data-label", label);
      // at most three lines per cell (atlas-course.css .atlas-clamp), as the page's own rows
      var box = document.createElement("div");
      box.className = "atlas-clamp";
      if (Array.isArray(c)) c.forEach(function (p) { piece(box, p[0], p[1]); });
      else piece(box, c, slug);
      box.setAttribute("title", box.textContent);
      td.appendChild(box);
      return td;
    }

    function show() {
      var ws = words();
      var hits = rows.filter(function (r) { return ws.every(function (w) { return r.text.indexOf(w) !== -1; }); });
      if (sortIndex !== null) {
        var col = sortIndex === 0 ? 0 : sortIndex + 1, order = window.atlasTableSort;
        var keyed = hits.map(function (r, i) { return { k: order.keyOf(textOf(r.cells[col])), i: i, r: r }; });
        keyed.sort(function (a, b) { return (descending ? -1 : 1) * order.compare(a.k, b.k) || a.i - b.i; });
        hits = keyed.map(function (x) { return x.r; });
      }
      var body = document.createElement("tbody");
      hits.slice(0, LISTED).forEach(function (r) {
        var tr = document.createElement("tr");
        tr.appendChild(cell(r.cells[0], r.cells[1], names[0]));
        for (var i = 2; i < r.cells.length; i++) tr.appendChild(cell(r.cells[i], null, names[i - 1]));
        body.appendChild(tr);
      });
      table.replaceChild(body, table.tBodies[0]);
      if (count) {
        count.textContent = hits.length + " of " + total + " models shown" +
          (hits.length > LISTED ? " (the first " + LISTED + " listed: add words to narrow)" : "");
      }
      if (hint) {
        hint.hidden = hits.length > 0 || !ws.length;
        hint.textContent = hint.hidden ? "" : noMatch(ws);
      }
    }

    // Nothing matches: say whether the words name a family the runner's table knows (module 8
    // uses family names; the crawl holds only the watchlist's models), else what the finder searches.
    function squash(s) { return s.toLowerCase().replace(/[^a-z0-9]/g, ""); }
    function noMatch(ws) {
      var keys = ws.map(squash).filter(function (w) { return w.length > 2; });
      var named = families.filter(function (f) {
        var own = [f.name].concat(f.types).map(squash);
        return keys.some(function (w) { return own.some(function (o) { return o.indexOf(w) !== -1; }); });
      });
      if (named.length) {
        return "No model of this snapshot matches every word. " + named.map(function (f) {
          return f.name + " (model_type " + f.types.join(", ") + ") is a family in the runner's table: " + f.says;
        }).join("; ") + ". The finder lists the crawl's models only; the Runs page has the family table.";
      }
      return "No model of this snapshot matches every word. The finder searches each row's text (id, org, " +
        "family, the claim cells): try part of a model id, an org, or a model_type such as deepseek_v3.";
    }

    function apply() {
      if (rows || words().length || sortIndex !== null) { load(show); return; }
      var here = table.tBodies[0].rows.length;
      if (count) count.textContent = here === total ? total + " of " + total + " models shown"
        : "the first " + here + " of " + total + " models listed: type to search them all";
    }

    table.atlasSortRows = function (index, desc) { sortIndex = index; descending = desc; load(show); };
    // ?find= (not ?q=, which the theme's search box claims), or ?h=, which a search hit's link carries
    var params = new URLSearchParams(window.location.search);
    var initial = params.get("find") || params.get("h");
    if (initial) input.value = initial;
    input.addEventListener("input", apply);
    apply();
  }

  // ---- diagrams ---------------------------------------------------------------------------------
  // A diagram scales to the column; on a narrow screen its labels get small, so a tap shows it at
  // the width it was drawn, in a box the reader scrolls sideways (and a second tap scales it back).
  function diagram(box) {
    var svg = box.querySelector("svg");
    if (!svg) return;
    box.setAttribute("tabindex", "0");
    box.setAttribute("title", "Tap or press Enter: full size / fit to the column");
    function toggle() {
      var zoomed = box.hasAttribute("data-zoomed");
      if (zoomed) { box.removeAttribute("data-zoomed"); svg.style.width = ""; }
      else { box.setAttribute("data-zoomed", ""); svg.style.width = svg.style.maxWidth; }
    }
    box.addEventListener("click", toggle);
    box.addEventListener("keydown", function (ev) { if (ev.key === "Enter") toggle(); });
  }

  function enable(doc) {
    Array.prototype.forEach.call(doc.querySelectorAll(".atlas-diagram"), function (el) {
      if (!el.hasAttribute("data-atlas-live")) { el.setAttribute("data-atlas-live", "1"); diagram(el); }
    });
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
