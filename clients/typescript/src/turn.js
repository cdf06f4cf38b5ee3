// One turn, followed to its end whatever happens on the way.
//
// This is the client's side of the recovery in docs/deployment/model.md:
//   1. GET /chat/stream/status: which turn occupies the conversation;
//   2. running: attach, after the last event read (Last-Event-ID);
//   3. dead: resume it (POST ?resume=true); refused with 409 because a replica
//      (or another client) took it over first: attach instead;
//   4. done, errored, cancelled: the verdict; a stream that broke first is
//      read to its end (attach after the last event), so the answer is whole;
//      once the turn's rows are gone, its answer is read from the transcript.
// A stream that breaks (a replica died, the network dropped, it went silent),
// ends with `dead` or `gone`, or ends with no verdict goes back to step 1, on
// the next replica. Each message is handed on once, in index order: an index
// at or below one already handed on is dropped.
//
// A turn queued behind others (`enqueue`, answered 202) is not the status's
// turn while it waits: the status lists it in `queue`, and the client
// attaches to it there (the attach waits for it to start). One that left
// the queue without starting, and so left nothing in the transcript, ended
// `cancelled`.

import {
  ConversationBusyError,
  errorFromResponse,
  GoneError,
  NotFoundError,
  RecoveryError,
  TetherError,
  TurnFailedError,
} from "./errors.js";
import { goesBackwards, STREAM_MODE, takenBack } from "./held.js";
import { passing, pause } from "./retry.js";
import { sendTurn } from "./start.js";
import { openStream, parseEventId, readStream } from "./stream.js";

/** @import { ChatMessage, EndReason, RecoveryCause, StreamFailure, TurnEvent } from "./types.js" */
/** @import { TetherClient } from "./client.js" */
/** @import { RequestOptions } from "./replicas.js" */
/** @import { NewTurn } from "./start.js" */
/** @import { ReadOutcome, Stream, StreamItem } from "./stream.js" */

const FINAL = new Set(["done", "errored", "cancelled"]);
const MESSAGE_ID_HEADER = "X-Tether-Message-Id";

/**
 * @typedef {object} TurnOptions
 * @property {string} sessionId
 * @property {string | null} [messageId]  the turn to follow; null follows whichever
 *   occupies the conversation
 * @property {string | null} [agent]  needed to resume; looked up in the conversation when not given
 * @property {string | null} [lastEventId]  continue after this event (`<message_id>:<index>`)
 * @property {ChatMessage | null} [shown]  what the caller shows of the turn as of
 *   `lastEventId` (a reloaded page): no update may take text back from it
 * @property {AbortSignal} [signal]  aborting it is `close()`
 * @property {boolean} [recoverable]  default true; false for a turn started with
 *   `stateful: false`, which no status knows and no replica can resume
 */

/**
 * What the status says to do next (`position`: the stream is an attach to a
 * turn waiting in the queue, there).
 * @typedef {{kind: "stream", stream: Stream, position?: number}
 *   | {kind: "end", reason: EndReason}
 *   | {kind: "transcript", reason: EndReason | null, displaced?: boolean}
 *   | {kind: "retry", cause: RecoveryCause, error: unknown}} Step
 */

/**
 * A turn being followed. Read it once: `for await (const message of turn)`
 * for the answer so far, or `turn.events()` for everything that happens.
 */
export class Turn {
  #abort = new AbortController();
  /** @type {Stream | null} */
  #first = null;
  /**
   * The reader of the start's stream when `start()` read its first event (a
   * 202's `queued`), with that event, for `events()` to go on from.
   * @type {{stream: Stream, items: AsyncGenerator<StreamItem, ReadOutcome, undefined>,
   *   first: IteratorResult<StreamItem, ReadOutcome>} | null}
   */
  #reader = null;
  #consumed = false;
  /** whether this client read part of the turn: then its end must be read, not assumed */
  #followed = false;
  #lastIndex = -1;
  /** @type {string | null} */
  #announced = null;
  /** @type {string | null} */
  #agent;
  /** @type {string | null} the Last-Event-ID given, applied once the turn it names is followed */
  #after;
  /** @type {ChatMessage | null} what the caller shows as of `#after` */
  #shownAfter;
  #recoverable;

