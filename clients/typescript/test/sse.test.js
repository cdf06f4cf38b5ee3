// The SSE parser, on bodies made here: how the bytes are split must not matter.

import assert from "node:assert/strict";
import { test } from "node:test";

import { readEvents } from "tether-client";

/**
 * A body that delivers `chunks` one by one.
 * @param {(string | Uint8Array)[]} chunks
 */
function body(chunks) {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) {
        controller.enqueue(typeof chunk === "string" ? encoder.encode(chunk) : chunk);
      }
      controller.close();
    },
  });
}

/** @param {ReadableStream<Uint8Array>} stream */
async function all(stream) {
  const events = [];
  for await (const event of readEvents(stream)) events.push(event);
  return events;
}

const WIRE =
  ': ping\r\n\r\nevent: new_message\r\nid: m1:0\r\ndata: {"content": "Hé"}\r\n\r\n' +
  'event: stream_status\ndata: {"reason": "done"}\n\n' +
  "data: first\rdata: second\r\r";

const EXPECTED = [
  { event: "new_message", id: "m1:0", data: '{"content": "Hé"}' },
  { event: "stream_status", id: "m1:0", data: '{"reason": "done"}' },
  { event: "message", id: "m1:0", data: "first\nsecond" },
];

test("events come out whole, with CRLF, LF or CR line ends", async () => {
  assert.deepEqual(await all(body([WIRE])), EXPECTED);
});

test("split anywhere, even inside a CRLF or a character, the events are the same", async () => {
  const bytes = new TextEncoder().encode(WIRE);
  for (let cut = 1; cut < bytes.length; cut++) {
    const events = await all(body([bytes.slice(0, cut), bytes.slice(cut)]));
    assert.deepEqual(events, EXPECTED, `split at byte ${cut}`);
  }
  const byByte = Array.from(bytes, (byte) => Uint8Array.of(byte));
  assert.deepEqual(await all(body(byByte)), EXPECTED);
});

test("comments, unknown fields and an event without data dispatch nothing", async () => {
  const events = await all(
    body([": keep-alive\n\nretry: 100\n\nevent: x\n\nfoo: bar\ndata: y\n\n"]),
  );
  assert.deepEqual(events, [{ event: "message", id: "", data: "y" }]);
});

test("every chunk is a sign of life, keep-alive comments included", async () => {
  let chunks = 0;
  const stream = body([": ping\n\n", ": ping\n\n", "data: z\n\n"]);
  for await (const event of readEvents(stream, { onBytes: () => chunks++ })) {
    assert.equal(event.data, "z");
  }
  assert.equal(chunks, 3);
});

test("a reader that stops early cancels the body", async () => {
  let cancelled = false;
  const stream = new ReadableStream({
    pull(controller) {
      controller.enqueue(new TextEncoder().encode("data: again\n\n"));
    },
    cancel() {
      cancelled = true;
    },
  });
  for await (const event of readEvents(stream)) {
    assert.equal(event.data, "again");
    break;
  }
  assert.ok(cancelled);
});
