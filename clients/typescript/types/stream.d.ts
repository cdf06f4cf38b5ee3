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
export function openStream(via: Stream["via"], request: (signal: AbortSignal) => Promise<{
    response: Response;
    url: string;
}>, turnSignal: AbortSignal): Promise<Stream>;
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
export function readStream(stream: Stream, idleMs: number): AsyncGenerator<StreamItem, ReadOutcome, undefined>;
/**
 * The turn and index an event id names (`<message_id>:<index>`), or null.
 * @param {string | null | undefined} eventId
 * @returns {{messageId: string, index: number} | null}
 */
export function parseEventId(eventId: string | null | undefined): {
    messageId: string;
    index: number;
} | null;
/**
 * An open stream: the response, the replica that gave it, how it was asked
 * for, and the controller that closes it.
 */
export type Stream = {
    response: Response;
    url: string;
    via: "start" | "attach" | "resume";
    controller: AbortController;
};
/**
 * How a stream ended: with a verdict (`stream_status`: done, errored,
 * cancelled, dead, gone), cleanly with none (a live stream's normal end, or a
 * server cut short), interrupted by a passing `event: error` (a store
 * unavailable), or broken (the connection failed or went silent).
 */
export type ReadOutcome = {
    kind: "verdict";
    reason: string;
    error: StreamFailure | null;
} | {
    kind: "clean";
} | {
    kind: "interrupted";
    error: StreamFailure | null;
} | {
    kind: "broken";
    error: unknown;
};
/**
 * What a stream hands on: a message (`new_message`: its id and the message),
 * or, first on the 202 answer to an enqueued turn, `queued` (its place in line).
 */
export type StreamItem = {
    type: "message";
    eventId: string;
    message: ChatMessage;
} | {
    type: "queued";
    messageId: string;
    position: number | null;
};
import type { StreamFailure } from "./types.js";
import type { ChatMessage } from "./types.js";