  /**
   * @param {TetherClient} client
   * @param {TurnOptions} options
   */
  constructor(client, options) {
    this.client = client;
    /** @readonly */
    this.sessionId = options.sessionId;
    /** The turn's message id, once known. @type {string | null} */
    this.messageId = null;
    /**
     * The id of the last event handed on: what a reconnect sends as Last-Event-ID.
     * @type {string | null}
     */
    this.lastEventId = null;
    /** The answer so far. @type {ChatMessage | null} */
    this.message = null;
    /**
     * Updates not shown because their text does not extend the answer so far
     * (shorter, or other text), and the characters they would have taken back.
     */
    this.dropped = { updates: 0, characters: 0 };
    /** The replica of the stream being read. @type {string | null} */
    this.url = null;
    /**
     * Whether the server queued the turn behind others (`enqueue` on a busy
     * conversation) rather than start it at once.
     */
    this.queued = false;
    /**
     * Its place in the conversation's queue (1: next) when the client last
     * heard it waited; null for a turn that never waited.
     * @type {number | null}
     */
    this.queuePosition = null;
    /**
     * How it ended, once it has.
     * @type {{reason: EndReason, error: StreamFailure | null} | null}
     */
    this.outcome = null;
    this.#agent = options.agent ?? null;
    this.#after = options.lastEventId ?? null;
    this.#shownAfter = options.shown ?? null;
    this.#recoverable = options.recoverable ?? true;
    if (options.messageId) this.#adopt(options.messageId);
    const signal = options.signal;
    if (signal?.aborted) this.close();
    signal?.addEventListener("abort", () => this.close(), { once: true });
  }

  /**
   * The old name of `queuePosition` (the Python client's `queue_position`).
   * @deprecated use `queuePosition`
   * @returns {number | null}
   */
  get position() {
    return this.queuePosition;
  }

  /** Whether the turn is no longer read: `close()` was called, or its reading is over. */
  get closed() {
    return this.#abort.signal.aborted;
  }

  /** Stop reading. The turn itself goes on (`cancel()` stops it). */
  close() {
    this.#abort.abort();
  }

  /**
   * Cancel the turn, from whichever replica answers; the partial answer is
   * kept. False when it had already ended.
   * @returns {Promise<boolean>}
   */
  async cancel() {
    if (this.messageId === null) throw new TetherError("no turn is known yet to cancel");
    return this.client.cancel(this.sessionId, this.messageId);
  }

  /**
   * Send the turn (`TetherClient.startTurn` calls it; see start.js): refusals
   * are thrown here, before anything is read.
   * @param {Omit<NewTurn, "sessionId" | "recoverable" | "signal">} request
   */
  async start(request) {
    const sent = await sendTurn(this.client, {
      ...request,
      sessionId: this.sessionId,
      recoverable: this.#recoverable,
      signal: this.#abort.signal,
    });
    if ("adopted" in sent) {
      this.#adopt(sent.adopted);
      if (sent.position !== null) this.#waits(sent.position);
      this.#followed = true; // this client's own turn: its whole answer is wanted
      return;
    }
    const stream = sent.stream;
    this.#first = stream;
    const messageId = stream.response.headers.get(MESSAGE_ID_HEADER);
    if (messageId) this.#adopt(messageId);
    if (stream.response.status === 202) {
      // Queued. Its first event says where it waits: read now, so that the
      // caller knows before the turn starts.
      this.queued = true;
      const items = readStream(stream, this.client.idleTimeoutMs);
      const first = await items.next();
      if (!first.done && first.value.type === "queued") this.#waits(first.value.position);
      this.#reader = { stream, items, first };
    }
  }

