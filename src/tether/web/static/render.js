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

/** The bubble of a message, created at the end of `list` if it is not there yet. */
export function bubbleFor(list, message, { agent } = {}) {
  const id = message.message_id;
  let item = id ? list.querySelector(`li[data-message-id="${CSS.escape(id)}"]`) : null;
  if (!item) {
    item = element("li", `message ${message.sender}`);
    if (id) item.dataset.messageId = id;
    const who = message.sender === "user" ? "You" : agent || "Agent";
    item.append(element("p", "who", who), element("div", "parts"), element("p", "text"));
    item.append(element("p", "turn-note"));
    list.append(item);
  }
  fill(item, message);
  return item;
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
