// cdr report: sortable envelope tables, and (gateway only) live refresh of a session and the
// admin session list. No remote code; document text arrives escaped by the server and the
// list is built with textContent only.
"use strict";
(function () {
  function cellValue(row, col) {
    var cell = row.children[col];
    return cell ? (cell.getAttribute("data-v") || cell.textContent) : "";
  }
  function sortBy(th) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    var col = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute("data-sort") === "num";
    var asc = th.getAttribute("aria-sort") !== "ascending";
    Array.prototype.forEach.call(th.parentNode.children, function (h) {
      h.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, col), y = cellValue(b, col);
      var c = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.addEventListener("click", function (ev) {
    var th = ev.target.closest && ev.target.closest("th[data-sort]");
    if (th) { sortBy(th); }
  });
  document.addEventListener("keydown", function (ev) {
    var th = ev.target.closest && ev.target.closest("th[data-sort]");
    if (th && (ev.key === "Enter" || ev.key === " ")) { ev.preventDefault(); sortBy(th); }
  });

  // Credentials for the gateway pages come in the URL fragment (never sent to a server, so
  // never in its logs): #token=<session token> or #key=<API key>. Kept in this tab only.
  function credentials() {
    var hash = window.location.hash.replace(/^#/, "");
    if (hash) {
      hash.split("&").forEach(function (kv) {
        var i = kv.indexOf("=");
        if (i > 0) {
          var k = kv.slice(0, i), v = decodeURIComponent(kv.slice(i + 1));
          if (k === "token" || k === "key") { sessionStorage.setItem("cdr-" + k, v); }
        }
      });
      history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    var headers = {};
    var token = sessionStorage.getItem("cdr-token");
    var key = sessionStorage.getItem("cdr-key");
    if (key) { headers["Authorization"] = "Bearer " + key; }
    if (token) { headers["CRP-Session"] = token; }
    return headers;
  }
  function status(text) {
    var el = document.getElementById("live");
    if (el) { el.textContent = text; }
  }
  function errorText(resp, body) {
    var msg = body && body.error && body.error.message;
    return "HTTP " + resp.status + (msg ? ": " + msg : "");
  }

  var live = document.body.getAttribute("data-live");
  if (live) {
    var headers = credentials();
    var version = -1;
    var poll = function () {
      fetch(live + "?after=" + version, {headers: headers, cache: "no-store"})
        .then(function (resp) {
          return resp.json().then(function (body) { return [resp, body]; });
        })
        .then(function (pair) {
          var resp = pair[0], body = pair[1];
          if (!resp.ok) { status(errorText(resp, body)); return; }
          if (body.changed) {
            version = body.version;
            var doc = new DOMParser().parseFromString(body.html, "text/html");
            document.getElementById("content").replaceChildren.apply(
              document.getElementById("content"), Array.prototype.slice.call(doc.body.childNodes));
          }
          var running = body.status === "in-progress";
          status((running ? "live, " : "finished (" + body.status + "), ") + body.windows +
                 " windows; updated " + new Date().toLocaleTimeString());
          if (running) { setTimeout(poll, 2000); }
        })
        .catch(function (err) { status("cannot reach the gateway: " + err); setTimeout(poll, 5000); });
    };
    poll();
  }

  var list = document.body.getAttribute("data-list");
  if (list) {
    var h = credentials();
    fetch(list, {headers: h, cache: "no-store"})
      .then(function (resp) { return resp.json().then(function (b) { return [resp, b]; }); })
      .then(function (pair) {
        var resp = pair[0], body = pair[1];
        if (!resp.ok) { status(errorText(resp, body)); return; }
        var tbody = document.getElementById("sessions");
        body.sessions.forEach(function (s) {
          var tr = document.createElement("tr");
          var a = document.createElement("a");
          a.href = "/ui/sessions/" + encodeURIComponent(s.id);
          a.textContent = s.id;
          var cells = [a, s.task, s.ranking, String(s.windows) + "/" + s.max_windows,
                       s.status, s.completeness.toFixed(2), s.mode,
                       new Date(s.updated * 1000).toLocaleString()];
          cells.forEach(function (c) {
            var td = document.createElement("td");
            if (typeof c === "string") { td.textContent = c; } else { td.appendChild(c); }
            tr.appendChild(td);
          });
          tbody.appendChild(tr);
        });
        status(body.sessions.length + " recent sessions");
      })
      .catch(function (err) { status("cannot reach the gateway: " + err); });
  }
})();
