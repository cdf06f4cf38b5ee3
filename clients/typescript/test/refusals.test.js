// What a real server refuses, as the typed error a caller can catch: each
// class with the server's own code. (Statuses a test cannot provoke here, a
// 401 or a 503, are mapped in errors.test.js.)

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, test } from "node:test";

import {
  BadRequestError,
  ConnectionFailedError,
  ConversationBusyError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  TurnFailedError,
  UnprocessableEntityError,
} from "tether-client";

import { NEEDS_REPLICAS, PROMPT, REPLICAS, clientOf, readAll } from "./support/replicas.js";

/**
 * Run `action`; return what it threw (it must throw).
 * @param {() => Promise<unknown>} action
 */
async function thrown(action) {
  try {
    await action();
  } catch (error) {
    return error;
  }
  assert.fail("it should have thrown");
}

describe("refusals", { skip: NEEDS_REPLICAS }, () => {
  test("400, 404, 413, 422: refused before any stream starts", async () => {
    const client = clientOf(REPLICAS[0].url);
    const unknown = await thrown(() => client.startTurn({ agent: "nobody", content: "hi" }));
    assert.ok(unknown instanceof NotFoundError);
    assert.equal(unknown.code, "UNKNOWN_AGENT");
    assert.equal(unknown.status, 404);

    const params = await thrown(() =>
      client.startTurn({ agent: "plain", content: "hi", botParams: { temperature: 2 } }),
    );
    assert.ok(params instanceof BadRequestError);
    assert.equal(params.code, "BOT_PARAMS_REJECTED");

    const invalid = await thrown(() => client.startTurn({ agent: "", content: "hi" }));
    assert.ok(invalid instanceof UnprocessableEntityError);
    assert.equal(invalid.code, "INVALID_REQUEST");
    assert.match(invalid.message, /agent_identifier/);

    const huge = await thrown(() =>
      client.startTurn({ agent: "plain", content: "x".repeat(1_100_000) }),
    );
    assert.ok(huge instanceof PayloadTooLargeError);
    assert.equal(huge.code, "BODY_TOO_LARGE");

    const cursor = await thrown(() => client.listConversations({ cursor: "not-a-cursor" }));
    assert.ok(cursor instanceof BadRequestError);
    assert.equal(cursor.code, "BAD_REQUEST");
  });

  test("409: a second turn in a busy conversation names the occupant", async () => {
    const client = clientOf(REPLICAS[0].url);
    const turn = await client.startTurn({ agent: "plain", content: PROMPT });
    const busy = await thrown(() =>
      client.startTurn({ agent: "plain", content: "me too", sessionId: turn.sessionId }),
    );
    assert.ok(busy instanceof ConversationBusyError);
    assert.equal(busy.status, 409);
    assert.equal(busy.code, "CONVERSATION_BUSY");
    assert.equal(busy.occupant, turn.messageId);
    assert.equal(busy.sessionId, turn.sessionId);
    await turn.cancel();
    await readAll(turn);
  });

  test("403: another user's private conversation; 404, 410: a turn not there", async () => {
    const owner = clientOf(REPLICAS[0].url);
    const turn = await owner.startTurn({ agent: "plain", content: PROMPT });
    await readAll(turn);

    const stranger = clientOf(REPLICAS[1].url);
    const read = await thrown(() => stranger.getConversation(turn.sessionId));
    assert.ok(read instanceof PermissionDeniedError);
    assert.equal(read.code, "CONVERSATION_NOT_OWNED");
    const follow = await thrown(() => readAll(stranger.follow(turn.sessionId)));
    assert.ok(follow instanceof PermissionDeniedError);

    // An ended turn: nothing to cancel (the server's 410), as the Python client's False.
    assert.equal(await owner.cancel(turn.sessionId, /** @type {string} */ (turn.messageId)), false);
    assert.equal(await turn.cancel(), false);
    const missing = await thrown(() => owner.cancel(turn.sessionId, "no-such-turn"));
    assert.ok(missing instanceof NotFoundError);
    assert.equal(missing.code, "TURN_NOT_FOUND");
  });

  test("a turn whose agent fails ends with TurnFailedError and the server's code", async () => {
    const client = clientOf(REPLICAS[0].url);
    const seen = [];
    const failed = await thrown(async () => {
      for await (const message of client.stream({ agent: "broken", content: PROMPT }))
        seen.push(message);
    });
    assert.ok(failed instanceof TurnFailedError);
    assert.equal(failed.code, "INTERNAL");
    assert.match(failed.message, /error id/);
    assert.ok(seen.length >= 1, "what it streamed before failing was handed on");
  });

  test("no replica that answers: ConnectionFailedError", async () => {
    // A port that was free a moment ago: nothing listens there.
    const port = await new Promise((resolve) => {
      const server = createServer().listen(0, "127.0.0.1", () => {
        const { port: free } = /** @type {import("node:net").AddressInfo} */ (server.address());
        server.close(() => resolve(free));
      });
    });
    const client = clientOf([`http://127.0.0.1:${port}`, `http://127.0.0.1:${port}/`]);
    const error = await thrown(() => client.listConversations());
    assert.ok(error instanceof ConnectionFailedError);
    assert.equal(error.maybeStarted, false, "a refused connection surely started nothing");
  });
});