  /**
   * Read the turn to its end: its final answer (null if it had none); throws
   * TurnFailedError if the turn ends errored.
   * @returns {Promise<ChatMessage | null>}
   */
  async answer() {
    for await (const _ of this);
    return this.message;
  }

  /** The answer so far, message by message; throws TurnFailedError if the turn ends errored. */
  async *[Symbol.asyncIterator]() {
    for await (const event of this.events()) {
      if (event.type === "message") yield event.message;
      else if (event.type === "end" && event.reason === "errored") {
        const error = event.error ?? { code: "ERRORED", message: "the turn ended errored" };
        throw new TurnFailedError(error.code, error.message, this.messageId);
      }
    }
  }

  /**
   * Everything that happens to the turn, until its end (or `close()`).
   * @returns {AsyncGenerator<TurnEvent, void, undefined>}
   */
  async *events() {
    if (this.#consumed) throw new TypeError("a Turn is read once: events() or its messages");
    this.#consumed = true;
    let stream = this.#first;
    this.#first = null;
    let trustFinal = false;
    let failures = 0;
    let progressAt = Date.now();
    /** @type {number | null} the place in the queue of the turn the next stream attaches to */
    let waitsAt = null;
    try {
      for (;;) {
        if (this.closed) return;
        if (stream === null) {
          if (Date.now() - progressAt > this.client.recoveryTimeoutMs) {
            throw new RecoveryError(
              `no replica carried turn ${this.messageId ?? "(unknown)"} of ${this.sessionId} ` +
                `on for ${this.client.recoveryTimeoutMs} ms`,
              this.messageId,
            );
          }
          const step = await this.#next(trustFinal);
          if (step.kind === "retry") {
            yield { type: "recovering", cause: step.cause, error: step.error };
            await this.#pause(step.error, failures++);
            continue;
          }
          if (step.kind === "end") {
            yield* this.#announce();
            yield this.#end(step.reason, null);
            return;
          }
          if (step.kind === "transcript") {
            const waiting = yield* this.#fromTranscript(step.reason, step.displaced ?? false);
            if (!waiting) return;
            await this.#pause(null, failures++);
            continue;
          }
          stream = step.stream;
          waitsAt = step.position ?? null;
          // Known to wait before its `turn` event, for whoever reads them.
          if (waitsAt !== null) this.#waits(waitsAt);
        }
        this.url = stream.url;
        this.#followed = true;
        yield* this.#announce();
        yield { type: "stream", via: stream.via, url: stream.url };
        if (waitsAt !== null) {
          yield {
            type: "queued",
            messageId: /** @type {string} */ (this.messageId),
            position: waitsAt,
          };
          waitsAt = null;
        }
        const before = this.#lastIndex;
        const outcome = yield* this.#read(stream);
        stream = null;
        const progressed = this.#lastIndex > before;
        if (progressed || (this.queued && this.#lastIndex === -1)) {
          // A wait in the queue, however long, was no failure either.
          progressAt = Date.now();
        }
        if (progressed) failures = 0;
        if (outcome.kind === "verdict" && FINAL.has(outcome.reason)) {
          yield this.#end(/** @type {EndReason} */ (outcome.reason), outcome.error);
          return;
        }
        if (this.closed) return;
        if (!this.#recoverable) {
          // No status knows a stateless turn: a clean close is its end (design
          // §3), anything else loses it.
          if (outcome.kind === "clean") {
            yield this.#end("done", null);
            return;
          }
          throw new RecoveryError(
            `the stream of turn ${this.messageId} broke, and a turn that is not stateful ` +
              "cannot be recovered",
            this.messageId,
          );
        }
        // A clean close with no verdict is the end of a live stream, or a
        // server that cut it short: the status says which.
        trustFinal = outcome.kind === "clean";
        if (outcome.kind !== "clean") {
          /** @type {RecoveryCause} */
          let cause = "interrupted";
          if (outcome.kind === "broken") cause = "disconnected";
          if (outcome.kind === "verdict" && outcome.reason !== "interrupted") {
            cause = outcome.reason === "dead" ? "dead" : "gone";
          }
          yield { type: "recovering", cause, error: outcome.error };
          if (outcome.kind === "broken") this.client.replicas.skip(this.url ?? "");
        }
        // A stream that brought nothing new is no reason to ask again at once.
        if (!progressed) await this.#pause(null, failures++);
      }
    } catch (error) {
      if (this.closed) return;
      throw error;
    } finally {
      // Ended, failed, or its reader stopped early: let go of every connection.
      this.close();
    }
  }

  // --------------------------------------------------------------- steps

  /**
   * Steps 1 to 4: ask a replica for the status, then open the stream it calls for.
   * @param {boolean} trustFinal  the last stream ended cleanly: a final status is the end
   * @returns {Promise<Step>}
   */
  async #next(trustFinal) {
    let answer;
    try {
      answer = await this.client.statusAnswer(this.sessionId, this.#abort.signal);
    } catch (error) {
      return retry(error);
    }
    const { status, url } = answer;
    if (status === null) {
      return this.messageId === null
        ? { kind: "end", reason: "none" }
        : { kind: "transcript", reason: null };
    }
    if (this.messageId === null) this.#adopt(status.message_id);
    if (status.message_id !== this.messageId) {
      const place = (status.queue ?? []).findIndex((entry) => entry.message_id === this.messageId);
      if (place !== -1) {
        // Still waiting its turn: the attach waits for it to start.
        try {
          return { kind: "stream", stream: await this.#attach(url), position: place + 1 };
        } catch (error) {
          return this.#refused(error, url);
        }
      }
      // A newer turn holds the conversation: this one is over. After a clean
      // close of its stream, done (the queue's next turn started at once);
      // else the transcript tells what it can.
      return { kind: "transcript", reason: trustFinal ? "done" : null, displaced: true };
    }
    const verdict = status.status;
    if (FINAL.has(verdict) && (trustFinal || !this.#followed)) {
      return { kind: "end", reason: /** @type {EndReason} */ (verdict) };
    }
    try {
      if (verdict === "dead") {
        try {
          return { kind: "stream", stream: await this.#resume(url) };
        } catch (error) {
          // A replica took the turn over first (or it is alive after all): attach.
          if (!(error instanceof ConversationBusyError)) throw error;
        }
      }
      return { kind: "stream", stream: await this.#attach(url) };
    } catch (error) {
      const ended = error instanceof GoneError || isMissingTurn(error);
      if (ended && FINAL.has(verdict)) {
        return { kind: "transcript", reason: /** @type {EndReason} */ (verdict) };
      }
      return this.#refused(error, url);
    }
  }

  /**
   * An attach or resume refused: ask again (after a pause; elsewhere when
   * that replica cannot serve), or throw what is no passing failure.
   * @param {unknown} error
   * @param {string} url
   * @returns {Step}
   */
  #refused(error, url) {
    const ended = error instanceof GoneError || isMissingTurn(error);
    if (ended || error instanceof ConversationBusyError) {
      return { kind: "retry", cause: "refused", error };
    }
    const step = retry(error);
    this.client.replicas.skip(url);
    return step;
  }

  /** @param {string} url */
  #attach(url) {
    const messageId = /** @type {string} */ (this.messageId);
    return this.#open("attach", url, "GET", `/chat/stream/${encodeURIComponent(messageId)}`, {
      params: { session_id: this.sessionId, stream_mode: STREAM_MODE },
      headers: this.lastEventId ? { "Last-Event-ID": this.lastEventId } : {},
    });
  }

  /** @param {string} url */
  async #resume(url) {
    if (this.#agent === null) {
      const { conversation } = await this.client.getConversation(this.sessionId, {
        signal: this.#abort.signal,
      });
      this.#agent = conversation.agent_identifier;
    }
    return this.#open("resume", url, "POST", "/chat/stream", {
      params: { resume: "true", message_id: this.messageId, stream_mode: STREAM_MODE },
      body: {
        agent_identifier: this.#agent,
        stateful: true,
        session_id: this.sessionId,
        conversation: [],
      },
    });
  }

  /**
   * A stream from the replica `url`; an error status is thrown as its TetherHttpError.
   * @param {Stream["via"]} via
   * @param {string} url
   * @param {string} method
   * @param {string} path
   * @param {RequestOptions} options
   */
  #open(via, url, method, path, options) {
    const request = async (/** @type {AbortSignal} */ signal) => {
      const response = await this.client.replicas.send(url, method, path, { ...options, signal });
      if (!response.ok) throw await errorFromResponse(response);
      return { response, url };
    };
    return openStream(via, request, this.#abort.signal);
  }

  // -------------------------------------------------------------- reading

  /**
   * Hand on one stream's new messages; say how it ended.
   * @param {Stream} stream
   * @returns {AsyncGenerator<TurnEvent, import("./stream.js").ReadOutcome, undefined>}
   */
  async *#read(stream) {
    const started = this.#reader?.stream === stream ? this.#reader : null;
    this.#reader = null;
    const messages = started?.items ?? readStream(stream, this.client.idleTimeoutMs);
    let pending = started?.first ?? null;
    try {
      for (;;) {
        const next = pending ?? (await messages.next());
        pending = null;
        if (next.done) return next.value;
        const item = next.value;
        if (item.type === "queued") {
          this.#waits(item.position);
          const messageId = this.messageId ?? item.messageId;
          yield { type: "queued", messageId, position: item.position };
          continue;
        }
        const { eventId, message } = item;
        const index = this.#accept(eventId);
        if (index === null) continue;
        const shown = this.message;
        if (shown !== null && goesBackwards(shown, message)) {
          // Never take text back from the screen (defence in depth: the
          // server shows only what a takeover continues from).
          this.dropped.updates += 1;
          this.dropped.characters += takenBack(shown, message);
          yield { type: "dropped", message, shown, eventId, index };
          continue;
        }
        this.message = message;
        yield { type: "message", message, eventId, index };
      }
    } finally {
      // A reader that stopped early closes the stream's connection.
      await messages.return({ kind: "broken", error: null });
    }
  }

  /**
   * The index of an event to hand on, or null for one of another turn or one
   * already handed on.
   * @param {string} eventId
   */
  #accept(eventId) {
    const named = parseEventId(eventId);
    if (named === null) return null;
    // Without the message id header (a cross-origin page that may not read
    // it) the first event names the turn.
    if (this.messageId === null) this.#adopt(named.messageId);
    if (named.messageId !== this.messageId || named.index <= this.#lastIndex) return null;
    this.#lastIndex = named.index;
    this.lastEventId = eventId;
    return named.index;
  }

  /**
   * Follow the turn `messageId`; continue after the Last-Event-ID given if it
   * is one of this turn (one of an older turn means nothing here).
   * @param {string} messageId
   */
  #adopt(messageId) {
    this.messageId = messageId;
    const after = parseEventId(this.#after);
    if (after === null || after.messageId !== messageId) return;
    this.#lastIndex = after.index;
    this.lastEventId = this.#after;
    this.#after = null;
    // The caller shows this much already: the guard holds from there.
    this.message = this.#shownAfter;
    // Part of it was read before: its end must be read too, not assumed.
    this.#followed = true;
  }

  /**
   * The turn waits in its conversation's queue, at `position`.
   * @param {number | null} position
   */
  #waits(position) {
    this.queued = true;
    this.queuePosition = position;
  }

  // --------------------------------------------------------------- endings

  /**
   * The end, read from the stored transcript: the turn's final message (when
   * this client had not seen it) and the conversation's last-turn status.
   * Returns true, having ended nothing, when its message still waits in the
   * queue (ask the status again).
   * @param {EndReason | null} reason  the verdict, when the status still said it
   * @param {boolean} displaced  the status named a newer turn
   * @returns {AsyncGenerator<TurnEvent, boolean, undefined>}
   */
  async *#fromTranscript(reason, displaced) {
    yield* this.#announce();
    let conversation;
    try {
      conversation = await this.client.getConversation(this.sessionId, {
        signal: this.#abort.signal,
      });
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
      yield this.#end(reason ?? "unknown", null);
      return false;
    }
    const messages = conversation.messages;
    const ids = new Set(messages.map((m) => m.message_id));
    if (this.queued && !ids.has(`${this.messageId}-user`)) {
      if (ids.has(`${this.messageId}-queued`)) return true;
      // It left the queue without starting (cancelled, or dropped for it
      // could never run), as its own stream would have said.
      yield this.#end("cancelled", null);
      return false;
    }
    const mine = messages.findLast((m) => m.sender === "bot" && m.message_id === this.messageId);
    if (!mine && displaced && reason === null) {
      // A newer turn took the conversation before this one recorded an
      // answer: an interrupt or a rollback, or a cancel.
      yield this.#end("cancelled", null);
      return false;
    }
    if (mine && mine.content !== this.message?.content) {
      this.message = mine;
      yield { type: "message", message: mine, eventId: null, index: null };
    }
    /** @type {StreamFailure | null} */
    let failure = null;
    if (mine) {
      // The answer says how its turn ended: the verdict its stream would
      // have told (after a clean close the status may have said "done" for
      // a turn an interrupt ended).
      ({ reason, failure } = endingOf(mine));
    }
    if (reason === null && mine && messages.at(-1) === mine) {
      const last = conversation.conversation.last_turn_status;
      if (last === "complete") reason = "done";
      else if (last === "errored" || last === "cancelled") reason = last;
    }
    yield this.#end(reason ?? "unknown", failure);
    return false;
  }

  /** @returns {Generator<TurnEvent, void, undefined>} */
  *#announce() {
    if (this.messageId !== null && this.messageId !== this.#announced) {
      this.#announced = this.messageId;
      yield { type: "turn", messageId: this.messageId };
    }
  }

  /**
   * @param {EndReason} reason
   * @param {StreamFailure | null} error
   * @returns {TurnEvent}
   */
  #end(reason, error) {
    this.outcome = { reason, error };
    return { type: "end", reason, error };
  }

  /**
   * @param {unknown} error
   * @param {number} failures
   */
  #pause(error, failures) {
    return pause(
      error,
      failures,
      this.client.retryDelaysMs,
      this.#abort.signal,
      this.client.random,
    );
  }
}

