// The chat page: who you are, your conversations, one conversation and its turn.
//
// The address says which conversation is open (#/c/SESSION), so a reload, a
// second tab or the same address on another replica opens the same one.
//
// A message sent while an answer is being written is queued behind it
// (multitask_strategy "enqueue"): it shows at once, marked queued, with a
// button to take it out. "Interrupt and send" (or Ctrl+Enter) stops the
// answer instead, keeping what it wrote, and answers the new message now.
// The page follows one turn at a time: when it ends, the next one of the
// queue (as the status lists it), on every tab of the conversation.

import { NotFoundError, TetherClient } from "./client/index.js";
import { Follower } from "./follow.js";
import {
  bubbleFor,
  conversationItem,
  failedWords,
  fill,
  markQueued,
  note,
  placeAnswered,
  unmarkQueued,
} from "./render.js";
import { loadSettings, loadToken, saveSettings, saveToken } from "./store.js";
import { words } from "./words.js";

const IDLE_POLL_MS = 2000;
const $ = (id) => document.getElementById(id);

const page = {
  auth: "headers",
  settings: loadSettings(),
  token: loadToken(),
  agents: [],
  /** @type {{sessionId: string, agent: string, owner: string | null, exists: boolean} | null} */
  open: null,
  /** @type {Follower | null} */
  follower: null,
  /** the bot bubble of the turn being shown */
  bubble: null,
  /** the newest message received of that turn */
  latest: null,
  /** a message being sent while an answer runs (one at a time) */
  sending: false,
  /**
   * Queued turns this tab cancelled: a status or transcript read before the
   * cancel and answered after it still lists them, and must not bring them back.
   * @type {Set<string>}
   */
  cancelled: new Set(),
  pollTimer: 0,
};

/** Who the page speaks as, asked before every request: the user can change it. */
function identity() {
  if (page.auth !== "token") return { "requester-uuid": page.settings.user };
  return page.token ? { Authorization: `Bearer ${page.token}` } : {};
}

// The page talks to the replica that served it; a load balancer in front
// moves it to another one when this one fails.
const client = new TetherClient({
  urls: location.origin,
  tenant: () => page.settings.tenant,
  headers: identity,
});

/** GET /web/config: the one request that is the page's own, not the API's. */
async function webConfig() {
  const query = new URLSearchParams({ tenant: page.settings.tenant });
  const response = await fetch(`/web/config?${query}`, { headers: identity() });
  if (!response.ok) throw new Error(`The server refused the page's settings (HTTP ${response.status}).`);
  return response.json();
}

// ------------------------------------------------------------------ identity

async function configure() {
  try {
    const config = await webConfig();
    page.auth = config.auth;
    page.agents = config.agents ?? [];
  } catch (error) {
    showError(error);
  }
  $("user-field").hidden = page.auth !== "headers";
  $("token-field").hidden = page.auth !== "token";
  $("user").required = page.auth === "headers";
  $("user").value = page.settings.user;
  $("token").value = page.token;
  $("tenant").value = page.settings.tenant;
  const select = $("agent");
  const chosen = select.value;
  select.replaceChildren(
    ...page.agents.map((name) => {
      const option = document.createElement("option");
      option.value = option.textContent = name;
      return option;
    }),
  );
  // The long answer is what shows the guarantees off; prefer it when offered.
  select.value = page.agents.includes(chosen)
    ? chosen
    : page.agents.includes("long-writer")
      ? "long-writer"
      : (page.agents[0] ?? "");
  if (page.agents.length === 0) {
    const option = document.createElement("option");
    option.value = "";
    option.textContent = page.auth === "token" ? "(enter a token first)" : "(no agents)";
    select.append(option);
  }
}

$("identity").addEventListener("submit", async (event) => {
  event.preventDefault();
  page.settings = { user: $("user").value.trim(), tenant: $("tenant").value.trim() };
  page.token = $("token").value.trim();
  saveSettings(page.settings);
  saveToken(page.token);
  await configure();
  await listConversations();
  await route();
});

