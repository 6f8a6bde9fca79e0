/**
 * An allowlist session from pi: the hosts pi names reach the server (`allow_hosts`), a refused
 * connection reaches pi as it happens (`network.denied`) and the model reads one line about it.
 * Nothing leaves the machine: the refused host is refused before any name is resolved.
 */
import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, it } from "node:test";
import type { ApprovalRequest, NetworkDenial } from "../src/protocol.ts";
import { SandboxSession } from "../src/session.ts";
import { SANDBOX_BIN, tempDir } from "./helpers.ts";
import { answering, loadExtension } from "./support.ts";

describe("network allowlist", () => {
	let workspace: string;
	let dataDir: string;
	before(() => {
		workspace = tempDir("pi-sbx-net-ws-");
		dataDir = tempDir("pi-sbx-net-data-");
	});
	after(() => {
		rmSync(workspace, { recursive: true, force: true });
		rmSync(dataDir, { recursive: true, force: true });
	});

	it("a host off the list is refused, pi hears of it at once, and the model reads why", async () => {
		const denials: NetworkDenial[] = [];
		const session = await SandboxSession.open({
			bin: SANDBOX_BIN,
			workspace,
			mode: "auto",
			backend: "bwrap",
			allowHosts: ["allowed.example"],
			onDenial: (denial) => denials.push(denial),
			env: { ...process.env, SANDBOX_DATA_DIR: dataDir },
		});
		try {
			const result = await session.call("Bash", { command: 'echo "$https_proxy"; curl -sSf http://denied.example/' });
			assert.equal(result.ok, false);
			assert.match(result.content, /^http:\/\/127\.0\.0\.1:3128$/m);
			assert.match(result.content, /sandbox: connection to denied\.example:80 refused \(not-allowed\)/);
			assert.deepEqual(
				denials.map((d) => [d.host, d.port, d.reason]),
				[["denied.example", 80, "not-allowed"]],
			);
		} finally {
			await session.close();
		}
	});

	it("/sandbox allow and /sandbox disallow change the running session's allowlist for its next command", async () => {
		const { tools, commands, emit } = loadExtension({
			"sandbox-bin": SANDBOX_BIN,
			"sandbox-mode": "auto",
			"sandbox-allow-host": "allowed.example",
		});
		const { ctx, notes } = answering(workspace);
		const previous = process.env.SANDBOX_DATA_DIR;
		process.env.SANDBOX_DATA_DIR = dataDir;
		await emit("session_start", { type: "session_start", reason: "startup" }, ctx);
		try {
			const bash = tools.get("bash");
			assert.ok(bash);
			const sandbox = commands.get("sandbox");
			await sandbox?.handler("network", ctx);
			assert.match(notes.at(-1) ?? "", /network allowlist: allowed\.example$/);
			await sandbox?.handler("allow later.example", ctx);
			assert.match(notes.at(-1) ?? "", /network allowlist: allowed\.example, later\.example$/);
			await sandbox?.handler("disallow allowed.example", ctx);
			assert.match(notes.at(-1) ?? "", /network allowlist: later\.example$/);
			// Refused before any name is resolved: nothing leaves the machine.
			const refused = await bash
				.execute("n1", { command: "curl -sSf http://allowed.example/" }, undefined, undefined, ctx)
				.then((result: unknown) => JSON.stringify(result), (error: Error) => error.message);
			assert.match(refused, /allowed\.example:80 refused \(not-allowed\)/); // the line the model reads
			await sandbox?.handler("allow", ctx);
			assert.match(notes.at(-1) ?? "", /takes one or more hosts/);
		} finally {
			await emit("session_shutdown", { type: "session_shutdown", reason: "quit" }, ctx);
			if (previous === undefined) delete process.env.SANDBOX_DATA_DIR;
			else process.env.SANDBOX_DATA_DIR = previous;
		}
	});

	it("with network.ask a host no rule names is put to pi's approver, with the running call's id", async () => {
		const profile = path.join(workspace, "ask.toml");
		writeFileSync(profile, 'requires = []\n[network]\nmode = "allowlist"\nask = true\n');
		const asked: ApprovalRequest[] = [];
		const session = await SandboxSession.open({
			bin: SANDBOX_BIN,
			workspace,
			mode: "auto",
			backend: "bwrap",
			profile,
			env: { ...process.env, SANDBOX_DATA_DIR: dataDir },
		});
		try {
			const result = await session.call(
				"Bash",
				{ command: "curl -sSf http://unlisted.example/" },
				{ idPrefix: "net", approver: (request) => (asked.push(request), "deny") },
			);
			assert.equal(result.ok, false);
			assert.match(result.content, /refused \(ask-denied\)/);
			assert.deepEqual(
				asked.map((r) => [r.tool, r.operation, r.resource]),
				[["Network", "connect", "unlisted.example:80"]],
			);
			assert.match(asked[0]?.tool_call_id ?? "", /^net:/);
		} finally {
			await session.close();
		}
	});
});
