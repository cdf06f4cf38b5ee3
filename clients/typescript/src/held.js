// What one stream's `new_message` events make, and whether the client shows it.
//
// The client asks for `stream_mode=delta`: the first event of a stream is the
// whole message, the next ones (when the message only grew) `{index, delta}`,
// put back together by the server's rule (tether.domain.appended_text):
// `content` grows by the text, and so does the last content part when it is a
// text part. Each stream starts whole, so nothing carries over between
// connections.
//
// Whatever a stream says, the client never takes text back from the screen:
// an update whose text does not extend the answer so far (shorter, or other
// text) is dropped and counted (`Turn.dropped`, and a `dropped` event).

/** @import { ChatMessage } from "./types.js" */

/** What the client asks of every stream it reads. */
export const STREAM_MODE = "delta";

/**
 * The message an event's data makes on a stream that holds `held`; null when
 * it makes none (a delta with nothing before it on this stream).
 * @param {ChatMessage | null} held
 * @param {Record<string, unknown>} data
 * @returns {ChatMessage | null}
 */
export function applyEvent(held, data) {
  if (typeof data.delta === "string" && !("sender" in data)) {
    return held === null ? null : appendText(held, data.delta);
  }
  return /** @type {ChatMessage} */ (data);
}

/**
 * `message` grown by `text`, as a new object.
 * @param {ChatMessage} message
 * @param {string} text
 * @returns {ChatMessage}
 */
export function appendText(message, text) {
  const grown = { ...message, content: (message.content ?? "") + text };
  const parts = message.content_parts;
  const last = parts?.[parts.length - 1];
  if (parts && last?.type === "text") {
    grown.content_parts = [...parts.slice(0, -1), { ...last, text: (last.text ?? "") + text }];
  }
  return grown;
}

/**
 * Whether showing `next` would take text back from `shown`.
 * @param {ChatMessage} shown
 * @param {ChatMessage} next
 */
export function goesBackwards(shown, next) {
  return !(next.content ?? "").startsWith(shown.content ?? "");
}

/**
 * How many characters of `shown` showing `next` would take back.
 * @param {ChatMessage} shown
 * @param {ChatMessage} next
 */
export function takenBack(shown, next) {
  const before = shown.content ?? "";
  const after = next.content ?? "";
  let kept = 0;
  while (kept < before.length && before[kept] === after[kept]) kept += 1;
  return before.length - kept;
}
