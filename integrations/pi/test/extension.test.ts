/**
 * The extension as pi loads it: its default export called with a stand-in ExtensionAPI that
 * records what it registers, and tools executed the way pi's agent loop executes them.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, realpathSync } from "node:fs";
import path from "node:path";
import { describe, it } from "node:test";
import { resolveConfig, shellWords } from "../src/index.ts";
import { SANDBOX_BIN, text } from "./helpers.ts";
import { answering, answeringInTurn, loadExtension, sessionDirs } from "./support.ts";

const TOOL_NAMES = ["bash", "edit", "find", "grep", "ls", "read", "write"];

describe("the pi extension", () => {
	const dirs = sessionDirs("ext");

	it("overrides pi's seven built-in tools and registers user_bash and /sandbox", () => {
		const { tools, commands } = loadExtension({});
		assert.deepEqual([...tools.keys()].sort(), TOOL_NAMES);
		assert.ok(commands.has("sandbox"));
	});

	it("config: flags win over the environment; a bad mode is refused", () => {
		const config = resolveConfig({ SANDBOX_BIN: "/env/sandbox", SANDBOX_MODE: "ask", SANDBOX_PROFILE: "ci" }, (name) =>
			name === "sandbox-mode" ? "auto" : undefined,
		);
		assert.deepEqual(config, {
			bin: "/env/sandbox",
			profile: "ci",
			mode: "auto",
			backend: undefined,
			mount: undefined,
			network: undefined,
			allowHosts: [],
			allowIndexes: [],
			classifierModel: undefined,
		});
		assert.deepEqual(resolveConfig({ SANDBOX_ALLOW_HOSTS: "pypi.org, *.pythonhosted.org" }).allowHosts, ["pypi.org", "*.pythonhosted.org"]);
		assert.deepEqual(resolveConfig({ SANDBOX_ALLOW_INDEXES: "pypi, npm=http://10.0.0.5:4873/" }).allowIndexes, ["pypi", "npm=http://10.0.0.5:4873/"]);
		assert.deepEqual(resolveConfig({ SANDBOX_ALLOW_INDEXES: "npm" }, (name) => (name === "sandbox-allow-index" ? "pypi" : undefined)).allowIndexes, ["pypi"]);
		assert.throws(() => resolveConfig({ SANDBOX_MODE: "yolo" }), /not one of ask, accept-edits, auto/);
	});

	it("without a server every tool fails and nothing runs on the host", async () => {
		const { tools, emit } = loadExtension({ "sandbox-bin": path.join(dirs.workspace, "no-such-sandbox") });
		const { ctx, notes } = answering(dirs.workspace);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		assert.match(notes.join("\n"), /Sandbox unavailable/);
		const canary = path.join(dirs.workspace, "ran-on-the-host");
		const calls: Array<[string, unknown]> = [
			["bash", { command: `touch ${canary}` }],
			["write", { path: canary, content: "x" }],
			["edit", { path: canary, edits: [{ oldText: "a", newText: "b" }] }],
			["read", { path: canary }],
			["ls", {}],
			["find", { pattern: "*" }],
			["grep", { pattern: "x" }],
		];
		for (const [name, params] of calls) {
			const tool = tools.get(name);
			assert.ok(tool, name);
			await tool.execute(`x-${name}`, params, undefined, undefined, ctx).then(
				(result) => assert.fail(`${name} returned ${text(result)}`),
				(error: Error) => assert.match(error.message, /sandbox/i, name),
			);
		}
		assert.equal(existsSync(canary), false);
		const userBash = (await emit("user_bash", { type: "user_bash", command: `touch ${canary}`, excludeFromContext: false, cwd: dirs.workspace }, ctx)) as {
			operations: { exec: (c: string, cwd: string, o: { onData: (d: Buffer) => void }) => Promise<unknown> };
		};
		await assert.rejects(userBash.operations.exec(`touch ${canary}`, dirs.workspace, { onData: () => {} }), /sandbox/);
		assert.equal(existsSync(canary), false);
	});

	it("runs tools in the sandbox, asks pi's UI, and stays down after the server dies until /sandbox restart", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "ask" });
		const { ctx, asked } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		const bash = tools.get("bash");
		const write = tools.get("write");
		assert.ok(bash && write);

		const who = await bash.execute("e1", { command: "id -u" }, undefined, undefined, ctx);
		assert.notEqual(text(who).trim(), "0");

		await assert.rejects(write.execute("e2", { path: "denied.txt", content: "x" }, undefined, undefined, ctx), /TOOL_DENIED/);
		assert.equal(asked.length, 1);
		assert.equal(existsSync(path.join(dirs.workspace, "denied.txt")), false);

		const allowing = answering(dirs.workspace, "Allow once");
		await write.execute("e3", { path: "allowed.txt", content: "yes\n" }, undefined, undefined, allowing.ctx);
		assert.equal(readFileSync(path.join(dirs.workspace, "allowed.txt"), "utf8"), "yes\n");

		const userBash = (await emit("user_bash", { type: "user_bash", command: "id -u", excludeFromContext: false, cwd: dirs.workspace }, ctx)) as {
			operations: { exec: (c: string, cwd: string, o: { onData: (d: Buffer) => void }) => Promise<{ exitCode: number | null }> };
		};
		let out = "";
		const done = await userBash.operations.exec("id -u", dirs.workspace, { onData: (d) => (out += d.toString()) });
		assert.equal(done.exitCode, 0);
		assert.notEqual(out.trim(), "0");

		// Kill the server behind the extension's back: calls fail, no silent restart.
		const status = answering(dirs.workspace);
		await commands.get("sandbox")?.handler("", status.ctx);
		const pid = Number(/pid (\d+)/.exec(status.notes.join("\n"))?.[1]);
		assert.ok(pid > 0, status.notes.join("\n"));
		process.kill(pid, "SIGKILL");
		await new Promise((resolve) => setTimeout(resolve, 1500));
		const canary = path.join(dirs.workspace, "after-death");
		await assert.rejects(bash.execute("e4", { command: `touch ${canary}` }, undefined, undefined, ctx), /sandbox server was killed/);
		await assert.rejects(bash.execute("e5", { command: `touch ${canary}` }, undefined, undefined, ctx), /until \/sandbox restart/);
		assert.equal(existsSync(canary), false);

		const restart = answering(dirs.workspace);
		await commands.get("sandbox")?.handler("restart", restart.ctx);
		assert.match(restart.notes.join("\n"), /Sandbox restarted/);
		const again = await bash.execute("e6", { command: "echo back" }, undefined, undefined, ctx);
		assert.equal(text(again).trim(), "back");

		await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
	});

	it("/sandbox profile switches the running pi session's profile between calls", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" });
		const { ctx, notes } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			await write.execute("p1", { path: "before-switch.txt", content: "x" }, undefined, undefined, ctx);
			assert.equal(readFileSync(path.join(dirs.workspace, "before-switch.txt"), "utf8"), "x");
			await commands.get("sandbox")?.handler("profile readonly", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: profile readonly now \(a new sandbox session, \w+\/ro\)/);
			await assert.rejects(write.execute("p2", { path: "after-switch.txt", content: "x" }, undefined, undefined, ctx));
			assert.equal(existsSync(path.join(dirs.workspace, "after-switch.txt")), false);
			await commands.get("sandbox")?.handler("profile no-such-profile", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: the profile was not switched: /);
			await commands.get("sandbox")?.handler("profile", ctx);
			assert.match(notes.at(-1) ?? "", /^Sandbox: profile readonly;/); // the earlier one stays
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("the footer follows a global mode change the session inherits", async () => {
		const { commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN });
		const { ctx } = answering(dirs.workspace, "Deny");
		const statuses: string[] = [];
		(ctx.ui as unknown as { setStatus: (key: string, text: string) => void }).setStatus = (_key, text) => statuses.push(text);
		const saved = process.env.SANDBOX_MODE;
		delete process.env.SANDBOX_MODE; // no session mode: the session inherits the global one
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			assert.match(statuses.at(-1) ?? "", / ask$/);
			await commands.get("sandbox")?.handler("policy mode accept-edits", ctx);
			assert.match(statuses.at(-1) ?? "", / accept-edits$/);
			await commands.get("sandbox")?.handler("policy mode ask", ctx);
			assert.match(statuses.at(-1) ?? "", / ask$/);
		} finally {
			if (saved !== undefined) process.env.SANDBOX_MODE = saved;
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("each call someone was asked about leaves its approval record in pi's UI", async () => {
		const { tools, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "ask" });
		const { ctx, notes, asked } = answeringInTurn(dirs.workspace, ["Allow once", "Deny"]);
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			await write.execute("a1", { path: "recorded.txt", content: "x" }, undefined, undefined, ctx);
			const allowed = path.join(realpathSync(dirs.workspace), "recorded.txt");
			assert.ok(notes.some((n) => n.startsWith(`Sandbox: allowed once by you: ${allowed} (rule `)), notes.join("\n"));
			await write.execute("a2", { path: "refused.txt", content: "x" }, undefined, undefined, ctx).catch(() => undefined);
			assert.ok(notes.some((n) => /^Sandbox: denied by you: .*refused\.txt \(rule \S+, answered in \d+\.\d s\)$/.test(n)), notes.join("\n"));
			assert.equal(asked.length, 2);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("turns are real: a call denied in one turn is not asked again in it, but is in the next", async () => {
		const { tools, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "ask" });
		const { ctx, asked } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			const attempt = (id: string) => write.execute(id, { path: "turned.txt", content: "x" }, undefined, undefined, ctx).catch((e: Error) => e);
			const note = (await emit("before_agent_start", { type: "before_agent_start", messageType: "user", prompt: "one", systemPrompt: "" }, ctx)) as
				| { systemPrompt: string }
				| undefined;
			assert.match(note?.systemPrompt ?? "", /scratch/i); // the model is told its scratch directory
			assert.match(note?.systemPrompt ?? "", /PI_SCRATCH_DIR/);
			assert.match(String(await attempt("t1")), /TOOL_DENIED/);
			assert.match(String(await attempt("t2")), /already denied this call in this turn/);
			assert.equal(asked.length, 1);
			await emit("before_agent_start", { type: "before_agent_start", messageType: "user", prompt: "two", systemPrompt: "" }, ctx);
			assert.match(String(await attempt("t3")), /TOOL_DENIED/);
			assert.equal(asked.length, 2, "a new turn asks again");
			assert.equal(existsSync(path.join(dirs.workspace, "turned.txt")), false);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("/sandbox mode and /sandbox plan change the running session's modes", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "ask" });
		const { ctx, asked, notes } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const write = tools.get("write");
			assert.ok(write);
			await commands.get("sandbox")?.handler("mode yolo", ctx);
			assert.match(notes.at(-1) ?? "", /not one of ask, accept-edits, auto/);
			await commands.get("sandbox")?.handler("mode auto", ctx);
			assert.match(notes.at(-1) ?? "", /permission mode auto, operating mode agent/);
			await write.execute("m1", { path: "moded.txt", content: "x" }, undefined, undefined, ctx);
			assert.equal(asked.length, 0);
			assert.equal(readFileSync(path.join(dirs.workspace, "moded.txt"), "utf8"), "x");
			await commands.get("sandbox")?.handler("plan", ctx);
			await assert.rejects(write.execute("m2", { path: "planned.txt", content: "x" }, undefined, undefined, ctx), /plan mode/);
			assert.equal(existsSync(path.join(dirs.workspace, "planned.txt")), false);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("/sandbox policy and /sandbox audit: a rule saved from pi reaches the running session at once", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" });
		const { ctx, notes } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const bash = tools.get("bash");
			assert.ok(bash);
			assert.match(text(await bash.execute("p1", { command: "echo free" }, undefined, undefined, ctx)), /free/);
			await commands.get("sandbox")?.handler('policy block "echo"', ctx);
			assert.match(notes.at(-1) ?? "", /sandbox policy block echo/);
			await assert.rejects(bash.execute("p2", { command: "echo blocked" }, undefined, undefined, ctx), /block rule/);
			await commands.get("sandbox")?.handler("policy list", ctx);
			assert.match(notes.at(-1) ?? "", /block\s+echo/);
			await commands.get("sandbox")?.handler("audit stats", ctx);
			assert.match(notes.at(-1) ?? "", /calls/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("/sandbox policy takes quoted phrases as one word: a many-word rule and a whole command to test", async () => {
		const { tools, commands, emit } = loadExtension({ "sandbox-bin": SANDBOX_BIN, "sandbox-mode": "auto" });
		const { ctx, notes } = answering(dirs.workspace, "Deny");
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const bash = tools.get("bash");
			assert.ok(bash);
			await commands.get("sandbox")?.handler('policy block "printf many words"', ctx);
			assert.match(notes.at(-1) ?? "", /added block rule \S+: 'printf many words'/);
			await assert.rejects(bash.execute("q1", { command: "printf many words here" }, undefined, undefined, ctx), /block rule/);
			assert.match(text(await bash.execute("q2", { command: "printf many" }, undefined, undefined, ctx)), /many/);
			await commands.get("sandbox")?.handler("policy test 'git push --force origin main'", ctx);
			assert.match(notes.at(-1) ?? "", /resource: git push --force origin main/);
			await commands.get("sandbox")?.handler('policy test "printf many words now"', ctx);
			assert.match(notes.at(-1) ?? "", /^deny: .*block rule/m);
			await commands.get("sandbox")?.handler('policy test "unclosed', ctx);
			assert.match(notes.at(-1) ?? "", /unclosed "/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
		}
	});

	it("shellWords splits as a POSIX shell does, without expanding", () => {
		assert.deepEqual(shellWords(`policy allow "npm install"`), ["policy", "allow", "npm install"]);
		assert.deepEqual(shellWords(` a  'b "c' "d 'e" f\\ g "" `), ["a", 'b "c', "d 'e", "f g", ""]);
		assert.deepEqual(shellWords(String.raw`"a\"b" 'c\d' e\'f`), ['a"b', "c\\d", "e'f"]);
		assert.throws(() => shellWords("x 'y"), /unclosed '/);
	});
});