/**
 * Try again when `error` is passing (no answer, a replica that cannot serve
 * now); anything else is thrown.
 * @param {unknown} error
 * @returns {Step}
 */
function retry(error) {
  const cause = passing(error);
  if (cause === null) throw error;
  return { kind: "retry", cause, error };
}

/**
 * A 404 for the turn itself (its rows are gone), not for an unknown agent.
 * @param {unknown} error
 */
function isMissingTurn(error) {
  return error instanceof NotFoundError && error.code === "TURN_NOT_FOUND";
}

/**
 * How a turn ended, as its answer in the transcript says: a `turn_error`
 * context part for errored (with its code and message), `turn_cancelled`
 * for cancelled, else done.
 * @param {import("./types.js").ChatMessage} answer
 * @returns {{reason: EndReason, failure: StreamFailure | null}}
 */
function endingOf(answer) {
  for (const part of answer.content_parts ?? []) {
    const context = /** @type {Record<string, any>} */ (part.context ?? {});
    const error = context.turn_error;
    if (error) {
      return {
        reason: "errored",
        failure: { code: String(error.code ?? "ERRORED"), message: String(error.message ?? "") },
      };
    }
    if (context.turn_cancelled === true) return { reason: "cancelled", failure: null };
  }
  return { reason: "done", failure: null };
}