// ------------------------------------------------------------- the list

async function listConversations() {
  const list = $("conversations");
  $("list-error").textContent = "";
  try {
    const result = await client.listConversations({ limit: 100 });
    const current = page.open?.sessionId;
    list.replaceChildren(...result.items.map((item) => conversationItem(item, current)));
    if (result.items.length === 0) {
      const empty = document.createElement("li");
      empty.className = "empty";
      empty.textContent = "No conversations yet.";
      list.replaceChildren(empty);
    }
  } catch (error) {
    list.replaceChildren();
    $("list-error").textContent = words(error);
  }
}

// ------------------------------------------------------- one conversation

async function route() {
  const match = /^#\/c\/(.+)$/.exec(location.hash);
  if (match) await openConversation(decodeURIComponent(match[1]));
  else startNew($("agent").value);
}

function reset(sessionId, agent, exists) {
  page.follower?.close();
  page.follower = null;
  page.bubble = null;
  page.latest = null;
  page.open = { sessionId, agent, owner: null, exists };
  $("transcript").replaceChildren();
  $("notice").textContent = "";
  $("error").textContent = "";
  setState("idle", "Ready.");
  for (const link of document.querySelectorAll("#conversations a")) {
    if (link.getAttribute("href") === `#/c/${encodeURIComponent(sessionId)}`) {
      link.setAttribute("aria-current", "page");
    } else {
      link.removeAttribute("aria-current");
    }
  }
}

function startNew(agent) {
  // The page names the conversation; the server creates it with the first turn.
  reset(crypto.randomUUID(), agent, false);
  $("title").textContent = "New conversation";
  $("agent-line").textContent = agent ? `Agent: ${agent}` : "";
  $("share").checked = false;
  $("share").disabled = true;
  $("prompt").focus();
}

async function openConversation(sessionId) {
  reset(sessionId, $("agent").value, false);
  const open = page.open;
  try {
    await loadTranscript();
  } catch (error) {
    showError(error);
    return;
  }
  if (page.open !== open) return;
  follow((follower) => follower.recover());
}

/** Show the stored transcript (GET /conversations/S); a 404 is a conversation not started yet. */
async function loadTranscript() {
  const open = page.open;
  let body = null;
  try {
    body = await client.getConversation(open.sessionId);
  } catch (error) {
    if (!(error instanceof NotFoundError)) throw error;
  }
  if (page.open !== open) return;
  if (body === null) {
    $("title").textContent = "New conversation";
    $("agent-line").textContent = open.agent ? `Agent: ${open.agent}` : "";
    $("share").disabled = true;
    return;
  }
  const summary = body.conversation;
  open.exists = true;
  open.agent = summary.agent_identifier;
  open.owner = summary.owner_uuid;
  $("title").textContent = summary.title || "(untitled)";
  $("agent-line").textContent = `Agent: ${summary.agent_identifier}`;
  $("share").checked = summary.shared;
  $("share").disabled = page.auth === "headers" && summary.owner_uuid !== page.settings.user;
  const list = $("transcript");
  // Keep the bubble of a turn being shown: the transcript gets it only at the
  // end; and messages this tab is still sending.
  const kept = page.bubble;
  const sending = [...list.querySelectorAll(":scope > li.pending")];
  list.replaceChildren();
  for (const message of body.messages) {
    if (message.queued && page.cancelled.has(message.queued.message_id)) continue;
    bubbleFor(list, message, { agent: open.agent });
  }
  if (kept && !list.querySelector(`li[data-message-id="${CSS.escape(kept.dataset.messageId)}"]`)) {
    placeAnswered(list, kept);
  }
  list.append(...sending);
  toBottom();
}

