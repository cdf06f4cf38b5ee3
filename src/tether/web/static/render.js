// Turning API objects into DOM: messages as they grow, and the conversation list.
//
// Everything the server sends is set as text (textContent), never as HTML:
// an answer is untrusted content, and the page's CSP forbids inline scripts
// anyway.

const LAST_TURN = {
  running: "answering",
  complete: "done",
  errored: "failed",
  cancelled: "stopped",
};

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/**
 * The bubble of a message, created if it is not there yet: a queued message
 * (`message.queued`) at the end of `list`, any other before the queued ones
 * (they are answered after everything above them).
 */
export function bubbleFor(list, message, { agent } = {}) {
  const id = message.message_id;
  let item = id ? list.querySelector(`li[data-message-id="${CSS.escape(id)}"]`) : null;
  if (!item) {
    item = element("li", `message ${message.sender}`);
    if (id) item.dataset.messageId = id;
    const who = message.sender === "user" ? "You" : agent || "Agent";
    item.append(element("p", "who", who), element("div", "parts"), element("p", "text"));
    item.append(element("p", "turn-note"));
    if (message.queued) list.append(item);
    else placeAnswered(list, item);
  }
  fill(item, message);
  if (message.queued) markQueued(item, message.queued.message_id ?? null);
  return item;
}

/** Put `item` (a message that is not waiting) after the answered ones, before the queued. */
export function placeAnswered(list, item) {
  const firstQueued = list.querySelector(":scope > li.queued");
  if (firstQueued && firstQueued !== item) list.insertBefore(item, firstQueued);
  else if (!firstQueued) list.append(item);
}

/**
 * Show `item` as a message waiting in the conversation's queue: a line that
 * says so and a button to take it out. `messageId`, the turn it will start,
 * is null while the message is being sent.
 */
export function markQueued(item, messageId) {
  item.classList.add("queued");
  let line = item.querySelector(".queue-line");
  if (!line) {
    line = element("div", "queue-line");
    line.append(element("span", "queue-state"));
    const cancel = element("button", "cancel-queued", "Cancel");
    cancel.type = "button";
    line.append(cancel);
    item.append(line);
  }
  const cancel = line.querySelector(".cancel-queued");
  if (messageId) {
    item.dataset.messageId = `${messageId}-queued`;
    item.dataset.turn = messageId;
    item.classList.remove("pending");
    line.querySelector(".queue-state").textContent = "Queued: answered after the messages above.";
    cancel.hidden = false;
    cancel.disabled = false;
  } else {
    item.classList.add("pending");
    line.querySelector(".queue-state").textContent = "Sending…";
    cancel.hidden = true;
  }
  const words = item.querySelector(".text")?.textContent ?? "";
  cancel.setAttribute("aria-label", `Cancel the queued message: ${words.slice(0, 60)}`);
}

/** A queued bubble whose turn started (or started at once): an ordinary message. */
export function unmarkQueued(item) {
  item.classList.remove("queued", "pending");
  item.querySelector(".queue-line")?.remove();
  delete item.dataset.turn;
}

/** Replace what a bubble shows with `message`: messages are cumulative, never deltas. */
export function fill(item, message) {
  const parts = item.querySelector(".parts");
  const nodes = (message.content_parts || []).map(part).filter((node) => node !== null);
  parts.replaceChildren(...nodes);
  let text = message.content || "";
  if (!text) {
    text = (message.content_parts || [])
      .filter((p) => p.type === "text" && p.text)
      .map((p) => p.text)
      .join("\n");
  }
  item.querySelector(".text").textContent = text;
  const ended = endedBy(message);
  if (ended) note(item, ended.words, ended.kind);
}

/** What the page says of a turn that failed, with the error's message. */
export function failedWords(message) {
  return `The answer failed: ${message ?? "the agent raised an error"}.`;
}

/**
 * How an answer says its turn ended other than done (tether's
 * `handlers/turn_ends.py`: a `turn_error` or `turn_cancelled` context part),
 * in the words the page shows when it sees the end live: a reload shows it too.
 */
function endedBy(message) {
  for (const p of message.content_parts || []) {
    const said = p.type === "context" ? p.context : null;
    if (said?.turn_error) return { words: failedWords(said.turn_error.message), kind: "error" };
    if (said?.turn_cancelled === true) return { words: "Stopped.", kind: "info" };
  }
  return null;
}

/** A line under a bubble: how the turn ended, or what the page did about it. */
export function note(item, words, kind = "info") {
  const line = item.querySelector(".turn-note");
  line.textContent = words;
  line.dataset.kind = kind;
}

function part(p) {
  if (p.type === "tool" && p.tool) return toolCall(p.tool);
  if (p.type === "table" && p.table) return table(p.table);
  if (p.type === "context" && p.context) return context(p.context);
  return null; // text parts repeat the content, which is shown once below
}

function toolCall(tool) {
  const box = element("div", "tool");
  box.dataset.status = tool.status || "running";
  const params = Object.entries(tool.params || {})
    .map(([key, value]) => `${key}: ${typeof value === "string" ? value : JSON.stringify(value)}`)
    .join(", ");
  const state = { running: "running…", completed: "done", error: "failed" }[tool.status] || tool.status;
  const head = element("p", "tool-head");
  head.append(element("span", "tool-name", `Tool ${tool.name}`), ` (${params}) `);
  head.append(element("span", "tool-state", state));
  box.append(head);
  if (tool.status !== "running" && tool.response !== undefined && tool.response !== null) {
    const shown = typeof tool.response === "string" ? tool.response : JSON.stringify(tool.response);
    box.append(element("p", "tool-result", `Result: ${shown}`));
  }
  return box;
}

function table(data) {
  const node = element("table", "table");
  const head = element("tr");
  for (const name of data.headers || []) head.append(element("th", "", String(name)));
  node.append(element("thead"), element("tbody"));
  node.tHead.append(head);
  for (const row of data.rows || []) {
    const line = element("tr");
    for (const cell of row) line.append(element("td", "", String(cell)));
    node.tBodies[0].append(line);
  }
  return node;
}

function context(data) {
  // An MCP server that needs the user's consent (tether.adapters.mcp.tools):
  // {"mcp_authorization": {"server", "url"}} becomes a button that opens it.
  const auth = data.mcp_authorization;
  if (auth && typeof auth.url === "string" && /^https?:\/\//i.test(auth.url)) {
    const box = element("div", "authorize");
    const link = element("a", "button", `Authorize ${auth.server}`);
    link.href = auth.url;
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    box.append(element("span", "", `${auth.server} needs your permission to act for you. `), link);
    return box;
  }
  const down = data.mcp_unavailable;
  if (down) return element("p", "unavailable", `${down.server} is unavailable: ${down.reason}`);
  return null;
}

/** One entry of the conversation list. */
export function conversationItem(summary, current) {
  const item = element("li");
  const link = element("a", "conversation");
  link.href = `#/c/${encodeURIComponent(summary.session_id)}`;
  if (summary.session_id === current) link.setAttribute("aria-current", "page");
  const status = LAST_TURN[summary.last_turn_status] || "new";
  link.append(element("span", "title", summary.title || "(untitled)"));
  const meta = element("span", "meta");
  meta.append(element("span", "agent", summary.agent_identifier), " · ");
  const badge = element("span", "status", status);
  badge.dataset.status = summary.last_turn_status || "new";
  meta.append(badge);
  if (summary.shared) meta.append(" · shared");
  link.append(meta);
  item.append(link);
  return item;
}
