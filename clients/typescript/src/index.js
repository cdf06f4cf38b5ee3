// tether-client: the names the package hands on. Nothing is defined here.

export { TetherClient } from "./client.js";
export {
  AuthenticationError,
  BadGatewayError,
  BadRequestError,
  ConflictError,
  ConnectionFailedError,
  ConversationBusyError,
  errorFromResponse,
  GatewayTimeoutError,
  GoneError,
  InternalServerError,
  NotFoundError,
  NotImplementedByServerError,
  PayloadTooLargeError,
  PermissionDeniedError,
  RecoveryError,
  ServiceUnavailableError,
  StreamError,
  TetherError,
  TetherHttpError,
  TetherHTTPError,
  TurnFailedError,
  TurnOutcomeUnknownError,
  UnprocessableEntityError,
} from "./errors.js";
export { readEvents } from "./sse.js";
export { Turn } from "./turn.js";

/**
 * @typedef {import("./types.js").ChatMessage} ChatMessage
 * @typedef {import("./types.js").ContentPart} ContentPart
 * @typedef {import("./types.js").ToolCall} ToolCall
 * @typedef {import("./types.js").TurnRequest} TurnRequest
 * @typedef {import("./types.js").MultitaskStrategy} MultitaskStrategy
 * @typedef {import("./types.js").TurnStatus} TurnStatus
 * @typedef {import("./types.js").QueuedMessage} QueuedMessage
 * @typedef {import("./types.js").QueuedMark} QueuedMark
 * @typedef {import("./types.js").ConversationSummary} ConversationSummary
 * @typedef {import("./types.js").ConversationPage} ConversationPage
 * @typedef {import("./types.js").Conversation} Conversation
 * @typedef {import("./types.js").StreamFailure} StreamFailure
 * @typedef {import("./types.js").TurnEvent} TurnEvent
 * @typedef {import("./types.js").EndReason} EndReason
 * @typedef {import("./types.js").RecoveryCause} RecoveryCause
 * @typedef {import("./client.js").ClientOptions} ClientOptions
 * @typedef {import("./sse.js").SseEvent} SseEvent
 */