/**
 * Run `action` on a new follower of the open conversation; one follower at a
 * time. When its turn ends, the conversation's next one is followed.
 */
async function follow(action) {
  const open = page.open;
  page.follower?.close();
  page.bubble = null;
  page.latest = null;
  const follower = new Follower(
    client,
    { tenant: page.settings.tenant, sessionId: open.sessionId, agent: open.agent },
    hooks(open, () => follower),
  );
  page.follower = follower;
  setRunning(true);
  try {
    await action(follower);
  } catch (error) {
    if (page.follower === follower) showError(error);
  } finally {
    if (page.follower === follower) {
      setRunning(false);
      if (follower.ended !== null && follower.ended !== "none") {
        followNext(follower.messageId);
      }
      schedulePoll();
    }
  }
}

/**
 * After turn `ended`: follow the one that holds the conversation now (an
 * interrupt from elsewhere), or else the first of the queue (it waits until
 * its turn starts, on whichever replica).
 */
async function followNext(ended) {
  const open = page.open;
  let status;
  try {
    status = await client.status(open.sessionId);
  } catch {
    return; // the poll looks again
  }
  if (page.open !== open || page.follower?.running || !status) return;
  syncQueue(status.queue ?? []);
  const occupant =
    status.message_id !== ended && (status.status === "running" || status.status === "dead")
      ? status.message_id
      : null;
  const next = occupant ?? status.queue?.[0]?.message_id;
  if (next) follow((follower) => follower.recover(next));
}

/**
 * Show the messages waiting in the conversation's queue as the status lists
 * them: add the ones another tab or device queued, drop the ones that left.
 */
function syncQueue(queue) {
  const list = $("transcript");
  const waiting = new Set(queue.map((entry) => `${entry.message_id}-queued`));
  for (const item of list.querySelectorAll(":scope > li.queued[data-message-id]")) {
    if (!waiting.has(item.dataset.messageId)) item.remove();
  }
  for (const entry of queue) {
    if (page.cancelled.has(entry.message_id)) continue;
    bubbleFor(list, {
      sender: "user",
      content: entry.content,
      message_id: `${entry.message_id}-queued`,
      queued: { message_id: entry.message_id },
    });
  }
}

/** One more update of this answer kept off the screen (`data-dropped`). */
function countDropped(bubble) {
  bubble.dataset.dropped = String(Number(bubble.dataset.dropped ?? 0) + 1);
}

