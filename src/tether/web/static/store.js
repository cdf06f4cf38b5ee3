// What the page keeps in the browser, and why each thing lives where it does.
//
// The user name and tenant are settings: localStorage, so every tab and every
// visit uses them. A token is a credential: sessionStorage, gone with the tab.
// The last event seen of a running answer belongs to one tab: sessionStorage
// survives a reload of that tab (which then continues after that event with no
// gap or repeat) and a second tab starts from the whole answer so far.

const SETTINGS = "tether.settings";
const TOKEN = "tether.token";
const SEEN = "tether.seen.";

function read(storage, key) {
  try {
    return JSON.parse(storage.getItem(key) ?? "null");
  } catch {
    return null; // a private window without storage, or a value from elsewhere
  }
}

function write(storage, key, value) {
  try {
    if (value === null) storage.removeItem(key);
    else storage.setItem(key, JSON.stringify(value));
  } catch {
    // Storage full or refused: the page still works, a reload just starts over.
  }
}

/** @returns {{user: string, tenant: string}} */
export function loadSettings() {
  const saved = read(localStorage, SETTINGS) ?? {};
  return {
    user: typeof saved.user === "string" && saved.user ? saved.user : "guest",
    tenant: typeof saved.tenant === "string" && saved.tenant ? saved.tenant : "demo",
  };
}

export function saveSettings(settings) {
  write(localStorage, SETTINGS, { user: settings.user, tenant: settings.tenant });
}

export function loadToken() {
  return read(sessionStorage, TOKEN) ?? "";
}

export function saveToken(token) {
  write(sessionStorage, TOKEN, token || null);
}

/**
 * The last event this tab showed of a conversation's running answer.
 * @returns {{messageId: string, eventId: string, message: object} | null}
 */
export function loadSeen(tenant, sessionId) {
  return read(sessionStorage, `${SEEN}${tenant}.${sessionId}`);
}

export function saveSeen(tenant, sessionId, seen) {
  write(sessionStorage, `${SEEN}${tenant}.${sessionId}`, seen);
}
