/**
 * The message an event's data makes on a stream that holds `held`; null when
 * it makes none (a delta with nothing before it on this stream).
 * @param {ChatMessage | null} held
 * @param {Record<string, unknown>} data
 * @returns {ChatMessage | null}
 */
export function applyEvent(held: ChatMessage | null, data: Record<string, unknown>): ChatMessage | null;
/**
 * `message` grown by `text`, as a new object.
 * @param {ChatMessage} message
 * @param {string} text
 * @returns {ChatMessage}
 */
export function appendText(message: ChatMessage, text: string): ChatMessage;
/**
 * Whether showing `next` would take text back from `shown`.
 * @param {ChatMessage} shown
 * @param {ChatMessage} next
 */
export function goesBackwards(shown: ChatMessage, next: ChatMessage): boolean;
/**
 * How many characters of `shown` showing `next` would take back.
 * @param {ChatMessage} shown
 * @param {ChatMessage} next
 */
export function takenBack(shown: ChatMessage, next: ChatMessage): number;
/** @import { ChatMessage } from "./types.js" */
/** What the client asks of every stream it reads. */
export const STREAM_MODE: "delta";
import type { ChatMessage } from "./types.js";
