// Sortable tables for the MTP Atlas site: click (or Enter/Space on) a header to sort by it; again
// to reverse. Also labels every cell with its column name for the phone card layout. Numbers sort as numbers ("1.23 (1.10–1.35)" counts as 1.23), other text by locale. Self-written and served locally: the site loads nothing from the network.
(function () {
  "use strict";

  function keyOf(text) {
    text = (text || "").trim();
    // A whole-cell number, optionally followed by a bracketed interval; dates and hex stay text.
    var m = text.match(/^([-+]?\d+(?:\.\d+)?)(?:\s+\(.*\))?$/);
    return m ? { num: parseFloat(m[1]), text: text } : { num: null, text: text };
  }

  function key(cell) {
    return keyOf(cell.textContent);
  }

  function compare(a, b) {
    if (a.num !== null && b.num !== null) return a.num - b.num;
    if (a.num !== null) return -1;   // numbers before dashes and words
    if (b.num !== null) return 1;
    return a.text.localeCompare(b.text);
  }

  function sortBy(table, index, header) {
    var body = table.tBodies[0];
    if (!body) return;
    var descending = header.getAttribute("aria-sort") === "ascending";
    if (table.atlasSortRows) {
      // a table holding only part of its rows (the model finder) sorts its data, not its DOM
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) { th.removeAttribute("aria-sort"); });
      header.setAttribute("aria-sort", descending ? "descending" : "ascending");
      table.atlasSortRows(index, descending);
      return;
    }
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r1, r2) {
      var c = compare(key(r1.cells[index] || r1), key(r2.cells[index] || r2));
      return descending ? -c : c;
    });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.removeAttribute("aria-sort");
    });
    header.setAttribute("aria-sort", descending ? "descending" : "ascending");
    rows.forEach(function (row) { body.appendChild(row); });
  }

  // Each cell learns its column's name, so that on a phone (atlas.css) a row can be shown as a
  // card of "name: value" lines instead of a table wider than the screen.
  function label(table) {
    var names = Array.prototype.map.call(table.tHead.rows[0].cells, function (th) {
      return (th.textContent || "").trim();
    });
    Array.prototype.forEach.call(table.tBodies, function (body) {
      Array.prototype.forEach.call(body.rows, function (row) {
        Array.prototype.forEach.call(row.cells, function (td, i) {
          if (names[i]) td.setAttribute("data-label", names[i]);
        });
      });
    });
    table.setAttribute("data-atlas-cards", "");
  }

  function enable(root) {
    var tables = root.querySelectorAll("article table");
    Array.prototype.forEach.call(tables, function (table) {
      if (!table.tHead || table.getAttribute("data-atlas-sortable") === "1") return;
      table.setAttribute("data-atlas-sortable", "1");
      label(table);
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, index) {
        th.setAttribute("data-atlas-sort", "");
        th.setAttribute("tabindex", "0");
        th.setAttribute("title", "Sort by this column");
        th.addEventListener("click", function () { sortBy(table, index, th); });
        th.addEventListener("keydown", function (ev) {
          if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortBy(table, index, th); }
        });
      });
    });
  }

  // the same order for tables that sort their own data
  window.atlasTableSort = { keyOf: keyOf, compare: compare };

  // Material emits document$ on every page load (also with instant loading); plain load otherwise.
  if (typeof document$ !== "undefined" && document$.subscribe) {
    document$.subscribe(function () { enable(document); });
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { enable(document); });
  } else {
    enable(document);
  }
})();
