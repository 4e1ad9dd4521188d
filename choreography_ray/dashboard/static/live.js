// choreography-ray dashboard: live parts of a page, without a build step or a library.
// An element with data-live="URL" is fetched again every data-every milliseconds (default 1000)
// and replaced by the answer, an HTML fragment of the same element. A fragment without
// data-live (the job settled) ends the refresh; a failed fetch is retried at the next tick.
"use strict";
(function () {
  function refresh(element) {
    const every = Number(element.dataset.every || 1000);
    window.setTimeout(async function () {
      try {
        const answer = await fetch(element.dataset.live, {
          credentials: "same-origin",
          headers: { "Accept": "text/html" },
          cache: "no-store",
        });
        if (answer.ok) {
          const holder = document.createElement("template");
          holder.innerHTML = (await answer.text()).trim();
          const fresh = holder.content.firstElementChild;
          if (fresh) {
            element.replaceWith(fresh);
            if (fresh.dataset.live) refresh(fresh);
            return;
          }
        }
      } catch (error) {
        // The dashboard is restarting or the network blinked: try again at the next tick.
      }
      refresh(element);
    }, every);
  }
  document.querySelectorAll("[data-live]").forEach(refresh);
})();