function hooks(open, me) {
  const current = () => page.open === open && page.follower === me();
  return {
    async turn(messageId, seen, sent) {
      if (!current()) return;
      open.exists = true;
      listConversations();
      const list = $("transcript");
      if (sent) {
        const mine = list.querySelector("li.message.user:not([data-message-id]):not(.queued)");
        if (mine) mine.dataset.messageId = `${messageId}-user`;
        $("share").disabled = false;
      }
      const shown = list.querySelector(`li[data-message-id="${CSS.escape(messageId)}"]`);
      // A turn this tab did not start (another tab, another device): its
      // user message is in the stored transcript, so fetch that first.
      if (!shown && !list.querySelector(`li[data-message-id="${CSS.escape(`${messageId}-user`)}"]`)) {
        await loadTranscript().catch(() => {});
      }
      // A bubble the stored transcript already shows keeps its text (a turn
      // that ended before this tab looked has nothing newer to show): only
      // what this tab itself showed last may replace it.
      const stored = list.querySelector(`li[data-message-id="${CSS.escape(messageId)}"]`);
      page.bubble =
        stored ?? bubbleFor(list, { sender: "bot", message_id: messageId }, { agent: open.agent });
      if (seen) fill(page.bubble, seen.message);
    },
    message(message) {
      if (!current() || !page.bubble) return;
      const shown = page.bubble.querySelector(".text").textContent;
      const content = message.content || "";
      // Never take text back from the screen: an update that does not extend
      // what the bubble shows (shorter, or other text) is not shown, and
      // counted on the bubble. The client drops these already; the page
      // checks what it shows itself, whatever the client did.
      if (!content.startsWith(shown)) {
        countDropped(page.bubble);
        return;
      }
      page.latest = message;
      const follow = nearBottom();
      fill(page.bubble, message);
      page.bubble.dataset.state = "streaming";
      if (follow) toBottom();
    },
    dropped() {
      if (current() && page.bubble) countDropped(page.bubble);
    },
    queued(messageId, position) {
      if (!current()) return;
      const ahead = position && position > 1 ? ` (${position - 1} more before it)` : "";
      setState("queued", `Waiting for the queued message to be answered${ahead}…`);
      const list = $("transcript");
      const item = list.querySelector(`li[data-message-id="${CSS.escape(`${messageId}-queued`)}"]`);
      const line = item?.querySelector(".queue-state");
      if (line) line.textContent = "Next: answered once the answer above ends.";
    },
    state(state, words) {
      if (current()) setState(state, words);
    },
    notice(words) {
      if (current()) $("notice").textContent = words;
    },
    async end(reason, error, started) {
      if (!current()) return;
      if (!started) {
        // A queued message taken out of the queue before its turn started.
        const id = `${me().messageId}-queued`;
        $("transcript").querySelector(`li[data-message-id="${CSS.escape(id)}"]`)?.remove();
        setState("cancelled", "The queued message was cancelled.");
        return;
      }
      const words = {
        done: "Answer complete.",
        cancelled: "Stopped. The partial answer is kept.",
        errored: failedWords(error?.message),
        unknown: "The answer has ended.",
        none: "Ready.",
      }[reason];
      const messageId = page.bubble?.dataset.messageId;
      if (reason === "cancelled" && messageId) {
        // Show what was kept, as the transcript holds it (the server tells
        // "cancelled" once the cancel has written it).
        const shown = page.bubble;
        page.bubble = null;
        await loadTranscript().catch(() => {});
        if (!current()) return;
        page.bubble = $("transcript").querySelector(
          `li[data-message-id="${CSS.escape(messageId)}"]`,
        );
        if (!page.bubble && shown) {
          // Not there (yet): what this tab showed stays rather than vanish.
          $("transcript").append(shown);
          page.bubble = shown;
        }
      }
      if (page.bubble) {
        if (reason === "done" && page.latest?.message_id === messageId) fill(page.bubble, page.latest);
        page.bubble.dataset.state = reason;
        if (reason === "cancelled") note(page.bubble, "Stopped.");
        if (reason === "errored") note(page.bubble, words, "error");
      }
      setState(reason === "none" ? "idle" : reason, words);
      listConversations();
    },
    failed(error) {
      if (current()) showError(error);
    },
  };
}

// ------------------------------------------------------ composer and controls

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send("enqueue");
});

$("interrupt").addEventListener("click", () => send("interrupt"));

$("prompt").addEventListener("keydown", (event) => {
  // Enter sends, Shift+Enter is a new line: what chat users expect. While an
  // answer is being written, Ctrl+Enter (Cmd+Enter) interrupts it instead.
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    if ((event.ctrlKey || event.metaKey) && page.follower?.running) send("interrupt");
    else $("composer").requestSubmit();
  }
});

/**
 * Send what the user wrote. While the page follows a turn it is sent with
 * `strategy` (enqueue or interrupt); otherwise as a new turn.
 */
