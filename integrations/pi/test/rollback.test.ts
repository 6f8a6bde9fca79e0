/**
 * Review records and rollback in pi, against a real `sandbox serve`: a Write's record carries
 * seed 003 §4c's fields, pi's write tells the user about it, and `/sandbox rollback` puts the
 * file back (the newest change first), leaves a file changed since alone, and says why it did
 * nothing when there is nothing it may do.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import { type AgentToolResult, createWriteTool, type ExtensionAPI, type ExtensionContext } from "@earendil-works/pi-coding-agent";
import sandboxExtension from "../src/index.ts";
import { createSandboxWriteOperations } from "../src/operations.ts";
import { parseReview, type ReviewChange } from "../src/protocol.ts";
import { observeReviews, ReviewLog, reviewNotice, rollbackCommand } from "../src/rollback.ts";
import { openSandbox, SANDBOX_BIN, type Sandbox, tempDir } from "./helpers.ts";

/** A stand-in for pi's UI that keeps what it was told. */
function notes() {
	const said: Array<{ message: string; level: string | undefined }> = [];
	return { said, ui: { notify: (message: string, level?: string) => said.push({ message, level }) }, last: () => said.at(-1)?.message ?? "" };
}

const RECORD: ReviewChange = {
	version: 1,
	snapshot_id: "0123456789abcdef",
	message_id: "call:1",
	tool_call_id: "call:1",
	turn_id: "",
	path: "/ws/src/a.ts",
	operation: "write",
	status: "modified",
	state: "active",
	additions: 3,
	deletions: 1,
	hunks: [],
	binary: false,
	truncated: false,
	reversible: true,
};

describe("the review notice", () => {
	it("names the file relative to the workspace, its status, its line counts and the snapshot", () => {
		assert.equal(
			reviewNotice(RECORD, "/ws"),
			"Sandbox: src/a.ts modified (+3 -1), snapshot 0123456789abcdef; /sandbox rollback 0123456789abcdef undoes it",
		);
	});

	it("takes the server's path relative to the workspace as it is", () => {
		assert.match(reviewNotice({ ...RECORD, path: "src/a.ts" }, "/ws"), /^Sandbox: src\/a\.ts modified \(\+3 -1\)/);
		const removed = { ...RECORD, path: "old.txt", status: "deleted" as const, reversible: false };
		assert.match(reviewNotice(removed, "/ws"), /^Sandbox: old\.txt deleted .*cannot be rolled back \(a removed file cannot be restored yet\)/);
	});

	it("says when a change cannot be rolled back or its lines were not counted", () => {
		const big = { ...RECORD, additions: null, deletions: null, truncated: true, reversible: false };
		assert.match(reviewNotice(big, "/ws"), /\(lines not counted \(too large\)\).*cannot be rolled back/);
		assert.match(reviewNotice({ ...big, binary: true, truncated: false }, "/elsewhere"), /^Sandbox: \/ws\/src\/a\.ts modified \(binary\)/);
	});

	it("reads a deletion, and refuses a record it cannot read", () => {
		const deleted = parseReview({ ...RECORD, operation: "delete", status: "deleted", additions: 0, deletions: 2 });
		assert.equal(deleted?.status, "deleted");
		assert.equal(deleted?.operation, "delete");
		assert.equal(parseReview({ ...RECORD, status: "renamed" }), undefined);
		assert.equal(parseReview({ ...RECORD, snapshot_id: 7 }), undefined);
	});
});

