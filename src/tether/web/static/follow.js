// Following one conversation's turn to its end, whatever happens on the way.
//
// This is the client recovery path of the README, in a browser:
//   1. GET /chat/stream/status: which turn occupies the conversation;
//   2. running: attach, after the last event this tab saw (Last-Event-ID);
//   3. dead: resume it here (POST ?resume=true), and say so;
//   4. done, errored, cancelled: nothing to follow.
// A stream that breaks (the replica died, the network dropped) or that ends
// without a verdict goes back to step 1, so a reload, a second tab and a
// replica's death all end the same way: the whole answer, once.

import { ApiError } from "./api.js";
import { readEvents } from "./sse.js";
import { loadSeen, saveSeen } from "./store.js";

const FINAL = new Set(["done", "errored", "cancelled"]);
const BACKOFF_MS = [300, 600, 1000, 2000, 3000];

/**
 * @typedef {object} FollowHooks
 * @property {(messageId: string, seen: object | null, sent: boolean) => Promise<void>} turn
 *   a turn is about to be shown (seen: what this tab last showed of it; sent:
 *   this follower started it, so its user message is on the page already)
 * @property {(message: object) => void} message   the answer so far
 * @property {(state: string, words: string) => void} state   for the status line
 * @property {(words: string) => void} notice   something the page did that the user should know
 * @property {(reason: string, error: object | null) => Promise<void>} end   the turn ended
 * @property {(error: ApiError) => void} failed   a refusal the page cannot get past
 */

export class Follower {
  /**
   * @param {import("./api.js").Api} api
   * @param {{tenant: string, sessionId: string, agent: string}} conversation
   * @param {FollowHooks} hooks
   */
  constructor(api, conversation, hooks) {
    this.api = api;
    this.conversation = conversation;
    this.hooks = hooks;
    this.abort = new AbortController();
    this.messageId = null;
    this.running = false;
    this.resumed = false;
    /** the turn send() started, if any */
    this.sent = null;
  }

  get closed() {
    return this.abort.signal.aborted;
  }

  /** Stop reading (another conversation was opened); the turn itself goes on. */
  close() {
    this.abort.abort();
  }

  /**
   * Send the user's message as a new turn and follow its answer.
   * @param {string} content
   * @param {() => void} unsent   called at once if the message was not sent (busy)
   */
  async send(content, unsent) {
    const { agent, sessionId } = this.conversation;
    let response;
    try {
      response = await this.api.startTurn(agent, sessionId, content, this.abort.signal);
    } catch (error) {
      if (error instanceof ApiError && error.status === 409) {
        unsent();
        // One turn per conversation: another tab or device is being answered.
        // Show that answer rather than fail.
        this.hooks.notice(
          "An answer is already being written in this conversation; showing it instead. " +
            "Your message was not sent.",
        );
        return this.#run(null);
      }
      throw error;
    }
    const messageId = response.headers.get("X-Tether-Message-Id");
    this.sent = messageId;
    return this.#run({ response, messageId });
  }

  /** Show whatever turn occupies the conversation now (on load, on reconnect). */
  recover() {
    return this.#run(null);
  }

  /** Cancel the turn being shown, from whichever replica serves the page. */
  async stop() {
    if (!this.messageId) return;
    await this.api.cancel(this.conversation.sessionId, this.messageId);
  }

  async #run(first) {
    this.running = true;
    let stream = first;
    let failures = 0;
    try {
      while (!this.closed) {
        if (stream === null) {
          const next = await this.#recover();
          if (next === "retry") {
            await this.#pause(failures++);
            continue;
          }
          if (next === null) return;
          stream = next;
        }
        if (stream.messageId !== this.messageId) {
          this.messageId = stream.messageId;
          await this.hooks.turn(
            stream.messageId,
            this.#seen(stream.messageId),
            stream.messageId === this.sent,
          );
        }
        const outcome = await this.#read(stream);
        stream = null;
        if (outcome.kind === "closed") return;
        if (outcome.kind === "broken") {
          this.hooks.state("reconnecting", "Connection lost. Reconnecting…");
          await this.#pause(failures++);
          continue;
        }
        failures = 0;
        if (FINAL.has(outcome.reason)) {
          await this.#finish(outcome.reason, outcome.error);
          return;
        }
        // dead (the producer stopped), gone (taken over elsewhere) or no
        // verdict at all: the status says what to do next.
      }
    } catch (error) {
      if (this.closed) return;
      if (error instanceof ApiError) this.hooks.failed(error);
      else throw error;
    } finally {
      this.running = false;
    }
  }

  /** Steps 1 to 4: a stream to read, null when there is nothing to follow, or "retry". */
  async #recover() {
    const { sessionId, agent } = this.conversation;
    const signal = this.abort.signal;
    let status;
    try {
      status = await this.api.status(sessionId);
    } catch (error) {
      if (error instanceof ApiError && error.status === 0) {
        this.hooks.state("reconnecting", "The server cannot be reached. Retrying…");
        return "retry";
      }
      throw error;
    }
    if (status === null) {
      await this.hooks.end("none", null);
      return null;
    }
    const messageId = status.message_id;
    if (FINAL.has(status.status)) {
      if (messageId !== this.messageId) await this.hooks.turn(messageId, null, false);
      this.messageId = messageId;
      await this.#finish(status.status, null);
      return null;
    }
    try {
      if (status.status === "dead") {
        this.hooks.state(
          "resuming",
          "The replica writing this answer stopped. Resuming it here from its last checkpoint…",
        );
        const response = await this.api.resume(agent, sessionId, messageId, signal);
        this.resumed = true;
        return { response, messageId };
      }
      const seen = this.#seen(messageId);
      const response = await this.api.attach(sessionId, messageId, seen?.eventId, signal);
      return { response, messageId };
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      // 409: someone resumed it first, or it is alive after all: attach.
      // 410: it finished or was replaced meanwhile. Either way, ask again.
      if (error.status === 409 || error.status === 410) return "retry";
      if (error.status === 0) return "retry";
      throw error;
    }
  }

  /** Read one stream to its end: {kind: "ended", reason, error} | {kind: "broken"} | {kind: "closed"}. */
  async #read({ response, messageId }) {
    const { tenant, sessionId } = this.conversation;
    let reason = null;
    let error = null;
    this.hooks.state("streaming", "Answering…");
    if (this.resumed) {
      this.hooks.notice(
        "The replica writing this answer stopped; this one resumed it from its last checkpoint.",
      );
      this.resumed = false;
    }
    try {
      for await (const event of readEvents(response)) {
        if (event.event === "new_message") {
          const message = JSON.parse(event.data);
          saveSeen(tenant, sessionId, { messageId, eventId: event.id, message });
          this.hooks.message(message);
        } else if (event.event === "stream_status") {
          reason = JSON.parse(event.data).reason;
        } else if (event.event === "error") {
          error = JSON.parse(event.data);
        }
      }
    } catch {
      return { kind: this.closed ? "closed" : "broken" };
    }
    if (this.closed) return { kind: "closed" };
    if (reason === null && error !== null) reason = "errored";
    return { kind: "ended", reason, error };
  }

  #seen(messageId) {
    const seen = loadSeen(this.conversation.tenant, this.conversation.sessionId);
    return seen && seen.messageId === messageId ? seen : null;
  }

  #finish(reason, error) {
    saveSeen(this.conversation.tenant, this.conversation.sessionId, null);
    return this.hooks.end(reason, error);
  }

  #pause(failures) {
    const ms = BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)];
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.abort.signal.addEventListener("abort", () => {
        clearTimeout(timer);
        resolve();
      });
    });
  }
}
