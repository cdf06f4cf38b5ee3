// Server-Sent Events over fetch().
//
// The browser's EventSource can neither POST (a turn starts with a POST) nor
// send headers (requester-uuid, Authorization, Last-Event-ID of our choosing),
// so the page reads the response body itself and parses the event stream
// format (https://html.spec.whatwg.org/multipage/server-sent-events.html).

/**
 * The events of an SSE response body, in order, as {event, id, data}.
 * Ends when the body ends; throws when the connection breaks.
 * @param {Response} response
 * @returns {AsyncGenerator<{event: string, id: string, data: string}>}
 */
export async function* readEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "";
  let id = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      // A line ends at CRLF, LF or CR; a trailing CR may be half of a CRLF
      // still in flight, so keep it for the next chunk.
      const lines = buffer.split(/\r\n|\n|\r(?!$)/);
      buffer = lines.pop();
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
    }
  } finally {
    // A reader that stops early (the page moved on) closes the connection.
    await reader.cancel().catch(() => {});
  }
}