async function send(strategy) {
  const prompt = $("prompt");
  const content = prompt.value.trim();
  if (!content || !page.open || page.sending) return;
  if (!page.open.agent) {
    showError(new Error("Choose an agent first."));
    return;
  }
  $("error").textContent = "";
  $("notice").textContent = "";
  if (page.follower?.running) {
    await sendWhileRunning(content, strategy);
    return;
  }
  const open = page.open;
  if (!location.hash.endsWith(encodeURIComponent(open.sessionId))) {
    // Name the new conversation in the address without reopening it.
    history.replaceState(null, "", `#/c/${encodeURIComponent(open.sessionId)}`);
  }
  const mine = bubbleFor($("transcript"), { sender: "user", content });
  if (!open.exists) $("title").textContent = content.slice(0, 80);
  toBottom();
  prompt.value = "";
  // One message in flight at a time: a second Send waits for this one's answer
  // to be accepted, and is then queued behind it.
  page.sending = true;
  const settled = () => {
    page.sending = false;
    setRunning(true);
  };
  const unsent = () => {
    mine.remove();
    if (!open.exists) $("title").textContent = "New conversation";
    prompt.value = content; // nothing was sent: keep what the user wrote
    settled();
  };
  await follow(async (follower) => {
    try {
      await follower.send(content, unsent, settled);
    } catch (error) {
      page.sending = false;
      if (!follower.sent) unsent();
      throw error;
    }
  });
}

/**
 * A message sent while an answer is being written: queued behind it (shown
 * at once, marked queued, to be followed when its turn comes), or
 * interrupting it (followed now; the interrupted answer keeps what it wrote).
 */
async function sendWhileRunning(content, strategy) {
  const open = page.open;
  const list = $("transcript");
  const prompt = $("prompt");
  const interrupted = strategy === "interrupt" ? page.bubble?.dataset.messageId : undefined;
  const queued = strategy === "enqueue" ? {} : null;
  const mine = bubbleFor(list, { sender: "user", content, queued });
  toBottom();
  prompt.value = "";
  page.sending = true;
  setRunning(true);
  let turn;
  try {
    turn = await client.startTurn({
      agent: open.agent,
      sessionId: open.sessionId,
      content,
      multitaskStrategy: strategy,
    });
  } catch (error) {
    mine.remove();
    if (page.open === open) {
      prompt.value = content; // not sent: keep what the user wrote
      showError(error);
    }
    return;
  } finally {
    page.sending = false;
    setRunning(Boolean(page.follower?.running));
  }
  if (page.open !== open) {
    turn.close();
    return;
  }
  if (turn.queued) {
    // One stream at a time: the page follows it when its turn comes.
    turn.close();
    const id = `${turn.messageId}-queued`;
    const shown = list.querySelector(`li[data-message-id="${CSS.escape(id)}"]`);
    if (shown && shown !== mine) shown.remove(); // a poll showed it first
    markQueued(mine, turn.messageId);
    if (!page.follower?.running) followNext(null); // the answer before it ended meanwhile
    return;
  }
  // Started at once: an interrupt, or the answer before it had just ended.
  unmarkQueued(mine);
  placeAnswered(list, mine);
  mine.dataset.messageId = `${turn.messageId}-user`;
  if (interrupted) {
    // Show what the interrupted answer kept (its last recorded message, which
    // the server stored before it started this turn), not what this tab read.
    page.follower?.close();
    page.bubble = null;
    await loadTranscript().catch(() => {});
    if (page.open !== open) {
      turn.close();
      return;
    }
    const kept = list.querySelector(`li[data-message-id="${CSS.escape(interrupted)}"]`);
    if (kept) {
      kept.dataset.state = "cancelled";
      note(kept, "Interrupted. The partial answer is kept.");
    }
  }
  follow((follower) => follower.take(turn));
}

$("transcript").addEventListener("click", async (event) => {
  const button = event.target.closest("button.cancel-queued");
  if (!button) return;
  const item = button.closest("li");
  const messageId = item?.dataset.turn;
  if (!messageId || !page.open) return;
  button.disabled = true;
  item.querySelector(".queue-state").textContent = "Cancelling…";
  try {
    if (await client.cancel(page.open.sessionId, messageId)) {
      page.cancelled.add(messageId);
      item.remove();
      $("notice").textContent = "The queued message was cancelled; it will not be answered.";
    } else {
      $("notice").textContent = "That message was already answered.";
    }
  } catch (error) {
    button.disabled = false;
    item.querySelector(".queue-state").textContent = "Queued: answered after the messages above.";
    showError(error);
  }
});

