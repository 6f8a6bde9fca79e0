/**
 * Issue 20 items 3, 5 and 6 in pi: `/sandbox goal`, the delegate's name on the approval card, the
 * project-trust question at session start and the ignored-policy notice, told once.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { approvalTitle } from "../src/index.ts";
import { parseApprovalRequest } from "../src/protocol.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";
import { answering, loadExtension, sessionDirs } from "./support.ts";

describe("operating modes, delegates and project trust in pi", () => {
	const dirs = sessionDirs("modes");

	it("the approval card names the asking delegate", () => {
		const request = parseApprovalRequest({
			session_id: "s",
			tool_call_id: "c",
			tool: "Bash",
			operation: "execute",
			resource: "make test",
			reason: "runs code",
			delegate: "test-runner",
		});
		assert.ok(request);
		assert.equal(request.delegate, "test-runner");
		assert.match(approvalTitle(request), /^Sandbox: allow Bash \(asked by delegate test-runner\) to execute make test\?/);
		const plain = parseApprovalRequest({ session_id: "s", tool_call_id: "c", tool: "Bash", operation: "execute", resource: "ls" });
		assert.ok(plain);
		assert.equal(plain.delegate, undefined);
		assert.doesNotMatch(approvalTitle(plain), /delegate/);
	});

	it("/sandbox goal: no writes; plan and goal are entered from agent only", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" });
		const { ctx, notes } = answering(dirs.workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			await commands.get("sandbox")?.handler("goal", ctx);
			assert.match(notes.at(-1) ?? "", /operating mode goal/);
			await assert.rejects(write.execute("g1", { path: "goal.txt", content: "x" }, undefined, undefined, ctx), /goal mode/);
			assert.equal(existsSync(path.join(dirs.workspace, "goal.txt")), false);
			await commands.get("sandbox")?.handler("plan", ctx);
			assert.match(notes.at(-1) ?? "", /not changed.*agent/s);
			await commands.get("sandbox")?.handler("agent", ctx);
			await commands.get("sandbox")?.handler("plan", ctx);
			assert.match(notes.at(-1) ?? "", /operating mode plan/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("an untrusted project's policy file is said to be ignored, once", async () => {
		const project = tempDir("pi-sbx-modes-project-");
		mkdirSync(path.join(project, ".sandbox"));
		writeFileSync(path.join(project, ".sandbox", "policy.toml"), '[policy]\nrules = [{ action = "block", text = "echo blocked" }]\n');
		const { commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" });
		const { ctx, notes } = answering(project);
		try {
			await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
			const told = () => notes.filter((note) => /policy\.toml: the project is not trusted/.test(note));
			assert.equal(told().length, 1, notes.join("\n"));
			await commands.get("sandbox")?.handler("restart", ctx);
			assert.equal(told().length, 1, "told once");
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
			rmSync(project, { recursive: true, force: true });
		}
	});

	it("default_project_trust = ask puts the question in pi's UI; a yes loads the project's rules", async () => {
		const project = tempDir("pi-sbx-modes-ask-");
		mkdirSync(path.join(project, ".sandbox"));
		writeFileSync(path.join(project, ".sandbox", "policy.toml"), '[policy]\nrules = [{ action = "block", text = "echo blocked" }]\n');
		const profile = path.join(dirs.dataDir, "asking.toml");
		const shipped = readFileSync(path.resolve(import.meta.dirname, "../../../profiles/default.toml"), "utf8");
		writeFileSync(profile, `${shipped}\n[policy]\ndefault_project_trust = "ask"\n`);
		const { tools, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto", "sandbox-profile": profile });
		const { ctx, notes, asked } = answering(project, "Allow once");
		try {
			await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
			assert.equal(asked.length, 1, notes.join("\n"));
			assert.match(asked[0] ?? "", /trust this project/);
			assert.match(asked[0] ?? "", /policy\.toml/);
			assert.equal(notes.filter((note) => /not trusted/.test(note)).length, 0);
			const bash = tools.get("bash");
			assert.ok(bash);
			await assert.rejects(bash.execute("b1", { command: "echo blocked" }, undefined, undefined, ctx), /block rule/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
			rmSync(project, { recursive: true, force: true });
		}
	});
});
