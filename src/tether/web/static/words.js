// What the page says when something fails: the client's typed errors, in words for people.

import {
  AuthenticationError,
  ConnectionFailedError,
  PayloadTooLargeError,
  RecoveryError,
  TetherHttpError,
  UnprocessableEntityError,
} from "./client/index.js";

/**
 * @param {unknown} error
 * @returns {string}
 */
export function words(error) {
  if (error instanceof ConnectionFailedError) {
    return "The server could not be reached. Is it running?";
  }
  if (error instanceof RecoveryError) {
    return "The answer could not be followed: no server carried it on. Reload to try again.";
  }
  if (error instanceof AuthenticationError) {
    const said = error.message ? `: ${error.message}` : "";
    return `The server did not accept your credentials${said}. Check the access token.`;
  }
  if (error instanceof UnprocessableEntityError) {
    return `The server refused the request: ${error.message}.`;
  }
  if (error instanceof PayloadTooLargeError) return "That message is too long for this server.";
  if (error instanceof TetherHttpError) {
    if (error.code === "DRAINING") return "This replica is shutting down. Try again in a moment.";
    if (error.message && !error.code.startsWith("HTTP_")) return sentence(error.message);
    if (error.status >= 500) return `The server failed (HTTP ${error.status}). Try again.`;
    return `The server refused the request (HTTP ${error.status}).`;
  }
  return error instanceof Error ? error.message : String(error);
}

/** @param {string} text */
function sentence(text) {
  const capital = text.charAt(0).toUpperCase() + text.slice(1);
  return /[.!?]$/.test(capital) ? capital : `${capital}.`;
}
