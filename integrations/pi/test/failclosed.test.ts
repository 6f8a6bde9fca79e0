/** A server that is gone, dies mid-call or never starts: the call fails, nothing runs on the host. */
import assert from "node:assert/strict";
import { existsSync, rmSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { createBashTool, createFindTool, createLsTool, createWriteTool } from "@earendil-works/pi-coding-agent";
import { SandboxError } from "../src/errors.ts";
import { executeSandboxGrep } from "../src/grep.ts";
import {
	createSandboxBashOperations,
	createSandboxFindOperations,
	createSandboxLsOperations,
	createSandboxWriteOperations,
	type SandboxCallContext,
} from "../src/operations.ts";
import { SandboxSession } from "../src/session.ts";
import { openSandbox, pgrep, tempDir, waitFor } from "./helpers.ts";

async function rejection(promise: Promise<unknown>): Promise<Error> {
	return promise.then(
		(value) => assert.fail(`expected a rejection, got ${JSON.stringify(value).slice(0, 300)}`),
		(error: unknown) => error as Error,
	);
}

describe("fail closed", () => {
	it("after the server is killed, every tool call fails and nothing runs on the host", async () => {
		const sb = await openSandbox();
		const pid = sb.session.pid;
		assert.ok(pid);
		process.kill(pid, "SIGKILL");
		await sb.session.client.waitForExit();
		const canary = path.join(sb.workspace, "ran-on-the-host");
		const ctx = sb.ctx();

		const bash = createBashTool(sb.workspace, { operations: createSandboxBashOperations(ctx) });
		const error = await rejection(bash.execute("k1", { command: `touch ${canary}` }));
		assert.match(error.message, /sandbox server was killed by SIGKILL/);
		assert.equal(existsSync(canary), false);

		const write = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(ctx) });
		await rejection(write.execute("k2", { path: canary, content: "x" }));
		assert.equal(existsSync(canary), false);

		await rejection(createLsTool(sb.workspace, { operations: createSandboxLsOperations(ctx) }).execute("k3", {}));
		await rejection(createFindTool(sb.workspace, { operations: createSandboxFindOperations(ctx) }).execute("k4", { pattern: "*" }));
		await rejection(executeSandboxGrep(ctx, sb.workspace, { pattern: "x" }));
		await sb.close();
	});

	it("a server killed during a call fails that call promptly, and the call's processes die with it", async () => {
		const sb = await openSandbox();
		const marker = `pisbx-orphan-${process.pid}-${Date.now()}`;
		const bash = createBashTool(sb.workspace, { operations: createSandboxBashOperations(sb.ctx()) });
		const call = rejection(bash.execute("k5", { command: `bash -c 'sleep 60; : ${marker}'` }));
		assert.ok(await waitFor(() => pgrep(marker).length > 0, 3000), "the command started");
		const killedAt = Date.now();
		process.kill(sb.session.pid ?? 0, "SIGKILL");
		const error = await call;
		assert.ok(error instanceof SandboxError && error.code === "SANDBOX_UNAVAILABLE", error.message);
		assert.ok(Date.now() - killedAt < 3000, "the pending call is rejected within the drain delay");
		assert.ok(await waitFor(() => pgrep(marker).length === 0, 5000), `left running: ${pgrep(marker).join(", ")}`);
		await sb.close();
	});

	it("no server at all: the session cannot open and the tools fail", async () => {
		const workspace = tempDir("pi-sbx-nobin-");
		const canary = path.join(workspace, "ran-on-the-host");
		const ctx: SandboxCallContext = {
			session: () => SandboxSession.open({ bin: path.join(workspace, "no-such-sandbox"), workspace, startupTimeoutMs: 5000 }),
		};
		const bash = createBashTool(workspace, { operations: createSandboxBashOperations(ctx) });
		const error = await rejection(bash.execute("n1", { command: `touch ${canary}` }));
		assert.match(error.message, /could not run the sandbox server/);
		assert.equal(existsSync(canary), false);
		rmSync(workspace, { recursive: true, force: true });
	});

	it("a session that was closed refuses calls", async () => {
		const sb = await openSandbox();
		await sb.session.close();
		const bash = createBashTool(sb.workspace, { operations: createSandboxBashOperations(sb.ctx()) });
		await rejection(bash.execute("c1", { command: "true" }));
		await sb.close();
	});
});
