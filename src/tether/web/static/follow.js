// Following one conversation's turn on the page, through the TypeScript
// client (`clients/typescript`, served at /static/client/).
//
// The recovery itself is the client's (status, attach with Last-Event-ID,
// resume a dead turn, or attach when a replica took it over first): one
// implementation for this page and every other user of the package. What is
// the page's own: it tells the user what happens, and it keeps the last event
// it showed in sessionStorage, so a reload of the tab continues after it with
// no gap or repeat.

import { ConversationBusyError, TetherError } from "./client/index.js";
import { loadSeen, saveSeen } from "./store.js";

/** What the status line says while the client recovers, by why it does. */
const RECOVERING = {
  disconnected: ["reconnecting", "Connection lost. Reconnecting…"],
  unreachable: ["reconnecting", "The server cannot be reached. Retrying…"],
  unavailable: ["reconnecting", "The server cannot answer right now. Retrying…"],
  dead: [
    "resuming",
    "The replica writing this answer stopped. Resuming it from its last checkpoint…",
  ],
  gone: ["reconnecting", "Another replica carries this answer on. Following it there…"],
  interrupted: ["reconnecting", "The answer was interrupted. Reconnecting…"],
  refused: ["reconnecting", "The answer changed hands. Following it…"],
};

/**
 * @typedef {object} FollowHooks
 * @property {(messageId: string, seen: object | null, sent: boolean) => Promise<void>} turn
 *   a turn is about to be shown (seen: what this tab last showed of it; sent:
 *   this follower started it, so its user message is on the page already);
 *   for a queued turn, once it starts
 * @property {(messageId: string, position: number | null) => void} queued
 *   the turn followed waits in the conversation's queue
 * @property {(message: object) => void} message   the answer so far
 * @property {(message: object) => void} dropped   an update not shown: it would
 *   have taken text back from the answer shown
 * @property {(state: string, words: string) => void} state   for the status line
 * @property {(words: string) => void} notice   something the page did that the user should know
 * @property {(reason: string, error: object | null, started: boolean) => Promise<void>} end
 *   the turn ended (started: false for a queued one that left the queue first)
 * @property {(error: Error) => void} failed   an error the client cannot get past
 */

export class Follower {
  /**
   * @param {import("./client/index.js").TetherClient} client
   * @param {{tenant: string, sessionId: string, agent: string}} conversation
   * @param {FollowHooks} hooks
   */
  constructor(client, conversation, hooks) {
    this.client = client;
    this.conversation = conversation;
    this.hooks = hooks;
    /** @type {import("./client/index.js").Turn | null} */
    this.turn = null;
    this.messageId = null;
    this.running = false;
    this.closed = false;
    /** the turn send() started, if any */
    this.sent = null;
    /** the turn followed waits in the queue (shown once it starts) */
    this.waiting = false;
    /** how the turn ended, once it has */
    this.ended = null;
  }

  /** Stop reading (another conversation was opened); the turn itself goes on. */
  close() {
    this.closed = true;
    this.turn?.close();
  }

  /**
   * Send the user's message as a new turn and follow its answer.
   * @param {string} content
   * @param {() => void} unsent   called at once if the message was not sent (busy)
   * @param {() => void} [accepted]   called once a replica accepted it
   */
  async send(content, unsent, accepted) {
    const { agent, sessionId } = this.conversation;
    let turn;
    try {
      turn = await this.client.startTurn({ agent, sessionId, content });
    } catch (error) {
      if (!(error instanceof ConversationBusyError)) throw error;
      unsent();
      // One turn per conversation: another tab or device is being answered.
      // Show that answer rather than fail.
      this.hooks.notice(
        "An answer is already being written in this conversation; showing it instead. " +
          "Your message was not sent: send it again to queue it after this answer.",
      );
      return this.recover();
    }
    this.sent = turn.messageId;
    accepted?.();
    return this.#run(turn);
  }

  /** Follow a turn this page started itself (an interrupt, or a message queued
   * that started at once). */
  take(turn) {
    this.sent = turn.messageId;
    return this.#run(turn);
  }

  /**
   * Show whatever turn occupies the conversation now (on load, on reconnect),
   * or turn `messageId` (the next one of the queue: it waits until it starts).
   * @param {string} [messageId]
   */
  recover(messageId) {
    const { tenant, sessionId, agent } = this.conversation;
    const seen = loadSeen(tenant, sessionId);
    const lastEventId = seen?.eventId ?? null;
    // What this tab showed at that event: the client takes no text back from it.
    const shown = seen?.message ?? null;
    return this.#run(this.client.follow(sessionId, { agent, messageId, lastEventId, shown }));
  }

  /** Cancel the turn being shown, from whichever replica serves the page. */
  async stop() {
    if (!this.messageId) return;
    await this.client.cancel(this.conversation.sessionId, this.messageId);
  }

  /** @param {import("./client/index.js").Turn} turn */
  async #run(turn) {
    const { tenant, sessionId } = this.conversation;
    this.turn = turn;
    if (this.closed) turn.close();
    this.running = true;
    /** a queued turn's id, shown (hooks.turn) once it starts */
    let pending = null;
    const show = async (messageId) => {
      this.waiting = false;
      await this.hooks.turn(messageId, this.#seen(messageId), messageId === this.sent);
    };
    try {
      for await (const event of turn.events()) {
        if (this.closed) return;
        if (event.type === "turn") {
          this.messageId = event.messageId;
          if (turn.queued) {
            pending = event.messageId;
            this.waiting = true;
          } else {
            await show(event.messageId);
          }
        } else if (event.type === "queued") {
          this.waiting = true;
          this.hooks.queued(event.messageId, event.position);
        } else if (event.type === "stream") {
          if (this.waiting) continue; // the `queued` event says what it waits for
          this.hooks.state("streaming", "Answering…");
          if (event.via === "resume") {
            this.hooks.notice(
              "The replica writing this answer stopped; this one resumed it from its last checkpoint.",
            );
          }
        } else if (event.type === "message") {
          if (pending !== null) {
            // The queued turn started.
            await show(pending);
            pending = null;
            this.hooks.state("streaming", "Answering…");
          }
          if (event.eventId) {
            saveSeen(tenant, sessionId, {
              messageId: this.messageId,
              eventId: event.eventId,
              message: event.message,
            });
          }
          this.hooks.message(event.message);
        } else if (event.type === "dropped") {
          // The client kept an update off the screen: it would have taken text back.
          this.hooks.dropped(event.message);
        } else if (event.type === "recovering") {
          const [state, words] = RECOVERING[event.cause] ?? RECOVERING.interrupted;
          this.hooks.state(state, words);
        } else if (event.type === "end") {
          if (event.reason !== "none") saveSeen(tenant, sessionId, null);
          const started = pending === null || event.reason !== "cancelled";
          if (pending !== null && started) await show(pending);
          this.waiting = false;
          this.ended = event.reason;
          await this.hooks.end(event.reason, event.error, started);
        }
      }
    } catch (error) {
      if (this.closed) return;
      if (error instanceof TetherError) this.hooks.failed(error);
      else throw error;
    } finally {
      this.running = false;
    }
  }

  /** What this tab last showed of turn `messageId`, if that is the turn it showed. */
  #seen(messageId) {
    const seen = loadSeen(this.conversation.tenant, this.conversation.sessionId);
    return seen && seen.messageId === messageId ? seen : null;
  }
}
