/** The JSON-RPC client and the session layer against a deliberately misbehaving fake server. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { SandboxClient } from "../src/client.ts";
import { SandboxError } from "../src/errors.ts";
import type { ApprovalRequest } from "../src/protocol.ts";
import { type Approver, SandboxSession } from "../src/session.ts";
import { FAKE_SERVER } from "./helpers.ts";

function openFake(scenario: string, approver?: Approver): Promise<SandboxSession> {
	return SandboxSession.open({
		bin: process.execPath,
		args: [FAKE_SERVER],
		workspace: "/tmp",
		approver,
		env: { ...process.env, FAKE_SCENARIO: scenario },
		startupTimeoutMs: 10_000,
	});
}

async function rejectsWithCode(promise: Promise<unknown>, code: string, message?: RegExp): Promise<SandboxError> {
	const error = await promise.then(
		() => assert.fail("expected a rejection"),
		(e: unknown) => e,
	);
	assert.ok(error instanceof SandboxError, `expected a SandboxError, got ${String(error)}`);
	assert.equal(error.code, code, error.message);
	if (message) assert.match(error.message, message);
	return error;
}

describe("client", () => {
	it("a missing executable fails with SANDBOX_UNAVAILABLE", async () => {
		await rejectsWithCode(
			SandboxSession.open({ bin: "/nonexistent/sandbox", workspace: "/tmp", startupTimeoutMs: 5000 }),
			"SANDBOX_UNAVAILABLE",
			/not found/,
		);
	});

	it("a server that exits rejects the pending call and every later one", async () => {
		const session = await openFake("exit-during-call");
		const error = await rejectsWithCode(session.call("Bash", { command: "true" }), "SANDBOX_UNAVAILABLE", /exited with code 3/);
		assert.match(error.message, /dying on purpose/, "the server's log tail is part of the error");
		assert.equal(session.alive, false);
		await rejectsWithCode(session.call("Bash", { command: "true" }), "SANDBOX_UNAVAILABLE");
	});

	it("a non-JSON line on stdout is fatal: the call fails and the server is stopped", async () => {
		const session = await openFake("garbage");
		await rejectsWithCode(session.call("Bash", { command: "true" }), "SANDBOX_PROTOCOL", /non-JSON/);
		const exit = await session.client.waitForExit();
		assert.equal(exit.signal, "SIGKILL");
	});

	it("a server that never answers times out", async () => {
		const session = await openFake("silent");
		await rejectsWithCode(session.call("Bash", { command: "true" }, { timeoutMs: 300 }), "SANDBOX_TIMEOUT");
		await session.close();
	});

	it("routes tool.output to its call, stdout and stderr apart", async () => {
		const session = await openFake("stream");
		const chunks: Array<[string, string]> = [];
		const result = await session.call("Bash", { command: "x" }, { onOutput: (stream, data) => chunks.push([stream, data]) });
		assert.equal(result.ok, true);
		assert.deepEqual(chunks, [
			["stdout", "out\n"],
			["stderr", "err\n"],
		]);
		await session.close();
	});

	it("an approval reaches the call's approver; its answer goes back", async () => {
		const seen: ApprovalRequest[] = [];
		const session = await openFake("approval", (request) => {
			seen.push(request);
			return "allow-once";
		});
		const result = await session.call("Write", { path: "/tmp/a", content: "x" });
		assert.equal(result.details.decision, "allow-once");
		assert.equal(seen.length, 1);
		assert.equal(seen[0]?.tool, "Write");
		assert.equal(seen[0]?.resource, "/tmp/a");
		await session.close();
	});

	it("an approver that throws, or answers nonsense, denies", async () => {
		const throwing = await openFake("approval", () => {
			throw new Error("ui crashed");
		});
		assert.equal((await throwing.call("Write", { path: "/tmp/a", content: "x" })).details.decision, "deny");
		await throwing.close();
		const nonsense = await openFake("approval", () => "yes please" as never);
		assert.equal((await nonsense.call("Write", { path: "/tmp/a", content: "x" })).details.decision, "deny");
		await nonsense.close();
	});

	it("the session's default approver denies", async () => {
		const session = await openFake("approval");
		assert.equal((await session.call("Write", { path: "/tmp/a", content: "x" })).details.decision, "deny");
		await session.close();
	});

	it("an approval for a call that is not ours is denied without asking", async () => {
		let asked = false;
		const session = await openFake("approval-unknown-call", () => {
			asked = true;
			return "allow-once";
		});
		assert.equal((await session.call("Write", { path: "/tmp/a", content: "x" })).details.decision, "deny");
		assert.equal(asked, false);
		await session.close();
	});

	it("close() shuts the server down", async () => {
		const session = await openFake("ok");
		await session.close();
		const exit = await session.client.waitForExit();
		assert.equal(exit.code, 0);
		await rejectsWithCode(session.call("Bash", { command: "true" }), "SANDBOX_UNAVAILABLE");
	});

	it("requests after the child is gone reject at once", async () => {
		const client = SandboxClient.spawn({ bin: process.execPath, args: ["-e", "process.exit(0)"] });
		await client.waitForExit();
		await rejectsWithCode(client.request("initialize", {}), "SANDBOX_UNAVAILABLE");
	});
});
