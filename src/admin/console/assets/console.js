// The approvals console's one script, compiled into the binary: a list's
// first page asks the server for its rows again every second and
// shows new ones without a reload (paused while the tab is hidden).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || live.getAttribute("data-live") !== "1") return;
  var status = document.createElement("p");
  status.className = "live-status";
  status.textContent = "live";
  live.parentNode.insertBefore(status, live);
  var ids = function (root) {
    var seen = {};
    root.querySelectorAll("tr[data-id]").forEach(function (tr) { seen[tr.getAttribute("data-id")] = true; });
    return seen;
  };
  var poll = function () {
    if (document.hidden) return;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null || html === undefined) {
          status.textContent = "live: the proxy did not answer";
          return;
        }
        if (html !== live.innerHTML) {
          var before = ids(live);
          live.innerHTML = html;
          live.querySelectorAll("tr[data-id]").forEach(function (tr) {
            if (!before[tr.getAttribute("data-id")]) tr.className += " fresh";
          });
        }
        status.textContent = "live · updated " + new Date().toLocaleTimeString();
      })
      .catch(function () { status.textContent = "live: the proxy did not answer"; });
  };
  setInterval(poll, 1000);
})();
