// The approvals console's only script. The pages work without it (reload to see changes); with
// it, the live region is replaced by the HTML the server pushes over server-sent events, and the
// time left counts down. It builds no markup of its own: what it inserts is the server's,
// already escaped there.
"use strict";
(function () {
  var skew = Number(document.body.dataset.now) - Date.now();

  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll("time.countdown[data-expires]").forEach(function (t) {
      var left = Math.max(0, Math.floor((Number(t.dataset.expires) - now) / 1000));
      var s = left % 60;
      t.textContent = Math.floor(left / 60) + "m " + (s < 10 ? "0" : "") + s + "s";
      if (left === 0) {
        t.classList.add("over");
      }
    });
  }

  var live = document.getElementById("live");
  if (live && window.EventSource) {
    var source = new EventSource(live.dataset.events);
    source.addEventListener("live", function (event) {
      live.innerHTML = event.data;
      tick();
    });
  }
  tick();
  setInterval(tick, 1000);
})();
