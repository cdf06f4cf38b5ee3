// Delta mode and the regression guard against real replicas (issue 25): the
// client asks every stream for `stream_mode=delta`, hands on whole messages
// all the same, and never hands on one that would take text back.

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  NEEDS_REPLICAS,
  PROMPT,
  REPLICAS,
  clientOf,
  messagesOf,
  readAll,
  reference,
} from "./support/replicas.js";

/** The rewinder agent's answer, message by message (its `steps.json`). */
const STEPS = [
  "Once upon a time there was a river.",
  "Once upon a time", // shorter
  "Once upon a time there was a lake.", // as long, other text
  "Once upon a time there was a river. It ran to the sea.",
];

/**
 * A fetch that keeps every URL asked for and every stream's text as it came.
 * @returns {{fetch: typeof fetch, asked: string[], wire: Promise<string>[]}}
 */
function recordingFetch() {
  /** @type {string[]} */
  const asked = [];
  /** @type {Promise<string>[]} */
  const wire = [];
  /** @type {typeof fetch} */
  const recording = async (input, init) => {
    const response = await fetch(input, init);
    asked.push(String(input));
    if (response.body === null || !response.headers.get("content-type")?.includes("event-stream"))
      return response;
    const [mine, theirs] = response.body.tee();
    wire.push(new Response(mine).text());
    const { status, statusText, headers } = response;
    return new Response(theirs, { status, statusText, headers });
  };
  return { fetch: recording, asked, wire };
}

describe("delta mode", { skip: NEEDS_REPLICAS }, () => {
  test("the client asks for deltas and hands on whole messages", async () => {
    const url = REPLICAS[0].url;
    const expected = await reference(url, "writer");
    const recorder = recordingFetch();
    const client = clientOf(url, { fetch: recorder.fetch });
    const turn = await client.startTurn({ agent: "writer", content: PROMPT });
    const events = await readAll(turn);
    const wire = (await Promise.all(recorder.wire)).join("");

    const streams = recorder.asked.filter((asked) => asked.includes("/chat/stream?"));
    assert.ok(streams.length > 0 && streams.every((asked) => asked.includes("stream_mode=delta")));
    const data = wire.split(/\r?\n/).filter((line) => line.startsWith("data: "));
    assert.ok(data.filter((line) => line.startsWith('data: {"index"')).length >= 5, wire);
    assert.ok(/event: stream_status\r?\ndata: \{"reason": "done"\}/.test(wire));

    // Every message handed on is whole, and the last is the transcript's.
    const messages = messagesOf(events);
    for (const { message } of messages) assert.equal(message.sender, "bot");
    const { messages: transcript } = await client.getConversation(turn.sessionId);
    assert.equal(messages.at(-1)?.message.content, expected);
    // Its text parts grew with it (the transcript writes out empty fields).
    const parts = (/** @type {import("tether-client").ChatMessage | undefined} */ message) =>
      (message?.content_parts ?? []).map((part) => [part.type, part.text ?? null]);
    assert.deepEqual(parts(messages.at(-1)?.message), parts(transcript.at(-1)));
    assert.equal(transcript.at(-1)?.content, expected);
    assert.deepEqual(turn.dropped, { updates: 0, characters: 0 });
  });

  test("an update that would take text back is dropped and counted", async () => {
    const gates = mkdtempSync(join(tmpdir(), "rewinder-"));
    writeFileSync(join(gates, "steps.json"), JSON.stringify(STEPS));
    let opened = 0;
    const client = clientOf(REPLICAS[0].url);
    const turn = await client.startTurn({ agent: "rewinder", content: gates });
    // The agent writes its next text once the client dealt with the last one.
    const events = await readAll(turn, (event) => {
      if (event.type === "message" || event.type === "dropped") {
        writeFileSync(join(gates, `go-${++opened}`), "");
      }
    });

    const shown = messagesOf(events).map(({ message }) => message.content);
    assert.deepEqual(shown, [STEPS[0], STEPS[3]]);
    const dropped = events.flatMap((event) => (event.type === "dropped" ? [event] : []));
    assert.deepEqual(
      dropped.map((event) => [event.message.content, event.shown.content]),
      [
        [STEPS[1], STEPS[0]],
        [STEPS[2], STEPS[0]],
      ],
    );
    // "there was a river." back to "Once upon a time", then "river." to "lake.".
    assert.deepEqual(turn.dropped, {
      updates: 2,
      characters: STEPS[0].length - STEPS[1].length + "river.".length,
    });
    assert.deepEqual(events.at(-1), { type: "end", reason: "done", error: null });
  });
});
