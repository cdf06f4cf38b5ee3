// Every HTTP error status becomes its own class, with the server's code and
// message, from each body shape the server (or a proxy in front) answers.
// The real refusals of a real server are in refusals.test.js.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AuthenticationError,
  BadGatewayError,
  BadRequestError,
  ConflictError,
  ConversationBusyError,
  errorFromResponse,
  GatewayTimeoutError,
  GoneError,
  InternalServerError,
  NotFoundError,
  NotImplementedByServerError,
  PayloadTooLargeError,
  PermissionDeniedError,
  ServiceUnavailableError,
  TetherError,
  TetherHttpError,
  UnprocessableEntityError,
} from "tether-client";

/**
 * @param {number} status
 * @param {unknown} body
 * @param {Record<string, string>} [headers]
 */
function answer(status, body, headers = {}) {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return new Response(text, { status, headers });
}

const CASES = /** @type {const} */ ([
  [400, "AGENTS_STORAGE_NOT_CONFIGURED", BadRequestError],
  [401, "UNAUTHENTICATED", AuthenticationError],
  [403, "TENANT_NOT_ALLOWED", PermissionDeniedError],
  [404, "UNKNOWN_AGENT", NotFoundError],
  [409, "CONFLICT", ConflictError],
  [410, "TURN_GONE", GoneError],
  [413, "BODY_TOO_LARGE", PayloadTooLargeError],
  [500, "INTERNAL", InternalServerError],
  [501, "NOT_IMPLEMENTED_BY_STORE", NotImplementedByServerError],
  [502, "BAD_GATEWAY", BadGatewayError],
  [503, "DRAINING", ServiceUnavailableError],
  [504, "GATEWAY_TIMEOUT", GatewayTimeoutError],
]);

test("each status has its class, carrying the server's code and message", async () => {
  for (const [status, code, Class] of CASES) {
    const error = await errorFromResponse(answer(status, { code, message: "why", detail: "why" }));
    assert.ok(error instanceof Class, `${status} is a ${Class.name}`);
    assert.ok(error instanceof TetherHttpError && error instanceof TetherError);
    assert.equal(error.name, Class.name);
    assert.equal(error.status, status);
    assert.equal(error.code, code);
    assert.equal(error.message, "why");
  }
});

test("a busy conversation names its occupant", async () => {
  const body = {
    code: "CONVERSATION_BUSY",
    message: "a turn is running",
    detail: { session_id: "s1", message_id: "m1" },
    message_id: "m1",
  };
  const error = await errorFromResponse(answer(409, body));
  assert.ok(error instanceof ConversationBusyError && error instanceof ConflictError);
  assert.equal(error.occupant, "m1");
  assert.equal(error.sessionId, "s1");
  assert.deepEqual(error.body, body);
});

test("FastAPI's 422 names every invalid field", async () => {
  const error = await errorFromResponse(
    answer(422, {
      detail: [
        { loc: ["body", "agent_identifier"], msg: "String should have at least 1 character" },
        { loc: ["query", "tenant"], msg: "Field required" },
      ],
    }),
  );
  assert.ok(error instanceof UnprocessableEntityError);
  assert.equal(error.code, "VALIDATION_ERROR");
  assert.equal(
    error.message,
    "body.agent_identifier: String should have at least 1 character; query.tenant: Field required",
  );
});

test("a 503 says how long to wait; a proxy's page, an unknown status have a class", async () => {
  const draining = await errorFromResponse(
    answer(503, { code: "STORE_UNAVAILABLE", message: "retry" }, { "Retry-After": "1" }),
  );
  assert.ok(draining instanceof ServiceUnavailableError);
  assert.equal(draining.retryAfter, 1);

  const proxy = await errorFromResponse(answer(502, "<html>\nBad Gateway\n</html>"));
  assert.ok(proxy instanceof BadGatewayError);
  assert.equal(proxy.code, "HTTP_502");
  assert.equal(proxy.message, "<html>");

  const teapot = await errorFromResponse(answer(418, { detail: "short and stout" }));
  assert.equal(teapot.constructor, TetherHttpError);
  assert.equal(teapot.code, "HTTP_418");
  assert.equal(teapot.message, "short and stout");
  assert.equal(teapot.retryAfter, null);
});
