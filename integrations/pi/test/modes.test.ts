/**
 * Issue 20 items 3, 5 and 6 in pi: `/sandbox goal`, the delegate's name on the approval card, the
 * project-trust question at session start and the ignored-policy notice, told once.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { AgentToolResult, ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import sandboxExtension, { approvalTitle } from "../src/index.ts";
import { parseApprovalRequest } from "../src/protocol.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";

interface RegisteredTool {
	execute: (id: string, params: unknown, signal: AbortSignal | undefined, onUpdate: undefined, ctx: unknown) => Promise<AgentToolResult<unknown>>;
}
type Handler = (event: unknown, ctx: unknown) => unknown;

function loadExtension(flags: Record<string, string>) {
	const tools = new Map<string, RegisteredTool>();
	const handlers = new Map<string, Handler[]>();
	const commands = new Map<string, { handler: (args: string, ctx: unknown) => Promise<void> }>();
	const pi = {
		registerFlag: () => {},
		getFlag: (name: string) => flags[name],
		registerTool: (tool: RegisteredTool & { name: string }) => tools.set(tool.name, tool),
		on: (event: string, handler: Handler) => handlers.set(event, [...(handlers.get(event) ?? []), handler]),
		registerCommand: (name: string, options: { handler: (args: string, ctx: unknown) => Promise<void> }) => commands.set(name, options),
	};
	sandboxExtension(pi as unknown as ExtensionAPI);
	const emit = async (event: string, payload: unknown, ctx: unknown) => {
		for (const handler of handlers.get(event) ?? []) await handler(payload, ctx);
	};
	return { tools, commands, emit };
}

function fakeContext(cwd: string, answer: string | undefined = "Deny") {
	const notes: string[] = [];
	const asked: string[] = [];
	const ctx = {
		cwd,
		hasUI: true,
		mode: "tui",
		signal: undefined,
		ui: {
			select: async (title: string) => (asked.push(title), answer),
			notify: (message: string) => notes.push(message),
			setStatus: () => {},
		},
	};
	return { ctx: ctx as unknown as ExtensionContext, notes, asked };
}

describe("operating modes, delegates and project trust in pi", () => {
	let workspace: string;
	let dataDir: string;
	before(() => {
		workspace = tempDir("pi-sbx-modes-ws-");
		dataDir = tempDir("pi-sbx-modes-data-");
		process.env.SANDBOX_DATA_DIR = dataDir;
	});
	after(() => {
		rmSync(workspace, { recursive: true, force: true });
		rmSync(dataDir, { recursive: true, force: true });
	});

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
		const { ctx, notes } = fakeContext(workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			await commands.get("sandbox")?.handler("goal", ctx);
			assert.match(notes.at(-1) ?? "", /operating mode goal/);
			await assert.rejects(write.execute("g1", { path: "goal.txt", content: "x" }, undefined, undefined, ctx), /goal mode/);
			assert.equal(existsSync(path.join(workspace, "goal.txt")), false);
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
		const { ctx, notes } = fakeContext(project);
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
		const profile = path.join(dataDir, "asking.toml");
		const shipped = readFileSync(path.resolve(import.meta.dirname, "../../../profiles/default.toml"), "utf8");
		writeFileSync(profile, `${shipped}\n[policy]\ndefault_project_trust = "ask"\n`);
		const { tools, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto", "sandbox-profile": profile });
		const { ctx, notes, asked } = fakeContext(project, "Allow once");
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
