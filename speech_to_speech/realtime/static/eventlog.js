// The event log: a debug panel listing the data channel's events, both ways, newest last.
//
// It keeps the last LIMIT events (older ones are dropped), also while hidden, so opening it shows
// what just happened. Each line: time since connecting, direction (↓ from the server, ↑ to it),
// the event's type and a short summary (a delta's words, an error's message, or the JSON).
export const LIMIT = 200;
const SUMMARY_CHARS = 160;

function summary(event) {
  if (typeof event.delta === "string") return JSON.stringify(event.delta);
  if (typeof event.transcript === "string") return JSON.stringify(event.transcript);
  if (event.error) return `${event.error.code || ""} ${event.error.message || ""}`.trim();
  if (event.response) {
    const r = event.response;
    return `${r.id} ${r.status}${r.metadata ? ` ${JSON.stringify(r.metadata)}` : ""}`;
  }
  const rest = { ...event };
  delete rest.type;
  delete rest.event_id;
  const text = JSON.stringify(rest);
  return text === "{}" ? "" : text;
}

/** The panel's controller: record(direction, event), clear(), toggle(show?), entries(). */
export function createEventLog({ panel, list, count, toggle, clear }) {
  let startedAt = performance.now();

  function record(direction, event) {
    const li = document.createElement("li");
    li.className = direction;
    li.dataset.type = event.type || "";
    const seconds = ((performance.now() - startedAt) / 1000).toFixed(2).padStart(7);
    li.innerHTML = `<span class="t"></span> <span class="dir"></span> <span class="type"></span> <span class="sum"></span>`;
    li.querySelector(".t").textContent = seconds;
    li.querySelector(".dir").textContent = direction === "in" ? "↓" : "↑";
    li.querySelector(".type").textContent = event.type || "?";
    const text = summary(event);
    li.querySelector(".sum").textContent = text.length > SUMMARY_CHARS ? `${text.slice(0, SUMMARY_CHARS)}…` : text;
    li.title = JSON.stringify(event);
    const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
    list.appendChild(li);
    while (list.childElementCount > LIMIT) list.firstElementChild.remove();
    count.textContent = String(list.childElementCount);
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  function empty() {
    list.replaceChildren();
    count.textContent = "0";
    startedAt = performance.now();
  }

  function show(visible = panel.hidden) {
    panel.hidden = !visible;
    toggle.setAttribute("aria-pressed", String(visible));
    if (visible) list.scrollTop = list.scrollHeight;
  }

  toggle.addEventListener("click", () => show());
  clear.addEventListener("click", empty);
  return { record, clear: empty, show, restart: () => (startedAt = performance.now()) };
}
