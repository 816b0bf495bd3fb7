// Test-only: evaluated in a built site page by tests/test_browser.py (through the DevTools
// protocol). Defines window.atlasProbe with layout measurements, a header click and a search, each
// returning plain JSON. Nothing here ships with the site.
(function () {
  "use strict";

  function box(el) {
    var r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top + window.scrollY, width: r.width, height: r.height};
  }

  function sleep(ms) { return new Promise(function (ok) { setTimeout(ok, ms); }); }

  function content() { return document.querySelector(".md-content__inner") || document.body; }

  // Words of a widget's table drawn on more than one line ("outp/ut"): one Range per word, and a
  // word whose Range has several line boxes was broken inside.
  function brokenWords(root) {
    var out = [];
    var walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (var node = walker.nextNode(); node; node = walker.nextNode()) {
      var re = /\S+/g, m;
      while ((m = re.exec(node.data))) {
        var r = document.createRange();
        r.setStart(node, m.index);
        r.setEnd(node, m.index + m[0].length);
        var tops = Array.prototype.map.call(r.getClientRects(), function (b) { return Math.round(b.top); });
        if (new Set(tops).size > 1) out.push(m[0]);
      }
    }
    return out;
  }

  // Every table and chart of the page, with every collapsible block opened so hidden content is
  // laid out (and measured) too.
  function measure() {
    Array.prototype.forEach.call(document.querySelectorAll("details"), function (d) { d.open = true; });
    return sleep(150).then(function () {
      var main = content();
      var col = box(main);
      var style = getComputedStyle(main);
      col.innerLeft = col.left + parseFloat(style.paddingLeft);
      col.innerRight = col.right - parseFloat(style.paddingRight);
      var tables = Array.prototype.map.call(main.querySelectorAll("table"), function (t, i) {
        var wrap = t.closest(".md-typeset__scrollwrap") || t.parentElement;
        var rights = Array.prototype.map.call(t.querySelectorAll("td, th"), function (c) { return box(c).right; });
        var fonts = Array.prototype.map.call(t.querySelectorAll("td"), function (c) {
          return parseFloat(getComputedStyle(c).fontSize); });
        return {index: i, box: box(t), maxCellRight: Math.max.apply(null, rights.concat([0])),
                // sideways scrolling of its wrapper, or of the table itself (a display: block table)
                hiddenScroll: Math.max(wrap.scrollWidth - wrap.clientWidth, t.scrollWidth - t.clientWidth),
                header: Array.prototype.map.call(t.tHead ? t.tHead.rows[0].cells : [], function (th) {
                  return (th.textContent || "").trim(); }),
                cards: t.hasAttribute("data-atlas-cards") && getComputedStyle(t).display === "block",
                widget: !!t.closest(".atlas-widget"),
                brokenWords: t.closest(".atlas-widget") ? brokenWords(t) : [],
                minFont: Math.min.apply(null, fonts.concat([99])),
                rows: t.tBodies.length ? t.tBodies[0].rows.length : 0,
                rowHeights: t.tBodies.length ? Array.prototype.map.call(t.tBodies[0].rows, function (r) {
                  return box(r).height; }) : []};
      });
      var charts = Array.prototype.map.call(main.querySelectorAll(".atlas-chart"), function (c) {
        var svg = c.querySelector("svg");
        var scale = svg ? box(svg).width / svg.viewBox.baseVal.width : 1;
        var svgFonts = svg ? Array.prototype.map.call(svg.querySelectorAll("text"), function (t) {
          return parseFloat(getComputedStyle(t).fontSize) * scale; }) : [];
        var htmlFonts = Array.prototype.map.call(c.querySelectorAll("p"), function (p) {
          return parseFloat(getComputedStyle(p).fontSize); });
        return {box: box(c), svg: svg ? box(svg) : null,
                title: (c.querySelector(".atlas-chart-title") || {}).textContent || "",
                minSvgFont: Math.min.apply(null, svgFonts.concat([99])),
                minHtmlFont: Math.min.apply(null, htmlFonts.concat([99]))};
      });
      // diagrams and widgets: their box, and whether anything inside scrolls sideways
      var blocks = Array.prototype.map.call(main.querySelectorAll(".atlas-diagram, .atlas-widget"), function (d) {
        var svg = d.querySelector("svg");
        return {kind: d.getAttribute("data-atlas-diagram") || d.getAttribute("data-atlas-widget"),
                box: box(d), inner: svg ? box(svg) : null, hiddenScroll: d.scrollWidth - d.clientWidth,
                // HTML content only: an SVG's drawing is clipped to its own (measured) box
                maxChildRight: Math.max.apply(null, Array.prototype.filter.call(
                  d.querySelectorAll("*"), function (c) { return !c.closest("svg"); }).map(function (c) {
                    return box(c).right; }).concat([0]))};
      });
      return {width: window.innerWidth, docScrollWidth: document.documentElement.scrollWidth,
              column: col, tables: tables, charts: charts, blocks: blocks};
    });
  }

  // Click a header twice; the column's cell texts before, after the first and the second click.
  function sort(tableIndex, column) {
    var t = content().querySelectorAll("table")[tableIndex];
    var col = function () {
      return Array.prototype.map.call(t.tBodies[0].rows, function (r) {
        return (r.cells[column].textContent || "").trim(); });
    };
    var th = t.tHead.rows[0].cells[column];
    var out = {before: col()};
    th.click();
    out.first = col();
    out.firstAria = th.getAttribute("aria-sort");
    th.click();
    out.second = col();
    out.secondAria = th.getAttribute("aria-sort");
    return out;
  }

  // Type into the site search the way a reader does and wait for the results list.
  function search(query) {
    var input = document.querySelector("input.md-search__input");
    var toggle = document.querySelector("input#__search");
    if (toggle) { toggle.checked = true; toggle.dispatchEvent(new Event("change")); }
    input.focus();
    input.value = query;
    input.dispatchEvent(new Event("focus"));
    input.dispatchEvent(new KeyboardEvent("keyup", {key: query.slice(-1)}));
    input.dispatchEvent(new Event("input", {bubbles: true}));
    var started = Date.now();
    return (function poll() {
      var items = document.querySelectorAll(".md-search-result__item");
      if (items.length || Date.now() - started > 15000) {
        return {results: Array.prototype.map.call(items, function (it) {
                  return (it.textContent || "").replace(/\s+/g, " ").trim(); }),
                meta: ((document.querySelector(".md-search-result__meta") || {}).textContent || "").trim()};
      }
      return sleep(200).then(poll);
    })();
  }

  window.atlasProbe = {measure: measure, sort: sort, search: search};
})();
