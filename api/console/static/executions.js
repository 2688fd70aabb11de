// The executions list, kept current: every second while the page is visible, its table's body is
// fetched again (/console/executions/rows, the same filters) and put in place of the old one, so
// that a call appears within two seconds of finishing, however slow one fetch is. Only on the newest page, and never while
// someone is editing the filters (their choice would be read back from the URL, not lost, but a
// table that moves under the pointer is no help). Plain ES2017; the body is the server's own
// escaped HTML, parsed inert (DOMParser runs no script) before it is adopted.
"use strict";

(function () {
  const PERIOD_MS = 1000; // one XREVRANGE of 50 entries a second per viewer: next to nothing
  const table = document.querySelector("table.executions");
  const source = table && table.dataset.live;
  if (!source) {
    return; // an older page: it does not change
  }
  const form = document.getElementById("execution-filters");
  let editing = false;
  let inFlight = false;
  let stopped = false;

  if (form) {
    form.addEventListener("focusin", () => { editing = true; });
    form.addEventListener("focusout", () => { editing = false; });
    form.addEventListener("input", () => { editing = true; });
  }

  async function refresh() {
    if (stopped || inFlight || editing || document.visibilityState !== "visible") {
      return;
    }
    inFlight = true;
    try {
      const answer = await fetch(source, { credentials: "same-origin", cache: "no-store" });
      if (answer.status === 401 || answer.status === 403) {
        stopped = true; // signed out: the next navigation goes to the sign-in page
        return;
      }
      if (!answer.ok) {
        return;
      }
      const parsed = new DOMParser().parseFromString("<table>" + await answer.text() + "</table>", "text/html");
      const fresh = parsed.getElementById("executions-rows");
      const current = document.getElementById("executions-rows");
      if (fresh && current) {
        current.replaceWith(document.adoptNode(fresh));
      }
    } catch (err) {
      // The API is restarting or the network is down: try again at the next tick.
    } finally {
      inFlight = false;
    }
  }

  setInterval(refresh, PERIOD_MS);
  document.addEventListener("visibilitychange", refresh);
}());
