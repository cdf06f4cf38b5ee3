// Server-Sent Events over fetch(), in browsers and Node alike.
//
// EventSource can neither POST (a turn starts with a POST) nor send headers
// (identity, and a Last-Event-ID of our choosing), so the client reads the
// response body itself and parses the event stream format
// (https://html.spec.whatwg.org/multipage/server-sent-events.html).

/**
 * One event of the stream.
 * @typedef {object} SseEvent
 * @property {string} event  the `event:` field, `message` when there was none
 * @property {string} id  the last `id:` field seen so far (the spec's "last event ID")
 * @property {string} data  the `data:` lines, joined by newlines
 */

/**
 * The events of an SSE body, in order. Ends when the body ends; throws when
 * the connection breaks. A reader that stops early (a `break`, a `return`)
 * cancels the body, which closes the connection.
 * @param {ReadableStream<Uint8Array>} body
 * @param {{onBytes?: () => void}} [options]  `onBytes` hears every chunk, keep-alive
 *   comments included: a watchdog's sign of life
 * @returns {AsyncGenerator<SseEvent, void, undefined>}
 */
export async function* readEvents(body, options = {}) {
  const reader = body.getReader();
  // One decoder for the whole body: a character split across chunks is kept whole.
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "";
  let id = "";
  /** @type {string[]} */
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (!done) options.onBytes?.();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      // A line ends at CRLF, LF or CR. A trailing CR may be half of a CRLF
      // still in flight, so it waits for the next chunk, unless none comes.
      const lines = buffer.split(done ? /\r\n|\n|\r/ : /\r\n|\n|\r(?!$)/);
      buffer = lines.pop() ?? "";
      for (const line of lines) {
        if (line === "") {
          if (data.length > 0) yield { event: event || "message", id, data: data.join("\n") };
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue; // a comment: the server's keep-alive ping
        const colon = line.indexOf(":");
        const field = colon === -1 ? line : line.slice(0, colon);
        let text = colon === -1 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
        else if (field === "id" && !text.includes("\0")) id = text;
      }
      // At the end, an event not closed by a blank line is dropped (as the spec says).
      if (done) return;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}
