// The package's code is as Prettier writes it (npm run format), as Python's is
// as ruff formats it: a diff shows what changed, never how it was typed.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const PRETTIER = join(ROOT, "node_modules", "prettier", "bin", "prettier.cjs");

test("prettier --check passes", async () => {
  try {
    await promisify(execFile)(
      process.execPath,
      [PRETTIER, "--check", "src/*.js", "test/**/*.js", "test/*.ts", "*.json"],
      { cwd: ROOT },
    );
  } catch (error) {
    const { stdout = "", stderr = "" } = /** @type {{stdout?: string, stderr?: string}} */ (error);
    assert.fail(`not formatted (npm run format):\n${stdout}${stderr}`);
  }
});
