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
 *   this follower started it, so its user message is on the page already)
 * @property {(message: object) => void} message   the answer so far
 * @property {(state: string, words: string) => void} state   for the status line
 * @property {(words: string) => void} notice   something the page did that the user should know
 * @property {(reason: string, error: object | null) => Promise<void>} end   the turn ended
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
   */
  async send(content, unsent) {
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
          "Your message was not sent.",
      );
      return this.recover();
    }
    this.sent = turn.messageId;
    return this.#run(turn);
  }

  /** Show whatever turn occupies the conversation now (on load, on reconnect). */
  recover() {
    const { tenant, sessionId, agent } = this.conversation;
    const seen = loadSeen(tenant, sessionId);
    return this.#run(this.client.follow(sessionId, { agent, lastEventId: seen?.eventId ?? null }));
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
    try {
      for await (const event of turn.events()) {
        if (this.closed) return;
        if (event.type === "turn") {
          this.messageId = event.messageId;
          const sent = event.messageId === this.sent;
          await this.hooks.turn(event.messageId, this.#seen(event.messageId), sent);
        } else if (event.type === "stream") {
          this.hooks.state("streaming", "Answering…");
          if (event.via === "resume") {
            this.hooks.notice(
              "The replica writing this answer stopped; this one resumed it from its last checkpoint.",
            );
          }
        } else if (event.type === "message") {
          if (event.eventId) {
            saveSeen(tenant, sessionId, {
              messageId: this.messageId,
              eventId: event.eventId,
              message: event.message,
            });
          }
          this.hooks.message(event.message);
        } else if (event.type === "recovering") {
          const [state, words] = RECOVERING[event.cause] ?? RECOVERING.interrupted;
          this.hooks.state(state, words);
        } else if (event.type === "end") {
          if (event.reason !== "none") saveSeen(tenant, sessionId, null);
          await this.hooks.end(event.reason, event.error);
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
