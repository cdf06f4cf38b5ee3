// One stream of a turn (the POST that starts or resumes it, or an attach):
// opened with a connection of its own, read with a watchdog, its events
// sorted into messages and how the stream ended.

import { TetherError } from "./errors.js";
import { applyEvent } from "./held.js";
import { readEvents } from "./sse.js";

/** @import { ChatMessage, StreamFailure } from "./types.js" */

/**
 * An open stream: the response, the replica that gave it, how it was asked
 * for, and the controller that closes it.
 * @typedef {{response: Response, url: string, via: "start" | "attach" | "resume",
 *   controller: AbortController}} Stream
 */

/**
 * How a stream ended: with a verdict (`stream_status`: done, errored,
 * cancelled, dead, gone), cleanly with none (a live stream's normal end, or a
 * server cut short), interrupted by a passing `event: error` (a store
 * unavailable), or broken (the connection failed or went silent).
 * @typedef {{kind: "verdict", reason: string, error: StreamFailure | null}
 *   | {kind: "clean"} | {kind: "interrupted", error: StreamFailure | null}
 *   | {kind: "broken", error: unknown}} ReadOutcome
 */

/**
 * Open a stream with a controller of its own, closed when `turnSignal`
 * aborts (the turn is closed) or by the reader's watchdog.
 * @param {Stream["via"]} via
 * @param {(signal: AbortSignal) => Promise<{response: Response, url: string}>} request
 * @param {AbortSignal} turnSignal
 * @returns {Promise<Stream>}
 */
export async function openStream(via, request, turnSignal) {
  const controller = new AbortController();
  const stop = () => controller.abort();
  turnSignal.addEventListener("abort", stop, { once: true });
  controller.signal.addEventListener("abort", () => turnSignal.removeEventListener("abort", stop), {
    once: true,
  });
  if (turnSignal.aborted) stop();
  try {
    const { response, url } = await request(controller.signal);
    return { response, url, via, controller };
  } catch (error) {
    controller.abort();
    throw error;
  }
}

/**
 * What a stream hands on: a message (`new_message`: its id and the message),
 * or, first on the 202 answer to an enqueued turn, `queued` (its place in line).
 * @typedef {{type: "message", eventId: string, message: ChatMessage}
 *   | {type: "queued", messageId: string, position: number | null}} StreamItem
 */

/**
 * The stream's messages, in order, and its `queued` event; returns how it
 * ended. The connection is closed when reading stops.
 * @param {Stream} stream
 * @param {number} idleMs  silence for this long breaks the stream
 * @returns {AsyncGenerator<StreamItem, ReadOutcome, undefined>}
 */
export async function* readStream(stream, idleMs) {
  /** @type {string | null} */
  let reason = null;
  /** @type {StreamFailure | null} */
  let error = null;
  /** @type {ChatMessage | null} the message this stream's events make so far */
  let held = null;
  const body = stream.response.body;
  if (body === null) return { kind: "broken", error: new TetherError("the stream has no body") };
  // A connection that goes silent (a dead network sends no reset) is broken:
  // the server pings every 15 s, so a much longer silence is no pause.
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let watchdog;
  const alive = () => {
    clearTimeout(watchdog);
    watchdog = setTimeout(() => stream.controller.abort(), idleMs);
  };
  alive();
  try {
    for await (const event of readEvents(body, { onBytes: alive })) {
      if (event.event === "new_message") {
        // Whole, or (stream_mode=delta) the text appended to the one before.
        const message = applyEvent(held, JSON.parse(event.data));
        if (message === null) continue;
        held = message;
        yield { type: "message", eventId: event.id, message };
      } else if (event.event === "queued") {
        const said = JSON.parse(event.data);
        const position = typeof said.position === "number" ? said.position : null;
        yield { type: "queued", messageId: String(said.message_id ?? ""), position };
      } else if (event.event === "stream_status") {
        reason = String(JSON.parse(event.data).reason);
      } else if (event.event === "error") {
        const said = JSON.parse(event.data);
        error = { code: String(said.code ?? "INTERNAL"), message: String(said.message ?? "") };
      }
    }
  } catch (failure) {
    return { kind: "broken", error: failure };
  } finally {
    clearTimeout(watchdog);
    stream.controller.abort();
  }
  if (reason !== null) return { kind: "verdict", reason, error };
  return error === null ? { kind: "clean" } : { kind: "interrupted", error };
}

/**
 * The turn and index an event id names (`<message_id>:<index>`), or null.
 * @param {string | null | undefined} eventId
 * @returns {{messageId: string, index: number} | null}
 */
export function parseEventId(eventId) {
  const colon = eventId?.lastIndexOf(":") ?? -1;
  if (!eventId || colon === -1 || !/^\d+$/.test(eventId.slice(colon + 1))) return null;
  return { messageId: eventId.slice(0, colon), index: Number(eventId.slice(colon + 1)) };
}