describe("rollback through a real sandbox session", () => {
	let sb: Sandbox;
	before(async () => {
		sb = await openSandbox({ mode: "auto" });
	});
	after(async () => {
		await sb?.close();
	});

	const file = (name: string) => path.join(sb.workspace, name);

	it("a Write's review record has the seed's version, message id, status and counts", async () => {
		const result = await sb.session.call("Write", { path: "seed.txt", content: "one\ntwo\n" }, { idPrefix: "msg-7" });
		const review = parseReview(result.review);
		assert.ok(review, JSON.stringify(result.review));
		assert.equal(review.version, 1);
		assert.match(review.message_id, /^msg-7:/);
		assert.equal(review.message_id, review.tool_call_id);
		assert.equal(review.path, "seed.txt"); // ADR 0043: relative to the workspace
		assert.deepEqual([review.operation, review.status, review.state, review.additions, review.deletions], ["write", "added", "active", 2, 0]);
		assert.deepEqual(review.hunks, ["@@ -0,0 +1,2 @@\n+one\n+two"]);
	});

	it("pi's write tells the record; rollback undoes the newest change first, then the one before", async () => {
		writeFileSync(file("a.txt"), "old\n");
		const log = new ReviewLog();
		const told = notes();
		const ctx = observeReviews(sb.ctx(), (session, review) => {
			log.note(session.info.session_id, review);
			told.ui.notify(reviewNotice(review, session.info.workspace), "info");
		});
		const write = createWriteTool(sb.workspace, { operations: createSandboxWriteOperations(ctx) });
		await write.execute("w1", { path: "a.txt", content: "new\n" });
		assert.match(told.last(), /^Sandbox: a\.txt modified \(\+1 -1\), snapshot [0-9a-f]{16}; \/sandbox rollback [0-9a-f]{16} undoes it$/);
		await write.execute("w2", { path: "b.txt", content: "fresh\n" });
		assert.match(told.last(), /^Sandbox: b\.txt added \(\+1 -0\)/);

		const ui = notes();
		assert.equal(await rollbackCommand(sb.session, log, "", ui.ui), "rolled-back");
		assert.equal(existsSync(file("b.txt")), false, ui.last());
		assert.equal(readFileSync(file("a.txt"), "utf8"), "new\n");
		assert.equal(await rollbackCommand(sb.session, log, "", ui.ui), "rolled-back");
		assert.equal(readFileSync(file("a.txt"), "utf8"), "old\n");
		assert.match(ui.last(), /^Sandbox: rolled back [0-9a-f]{16}: restored the previous content of /);
		assert.equal(await rollbackCommand(sb.session, log, "", ui.ui), "nothing");
	});

	it("a file changed since the tool ran is left alone: CONFLICT", async () => {
		const result = await sb.session.call("Write", { path: "c.txt", content: "tool\n" });
		const id = parseReview(result.review)?.snapshot_id;
		assert.ok(id);
		writeFileSync(file("c.txt"), "mine\n");
		await assert.rejects(sb.session.rollback(id), (error: Error & { code?: string }) => error.code === "CONFLICT");
		const ui = notes();
		assert.equal(await rollbackCommand(sb.session, new ReviewLog(), id, ui.ui), "conflict");
		assert.match(ui.last(), /refused: .*changed since the tool ran/);
		assert.equal(readFileSync(file("c.txt"), "utf8"), "mine\n");
	});

	it("an unknown snapshot, one of an earlier session, or no session: nothing is rolled back and it says why", async () => {
		const ui = notes();
		assert.equal(await rollbackCommand(sb.session, new ReviewLog(), "feedfacefeedface", ui.ui), "unknown");
		assert.match(ui.last(), /no snapshot feedfacefeedface in this session/);
		const log = new ReviewLog();
		log.note("an-earlier-session", RECORD);
		assert.equal(await rollbackCommand(sb.session, log, RECORD.snapshot_id, ui.ui), "unknown");
		assert.match(ui.last(), /belonged to an earlier sandbox session/);
		assert.equal(await rollbackCommand(undefined, log, "", ui.ui), "not-running");
	});
});

describe("/sandbox rollback in the extension", () => {
	let workspace: string;
	let dataDir: string;
	before(() => {
		workspace = tempDir("pi-sbx-rb-ws-");
		dataDir = tempDir("pi-sbx-rb-data-");
		process.env.SANDBOX_DATA_DIR = dataDir;
	});
	after(() => {
		rmSync(workspace, { recursive: true, force: true });
		rmSync(dataDir, { recursive: true, force: true });
	});

	it("pi's write shows the review notice and `/sandbox rollback` restores the file", async () => {
		type Execute = (id: string, params: unknown, signal: undefined, onUpdate: undefined, ctx: unknown) => Promise<AgentToolResult<unknown>>;
		const tools = new Map<string, Execute>();
		const handlers = new Map<string, Array<(event: unknown, ctx: unknown) => unknown>>();
		const commands = new Map<string, (args: string, ctx: unknown) => Promise<void>>();
		const pi = {
			registerFlag: () => {},
			getFlag: (name: string) => ({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" })[name],
			registerTool: (tool: { name: string; execute: Execute }) => tools.set(tool.name, tool.execute),
			on: (event: string, handler: (event: unknown, ctx: unknown) => unknown) => handlers.set(event, [...(handlers.get(event) ?? []), handler]),
			registerCommand: (name: string, options: { handler: (args: string, ctx: unknown) => Promise<void> }) => commands.set(name, options.handler),
		};
		sandboxExtension(pi as unknown as ExtensionAPI);
		const told = notes();
		const ctx = { cwd: workspace, hasUI: true, mode: "tui", signal: undefined, ui: { ...told.ui, setStatus: () => {}, select: async () => undefined } };
		const emit = async (event: string) => {
			for (const handler of handlers.get(event) ?? []) await handler({ type: event, reason: "startup" }, ctx as unknown as ExtensionContext);
		};
		await emit("session_start");
		try {
			writeFileSync(path.join(workspace, "notes.md"), "# before\n");
			await tools.get("write")?.("x1", { path: "notes.md", content: "# after\n" }, undefined, undefined, ctx);
			assert.match(told.last(), /^Sandbox: notes\.md modified \(\+1 -1\), snapshot [0-9a-f]{16}; \/sandbox rollback/);
			await commands.get("sandbox")?.("rollback", ctx);
			assert.match(told.last(), /^Sandbox: rolled back [0-9a-f]{16}: restored the previous content of /);
			assert.equal(readFileSync(path.join(workspace, "notes.md"), "utf8"), "# before\n");
		} finally {
			await emit("session_shutdown");
		}
	});
});