$("stop").addEventListener("click", async () => {
  const follower = page.follower;
  if (!follower) return;
  $("stop").disabled = true;
  setState("stopping", "Stopping…");
  try {
    await follower.stop();
  } catch (error) {
    showError(error);
    $("stop").disabled = !follower.running;
  }
});

$("share").addEventListener("change", async () => {
  const box = $("share");
  const open = page.open;
  try {
    const summary = await client.shareConversation(open.sessionId, box.checked);
    box.checked = summary.shared;
    $("notice").textContent = summary.shared
      ? "Shared: anyone in the tenant with this page's address can read it."
      : "Private again.";
    listConversations();
  } catch (error) {
    box.checked = !box.checked;
    showError(error);
  }
});

$("agent").addEventListener("change", () => {
  // A conversation not started yet takes the agent chosen now; a started one
  // keeps its own (a new conversation starts with the chosen one).
  const open = page.open;
  if (open && !open.exists && !page.follower?.running) {
    open.agent = $("agent").value;
    $("agent-line").textContent = open.agent ? `Agent: ${open.agent}` : "";
  }
});

$("new").addEventListener("submit", (event) => {
  event.preventDefault();
  if (location.hash) history.pushState(null, "", location.pathname);
  startNew($("agent").value);
});

window.addEventListener("hashchange", route);

// ------------------------------------------------------------------ helpers

/** The element that scrolls the transcript: itself on wide screens, the page on phones. */
function scroller() {
  const list = $("transcript");
  return getComputedStyle(list).overflowY === "auto" ? list : document.scrollingElement;
}

// Keep the growing answer in view, unless the reader scrolled up to read.
function nearBottom() {
  const box = scroller();
  return box.scrollHeight - box.scrollTop - box.clientHeight < 80;
}

function toBottom() {
  const box = scroller();
  box.scrollTop = box.scrollHeight;
}

function setState(state, words) {
  const status = $("status");
  status.dataset.state = state;
  status.textContent = words;
}

function setRunning(running) {
  // While an answer is being written, Send queues; Interrupt stops it first.
  $("send").disabled = page.sending;
  $("interrupt").hidden = !running;
  $("interrupt").disabled = page.sending;
  $("send-hint").hidden = !running;
  $("stop").disabled = !running;
  $("transcript").setAttribute("aria-busy", String(running));
}

function showError(error) {
  $("error").textContent = words(error);
}

/**
 * Keep up with what other tabs and devices do: the messages they queue (while
 * a turn is followed too), and, while idle, a turn they started or the next
 * one of the queue, which is then shown.
 */
function schedulePoll() {
  clearTimeout(page.pollTimer);
  page.pollTimer = setTimeout(async () => {
    const open = page.open;
    if (!open || !open.exists || document.hidden) {
      schedulePoll();
      return;
    }
    try {
      const status = await client.status(open.sessionId);
      if (page.open === open && status) syncQueue(status.queue ?? []);
      const shown = page.follower?.messageId;
      const next = status?.queue?.[0]?.message_id;
      if (page.open === open && status && !page.follower?.running) {
        if (status.message_id !== shown) {
          if (status.status === "running" || status.status === "dead") {
            follow((follower) => follower.recover());
            return;
          }
          await loadTranscript();
          if (page.follower) page.follower.messageId = status.message_id;
        }
        if (next) {
          follow((follower) => follower.recover(next));
          return;
        }
      }
    } catch {
      // The next poll tries again; errors that matter show when the user acts.
    }
    schedulePoll();
  }, IDLE_POLL_MS);
}

await configure();
await Promise.all([listConversations(), route()]);
schedulePoll();
