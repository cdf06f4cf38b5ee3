// The package is typed: its JavaScript passes a strict type check (checkJs),
// a TypeScript user's code against its declarations checks too
// (test/consumer.ts), and the committed declarations (types/) are exactly
// what the sources declare, so no build step is ever needed.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("..", import.meta.url));
const TSC = join(ROOT, "node_modules", "typescript", "bin", "tsc");

/** @param {string[]} args */
async function tsc(args) {
  try {
    await run(process.execPath, [TSC, ...args], { cwd: ROOT });
  } catch (error) {
    const { stdout = "", stderr = "" } = /** @type {{stdout?: string, stderr?: string}} */ (error);
    assert.fail(`tsc ${args.join(" ")} failed:\n${stdout}${stderr}`);
  }
}

test("tsc --noEmit (strict, checkJs): the sources, the tests, a TypeScript user", async () => {
  await tsc(["--noEmit", "-p", "tsconfig.json"]);
});

test("the committed declarations are the ones the sources give (npm run types)", async () => {
  const fresh = await mkdtemp(join(tmpdir(), "tether-client-types-"));
  try {
    await tsc(["-p", "tsconfig.types.json", "--outDir", fresh]);
    const committed = join(ROOT, "types");
    const names = (await readdir(fresh)).sort();
    assert.deepEqual((await readdir(committed)).sort(), names);
    for (const name of names) {
      const [want, have] = await Promise.all([
        readFile(join(fresh, name), "utf8"),
        readFile(join(committed, name), "utf8"),
      ]);
      assert.equal(have, want, `types/${name} is out of date: run npm run types`);
    }
  } finally {
    await rm(fresh, { recursive: true, force: true });
  }
});
